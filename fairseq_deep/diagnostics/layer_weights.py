"""Export and plot the learned layer weights of a checkpoint (Wang et al. 2019, Sec. 6.4, Fig. 5).

    python -m fairseq_deep.diagnostics.layer_weights CHECKPOINT --out-dir DIR \
        [--mask-below 0.1 --mask-row-fraction 0.05] [--no-mask] [--no-plot]

Every learned layer-weight matrix of the model is found by the suffix of its state-dict key,
through the *kinds* that the model families declare (:func:`kinds`: each technique's
:class:`~fairseq_deep.modules.common.layer_weight_kinds.LayerWeightKind` beside its module, named in
its families' declarations, :mod:`fairseq_deep.models.families`).  For each matrix the command
writes ``<key>.json`` (matrix, labels, key, kind), ``<key>.csv`` and ``<key>.png``, a heatmap
drawn as in Fig. 5: one row per reader (layer l+1 ... the readout),
one column per layer read (y_0 = embedding ... y_l).  As in the paper, entries with ``|w| < 0.1`` or
below 5% of their row's largest absolute value are masked out of the plot (``--no-mask`` shows
them); the JSON and CSV always hold every value.
"""

import csv
import json
import logging
import os
import sys
from typing import Any, Dict, List, Optional, Sequence

import torch
from torch import Tensor

from ..checkpoints import load_as_saved
from ..errors import ArgumentParser, UserError, import_optional, report_user_errors
from ..models import families
from ..modules.common.layer_weight_kinds import (  # noqa: F401  (cfg_value, layer_labels: this module's API)
    LayerWeightKind,
    cfg_value,
    layer_labels,
)
from ..quiet import quiet_warnings

logger = logging.getLogger("fairseq_deep.diagnostics.layer_weights")


# ---------------------------------------------------------------------------------------------
# Kinds of layer-weight matrices: declared beside their modules, named by the families
# ---------------------------------------------------------------------------------------------


def kinds() -> Dict[str, LayerWeightKind]:
    """Every kind of layer-weight matrix that a registered model family holds, by name."""
    return families.layer_weight_kinds()


# ---------------------------------------------------------------------------------------------
# Extraction and masking
# ---------------------------------------------------------------------------------------------


def extract_layer_weights(state_dict: Dict[str, Tensor], cfg=None) -> List[Dict[str, Any]]:
    """One record per learned layer-weight matrix of ``state_dict``, in key order.

    ``cfg`` is the model config of the checkpoint (``ckpt["cfg"]["model"]``, a Namespace, dict or
    omegaconf node; ``None`` for defaults).  A record holds ``key``, ``kind``, ``matrix`` (a float
    tensor, plotting orientation), ``valid`` (bool tensor), ``row_labels``, ``col_labels`` and
    ``stored_shape``.
    """
    records = []
    known = kinds().values()
    for key, value in state_dict.items():
        if not isinstance(value, Tensor):
            continue
        for kind in known:
            if kind.matches(key, value):
                matrix, valid = kind.effective(value, cfg)
                rows, cols = kind.labels(matrix)
                records.append(
                    {
                        "key": key,
                        "kind": kind.name,
                        "matrix": matrix,
                        "valid": valid,
                        "row_labels": rows,
                        "col_labels": cols,
                        "stored_shape": list(value.shape),
                    }
                )
                break
    return records


def small_weight_mask(
    matrix: Tensor, below: float = 0.1, row_fraction: float = 0.05, valid: Optional[Tensor] = None
) -> Tensor:
    """Entries to hide, as in Wang et al. Sec. 6.4: ``|w| < below`` or ``|w| < row_fraction *
    max_k |w[r, k]|`` (the row's largest absolute value over its valid entries), and every entry that
    is not ``valid``.  True = masked."""
    a = matrix.detach().float().abs()
    valid = torch.ones_like(a, dtype=torch.bool) if valid is None else valid.bool()
    row_max = a.masked_fill(~valid, 0).max(dim=1, keepdim=True).values
    return ~valid | (a < below) | (a < row_fraction * row_max)


# ---------------------------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------------------------


