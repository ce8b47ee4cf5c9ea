"""Residual and initialisation schemes for very deep Transformers, as settings of a layer of depth l.

Four later answers to "why does a deep post-norm Transformer stop learning", each a change to how
layer ``index`` of a stack of ``num_layers`` adds its sublayers to their input, or how its weights
are drawn.  They are applied to whatever layer a stack's ``build_layer`` returns (fairseq's layer,
a multi-layer-attention layer), once, before activation checkpointing wraps it
(:func:`apply_schemes`, called by ``models/transformer_stack.py``), so they compose with every
layer history (residual, DLCL, transparent attention, aggregation).

* **DeepNorm** (Wang, Ma, Dong, Huang, Zhang, Wei 2022, "DeepNet: Scaling Transformers to 1,000
  Layers", Sec. 2-3, Fig. 2): every sublayer is ``x = LN(alpha * x + G(x))`` (post-norm), and the
  feed-forward weights and the attention value and output projections are drawn Xavier-normal with
  gain ``beta`` (queries and keys with gain 1).  For N encoder and M decoder layers (Sec. 3,
  "encoder-decoder"): encoder alpha = 0.81 (N^4 M)^(1/16), beta = 0.87 (N^4 M)^(-1/16); decoder
  alpha = (3M)^(1/4), beta = (12M)^(-1/4).  Cross-attention counts as a decoder sublayer.
* **Admin** (Liu, Liu, Gao, Chen, Han 2020, "Understanding the Difficulty of Training
  Transformers", Sec. 5): post-norm with ``x_i = LN(x_{i-1} * omega_i + f_i(x_{i-1}))``, one
  learned vector omega_i (width d) per sublayer, initialised by profiling: omega_i^2 =
  1 + sum_{j<i} Var[f_j] (Eq. 8 with the embedding's variance taken as 1).  The profile is taken
  in the first training forward pass, sublayer by sublayer in order, as the authors' code does:
  sublayer i takes omega_i = r, then r^2 = Var[x_{i-1} * omega_i] + Var[f_i(x_{i-1})] (variance
  over all elements of the batch, dropout as in training; averaged over data-parallel workers so
  that they agree).  ``admin_profiled`` (a buffer) keeps a checkpoint from being profiled again.
* **ReZero** (Bachlechner, Majumder, Mao, Cottrell, McAuley 2020, Eq. 5): ``x = x + alpha F(x)``,
  one scalar alpha per layer (shared by its sublayers, as in the authors' Transformer layer),
  initialised to 0, and no layer norm: at initialisation every layer is the identity map.
* **DS-Init** (Zhang, Titov, Sennrich 2019, "Improving Deep Transformer with Depth-Scaled
  Initialization and Merged Attention", Eq. 9): every weight matrix of layer l (1-based, counted
  per stack) is drawn from U(-b, b), b = sqrt(6 / (fan_in + fan_out)) * alpha / sqrt(l), so its
  standard deviation is sqrt(2 / (fan_in + fan_out)) * alpha / sqrt(l); biases keep fairseq's
  initialisation.  alpha defaults to 1 (the paper's alpha is in [0, 1]).  The merged attention
  sublayer (MAtt) of the same paper is not part of this package.

* **B2T connection** (Takase, Kiyono, Kobayashi, Suzuki, Findings of ACL 2023, "B2T Connection:
  Serving Stability and Performance in Deep Transformers", Sec. 4): post-norm layers whose last
  layer norm also takes the layer's input, skipping the inner ones: an encoder layer computes
  h = LN(x + Attn(x)), y = LN(h + FFN(h) + x), a decoder layer adds x the same way before its
  last norm (past both inner norms).  As the authors' code (github.com/takase/b2t_connection,
  ``fairseq/modules/transformer_layer.py``, ``rescaling_init``), every weight matrix of a layer of
  a stack of N starts from fairseq's initialisation times N^(-1/2).

Admin's omega may also start from admin-torch's closed form instead of a profile
(``--admin-init``, Liu et al.'s admin-torch 0.1.0 ``calculate_init``: omega^2 = (n+1)/log(n+1) - 1
for O(log n) output change, n for O(1), 1 for O(n), n the stack's residual sublayers: 2N in the
encoder, 3M in the decoder), which admin-torch, having removed the profiling stage, uses.

The layer norm schemes (Sub-LN, Peri-LN, Mix-LN, DyT) and LayerScale are in
:mod:`~fairseq_deep.modules.schemes.norm_schemes`; :func:`apply_schemes` applies them too.

Combinations: DeepNorm, Admin, ReZero and B2T each replace the residual connection, so at most
one is on; each needs a post-norm stack (ReZero: no layer norm at all); DS-Init composes with
standard, Admin and ReZero residuals but not with DeepNorm, B2T or Sub-LN, which set the same
weights' scale.  A layer that has its own residual connection (``--ta-no-encoder-residual``)
takes none of them.
"""

