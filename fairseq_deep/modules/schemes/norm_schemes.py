"""Where a Transformer layer's layer norms go, what stands in for them, and a scale on each
sublayer's output: five later schemes, each a setting of whatever layer a stack builds.

They are applied by :func:`~fairseq_deep.modules.schemes.residual_schemes.apply_schemes` to the layer
``build_layer`` returned (fairseq's layer, a multi-layer-attention layer), before it is wrapped for
activation checkpointing and FSDP, and by :func:`finish_stack` to the stack's own norms (the final
layer norm of a pre-norm stack, the embedding's, a history's), so they compose with every layer
history.  Nothing is rewritten: a layer norm is added inside the modules that compute a sublayer
(a mixin on its output projection, :class:`SubLayerNormInput`, or on the module whose output is
the sublayer's output, :class:`SublayerOutput`), replaced by another module, or a layer's
``normalize_before`` is set.

* **Sub-LN / Magneto** (Wang, Ma, Huang, Dong, Wang, Peng, Wu, Bajaj, Singhal, Benhaim, Patra,
  Liu, Chaudhary, Song, Wei, ICML 2023, "Magneto: A Foundation Transformer", Sec. 2-3): pre-norm
  sublayers with a second layer norm inside, before the output projection:
  attention ``x + W_O LN(Attn(LN(x)))``, FFN ``x + W_2 LN(phi(W_1 LN(x)))``.  As the authors' code
  (torchscale 0.3.0, ``component/multihead_attention.py``: ``inner_attn_ln`` only ``if subln and
  self.self_attention``) the encoder-decoder attention gets no inner norm.  Initialisation
  (torchscale ``architecture/encoder.py``, ``decoder.py``): after the usual initialisation, the
  weights and biases of fc1, fc2 and of every attention's value and output projections are
  multiplied by gamma; for N encoder and M decoder layers, encoder gamma = sqrt(log(3M) log(2N)
  / 3), decoder gamma = sqrt(log(3M)).
* **Peri-LN** (Kim, Lee, Park, Oh, Kim, Yoo, Shin, Han, Shin, Yoo, ICML 2025, "Peri-LN: Revisiting
  Normalization Layer in the Transformer Architecture"): a layer norm on the input and on the
  output of every sublayer, ``x + LN_out(F(LN_in(x)))``; the residual stream itself is never
  normalised.  The paper gives no code; the output norm is applied before the sublayer's dropout
  (as fairseq's NormFormer ``attn_ln``), the stack keeps pre-norm's final layer norm, and the
  embedding's layer norm is fairseq's own ``--layernorm-embedding`` (off unless asked for).
* **Mix-LN** (Li, Yin, Liu, ICLR 2025, "Mix-LN: Unleashing the Power of Deeper Layers by Combining
  Pre-LN and Post-LN"): the first floor(alpha L) layers of a stack of L are post-norm, the rest
  pre-norm; alpha = 0.25 in the authors' scripts (3 post-norm layers of 12 at 71M parameters, 6 of
  24 at 1B).  Their LLaMA keeps its final norm whatever alpha; here a stack ends with a layer norm
  exactly when its top layer is pre-norm, so that alpha = 0 is fairseq's pre-norm Transformer and
  alpha = 1 its post-norm one.
* **DyT** (Zhu, Chen, He, LeCun, Liu, CVPR 2025, "Transformers without Normalization"): every
  layer norm becomes ``DyT(x) = gamma * tanh(alpha x) + beta``, alpha one learned scalar per
  norm, initialised to alpha_0 = 0.5 (the paper's default outside LLMs; the authors' LLaMA runs
  start the norms in front of attention at a larger alpha_0 than the others, here
  ``--dyt-alpha-init-attention``).  Every norm of the stack is replaced: the layers' (and the
  inner norms of Sub-LN and Peri-LN), the stack's final and embedding norms, a DLCL history's.
* **LayerScale** (Touvron, Cord, Sablayrolles, Synnaeve, Jegou, ICCV 2021, "Going deeper with
  Image Transformers", Sec. 2): ``x + diag(lambda) F(x)``, lambda a learned vector of width d per
  sublayer, initialised to epsilon: 0.1 for stacks of up to 18 layers, 1e-5 up to 24, 1e-6 deeper
  (the paper; the authors' ``cait_models.py``: 1e-5 at depth 24, 1e-6 at 36 and 48).  lambda
  multiplies the sublayer's output before its dropout (the same, dropout being elementwise), so
  it also folds exactly into the output projection (``models/reduction.py``).
"""

