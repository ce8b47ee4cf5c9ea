"""Group permutation (GPKD) and Skipping Sub-Layer as settings of the Transformer stacks' layer
loop (Li, Wang, Liu, Du, Xiao, Zhang, Zhu, AAAI 2021: "Learning Light-Weight Translation Models
from Deep Transformer", Sec. 3 and 4; docs/distill.md, "GPKD and Skipping Sub-Layer").

**Group permutation** (Sec. 3): the L layers of a stack form G groups of L/G consecutive layers;
during training each batch runs the layers of every group in an order drawn at random, groups
staying in place, so that every layer of a group learns to stand for the whole group; a student
of G layers is then the teacher with one layer per group (``fairseq-deep-extract``,
:mod:`fairseq_deep.extract`).  In eval mode (validation, decoding) the layers run in their natural
order, so that the options do not change what a trained model computes.  With a layer history
(DLCL, Wang et al. 2019) the history records its entries in *execution* order: row r of the DLCL
weights forms the input of whichever layer runs r-th, and entry k is the output of whichever layer
ran k-th.  The weights belong to positions and the layers move between the positions of their
group.  The paper's teachers are pre-norm Transformers, whose residual stream has no positions to
keep; for DLCL this is our reading of the method: the layers of a group are interchangeable and
the connections are not.  It is also what the natural order computes at inference (position = layer),
and what the extracted student keeps: the weights of the chosen layers' positions.

**Skipping Sub-Layer** (Sec. 4): sub-layer m (1-based, counted over the stack in the order the
layers run them: self-attention, encoder attention, FFN) of a stack of S sub-layers is skipped
during training with probability ``p_m = rate * m / S``, a rate that grows linearly with depth (the
paper's rate grows with depth; these constants are the authors' code's, (2l+1)/(2L) and
(2l+2)/(2L) per encoder layer: the paper's text was not at hand to compare them).  A skipped
sub-layer passes its input on: the pre-norm layer computes ``x + M F(LN(x))``
with M in {0, 1}, so the layer still has an output and a DLCL history keeps its row (unlike
fairseq's LayerDrop, which drops whole layers and shifts the rows: refused with DLCL).  At
inference the output of sub-layer m is scaled by ``1 - p_m``, ``x + (1 - p_m) F(LN(x))``, as the
authors' code does and the issue reads the paper (the expectation of the training-time sum, as
stochastic depth, Huang et al. 2016): a rate is then part of what the model computes, an
architecture option compared on restore.

What differs from the authors' code (libeineu/GPKD, fairseq 0.6.2), and why:

* group option: ours is the number of groups (the student's depth), ``--gpkd-encoder-groups``; the
  authors' ``--enc-group`` is the number of layers per group;
* the authors' decoder slices its groups with the encoder's group size (``i * enc_group`` ..
  ``(i+1) * dec_group``) and, in eval mode, loops over ``encoder_layers`` decoder layers: each
  stack here uses its own groups and depth;
* order: one permutation per batch (the authors draw with Python's ``random``, we with torch's
  generator, which fairseq seeds, so that a run is reproducible);
* skipping: one decision per *sentence* (the authors draw one per batch, ``torch.rand(1)``): every
  parameter is then used in every step (DDP needs no ``--find-unused-parameters``) and a batch
  never loses a whole sub-layer's gradient; the sub-layer is computed and multiplied by the mask,
  so no time is saved;
* the first layer is never skipped (as the authors' encoder): its sub-layers have p = 0, also at
  inference, where the authors still scale the first layer's outputs by (1 - p) though training
  never skipped them;
* the authors' decoder numbers its sub-layers self-attention 3l+1, FFN 3l+2, encoder attention 3l+3
  (not the order they run in), scales the self-attention's *residual* instead of its output at
  inference, and is never used (``layer_d = 0`` in every preset): ours counts the sub-layers in the
  order they run and scales outputs on both stacks alike; which stacks skip is
  ``--skip-sublayer-stacks`` (default ``encoder``, the authors' setting);
* skipping is defined on pre-norm layers (``x + F(LN(x))``); a post-norm stack is refused.

Both are offered by the families where the paper defines them, the pre-norm Transformer and DLCL
(``transformer_dlcl``: the model class says so, ``gpkd_defined``); every other Transformer family
refuses the options by name when it is built (:func:`check_gpkd`).
"""

from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import torch
from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from torch import Tensor, nn

from ...errors import UserError
from ..common.growth import declare_layer
from .stream_schemes import StreamSchemesConfig, chosen

SKIP_STACKS = ("encoder", "decoder", "both")