import itertools
import logging
import math
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional, Tuple

import torch
import torch.distributed as dist
from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.modules.transformer_layer import (
    TransformerDecoderLayerBase,
    TransformerEncoderLayerBase,
)
from torch import Tensor, nn

from ...errors import UserError
from ..common.growth import GrowError, declare_layer
from . import norm_schemes
from .norm_schemes import NORM_SCHEMES, NormSchemesConfig

logger = logging.getLogger(__name__)


@dataclass
class DeepNormConfig(FairseqDataclass):
    """The ``--deepnorm*`` options (Wang et al. 2022)."""

    deepnorm: bool = field(
        default=False,
        metadata={
            "help": "DeepNorm (Wang et al. 2022): post-norm sublayers x = LN(alpha x + G(x)) and "
            "Xavier-normal init with gain beta of the FFN and attention value/output projections"
        },
    )
    deepnorm_alpha: Optional[str] = field(
        default=None,
        metadata={
            "help": "residual scale alpha as ENCODER,DECODER (default: from the depths, Sec. 3 of the paper)"
        },
    )
    deepnorm_beta: Optional[str] = field(
        default=None,
        metadata={
            "architecture": False,
            "help": "init gain beta as ENCODER,DECODER (default: from the depths, Sec. 3 of the paper)",
        },
    )


@dataclass
class AdminConfig(FairseqDataclass):
    """The ``--admin`` option (Liu et al. 2020)."""

    admin: bool = field(
        default=False,
        metadata={
            "help": "Admin (Liu et al. 2020): post-norm x = LN(x * omega + f(x)), omega learned per "
            "sublayer and initialised by profiling the first training batch"
        },
    )
    admin_init: ChoiceEnum(["profile", "O(logn)", "O(1)", "O(n)"]) = field(
        default="profile",
        metadata={
            "architecture": False,
            "help": "Admin's initial omega: profiled on the first training batch (the paper), or "
            "admin-torch's closed form for an output change of O(log n), O(1) or O(n)",
        },
    )


@dataclass
class B2TConfig(FairseqDataclass):
    """The ``--b2t`` option (Takase et al. 2023)."""

    b2t: bool = field(
        default=False,
        metadata={
            "help": "B2T connection (Takase et al. 2023): post-norm layers whose last layer norm "
            "also takes the layer's input, y = LN(h + F(h) + x), skipping the inner norms"
        },
    )


@dataclass
class ReZeroConfig(FairseqDataclass):
    """The ``--rezero*`` options (Bachlechner et al. 2020)."""

    rezero: bool = field(
        default=False,
        metadata={
            "help": "ReZero (Bachlechner et al. 2020): x = x + alpha F(x), one learned scalar per "
            "layer, no layer norm"
        },
    )
    rezero_init: float = field(
        default=0.0,
        metadata={
            "architecture": False,
            "help": "initial value of every ReZero alpha (the paper's: 0)",
        },
    )


@dataclass
class DSInitConfig(FairseqDataclass):
    """The ``--ds-init*`` options (Zhang et al. 2019)."""

    ds_init: bool = field(
        default=False,
        metadata={
            "architecture": False,
            "help": "depth-scaled initialisation (Zhang et al. 2019): the weights of layer l drawn "
            "from the Xavier range scaled by alpha / sqrt(l)",
        },
    )
    ds_init_alpha: float = field(
        default=1.0,
        metadata={"architecture": False, "help": "alpha of DS-Init (in [0, 1] in the paper)"},
    )


