"""Which models of the package are fairseq's own ``transformer``, and its parameters for them
(``fairseq-deep-export``, docs/export.md).

Each family declares, beside its model, a rule (``reduction`` of its declaration,
:mod:`fairseq_deep.models.families`): the built model -> None when fairseq's ``transformer``
computes the same function, up to a fold of its parameters, or else why not, in one line.  The
Transformer families declare :func:`residual_stacks`, which reads what the model computes, not
its name: both stacks run the residual history (no DLCL, no
aggregation: ``LayerHistory.not_residual``) over fairseq's own layers (no multi-layer attention,
no ReZero, no layer without residual: ``why_not_standard``).  The recurrent families declare
:func:`never`.

Such a model may still scale the residual of its sublayers: a post-norm sublayer computes
``LN(s * x + F(x))`` with s = 1 (fairseq's own), alpha (DeepNorm) or omega_i, one per dimension
(Admin) (``residual_scales``).  :func:`fold` moves s into fairseq's parameters, exactly (up to
float rounding), without touching any layer norm's epsilon: the stock model's residual stream
carries ``s * x`` instead of x.  With s_k the scale of sublayer k of a stack (bottom first):

* the layer norm that ends sublayer k (the one that makes x_k) is multiplied by s_{k+1} (gamma
  and beta), so that it outputs s_{k+1} * x_k, the residual sublayer k+1 adds;
* the linear maps that read sublayer k's input (q, k, v of self-attention; q of encoder
  attention; fc1) take the columns of their weights divided by s_k, so that F(x) is unchanged;
* the stack's input x_0 is multiplied by s_1: the token embedding's columns and the positions
  (a learned table in the stock model: ``--{encoder,decoder}-learned-pos``), or the embedding
  layer norm's gamma and beta when there is one;
* the last layer norm of the encoder is unchanged (the decoder's attention reads x itself); that of
  the decoder is divided by s_1 when the output projection is the (scaled) decoder embedding, so
  that the logits are unchanged; the scaled embeddings are no longer shared with the encoder's.

LayerScale's lambda (``modules/schemes/norm_schemes.py``) multiplies a sublayer's output, so it folds into
the rows and bias of the linear map that ends the sublayer (out_proj, fc2), in pre- and post-norm
layers alike (:func:`_fold_output_scales`).  The schemes that add or replace layer norms (Sub-LN,
Peri-LN, DyT), mix norm positions in a stack (Mix-LN between 0 and 1) or add a connection (B2T)
do not reduce: :func:`residual_stacks` says why.
"""

from typing import Callable, Dict, List, Optional, Tuple

import torch
from fairseq.modules.transformer_layer import (
    TransformerDecoderLayer,
    TransformerDecoderLayerBase,
    TransformerEncoderLayer,
    TransformerEncoderLayerBase,
)
from torch import Tensor, nn

from ..errors import UserError
from ..modules.schemes.norm_schemes import mixed_norm_positions, output_scales
from ..modules.schemes.norm_schemes import why_not_standard as norm_why_not_standard
from ..modules.schemes.residual_schemes import residual_scales, scheme_base
from . import families

#: what serves a model that does not reduce
SERVED_BY = (
    "serve it with fairseq-deep-interactive or the hub interface "
    "(Model.from_pretrained), which run its own code (docs/export.md)"
)

STANDARD_LAYERS = (
    TransformerEncoderLayerBase,
    TransformerDecoderLayerBase,
    TransformerEncoderLayer,
    TransformerDecoderLayer,
)


class Never:
    """The rule of a family no model of which reduces (:func:`never`); ``why`` says why."""

    def __init__(self, why: str):
        self.why = why

    def __call__(self, model: nn.Module) -> Optional[str]:
        return self.why


def never(why: str) -> Callable[[nn.Module], Optional[str]]:
    """The rule of a family no model of which reduces (one line: why)."""
    return Never(why)


def why_not_transformer(family: str, model: nn.Module) -> Optional[str]:
    """None when ``model`` (of ``family``, a model name) reduces to fairseq's ``transformer``, else
    why not (the rule the family declares)."""
    declared = families.get(family)
    if declared is None:
        return f"the family {family} declares no reduction to fairseq's transformer"
    return declared.reduction(model)


