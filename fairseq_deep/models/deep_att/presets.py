"""Named architectures of Zhou et al. (2016): sizes of Sec. 4.2 (embeddings 256, 512 cells) and the
grid of Tables 2-6.  Presets fill defaults (a command-line value wins) and chain to ``deep_att``;
what a preset's name states (depth, columns, width, no F-F, Uni, Deep-ED) is fixed, and a
conflicting flag is an error naming it.  Optimisation settings live in the recipes."""

from ..presets import register_preset
from .config import DeepAttConfig

deep_att_architecture = register_preset(
    "deep_att",
    "deep_att",
    "Deep-Att with F-F connections, n_e = 9, n_d = 7, two interleaved columns (Table 1: 37.7).",
    options=DeepAttConfig,
)
deep_att_ff = register_preset(
    "deep_att",
    "deep_att_ff",
    "Deep-Att with F-F connections (the paper's final model).",
    deep_att_architecture,
)


deep_ed_ff = register_preset(
    "deep_att",
    "deep_ed_ff",
    "Deep-ED: the static interface of Eq. 7 instead of attention (Table 1: 36.3).",
    deep_att_architecture,
    fixed={"ff_interface": "ed"},
)
register_preset(
    "deep_att",
    "deep_att_ff_uni",
    "Table 4 'Uni': two columns, every encoder layer forward.",
    deep_att_architecture,
    fixed={"ff_encoder_directions": "forward"},
)
register_preset(
    "deep_att",
    "deep_ed_ff_uni",
    "Table 4 'Uni' for Deep-ED.",
    deep_ed_ff,
    fixed={"ff_encoder_directions": "forward"},
)


def _register(name: str, doc: str, fixed: dict, defaults: dict = None):
    return register_preset(
        "deep_att", name, doc, deep_att_architecture, fixed=fixed, defaults=defaults
    )


def _depth(n_e, n_d):
    return {"encoder_layers": n_e, "decoder_layers": n_d}


def _width(w):
    return {"encoder_hidden_size": w, "decoder_hidden_size": w}


# Tables 2 and 5: depth with F-F (two columns).
for _e, _d in ((1, 1), (2, 2), (5, 3), (9, 7)):
    _register(
        f"deep_att_ff_{_e}x{_d}",
        f"Deep-Att with F-F, n_e = {_e}, n_d = {_d} (Tables 2, 5).",
        {**_depth(_e, _d), "ff_mode": "half"},
    )
# Tables 5 and 6: one encoder column, width 512 and 1024.
_register(
    "deep_att_ff_9x7_1col",
    "Deep-Att with F-F, 9/7, one encoder column (Table 5: 36.6).",
    {**_depth(9, 7), "ff_mode": "half", "ff_encoder_columns": 1},
)
_register(
    "deep_att_ff_9x7_1col_w1024",
    "Deep-Att with F-F, 9/7, one column, 1024 cells (Table 6: 36.7).",
    {**_depth(9, 7), "ff_mode": "half", "ff_encoder_columns": 1, **_width(1024)},
)
# Tables 2 and 3: without F-F (the standard stacked model; W_p off, so 1/1 is Bahdanau's model).
for _e, _d in ((1, 1), (2, 2)):
    _register(
        f"deep_att_noff_{_e}x{_d}",
        f"Deep-Att without F-F, n_e = {_e}, n_d = {_d} (Table 2).",
        {**_depth(_e, _d), "ff_mode": "none"},
        {"ff_proj_ratio": 1},
    )
_register(
    "deep_att_noff_2x2_w1024",
    "Deep-Att without F-F, 2/2, 1024 cells (Table 3: 33.8).",
    {**_depth(2, 2), "ff_mode": "none", **_width(1024)},
    {"ff_proj_ratio": 1},
)
