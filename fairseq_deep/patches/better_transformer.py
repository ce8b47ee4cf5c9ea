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
at import; the models import this module alone (it imports neither fairseq nor the rest of the
package).

Versions: fairseq 0.12.2; on later fairseq (ve-fairseq 0.12.3), which removed the path, it only
drops the keys of 0.12.2 checkpoints.

Pinned by: tests/test_stacks.py (no parameter a fused copy, checkpoints of either stack load and
compute the same, decoding alone equals decoding in a padded batch), tests/test_old_checkpoints.py,
tests/test_aggregation.py (``without_better_transformer_keys``: a baseline of fairseq's own
``transformer`` written on 0.12.2, loaded by ``--init-from-pretrained``).
"""

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
    return layer


def _drop_better_transformer_keys(state_dict, prefix, *args):
    """Load-state-dict pre-hook: runs after 0.12.2's ``_load_from_state_dict`` added the fused
    copies and before torch matches keys, so neither stack sees them as unexpected."""
    for name in BETTER_TRANSFORMER_PARAMS:
        state_dict.pop(prefix + name, None)


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
