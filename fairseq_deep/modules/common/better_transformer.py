"""No "BetterTransformer" fast path in the encoder layers this package builds.

Replaces: fairseq 0.12.2's fast path of ``TransformerEncoderLayerBase`` (the official release,
Python <= 3.10): eight extra parameters per layer (fused copies of the attention and FFN weights,
filled when a state dict is loaded) and, in eval mode without grad, a fused kernel
(``torch._transformer_encoder_layer_fwd``) that expects batch-first input, a known mask type and
fairseq's own sub-modules.  Our stacks call layers time-first, replace layer norms (post-norm
DLCL, ReZero), change the residual and add parameters, so the fast path would decode wrong or
crash, and the unused copies would stop DDP and inflate parameter counts (docs/design.md, "Two
fairseq stacks").  :func:`without_better_transformer`, called by the stacks' layer builders, turns
it off for every encoder layer the package builds: the same parameters, the same outputs and the
same checkpoints on both stacks.  No function of fairseq's is replaced and nothing is installed
at import, so it is no module of ``patches/`` but the layers' own (it imports neither fairseq nor
the rest of the package).

Under fully sharded training (fairscale's FSDP flattens each wrapped layer's parameters into one
``flat_param``) a state dict holds no weight of the layer's own, and 0.12.2's
``_load_from_state_dict``, which reads them to fill the fused copies, raised a ``KeyError``: a run
saved with ``--use-sharded-state`` did not resume (docs/fully_sharded.md).  Such a layer loads with
empty stand-ins for the weights it reads, dropped again with the fused copies.

Versions: fairseq 0.12.2; on later fairseq (ve-fairseq 0.12.3), which removed the path, it only
drops the keys of 0.12.2 checkpoints.

Pinned by: tests/test_stacks.py (no parameter a fused copy, checkpoints of either stack load and
compute the same, decoding alone equals decoding in a padded batch), tests/test_old_checkpoints.py,
tests/test_aggregation.py (``without_better_transformer_keys``: a baseline of fairseq's own
``transformer`` written on 0.12.2, loaded by ``--init-from-pretrained``).
"""

import torch

#: the fused copies that fairseq 0.12.2's TransformerEncoderLayerBase adds for its fast path
BETTER_TRANSFORMER_PARAMS = (
    "in_proj_weight",
    "in_proj_bias",
    "out_proj_weight",
    "out_proj_bias",
    "fc1_weight",
    "fc1_bias",
    "fc2_weight",
    "fc2_bias",
)

#: the weights 0.12.2's ``_load_from_state_dict`` reads from the state dict to make the fused copies
READ_BY_FAST_PATH = tuple(
    f"{module}.{name}"
    for module in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")
    + ("self_attn.out_proj", "fc1", "fc2")
    for name in ("weight", "bias")
)
#: what stands in for them where the layer's parameters are flat (fully sharded): dropped on loading
_STAND_IN = torch.empty(0)


def without_better_transformer(layer):
    """``layer`` (a fairseq encoder layer, or a subclass) without fairseq 0.12.2's fast path.

    Removes the layer's fused parameter copies (never trained: they are only filled on loading),
    keeps the fused kernel from being chosen (``can_use_fastpath``; the stacks of this package also
    never enter fairseq's nested-tensor encoder loop), and drops those keys from any state dict
    the layer loads, whether 0.12.2's ``_load_from_state_dict`` just made them or a checkpoint
    written on 0.12.2 holds them.  Returns the layer."""
    for name in BETTER_TRANSFORMER_PARAMS:
        if name in layer._parameters:
            del layer._parameters[name]
    if hasattr(layer, "can_use_fastpath"):
        layer.can_use_fastpath = False
    if _drop_better_transformer_keys not in layer._load_state_dict_pre_hooks.values():
        layer._register_load_state_dict_pre_hook(_drop_better_transformer_keys)
    if hasattr(layer, "load_to_BT") and "_load_from_state_dict" not in vars(layer):  # 0.12.2
        layer._load_from_state_dict = _load_flat_safe.__get__(layer)
    return layer


def _load_flat_safe(layer, state_dict, prefix, *args):
    """The layer's own ``_load_from_state_dict`` (0.12.2's and its subclasses'), with empty
    stand-ins for the weights 0.12.2's reads where fully sharded training flattened the layer's
    parameters (its q_proj has no weight of its own: the wrapper's flat_param holds it)."""
    if "weight" not in layer.self_attn.q_proj._parameters:
        for name in READ_BY_FAST_PATH:
            state_dict.setdefault(prefix + name, _STAND_IN)
    type(layer)._load_from_state_dict(layer, state_dict, prefix, *args)


def _drop_better_transformer_keys(state_dict, prefix, *args):
    """Load-state-dict pre-hook: runs after 0.12.2's ``_load_from_state_dict`` added the fused
    copies and before torch matches keys, so neither stack sees them as unexpected."""
    for name in BETTER_TRANSFORMER_PARAMS:
        state_dict.pop(prefix + name, None)
    for name in READ_BY_FAST_PATH:
        if state_dict.get(prefix + name) is _STAND_IN:
            del state_dict[prefix + name]


def without_better_transformer_keys(state_dict):
    """A copy of ``state_dict`` without the fused copies of fairseq 0.12.2's encoder layers (a
    checkpoint of fairseq's own ``transformer`` written on 0.12.2 holds them, zeros unless it was
    loaded before): the entries ``P.in_proj_weight``, ... of every layer ``P`` that has
    ``P.self_attn.q_proj.weight``."""
    suffix = "self_attn.q_proj.weight"
    fused = {
        prefix + name
        for prefix in (k[: -len(suffix)] for k in state_dict if k.endswith("." + suffix))
        for name in BETTER_TRANSFORMER_PARAMS
    }
    return type(state_dict)((k, v) for k, v in state_dict.items() if k not in fused)
