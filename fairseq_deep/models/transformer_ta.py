"""Deep Transformer encoders with transparent attention.

Bapna, Chen, Firat, Cao, Wu (EMNLP 2018). Training Deeper Neural Machine Translation Models with
Transparent Attention.  fairseq's Transformer whose decoder layer j attends to
z^j = sum_i s_{i,j} h^i over the embedding output and all N encoder layers (Eq. 1-2) instead of the
top layer only.  The same model class gives the rows of Tables 1-2 by --arch:

* ``transformer_ta[_12l|_16l|_20l]``: "Transparent";
* ``transformer_ta_baseline[...]``: "Baseline" (``--ta-disable``: the decoder reads the top layer);
* ``transformer_ta_nores[...]``: "Baseline - residuals" (``--ta-no-encoder-residual`` as well).

The M combinations are computed once per source sentence, in the encoder's forward (which beam
search runs once per batch), and travel in ``encoder_out["transparent_memory"]``, which
``reorder_encoder_out`` reorders with the beam; decoder layer j receives memory j through the
``encoder_memory`` hook, and its cross-attention caches its keys and values of that memory in the
incremental state at the first step, as for the plain model.
"""

from dataclasses import dataclass, field
from typing import Dict, List, Optional

from fairseq.models import register_model
from fairseq.models.transformer import TransformerConfig
from fairseq.models.transformer import base_architecture as fairseq_transformer_base
from fairseq.modules.transformer_layer import TransformerEncoderLayerBase
from torch import Tensor

from ..modules.common.growth import declare_layer
from ..modules.common.reorder import reorder_batch
from ..modules.histories.layer_history import LayerHistory
from ..modules.histories.transparent_attention import (
    TRANSPARENT_WEIGHTS,
    TransparentReadout,
    TransparentReadoutConfig,
)
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

MEMORY_KEY = "transparent_memory"


@dataclass
class TransparentAttentionConfig(TransparentReadoutConfig):
    """Options of ``transformer_ta``: the readout's (``--ta-dropout``, ``--ta-init``) and the model's."""

    ta_disable: bool = field(
        default=False,
        metadata={
            "help": "no transparent attention: every decoder layer attends to the top encoder "
            "layer (the 'Baseline' rows of Bapna et al. 2018, Tables 1-2)"
        },
    )
    encoder_no_residual: bool = (
        field(  # --ta-no-encoder-residual (TransformerTAModel.renamed_flags)
            default=False,
            metadata={
                "help": "remove the residual connections of the encoder layers (Bapna et al. "
                "Sec. 2.3, the 'Baseline - residuals' rows)"
            },
        )
    )


class NoResidualEncoderLayer(TransformerEncoderLayerBase):
    """A Transformer encoder layer whose sublayers are not added to their input (x = F(x))."""

    #: why fairseq's own layer cannot compute this one (fairseq-deep-export)
    why_not_standard = "its encoder layers have no residual connections (--ta-no-encoder-residual)"

    def residual_connection(self, x, residual):
        return x


# fairseq-deep-grow (modules/common/growth.py): F(x) is not x for any value of its parameters
declare_layer(
    NoResidualEncoderLayer,
    identity=lambda layer: (
        "its encoder layers have no residual connections (--ta-no-encoder-residual), so no new layer is the identity"
    ),
)