import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import torch
from fairseq.dataclass import FairseqDataclass
from fairseq.modules import MultiheadAttention
from torch import Tensor, nn

from ...errors import UserError


@dataclass
class SubLNConfig(FairseqDataclass):
    """The ``--subln`` option (Wang et al. 2023)."""

    subln: bool = field(
        default=False,
        metadata={
            "help": "Sub-LN (Magneto, Wang et al. 2023): pre-norm sublayers with a second layer "
            "norm before the output projection, and gamma-scaled initialisation"
        },
    )


@dataclass
class PeriLNConfig(FairseqDataclass):
    """The ``--peri-ln`` option (Kim et al. 2025)."""

    peri_ln: bool = field(
        default=False,
        metadata={
            "help": "Peri-LN (Kim et al. 2025): a layer norm on the input and on the output of "
            "every sublayer, x + LN(F(LN(x)))"
        },
    )


@dataclass
class MixLNConfig(FairseqDataclass):
    """The ``--mix-ln-ratio`` option (Li et al. 2025)."""

    mix_ln_ratio: Optional[str] = field(
        default=None,
        metadata={
            "help": "Mix-LN (Li et al. 2025): the first floor(R L) layers of each stack post-norm, "
            "the rest pre-norm; R in [0, 1] (the paper's 0.25), or ENCODER,DECODER"
        },
    )


@dataclass
class DyTConfig(FairseqDataclass):
    """The ``--dyt*`` options (Zhu et al. 2025)."""

    dyt: bool = field(
        default=False,
        metadata={
            "help": "DyT (Zhu et al. 2025): every layer norm replaced by gamma tanh(alpha x) + beta, "
            "alpha learned"
        },
    )
    dyt_alpha_init: float = field(
        default=0.5,
        metadata={"architecture": False, "help": "initial alpha of every DyT (the paper's 0.5)"},
    )
    dyt_alpha_init_attention: Optional[float] = field(
        default=None,
        metadata={
            "architecture": False,
            "help": "initial alpha of the DyT of the attention sublayers (default: --dyt-alpha-init)",
        },
    )


@dataclass
class LayerScaleConfig(FairseqDataclass):
    """The ``--layerscale*`` options (Touvron et al. 2021)."""

    layerscale: bool = field(
        default=False,
        metadata={
            "help": "LayerScale (Touvron et al. 2021): x + diag(lambda) F(x), lambda learned per "
            "channel and sublayer"
        },
    )
    layerscale_init: Optional[float] = field(
        default=None,
        metadata={
            "architecture": False,
            "help": "initial lambda (default from the stack's depth L: 0.1 for L <= 18, 1e-5 for "
            "L <= 24, 1e-6 deeper)",
        },
    )


@dataclass
class NormSchemesConfig(SubLNConfig, PeriLNConfig, MixLNConfig, DyTConfig, LayerScaleConfig):
    """Every option of this module (composed into ``ResidualSchemesConfig``)."""


#: the options that turn a scheme of this module on, for logs and for the hybrids' refusal
NORM_SCHEMES = ("subln", "peri_ln", "mix_ln_ratio", "dyt", "layerscale")


def scheme_on(opts, name: str) -> bool:
    return getattr(opts, name) not in (None, False)


