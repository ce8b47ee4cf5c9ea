"""Does transparent attention make a deep post-norm encoder trainable?  (Bapna et al. 2018, at small scale)

    python -m benchmarks.ta_depth [--mode train|overhead|all] [--encoder-layers 16 --decoder-layers 2]
        [--embed-dim 32 --ffn-dim 64 --heads 4] [--max-update 3000 --max-tokens 2048]
        [--peak-lr 1.5e-3 --warmup 500] [--systems postnorm ta dlcl_prenorm [postnorm_6l nores]]
        [--multi30k /work/shared/data/multi30k]

``--mode train`` trains, on the same data, seed, batch size, update budget and learning-rate
schedule (Chen et al. 2018 Eq. 2, ``--lr-scheduler noam``; only ``--arch`` differs):

* ``postnorm``: a deep post-norm Transformer encoder (``transformer_ta_baseline``, Table 1 "Baseline");
* ``ta``: the same with transparent attention (``transformer_ta``, Table 1 "Transparent");
* ``dlcl_prenorm``: the same depth as pre-norm DLCL (``transformer_dlcl``, Wang et al. 2019);
* optional: ``postnorm_6l`` (the 6-layer post-norm reference of Fig. 1) and ``nores``
  (``transformer_ta_nores``, Table 1 "Baseline - residuals"),

every run with ``--task translation_deep --log-grad-norm-ratio`` (and ``--log-ta-weights last`` for
``ta``), and reports for each: whether it trained (all losses finite and the last logged train loss
below 80% of the first one), the final valid loss, BLEU on the test set (beam 4), r_t at the start
/ middle / end, and the plots of r_t (Fig. 1-3), of the train loss and of s_{i,M} (Fig. 4).

``--mode overhead`` measures the cost of the r_t diagnostic in-process: median time of a training
step (forward, backward; no optimizer step) of the translation task, of ``translation_deep`` with
the diagnostic off, and with it on (``--log-grad-norm-ratio``, and with ``--log-ta-weights all``),
interleaved (in a shuffled order) over ``--overhead-repeats`` rounds.

``--device cuda`` (the default where torch sees a GPU) trains and decodes without ``--cpu`` (one
GPU: ``--distributed-world-size 1``), with ``--precision``'s fairseq flag (``fp16``, ``amp``
(CUDA only), ``bf16``; default fp32), and runs the overhead measurement on the GPU, with
``torch.cuda.synchronize()`` before every clock reading (float32 there, whatever ``--precision``).

The paper's learning rate (r0 = 3.0, 40k warm-up, d_model = 512: peak 6.6e-4) does not fit a run of
a few thousand updates of a 32-wide model; the schedule keeps its form and its peak is
``--peak-lr`` (r0 = peak * sqrt(d_model * warmup)).
"""

if __name__ == "__main__" and not __package__:  # run as a file, the package's imports would fail
    raise SystemExit(
        "benchmarks/ta_depth.py is a module of the benchmarks package: run it from the "
        "repository root as python -m benchmarks.ta_depth"
    )

import argparse
import json
import math
import os
import platform
import statistics
import time
from typing import Dict, List

from fairseq_deep import runs
from fairseq_deep.runs import Part, recipes

from . import harness
from .dlcl_speed import prepare_multi30k, prepare_synthetic, run
from .harness import add_device_argument, describe, device_from_args, parse_flags

SYSTEMS = {
    "postnorm": ("post-norm Transformer (baseline)", "transformer_ta_baseline", []),
    "ta": ("post-norm + transparent attention", "transformer_ta", ["--log-ta-weights", "last"]),
    "dlcl_prenorm": ("pre-norm DLCL", "transformer_dlcl", []),
    "postnorm_6l": ("post-norm Transformer, 6 layers", "transformer_ta_baseline", []),
    "nores": ("post-norm, no encoder residuals", "transformer_ta_nores", []),
}


log = harness.logger("ta_depth")


