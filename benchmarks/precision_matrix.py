"""Every model family through the real fairseq-train and fairseq-generate, in each precision.

For each family and precision: train ``--updates`` updates (``python -m fairseq_cli.train ...
--user-dir fairseq_deep`` with the precision's flag), then decode the test set with
``fairseq_cli.generate`` in the same precision, and print one markdown table (precision x family:
trained?, updates reached, last training loss, last and smallest loss scale, fairseq's count of
overflowed steps, test sentences decoded / in the test set, the error that stopped a run).  Numbers
go to ``WORK_DIR/results.json`` too, rewritten as each run ends (and each finished run's table row
goes to stderr), so a matrix cut short keeps what it measured; ``--run-timeout`` caps each run.

Precisions: ``fp32``; ``fp16`` (fairseq's FP16Optimizer: the model in half, float32 master
weights, dynamic loss scale); ``memory_efficient_fp16``; ``amp`` (autocast + GradScaler; CUDA
only: on CPU fairseq's ``--amp`` is float32, so the script skips it there); ``bf16`` (the model
in bfloat16, float32 master weights, no loss scale; fairseq_deep's precision shim stops ``--bf16``
from implying ``--tpu``).  Decoding uses ``--fp16`` for fp16, memory_efficient_fp16 and amp,
``--bf16`` for bf16.

    # on a GPU, the papers' widths (the table of issue 12), binarized Multi30k or any other data:
    python -m benchmarks.precision_matrix --data DATA_BIN --scale paper --updates 1000
    # on CPU, tiny models (what tests/test_precision.py runs on generated data):
    python -m benchmarks.precision_matrix --data DATA_BIN --scale tiny --updates 3 --device cpu \\
        --precisions fp16 bf16 --jobs 2

``--scale paper`` uses each family's named architecture at its paper width (transformer_dlcl_30l,
transformer_ta_16l, rnmt_plus_512, deep_att_ff_5x3, ...); ``--scale tiny`` the depth-free
architecture at width 16 with 2-3 layers.  ``--families`` picks some of them.
"""

if __name__ == "__main__" and not __package__:  # run as a file, the package's imports would fail
    raise SystemExit(
        "benchmarks/precision_matrix.py is a module of the benchmarks package: run it from the "
        "repository root as python -m benchmarks.precision_matrix"
    )

import argparse
import concurrent.futures
import contextlib
import glob
import os
import sys
import threading
import time

from fairseq_deep import runs
from fairseq_deep.models import families
from fairseq_deep.runs import Part, recipes
from fairseq_deep.runs.recipes import PRECISIONS

from . import harness
from .harness import add_device_argument, device_from_args

# the tiny sizes of the families (``tiny_sizes`` of their declarations), as the tests name them
_TRANSFORMER_TINY = list(families.TINY_TRANSFORMER)
_RNMT_TINY = list(families.get("rnmt_plus").tiny_sizes)
_HYBRID_TINY = list(families.get("rnmt_hybrid").tiny_sizes)
_DEEP_ATT_TINY = list(families.get("deep_att").tiny_sizes)


def rows():
    """name: (architecture at the paper's width, depth-free architecture, tiny sizes, model flags
    of both, training flags of both): every tiny configuration that a family declares (its
    ``tiny``, fairseq_deep/models/families.py), so a family is in the matrix the moment it is
    declared (the rows of tests/test_precision.py and tests/test_stacks.py too)."""
    return {
        tiny.name: (
            tiny.paper.arch,
            tiny.arch,
            list(family.tiny_sizes),
            list(tiny.model),
            runs.flags(tiny.training),
        )
        for family, tiny in families.tiny_configs()
    }


FAMILIES = rows()


