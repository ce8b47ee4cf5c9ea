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
"""

from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch
from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.modules import MultiheadAttention
from fairseq.modules.transformer_layer import (
    TransformerDecoderLayerBase,
    TransformerEncoderLayerBase,
)
from fairseq.utils import safe_getattr
from torch import Tensor, nn

from .growth import declare_layer


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


class MultiLayerAttentionEncoderLayer(TransformerEncoderLayerBase):
    """fairseq's encoder layer whose self-attention output is Eq. 8's AGG over lower layers."""

    #: why fairseq's own layer cannot compute this one (fairseq-deep-export)
    why_not_standard = (
        "multi-layer attention: its self-attention also attends to the layers "
        "below (Dou et al. 2018)"
    )

    def __init__(self, cfg, num_lower: int, node_factory, return_fc=False):
        super().__init__(cfg, return_fc=return_fc)
        _check_cfg(cfg)
        self.num_lower = num_lower
        self.lower_attention = LowerLayerAttention(
            self.embed_dim,
            cfg.encoder.attention_heads,
            num_lower,
            node_factory,
            cfg.attention_dropout,
        )

    def forward(
        self,
        x,
        encoder_padding_mask: Optional[Tensor],
        attn_mask: Optional[Tensor] = None,
        lower: Optional[List[Tensor]] = None,
    ):
        if attn_mask is not None:
            attn_mask = attn_mask.masked_fill(
                attn_mask.to(torch.bool), -1e8 if x.dtype == torch.float32 else -1e4
            )
        lower = list(lower or [])[: self.num_lower]
        residual = x
        if self.normalize_before:
            x = self.self_attn_layer_norm(x)
            lower = [self.self_attn_layer_norm(h) for h in lower]
        own, _ = self.self_attn(
            query=x,
            key=x,
            value=x,
            key_padding_mask=encoder_padding_mask,
            need_weights=False,
            attn_mask=attn_mask,
        )
        x = self.lower_attention(
            x, own, lower, key_padding_mask=encoder_padding_mask, attn_mask=attn_mask
        )
        x = self.dropout_module(x)
        x = self.residual_connection(x, residual)
        if not self.normalize_before:
            x = self.self_attn_layer_norm(x)

        residual = x  # the feed-forward sublayer, as fairseq's
        if self.normalize_before:
            x = self.final_layer_norm(x)
        x = self.activation_dropout_module(self.activation_fn(self.fc1(x)))
        x = self.fc2(x)
        fc_result = x
        x = self.residual_connection(self.dropout_module(x), residual)
        if not self.normalize_before:
            x = self.final_layer_norm(x)
        if self.return_fc and not torch.jit.is_scripting():
            return x, fc_result
        return x


class MultiLayerAttentionDecoderLayer(TransformerDecoderLayerBase):
    """fairseq's decoder layer whose self-attention output is Eq. 8's AGG over lower layers;
    encoder-decoder attention and feed-forward are fairseq's."""

    why_not_standard = MultiLayerAttentionEncoderLayer.why_not_standard

    def __init__(self, cfg, num_lower: int, node_factory, no_encoder_attn=False):
        super().__init__(cfg, no_encoder_attn=no_encoder_attn)
        _check_cfg(cfg)
        self.num_lower = num_lower
        self.lower_attention = LowerLayerAttention(
            self.embed_dim,
            cfg.decoder.attention_heads,
            num_lower,
            node_factory,
            cfg.attention_dropout,
        )

    def forward(
        self,
        x,
        encoder_out: Optional[Tensor] = None,
        encoder_padding_mask: Optional[Tensor] = None,
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        prev_self_attn_state: Optional[List[Tensor]] = None,
        prev_attn_state: Optional[List[Tensor]] = None,
        self_attn_mask: Optional[Tensor] = None,
        self_attn_padding_mask: Optional[Tensor] = None,
        need_attn: bool = False,
        need_head_weights: bool = False,
        lower: Optional[List[Tensor]] = None,
    ):
        if prev_self_attn_state is not None or prev_attn_state is not None:
            raise ValueError(
                "multi-layer attention layers do not take prev_self_attn_state/prev_attn_state"
            )
        if need_head_weights:
            need_attn = True
        lower = list(lower or [])[: self.num_lower]
        residual = x
        if self.normalize_before:
            x = self.self_attn_layer_norm(x)
            lower = [self.self_attn_layer_norm(h) for h in lower]
        own, _ = self.self_attn(
            query=x,
            key=x,
            value=x,
            key_padding_mask=self_attn_padding_mask,
            incremental_state=incremental_state,
            need_weights=False,
            attn_mask=self_attn_mask,
        )
        x = self.lower_attention(
            x,
            own,
            lower,
            key_padding_mask=self_attn_padding_mask,
            attn_mask=self_attn_mask,
            incremental_state=incremental_state,
        )
        x = self.dropout_module(x)
        x = self.residual_connection(x, residual)
        if not self.normalize_before:
            x = self.self_attn_layer_norm(x)

        attn = None  # encoder-decoder attention and feed-forward, as fairseq's layer
        if self.encoder_attn is not None and encoder_out is not None:
            residual = x
            if self.normalize_before:
                x = self.encoder_attn_layer_norm(x)
            x, attn = self.encoder_attn(
                query=x,
                key=encoder_out,
                value=encoder_out,
                key_padding_mask=encoder_padding_mask,
                incremental_state=incremental_state,
                static_kv=True,
                need_weights=need_attn or (not self.training and self.need_attn),
                need_head_weights=need_head_weights,
            )
            x = self.residual_connection(self.dropout_module(x), residual)
            if not self.normalize_before:
                x = self.encoder_attn_layer_norm(x)

        residual = x
        if self.normalize_before:
            x = self.final_layer_norm(x)
        x = self.activation_dropout_module(self.activation_fn(self.fc1(x)))
        if self.ffn_layernorm is not None:
            x = self.ffn_layernorm(x)
        x = self.dropout_module(self.fc2(x))
        if self.w_resid is not None:
            residual = torch.mul(self.w_resid, residual)
        x = self.residual_connection(x, residual)
        if not self.normalize_before:
            x = self.final_layer_norm(x)
        return x, attn, None


# fairseq-deep-grow (modules/growth.py): a copy attends to as many lower layers as its source
# (layer l to min(k, l)), and no new layer with lower attention starts as the identity
for _layer in (MultiLayerAttentionEncoderLayer, MultiLayerAttentionDecoderLayer):
    declare_layer(
        _layer,
        role=lambda layer: layer.num_lower,
        identity=lambda layer: (
            "multi-layer attention (each layer also attends to the outputs of the layers below it)"
        ),
    )
