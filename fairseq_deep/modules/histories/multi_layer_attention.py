"""Multi-layer attention (Dou et al. 2018, Sec. 3.1.2, Eq. 8).

The self-attention of layer l attends to the k layers below it with separate attention models,
C^l_{-i} = ATT(Q^l, K^{l-i}, V^{l-i}) for i = 1..k, and AGG combines them into one d-dimensional
vector C^l = AGG(C^l_{-1}, ..., C^l_{-k}) that takes the place of the self-attention output in
the layer (Eq. 1, 2).  Only self-attention changes, never encoder-decoder attention.

Layer l (1-based; layer 0 is the embedding) attends to min(k, l) layers: lower layers with fewer
than k predecessors use what exists, so layer 1 is a plain fairseq layer.  C^l_{-1} is the
layer's own ``self_attn`` (fairseq's parameter names, so a baseline checkpoint initialises it);
the attentions over layers l-2 ... l-k live in ``lower_attention``.  "Layer l-i" means the states
the backbone fed into layer l-i+1, i.e. H^{l-i} of the plain Transformer (with an aggregation
history: what that layer actually read).  In pre-norm stacks the lower states pass through the
layer's ``self_attn_layer_norm``, as its own input does.

Incremental decoding: each lower-layer attention is its own ``MultiheadAttention``, whose keys and
values of earlier positions are cached in the incremental state under that module's id (and
reordered with the beam by fairseq like any other); a step feeds it the new position's state of
its lower layer only.

How, the way fairseq's ``examples/latent_depth`` changes its layers (the smallest hook, no copied
forward): fairseq's encoder and decoder layers run as they are; their self-attention, built by
fairseq's hook ``build_self_attention``, is :class:`MultiLayerSelfAttention`, fairseq's module
whose output becomes AGG over the lower layers while its layer's forward runs, and the layers'
``forward`` only hands it the lower layers' states (a context variable, nothing on the module).
"""

import contextlib
import contextvars
from dataclasses import dataclass, field
from typing import List, Optional

from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.modules import MultiheadAttention
from fairseq.modules.transformer_layer import (
    TransformerDecoderLayerBase,
    TransformerEncoderLayerBase,
)
from fairseq.utils import safe_getattr
from torch import Tensor, nn

from ..common.growth import declare_layer


@dataclass
class MultiLayerAttentionConfig(FairseqDataclass):
    """The ``--mla-*`` options (Dou et al. 2018, Sec. 3.1.2), read by :func:`mla_window` only."""

    mla_layers: int = field(
        default=1,
        metadata={
            "help": "multi-layer attention (Eq. 8): self-attention of layer l attends to "
            "layers l-1..l-k with separate attentions combined by AGG; 1 = off"
        },
    )
    mla_stacks: ChoiceEnum(["both", "encoder", "decoder"]) = field(
        default="both",
        metadata={"help": "stacks whose self-attention is multi-layer (--mla-layers > 1)"},
    )


def mla_window(cfg, side: str) -> int:
    """k of Eq. 8 for the `side` ("encoder"/"decoder") stack: how many layers its self-attentions
    attend to (1 = off, the plain layer)."""
    opts = MultiLayerAttentionConfig.from_namespace(cfg)
    k = opts.mla_layers
    if k < 1:
        raise ValueError(f"--mla-layers must be >= 1 (1 turns multi-layer attention off), got {k}")
    return k if opts.mla_stacks in ("both", side) else 1


class LowerLayerAttention(nn.Module):
    """The attentions over layers l-2 ... l-n-1 and the AGG node of Eq. 8 (n = ``num_lower``)."""

    def __init__(
        self, embed_dim: int, num_heads: int, num_lower: int, node_factory, attention_dropout=0.0
    ):
        super().__init__()
        self.attns = nn.ModuleList(
            MultiheadAttention(embed_dim, num_heads, dropout=attention_dropout)
            for _ in range(num_lower)
        )
        self.agg = node_factory(num_lower + 1, 0)  # top input: C_{-1}, the nearest layer's

    def forward(
        self,
        query: Tensor,
        own: Tensor,
        lower: List[Tensor],
        key_padding_mask=None,
        attn_mask=None,
        incremental_state=None,
    ) -> Tensor:
        """own: C_{-1}; lower: states of layers l-2, l-3, ... (nearest first), T x B x C."""
        outputs = [own]
        for attn, states in zip(self.attns, lower):
            c, _ = attn(
                query=query,
                key=states,
                value=states,
                key_padding_mask=key_padding_mask,
                incremental_state=incremental_state,
                need_weights=False,
                attn_mask=attn_mask,
            )
            outputs.append(c)
        return self.agg(outputs)


def _check_cfg(cfg):
    for name, flag in (
        ("cross_self_attention", "--cross-self-attention"),
        ("scale_attn", "--scale-attn"),
        ("scale_heads", "--scale-heads"),
    ):
        if safe_getattr(cfg, name, False):
            raise ValueError(
                f"multi-layer attention (--mla-layers > 1) does not support {flag}: drop it"
            )


