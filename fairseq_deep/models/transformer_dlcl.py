"""Deep Transformers with pre-norm and dynamic linear combination of layers.

Wang, Li, Xiao, Zhu, Li, Wong, Chao (ACL 2019). Learning Deep Transformer Models for Machine
Translation.  The model is fairseq's `transformer` with its layer loops handed to a
:class:`~fairseq_deep.modules.histories.layer_history.DynamicLinearCombination` (``--dlcl-stacks``); with
``--dlcl-stacks none`` it is the plain pre-norm or post-norm Transformer of Table 1.
"""

from fairseq.models import register_model
from fairseq.models.transformer import TransformerConfig
from fairseq.models.transformer import base_architecture as fairseq_transformer_base
from fairseq.models.transformer.transformer_legacy import (
    transformer_vaswani_wmt_en_de_big,
    transformer_wmt_en_de_big_t2t,
)

from ..modules.histories.layer_history import DLCL_WEIGHTS, DLCLConfig, build_dlcl
from ..modules.schemes.denseformer import DENSEFORMER_WEIGHTS
from ..modules.schemes.hyper_connections import HYPER_CONNECTION_WEIGHTS
from .families import TINY_TRANSFORMER, Family, PaperScale, Tiny, declare, transformer_sizes
from .presets import PRENORM, first_line, register_preset
from .reduction import residual_stacks
from .transformer_stack import (
    HistoryTransformerDecoder,
    HistoryTransformerEncoder,
    TechniqueTransformerModel,
)


@register_model("transformer_dlcl")
class TransformerDLCLModel(TechniqueTransformerModel):
    """fairseq's Transformer whose encoder and decoder layers read a learned linear combination
    of all earlier layers (Wang et al. 2019, Eq. 7-9)."""

    options = DLCLConfig
    base_arch = "transformer_dlcl"
    gpkd_defined = True  # group permutation, Skipping Sub-Layer (Li et al. 2021): pre-norm, DLCL

    @classmethod
    def build_encoder(cls, args, src_dict, embed_tokens):
        cfg = TransformerConfig.from_namespace(args)
        history = build_dlcl(
            cfg, "encoder", cfg.encoder.layers, cfg.encoder.embed_dim, cfg.encoder.normalize_before
        )
        return HistoryTransformerEncoder(cfg, src_dict, embed_tokens, history)

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        cfg = TransformerConfig.from_namespace(args)
        history = build_dlcl(
            cfg, "decoder", cfg.decoder.layers, cfg.decoder.embed_dim, cfg.decoder.normalize_before
        )
        return HistoryTransformerDecoder(
            cfg, tgt_dict, embed_tokens, history, no_encoder_attn=cfg.no_cross_attention
        )


# ---------------------------------------------------------------------------------------------
# Named architectures.  They only fill defaults (a value given on the command line wins) and chain
# to fairseq's `transformer` preset.  Optimisation settings (lr, warmup, batch) live in the recipes.
# ---------------------------------------------------------------------------------------------


_POSTNORM = {"encoder_normalize_before": False, "decoder_normalize_before": False}
# pre-norm Transformer-Base as in tensor2tensor (Wang et al. Sec. 4.2): fairseq's
# ``transformer_wmt_en_de_big_t2t`` without the Big sizes
_PRENORM_BASE = {**PRENORM, "attention_dropout": 0.1, "activation_dropout": 0.1}
_DLCL_OFF = {"dlcl_stacks": "none"}