class TransparentTransformerEncoder(HistoryTransformerEncoder):
    """Transformer encoder that also returns the M transparent-attention memories.

    ``transparent_attention`` (a :class:`TransparentReadout` over y_0..y_N, or None for the
    baseline) has state-dict key ``encoder.transparent_attention.weight``, (N+1) x M.
    For a pre-norm encoder the entries are the residual streams and each memory is
    ``layer_norm(sum_i s_ij y_i)`` with the encoder's final layer norm, so that a readout with all
    its mass on y_N is exactly the plain model's ``encoder_out``.
    """

    def __init__(self, cfg, dictionary, embed_tokens, readout: Optional[TransparentReadout]):
        super().__init__(cfg, dictionary, embed_tokens, LayerHistory(cfg.encoder.layers))
        if readout is not None and self.encoder_layerdrop > 0:
            raise ValueError(
                "--encoder-layerdrop skips layers, which would shift the rows of the "
                "transparent attention weights: set --encoder-layerdrop 0 (or --ta-disable)"
            )
        self.transparent_attention = readout

    def build_layer(self, cfg, index, num_layers):
        if not cfg.encoder_no_residual:
            return super().build_layer(cfg, index, num_layers)
        return NoResidualEncoderLayer(cfg, return_fc=self.return_fc)

    def forward_scriptable(
        self,
        src_tokens,
        src_lengths: Optional[Tensor] = None,
        return_all_hiddens: bool = False,
        token_embeddings: Optional[Tensor] = None,
    ):
        transparent = self.transparent_attention is not None
        out = super().forward_scriptable(
            src_tokens, src_lengths, return_all_hiddens or transparent, token_embeddings
        )
        if transparent:
            memory = self.transparent_attention(out["encoder_states"])
            if self.layer_norm is not None:
                memory = [self.layer_norm(z) for z in memory]
            out[MEMORY_KEY] = memory
            if not return_all_hiddens:
                out["encoder_states"] = []  # not reordered at every beam step for nothing
        return out

    def reorder_encoder_out(self, encoder_out: Dict[str, List[Tensor]], new_order):
        reordered = super().reorder_encoder_out(encoder_out, new_order)
        if MEMORY_KEY in encoder_out:  # M memories, T x B x C
            reordered.update(
                reorder_batch({MEMORY_KEY: encoder_out[MEMORY_KEY]}, new_order, (MEMORY_KEY,))
            )
        return reordered


class TransparentTransformerDecoder(HistoryTransformerDecoder):
    """Transformer decoder whose layer j attends to ``encoder_out["transparent_memory"][j]``."""

    def __init__(self, cfg, dictionary, embed_tokens, transparent: bool, no_encoder_attn=False):
        super().__init__(
            cfg,
            dictionary,
            embed_tokens,
            LayerHistory(cfg.decoder.layers),
            no_encoder_attn=no_encoder_attn,
        )
        if transparent and self.decoder_layerdrop > 0:
            raise ValueError(
                "--decoder-layerdrop skips layers, which would hand decoder layer j the "
                "memory of another layer: set --decoder-layerdrop 0 (or --ta-disable)"
            )
        self.transparent = transparent

    def encoder_memory(
        self, encoder_out: Optional[Dict[str, List[Tensor]]], idx: int, incremental_state
    ):
        if not self.transparent or encoder_out is None:
            return super().encoder_memory(encoder_out, idx, incremental_state)
        memory = encoder_out.get(MEMORY_KEY)
        if memory is None or len(memory) != self.num_layers:
            raise RuntimeError(
                f"the transformer_ta decoder needs encoder_out['{MEMORY_KEY}'] with one memory per "
                f"decoder layer ({self.num_layers}); got "
                f"{'none' if memory is None else len(memory)}: use the encoder of transformer_ta, "
                "and reorder encoder outputs with its reorder_encoder_out"
            )
        return memory[idx]


@register_model("transformer_ta")
class TransformerTAModel(TechniqueTransformerModel):
    """fairseq's Transformer with transparent attention over all encoder layers (Bapna et al. 2018)."""

    options = TransparentAttentionConfig
    base_arch = "transformer_ta"
    renamed_flags = {"--encoder-no-residual": "--ta-no-encoder-residual"}

    @classmethod
    def build_encoder(cls, args, src_dict, embed_tokens):
        cfg = TransformerConfig.from_namespace(args)
        readout = None
        if not cfg.ta_disable:
            readout = TransparentReadout.from_options(
                cfg, cfg.encoder.layers + 1, cfg.decoder.layers
            )
        return TransparentTransformerEncoder(cfg, src_dict, embed_tokens, readout)

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        cfg = TransformerConfig.from_namespace(args)
        return TransparentTransformerDecoder(
            cfg,
            tgt_dict,
            embed_tokens,
            transparent=not cfg.ta_disable,
            no_encoder_attn=cfg.no_cross_attention,
        )


def _reduction(model) -> Optional[str]:
    """fairseq-deep-export: the baselines (--ta-disable, with residuals) reduce, nothing else."""
    if model.encoder.transparent_attention is not None:
        return (
            "transparent attention: decoder layer j attends to its own learned mix of all "
            "encoder layers (Bapna et al. 2018)"
        )
    return residual_stacks(model)