# GPU memory of one paper-scale run (issue 24: 16 runs at once on an 80 GB H100, 9 died of CUDA
# out-of-memory).  Per family: parameters (millions, an 8k joint vocabulary: counted by building each
# --arch on the meta device), the sum of width x layers of its Transformer layers and of hidden size
# x layers x directions of its recurrent ones (Deep-Att: every F-F layer of both columns).
PAPER_MEMORY = {tiny.name: tiny.paper.memory for _, tiny in families.tiny_configs()}
#: bytes per token and unit of width x layers kept for the backward: a Transformer layer ~34 values of
#: width per token in 16-bit (Korthikanti et al. 2022) plus the decoder's cross-attention: 48; the
#: recurrent loops run in float32 and keep gates, cell and layer-norm statistics of every step: 100
TRANSFORMER_BYTES, RECURRENT_BYTES = 48, 100


def estimate_gb(family: str, max_tokens: int, vocab: int = 8000) -> float:
    """GPU memory (GB) of one paper-scale training run: 1.5 GB of CUDA context and workspaces, 20
    bytes a parameter (16-bit weights and gradients, float32 master weights and gradients, Adam's two
    moments; AMP: 16), the activations times 1.5 (the caching allocator's slack) and the logits
    (float16 + float32 log-softmax and its gradient, 12 bytes an entry).  A planning figure, on the
    safe side: docs/precision.md lists it per family; ``gb_free`` in the runs' logs measures it."""
    return memory_gb(PAPER_MEMORY[family], max_tokens, vocab)


def memory_gb(paper_memory, max_tokens: int, vocab: int = 8000) -> float:
    """:func:`estimate_gb` of a run whose (parameters in millions, width x layers of its Transformer
    layers, hidden size x layers x directions of its recurrent ones) are ``paper_memory``."""
    params_m, transformer, recurrent = paper_memory
    activations = max_tokens * (transformer * TRANSFORMER_BYTES + recurrent * RECURRENT_BYTES) * 1.5
    return round(
        1.5 + params_m * 1e6 * 20 / 1e9 + activations / 1e9 + max_tokens * vocab * 12 / 1e9, 1
    )


def system_gb(arch: str, flags=(), max_tokens: int = 4096, vocab: int = 8000) -> float:
    """:func:`memory_gb` of a study system (``--arch arch`` with ``flags``) at its presets' width:
    the paper memory its family declares for that preset (the declaration whose paper-scale
    ``arch`` is ``arch``, else whose depth-free ``arch`` is, else the family's first), a
    Transformer's scaled by its layers against the declared preset's (every per-layer figure is
    linear in depth).  A planning figure on the safe side (the hybrids' declared paper sizes are
    wider than Base)."""
    spec = families.spec(arch)
    tinies = spec.family.tiny
    tiny = (
        next((t for t in tinies if t.paper.arch == arch), None)
        or next((t for t in tinies if t.arch == spec.depth_free), None)
        or tinies[0]
    )
    params_m, transformer, recurrent = tiny.paper.memory
    if spec.kind == "transformer":
        encoder, decoder = spec.depths
        encoder = int(runs.option_value(flags, "--encoder-layers") or encoder)
        decoder = int(runs.option_value(flags, "--decoder-layers") or decoder)
        ratio = (encoder + decoder) / sum(families.spec(tiny.paper.arch).depths)
        params_m, transformer = params_m * ratio, transformer * ratio
    return memory_gb((params_m, transformer, recurrent), max_tokens, vocab)


def data_languages(data):
    """(source, target, test set size) of a fairseq-preprocess folder."""
    idx = sorted(glob.glob(os.path.join(data, "test.*-*.*.idx")))
    if not idx:
        raise SystemExit(
            f"{data}: no binarized test set (test.SRC-TGT.SRC.idx); run fairseq-preprocess "
            "with --testpref"
        )
    pair, lang = os.path.basename(idx[0]).split(".")[1:3]
    src, tgt = pair.split("-")
    from fairseq.data import indexed_dataset

    return (
        src,
        tgt,
        len(indexed_dataset.MMapIndexedDataset(os.path.join(data, f"test.{pair}.{src}"))),
    )