def mix_ln_ratio(opts, side: str) -> Optional[float]:
    """R of ``--mix-ln-ratio`` for one side, or None when Mix-LN is off."""
    value = opts.mix_ln_ratio
    if value is None:
        return None
    try:
        numbers = [float(p) for p in str(value).split(",")]
    except ValueError:
        numbers = []
    if len(numbers) not in (1, 2) or not all(0 <= r <= 1 for r in numbers):
        raise UserError(
            f"--mix-ln-ratio takes one number in [0, 1] or ENCODER,DECODER, got {value!r}"
        )
    return numbers[0] if side == "encoder" or len(numbers) == 1 else numbers[1]


def post_norm_layers(ratio: float, num_layers: int) -> int:
    """floor(ratio L): how many bottom layers Mix-LN makes post-norm (the 1e-9 keeps a ratio
    written as k / L from rounding down to k - 1)."""
    return min(num_layers, int(math.floor(ratio * num_layers + 1e-9)))


def check_norm_schemes(opts, normalize_before: Dict[str, bool], residual: List[str]):
    """A UserError for a combination of this module's schemes that makes no sense.
    ``normalize_before``: each side's, ``residual``: the residual schemes that are on."""
    pre_norm = [s for s in ("subln", "peri_ln", "mix_ln_ratio") if scheme_on(opts, s)]
    for name in pre_norm:
        for side in ("encoder", "decoder"):
            if not normalize_before[side]:
                flag = f"--{name.replace('_', '-')}"
                arch = {"subln": "subln", "peri_ln": "periln", "mix_ln_ratio": "mixln"}[name]
                raise UserError(
                    f"{flag} needs a pre-norm stack, but the {side} is post-norm: use --arch "
                    f"transformer_{arch} (or a pre-norm --arch such as transformer_prenorm, "
                    "transformer_dlcl)"
                )
        mix_ln_ratio(opts, "encoder")
    if scheme_on(opts, "mix_ln_ratio") and (opts.subln or opts.peri_ln):
        other = "--subln" if opts.subln else "--peri-ln"
        raise UserError(
            f"--mix-ln-ratio makes the bottom layers post-norm, and {other} is built on "
            "pre-norm layers: choose one"
        )
    for name in ("dyt", "layerscale"):
        if getattr(opts, name) and "rezero" in residual:
            what = (
                "has no layer norm to replace"
                if name == "dyt"
                else "already scales each layer's sublayers"
            )
            raise UserError(f"--rezero {what} (--{name}): choose one")
    if opts.subln and opts.ds_init:
        raise UserError(
            "--subln and --ds-init both set the scale of the initial weights: choose one"
        )


# ----------------------------------------------------------------------------------------------
# Modules and mixins
# ----------------------------------------------------------------------------------------------


class DynamicTanh(nn.Module):
    """DyT (Zhu et al. 2025, Eq. 1): ``weight * tanh(alpha * x) + bias``, alpha a learned scalar."""

    def __init__(self, normalized_shape, alpha_init: float = 0.5):
        super().__init__()
        self.normalized_shape = tuple(normalized_shape)
        self.alpha = nn.Parameter(torch.full((1,), float(alpha_init)))
        self.weight = nn.Parameter(torch.ones(self.normalized_shape))
        self.bias = nn.Parameter(torch.zeros(self.normalized_shape))

    def forward(self, x: Tensor) -> Tensor:
        return torch.tanh(self.alpha * x) * self.weight + self.bias

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}"


class SubLayerNormInput:
    """Mixed into an output projection (``nn.Linear``): ``W LN(x) + b`` (Sub-LN's inner norm,
    ``sub_layer_norm``)."""

    def forward(self, x: Tensor) -> Tensor:
        return super().forward(self.sub_layer_norm(x))


