"""Parameters, memory and time of one update against depth, with and without activation checkpointing.

    python -m benchmarks.depth [--depths 6 100 1000] [--arch transformer_deepnorm [ARCH ...]]
        [--checkpoint both|off|on] [--decoder-layers 1] [--width 8 --ffn 16 --heads 2]
        [--batch 8 --length 16] [--updates 3] [--device cuda|cpu] [--threads N]
        [--cli [--cli-layers 1000 --cli-updates 3]] [--work-dir bench_runs/depth]

For every ``--arch`` (default: DeepNorm, Wang et al. 2022), every encoder depth N of ``--depths``
and with checkpointing off and on (fairseq's ``--checkpoint-activations``), a model of N encoder
and ``--decoder-layers`` decoder layers at a narrow width (default 8, FFN 16, 2 heads, dropout
0.1) is built in process through fairseq's own parser and ``--arch`` presets (as fairseq-train
builds it), then trained on one fixed random batch (``--batch`` sentences of ``--length``
tokens on both sides, cross-entropy, ``torch.optim.Adam``): one warm-up update (Admin profiles
there), then ``--updates`` timed updates.  It reports:

* parameters;
* seconds to build the model, and seconds per update (forward, backward, Adam step; median of
  the timed updates): wall-clock (``torch.cuda.synchronize()`` before every clock reading on
  CUDA) and the CPU time of this process (``time.process_time``; on a shared machine less
  disturbed by other work than the wall clock, as long as torch runs one thread: ``--threads 1``;
  on CUDA it is the host's share only);
* memory in all, per layer (the total over encoder + decoder layers) and per added layer (the
  growth from the next smaller depth of the same arch and checkpointing, per encoder layer: what
  one more layer costs, without the share of the embeddings, the output layer and the batch):

  - saved activations (any device): bytes of the distinct tensor storages that autograd keeps
    for backward at the end of the forward pass (``torch.autograd.graph.saved_tensors_hooks``,
    parameters excluded), as ``benchmarks/dlcl_speed.py`` measures them.  With checkpointing
    that is each layer's input (and what the history, embeddings and output layer keep); the
    one layer that backward recomputes at a time is not counted;
  - on CUDA, also the peak of ``torch.cuda.max_memory_allocated`` during one update, above
    what was allocated before it (parameters, Adam's state, the batch): activations, gradients
    and workspace.

``--cli`` also runs the real command lines once: ``fairseq-train`` of a ``--cli-layers``-layer
DeepNorm encoder (width 8, ``--checkpoint-activations``) for ``--cli-updates`` updates on a small
synthetic corpus, then ``fairseq-generate`` (beam 2) of its test set, and reports the wall
seconds of each and the sentences translated.

Prints a markdown table; every number goes to ``WORK_DIR/results.json``.
"""

if __name__ == "__main__" and not __package__:  # run as a file, the package's imports would fail
    raise SystemExit(
        "benchmarks/depth.py is a module of the benchmarks package: run it from the "
        "repository root as python -m benchmarks.depth"
    )

import os
import shutil
import statistics
import time
from typing import Dict, List

import torch

import fairseq_deep  # noqa: F401  (registers the architectures)
from fairseq_deep import runs
from fairseq_deep.runs import Part, recipes

from . import harness
from .dlcl_speed import machine, saved_bytes  # (autograd's saved bytes, as measured there)
from .harness import PeakMemory, add_device_argument, clock, describe, device_from_args

log = harness.logger("depth")


def model_flags(a, encoder_layers: int, checkpoint: bool) -> List[str]:
    return [
        *recipes.layers(encoder_layers, a.decoder_layers),
        *recipes.transformer_size(a.width, a.ffn, a.heads),
        *recipes.dropout("0.1"),
        "--share-all-embeddings",
        *(["--checkpoint-activations"] if checkpoint else []),
    ]