def train_run(args, family, precision, save_dir) -> runs.Run:
    """fairseq-train of a family in a precision: Adam (0.9, 0.98) with inverse_sqrt warm-up unless
    the family names its optimiser, label-smoothed cross-entropy unless it names its criterion, its
    model and training flags, then ``--train-args``."""
    paper_arch, tiny_arch, tiny_flags, model_flags, flags = FAMILIES[family]
    arch, sizes = (paper_arch, []) if args.scale == "paper" else (tiny_arch, tiny_flags)
    return runs.Run.of(
        "train",
        args.data,
        Part("model", ["--arch", arch, *sizes]),
        recipes.budget(max_tokens=args.max_tokens, max_update=args.updates),
        recipes.learning_rate(args.lr),
        recipes.inverse_sqrt(args.warmup),
        recipes.dropout("0.1"),
        recipes.seed("1"),
        recipes.saving(save_dir=save_dir, no_epoch_checkpoints=True),
        recipes.json_log(args.log_interval),
        recipes.saving(disable_validation=True),
        recipes.device(args.device, precision),
        None if recipes.gives(flags, "optimizer") else recipes.adam(),
        None if recipes.gives(flags, "criterion") else recipes.label_smoothed(0.1),
        Part("family", model_flags + flags),
        Part("train_args", args.train_args),
    )


def generate_run(args, precision, checkpoint) -> runs.Run:
    """fairseq-generate of the test set in the precision (with ``--decode-shards N``, fairseq's
    first of N shards of the batches: the distributed world's rank 0)."""
    shards = args.decode_shards
    return runs.Run.of(
        "generate",
        args.data,
        recipes.decoding(path=checkpoint, gen_subset="test"),
        recipes.decoding(beam=args.beam, batch_size=args.batch_size),
        recipes.decoding(max_len_a="0", max_len_b=args.max_len)
        if args.max_len is not None
        else None,
        ["--distributed-world-size", shards, "--distributed-rank", "0"] if shards > 1 else [],
        recipes.device(args.device, precision, "generate"),
    )


def expected_decoded(args, n_test: int) -> int:
    """Sentences a decode of the test set covers: all, or with ``--decode-shards N`` fairseq's first
    shard of the batches (about n_test / N); run_one reports what was decoded of this."""
    return n_test if args.decode_shards <= 1 else -1  # -1: a shard's size is known once decoded


def remove_checkpoints(out: str):
    """The run's checkpoints (hundreds of MB to GB at paper scale) once it is decoded or has failed."""
    for path in glob.glob(os.path.join(out, "*.pt")):
        os.remove(path)


def _scale_stats(row, stats, text):
    """Loss-scale figures of a run: the last and the smallest logged scale and fairseq's count of
    overflowed (skipped) steps, from its ``train_inner`` logs and "gradient overflow" notes."""
    scales = [float(s["loss_scale"]) for s in stats if "loss_scale" in s]
    if scales:
        row["loss_scale"], row["min_scale"] = scales[-1], min(scales)
    row["overflows"] = runs.count_overflows(text)