def model_flags(a, system: str) -> List[str]:
    layers = 6 if system == "postnorm_6l" else a.encoder_layers
    return [
        *recipes.layers(layers, a.decoder_layers),
        *recipes.transformer_size(a.embed_dim, a.ffn_dim, a.heads),
        *recipes.dropout(a.dropout, a.dropout, a.dropout),
        "--share-all-embeddings",
    ]


def train_run(a, data: str, system: str, save_dir: str) -> runs.Run:
    """fairseq-train of a system: Adam (0.9, 0.98, eps 1e-9) with Chen et al.'s Eq. 2 (noam),
    ``--peak-lr`` its peak (r0 = peak * sqrt(d_model * warmup))."""
    _, arch, extra = SYSTEMS[system]
    r0 = a.peak_lr * math.sqrt(a.embed_dim * a.warmup)
    return runs.Run.of(
        "train",
        data,
        Part("model", ["--arch", arch, *model_flags(a, system)]),
        ["--task", "translation_deep", "--log-grad-norm-ratio"],
        recipes.adam(eps="1e-9"),
        recipes.noam(r0, a.embed_dim, a.warmup),
        recipes.label_smoothed(0.1),
        recipes.budget(max_tokens=a.max_tokens, max_update=a.max_update),
        Part("logging", ["--log-interval", str(a.log_interval), "--log-format", "json"]),
        recipes.seed(a.seed),
        recipes.saving(
            save_dir=save_dir,
            no_epoch_checkpoints=True,
            no_last_checkpoints=True,
            validate_interval_updates=max(a.max_update // 4, 1),
            save_interval_updates=a.max_update,
            keep_best_checkpoints=0,
        ),
        recipes.device(a.device, a.precision),
        ["--num-workers", "0"],
        Part("system", extra),
    )


def generate(a, data: str, checkpoint: str, log_path: str) -> Dict[str, float]:
    decoded = run(
        runs.Run.of(
            "generate",
            data,
            ["--task", "translation_deep"],
            recipes.decoding(path=checkpoint, beam=4, max_tokens=4000),
            recipes.device(a.device, a.precision, "generate"),
            ["--gen-subset", "test"],
            [*recipes.post_process("sentencepiece"), "--scoring", "sacrebleu"]
            if a.multi30k
            else [],
        ),
        log_path,
    )
    bleu = decoded.generated.bleu4
    return {"bleu": float(bleu) if bleu else float("nan")}


def summarize(series) -> Dict[str, float]:
    from fairseq_deep.diagnostics.plot_training import ta_weight_series

    loss = [v for _, v in series.get("loss", [])]
    ratio = [v for _, v in series.get("gnorm_ratio", [])]
    finite = bool(loss) and all(math.isfinite(v) for v in loss)
    out = {
        "first_train_loss": loss[0] if loss else float("nan"),
        "last_train_loss": loss[-1] if loss else float("nan"),
        "trained": bool(finite and loss[-1] < 0.8 * loss[0]),
        "loss_finite": finite,
    }
    if ratio:
        out.update(
            r_t_start=ratio[0],
            r_t_middle=ratio[len(ratio) // 2],
            r_t_end=ratio[-1],
            r_t_min=min(ratio),
            r_t_max=max(ratio),
        )
    j, by_layer = ta_weight_series(series)
    if by_layer:
        final = {i: values[-1][1] for i, values in by_layer.items()}
        out["final_s_column"] = j
        out["final_s"] = [round(final[i], 4) for i in sorted(final)]
    return out


def benchmark_training(a, data: str) -> Dict[str, Dict]:
    from fairseq_deep.diagnostics.plot_training import plot_runs

    results, by_system = {}, {}
    for system in a.systems:
        label, arch, extra = SYSTEMS[system]
        run_dir = os.path.join(a.work_dir, "runs", system)
        os.makedirs(run_dir, exist_ok=True)
        log(f"training {system}: --arch {arch} ({a.max_update} updates)")
        t0 = time.time()
        # a run that dies (e.g. a nan loss) is a result, not a crash
        trained = runs.execute(
            train_run(a, data, system, run_dir), os.path.join(run_dir, "train.log")
        )
        failed = None if trained.ok else trained.error()
        records = trained.records
        series = runs.series(records)
        by_system[system] = series
        res = {
            "label": label,
            "arch": arch,
            "train_seconds": round(time.time() - t0, 1),
            **summarize(series),
        }
        valid = [r for r in records if r["kind"] == "valid"]
        res["valid_loss"] = float(valid[-1]["loss"]) if valid else float("nan")
        ckpt = os.path.join(run_dir, "checkpoint_best.pt")
        if failed:
            res.update(trained=False, error=failed, bleu=float("nan"))
        elif os.path.exists(ckpt):
            res.update(generate(a, data, ckpt, os.path.join(run_dir, "generate.log")))
        results[system] = res
        log(f"{system}: {json.dumps(res)}")
    plots = plot_runs(
        {SYSTEMS[s][0] + f" ({s})": by_system[s] for s in by_system},
        os.path.join(a.work_dir, "plots"),
        log_y=True,
    )
    return {"systems": results, "plots": plots}


def table(results: Dict[str, Dict]) -> str:
    rows = []
    for r in results.values():
        rt = (
            " / ".join(f"{r[k]:.3g}" for k in ("r_t_start", "r_t_middle", "r_t_end"))
            if "r_t_end" in r
            else "-"
        )
        rows.append(
            [
                r["label"],
                f"`{r['arch']}`",
                "yes" if r["trained"] else "NO",
                f"{r['first_train_loss']:.3f} -> {r['last_train_loss']:.3f}",
                f"{r['valid_loss']:.3f}",
                f"{r.get('bleu', float('nan')):.2f}",
                rt,
            ]
        )
    return harness.markdown_table(
        [
            "system",
            "arch",
            "trained",
            "train loss first -> last",
            "valid loss",
            "BLEU",
            "r_t start / mid / end",
        ],
        rows,
    )


# ---------------------------------------------------------------------------------------------
# Overhead of the diagnostic, in-process
# ---------------------------------------------------------------------------------------------


def overhead(a) -> Dict[str, float]:
    import torch
    from fairseq import options, tasks
    from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion

    import fairseq_deep  # noqa: F401
    from fairseq_deep.tasks.translation_deep import TranslationDeepTask

    torch.set_num_threads(a.threads)
    dim = a.embed_dim
    argv = [
        "x",
        "--task",
        "translation",
        "--arch",
        "transformer_ta",
        *parse_flags(a.device),
        *model_flags(a, "ta"),
        "--dropout",
        "0.1",
    ]
    args = options.parse_args_and_arch(options.get_training_parser(), argv)
    dictionary = harness.dictionary(1000)
    plain = tasks.translation.TranslationTask(args, dictionary, dictionary)
    torch.manual_seed(0)
    model = plain.build_model(args).to(a.device)
    variants = {}
    for name, ratio, ta in (
        ("translation", None, None),
        ("translation_deep, off", False, "none"),
        ("translation_deep, --log-grad-norm-ratio", True, "none"),
        ("translation_deep, r_t + --log-ta-weights all", True, "all"),
    ):
        if ratio is None:
            variants[name] = plain
            continue
        targs = argparse.Namespace(**vars(args))
        targs.log_grad_norm_ratio, targs.log_ta_weights = ratio, ta
        variants[name] = TranslationDeepTask(targs, dictionary, dictionary)
    criterion = LabelSmoothedCrossEntropyCriterion(
        plain, sentence_avg=False, label_smoothing=0.1
    ).to(a.device)

    g = torch.Generator().manual_seed(0)
    bsz, length = a.overhead_batch, 20
    src = torch.randint(4, len(dictionary), (bsz, length), generator=g)
    tgt = torch.randint(4, len(dictionary), (bsz, length), generator=g)
    sample = {
        "id": torch.arange(bsz),
        "nsentences": bsz,
        "ntokens": tgt.numel(),
        "target": tgt,
        "net_input": {
            "src_tokens": src,
            "src_lengths": torch.full((bsz,), length),
            "prev_output_tokens": tgt.roll(1, dims=1),
        },
    }
    if a.device != "cpu":
        from fairseq import utils

        sample = utils.move_to_cuda(sample)

    class Opt:
        def backward(self, loss):
            loss.backward()

    for _ in range(2):  # warm-up
        for task in variants.values():
            task.train_step(sample, model, criterion, Opt(), 0)
    import random

    def seconds(task):
        def measure(r):
            model.zero_grad(set_to_none=True)
            return harness.timed(
                lambda: task.train_step(sample, model, criterion, Opt(), 0), a.device
            )[1]

        return measure

    # in a shuffled order: no variant always runs first (or right after another)
    times = harness.alternated(
        {name: seconds(task) for name, task in variants.items()},
        a.overhead_repeats,
        shuffle=random.Random(0),
    )
    base = statistics.median(times["translation"])
    res = {
        "encoder_layers": a.encoder_layers,
        "embed_dim": dim,
        "batch": f"{bsz} x {length} tokens",
        "threads": a.threads,
        "repeats": a.overhead_repeats,
    }
    if a.device != "cpu":
        res["device"] = describe(a.device)
    for name, ts in times.items():
        med = statistics.median(ts)
        res[name] = {"median_ms": round(1000 * med, 2), "vs_translation": round(med / base - 1, 4)}
    return res


def overhead_table(res: Dict) -> str:
    return harness.markdown_table(
        ["task", "median ms / train step", "vs translation"],
        [
            [name, f"{v['median_ms']:.1f}", f"{100 * v['vs_translation']:+.1f}%"]
            for name, v in res.items()
            if isinstance(v, dict)
        ],
    )


def get_parser():
    p = harness.parser(__doc__)
    p.add_argument("--mode", choices=["train", "overhead", "all"], default="all")
    harness.add_work_dir(p, os.path.join(harness.ROOT, "bench_runs", "ta_depth"))
    harness.add_json(p, help="results file (default WORK_DIR/results.json)")
    p.add_argument(
        "--systems", nargs="+", choices=list(SYSTEMS), default=["postnorm", "ta", "dlcl_prenorm"]
    )
    p.add_argument("--encoder-layers", type=int, default=16)
    p.add_argument("--decoder-layers", type=int, default=2)
    p.add_argument("--embed-dim", type=int, default=32)
    p.add_argument("--ffn-dim", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--max-update", type=int, default=3000)
    p.add_argument("--max-tokens", type=int, default=2048)
    p.add_argument("--peak-lr", type=float, default=1.5e-3)
    p.add_argument("--warmup", type=int, default=500)
    p.add_argument("--log-interval", type=int, default=25)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--synthetic-train", type=int, default=20000)
    p.add_argument("--test-size", type=int, default=500)
    p.add_argument(
        "--multi30k", default=None, help="raw Multi30K folder instead of the synthetic data"
    )
    p.add_argument("--src-lang", default="en")
    p.add_argument("--tgt-lang", default="de")
    p.add_argument("--spm-vocab", type=int, default=8000)
    harness.add_threads(p, 1, "torch threads of the overhead measurement")
    add_device_argument(p, precision=True)
    p.add_argument("--overhead-repeats", type=int, default=30)
    p.add_argument("--overhead-batch", type=int, default=32)
    return p


def main(argv=None):
    a = get_parser().parse_args(argv)
    device_from_args(a)
    os.makedirs(a.work_dir, exist_ok=True)
    results = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cpus",
        "args": vars(a),
    }
    if a.device != "cpu":
        results["device"] = describe(a.device)
    if a.mode in ("train", "all"):
        data, _, _ = (prepare_multi30k if a.multi30k else prepare_synthetic)(a.work_dir, a)
        results["training"] = benchmark_training(a, data)
        print(table(results["training"]["systems"]))
        print("plots: " + ", ".join(results["training"]["plots"]))
    if a.mode in ("overhead", "all"):
        results["overhead"] = overhead(a)
        print(overhead_table(results["overhead"]))
    path = harness.write_json(
        a.json or os.path.join(a.work_dir, "results.json"), results, default=str
    )
    print(f"results: {path}")


if __name__ == "__main__":
    main()
