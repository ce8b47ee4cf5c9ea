"""Plots of a training run's gradient flow: r_t (Bapna et al. 2018, Fig. 1-3) and s_{i,j} (Fig. 4).

    fairseq-deep-plot-training RUN [RUN ...] --out-dir DIR [--labels A B ...] [--column J]

Each RUN is a fairseq-train log (its console output or its ``--log-file``, ``--log-format json``
or ``simple``) or a ``--tensorboard-logdir`` directory.  The run must have been trained with
``--task translation_deep --log-grad-norm-ratio`` (and ``--log-ta-weights`` for Fig. 4).  Writes

* ``grad_norm_ratio.png``: r_t against the update, one curve per run (as Fig. 1 compares a 6- and a
  20-layer model);
* ``ta_weights[_LABEL].png``: s_{i,J} over training, one curve per encoder layer i (Fig. 4; J is
  the decoder attention module, the last one logged by default);
* ``loss.png``: the train loss (solid) and, where the log has validation records, the valid loss
  (dashed, markers), one colour per run;
* ``training_series.json``: every series read, ``{label: {metric: [[update, value], ...]}}``.

The final s matrix of a checkpoint is drawn by the layer-weight exporter
(:mod:`fairseq_deep.diagnostics.layer_weights`).
"""

import glob
import json
import logging
import os
import re
import sys
from collections import defaultdict
from typing import Dict, List, Optional, Sequence, Tuple

from ..errors import ArgumentParser, import_optional, report_user_errors
from ..quiet import quiet_warnings

Series = Dict[str, List[Tuple[float, float]]]

_TRAIN_INNER = re.compile(r"\|\s*train_inner\s*\|\s*(.*)$")
_VALID = re.compile(r"\|\s*valid\s*\|\s*(.*)$")
# "epoch 001 | valid on 'valid' subset | loss 8.308 | nll_loss 8.302 | ... | num_updates 20"
_SIMPLE_VALID_FIELD = re.compile(r"\|\s*([A-Za-z_]\w*) ([-+0-9.eEinfa]+)\s*(?=\||$)")
_SIMPLE_INNER = re.compile(r"^\s*epoch \d+:\s+\d+\s*/\s*\d+\s")
_KEY_VALUE = re.compile(r"([A-Za-z_][\w.]*)=([-+0-9.eEinfa]+)")
_TA_KEY = re.compile(r"^ta\d*_s(\d+)_(\d+)$")


def _number(value) -> Optional[float]:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _valid_record(body: str) -> Optional[Dict[str, float]]:
    """A ``valid`` record (json or simple) as {"valid_loss": ..., "num_updates": ...}."""
    if body.startswith("{"):
        try:
            record = json.loads(body)
        except json.JSONDecodeError:
            return None
        record = {k: _number(v) for k, v in record.items()}
    else:
        record = {f"valid_{k}": _number(v) for k, v in _SIMPLE_VALID_FIELD.findall("| " + body)}
    record["num_updates"] = record.pop("valid_num_updates", None)
    return record if record.get("num_updates") is not None else None


def parse_log_lines(lines: Sequence[str]) -> Series:
    """The ``train_inner`` records of a fairseq-train log, keyed by metric, and the ``valid``
    records' metrics as ``valid_*`` (valid_loss, ...); x = num_updates."""
    series: Series = defaultdict(list)
    for line in lines:
        v = _VALID.search(line)
        if v:
            record = _valid_record(v.group(1).strip())
            for key, value in (record or {}).items():
                if key.startswith("valid_") and key != "valid_epoch" and value is not None:
                    series[key].append((record["num_updates"], value))
            continue
        m = _TRAIN_INNER.search(line)
        if m:  # a console line: "... | INFO | train_inner | <record>"
            body = m.group(1).strip()
        elif _SIMPLE_INNER.match(line) or line.lstrip().startswith("{"):
            body = line.strip()  # --log-file lines carry the record only
        else:
            continue
        if body.startswith("{"):
            try:
                record = json.loads(body)
            except json.JSONDecodeError:
                continue
            if (
                not m and "loss" not in record
            ):  # the end-of-epoch / valid records: train_loss, valid_loss
                continue
        elif _SIMPLE_INNER.match(body):  # "epoch 001:     10 / 63 loss=8.455, nll_loss=8.173, ..."
            record = dict(_KEY_VALUE.findall(body))
        else:
            continue
        step = _number(record.get("num_updates"))
        if step is None:
            continue
        for key, value in record.items():
            v = _number(value)
            if v is not None and key not in ("num_updates", "epoch", "update"):
                series[key].append((step, v))
    return dict(series)


