"""Named architectures of the residual, initialisation and layer norm schemes
(modules/schemes/residual_schemes.py, modules/schemes/norm_schemes.py).

Each is the plain Transformer-Base of the ``transformer_dlcl`` family (``--dlcl-stacks none``:
512/2048/8 heads, dropout 0.1), post-norm or pre-norm as the scheme needs, with one scheme on; the
scheme is a setting (``--deepnorm``, ``--admin``, ``--ds-init``, ``--rezero``, ``--b2t``,
``--subln``, ``--peri-ln``, ``--mix-ln-ratio``, ``--dyt``, ``--layerscale``) that every Transformer
family of the package takes, so ``--arch transformer_dlcl_postnorm_30l --deepnorm`` or ``--arch
transformer_ta_baseline_16l --admin`` work too.  Depths (encoder + decoder layers) are those the
papers train on WMT where they do:

* ``transformer_deepnorm[_{18,50,100}l]``: DeepNet (Wang et al. 2022, Table 1): 18L-18L,
  50L-50L, 100L-100L on WMT-17 En-De at base width.
* ``transformer_admin[_{18,60}l]``: Admin (Liu et al. 2020, Table 1): 18L-18L (WMT'14 En-De) and
  60L-12L (WMT'14 En-Fr), base width.
* ``transformer_dsinit[_{12,20,30}l]``: DS-Init (Zhang et al. 2019, Table 3/5): 12, 20 and 30
  layers on each side, base width, post-norm (the merged attention of the paper is not included).
* ``transformer_rezero[_{18,50}l]``: ReZero (Bachlechner et al. 2020) N + N layers at base width
  (the paper's MT run is 6 + 6; its deep Transformers are language models).
* ``transformer_b2t[_{18,100}l]``: B2T connection (Takase et al. 2023), post-norm: 18L-18L and
  100L-100L on WMT En-De, as the paper (the authors' README trains these two with dropout 0.5,
  which ``--dropout 0.5`` gives, and word dropout 0.1, which neither fairseq nor this package has).
* ``transformer_subln[_{18,50}l]``, ``transformer_periln[_{18,50}l]``, ``transformer_mixln[_{18,50}l]``
  (ratio 0.25), ``transformer_dyt[_{18,50}l]``: Sub-LN/Magneto (Wang et al. 2023), Peri-LN (Kim et al.
  2025), Mix-LN (Li et al. 2025), DyT (Zhu et al. 2025) on the pre-norm Transformer; their papers'
  deep models are language or vision models, so the depths are ours (those of the other schemes).
* ``transformer_layerscale[_{18,24,36}l]``: LayerScale (Touvron et al. 2021) on the pre-norm
  Transformer, at depths where its initial lambda changes (0.1 up to 18 layers, 1e-5 at 24, 1e-6
  beyond; CaiT's are 24 and 36 layers).

The depth-free preset of each (6 + 6 layers) leaves the depths free; a depth-named preset owns them.
"""

from .families import PaperScale, Tiny, declare_presets
from .presets import register_preset
from .transformer_dlcl import postnorm_architecture, prenorm_architecture

_POST = ("Post-norm", postnorm_architecture)
_PRE = ("Pre-norm", prenorm_architecture)
_N = {18: (18, 18), 50: (50, 50)}

SCHEMES = {  # preset name: (what, the base, the options it owns, {depth name: (encoder, decoder)})
    "transformer_deepnorm": (
        "DeepNorm (Wang et al. 2022)",
        _POST,
        {"deepnorm": True},
        {18: (18, 18), 50: (50, 50), 100: (100, 100)},
    ),
    "transformer_admin": (
        "Admin (Liu et al. 2020)",
        _POST,
        {"admin": True},
        {18: (18, 18), 60: (60, 12)},
    ),
    "transformer_dsinit": (
        "DS-Init (Zhang et al. 2019)",
        _POST,
        {"ds_init": True},
        {12: (12, 12), 20: (20, 20), 30: (30, 30)},
    ),
    "transformer_rezero": ("ReZero (Bachlechner et al. 2020)", _POST, {"rezero": True}, _N),
    "transformer_b2t": (
        "the B2T connection (Takase et al. 2023)",
        _POST,
        {"b2t": True},
        {18: (18, 18), 100: (100, 100)},
    ),
    "transformer_subln": ("Sub-LN (Magneto, Wang et al. 2023)", _PRE, {"subln": True}, _N),
    "transformer_periln": ("Peri-LN (Kim et al. 2025)", _PRE, {"peri_ln": True}, _N),
    "transformer_dyt": ("DyT (Zhu et al. 2025)", _PRE, {"dyt": True}, _N),
    "transformer_layerscale": (
        "LayerScale (Touvron et al. 2021)",
        _PRE,
        {"layerscale": True},
        {18: (18, 18), 24: (24, 24), 36: (36, 36)},
    ),
}
#: schemes whose option is a value a preset only defaults (the command line may change it)
DEFAULTS = {"transformer_mixln": ("Mix-LN (Li et al. 2025), ratio 0.25", {"mix_ln_ratio": "0.25"})}