def measure(a, arch: str, depth: int, checkpoint: bool, dictionary) -> Dict[str, float]:
    t0 = clock(a.device)
    model = harness.build_model(
        ["--arch", arch, *model_flags(a, depth, checkpoint)], dictionary, a.device
    ).train()
    build_s = clock(a.device) - t0
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(0)
    lo = dictionary.nspecial
    src = torch.randint(lo, len(dictionary), (a.batch, a.length), generator=g)
    tgt = torch.randint(lo, len(dictionary), (a.batch, a.length), generator=g)
    src[:, -1] = tgt[:, -1] = dictionary.eos()
    prev = torch.roll(tgt, 1, dims=1)
    src, tgt, prev = src.to(a.device), tgt.to(a.device), prev.to(a.device)
    lengths = torch.full((a.batch,), a.length, device=a.device)

    def forward():
        logits = model(src, lengths, prev)[0]
        return torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), tgt.flatten())

    def update(count_saved=False):
        optimizer.zero_grad(set_to_none=True)
        if count_saved:
            loss, saved = saved_bytes(forward, model.parameters())
        else:
            loss, saved = forward(), None
        loss.backward()
        optimizer.step()
        return loss.item(), saved

    loss, saved = update(count_saved=True)  # warm-up (Admin profiles here); counts saved tensors
    times, cpu_times, losses = [], [], [loss]
    peak = None
    for _ in range(a.updates):
        optimizer.zero_grad(set_to_none=True)  # the gradients count in the peak, not in the base
        with PeakMemory(a.device) as mem:
            t0, c0 = clock(a.device), time.process_time()
            loss, _ = update()
            times.append(clock(a.device) - t0)
            cpu_times.append(time.process_time() - c0)
        losses.append(loss)
        if mem.mib is not None:
            peak = mem.mib if peak is None else max(peak, mem.mib)
    layers = depth + a.decoder_layers
    row = {
        "arch": arch,
        "encoder_layers": depth,
        "decoder_layers": a.decoder_layers,
        "checkpoint": checkpoint,
        "params": sum(p.numel() for p in model.parameters()),
        "build_s": build_s,
        "s_per_update": statistics.median(times),
        "update_s": times,
        "cpu_s_per_update": statistics.median(cpu_times),
        "update_cpu_s": cpu_times,
        "saved_mib": saved / 2**20,
        "saved_kib_per_layer": saved / 2**10 / layers,
        "losses": losses,
        "finite": all(map(lambda x: x == x and abs(x) != float("inf"), losses)),
    }
    if peak is not None:
        row["peak_mib"] = peak
        row["peak_kib_per_layer"] = peak * 2**10 / layers
    return row


def in_process(a) -> List[Dict[str, float]]:
    dictionary = harness.dictionary(a.vocab)
    modes = {"both": [False, True], "off": [False], "on": [True]}[a.checkpoint]
    rows = []
    for arch in a.arch:
        for depth in a.depths:
            for checkpoint in modes:
                log(
                    f"{arch}, {depth}+{a.decoder_layers} layers, checkpointing {'on' if checkpoint else 'off'}"
                )
                row = measure(a, arch, depth, checkpoint, dictionary)
                log(
                    "  " + ", ".join(f"{k}={v:.4g}" for k, v in row.items() if isinstance(v, float))
                )
                rows.append(row)
    add_slopes(rows)
    return rows


def add_slopes(rows):
    """Memory per added layer: the growth from the next smaller depth of the same arch and
    checkpointing, per layer (what a layer costs, without the embeddings' and output's share)."""
    for key in ("saved_mib", "peak_mib"):
        for r in rows:
            smaller = [
                o
                for o in rows
                if (o["arch"], o["checkpoint"]) == (r["arch"], r["checkpoint"])
                and o["encoder_layers"] < r["encoder_layers"]
                and key in o
                and key in r
            ]
            if smaller:
                o = max(smaller, key=lambda o: o["encoder_layers"])
                r[key.replace("_mib", "_kib_per_added_layer")] = (
                    (r[key] - o[key]) * 2**10 / (r["encoder_layers"] - o["encoder_layers"])
                )


def _kib(r, key) -> str:
    return f"{r[key]:.1f}" if key in r else "-"