@dataclass
class ResidualSchemesConfig(
    DeepNormConfig, AdminConfig, ReZeroConfig, B2TConfig, DSInitConfig, NormSchemesConfig
):
    """Every scheme's options (this module's and norm_schemes'); composed into every Transformer
    family of the package."""


RESIDUAL_SCHEMES = ("deepnorm", "admin", "rezero", "b2t")


def check_schemes(cfg) -> ResidualSchemesConfig:
    """The schemes' options of ``cfg`` (a namespace or TransformerConfig), or a UserError for a
    combination that makes no sense."""
    opts = ResidualSchemesConfig.from_namespace(cfg)
    chosen = [name for name in RESIDUAL_SCHEMES if getattr(opts, name)]
    if len(chosen) > 1:
        raise UserError(
            f"--{' and --'.join(chosen)} each replace the residual connection: choose one"
        )
    for name in ("deepnorm", "b2t"):
        if getattr(opts, name) and opts.ds_init:
            raise UserError(
                f"--{name} and --ds-init both set the scale of the initial weights: choose one"
            )
    if chosen:
        for side in ("encoder", "decoder"):
            if _stack_options(cfg, side)[0]:
                what = "has no layer norm" if chosen[0] == "rezero" else "is a post-norm scheme"
                raise UserError(
                    f"--{chosen[0]} {what}, but the {side} is pre-norm (--{side}-normalize-before): use a "
                    f"post-norm --arch (transformer_{chosen[0].replace('_', '')}, transformer_postnorm, "
                    f"transformer_dlcl_postnorm, transformer_ta_baseline, ...)"
                )
    if opts.ds_init and not opts.ds_init_alpha > 0:
        raise UserError(f"--ds-init-alpha must be positive, got {opts.ds_init_alpha}")
    norm_schemes.check_norm_schemes(
        opts, {side: _stack_options(cfg, side)[0] for side in ("encoder", "decoder")}, chosen
    )
    return opts


def _stack_options(cfg, side: str) -> Tuple[bool, int]:
    """(normalize_before, layers) of one side of a TransformerConfig or a flat namespace."""
    sub = getattr(cfg, side, None)
    if sub is not None and hasattr(sub, "layers"):
        return bool(sub.normalize_before), int(sub.layers)
    return bool(getattr(cfg, f"{side}_normalize_before", False)), int(
        getattr(cfg, f"{side}_layers")
    )


def deepnorm_constants(side: str, encoder_layers: int, decoder_layers: int) -> Tuple[float, float]:
    """(alpha, beta) of DeepNorm for one side of an encoder-decoder of N + M layers (Sec. 3)."""
    n, m = encoder_layers, decoder_layers
    if side == "encoder":
        return 0.81 * (n**4 * m) ** (1 / 16), 0.87 * (n**4 * m) ** (-1 / 16)
    return (3 * m) ** 0.25, (12 * m) ** -0.25


def _pair(value: Optional[str], side: str, option: str) -> Optional[float]:
    if value is None:
        return None
    parts = str(value).split(",")
    try:
        numbers = [float(p) for p in parts]
    except ValueError:
        numbers = []
    if len(numbers) not in (1, 2):
        raise UserError(f"{option} takes one number or ENCODER,DECODER, got {value!r}")
    return numbers[0] if side == "encoder" or len(numbers) == 1 else numbers[1]


# ----------------------------------------------------------------------------------------------
# Layer mixins: each overrides fairseq's ``residual_connection(x, residual)`` (= residual + x),
# which fairseq's layers (and the multi-layer-attention layers) call once per sublayer, in order.
# ----------------------------------------------------------------------------------------------


class DeepNormResidual:
    """``residual_connection``: alpha * residual + x (the layer norm after it is fairseq's post-norm)."""

    deepnorm_alpha: float = 1.0

    def residual_connection(self, x, residual):
        return residual * self.deepnorm_alpha + x

    def residual_scales(self) -> Tensor:
        """alpha for every sublayer (see :func:`residual_scales`)."""
        return torch.full((_sublayers(self), self.embed_dim), float(self.deepnorm_alpha))


