"""Named hybrids (Chen et al. 2018, Tables 5-6): defaults only; a preset's encoder/decoder kind is fixed."""

from fairseq.models.transformer import base_architecture as fairseq_transformer_base
from fairseq.utils import safe_getattr

from ...presets import PRENORM, register_preset, same_as, set_default, transformer_big
from ..config import RNMTPlusConfig
from .config import HybridConfig, RNMTHybridConfig

hybrid_base_architecture = register_preset(
    "rnmt_hybrid",
    "rnmt_hybrid",
    "A hybrid of --hybrid-encoder and --hybrid-decoder (Transformer Base sizes, pre-norm).",
    fairseq_transformer_base,
    options=RNMTHybridConfig,
    defaults={
        "encoder_layers": 6,
        "decoder_layers": lambda args: (
            8
            if str(safe_getattr(args, "hybrid_decoder", HybridConfig.hybrid_decoder)) == "rnmt"
            else 6
        ),
        "attention_dropout": same_as("dropout", RNMTPlusConfig.dropout),
        **PRENORM,
        "max_source_positions": RNMTPlusConfig.max_source_positions,
        "max_target_positions": RNMTPlusConfig.max_target_positions,
    },
)


def hybrid_big_architecture(args):
    """The Transformer parts of the named hybrids are Transformer Big as in Chen et al. App. A.2
    (model 1024, hidden 8192, 16 heads), pre-norm."""
    transformer_big(args, ffn_dim=8192)
    for name, value in PRENORM.items():
        set_default(args, name, value)
    hybrid_base_architecture(args)


def _hybrid(name: str, doc: str, encoder: str, decoder: str, defaults=None):
    """A named hybrid owns its encoder and decoder kinds."""
    return register_preset(
        "rnmt_hybrid",
        name,
        doc,
        hybrid_big_architecture,
        defaults=defaults,
        fixed={"hybrid_encoder": encoder, "hybrid_decoder": decoder},
    )


hybrid_transformer_rnmt = _hybrid(
    "hybrid_transformer_rnmt",
    "Table 5: Transformer Big encoder + RNMT+ decoder.",
    "transformer",
    "rnmt",
)
hybrid_rnmt_transformer = _hybrid(
    "hybrid_rnmt_transformer",
    "Table 5: RNMT+ encoder + Transformer Big decoder.",
    "rnmt",
    "transformer",
)
hybrid_cascaded = _hybrid(
    "hybrid_cascaded",
    "Table 6: 6-layer RNMT+ encoder (pre-trained, frozen) + 4 Transformer layers, RNMT+ decoder.",
    "cascaded",
    "rnmt",
    defaults={"encoder_layers": 4, "no_token_positional_embeddings": True},
)
hybrid_multicolumn = _hybrid(
    "hybrid_multicolumn",
    "Table 6: RNMT+ column + Transformer Big column, concatenated, RNMT+ decoder.",
    "multicolumn",
    "rnmt",
)