class SublayerOutput:
    """Mixed into the module whose output is a sublayer's output (the self-attention, or multi-layer
    attention's combination of it; the encoder attention; the FFN's ``fc2``): its output y becomes
    ``layer_scale * output_layer_norm(y)``, each part only when present (Peri-LN's output norm,
    LayerScale's lambda).  Attention modules return (y, weights): y is changed, the weights not."""

    def forward(self, *args, **kwargs):
        out = super().forward(*args, **kwargs)
        if isinstance(out, tuple):
            return (self.sublayer_output(out[0]), *out[1:])
        return self.sublayer_output(out)

    def sublayer_output(self, y: Tensor) -> Tensor:
        if self.output_layer_norm is not None:
            y = self.output_layer_norm(y)
        if self.layer_scale is not None:
            y = y * self.layer_scale
        return y


_MIXED: Dict[Tuple[type, type], type] = {}


def _mix_into(module: nn.Module, mixin: type):
    """Make ``module`` an instance of ``mixin`` + its own class (one class per pair, made once)."""
    if isinstance(module, mixin):
        return
    key = (mixin, type(module))
    if key not in _MIXED:
        _MIXED[key] = type(
            mixin.__name__ + type(module).__name__,
            (mixin, type(module)),
            {"__module__": __name__, "__doc__": f"{type(module).__name__} with {mixin.__name__}."},
        )
    module.__class__ = _MIXED[key]


def _sublayer_output(module: nn.Module) -> nn.Module:
    """``module`` as a :class:`SublayerOutput` (its parts registered, None until set)."""
    if not isinstance(module, SublayerOutput):
        _mix_into(module, SublayerOutput)
        module.register_module("output_layer_norm", None)
        module.register_parameter("layer_scale", None)
    return module


def sublayer_outputs(layer: nn.Module) -> List[Tuple[str, nn.Module]]:
    """(name, module) of the modules whose outputs are the layer's sublayer outputs, in the order the
    layer runs them: the self-attention (multi-layer attention's ``lower_attention``, which
    combines it with the attentions over lower layers), the encoder attention, the FFN's fc2."""
    lower = getattr(layer, "lower_attention", None)
    found = [("lower_attention", lower) if lower is not None else ("self_attn", layer.self_attn)]
    if getattr(layer, "encoder_attn", None) is not None:
        found.append(("encoder_attn", layer.encoder_attn))
    found.append(("fc2", layer.fc2))
    return found


def _is_layer_norm(module: nn.Module) -> bool:
    return isinstance(module, nn.LayerNorm) or type(module).__name__ == "FusedLayerNorm"


def _layer_norm(dim: int, like: nn.Module) -> nn.LayerNorm:
    """A layer norm of width ``dim`` on the device and dtype of ``like``'s parameters."""
    p = next(like.parameters())
    return nn.LayerNorm(dim).to(device=p.device, dtype=p.dtype)


# ----------------------------------------------------------------------------------------------
# Applying the schemes
# ----------------------------------------------------------------------------------------------


def subln_gamma(side: str, encoder_layers: int, decoder_layers: int) -> float:
    """gamma of Sub-LN's initialisation for one side of an N + M encoder-decoder (torchscale)."""
    n, m = encoder_layers, decoder_layers
    if side == "encoder":
        return math.sqrt(math.log(3 * m) * math.log(2 * n) / 3)
    return math.sqrt(math.log(3 * m))


def layerscale_epsilon(num_layers: int) -> float:
    """LayerScale's initial lambda for a stack of ``num_layers`` (Touvron et al. 2021, Sec. 2)."""
    if num_layers <= 18:
        return 0.1
    return 1e-5 if num_layers <= 24 else 1e-6


def _self_attentions(layer: nn.Module) -> List[MultiheadAttention]:
    """Every attention of the layer but the encoder attention (multi-layer attention's lower ones
    included)."""
    cross = getattr(layer, "encoder_attn", None)
    return [m for m in layer.modules() if isinstance(m, MultiheadAttention) and m is not cross]


