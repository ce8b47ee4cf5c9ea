"""Transformers that exploit deep representations: layer aggregation and multi-layer attention.

Dou, Tu, Wang, Shi, Zhang (EMNLP 2018). Exploiting Deep Representations for Neural Machine
Translation.  fairseq's Transformer with (a) its layer loops handed to an aggregation history
(``--agg-encoder`` / ``--agg-decoder``: dense, linear, iterative, hierarchical; Sec. 3.1.1) and
(b) self-attentions that attend to the k layers below (``--mla-layers k``; Sec. 3.1.2).  With
``--agg-* none --mla-layers 1`` it is fairseq's Transformer.  The layer-diversity regularizer
(Sec. 3.2) is the criterion ``label_smoothed_cross_entropy_with_diversity``; initialisation from
a trained Transformer is ``--init-from-pretrained`` with ``--finetune-from-model``.
"""

from dataclasses import dataclass
from typing import List

from fairseq.models import register_model
from fairseq.models.transformer import TransformerConfig
from fairseq.models.transformer import base_architecture as fairseq_transformer_base
from fairseq.models.transformer.transformer_legacy import transformer_vaswani_wmt_en_de_big
from torch import Tensor

from ..checkpoint_init import PretrainedInitConfig, PretrainedInitMixin
from ..modules.histories.layer_aggregation import AggregationConfig, build_aggregation, node_factory
from ..modules.histories.multi_layer_attention import (
    MultiLayerAttentionConfig,
    MultiLayerAttentionDecoderLayer,
    MultiLayerAttentionEncoderLayer,
    mla_window,
)
from .families import TINY_TRANSFORMER, Family, PaperScale, Tiny, declare, transformer_sizes
from .presets import fill_defaults, register_preset
from .reduction import residual_stacks
from .transformer_stack import (
    HistoryTransformerDecoder,
    HistoryTransformerEncoder,
    TechniqueTransformerModel,
)


@dataclass
class TransformerAggConfig(AggregationConfig, MultiLayerAttentionConfig, PretrainedInitConfig):
    """Options of ``transformer_agg``: each technique's own, declared beside its reader."""


class AggTransformerEncoder(HistoryTransformerEncoder):
    """The history stack with multi-layer self-attention in layers 2..L when --mla-layers > 1."""

    def __init__(self, cfg, dictionary, embed_tokens, history):
        super().__init__(cfg, dictionary, embed_tokens, history)
        self.lower_window = mla_window(cfg, "encoder") - 1

    def build_layer(self, cfg, index, num_layers):
        num_lower = min(mla_window(cfg, "encoder"), index + 1) - 1
        if num_lower == 0:
            return super().build_layer(cfg, index, num_layers)
        return MultiLayerAttentionEncoderLayer(
            cfg,
            num_lower,
            node_factory(cfg, cfg.encoder.embed_dim, cfg.encoder.attention_heads),
            return_fc=self.return_fc,
        )

    def forward_layer(self, idx: int, layer, x: Tensor, lower: List[Tensor], **kwargs):
        if getattr(layer, "num_lower", 0):
            return layer(x, lower=lower[::-1], **kwargs)
        return layer(x, **kwargs)


class AggTransformerDecoder(HistoryTransformerDecoder):
    """The history stack with multi-layer self-attention in layers 2..L when --mla-layers > 1."""

    def __init__(self, cfg, dictionary, embed_tokens, history, no_encoder_attn=False):
        super().__init__(cfg, dictionary, embed_tokens, history, no_encoder_attn=no_encoder_attn)
        self.lower_window = mla_window(cfg, "decoder") - 1

    def build_layer(self, cfg, index, num_layers, no_encoder_attn=False):
        num_lower = min(mla_window(cfg, "decoder"), index + 1) - 1
        if num_lower == 0:
            return super().build_layer(cfg, index, num_layers, no_encoder_attn)
        return MultiLayerAttentionDecoderLayer(
            cfg,
            num_lower,
            node_factory(cfg, cfg.decoder.embed_dim, cfg.decoder.attention_heads),
            no_encoder_attn=no_encoder_attn,
        )

    def forward_layer(self, idx: int, layer, x: Tensor, lower: List[Tensor], *args, **kwargs):
        if getattr(layer, "num_lower", 0):
            return layer(x, *args, lower=lower[::-1], **kwargs)
        return layer(x, *args, **kwargs)