def residual_stacks(model: nn.Module) -> Optional[str]:
    """The rule of the Transformer families: the residual history over fairseq's own layers."""
    for side in ("encoder", "decoder"):
        stack = getattr(model, side)
        why = stack.history.not_residual()
        if why is not None:
            return f"{why} (its {side})"
        why = mixed_norm_positions(stack.layers)
        if why is not None:
            return f"{why} (its {side})"
        for layer in stack.layers:
            name = type(layer).__name__
            why = getattr(layer, "why_not_standard", None) or norm_why_not_standard(layer)
            if why is None and scheme_base(layer) not in STANDARD_LAYERS:
                why = f"its {side} layers are {name}, not fairseq's Transformer layers"
            if why is None and residual_scales(layer) is None:
                why = f"its {side} layers ({name}) have a residual connection of their own"
            if why is not None:
                return why
    return None


# ---------------------------------------------------------------------------------------------
# the fold
# ---------------------------------------------------------------------------------------------

#: sublayer -> (the linear maps that read its input, the layer norm that ends it), in fairseq's
#: layers
SUBLAYERS = {
    "self_attn": (
        ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
        "self_attn_layer_norm",
    ),
    "encoder_attn": (("encoder_attn.q_proj",), "encoder_attn_layer_norm"),
    "ffn": (("fc1",), "final_layer_norm"),
}


def sublayer_names(layer: nn.Module) -> List[str]:
    """The sublayers of a fairseq layer, in the order it runs them (and calls
    ``residual_connection``)."""
    cross = ["encoder_attn"] if getattr(layer, "encoder_attn", None) is not None else []
    return ["self_attn", *cross, "ffn"]


def position_table(stack: nn.Module, max_positions: int) -> Tensor:
    """The stack's positions as the table of fairseq's learned positions (``max_positions`` +
    padding_idx + 1 rows; rows up to padding_idx are zeros): the module's own output, whether it
    is sinusoidal or learned, on the positions 1..max_positions."""
    pad = stack.padding_idx
    tokens = torch.full((1, max_positions), pad + 1, dtype=torch.long)
    with torch.no_grad():
        rows = stack.embed_positions(tokens)[0].float()
    return torch.cat([rows.new_zeros(pad + 1, rows.size(-1)), rows])


def fold(model: nn.Module) -> Tuple[Dict[str, Tensor], Dict[str, object], List[str]]:
    """(state dict, option changes, notes): the parameters of fairseq's ``transformer`` that
    computes what ``model`` (a model :func:`residual_stacks` accepts) computes, with the residual
    scales folded in (module docstring); the options of the stock model that change
    (``encoder_learned_pos``, ``share_all_embeddings``, ...); what was folded, for the user.
    Entries of ``model`` that the stock model has no place for (Admin's omega) are left in."""
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}  # ties become copies
    changes: Dict[str, object] = {}
    notes: List[str] = []
    for side in ("encoder", "decoder"):
        note = _fold_stack(state, model, side, changes)
        if note:
            notes.append(note)
        note = _fold_output_scales(state, model, side)
        if note:
            notes.append(note)
        _norm_position(model, side, changes)
    if notes and model.encoder.embed_tokens is model.decoder.embed_tokens:
        changes["share_all_embeddings"] = False  # each side's embedding took its own scale
        changes["share_decoder_input_output_embed"] = True  # implied by sharing all
        notes.append(
            "the encoder and decoder embeddings are no longer shared (each carries its "
            "stack's scale)"
        )
    return state, changes, notes


