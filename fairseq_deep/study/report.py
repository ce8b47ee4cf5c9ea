"""A study's results: ``results.json``'s object (:func:`results`: every run's scores, means and
standard deviations over seeds, sacreBLEU's paired bootstrap against each group's baseline), the
markdown table of ``results.md`` and the PNG plots under ``plots/``."""

import hashlib
import json
import os
import statistics
from dataclasses import asdict
from typing import Dict, List, Optional, Tuple

from .. import runs
from ..diagnostics.plot_training import _pyplot, series_styles
from .commands import interval, precision, recipe_text
from .groups import GROUPS
from .runner import Study, learning_curve


def results(study: Study) -> dict:
    a = study.args
    out = {
        "settings": {
            "data": os.path.abspath(a.data),
            "spm": a.spm,
            "remove_bpe": a.remove_bpe,
            "ref": a.ref,
            "width": a.width,
            "max_update": a.max_update,
            "minutes": a.minutes,
            "seeds": a.seeds,
            "lr": a.lr,
            "warmup": a.warmup,
            "dropout": a.dropout,
            "max_tokens": a.max_tokens,
            "beam": a.beam,
            "checkpoint": a.checkpoint,
            "train_args": a.train_args_list,
            "gen_args": a.gen_args_list,
            "test_size": study.n_test,
            "cpu": a.cpu,
            "recipe": a.recipe,
            "precision": getattr(a, "precision", "fp32"),
            "valid_interval": interval(a),
            "patience": getattr(a, "patience", 0),
        },
        "groups": {},
    }
    for gname, (baseline, systems) in study.groups.items():
        by_system = {s.name: [r for r in study.runs if r.system is s] for s in systems}
        rows = {}
        for s in systems:
            seeds = {
                str(r.seed): (
                    r.result if r.status == "done" else {"error": r.error, "status": r.status}
                )
                for r in by_system[s.name]
            }
            ok = [r.result for r in by_system[s.name] if r.status == "done" and r.result]
            row = {
                **{k: v for k, v in asdict(s).items() if k != "group"},
                "seeds": seeds,
                "seeds_done": len(ok),
                "recipe": recipe_text(a, s.spec, s.flags + a.train_args_list),
                "precision": precision(a, s),
            }
            for metric in ("bleu", "chrf"):
                values = [r[metric] for r in ok]
                row[f"{metric}_mean"] = statistics.fmean(values) if values else None
                row[f"{metric}_std"] = (
                    statistics.stdev(values) if len(values) > 1 else (0.0 if values else None)
                )
            rows[s.name] = row
        # paired bootstrap, one test per seed that the baseline and the system both finished
        for seed in range(1, a.seeds + 1):
            base_run = next((r for r in by_system[baseline] if r.seed == seed), None)
            base_hyps = study.read_hyps(base_run) if base_run else None
            if base_hyps is None:
                continue
            refs = study.read_run_refs(base_run)
            for s in systems:
                run = next(r for r in by_system[s.name] if r.seed == seed)
                p = None if s.name == baseline else paired(study, run, base_hyps, refs)
                if p is not None:
                    rows[s.name].setdefault("paired_bs", {})[str(seed)] = p
        out["groups"][gname] = {"baseline": baseline, "systems": rows}
    return out


def paired(study: Study, run, base_hyps: List[str], refs: List[str]) -> Optional[Dict]:
    """sacreBLEU's paired bootstrap of a finished run against its baseline's hypotheses
    ({"bleu_p", "chrf_p"}; None while the run has none), kept in the run's ``paired_bs.json`` for
    these baseline hypotheses and sample count, so that results written as each run ends test
    each system once (sacreBLEU draws the same resamples for every system: its seed is fixed)."""
    hyps = study.read_hyps(run)
    if hyps is None:
        return None
    key = {
        "baseline": hashlib.sha1("\n".join(base_hyps).encode("utf-8")).hexdigest(),
        "samples": study.args.bootstrap_samples,
    }
    path = run.path("paired_bs.json")
    if os.path.exists(path):
        with open(path) as f:
            kept = json.load(f)
        if {k: kept.get(k) for k in key} == key:
            return kept["p"]
    p = runs.paired_bootstrap(base_hyps, {"system": hyps}, refs, key["samples"])["system"]
    with open(path, "w") as f:
        json.dump({**key, "p": p}, f, indent=1)
    return p