def apply_to_layer(layer: nn.Module, opts, side: str, index: int, depths: Dict[str, int]):
    """Mix-LN, Sub-LN, Peri-LN and LayerScale on layer ``index`` of the ``side`` stack (``depths``:
    {"encoder": N, "decoder": M}), in place; DyT comes last (:func:`replace_norms`)."""
    num_layers = depths[side]
    ratio = mix_ln_ratio(opts, side)
    if ratio is not None:
        layer.normalize_before = index >= post_norm_layers(ratio, num_layers)
    if opts.subln:
        for attn in _self_attentions(layer):
            attn.skip_embed_dim_check = True  # fairseq's fused path would skip the inner norm
            _mix_into(attn.out_proj, SubLayerNormInput)
            attn.out_proj.sub_layer_norm = _layer_norm(attn.out_proj.in_features, attn.out_proj)
        _mix_into(layer.fc2, SubLayerNormInput)
        layer.fc2.sub_layer_norm = _layer_norm(layer.fc2.in_features, layer.fc2)
        gamma = subln_gamma(side, depths["encoder"], depths["decoder"])
        with torch.no_grad():
            for name, module in layer.named_modules():
                if isinstance(module, nn.Linear) and name.rsplit(".", 1)[-1] in (
                    "fc1",
                    "fc2",
                    "v_proj",
                    "out_proj",
                ):
                    module.weight.mul_(gamma)
                    if module.bias is not None:
                        module.bias.mul_(gamma)
    if opts.peri_ln:
        for _, module in sublayer_outputs(layer):
            _sublayer_output(module).output_layer_norm = _layer_norm(layer.embed_dim, module)
    if opts.layerscale:
        eps = opts.layerscale_init
        eps = layerscale_epsilon(num_layers) if eps is None else eps
        for _, module in sublayer_outputs(layer):
            p = next(module.parameters())
            _sublayer_output(module).layer_scale = nn.Parameter(
                torch.full((layer.embed_dim,), float(eps), device=p.device, dtype=p.dtype)
            )


_ATTENTION_NORMS = ("self_attn_layer_norm", "encoder_attn_layer_norm")


def replace_norms(module: nn.Module, opts, skip: Tuple[str, ...] = (), prefix: str = ""):
    """DyT: every layer norm under ``module`` (but the children named in ``skip``) replaced by a
    :class:`DynamicTanh` of its width, which starts from the norm's gamma and beta."""
    if not opts.dyt:
        return
    attention_alpha = opts.dyt_alpha_init_attention
    for name, child in list(module.named_children()):
        if not prefix and name in skip:
            continue
        if _is_layer_norm(child):
            alpha = opts.dyt_alpha_init
            if name in _ATTENTION_NORMS and attention_alpha is not None:
                alpha = attention_alpha
            dyt = DynamicTanh(child.normalized_shape, alpha)
            p = next(child.parameters(), None)
            if p is not None:
                dyt = dyt.to(device=p.device, dtype=p.dtype)
                with torch.no_grad():
                    dyt.weight.copy_(child.weight)
                    dyt.bias.copy_(child.bias)
            setattr(module, name, dyt)
        else:
            replace_norms(child, opts, skip, prefix=f"{prefix}{name}.")


def finish_stack(stack: nn.Module, opts, side: str, num_layers: int):
    """What the schemes change in a built stack outside its layers (which are wrapped by then):
    Mix-LN drops the final layer norm when every layer is post-norm, DyT replaces the stack's own
    norms (final, embedding, a history's)."""
    ratio = mix_ln_ratio(opts, side)
    if ratio is not None and post_norm_layers(ratio, num_layers) == num_layers:
        stack.layer_norm = None
    replace_norms(stack, opts, skip=("layers",))


# ----------------------------------------------------------------------------------------------
# What the tools read: exporting (models/reduction.py) and growing (modules/common/growth.py)
# ----------------------------------------------------------------------------------------------