@dataclass
class GPKDConfig(FairseqDataclass):
    """The options of group permutation and Skipping Sub-Layer (Li et al. 2021)."""

    gpkd_encoder_groups: int = field(
        default=0,
        metadata={
            "architecture": False,  # training only: eval mode runs the natural order
            "help": "group permutation (GPKD, Li et al. 2021, Sec. 3): the encoder's layers in this "
            "many groups of equal size, each group's layers run in a random order per batch in "
            "training (the depth of the student fairseq-deep-extract makes); 0: off",
        },
    )
    gpkd_decoder_groups: int = field(
        default=0,
        metadata={
            "architecture": False,
            "help": "group permutation of the decoder's layers (as --gpkd-encoder-groups); 0: off",
        },
    )
    skip_sublayer_rate: float = field(
        default=0.0,
        metadata={
            "help": "Skipping Sub-Layer (Li et al. 2021, Sec. 4): sub-layer m of S skipped in "
            "training with probability rate*m/S (one draw per sentence; never the first layer), its "
            "output scaled by 1 - rate*m/S at inference; 0: off"
        },
    )
    skip_sublayer_stacks: ChoiceEnum(list(SKIP_STACKS)) = field(
        default="encoder",
        metadata={
            "help": "the stacks whose sub-layers --skip-sublayer-rate skips (the authors' code: the "
            "encoder)"
        },
    )


def _on(opts: GPKDConfig) -> List[str]:
    return [
        flag
        for flag, value in (
            ("--gpkd-encoder-groups", opts.gpkd_encoder_groups),
            ("--gpkd-decoder-groups", opts.gpkd_decoder_groups),
            ("--skip-sublayer-rate", opts.skip_sublayer_rate),
        )
        if value
    ]


def skip_sides(opts: GPKDConfig) -> Tuple[str, ...]:
    """The stacks whose sub-layers are skipped (none when the rate is 0)."""
    if not opts.skip_sublayer_rate:
        return ()
    return (
        ("encoder", "decoder")
        if opts.skip_sublayer_stacks == "both"
        else (str(opts.skip_sublayer_stacks),)
    )


def check_gpkd(args, defined: bool) -> GPKDConfig:
    """The options of ``args`` (a model's namespace after its preset), or a UserError in one line:
    a family where the paper does not define them (``defined``), groups that do not divide a
    stack, a rate outside [0, 1), skipping on a post-norm stack or with a stream-level scheme."""
    opts = GPKDConfig.from_namespace(args)
    on = _on(opts)
    if on and not defined:
        raise UserError(
            f"{' and '.join(on)} (Li et al. 2021) {'are' if len(on) > 1 else 'is'} defined for "
            "the pre-norm Transformer and DLCL (transformer_dlcl, transformer_prenorm, ...), "
            f"not for --arch {args.arch}"
        )
    for side in ("encoder", "decoder"):
        groups, depth = getattr(opts, f"gpkd_{side}_groups"), getattr(args, f"{side}_layers")
        if groups < 0 or (groups and depth % groups):
            raise UserError(
                f"--gpkd-{side}-groups {groups} does not divide the {side}'s {depth} layers into "
                f"groups of equal size: give a divisor of {depth} (or 0: off)"
            )
        if groups and getattr(args, f"{side}_layerdrop"):
            raise UserError(
                f"--gpkd-{side}-groups orders the {side}'s layers itself, and "
                f"--{side}-layerdrop drops some: set --{side}-layerdrop 0"
            )
    if not 0 <= opts.skip_sublayer_rate < 1:
        raise UserError(f"--skip-sublayer-rate must be in [0, 1), got {opts.skip_sublayer_rate}")
    for side in skip_sides(opts):
        if not getattr(args, f"{side}_normalize_before"):
            raise UserError(
                f"--skip-sublayer-rate skips sub-layers of pre-norm layers, x + F(LN(x)) (Li et al. "
                f"2021, Sec. 4), but the {side} is post-norm: use a pre-norm --arch "
                f"(transformer_dlcl, transformer_prenorm) or --skip-sublayer-stacks"
            )
    streams = chosen(StreamSchemesConfig.from_namespace(args))
    if skip_sides(opts) and streams:
        raise UserError(
            f"--skip-sublayer-rate takes no stream-level scheme ({' '.join(streams)}): a skipped "
            "sub-layer passes on the plain residual stream"
        )
    return opts


# ---------------------------------------------------------------------------------------------
# group permutation: the order of the layers in a forward pass
# ---------------------------------------------------------------------------------------------


def layer_order(num_layers: int, groups: int, training: bool) -> Optional[List[int]]:
    """The indices of the layers in the order a forward pass runs them, or None for the natural
    order (eval mode, no groups, or groups of one layer): groups of ``num_layers // groups``
    consecutive layers, each group's order drawn with torch's generator."""
    if not training or groups <= 0 or groups >= num_layers:
        return None
    size = num_layers // groups
    order: List[int] = []
    for g in range(groups):
        order += (g * size + torch.randperm(size)).tolist()
    return order


def ordered(layers: Sequence[nn.Module], groups: int, training: bool) -> Sequence[nn.Module]:
    """``layers`` in the order this forward pass runs them (:func:`layer_order`)."""
    order = layer_order(len(layers), groups, training)
    return layers if order is None else [layers[i] for i in order]


