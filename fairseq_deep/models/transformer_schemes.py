"""Named architectures of the residual and initialisation schemes (modules/residual_schemes.py).

Each is the plain post-norm Transformer-Base of the ``transformer_dlcl`` family (``--dlcl-stacks
none``: 512/2048/8 heads, dropout 0.1) with one scheme on; the scheme is a setting
(``--deepnorm``, ``--admin``, ``--ds-init``, ``--rezero``) that every Transformer family of the
package takes, so ``--arch transformer_dlcl_postnorm_30l --deepnorm`` or ``--arch
transformer_ta_baseline_16l --admin`` work too.  Depths (encoder + decoder layers) are those the
papers train on WMT:

* ``transformer_deepnorm[_{18,50,100}l]``: DeepNet (Wang et al. 2022, Table 1): 18L-18L,
  50L-50L, 100L-100L on WMT-17 En-De at base width.
* ``transformer_admin[_{18,60}l]``: Admin (Liu et al. 2020, Table 1): 18L-18L (WMT'14 En-De) and
  60L-12L (WMT'14 En-Fr), base width.
* ``transformer_dsinit[_{12,20,30}l]``: DS-Init (Zhang et al. 2019, Table 3/5): 12, 20 and 30
  layers on each side, base width, post-norm (the merged attention of the paper is not included).
* ``transformer_rezero[_{18,50}l]``: ReZero (Bachlechner et al. 2020) N + N layers at base width
  (the paper's MT run is 6 + 6; its deep Transformers are language models).

The depth-free preset of each (6 + 6 layers) leaves the depths free; a depth-named preset owns them.
"""

from .families import Tiny, declare_presets
from .presets import register_preset
from .transformer_dlcl import postnorm_architecture

SCHEMES = {  # preset name: (what, the option it owns, {depth name: (encoder, decoder layers)})
    "transformer_deepnorm": (
        "DeepNorm (Wang et al. 2022)",
        "deepnorm",
        {18: (18, 18), 50: (50, 50), 100: (100, 100)},
    ),
    "transformer_admin": ("Admin (Liu et al. 2020)", "admin", {18: (18, 18), 60: (60, 12)}),
    "transformer_dsinit": (
        "DS-Init (Zhang et al. 2019)",
        "ds_init",
        {12: (12, 12), 20: (20, 20), 30: (30, 30)},
    ),
    "transformer_rezero": (
        "ReZero (Bachlechner et al. 2020)",
        "rezero",
        {18: (18, 18), 50: (50, 50)},
    ),
}

for _name, (_what, _option, _depths) in SCHEMES.items():
    _base = register_preset(
        "transformer_dlcl",
        _name,
        f"Post-norm Transformer-Base with {_what}, 6 + 6 layers.",
        postnorm_architecture,
        fixed={_option: True},
        defaults={"encoder_layers": 6, "decoder_layers": 6},
    )
    for _depth, _layers in _depths.items():
        register_preset(
            "transformer_dlcl",
            f"{_name}_{_depth}l",
            f"Post-norm Transformer-Base with {_what}, {_layers[0]} + {_layers[1]} layers.",
            _base,
            depth=_layers,
        )


# the study's depth group and the test matrices (issue 17: tiny, 3 + 2 layers; the paper's depth-18
# presets at scale)
declare_presets(
    "transformer_dlcl",
    depth_sweep=(
        ("DeepNorm", "transformer_deepnorm", "deepnorm"),
        ("Admin", "transformer_admin", "admin"),
        ("DS-Init", "transformer_dsinit", "dsinit"),
        ("ReZero", "transformer_rezero", "rezero"),
    ),
    tiny=(
        Tiny(
            "transformer_deepnorm",
            "transformer_deepnorm",
            "transformer_deepnorm_18l",
            (144.7, 36 * 512, 0),
        ),
        Tiny(
            "transformer_admin",
            "transformer_admin",
            "transformer_admin_18l",
            (144.8, 36 * 512, 0),
            samples=("bf16",),
        ),
        Tiny(
            "transformer_dsinit",
            "transformer_dsinit",
            "transformer_dsinit_12l",
            (100.6, 24 * 512, 0),
        ),
        Tiny(
            "transformer_rezero",
            "transformer_rezero",
            "transformer_rezero_18l",
            (144.6, 36 * 512, 0),
        ),
    ),
)