def _fmt(mean, std, seeds):
    if mean is None:
        return "-"
    return f"{mean:.2f}" + (f" ± {std:.2f}" if seeds > 1 else "")


def markdown(results: dict) -> str:
    s = results["settings"]
    budget = " and ".join(
        x
        for x in (
            f"{s['max_update']} updates" if s["max_update"] else "",
            f"{s['minutes']} minutes" if s["minutes"] else "",
        )
        if x
    )
    lines = [
        "# fairseq-deep-study results",
        "",
        f"Data `{s['data']}` ({s['test_size']} test sentences), width {s['width'] or 'of the presets'}, "
        f"budget {budget or 'none'} per system, {s['seeds']} seed(s), lr {s['lr']}, warm-up {s['warmup']}, "
        f"recipe {s.get('recipe', 'shared')} (each system's optimiser and schedule: the recipe column), "
        f"max-tokens {s['max_tokens']}, beam {s['beam']}, checkpoint_{s['checkpoint']}; "
        "sacreBLEU and chrF on detokenized text (mean ± std over seeds); p: sacreBLEU's paired "
        "bootstrap resampling against the group's baseline (one value per seed); epochs (stop): "
        "epochs trained (the last one partial where the budget stopped it) and what stopped "
        "training (plateau: --patience validations without a better loss; time, max_update: the "
        "budget); updates/s: "
        "updates per second of fairseq's training wall clock (validation included).",
        "",
    ]
    for gname, group in results["groups"].items():
        title = GROUPS[gname][0] if gname in GROUPS else "systems given with --system"
        lines += [
            f"## {gname}: {title}",
            "",
            f"Baseline: `{group['baseline']}`.",
            "",
            "| system | --arch | flags | enc. layers | BLEU | chrF | p (BLEU) | updates | epochs (stop) | "
            "updates/s | best valid loss | recipe | precision | note |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for name, row in group["systems"].items():
            done = [r for r in row["seeds"].values() if r and "bleu" in r]
            p = row.get("paired_bs", {})
            p_text = (
                "baseline"
                if name == group["baseline"]
                else (" / ".join(f"{v['bleu_p']:.4f}" for v in p.values()) if p else "-")
            )
            updates = "/".join(str(r.get("updates")) for r in done) or "-"
            epochs = (
                "/".join(
                    f"{r['epochs']}" + (f" ({r['stopped']})" if r.get("stopped") else "")
                    for r in done
                    if r.get("epochs") is not None
                )
                or "-"
            )
            valid = (
                "/".join(
                    f"{r['best_valid_loss']:.3f}"
                    for r in done
                    if r.get("best_valid_loss") is not None
                )
                or "-"
            )
            rate = (
                "/".join(
                    f"{r['updates_per_second']:.3g}" for r in done if r.get("updates_per_second")
                )
                or "-"
            )
            notes = "; ".join(
                f"seed {k}: {r.get('status')} {r.get('error') or ''}".strip()
                for k, r in row["seeds"].items()
                if not r or "bleu" not in r
            )
            flags = " ".join(row["flags"]).replace("|", "\\|")
            depth = row["depth"] if row["depth"] is not None else "-"
            lines.append(
                f"| {name} | `{row['arch']}` | {flags} | {depth} | "
                f"{_fmt(row['bleu_mean'], row['bleu_std'], row['seeds_done'])} | "
                f"{_fmt(row['chrf_mean'], row['chrf_std'], row['seeds_done'])} | {p_text} | {updates} | "
                f"{epochs} | {rate} | {valid} | {row.get('recipe') or '-'} | "
                f"{row.get('precision') or '-'} | {notes.replace('|', '/')} |"
            )
        lines.append("")
    return "\n".join(lines)


def _save(plt, fig, path: str, written: List[str]):
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    written.append(path)


def plot(study: Study, results: dict, out_dir: str) -> List[str]:
    """PNG plots per group: BLEU against encoder depth per technique (where the group varies
    depth), valid loss over updates and over seconds of training, and r_t over updates (runs with
    --log-grad-norm-ratio)."""
    plt = _pyplot()
    os.makedirs(out_dir, exist_ok=True)
    written = []
    for gname, group in results["groups"].items():
        rows = group["systems"]
        by_technique: Dict[str, List[Tuple[int, float, float]]] = {}
        for row in rows.values():
            if row["depth"] is not None and row["bleu_mean"] is not None:
                by_technique.setdefault(row["technique"] or row["name"], []).append(
                    (row["depth"], row["bleu_mean"], row["bleu_std"] or 0.0)
                )
        if len({d for v in by_technique.values() for d, _, _ in v}) > 1:
            fig, ax = plt.subplots(figsize=(6, 4))
            for (technique, points), style in zip(
                by_technique.items(), series_styles(len(by_technique))
            ):
                points.sort()
                ax.errorbar(
                    [p[0] for p in points],
                    [p[1] for p in points],
                    yerr=[p[2] for p in points],
                    label=technique,
                    marker="o",
                    capsize=3,
                    **style,
                )
            ax.set_xticks(sorted({d for v in by_technique.values() for d, _, _ in v}))
            ax.set_xlabel("encoder layers")
            ax.set_ylabel("BLEU (test)")
            ax.set_title(f"{gname}: BLEU against encoder depth", fontsize=9)
            ax.legend(fontsize=8)
            _save(plt, fig, os.path.join(out_dir, f"bleu_depth_{gname}.png"), written)
        series = {}
        for run in study.runs:
            if run.system.group == gname and run.seed == min(
                r.seed for r in study.runs if r.system is run.system
            ):
                log = os.path.join(run.run_dir, "train.log")
                if os.path.exists(log):
                    series[run.system.name] = runs.series(runs.parse_log(log))
        for metric, ylabel, name in (
            ("valid_loss", "valid loss", "valid_loss"),
            ("gnorm_ratio", "r_t = |dL/dh_1| / |dL/dh_N|", "grad_norm_ratio"),
        ):
            have = {k: v[metric] for k, v in series.items() if v.get(metric)}
            if not have:
                continue
            fig, ax = plt.subplots(figsize=(6, 4))
            for (label, values), style in zip(have.items(), series_styles(len(have))):
                ax.plot(
                    [x for x, _ in values],
                    [y for _, y in values],
                    label=label,
                    marker="o" if metric == "valid_loss" else None,
                    markersize=3,
                    **style,
                )
            ax.set_xlabel("update")
            ax.set_ylabel(ylabel)
            if metric == "gnorm_ratio":
                ax.set_yscale("log")
            ax.set_title(f"{gname}: {ylabel} (seed {min(r.seed for r in study.runs)})", fontsize=9)
            ax.legend(fontsize=7, ncol=2 if len(have) > 8 else 1)
            _save(plt, fig, os.path.join(out_dir, f"{name}_{gname}.png"), written)
        # the same learning curves against training time: cost and learning apart
        timed = {}
        for label, s in series.items():
            curve = learning_curve(s)[0]
            if curve and all(t is not None for _, t, _ in curve):
                timed[label] = curve
        if timed:
            fig, ax = plt.subplots(figsize=(6, 4))
            for (label, curve), style in zip(timed.items(), series_styles(len(timed))):
                ax.plot(
                    [t for _, t, _ in curve],
                    [v for _, _, v in curve],
                    label=label,
                    marker="o",
                    markersize=3,
                    **style,
                )
            ax.set_xlabel("seconds of training (fairseq's wall clock, validation included)")
            ax.set_ylabel("valid loss")
            ax.set_title(
                f"{gname}: valid loss against time (seed {min(r.seed for r in study.runs)})",
                fontsize=9,
            )
            ax.legend(fontsize=7, ncol=2 if len(timed) > 8 else 1)
            _save(plt, fig, os.path.join(out_dir, f"valid_loss_seconds_{gname}.png"), written)
    return written