def why_not_standard(layer: nn.Module) -> Optional[str]:
    """Why fairseq's own Transformer layer cannot compute ``layer``, for the schemes of this module
    that add or replace norms (None when it can, LayerScale being a fold of the output projection)."""
    modules = list(layer.modules())
    if any(isinstance(m, DynamicTanh) for m in modules):
        return (
            "DyT replaces every layer norm by gamma tanh(alpha x) + beta (Zhu et al. 2025), "
            "which no standard Transformer layer computes"
        )
    if any(isinstance(m, SubLayerNormInput) for m in modules):
        return (
            "Sub-LN (Magneto) adds a layer norm inside each sublayer, before its output "
            "projection (Wang et al. 2023), which a standard Transformer layer has no place for"
        )
    if any(getattr(m, "output_layer_norm", None) is not None for m in modules):
        return (
            "Peri-LN normalises each sublayer's output before the residual addition (Kim et al. "
            "2025), which a standard Transformer layer has no place for"
        )
    return None


def mixed_norm_positions(layers) -> Optional[str]:
    """Why a stack whose layers are post-norm and pre-norm (Mix-LN) is no standard Transformer."""
    kinds = [bool(layer.normalize_before) for layer in layers]
    if len(set(kinds)) < 2:
        return None
    return (
        f"Mix-LN: {kinds.count(False)} of its {len(kinds)} layers are post-norm and the rest "
        "pre-norm (Li et al. 2025), and a standard Transformer has one layer norm position per stack"
    )


def output_scales(layer: nn.Module) -> List[Tuple[str, Tensor]]:
    """(the key of the linear map that ends a sublayer, under the layer, LayerScale's lambda) for
    every sublayer with a LayerScale: ``lambda (W x + b) = (diag(lambda) W) x + lambda b``."""
    found = []
    for name, module in sublayer_outputs(layer):
        scale = getattr(module, "layer_scale", None)
        if scale is not None:
            found.append((name if name == "fc2" else f"{name}.out_proj", scale.detach()))
    return found


def identity_parameters(layer: nn.Module) -> List[str]:
    """The parameters of a pre-norm layer that, set to 0, make every sublayer's output 0: the
    output projection's weight and bias, and Peri-LN's output norm's beta (LN(0) = beta; DyT(0) =
    beta too)."""
    names = []
    for name, module in sublayer_outputs(layer):
        proj = "fc2" if name == "fc2" else f"{name}.out_proj"
        names += [f"{proj}.weight", f"{proj}.bias"]
        if getattr(module, "output_layer_norm", None) is not None:
            names.append(f"{name}.output_layer_norm.bias")
    return names


def role(layer: nn.Module):
    """What a copy of a layer must share with its source (fairseq-deep-grow): pre- or post-norm."""
    return bool(layer.normalize_before)


def mix_ln_grow_options(args, new_args, request) -> List[str]:
    """Mix-LN when a stack grows: the grown stacks keep the shallow ones' post-norm bottom layers
    (the same count, not the same ratio), so that every copied layer keeps its kind and ``--method
    identity`` adds pre-norm layers on top; ``--mix-ln-ratio`` is written as ENCODER,DECODER."""
    opts = MixLNConfig.from_namespace(args)
    if opts.mix_ln_ratio is None:
        return []
    counts = {
        side: post_norm_layers(mix_ln_ratio(opts, side), request.old_depths[side])
        for side in ("encoder", "decoder")
    }
    ratios = [counts[s] / request.new_depths[s] for s in ("encoder", "decoder")]
    new_args.mix_ln_ratio = f"{ratios[0]!r},{ratios[1]!r}"
    return [
        f"Mix-LN: the grown stacks keep {counts['encoder']} + {counts['decoder']} post-norm bottom "
        f"layers (--mix-ln-ratio {new_args.mix_ln_ratio})"
    ]