def table(a, rows) -> str:
    gpu = any("peak_mib" in r for r in rows)
    head = [
        "--arch",
        "enc.+dec. layers",
        "checkpointing",
        "parameters",
        "build s",
        "s / update",
        "CPU s / update",
        "saved activations MiB",
        "saved KiB / layer",
        "saved KiB / added layer",
    ]
    if gpu:
        head += ["peak GPU MiB", "peak GPU KiB / layer", "peak GPU KiB / added layer"]
    lines = []
    for r in rows:
        cells = [
            f"`{r['arch']}`",
            f"{r['encoder_layers']}+{r['decoder_layers']}",
            "on" if r["checkpoint"] else "off",
            f"{r['params']:,}",
            f"{r['build_s']:.1f}",
            f"{r['s_per_update']:.3f}",
            f"{r['cpu_s_per_update']:.3f}",
            f"{r['saved_mib']:.2f}",
            f"{r['saved_kib_per_layer']:.1f}",
            _kib(r, "saved_kib_per_added_layer"),
        ]
        if gpu:
            cells += [
                f"{r['peak_mib']:.2f}" if "peak_mib" in r else "-",
                _kib(r, "peak_kib_per_layer"),
                _kib(r, "peak_kib_per_added_layer"),
            ]
        if not r["finite"]:
            cells[-1] += " (loss not finite)"
        lines.append(cells)
    return harness.markdown_table(head, lines, "lrl" + "r" * (len(head) - 3))


# ---------------------------------------------------------------------------------------------
# --cli: fairseq-train and fairseq-generate of a deep narrow DeepNorm encoder
# ---------------------------------------------------------------------------------------------


def _run(run: runs.Run, log_path: str, env) -> runs.Result:
    return runs.execute(run, log_path, env=env).check()


def cli(a, env) -> Dict[str, float]:
    from fairseq_deep.data.synthetic import write_corpus

    work = os.path.join(a.work_dir, "cli")
    shutil.rmtree(work, ignore_errors=True)
    prefixes = write_corpus(
        os.path.join(work, "raw"), train=a.cli_train, valid=20, test=a.cli_test, seed=1
    )
    data = os.path.join(work, "bin")
    _run(
        runs.preprocess("src", "tgt", data, prefixes["train"], prefixes["valid"], prefixes["test"]),
        os.path.join(work, "preprocess.log"),
        env,
    )
    save = os.path.join(work, "checkpoints")
    log(
        f"fairseq-train: transformer_deepnorm, {a.cli_layers}+1 layers, width 8, {a.cli_updates} updates"
    )
    trained = _run(
        runs.Run.of(
            "train",
            data,
            Part("model", ["--arch", "transformer_deepnorm"]),
            recipes.layers(a.cli_layers, 1),
            recipes.transformer_size(8, 16, 2),
            ["--share-all-embeddings", "--checkpoint-activations"],
            recipes.device(a.device),
            ["--num-workers", "0"],
            recipes.adam("1e-3", betas=None),
            recipes.budget(max_tokens=400, max_update=a.cli_updates),
            recipes.label_smoothed(0.1),
            recipes.saving(disable_validation=True, save_dir=save, no_epoch_checkpoints=True),
            recipes.json_log(1),
        ),
        os.path.join(work, "train.log"),
        env,
    )
    losses = [float(r["loss"]) for r in trained.records if r["kind"] == "train_inner"]
    log("fairseq-generate, beam 2")
    decoded = _run(
        runs.Run.of(
            "generate",
            data,
            recipes.decoding(
                path=os.path.join(save, "checkpoint_last.pt"),
                gen_subset="test",
                beam=2,
                batch_size=32,
            ),
            recipes.device(a.device, program="generate"),
            ["--num-workers", "0"],
            recipes.decoding(max_len_a=0, max_len_b=10),
        ),
        os.path.join(work, "generate.log"),
        env,
    )
    translated = decoded.generated.translated
    return {
        "encoder_layers": a.cli_layers,
        "updates": a.cli_updates,
        "train_wall_s": trained.seconds,
        "train_losses": losses,
        "generate_wall_s": decoded.seconds,
        "sentences": translated.sentences if translated else 0,
        "test_size": a.cli_test,
    }


