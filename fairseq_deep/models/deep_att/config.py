"""Options of Deep-Att / Deep-ED (Zhou et al. 2016): sizes of Sec. 4.2, fast-forward connections
(Sec. 3.1, Eq. 5-6), the interleaved encoder (Eq. 3) and the interface (Eq. 7-8)."""

from dataclasses import dataclass, field

from fairseq.dataclass import ChoiceEnum, FairseqDataclass

from ...modules.recurrent.kernel_choice import DEFAULT as DEFAULT_IMPL
from ...modules.recurrent.kernel_choice import IMPLS


def _opt(default, help_text, may_change=False):
    """A field; ``may_change``: not an architecture option (it may change when training goes on,
    fairseq_deep/model_options.py)."""
    metadata = {"help": help_text, **({"architecture": False} if may_change else {})}
    return field(default=default, metadata=metadata)


@dataclass
class DeepAttConfig(FairseqDataclass):
    encoder_embed_dim: int = _opt(256, "source word embedding size (Sec. 4.2: 256)")
    decoder_embed_dim: int = _opt(256, "target word embedding size (Sec. 4.2: 256)")
    encoder_hidden_size: int = _opt(512, "LSTM cells per encoder layer (Sec. 4.2: 512)")
    decoder_hidden_size: int = _opt(512, "LSTM cells per decoder layer (Sec. 4.2: 512)")
    encoder_layers: int = _opt(9, "n_e: layers per encoder column")
    decoder_layers: int = _opt(7, "n_d: decoder layers")
    dropout: float = _opt(0.1, "p_d: dropout on the LSTM outputs h (Sec. 3.2)", may_change=True)
    ff_mode: ChoiceEnum(["half", "whole", "none"]) = _opt(
        "half",
        "fast-forward input of layer k>1: [Half(f), Dr(h)] (Eq. 6), [f, Dr(h)] (Eq. 5), "
        "or none = the standard stacked LSTM (Table 2, no F-F)",
    )
    ff_encoder_columns: int = _opt(2, "encoder columns a1, a2 (Sec. 3.1; Table 5: 1)")
    ff_encoder_directions: ChoiceEnum(["interleaved", "forward"]) = _opt(
        "interleaved",
        "interleaved bi-directional encoder (Eq. 3) or every layer forward ('Uni', Table 4)",
    )
    ff_interface: ChoiceEnum(["att", "ed"]) = _opt(
        "att", "att = Deep-Att (attention over W_p e_t), ed = Deep-ED (static e, Eq. 7)"
    )
    ff_proj_ratio: int = _opt(
        4, "Deep-Att: W_p projects e_t to 1/ratio of its size (Eq. 8: 4); 1 = no W_p"
    )
    ff_attention_dim: int = _opt(
        0, "size of the alignment model a() of Eq. 9; 0 = the decoder hidden size"
    )
    ff_init_std: float = _opt(
        0.07,
        "non-recurrent parameters ~ N(0, std^2), recurrent ones zero (Sec. 4.3); "
        "<= 0 keeps PyTorch's initialisation",
        may_change=True,
    )
    deep_att_cell_impl: ChoiceEnum(list(IMPLS)) = _opt(
        DEFAULT_IMPL,
        "time loop of the Eq. 4 cells: 'auto' (the fused Triton kernels on a CUDA device when "
        "triton imports, else the loop; the same numbers), 'loop' (Python, every device) or 'triton' (one fused "
        "Triton kernel per step, forward and backward; needs triton and a CUDA GPU)",
        may_change=True,
    )
    max_source_positions: int = _opt(100000, "longest source", may_change=True)
    max_target_positions: int = _opt(100000, "longest target", may_change=True)