def read_tensorboard(logdir: str) -> Series:
    """The ``train_inner`` scalars of a --tensorboard-logdir directory (needs tensorboard)."""
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError as e:
        raise ImportError(
            "reading tensorboard events needs tensorboard: pip install tensorboard "
            "(or plot from the training log instead)"
        ) from e
    sub = os.path.join(logdir, "train_inner")
    path = sub if os.path.isdir(sub) else logdir
    if not glob.glob(os.path.join(path, "events.out.tfevents.*")):
        raise FileNotFoundError(
            f"no tensorboard events under {path} (expected {logdir}/train_inner)"
        )
    acc = EventAccumulator(path, size_guidance={"scalars": 0})
    acc.Reload()
    series = {
        tag: [(float(e.step), float(e.value)) for e in acc.Scalars(tag)]
        for tag in acc.Tags()["scalars"]
    }
    valid = os.path.join(logdir, "valid")
    if path == sub and glob.glob(os.path.join(valid, "events.out.tfevents.*")):
        acc = EventAccumulator(valid, size_guidance={"scalars": 0})
        acc.Reload()
        series.update(
            {
                f"valid_{tag}": [(float(e.step), float(e.value)) for e in acc.Scalars(tag)]
                for tag in acc.Tags()["scalars"]
            }
        )
    return series


def read_run(path: str) -> Series:
    if os.path.isdir(path):
        return read_tensorboard(path)
    with open(path, encoding="utf-8", errors="replace") as f:
        return parse_log_lines(f.readlines())


def ta_weight_series(
    series: Series, column: Optional[int] = None
) -> Tuple[Optional[int], Dict[int, List[Tuple[float, float]]]]:
    """{i: [(update, s_{i,J})]} for decoder module J (default: the largest logged)."""
    by_col: Dict[int, Dict[int, List[Tuple[float, float]]]] = defaultdict(dict)
    for key, values in series.items():
        m = _TA_KEY.match(key)
        if m:
            by_col[int(m.group(2))][int(m.group(1))] = values
    if not by_col:
        return None, {}
    j = column if column is not None else max(by_col)
    if j not in by_col:
        raise ValueError(f"--column {j}: the run logged s_(i,j) for j in {sorted(by_col)}")
    return j, dict(sorted(by_col[j].items()))


def _pyplot():
    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # its font search logs at DEBUG
    matplotlib = import_optional(
        "matplotlib", "plotting", "matplotlib (or the extra 'fairseq_deep[plot]')"
    )
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _safe(label: str) -> str:
    return re.sub(r"[^\w.-]+", "_", label)