def _pyplot():
    # an import of fairseq leaves the root logger at DEBUG, where matplotlib logs its font search
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    matplotlib = import_optional(
        "matplotlib",
        "plotting layer weights",
        "matplotlib (or the extra 'fairseq_deep[plot]')",
        "pass --no-plot to write only JSON and CSV",
    )
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


#: at most this many labelled ticks on an axis: deeper matrices label every k-th layer (and the last)
MAX_TICK_LABELS = 16


def tick_positions(n: int, max_labels: int = MAX_TICK_LABELS) -> List[int]:
    """The rows (or columns) of an ``n``-long axis that get a label: all of them up to ``max_labels``,
    else every k-th (k = 2, 5, 10, ... so that labels read as round layer numbers), always with the first
    (y_0, the embedding) and the last (the readout, or the top layer)."""
    if n <= max_labels:
        return list(range(n))
    step = (
        next(k for k in (2, 5, 10, 20, 25, 50, 100, 200, 500) if n / k <= max_labels)
        if n <= 500 * max_labels
        else -(-n // max_labels)
    )
    ticks = list(range(0, n, step))
    if n - 1 - ticks[-1] < step / 2:  # too close to the last: the last instead
        ticks[-1] = n - 1
    elif ticks[-1] != n - 1:
        ticks.append(n - 1)
    return ticks


def _figure_size(n_rows: int, n_cols: int):
    """Inches (width, height): about 0.3 in a cell, within 4.5 x 4 and 24 x 22 (a colour bar beside)."""
    width = min(24.0, max(4.5, 0.3 * n_cols + 3.5))
    height = min(22.0, max(4.0, 0.3 * n_rows + 2.5))
    return width, height


def plot_heatmap(
    matrix,
    row_labels: Sequence[str],
    col_labels: Sequence[str],
    title: str,
    path: str,
    mask=None,
    annotate: Optional[bool] = None,
    empty=None,
) -> str:
    """Draw ``matrix`` as a heatmap (:func:`heatmap_figure`) into ``path`` (PNG); returns ``path``."""
    plt = _pyplot()
    fig = heatmap_figure(
        matrix, row_labels, col_labels, title, mask=mask, annotate=annotate, empty=empty
    )
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def heatmap_figure(
    matrix,
    row_labels: Sequence[str],
    col_labels: Sequence[str],
    title: str,
    mask=None,
    annotate: Optional[bool] = None,
    empty=None,
):
    """A matplotlib figure of ``matrix`` as a heatmap (rows top to bottom, columns left to right).

    ``mask``: a bool matrix, True where an entry is hidden.  ``empty``: True where no entry exists
    (e.g. the upper triangle of a layer-combination matrix): drawn white; hidden entries that do
    exist are drawn light grey and hatched, so that the two cannot be mistaken for each other.
    Values are annotated in the cells when ``annotate`` (default: matrices of at most 12 columns
    and rows).

    Readable at any depth: the figure grows with the rows and columns (each on its own), an axis of
    more than :data:`MAX_TICK_LABELS` labels every k-th layer (:func:`tick_positions`) with a thin
    grid line there, at a fixed readable font size.  Colours: signed matrices (DLCL's weights) get a
    diverging map centred at 0 (blue negative, white 0, red positive, symmetric limits), non-negative
    ones (softmax weights) a sequential map from 0; the colour bar beside the plot is as tall as it
    and says which.
    """
    plt = _pyplot()
    import numpy as np
    from mpl_toolkits.axes_grid1 import make_axes_locatable

    m = np.asarray(
        matrix.detach().cpu().float() if isinstance(matrix, Tensor) else matrix, dtype=float
    )
    hidden = (
        np.zeros_like(m, dtype=bool)
        if mask is None
        else np.asarray(mask.cpu() if isinstance(mask, Tensor) else mask, dtype=bool)
    )
    data = np.ma.masked_array(m, mask=hidden)
    shown = m[~hidden]
    signed = bool(shown.size and shown.min() < 0)
    if signed:
        vmax = float(np.abs(shown).max()) or 1.0
        cmap, vmin = plt.get_cmap("RdBu_r").copy(), -vmax
        bar_label = "weight (signed: blue < 0 < red, centred at 0)"
    else:
        cmap = plt.get_cmap("viridis").copy()
        vmin, vmax = 0.0, (float(shown.max()) if shown.size else 1.0) or 1.0
        bar_label = "weight"
    cmap = (
        cmap.with_extremes(bad="white") if hasattr(cmap, "with_extremes") else cmap
    )  # masked: white
    if not hasattr(cmap, "with_extremes"):  # pragma: no cover - matplotlib < 3.4
        cmap.set_bad("white")

    n_rows, n_cols = m.shape
    size = _figure_size(n_rows, n_cols)
    fig, ax = plt.subplots(figsize=size)
    im = ax.imshow(data, cmap=cmap, vmin=vmin, vmax=vmax, interpolation="nearest", aspect="auto")
    fontsize = min(
        13.0, max(9.0, 0.5 * max(size))
    )  # the large figures of deep models: larger labels
    rows, cols = tick_positions(n_rows), tick_positions(n_cols)
    ax.set_xticks(cols)
    long_labels = max((len(str(col_labels[c])) for c in cols), default=0) > 4
    ax.set_xticklabels(
        [col_labels[c] for c in cols],
        fontsize=fontsize,
        rotation=45 if long_labels else 0,
        ha="right" if long_labels else "center",
        rotation_mode="anchor",
    )
    ax.set_yticks(rows)
    ax.set_yticklabels([row_labels[r] for r in rows], fontsize=fontsize)
    if len(cols) < n_cols or len(rows) < n_rows:  # thin guides at the labelled layers
        for c in cols:
            ax.axvline(c, color="0.6", linewidth=0.4, alpha=0.5, zorder=3)
        for r in rows:
            ax.axhline(r, color="0.6", linewidth=0.4, alpha=0.5, zorder=3)
    ax.set_xlabel("layer read", fontsize=fontsize + 1)
    ax.set_ylabel("reader", fontsize=fontsize + 1)
    ax.set_title(title, fontsize=fontsize + 1)
    if annotate is None:
        annotate = max(n_rows, n_cols) <= 12
    if annotate:
        for r in range(n_rows):
            for c in range(n_cols):
                if not hidden[r, c]:
                    dark = (abs(m[r, c]) > 0.6 * vmax) if signed else (m[r, c] < (vmin + vmax) / 2)
                    ax.text(
                        c,
                        r,
                        f"{m[r, c]:.2f}",
                        ha="center",
                        va="center",
                        fontsize=7,
                        color="white" if dark else "black",
                    )
    if empty is not None:
        from matplotlib.patches import Rectangle

        absent = np.asarray(empty.cpu() if isinstance(empty, Tensor) else empty, dtype=bool)
        for r, c in zip(*np.nonzero(hidden & ~absent)):
            ax.add_patch(
                Rectangle(
                    (c - 0.5, r - 0.5),
                    1,
                    1,
                    facecolor="0.88",
                    edgecolor="0.55",
                    hatch="///",
                    linewidth=0,
                )
            )
    cax = make_axes_locatable(ax).append_axes(
        "right", size=0.22, pad=0.15
    )  # inches: as tall as the plot
    bar = fig.colorbar(im, cax=cax)
    bar.ax.tick_params(labelsize=fontsize)
    bar.set_label(bar_label, fontsize=fontsize)
    fig.tight_layout()
    return fig


def write_record(
    record: Dict[str, Any],
    out_dir: str,
    mask: Optional[Tensor] = None,
    plot: bool = True,
    note: str = "",
) -> Dict[str, str]:
    """Write ``<key>.json``, ``<key>.csv`` and (when ``plot``) ``<key>.png`` into ``out_dir``."""
    os.makedirs(out_dir, exist_ok=True)
    base = os.path.join(out_dir, record["key"])
    m = record["matrix"]
    paths = {"json": base + ".json", "csv": base + ".csv"}
    with open(paths["json"], "w", encoding="utf-8") as f:
        json.dump(
            {
                "key": record["key"],
                "kind": record["kind"],
                "description": kinds()[record["kind"]].description
                if record["kind"] in kinds()
                else "",
                "stored_shape": record["stored_shape"],
                "row_labels": record["row_labels"],
                "col_labels": record["col_labels"],
                "matrix": m.tolist(),
                "valid": record["valid"].tolist(),
                "plot_mask": None if mask is None else mask.tolist(),
            },
            f,
            indent=1,
        )
    with open(paths["csv"], "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["reader"] + list(record["col_labels"]))
        for label, row in zip(record["row_labels"], m.tolist()):
            w.writerow([label] + [f"{v:.6g}" for v in row])
    if plot:
        title = f"{record['key']} ({record['kind']})" + (f"\n{note}" if note else "")
        paths["png"] = plot_heatmap(
            m,
            record["row_labels"],
            record["col_labels"],
            title,
            base + ".png",
            mask=mask,
            empty=~record["valid"],
        )
    return paths


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------


def load_checkpoint(path: str):
    """``(state_dict, model_cfg)`` of a fairseq checkpoint, loaded with torch's safe unpickler."""
    # a missing, truncated or refused file: the CheckpointError of generate/interactive/hub
    ckpt = load_as_saved(path, require_model=False)
    if isinstance(ckpt, dict) and "model" in ckpt and isinstance(ckpt["model"], dict):
        cfg = ckpt.get("cfg") or {}
        model_cfg = cfg_value(cfg, "model", None) if cfg else None
        if model_cfg is None:
            model_cfg = ckpt.get("args")  # checkpoints of fairseq < 0.10
        return ckpt["model"], model_cfg
    if isinstance(ckpt, dict) and all(isinstance(v, Tensor) for v in ckpt.values()):
        return ckpt, None  # a bare state dict
    raise UserError(
        f"{path} is neither a fairseq checkpoint (a dict with 'model') nor a state dict"
    )


def get_parser():
    p = ArgumentParser(
        prog="fairseq-deep-layer-weights",
        description="Export (JSON, CSV) and plot (PNG) the learned layer weights of a checkpoint, "
        "as Fig. 5 of Wang et al. (2019).",
    )
    p.add_argument("checkpoint", help="a fairseq checkpoint (e.g. checkpoints/checkpoint_best.pt)")
    p.add_argument("--out-dir", required=True, help="folder for <key>.json, <key>.csv, <key>.png")
    p.add_argument(
        "--mask-below",
        type=float,
        default=0.1,
        help="hide entries with |w| below this value in the plot (default 0.1, as the paper)",
    )
    p.add_argument(
        "--mask-row-fraction",
        type=float,
        default=0.05,
        help="hide entries below this fraction of their row's max |w| (default 0.05)",
    )
    p.add_argument("--no-mask", action="store_true", help="show every entry of the matrix")
    p.add_argument("--no-plot", action="store_true", help="write JSON and CSV only (no matplotlib)")
    return p


def main(argv=None) -> int:
    args = get_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    state_dict, cfg = load_checkpoint(args.checkpoint)
    records = extract_layer_weights(state_dict, cfg)
    if not records:
        suffixes = ", ".join(f"'{k.suffix}' ({k.name})" for k in kinds().values())
        print(
            f"error: no layer-weight matrix in {args.checkpoint}: looked for keys ending in "
            f"{suffixes}. Was the model trained with layer weights (e.g. --arch transformer_dlcl "
            "with --dlcl-stacks other than none)?",
            file=sys.stderr,
        )
        return 1
    if not args.no_plot:
        _pyplot()  # fail before writing anything when matplotlib is missing
    for record in records:
        if args.no_mask or not kinds()[record["kind"]].mask_small:
            mask, note = ~record["valid"], ""  # entries that do not exist stay blank
        else:
            mask = small_weight_mask(
                record["matrix"], args.mask_below, args.mask_row_fraction, record["valid"]
            )
            note = (
                f"hatched: |w| < {args.mask_below:g} or < {args.mask_row_fraction:g} x row max |w|; "
                "white: no such connection"
            )
        paths = write_record(record, args.out_dir, mask=mask, plot=not args.no_plot, note=note)
        shape = "x".join(map(str, record["matrix"].shape))
        print(f"{record['key']} ({record['kind']}, {shape}): " + ", ".join(paths.values()))
    return 0


def cli_main():
    quiet_warnings()
    sys.exit(report_user_errors(main, "fairseq-deep-layer-weights"))


if __name__ == "__main__":
    cli_main()