class ReZeroResidual:
    """``residual_connection``: residual + alpha * x, alpha = ``self.rezero_alpha`` (one per layer)."""

    #: why fairseq's own Transformer layer cannot compute this one (fairseq-deep-export)
    why_not_standard = (
        "ReZero's layers compute x + alpha F(x) without layer norm (Bachlechner "
        "et al. 2020), which no standard Transformer layer does"
    )

    def residual_connection(self, x, residual):
        return residual + self.rezero_alpha * x


# The B2T layer forward passes in flight: (the layer's input, a counter of its residual calls, how
# many it makes), set and reset by ``B2TResidual.forward`` (a context variable, as Admin's count)
_B2T_BOTTOM: ContextVar[Tuple[Tensor, Iterator[int], int]] = ContextVar("b2t_bottom")


class B2TResidual:
    """``residual_connection``: residual + x, and for the layer's last sublayer also the layer's
    input (the bottom), before the post-norm layer norm that ends the layer (Takase et al. 2023).

    A layer makes two residual calls (encoder) or three (decoder with encoder output), the FFN's
    last: ``forward`` keeps the input and counts the calls in a context variable, not on the
    module, so the layer is re-entrant."""

    #: why fairseq's own Transformer layer cannot compute this one (fairseq-deep-export)
    why_not_standard = (
        "B2T adds each layer's input to its last sublayer's output, past the inner layer norms "
        "(Takase et al. 2023), a connection no standard Transformer layer has"
    )

    def forward(self, x, *args, **kwargs):
        encoder_out = args[0] if args else kwargs.get("encoder_out")
        calls = 2 + (getattr(self, "encoder_attn", None) is not None and encoder_out is not None)
        token = _B2T_BOTTOM.set((x, itertools.count(), calls))
        try:
            return super().forward(x, *args, **kwargs)
        finally:
            _B2T_BOTTOM.reset(token)

    def residual_connection(self, x, residual):
        bottom, count, calls = _B2T_BOTTOM.get()
        out = residual + x
        return out + bottom if next(count) == calls - 1 else out


def b2t_rescale(layer: nn.Module, num_layers: int):
    """The authors' ``rescaling_init``: every weight matrix of the layer times N^(-1/2)."""
    with torch.no_grad():
        for module in layer.modules():
            if isinstance(module, nn.Linear):
                module.weight.mul_(num_layers**-0.5)


def admin_closed_form(init: str, residual_sublayers: int) -> float:
    """omega of admin-torch 0.1.0's ``calculate_init`` for ``init`` (O(logn), O(1), O(n)) and a stack
    of ``residual_sublayers`` (n): (n+1)/log(n+1) - 1, n or 1, square-rooted."""
    n = residual_sublayers
    value = {"O(logn)": (n + 1) / math.log(n + 1) - 1, "O(1)": n, "O(n)": 1.0}[init]
    return value**0.5


class AdminProfile:
    """The running output scale r of one stack while its first training batch profiles it."""

    def __init__(self):
        self.ratio = 1.0  # the embedding's share, taken as variance 1 (as the authors' code)


def _mean_over_workers(value: Tensor) -> Tensor:
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        value = value.clone()
        dist.all_reduce(value)
        value = value / dist.get_world_size()
    return value


# The sublayer calls of the Admin layer forward passes in flight: one counter per call, set and
# reset by ``AdminResidual.forward`` (a context variable, so nothing is written on the module and
# two passes in flight, nested or on two threads, each count their own sublayers).
_ADMIN_SUBLAYER: ContextVar[Iterator[int]] = ContextVar("admin_sublayer")