class MultiLayerSelfAttention(MultiheadAttention):
    """fairseq's self-attention of an MLA layer: C^l_{-1}, fairseq's module with its parameters,
    their names and its incremental cache, whose output becomes Eq. 8's AGG(C^l_{-1}, ..., C^l_{-k})
    while its own layer's forward runs (:func:`_reading_lower_layers`).  The one method of
    fairseq's layers that multi-layer attention changes: they call it and do the rest (residual,
    layer norms, encoder attention, feed-forward) as they always do."""

    def forward(
        self,
        query,
        key,
        value,
        key_padding_mask=None,
        incremental_state=None,
        need_weights=True,
        static_kv=False,
        attn_mask=None,
        before_softmax=False,
        need_head_weights=False,
    ):
        own, weights = super().forward(
            query,
            key,
            value,
            key_padding_mask=key_padding_mask,
            incremental_state=incremental_state,
            need_weights=need_weights,
            static_kv=static_kv,
            attn_mask=attn_mask,
            before_softmax=before_softmax,
            need_head_weights=need_head_weights,
        )
        reading = _LOWER.get()
        if reading is None or reading[0] is not self:
            return own, weights
        _, lower_attention, lower = reading
        return lower_attention(
            query,
            own,
            lower,
            key_padding_mask=key_padding_mask,
            attn_mask=attn_mask,
            incremental_state=incremental_state,
        ), weights


#: (the self-attention, its layer's LowerLayerAttention, the lower layers' states) while an MLA
#: layer's forward runs: a context variable, not an attribute, so that nothing is stored on a
#: module during a forward pass (re-entrant: activation checkpointing, two passes in flight)
_LOWER = contextvars.ContextVar("fairseq_deep_mla_lower", default=None)


@contextlib.contextmanager
def _reading_lower_layers(layer, lower: Optional[List[Tensor]]):
    """While the block runs, ``layer``'s self-attention also attends to ``lower`` (the inputs of
    layers l-1, l-2, ..., nearest first; at most ``layer.num_lower``), which pass through the
    layer's ``self_attn_layer_norm`` in a pre-norm stack, as its own input does."""
    lower = list(lower or [])[: layer.num_lower]
    if layer.normalize_before:
        lower = [layer.self_attn_layer_norm(h) for h in lower]
    token = _LOWER.set((layer.self_attn, layer.lower_attention, lower))
    try:
        yield
    finally:
        _LOWER.reset(token)


class _MultiLayerAttention:
    """What both MLA layers add to fairseq's: the attentions over the lower layers and AGG
    (``lower_attention``), and a self-attention that reads them (:class:`MultiLayerSelfAttention`,
    through fairseq's builder hook ``build_self_attention``)."""

    #: why fairseq's own layer cannot compute this one (fairseq-deep-export)
    why_not_standard = (
        "multi-layer attention: its self-attention also attends to the layers "
        "below (Dou et al. 2018)"
    )

    def _add_lower_attention(self, cfg, side, num_lower: int, node_factory):
        _check_cfg(cfg)
        self.num_lower = num_lower
        self.lower_attention = LowerLayerAttention(
            self.embed_dim,
            getattr(cfg, side).attention_heads,
            num_lower,
            node_factory,
            cfg.attention_dropout,
        )

    def build_self_attention(self, embed_dim, cfg, *args, **kwargs):
        attn = super().build_self_attention(embed_dim, cfg, *args, **kwargs)
        attn.__class__ = (
            MultiLayerSelfAttention  # fairseq's module as fairseq built it, one method more
        )
        return attn


class MultiLayerAttentionEncoderLayer(_MultiLayerAttention, TransformerEncoderLayerBase):
    """fairseq's encoder layer whose self-attention output is Eq. 8's AGG over lower layers."""

    def __init__(self, cfg, num_lower: int, node_factory, return_fc=False):
        super().__init__(cfg, return_fc=return_fc)
        self._add_lower_attention(cfg, "encoder", num_lower, node_factory)

    def forward(self, x, encoder_padding_mask, attn_mask=None, lower=None):
        with _reading_lower_layers(self, lower):
            return super().forward(x, encoder_padding_mask, attn_mask)


class MultiLayerAttentionDecoderLayer(_MultiLayerAttention, TransformerDecoderLayerBase):
    """fairseq's decoder layer whose self-attention output is Eq. 8's AGG over lower layers;
    encoder-decoder attention and feed-forward are fairseq's."""

    def __init__(self, cfg, num_lower: int, node_factory, no_encoder_attn=False):
        super().__init__(cfg, no_encoder_attn=no_encoder_attn)
        self._add_lower_attention(cfg, "decoder", num_lower, node_factory)

    def forward(self, x, *args, lower=None, **kwargs):
        if kwargs.get("prev_self_attn_state") is not None:
            raise ValueError(
                "multi-layer attention layers do not take prev_self_attn_state (the attentions "
                "over the lower layers keep caches of their own)"
            )
        with _reading_lower_layers(self, lower):
            return super().forward(x, *args, **kwargs)


# fairseq-deep-grow (modules/common/growth.py): a copy attends to as many lower layers as its source
# (layer l to min(k, l)), and no new layer with lower attention starts as the identity
for _layer in (MultiLayerAttentionEncoderLayer, MultiLayerAttentionDecoderLayer):
    declare_layer(
        _layer,
        role=lambda layer: layer.num_lower,
        identity=lambda layer: (
            "multi-layer attention (each layer also attends to the outputs of the layers below it)"
        ),
    )
