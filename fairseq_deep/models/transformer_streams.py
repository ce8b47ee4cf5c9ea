"""Named architectures of the stream-level schemes (modules/schemes/stream_schemes.py).

Each is the plain Transformer-Base of the ``transformer_dlcl`` family (``--dlcl-stacks none``:
512/2048/8 heads) with one scheme on: pre-norm (as ``transformer_prenorm``) for DenseFormer,
hyper-connections and the ODE blocks, post-norm (``transformer_postnorm``) for ResiDual, whose
main stream is post-LN.  The scheme is a setting every Transformer family takes (``--arch
transformer_ta_baseline --resi-dual`` works too).  Depths, for deep translation models: 6 + 6
(depth-free), 18 + 18 and a 48-layer encoder over 6 decoder layers:

* ``transformer_denseformer[_{18,48}l]``: DenseFormer 1x1 (Pagliardini et al. 2024; the paper's
  models are 48- and 72-block language models; the authors' experiments default to a DWA every 2
  blocks over every 2nd block's output: ``--denseformer-period 2 --denseformer-dilation 2``);
* ``transformer_hc[_{18,48}l]``: dynamic hyper-connections with 4 streams (DHCx4, Zhu et al.
  2025, their best); ``transformer_mhc[_{18,48}l]``: mHC with 4 streams (Xie et al. 2025);
* ``transformer_resi_dual[_{18,48}l]``: ResiDual (Xie et al. 2023; the authors' README trains 6
  or 12 layers per side on IWSLT and WMT, their OPUS configuration 18 + 18 with the dual stream
  scaled by 0.05, the same as a dual-norm epsilon of 4e-5: docs/deep_schemes.md);
* ``transformer_ode_rk2[_{18,48}l]``: RK2 blocks with the gated coefficients in the encoder (Li et
  al. 2022); ``transformer_ode_rk4``: fixed RK4 blocks.  The authors' training scripts train more:
  12 gated RK2 encoder blocks and 6 decoder layers of a pre-norm Big model with DLCL in both
  stacks and relative positions, which is ``--arch transformer_dlcl_big_12l --ode-method rk2``
  without the relative positions (this package has none).
"""

from .families import PaperScale, Tiny, declare_presets
from .presets import register_preset
from .transformer_dlcl import postnorm_architecture, prenorm_architecture

DEPTHS = {18: (18, 18), 48: (48, 6)}

STREAMS = {  # preset: (what, the options it owns, parent, the preset a changed option points to)
    "transformer_denseformer": (
        "DenseFormer (Pagliardini et al. 2024)",
        {"denseformer": True},
        prenorm_architecture,
        "transformer_prenorm",
    ),
    "transformer_hc": (
        "dynamic hyper-connections x4 (Zhu et al. 2025)",
        {"hyper_connections": "dynamic"},
        prenorm_architecture,
        "transformer_prenorm",
    ),
    "transformer_mhc": (
        "mHC x4 (Xie et al. 2025)",
        {"hyper_connections": "mhc"},
        prenorm_architecture,
        "transformer_prenorm",
    ),
    "transformer_resi_dual": (
        "ResiDual (Xie et al. 2023)",
        {"resi_dual": True},
        postnorm_architecture,
        "transformer_postnorm",
    ),
    "transformer_ode_rk2": (
        "gated RK2 encoder blocks (Li et al. 2022)",
        {"ode_method": "rk2"},
        prenorm_architecture,
        "transformer_prenorm",
    ),
    "transformer_ode_rk4": (
        "RK4 encoder blocks (Li et al. 2022)",
        {"ode_method": "rk4"},
        prenorm_architecture,
        "transformer_prenorm",
    ),
}

#: what a preset fills besides its depths (a value given on the command line wins)
DEFAULTS = {"transformer_ode_rk4": {"ode_coefficients": "fixed"}}  # the paper's RK4 block

for _name, (_what, _options, _parent, _instead) in STREAMS.items():
    _norm = "Pre" if _parent is prenorm_architecture else "Post"
    _base = register_preset(
        "transformer_dlcl",
        _name,
        f"{_norm}-norm Transformer-Base, 6 + 6 layers, with {_what}.",
        _parent,
        fixed=_options,
        defaults={"encoder_layers": 6, "decoder_layers": 6, **DEFAULTS.get(_name, {})},
        instead=_instead,
    )
    if _name == "transformer_ode_rk4":
        continue
    for _depth, _layers in DEPTHS.items():
        register_preset(
            "transformer_dlcl",
            f"{_name}_{_depth}l",
            f"{_norm}-norm Transformer-Base, {_layers[0]} + {_layers[1]} layers, with {_what}.",
            _base,
            depth=_layers,
        )

# the study's modern group (its lines) and the matrices' rows (models/families.py): tiny 3 + 2
# layers, the ODE blocks in both stacks; the paper-scale memory of the 48 + 6 presets
# (benchmarks/precision_matrix.estimate_gb: 188.7M parameters with an 8k vocabulary;
# hyper-connections keep 4 streams and RK2 evaluates each layer twice, so their activations count
# twice)
declare_presets(
    "transformer_dlcl",
    sweeps={
        "modern": (
            ("DenseFormer", "transformer_denseformer", "denseformer"),
            ("HC", "transformer_hc", "hc"),
            ("mHC", "transformer_mhc", "mhc"),
            ("ResiDual", "transformer_resi_dual", "resi_dual"),
            ("ODE RK2", "transformer_ode_rk2", "ode_rk2"),
            ("ODE RK4", "transformer_ode_rk4", "ode_rk4"),
        )
    },
    tiny=(
        Tiny(
            "transformer_denseformer",
            "transformer_denseformer",
            PaperScale("transformer_denseformer_48l", (188.7, 54 * 512, 0)),
        ),
        Tiny(
            "transformer_hc",
            "transformer_hc",
            PaperScale("transformer_hc_48l", (188.7, 108 * 512, 0)),
        ),
        Tiny(
            "transformer_mhc",
            "transformer_mhc",
            PaperScale("transformer_mhc_48l", (188.7, 108 * 512, 0)),
        ),
        Tiny(
            "transformer_resi_dual",
            "transformer_resi_dual",
            PaperScale("transformer_resi_dual_48l", (188.7, 54 * 512, 0)),
        ),
        Tiny(
            "transformer_ode_rk2",
            "transformer_ode_rk2",
            PaperScale("transformer_ode_rk2_48l", (188.7, 108 * 512, 0)),
            model=("--ode-stacks", "both"),
        ),
    ),
)
