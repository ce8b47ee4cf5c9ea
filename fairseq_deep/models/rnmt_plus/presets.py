"""Named RNMT+ architectures.  They only fill defaults (a command-line value wins) and chain to
``rnmt_plus``; what a preset's name states (encoder depth, transparent attention, no encoder
residuals) is fixed, and a conflicting flag is an error that names it.  Optimisation settings
(Eq. 1, dropout per language pair, weight decay) live in the recipes under examples/rnmt_plus.

* ``rnmt_plus``: App. A.3 of Chen et al. (1024 units, 6 bidirectional encoder layers, 8 decoder
  layers, 4 attention heads, dropout 0.3 as for En-De).
* ``rnmt_plus_512`` and ``rnmt_plus_512_{12,16,20}l``: the smaller RNMT+ of Bapna et al. (2018,
  Sec. 2.2, "Baseline" of Tables 3-4): 512 units, 6/12/16/20 encoder layers, 8 decoder layers.
* ``rnmt_plus_512_ta[_{12,16,20}l]``: the same with transparent attention (M = 1, the projection
  applied to the weighted combination; "Transparent" rows).
* ``rnmt_plus_512_nores[_{12,16,20}l]``: no residual connections in the encoder ("Baseline -
  residuals" rows; only the 6-layer one trained in the paper).
"""

from ..presets import register_preset, same_as
from .config import RNMTPlusConfig

rnmt_plus_architecture = register_preset(
    "rnmt_plus",
    "rnmt_plus",
    "RNMT+ of Chen et al. (2018), App. A.3: 1024 units, 6 + 8 layers, 4 heads.",
    # "all dropout types" share one rate; RNMT+ as published has no DLCL (RNMTPlusConfig: --dlcl-stacks none)
    defaults={"attention_dropout": same_as("dropout", RNMTPlusConfig.dropout)},
    options=RNMTPlusConfig,
)
rnmt_plus_512 = register_preset(
    "rnmt_plus",
    "rnmt_plus_512",
    "The smaller RNMT+ of Bapna et al. (2018, Sec. 2.2): 512 units, 6 + 8 layers.",
    rnmt_plus_architecture,
    defaults={
        name: 512
        for name in (
            "encoder_embed_dim",
            "decoder_embed_dim",
            "encoder_hidden_size",
            "decoder_hidden_size",
        )
    },
)


VARIANTS = {  # name part: (what, the options it owns)
    "": ("baseline", {}),
    "_ta": ("transparent attention", {"rnmt_transparent": True}),
    "_nores": ("no encoder residuals", {"rnmt_encoder_residual_start": 0}),
}

for _depth in (6, 12, 16, 20):
    _suffix = "" if _depth == 6 else f"_{_depth}l"
    for _part, (_what, _fixed) in VARIANTS.items():
        if _part or _depth != 6:  # rnmt_plus_512 itself is registered above
            register_preset(
                "rnmt_plus",
                f"rnmt_plus_512{_part}{_suffix}",
                f"RNMT+ (512) of Bapna et al. (2018), {_depth}-layer encoder, {_what} (Tables 3-4).",
                rnmt_plus_512,
                fixed={"encoder_layers": _depth, **_fixed},
                instead="rnmt_plus_512",
            )