# ---------------------------------------------------------------------------------------------
# Skipping Sub-Layer: a mixin on the layer's residual connection
# ---------------------------------------------------------------------------------------------

# the rates of the sub-layers still to run in the layer forward pass in flight (a context
# variable, set by ``forward``: the module stores nothing during a pass, as Admin's count)
_RATES: ContextVar[Iterator[float]] = ContextVar("skip_sublayer_rates")


class SkippingSublayers:
    """Mixed into a pre-norm fairseq layer: each ``residual_connection(x, residual)`` (one per
    sub-layer, in the order they run) adds ``M * x`` in training, M ~ Bernoulli(1 - p) drawn per
    sentence, and ``(1 - p) * x`` in eval mode; p is the sub-layer's rate (``skip_rates``)."""

    #: why fairseq's own Transformer layer does not compute this one (fairseq-deep-export)
    why_not_standard = (
        "Skipping Sub-Layer scales each sub-layer's output by 1 - p at inference (Li et al. "
        "2021, Sec. 4); fairseq-deep-extract writes a student with the scales folded into its "
        "weights (docs/distill.md)"
    )

    def forward(self, *args, **kwargs):
        token = _RATES.set(iter(self.skip_rates))
        try:
            return super().forward(*args, **kwargs)
        finally:
            _RATES.reset(token)

    def residual_connection(self, x: Tensor, residual: Tensor) -> Tensor:
        rate = next(_RATES.get())
        if rate > 0:
            if self.training:  # time-first: one decision per sentence (dimension 1)
                keep = torch.rand((1, x.size(1), 1), device=x.device) >= rate
                x = x * keep.to(x.dtype)
            else:
                x = x * (1.0 - rate)
        return super().residual_connection(x, residual)


_CLASSES: Dict[type, type] = {}


def sublayer_count(layer: nn.Module) -> int:
    """Self-attention, encoder attention (a decoder layer with one), FFN."""
    return 2 + (getattr(layer, "encoder_attn", None) is not None)


def skip_rates(rate: float, index: int, num_layers: int, per_layer: int) -> Tuple[float, ...]:
    """The rates of the sub-layers of layer ``index`` (0-based) of ``num_layers``: rate * m / S for
    sub-layer m (1-based over the stack) of S = per_layer * num_layers; 0 in the first layer."""
    total = per_layer * num_layers
    if index == 0:
        return (0.0,) * per_layer
    return tuple(rate * (index * per_layer + k + 1) / total for k in range(per_layer))


def apply_skipping(layer: nn.Module, cfg, side: str, index: int, num_layers: int) -> nn.Module:
    """Layer ``index`` of the ``side`` stack under ``--skip-sublayer-rate`` (changed in place and
    returned; the layer as it is where the rate is 0 or the stack does not skip).  Every layer of
    a skipping stack takes the mixin, the first with rates 0, so that all have one class
    (fairseq-deep-grow copies a layer into one of its class)."""
    opts = GPKDConfig.from_namespace(cfg)
    if side not in skip_sides(opts):
        return layer
    if not layer.normalize_before:  # Mix-LN's bottom layers
        raise UserError(
            f"--skip-sublayer-rate skips sub-layers of pre-norm layers, but {side} layer "
            f"{index + 1} is post-norm (--mix-ln-ratio): set --skip-sublayer-stacks to the other stack"
        )
    base = type(layer)
    if base not in _CLASSES:
        _CLASSES[base] = type(
            f"Skipping{base.__name__}", (SkippingSublayers, base), {"scheme_base": base}
        )
    layer.__class__ = _CLASSES[base]
    per_layer = sublayer_count(layer)
    layer.skip_rates = skip_rates(opts.skip_sublayer_rate, index, num_layers, per_layer)
    return layer


def inference_scales(layer: nn.Module) -> List[Tuple[str, float]]:
    """(the linear map that ends a sub-layer, under the layer; its inference scale 1 - p) for each
    skipped sub-layer of ``layer``: ``(1 - p)(W x + b) = ((1 - p) W) x + (1 - p) b``, which
    fairseq-deep-extract folds into the student's weights."""
    rates = getattr(layer, "skip_rates", None)
    if rates is None:
        return []
    names = ["self_attn.out_proj"]
    if getattr(layer, "encoder_attn", None) is not None:
        names.append("encoder_attn.out_proj")
    names.append("fc2")
    return [(name, 1.0 - rate) for name, rate in zip(names, rates) if rate > 0]


def _no_identity(layer: nn.Module) -> str:
    return (
        "Skipping Sub-Layer's rates depend on the depth (rate * m / S), so a deeper stack scales "
        "the kept layers' sub-layers otherwise at inference"
    )


# fairseq-deep-grow (modules/common/growth.py): a skipping layer is copied as its base class is
# (the grown stack's rates are the new depth's); --method identity cannot keep the outputs
declare_layer(SkippingSublayers, identity=_no_identity)