def _fold_stack(
    state: Dict[str, Tensor], model: nn.Module, side: str, changes: Dict[str, object]
) -> str:
    stack = getattr(model, side)
    sublayers = []  # (key prefix of the layer, sublayer name, scale s, float64 of width d)
    for i, layer in enumerate(stack.layers):
        for name, scale in zip(sublayer_names(layer), residual_scales(layer).double()):
            sublayers.append((f"{side}.layers.{i}.", name, scale))
    if all(bool((s == 1).all()) for _, _, s in sublayers):
        return ""
    if any(layer.normalize_before for layer in stack.layers):
        raise UserError(
            f"the {side} is pre-norm and scales its residuals: fairseq-deep-export "
            "folds residual scales of post-norm layers only"
        )
    smallest = min(float(s.abs().min()) for _, _, s in sublayers)
    if smallest < 1e-6:
        raise UserError(
            f"a residual scale of the {side} is {smallest:.3g}: so small a scale "
            "cannot be divided out of the next sublayer's weights"
        )
    unsupported = [
        flag
        for flag, present in (
            ("--adaptive-softmax-cutoff", getattr(stack, "adaptive_softmax", None) is not None),
            (f"--{side}-input-dim", getattr(stack, "project_in_dim", None) is not None),
            (f"--{side}-output-dim", getattr(stack, "project_out_dim", None) is not None),
        )
        if present
    ]
    if unsupported:
        raise UserError(
            f"the residual scales of the {side} cannot be folded into a model with "
            f"{', '.join(unsupported)}"
        )

    first = sublayers[0][2]
    scales_embedding = stack.layernorm_embedding is None
    tied = side == "decoder" and stack.output_projection.weight is stack.embed_tokens.weight
    last = 1 / first if tied and scales_embedding else torch.ones_like(first)
    for k, (prefix, name, scale) in enumerate(sublayers):
        linears, norm = SUBLAYERS[name]
        for linear in linears:
            _scale(state, f"{prefix}{linear}.weight", 1 / scale)  # columns: W x = (W / s)(s x)
        after = sublayers[k + 1][2] if k + 1 < len(sublayers) else last
        for p in ("weight", "bias"):
            _scale(state, f"{prefix}{norm}.{p}", after)
    if not scales_embedding:
        for p in ("weight", "bias"):
            _scale(state, f"{side}.layernorm_embedding.{p}", first)
    else:
        _scale(state, f"{side}.embed_tokens.weight", first)
        if tied:
            state[f"{side}.output_projection.weight"] = state[f"{side}.embed_tokens.weight"]
        if stack.embed_positions is not None:
            limit = stack.max_source_positions if side == "encoder" else stack.max_target_positions
            state[f"{side}.embed_positions.weight"] = position_table(stack, limit)
            _scale(state, f"{side}.embed_positions.weight", first)
            changes[f"{side}_learned_pos"] = True
    values = torch.stack([s for _, _, s in sublayers])
    same = bool((values == values[0, 0]).all())
    what = (
        f"{float(values[0, 0]):.6g} (one scale)"
        if same
        else f"{float(values.min()):.4g} to {float(values.max()):.4g} (one per dimension)"
    )
    where = (
        "the embedding layer norm"
        if not scales_embedding
        else "the token embeddings"
        + (" and positions (now a learned table)" if stack.embed_positions is not None else "")
    )
    return (
        f"{side}: {len(sublayers)} residual scales of {what} folded into the layer norms, the "
        f"input columns of q/k/v and fc1, and {where}"
    )


def _fold_output_scales(state: Dict[str, Tensor], model: nn.Module, side: str) -> str:
    """LayerScale (Touvron et al. 2021): lambda (W x + b) = (diag(lambda) W) x + lambda b, the rows
    of the linear map that ends each sublayer (the attentions' out_proj, fc2) times its lambda."""
    folded = 0
    for i, layer in enumerate(getattr(model, side).layers):
        for linear, scale in output_scales(layer):
            prefix = f"{side}.layers.{i}.{linear}."
            weight = state[prefix + "weight"]
            state[prefix + "weight"] = (weight.double() * scale.double()[:, None]).to(weight.dtype)
            if prefix + "bias" in state:
                _scale(state, prefix + "bias", scale.double())
            folded += 1
    if not folded:
        return ""
    return f"{side}: {folded} LayerScale vectors folded into the rows of out_proj and fc2"


def _norm_position(model: nn.Module, side: str, changes: Dict[str, object]):
    """A stack whose layers all sit at another norm position than its options say (Mix-LN with
    ratio 1: every layer post-norm, no final norm, in a pre-norm configuration) is fairseq's
    transformer with the layers' position."""
    stack = getattr(model, side)
    kinds = {bool(layer.normalize_before) for layer in stack.layers}
    configured = bool(getattr(stack.cfg, side).normalize_before)
    if len(kinds) == 1 and kinds != {configured}:
        changes[f"{side}_normalize_before"] = kinds.pop()


def _scale(state: Dict[str, Tensor], key: str, factor: Tensor):
    """``state[key]`` times ``factor`` along its last dimension, computed in float64."""
    value = state[key]
    state[key] = (value.double() * factor).to(value.dtype)