def run_one(args, family, precision, n_test):
    """Train and decode one (family, precision); a dict of what was seen."""
    row = {"family": family, "precision": precision}
    if precision == "amp" and args.device == "cpu":
        return {**row, "trained": None, "note": "n/a on CPU (fairseq's --amp is CUDA autocast)"}
    out = os.path.join(args.work_dir, f"{family}.{precision}")
    os.makedirs(out, exist_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONWARNINGS="ignore")
    if args.device == "cpu":
        env.setdefault("OMP_NUM_THREADS", "1")
    t0 = time.time()
    checkpoint = os.path.join(out, "checkpoint_last.pt")
    train, decode = (
        train_run(args, family, precision, out),
        generate_run(args, precision, checkpoint),
    )
    timeout = args.run_timeout or None
    decoding = None
    if args.one_process:  # both in one Python (a start-up of fairseq saved per run)
        results = runs.execute_together(
            [train, decode], os.path.join(out, "train_and_generate.log"), env=env, timeout=timeout
        )
        trained, decoding = results[0], (results[1] if len(results) > 1 else None)
    else:
        trained = runs.execute(train, os.path.join(out, "train.log"), env=env, timeout=timeout)
        row["train_s"] = round(time.time() - t0, 1)
    stats = [r for r in trained.records if r["kind"] == "train_inner"]
    row["trained"] = trained.ok
    if stats:
        row["last_loss"] = float(stats[-1]["loss"])
        row["updates"] = int(stats[-1]["num_updates"])
    _scale_stats(row, stats, trained.output)
    gb_free = [float(s["gb_free"]) for s in stats if "gb_free" in s]
    if gb_free:
        row["gb_free_min"] = min(gb_free)  # fairseq's own reading of the free GPU memory
    if not trained.ok:
        row["error"] = (
            f"stopped by --run-timeout {args.run_timeout:g} s at update {row.get('updates', 0)}"
            if trained.timed_out
            else trained.error(200)
        )
        if not args.keep_checkpoints:
            remove_checkpoints(out)
        return row
    if decoding is None:
        decoding = runs.execute(decode, os.path.join(out, "generate.log"), env=env, timeout=timeout)
    if not args.keep_checkpoints:
        remove_checkpoints(out)
    generated = decoding.generated
    row["decoded"] = len(generated.tokens)
    shard = generated.translated
    expected = expected_decoded(args, n_test)
    row["test_size"] = expected if expected >= 0 else (shard.sentences if shard else n_test)
    if args.decode_shards > 1:
        row["note"] = f"shard 0 of {args.decode_shards} of the {n_test} test sentences"
    if not decoding.ok:
        row["error"] = "generate: " + (
            "stopped by --run-timeout" if decoding.timed_out else decoding.error(200)
        )
    return row


def run_matrix(args):
    """Every (family, precision), ``--jobs`` at a time.  ``WORK_DIR/results.json`` is rewritten and a
    table row printed as each run ends, so a matrix cut short still leaves what it measured."""
    _, _, n_test = data_languages(args.data)
    os.makedirs(args.work_dir, exist_ok=True)
    jobs = [(f, p) for p in args.precisions for f in args.families]
    rows, lock = [None] * len(jobs), threading.Lock()

    def one(i):
        row = run_one(args, jobs[i][0], jobs[i][1], n_test)
        with lock:
            rows[i] = row
            harness.write_json(
                os.path.join(args.work_dir, "results.json"),
                {
                    "scale": args.scale,
                    "device": args.device,
                    "updates": args.updates,
                    "rows": [r for r in rows if r is not None],
                },
            )
            print(table([row]).splitlines()[-1], file=sys.stderr, flush=True)

    memory = MemoryCap(args.memory_gb)

    def capped(i):
        need = (
            estimate_gb(jobs[i][0], args.max_tokens)
            if args.scale == "paper" and args.memory_gb
            else 0.0
        )
        with memory.hold(need):
            one(i)

    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        list(pool.map(capped, range(len(jobs))))
    return rows


class MemoryCap:
    """At most ``total`` GB of estimated GPU memory held by the runs at once (0: no cap); a run that
    needs more than ``total`` alone still runs, alone.  ``peak`` records the most held at once."""

    def __init__(self, total: float):
        self.total, self.used, self.running, self.peak = total, 0.0, 0, 0.0
        self.cond = threading.Condition()

    @contextlib.contextmanager
    def hold(self, gb: float):
        with self.cond:
            while self.total and self.running and self.used + gb > self.total:
                self.cond.wait()
            self.used += gb
            self.running += 1
            self.peak = max(self.peak, self.used)
        try:
            yield
        finally:
            with self.cond:
                self.used -= gb
                self.running -= 1
                self.cond.notify_all()