def get_parser():
    p = harness.parser(__doc__, show_defaults=True)
    p.add_argument(
        "--arch",
        nargs="+",
        default=["transformer_deepnorm"],
        help="depth-free presets to compare (e.g. transformer_postnorm transformer_prenorm "
        "transformer_dlcl transformer_admin)",
    )
    p.add_argument("--depths", type=int, nargs="+", default=[6, 100, 1000], help="encoder layers")
    p.add_argument("--decoder-layers", type=int, default=1)
    p.add_argument(
        "--checkpoint",
        choices=["both", "off", "on"],
        default="both",
        help="--checkpoint-activations off, on, or both",
    )
    p.add_argument("--width", type=int, default=8)
    p.add_argument("--ffn", type=int, default=16)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--vocab", type=int, default=1000, help="symbols of the random dictionary")
    p.add_argument("--batch", type=int, default=8, help="sentences of the fixed batch")
    p.add_argument("--length", type=int, default=16, help="source and target tokens per sentence")
    p.add_argument("--updates", type=int, default=5, help="timed updates after one warm-up update")
    harness.add_threads(p, help="torch threads (and OMP/MKL threads of --cli runs)")
    p.add_argument(
        "--cli", action="store_true", help="also fairseq-train and fairseq-generate a deep model"
    )
    p.add_argument("--cli-only", action="store_true", help="only the --cli run")
    p.add_argument("--cli-layers", type=int, default=1000)
    p.add_argument("--cli-updates", type=int, default=3)
    p.add_argument(
        "--cli-train", type=int, default=200, help="synthetic training pairs of the --cli run"
    )
    p.add_argument(
        "--cli-test", type=int, default=20, help="synthetic test sentences of the --cli run"
    )
    harness.add_work_dir(
        p,
        os.path.join(harness.ROOT, "bench_runs", "depth"),
        "results.json and the --cli run's data, checkpoints and logs (git-ignored)",
    )
    add_device_argument(
        p,
        note="Memory: saved-activation bytes on both; on cuda also the peak of "
        "torch.cuda.max_memory_allocated during an update",
    )
    return p


def main(argv=None):
    a = get_parser().parse_args(argv)
    device_from_args(a)
    os.makedirs(a.work_dir, exist_ok=True)
    env = harness.thread_env(a.threads, dict(os.environ, PYTHONUNBUFFERED="1"))
    harness.set_threads(a.threads)
    report = {"machine": machine(a.device), "args": vars(a)}
    sections = [f"Machine: {report['machine']}"]
    if not a.cli_only:
        rows = in_process(a)
        report["rows"] = rows
        sections.append(
            f"### One update against depth: width {a.width}, FFN {a.ffn}, {a.heads} heads, batch "
            f"{a.batch}x{a.length} tokens (both sides), Adam; {describe(a.device)}; median of {a.updates} "
            f"updates after one warm-up\n\n" + table(a, rows)
        )
    if a.cli or a.cli_only:
        r = cli(a, env)
        report["cli"] = r
        sections.append(
            f"### fairseq-train + fairseq-generate: transformer_deepnorm, {r['encoder_layers']}+1 layers, width 8, "
            f"--checkpoint-activations\n\n"
            + harness.markdown_table(
                [
                    f"fairseq-train, {r['updates']} updates (wall s)",
                    "train loss, first / last",
                    "fairseq-generate, beam 2 (wall s)",
                    "test sentences translated",
                ],
                [
                    [
                        f"{r['train_wall_s']:.1f}",
                        f"{r['train_losses'][0]:.3f} / {r['train_losses'][-1]:.3f}",
                        f"{r['generate_wall_s']:.1f}",
                        f"{r['sentences']} / {r['test_size']}",
                    ]
                ],
                "rrrr",
            )
        )
    path = harness.write_json(os.path.join(a.work_dir, "results.json"), report)
    print("\n\n".join(sections))
    print(f"\n(all numbers: {path})")


if __name__ == "__main__":
    main()
