"""Options of the RNMT+ encoder and decoder (Chen et al. 2018, Sec. 4.1; Bapna et al. 2018, Sec. 2.4).

``RNMTConfig`` holds only what a Transformer does not have, so that the hybrids can add it next
to fairseq's Transformer options; ``RNMTPlusConfig`` adds the options whose names the Transformer
shares (embedding sizes, layer counts, dropout, embedding sharing) for the plain ``rnmt_plus``.
The ``--ta-*`` options are the transparent readout's (:mod:`fairseq_deep.modules.histories.transparent_attention`)
and the ``--dlcl-*`` options the layer history's (:mod:`fairseq_deep.modules.histories.layer_history`).
"""

from dataclasses import dataclass, field

from fairseq.dataclass import ChoiceEnum

from ...modules.histories.layer_history import DLCL_STACKS, DLCLConfig
from ...modules.histories.transparent_attention import TransparentReadoutConfig
from ...modules.recurrent.kernel_choice import DEFAULT as DEFAULT_IMPL
from ...modules.recurrent.kernel_choice import IMPLS


@dataclass
class RNMTConfig(TransparentReadoutConfig):
    """RNMT+'s own options, with the ``--ta-*`` options of its transparent readout."""

    encoder_hidden_size: int = field(
        default=1024,
        metadata={"help": "LSTM units per direction of each bidirectional encoder layer"},
    )
    decoder_hidden_size: int = field(
        default=1024, metadata={"help": "LSTM units of each decoder layer"}
    )
    rnmt_attention_heads: int = field(
        default=4, metadata={"help": "heads of the multi-head additive attention (Sec. 4.1: 4)"}
    )
    rnmt_encoder_residual_start: int = field(
        default=3,
        metadata={
            "help": "first encoder layer (1-based) with a residual connection (Sec. 4.1: 3); "
            "0 = no residual connections ('Baseline - residuals' of Bapna et al., Tables 3-4)"
        },
    )
    rnmt_decoder_residual_start: int = field(
        default=3,
        metadata={"help": "first decoder layer (1-based) with a residual connection; 0 = none"},
    )
    rnmt_cell_clip: float = field(
        default=10.0,
        metadata={"help": "clip LSTM cell values to +-this (lingvo's cell_value_cap); 0 = off"},
    )
    rnmt_output_tanh: bool = field(
        default=False,
        metadata={
            "help": "h = sigmoid(o) * tanh(c) (the classic LSTM); RNMT+ uses h = sigmoid(o) * c "
            "('no non-linearity is applied to the LSTM output')"
        },
    )
    rnmt_no_layer_norm: bool = field(
        default=False,
        metadata={
            "help": "LSTM cells without the per-gate layer norm (Chen et al. 2018, Table 4, "
            "'- Layer Norm'): gates W x + U h + b"
        },
    )
    rnmt_lstm_impl: ChoiceEnum(list(IMPLS)) = field(
        default=DEFAULT_IMPL,
        metadata={
            "architecture": False,
            "help": "time loop of the layer-normalized LSTM cells: 'auto' (the fused Triton kernels on a CUDA "
            "device when triton imports, else the loop; the same numbers), 'loop' (TorchScript, every "
            "device) or 'triton' (one fused Triton kernel per step, forward and backward; needs triton and "
            "a CUDA GPU); cells without layer norm run the loop",
        },
    )
    rnmt_init_scale: float = field(
        default=0.0,
        metadata={
            "architecture": False,
            "help": "LSTM weights uniform in +-this (lingvo: 0.04); 0 = 1/sqrt(hidden size)",
        },
    )
    rnmt_encoder_layers: int = field(
        default=6,
        metadata={
            "help": "hybrids only: layers of the RNMT+ encoder (column) when --encoder-layers "
            "counts Transformer layers"
        },
    )
    rnmt_transparent: bool = field(
        default=False,
        metadata={
            "help": "transparent attention (Bapna et al. 2018, Eq. 1-2, M = 1): the decoder "
            "attends a learned softmax-weighted sum of all encoder layers, projected"
        },
    )


@dataclass
class RNMTPlusConfig(RNMTConfig, DLCLConfig):
    """Options of ``rnmt_plus``: RNMT+'s, the Transformer-named ones, and layer combination over
    the LSTM stacks (``--dlcl-*``, off by default here: ``--dlcl-stacks none``)."""

    dlcl_stacks: DLCL_STACKS = field(  # DLCLConfig's option, RNMT+'s default
        default="none",
        metadata={
            "help": "LSTM stacks that combine their layers with DLCL (Wang et al. 2019, pre-norm Eq. 8); "
            "'none' (RNMT+ as published) gives the plain residual stacks"
        },
    )
    encoder_embed_dim: int = field(default=1024, metadata={"help": "source embedding dimension"})
    decoder_embed_dim: int = field(default=1024, metadata={"help": "target embedding dimension"})
    encoder_layers: int = field(
        default=6, metadata={"help": "bidirectional LSTM layers of the encoder"}
    )
    decoder_layers: int = field(default=8, metadata={"help": "LSTM layers of the decoder"})
    dropout: float = field(
        default=0.3,
        metadata={
            "architecture": False,
            "help": "dropout on embeddings and on each layer output (En-De 0.3, En-Fr 0.2)",
        },
    )
    attention_dropout: float = field(
        default=0.3, metadata={"architecture": False, "help": "dropout on the attention weights"}
    )
    share_decoder_input_output_embed: bool = field(
        default=False, metadata={"help": "tie the decoder's input and output embeddings"}
    )
    share_all_embeddings: bool = field(
        default=False,
        metadata={"help": "share encoder, decoder and output embeddings (joined dictionary)"},
    )
    max_source_positions: int = field(
        default=1024, metadata={"architecture": False, "help": "longest source sentence"}
    )
    max_target_positions: int = field(
        default=1024, metadata={"architecture": False, "help": "longest target sentence"}
    )
    # fairseq's Transformer options that a user tries here: known, so that they are refused with a reason
    checkpoint_activations: bool = field(
        default=False,
        metadata={
            "architecture": False,
            "help": "not supported by RNMT+ (refused): lower --max-tokens, raise --update-freq",
        },
    )
    encoder_layerdrop: float = field(
        default=0.0, metadata={"architecture": False, "help": "not supported by RNMT+ (refused)"}
    )