class AdminResidual:
    """``residual_connection``: residual * omega_i + x, omega_i (width d) of the layer's sublayer i.

    fairseq's layers do not say which sublayer calls ``residual_connection``: each ``forward``
    counts its own calls (it always runs the sublayers in the same order), so sublayer i uses row i
    of ``admin_omega``.  The count lives in a context variable, not on the module: the layer is
    re-entrant.  The first training forward profiles the layer (Liu et al. 2020, Sec. 4.3: it sets
    ``admin_omega`` and the buffer ``admin_profiled``, once); after that, and after a profiled
    checkpoint is loaded, a forward writes nothing.

    omega_i = ``admin_omega[i]`` + ``admin_omega_learned[i]``: the profile is a buffer, what
    training learns is a parameter that starts at 0.  The profile is written during a forward
    pass, and a parameter written there does not stay written under mixed precision: ``--fp16``
    and ``--bf16`` keep float32 master copies taken before the first forward and copy them back
    after the first step, and fully sharded training (``--ddp-backend fully_sharded``) computes on
    a temporary copy of its flat parameters, so the profile was silently lost (omega = 1 after one
    update, measured with ``--fp16``).  A buffer is the module's own in every precision and
    backend.  The gradient of the learned part is omega's gradient, so Adam takes the same steps
    as on omega itself (weight decay pulls the learned part, not omega, towards 0).  A checkpoint
    of the earlier form (``admin_omega`` a parameter holding omega whole) loads with a learned part
    of 0: the same omega.
    """

    _admin_done = False  # a Python copy of the buffer admin_profiled: no device sync per step

    def forward(self, *args, **kwargs):
        token = _ADMIN_SUBLAYER.set(itertools.count())
        try:
            return super().forward(*args, **kwargs)
        finally:
            _ADMIN_SUBLAYER.reset(token)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        learned = prefix + "admin_omega_learned"
        if learned not in state_dict and prefix + "admin_omega" in state_dict:  # the earlier form
            state_dict[learned] = torch.zeros_like(state_dict[prefix + "admin_omega"])
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        self._admin_done = bool(self.admin_profiled)

    def residual_connection(self, x, residual):
        index = next(_ADMIN_SUBLAYER.get())
        if self.training and not self._admin_done:
            with torch.no_grad():  # the learned part is 0 until the first update
                omega = self.admin_omega[index].fill_(self.admin_profile.ratio)
                variance = torch.stack([(residual.float() * omega.float()).var(), x.float().var()])
                self.admin_profile.ratio = float(_mean_over_workers(variance).sum().sqrt())
                if index == self.admin_omega.size(0) - 1:
                    self.admin_profiled.fill_(True)
                    self._admin_done = True
                    logger.debug(f"Admin profile: omega = {self.admin_omega.data[:, 0].tolist()}")
        return residual * (self.admin_omega[index] + self.admin_omega_learned[index]) + x

    def residual_scales(self) -> Tensor:
        """omega_i of every sublayer, one row each: the profile plus what training learned (see
        :func:`residual_scales`)."""
        return (self.admin_omega + self.admin_omega_learned).detach().clone()


# ----------------------------------------------------------------------------------------------
# Applying the schemes to a built layer
# ----------------------------------------------------------------------------------------------

_CLASSES: Dict[Tuple[type, type], type] = {}
_PLAIN_RESIDUAL = (
    TransformerEncoderLayerBase.residual_connection,
    TransformerDecoderLayerBase.residual_connection,
)


def _mix(layer: nn.Module, mixin: type):
    """Make ``layer`` an instance of ``mixin`` + its own class (one class per pair, made once)."""
    base = type(layer)
    if base.residual_connection not in _PLAIN_RESIDUAL:
        raise UserError(
            f"{base.__name__} has its own residual connection (e.g. --ta-no-encoder-residual); "
            "it takes no --deepnorm, --admin, --rezero or --b2t"
        )
    key = (mixin, base)
    if key not in _CLASSES:
        _CLASSES[key] = type(
            mixin.__name__.replace("Residual", "") + base.__name__,
            (mixin, base),
            {
                "__module__": __name__,
                "scheme_base": base,
                "__doc__": f"{base.__name__} with {mixin.__name__}.",
            },
        )
    layer.__class__ = _CLASSES[key]


def scheme_base(layer: nn.Module) -> type:
    """The class of ``layer`` before a residual scheme was mixed into it (its own class if none)."""
    return getattr(type(layer), "scheme_base", type(layer))


def residual_scales(layer: nn.Module) -> Optional[Tensor]:
    """What each sublayer's ``residual_connection`` multiplies its residual by, one row per
    sublayer in the order the layer runs them (self-attention, encoder attention, FFN), width d:
    1 for fairseq's own connection, alpha for DeepNorm, omega_i for Admin (their
    ``residual_scales``).  A post-norm layer with these scales computes LN(residual * s + F(x)),
    which fairseq-deep-export folds into fairseq's own layer (docs/export.md).  None for a residual
    connection that states no scale (ReZero's has none: ``why_not_standard``)."""
    own = getattr(layer, "residual_scales", None)
    if own is not None:
        return own()
    if type(layer).residual_connection in _PLAIN_RESIDUAL:
        return torch.ones(_sublayers(layer), layer.embed_dim)
    return None