declare(
    Family(
        name="transformer_ta",
        model=TransformerTAModel,
        kind="transformer",
        transformer_layers=True,
        sizes=transformer_sizes,
        # fairseq-deep-grow: --encoder-layers and --decoder-layers (the transparent weights:
        # modules/histories/transparent_attention.py)
        grows=True,
        reduction=_reduction,  # fairseq-deep-export: the baselines with residuals
        # --denseformer and --hyper-connections replace its residual history
        layer_weights=(TRANSPARENT_WEIGHTS, DENSEFORMER_WEIGHTS, HYPER_CONNECTION_WEIGHTS),
        study=("bapna",),
        tiny_sizes=TINY_TRANSFORMER,
        tiny=(
            Tiny(
                "transformer_ta",
                "transformer_ta",
                PaperScale("transformer_ta_16l", (88.0, 22 * 512, 0)),
            ),
        ),
    )
)


# ---------------------------------------------------------------------------------------------
# Named architectures (defaults only; a value given on the command line wins).
# Sec. 2.2: Transformer Base, 6 decoder layers, encoders of 6/12/16/20 layers.  The Transformer of
# Chen et al. (2018) uses all four dropouts at 0.1 (App. A.2).  Post-norm (Vaswani et al.), the
# model whose deep baselines fail to train (also Wang et al. 2019, Table 1); Chen et al.'s own
# implementation is pre-norm: use transformer_ta_prenorm(_{12,16,20}l) for that reading.
# ---------------------------------------------------------------------------------------------


_TA_BASE = {"attention_dropout": 0.1, "activation_dropout": 0.1}

ta_base_architecture = register_preset(
    "transformer_ta",
    "transformer_ta",
    "Transformer Base with transparent attention (Bapna et al. 2018), 6+6 layers.",
    fairseq_transformer_base,
    defaults=_TA_BASE,
    options=TransparentAttentionConfig,
)
ta_baseline_architecture = register_preset(
    "transformer_ta",
    "transformer_ta_baseline",
    "Transformer Base without transparent attention (Table 1, 'Baseline').",
    ta_base_architecture,
    defaults={"ta_disable": True},
)
ta_nores_architecture = register_preset(
    "transformer_ta",
    "transformer_ta_nores",
    "Transformer Base without transparent attention nor encoder residuals (Table 1, 'Baseline - residuals').",
    ta_base_architecture,
    defaults={"ta_disable": True, "encoder_no_residual": True},
)
ta_prenorm_architecture = register_preset(
    "transformer_ta",
    "transformer_ta_prenorm",
    "Pre-norm Transformer Base with transparent attention (Chen et al. 2018's layer: normalize, transform, "
    "dropout, residual-add; the final encoder norm applies to each memory).",
    ta_base_architecture,
    defaults=PRENORM,
)


# Chen et al.'s (2018) Transformer Big (App. A.2), Bapna et al.'s "(Big)" column (Sec. 3: "the
# standard Transformer Big ... as described in (Chen et al., 2018)"): pre-norm, model 1024, FFN 8192,
# 16 heads, residual and input dropout 0.3, no attention or ReLU dropout.
CHEN_BIG = {
    "encoder_embed_dim": 1024,
    "encoder_ffn_embed_dim": 8192,
    "encoder_attention_heads": 16,
    "decoder_embed_dim": 1024,
    "decoder_ffn_embed_dim": 8192,
    "decoder_attention_heads": 16,
    "dropout": 0.3,
    "attention_dropout": 0.0,
    "activation_dropout": 0.0,
    **PRENORM,
}
register_preset(
    "transformer_ta",
    "transformer_ta_big",
    "Chen et al.'s Transformer Big (pre-norm, 1024/8192/16 heads, dropout 0.3) with "
    "transparent attention, 6+6 layers.",
    ta_base_architecture,
    defaults=CHEN_BIG,
)
register_preset(
    "transformer_ta",
    "transformer_ta_baseline_big",
    "Bapna et al. Tables 1-2 '(Big)': Chen et al.'s Transformer Big (pre-norm, 1024/8192/16 "
    "heads, dropout 0.3), no transparent attention, 6+6 layers.",
    ta_baseline_architecture,
    defaults=CHEN_BIG,
)

# Tables 1-2 of Bapna et al.: 12, 16 and 20 encoder layers over a 6-layer decoder (and the
# pre-norm reading at the same depths).
for _depth in (12, 16, 20):
    for _name, _parent in (
        ("transformer_ta", ta_base_architecture),
        ("transformer_ta_baseline", ta_baseline_architecture),
        ("transformer_ta_nores", ta_nores_architecture),
        ("transformer_ta_prenorm", ta_prenorm_architecture),
    ):
        register_preset(
            "transformer_ta",
            f"{_name}_{_depth}l",
            f"{first_line(_parent)}, with a {_depth}-layer encoder.",
            _parent,
            depth=(_depth, 6),
        )