for _name, (_what, (_kind, _parent), _fixed, _depths) in SCHEMES.items():
    _base = register_preset(
        "transformer_dlcl",
        _name,
        f"{_kind} Transformer-Base with {_what}, 6 + 6 layers.",
        _parent,
        fixed=_fixed,
        defaults={"encoder_layers": 6, "decoder_layers": 6},
    )
    for _depth, _layers in _depths.items():
        register_preset(
            "transformer_dlcl",
            f"{_name}_{_depth}l",
            f"{_kind} Transformer-Base with {_what}, {_layers[0]} + {_layers[1]} layers.",
            _base,
            depth=_layers,
        )
for _name, (_what, _defaults) in DEFAULTS.items():
    _base = register_preset(
        "transformer_dlcl",
        _name,
        f"Pre-norm Transformer-Base with {_what}, 6 + 6 layers.",
        prenorm_architecture,
        defaults={**_defaults, "encoder_layers": 6, "decoder_layers": 6},
    )
    for _depth, _layers in _N.items():
        register_preset(
            "transformer_dlcl",
            f"{_name}_{_depth}l",
            f"Pre-norm Transformer-Base with {_what}, {_layers[0]} + {_layers[1]} layers.",
            _base,
            depth=_layers,
        )


# the study's depth group (and DeepNorm, a baseline of the modern group) and the test matrices
# (issue 17: tiny, 3 + 2 layers; the paper's depth-18 presets at scale)
declare_presets(
    "transformer_dlcl",
    sweeps={
        "depth": (
            ("DeepNorm", "transformer_deepnorm", "deepnorm"),
            ("Admin", "transformer_admin", "admin"),
            ("DS-Init", "transformer_dsinit", "dsinit"),
            ("ReZero", "transformer_rezero", "rezero"),
        ),
        "modern": (("DeepNorm", "transformer_deepnorm", "deepnorm"),),
    },
    tiny=(
        Tiny(
            "transformer_deepnorm",
            "transformer_deepnorm",
            PaperScale("transformer_deepnorm_18l", (144.7, 36 * 512, 0)),
        ),
        Tiny(
            "transformer_admin",
            "transformer_admin",
            PaperScale("transformer_admin_18l", (144.8, 36 * 512, 0)),
            samples=("bf16",),
        ),
        Tiny(
            "transformer_dsinit",
            "transformer_dsinit",
            PaperScale("transformer_dsinit_12l", (100.6, 24 * 512, 0)),
        ),
        Tiny(
            "transformer_rezero",
            "transformer_rezero",
            PaperScale("transformer_rezero_18l", (144.6, 36 * 512, 0)),
        ),
    ),
)

# issue 41: the per-layer schemes' lines of the study's modern group and rows of the matrices
# (modules/schemes/norm_schemes.py, B2T in residual_schemes.py); Mix-LN at ratio 0.5 in the matrices, not
# the paper's 0.25 (the preset's, which the study trains): the tiny 3 + 2 layers then mix post- and
# pre-norm on both sides
declare_presets(
    "transformer_dlcl",
    sweeps={
        "modern": (
            ("B2T", "transformer_b2t", "b2t"),
            ("Sub-LN", "transformer_subln", "subln"),
            ("Peri-LN", "transformer_periln", "periln"),
            ("Mix-LN", "transformer_mixln", "mixln"),
            ("DyT", "transformer_dyt", "dyt"),
            ("LayerScale", "transformer_layerscale", "layerscale"),
        )
    },
    tiny=(
        Tiny(
            "transformer_b2t",
            "transformer_b2t",
            PaperScale("transformer_b2t_18l", (144.7, 36 * 512, 0)),
        ),
        Tiny(
            "transformer_subln",
            "transformer_subln",
            PaperScale("transformer_subln_18l", (144.9, 36 * 512, 0)),
        ),
        Tiny(
            "transformer_periln",
            "transformer_periln",
            PaperScale("transformer_periln_18l", (144.8, 36 * 512, 0)),
        ),
        Tiny(
            "transformer_mixln",
            "transformer_mixln",
            PaperScale("transformer_mixln_18l", (144.7, 36 * 512, 0)),
            model=("--mix-ln-ratio", "0.5"),
        ),
        Tiny(
            "transformer_dyt",
            "transformer_dyt",
            PaperScale("transformer_dyt_18l", (144.7, 36 * 512, 0)),
        ),
        Tiny(
            "transformer_layerscale",
            "transformer_layerscale",
            PaperScale("transformer_layerscale_18l", (144.8, 36 * 512, 0)),
        ),
    ),
)