def table(rows):
    lines = []
    for r in rows:
        trained = {True: "yes", False: "**no**", None: "-"}[r.get("trained")]
        decoded = f"{r['decoded']} / {r['test_size']}" if "decoded" in r else "-"
        loss = f"{r['last_loss']:.3f}" if "last_loss" in r else "-"
        scale = f"{r['loss_scale']:g} / {r['min_scale']:g}" if "loss_scale" in r else "-"
        note = r.get("error") or r.get("note") or ""
        lines.append(
            [
                r["precision"],
                r["family"],
                trained,
                r.get("updates", "-"),
                loss,
                scale,
                r.get("overflows", "-"),
                decoded,
                note,
            ]
        )
    return harness.markdown_table(
        [
            "precision",
            "family",
            "trained",
            "updates",
            "last loss",
            "loss scale (last / min)",
            "overflows",
            "decoded",
            "note",
        ],
        lines,
    )


def get_parser():
    p = harness.parser(__doc__)
    p.add_argument(
        "--data", required=True, help="fairseq-preprocess output folder with train and test"
    )
    harness.add_work_dir(p, os.path.join("bench_runs", "precision_matrix"))
    p.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    p.add_argument(
        "--precisions",
        nargs="+",
        default=["fp16", "memory_efficient_fp16", "amp", "bf16"],
        choices=list(PRECISIONS),
    )
    p.add_argument("--scale", choices=["paper", "tiny"], default="paper")
    add_device_argument(p, note="amp is skipped on cpu (fairseq's --amp is CUDA autocast)")
    p.add_argument("--updates", type=int, default=40)
    p.add_argument("--max-tokens", type=int, default=4096)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=400)
    p.add_argument("--log-interval", type=int, default=10)
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument(
        "--max-len",
        type=int,
        default=None,
        help="decode at most N tokens a sentence (fairseq-generate's --max-len-a 0 --max-len-b N; "
        "default fairseq's 200: a model trained a few updates "
        "never stops before it, which makes decoding most of a tiny CPU run)",
    )
    p.add_argument("--jobs", type=int, default=1, help="runs at a time (at most; see --memory-gb)")
    p.add_argument(
        "--memory-gb",
        type=float,
        default=0,
        help="--scale paper: start a run only while the estimated GPU memory of the runs going on "
        "(estimate_gb) stays within this many GB (0: no cap)",
    )
    p.add_argument(
        "--decode-shards",
        type=int,
        default=1,
        help="decode only fairseq-generate's first of N shards of the test batches "
        "(--distributed-world-size N --distributed-rank 0, one process): about 1/N of the sentences",
    )
    p.add_argument(
        "--keep-checkpoints",
        action="store_true",
        help="keep each run's checkpoints (default: deleted once it is decoded or has failed)",
    )
    p.add_argument(
        "--run-timeout",
        type=float,
        default=0,
        help="seconds each fairseq-train (and each fairseq-generate) may run; a run stopped "
        "by it is reported with the update it reached (0: no limit)",
    )
    p.add_argument(
        "--one-process",
        action="store_true",
        help="train and decode each run in one Python process (saves a start-up of fairseq per run; "
        "results.json then has no train_s; --run-timeout caps both together)",
    )
    p.add_argument(
        "--train-args",
        nargs=argparse.REMAINDER,
        default=[],
        help="everything after this goes to every fairseq-train as it is",
    )
    return p


def parse_args(argv=None):
    args = get_parser().parse_args(argv)
    device_from_args(args)
    args.log_interval = min(args.log_interval, args.updates)
    return args


def main(argv=None):
    args = parse_args(argv)
    rows = run_matrix(args)
    print(
        f"{args.scale} scale, {args.device}, {args.updates} updates of {args.max_tokens} tokens, "
        f"data {args.data}\n"
    )
    print(table(rows))
    return (
        0
        if all(
            r.get("trained") in (True, None) and r.get("decoded", 0) == r.get("test_size", 0)
            for r in rows
        )
        else 1
    )


if __name__ == "__main__":
    sys.exit(main())