dlcl_base_architecture = register_preset(
    "transformer_dlcl",
    "transformer_dlcl",
    "Pre-norm DLCL (Base): the paper's main system, 6+6 layers.",
    fairseq_transformer_base,
    defaults=_PRENORM_BASE,
    options=DLCLConfig,
)
dlcl_postnorm_architecture = register_preset(
    "transformer_dlcl",
    "transformer_dlcl_postnorm",
    "Post-norm DLCL (Base), Eq. 9.",
    fairseq_transformer_base,
    defaults=_POSTNORM,
    options=DLCLConfig,
)
dlcl_big_architecture = register_preset(
    "transformer_dlcl",
    "transformer_dlcl_big",
    "Pre-norm DLCL (Big): fairseq's pre-norm Transformer Big (``transformer_wmt_en_de_big_t2t``).",
    transformer_wmt_en_de_big_t2t,
    options=DLCLConfig,
)
prenorm_architecture = register_preset(
    "transformer_dlcl",
    "transformer_prenorm",
    "Plain pre-norm Transformer-Base (Table 1 baseline): DLCL off.",
    dlcl_base_architecture,
    defaults=_DLCL_OFF,
)
prenorm_big_architecture = register_preset(
    "transformer_dlcl",
    "transformer_prenorm_big",
    "Plain pre-norm Transformer Big: DLCL off.",
    dlcl_big_architecture,
    defaults=_DLCL_OFF,
)
postnorm_architecture = register_preset(
    "transformer_dlcl",
    "transformer_postnorm",
    "Plain post-norm Transformer-Base (Vaswani et al.), the same as fairseq's `transformer`.",
    dlcl_postnorm_architecture,
    defaults=_DLCL_OFF,
)
postnorm_big_architecture = register_preset(
    "transformer_dlcl",
    "transformer_postnorm_big",
    'Plain post-norm Transformer-Big (Wang et al. Table 1, post-norm "Transformer (Big)", 211M; Vaswani '
    "et al.): fairseq's ``transformer_vaswani_wmt_en_de_big`` (1024/4096/16 heads, dropout 0.3), DLCL off.",
    transformer_vaswani_wmt_en_de_big,
    defaults={**_POSTNORM, **_DLCL_OFF},
    options=DLCLConfig,
)
# Table 6 "+ big encoder": pre-norm Transformer-Base whose encoder is Transformer-Big's (1024
# wide, FFN 4096, 16 heads); the decoder stays Base (its encoder attention reads 1024-wide keys).
register_preset(
    "transformer_dlcl",
    "transformer_prenorm_big_encoder",
    "Wang et al. Table 6 '+ big encoder': pre-norm Transformer-Base with a Big encoder "
    "(1024/4096/16 heads; decoder 512/2048/8 heads).",
    prenorm_architecture,
    defaults={
        "encoder_embed_dim": 1024,
        "encoder_ffn_embed_dim": 4096,
        "encoder_attention_heads": 16,
        "decoder_embed_dim": 512,
        "decoder_ffn_embed_dim": 2048,
        "decoder_attention_heads": 8,
    },
)
# Table 6: pre-norm Transformer-Big + 12-layer encoder (DLCL).
register_preset(
    "transformer_dlcl",
    "transformer_dlcl_big_12l",
    "Table 6: pre-norm Transformer-Big + 12-layer encoder (DLCL).",
    dlcl_big_architecture,
    depth=(12, None),
)
# Table 1 / Table 2 / Figure 3 of Wang et al.: encoders of 12-30 layers over a 6-layer decoder.
for _depth in (12, 16, 20, 25, 30):
    for _name, _parent in (
        ("transformer_dlcl", dlcl_base_architecture),
        ("transformer_dlcl_postnorm", dlcl_postnorm_architecture),
        ("transformer_prenorm", prenorm_architecture),
        ("transformer_postnorm", postnorm_architecture),
    ):
        register_preset(
            "transformer_dlcl",
            f"{_name}_{_depth}l",
            f"{first_line(_parent)}, with a {_depth}-layer encoder.",
            _parent,
            depth=(_depth, None),
        )


declare(
    Family(
        name="transformer_dlcl",
        model=TransformerDLCLModel,
        kind="transformer",
        transformer_layers=True,
        sizes=transformer_sizes,
        # fairseq-deep-grow: --encoder-layers and --decoder-layers (the rest is declared by the parts)
        grows=True,
        # fairseq-deep-export: fairseq's transformer when both stacks are residual (--dlcl-stacks
        # none: the pre-/post-norm presets, DeepNorm, Admin, DS-Init), whatever the --arch is called
        reduction=residual_stacks,
        layer_weights=(DLCL_WEIGHTS, DENSEFORMER_WEIGHTS, HYPER_CONNECTION_WEIGHTS),
        study=("wang", "chen", "depth", "li"),
        # the study's sweeps: the depth group's first lines, the baselines of the modern group
        # (the schemes' lines are declared beside their presets: transformer_schemes.py, ...)
        sweeps={
            "depth": (
                ("post-norm", "transformer_postnorm", "postnorm"),
                ("pre-norm", "transformer_prenorm", "prenorm"),
                ("DLCL", "transformer_dlcl", "dlcl"),
            ),
            "modern": (
                ("pre-norm", "transformer_prenorm", "prenorm"),
                ("DLCL", "transformer_dlcl", "dlcl"),
            ),
        },
        stands_for={"transformer": "transformer_postnorm"},  # which is fairseq's transformer
        tiny_sizes=TINY_TRANSFORMER,
        tiny=(
            Tiny(
                "transformer_dlcl",
                "transformer_dlcl",
                PaperScale("transformer_dlcl_30l", (132.1, 36 * 512, 0)),
                samples=("bf16",),
            ),
            Tiny(
                "transformer_dlcl_postnorm",
                "transformer_dlcl_postnorm",
                PaperScale("transformer_dlcl_postnorm_30l", (132.1, 36 * 512, 0)),
            ),
            Tiny(
                "transformer_prenorm",
                "transformer_prenorm",
                PaperScale("transformer_prenorm_30l", (132.1, 36 * 512, 0)),
            ),
            # Li et al. 2021 (modules/schemes/gpkd.py): DLCL under group permutation (the tiny
            # 3 + 2 layers each one group) and Skipping Sub-Layer in both stacks
            Tiny(
                "transformer_dlcl_gpkd",
                "transformer_dlcl",
                PaperScale("transformer_dlcl_30l", (132.1, 36 * 512, 0)),
                model=(
                    *("--gpkd-encoder-groups", "1", "--gpkd-decoder-groups", "1"),
                    *("--skip-sublayer-rate", "0.3", "--skip-sublayer-stacks", "both"),
                ),
            ),
        ),
    )
)