def _attentions(layer: nn.Module):
    return [
        m
        for m in (getattr(layer, "self_attn", None), getattr(layer, "encoder_attn", None))
        if m is not None
    ]


def _sublayers(layer: nn.Module) -> int:
    return 2 + (getattr(layer, "encoder_attn", None) is not None)


def _init_deepnorm(layer: nn.Module, beta: float):
    """Fig. 2 of the paper: Xavier-normal, gain beta for the FFN and the value/output projections."""
    for attn in _attentions(layer):
        for proj, gain in (
            (attn.q_proj, 1.0),
            (attn.k_proj, 1.0),
            (attn.v_proj, beta),
            (attn.out_proj, beta),
        ):
            nn.init.xavier_normal_(proj.weight, gain=gain)
    for fc in (layer.fc1, layer.fc2):
        nn.init.xavier_normal_(fc.weight, gain=beta)


def ds_init_gain(index: int, alpha: float) -> float:
    """The gain of DS-Init for layer ``index`` (0-based): alpha / sqrt(l), l = index + 1."""
    return alpha / math.sqrt(index + 1)


def _init_ds(layer: nn.Module, gain: float):
    for module in layer.modules():
        if isinstance(module, nn.Linear):
            nn.init.xavier_uniform_(module.weight, gain=gain)


def apply_schemes(
    layer: nn.Module,
    cfg,
    side: str,
    index: int,
    num_layers: int,
    profile: Optional[AdminProfile] = None,
) -> nn.Module:
    """Layer ``index`` of the ``side`` stack (``num_layers`` deep) under the schemes of ``cfg``,
    changed in place and returned.  ``profile`` is the stack's shared Admin profile."""
    opts = check_schemes(cfg)
    depths = {s: _stack_options(cfg, s)[1] for s in ("encoder", "decoder")}
    if opts.ds_init:
        _init_ds(layer, ds_init_gain(index, opts.ds_init_alpha))
    norm_schemes.apply_to_layer(layer, opts, side, index, depths)
    if opts.deepnorm:
        alpha, beta = deepnorm_constants(
            side, _stack_options(cfg, "encoder")[1], _stack_options(cfg, "decoder")[1]
        )
        given_alpha = _pair(opts.deepnorm_alpha, side, "--deepnorm-alpha")
        given_beta = _pair(opts.deepnorm_beta, side, "--deepnorm-beta")
        alpha = alpha if given_alpha is None else given_alpha
        beta = beta if given_beta is None else given_beta
        _mix(layer, DeepNormResidual)
        layer.deepnorm_alpha = alpha
        _init_deepnorm(layer, beta)
    elif opts.admin:
        _mix(layer, AdminResidual)
        layer.register_buffer("admin_omega", torch.ones(_sublayers(layer), layer.embed_dim))
        layer.admin_omega_learned = nn.Parameter(torch.zeros(_sublayers(layer), layer.embed_dim))
        layer.register_buffer("admin_profiled", torch.tensor(False))
        layer.admin_profile = profile if profile is not None else AdminProfile()
        if opts.admin_init != "profile":  # admin-torch's closed form: nothing to profile
            sublayers = (2 if side == "encoder" else 3) * num_layers
            layer.admin_omega.fill_(admin_closed_form(opts.admin_init, sublayers))
            layer.admin_profiled.fill_(True)
            layer._admin_done = True
    elif opts.rezero:
        _mix(layer, ReZeroResidual)
        layer.rezero_alpha = nn.Parameter(torch.full((1,), float(opts.rezero_init)))
        for name in ("self_attn_layer_norm", "encoder_attn_layer_norm", "final_layer_norm"):
            if getattr(layer, name, None) is not None:
                setattr(layer, name, nn.Identity())
    elif opts.b2t:
        _mix(layer, B2TResidual)
        b2t_rescale(layer, num_layers)
    norm_schemes.replace_norms(layer, opts)  # DyT, last: every norm the schemes left
    return layer