def series_styles(n: int) -> List[Dict[str, object]]:
    """n distinct (colour, line style) pairs: the 10 colours of matplotlib's qualitative tab10
    palette, then the same with dashed, dotted and dash-dotted lines."""
    colours = [f"C{i}" for i in range(10)]
    styles = ["-", "--", ":", "-."]
    return [
        {"color": colours[i % 10], "linestyle": styles[(i // 10) % len(styles)]} for i in range(n)
    ]


def plot_runs(
    runs: Dict[str, Series], out_dir: str, column: Optional[int] = None, log_y: bool = False
) -> List[str]:
    plt = _pyplot()
    os.makedirs(out_dir, exist_ok=True)
    written = []

    def curves(metric, ylabel, title, name, log_scale=False, dashed_metric=None):
        have = {label: s[metric] for label, s in runs.items() if s.get(metric)}
        if not have:
            return
        fig, ax = plt.subplots(figsize=(6, 4))
        for (label, values), style in zip(have.items(), series_styles(len(have))):
            ax.plot(
                [x for x, _ in values], [y for _, y in values], label=label, color=style["color"]
            )
            extra = runs[label].get(dashed_metric) if dashed_metric else None
            if extra:
                ax.plot(
                    [x for x, _ in extra],
                    [y for _, y in extra],
                    label=f"{label} (valid)",
                    color=style["color"],
                    linestyle="--",
                    marker="o",
                    markersize=3,
                )
        ax.set_xlabel("update t")
        ax.set_ylabel(ylabel)
        if log_scale:
            ax.set_yscale("log")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = os.path.join(out_dir, name)
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)

    curves(
        "gnorm_ratio",
        "r_t = |dL/dh_1| / |dL/dh_N|",
        "grad-norm ratio (Bapna et al. 2018, Fig. 1-3)",
        "grad_norm_ratio.png",
        log_y,
    )
    curves(
        "loss",
        "loss",
        "train loss (solid) and valid loss (dashed)",
        "loss.png",
        dashed_metric="valid_loss",
    )

    with_ta = {label: ta_weight_series(s, column) for label, s in runs.items()}
    with_ta = {label: v for label, v in with_ta.items() if v[1]}
    for label, (j, by_layer) in with_ta.items():
        fig, ax = plt.subplots(figsize=(6, 4))
        for (i, values), style in zip(by_layer.items(), series_styles(len(by_layer))):
            ax.plot(
                [x for x, _ in values],
                [y for _, y in values],
                **style,
                label="emb." if i == 0 else f"layer {i}",
            )
        ax.set_xlabel("update t")
        ax.set_ylabel(f"s_(i,{j})")
        ax.set_title(
            f"transparent attention weights of decoder layer {j} ({label}; Fig. 4)", fontsize=9
        )
        ax.legend(fontsize=6, ncol=2 if len(by_layer) > 8 else 1)
        fig.tight_layout()
        name = "ta_weights.png" if len(with_ta) == 1 else f"ta_weights_{_safe(label)}.png"
        path = os.path.join(out_dir, name)
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)

    path = os.path.join(out_dir, "training_series.json")
    with open(path, "w") as f:
        json.dump(runs, f)
    written.append(path)
    return written


def get_parser():
    p = ArgumentParser(
        prog="fairseq-deep-plot-training",
        description="Plot the grad-norm ratio r_t and the transparent attention weights s_(i,j) "
        "of fairseq-train runs (Bapna et al. 2018, Fig. 1-4).",
    )
    p.add_argument(
        "runs",
        nargs="+",
        help="fairseq-train logs (json or simple format) or --tensorboard-logdir directories",
    )
    p.add_argument("--out-dir", required=True, help="where the PNG and JSON files go")
    p.add_argument("--labels", nargs="+", help="one legend label per run (default: file names)")
    p.add_argument(
        "--column",
        type=int,
        default=None,
        help="decoder attention module j of s_(i,j) to plot (default: the last logged)",
    )
    p.add_argument("--log-y", action="store_true", help="logarithmic r_t axis")
    return p


def main(argv=None) -> int:
    args = get_parser().parse_args(argv)
    labels = args.labels or [os.path.basename(os.path.normpath(r)) for r in args.runs]
    if len(labels) != len(args.runs):
        print(f"--labels: {len(labels)} labels for {len(args.runs)} runs", file=sys.stderr)
        return 2
    runs = {}
    for label, path in zip(labels, args.runs):
        series = read_run(path)
        if "gnorm_ratio" not in series:
            print(
                f"warning: {path} has no gnorm_ratio: train with --task translation_deep "
                "--log-grad-norm-ratio",
                file=sys.stderr,
            )
        runs[label] = series
    for path in plot_runs(runs, args.out_dir, args.column, args.log_y):
        print(path)
    return 0


def cli_main():
    quiet_warnings()
    sys.exit(report_user_errors(main, "fairseq-deep-plot-training"))


if __name__ == "__main__":
    cli_main()