@register_model("transformer_agg")
class TransformerAggModel(PretrainedInitMixin, TechniqueTransformerModel):
    """fairseq's Transformer with layer aggregation and multi-layer attention (Dou et al. 2018)."""

    options = TransformerAggConfig
    base_arch = "transformer_agg"

    @classmethod
    def build_model(cls, args, task):
        model = super().build_model(args, task)
        model.init_from_pretrained = bool(
            PretrainedInitConfig.from_namespace(args).init_from_pretrained
        )
        return model

    @classmethod
    def build_encoder(cls, args, src_dict, embed_tokens):
        cfg = TransformerConfig.from_namespace(args)
        history = build_aggregation(
            cfg,
            "encoder",
            cfg.encoder.layers,
            cfg.encoder.embed_dim,
            cfg.encoder.attention_heads,
            cfg.encoder.ffn_embed_dim,
        )
        return AggTransformerEncoder(cfg, src_dict, embed_tokens, history)

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        cfg = TransformerConfig.from_namespace(args)
        history = build_aggregation(
            cfg,
            "decoder",
            cfg.decoder.layers,
            cfg.decoder.embed_dim,
            cfg.decoder.attention_heads,
            cfg.decoder.ffn_embed_dim,
        )
        return AggTransformerDecoder(
            cfg, tgt_dict, embed_tokens, history, no_encoder_attn=cfg.no_cross_attention
        )


declare(
    Family(
        name="transformer_agg",
        model=TransformerAggModel,
        kind="transformer",
        transformer_layers=True,
        sizes=transformer_sizes,
        # fairseq-deep-grow: --encoder-layers and --decoder-layers (the aggregation histories and the
        # multi-layer attention layers declare the rest: modules/histories/layer_aggregation.py,
        # multi_layer_attention.py)
        grows=True,
        # fairseq-deep-export: fairseq's transformer with every technique off (--agg-* none,
        # --mla-layers 1)
        reduction=residual_stacks,
        study=("dou",),
        tiny_sizes=TINY_TRANSFORMER,
        tiny=(
            Tiny(
                "transformer_hier_agg+div",
                "transformer_hier_agg",
                # the aggregation nodes keep every layer's output: 1.5x
                PaperScale("transformer_hier_agg", (79.5, 18 * 512, 0)),
                training={
                    "criterion": "label_smoothed_cross_entropy_with_diversity",
                    "label_smoothing": "0.1",
                },
            ),
            Tiny(
                "transformer_dense",
                "transformer_dense",
                PaperScale("transformer_dense", (56.4, 18 * 512, 0)),
            ),
            Tiny(
                "transformer_mla3",
                "transformer_mla3",
                PaperScale("transformer_mla3", (85.3, 18 * 512, 0)),
            ),
        ),
    )
)


# ---------------------------------------------------------------------------------------------
# Named architectures: rows 1-7 of Dou et al.'s Table 1 (Transformer-Base, post-norm as in the
# paper) and Table 2 (Base and Big).  They only fill defaults and chain to fairseq's `transformer`.
# ---------------------------------------------------------------------------------------------


agg_base_architecture = register_preset(
    "transformer_agg",
    "transformer_agg",
    "Transformer-Base (Table 1, row 1) in the aggregation stack: every technique off.",
    fairseq_transformer_base,
    options=TransformerAggConfig,
)


PRESETS = {  # name: (Table 1 row, option defaults)
    "transformer_agg_baseline": (1, {}),
    "transformer_dense": (2, {"agg_encoder": "dense", "agg_decoder": "dense"}),
    "transformer_linear_agg": (3, {"agg_encoder": "linear", "agg_decoder": "linear"}),
    "transformer_iterative_agg": (4, {"agg_encoder": "iterative", "agg_decoder": "iterative"}),
    "transformer_hier_agg": (5, {"agg_encoder": "hierarchical", "agg_decoder": "hierarchical"}),
    "transformer_mla2": (6, {"mla_layers": 2}),
    "transformer_mla3": (7, {"mla_layers": 3}),
}


def agg_big_architecture(args):
    """Transformer-Big (Table 2) in the aggregation stack: fairseq's Big preset, every technique off
    (the parent of the ``_big`` presets, not an ``--arch`` itself)."""
    fill_defaults(args, TransformerAggConfig())
    transformer_vaswani_wmt_en_de_big(args)


for _name, (_row, _values) in PRESETS.items():
    for _suffix, _parent in (
        ("", agg_base_architecture),
        ("_big", agg_big_architecture),
    ):  # Table 2: Big
        register_preset(
            "transformer_agg",
            _name + _suffix,
            f"Dou et al. (2018) Table 1 row {_row}, Transformer-{'Big' if _suffix else 'Base'}: "
            f"{_values or 'baseline'}.",
            _parent,
            defaults=_values,
        )