def finish_stack(stack: nn.Module, cfg, side: str, num_layers: int):
    """The schemes' changes to a built stack outside its layers (Mix-LN's final norm, DyT's
    replacement of the stack's own norms): :func:`~fairseq_deep.modules.schemes.norm_schemes.finish_stack`."""
    norm_schemes.finish_stack(stack, check_schemes(cfg), side, num_layers)


def scheme_names(cfg) -> str:
    """The schemes that are on, for logs (``deepnorm+ds_init``), or ``""``."""
    opts = ResidualSchemesConfig.from_namespace(cfg)
    names = (*RESIDUAL_SCHEMES, "ds_init", *NORM_SCHEMES)
    return "+".join(name for name in names if norm_schemes.scheme_on(opts, name))


def unprofiled_admin_layers(model: nn.Module) -> int:
    """How many Admin layers of ``model`` still wait for their profile (0 after the first training batch)."""
    return sum(
        1 for m in model.modules() if isinstance(m, AdminResidual) and not bool(m.admin_profiled)
    )


# ----------------------------------------------------------------------------------------------
# Growing (fairseq-deep-grow, modules/common/growth.py): how a new layer of each residual connection
# starts as the identity, and DeepNorm's constants, which depend on the depth
# ----------------------------------------------------------------------------------------------


def _fairseq_layer_identity(layer: nn.Module):
    """fairseq's pre-norm layer computes x + F(LN(x)) per sublayer: with the output projection of
    every sublayer (self-attention, encoder attention, fc2) 0, it computes x + 0 + 0."""
    if type(layer).residual_connection not in _PLAIN_RESIDUAL:
        return f"its layers ({type(layer).__name__}) have a residual connection of their own"
    if not layer.normalize_before:
        return "its layers are post-norm Transformer layers (LN(x + 0) is not x)"
    return norm_schemes.identity_parameters(layer)  # Peri-LN's output norm too


def _deepnorm_options(args, new_args, request) -> List[str]:
    """DeepNorm's alpha and beta are functions of N and M: the grown model takes those of the new
    depth (a note: every layer, copied or not, computes another function), or with
    ``--deepnorm-constants keep`` the shallow depth's, written into ``--deepnorm-alpha/-beta``;
    ``--method identity`` needs ``keep``."""
    opts = DeepNormConfig.from_namespace(args)
    if request.constants == "keep":
        old = request.old_depths
        for opt, i in (("deepnorm_alpha", 0), ("deepnorm_beta", 1)):
            if getattr(opts, opt) is None:
                pair = [
                    deepnorm_constants(s, old["encoder"], old["decoder"])[i]
                    for s in ("encoder", "decoder")
                ]
                setattr(new_args, opt, f"{pair[0]!r},{pair[1]!r}")
        return []
    if (
        request.method == "identity"
        and request.new_depths != request.old_depths
        and opts.deepnorm_alpha is None
    ):
        raise GrowError(
            "--method identity with --deepnorm: DeepNorm's alpha of every layer depends on the depth, "
            "so the grown model computes another function; add --deepnorm-constants keep"
        )
    return ["DeepNorm: alpha/beta of the new depth (every layer's residual scale changes)"]


# fairseq's layers: a copy keeps its source's norm position (Mix-LN), Mix-LN's post-norm layers keep
# their count
for _layer in (TransformerEncoderLayerBase, TransformerDecoderLayerBase):
    declare_layer(
        _layer,
        role=norm_schemes.role,
        identity=_fairseq_layer_identity,
        options=norm_schemes.mix_ln_grow_options,
    )
declare_layer(
    DeepNormResidual,
    options=_deepnorm_options,
    identity=lambda layer: "its layers are post-norm DeepNorm layers (LN(alpha x + 0) is not x)",
)
# Admin's omegas (the profile, a buffer, and the learned part) and admin_profiled travel with their
# layer: a copied layer is not profiled again
declare_layer(
    AdminResidual,
    identity=lambda layer: "its layers are post-norm Admin layers (LN(omega x + 0) is not x)",
)
declare_layer(ReZeroResidual, identity=lambda layer: ["rezero_alpha"])  # alpha 0: x + 0 F(x)
declare_layer(
    B2TResidual,
    identity=lambda layer: "its layers are post-norm B2T layers (LN(x + 0 + x) is not x)",
)
