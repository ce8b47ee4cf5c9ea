"""Speed and memory of DLCL (Wang et al. 2019) against fairseq's own pre-norm Transformer.

    python -m benchmarks.dlcl_speed [--mode all|train|memory] [--multi30k /work/shared/data/multi30k]
        [--encoder-layers 12 --decoder-layers 3 --embed-dim 128 --ffn-dim 256 --heads 4]
        [--max-update 60 --skip-updates 10 --log-interval 10 --max-tokens 2048 --repeats 2]

``--mode train`` trains, in one run on the same data, seed and flags (only ``--arch`` differs, and
both with ``--user-dir`` so that both get the same plugin shims):

* A: fairseq's ``transformer`` with ``--encoder-normalize-before --decoder-normalize-before``;
* B: ``transformer_dlcl`` (DLCL on both stacks) at the same depth and width,

alternating A, B, A, B, ... (``--repeats``), and reports, as medians over the repeats:

* training speed: target words/s of fairseq-train, from its ``train_inner`` log lines (``wps``),
  the first ``--skip-updates`` updates excluded;
* peak memory of training: the max RSS of the fairseq-train process (``os.wait4``), which includes
  the Python/torch/fairseq baseline shared by both;
* saved activations of one training forward+backward of the full model, measured in-process on a
  fixed batch: bytes of the distinct tensor storages autograd keeps for backward
  (``torch.autograd.graph.saved_tensors_hooks``, parameters excluded);
* decoding speed: tokens/s of ``fairseq-generate`` (beam 5) on the test set, from its final
  ``Translated ... tokens/s`` line, with its BLEU as a sanity check;

each as a ratio B / A.

``--mode memory`` is an in-process micro-benchmark: saved-activation bytes (and time) of one
forward+backward through encoders of ``--micro-layers`` (default 6, 12, 30) layers: fairseq's plain
pre-norm encoder, the DLCL encoder of fairseq_deep (each layer output kept once: O(L) history
memory) and, for reference, a DLCL encoder that re-stacks all earlier outputs at every layer as
the authors' code does (O(L^2)).  ``--mode all`` (the default) runs both.

``--device cuda`` (the default where torch sees a GPU) runs fairseq-train and fairseq-generate
without ``--cpu`` (training on one GPU: ``--distributed-world-size 1``) and the in-process models
on the GPU, with ``torch.cuda.synchronize()`` before every clock reading.  Memory on a GPU: the
peak GPU memory of fairseq-train is read from fairseq's own ``gb_free`` log field (device total
minus ``torch.cuda.max_memory_allocated()`` of the last update of each ``--log-interval``, 0.1 GiB
resolution); the peak RSS row is then host memory only.  The in-process parts add the peak of
``torch.cuda.max_memory_allocated()`` during the forward+backward, above what was allocated before
it.  ``--precision fp16|amp|bf16|memory_efficient_fp16`` passes fairseq's flag to the fairseq runs
(``amp`` on CUDA only); the in-process parts stay float32.

Data: the project's synthetic corpus by default (written into the work dir and binarized there);
``--multi30k DIR`` uses Multi30K en-de (the raw gzip files, never copied into the repository): a
joint sentencepiece model of ``--spm-vocab`` (8k) pieces, then fairseq-preprocess.
"""

if __name__ == "__main__" and not __package__:  # run as a file, the package's imports would fail
    raise SystemExit(
        "benchmarks/dlcl_speed.py is a module of the benchmarks package: run it from the "
        "repository root as python -m benchmarks.dlcl_speed"
    )

import gzip
import json
import os
import platform
import shutil
import statistics
import time
from typing import Dict, List

import torch

import fairseq_deep  # noqa: F401  (registers transformer_dlcl for the in-process parts)
from fairseq_deep import runs
from fairseq_deep.data.synthetic import write_corpus
from fairseq_deep.runs import Part, recipes

from . import harness
from .harness import PeakMemory, add_device_argument, describe, device_from_args, median_seconds

# label, --arch.  Everything else on the command line is shared.
SYSTEMS = [
    ("fairseq transformer (pre-norm)", "transformer"),
    ("transformer_dlcl", "transformer_dlcl"),
]


log = harness.logger("dlcl_speed")


def run(run: runs.Run, log_path: str, env=None) -> runs.Result:
    """Run ``run`` with stdout+stderr into ``log_path``; its result (``max_rss_kib``: the peak
    memory of that process alone), or SystemExit with the end of its log where it failed."""
    return runs.execute(run, log_path, env=env).check()


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------


def _prepared(dest: str, stamp: Dict) -> bool:
    path = os.path.join(dest, "prepared.json")
    return os.path.exists(path) and json.load(open(path)) == stamp


def _preprocess(prefix_dir: str, src: str, tgt: str, dest: str, stamp: Dict):
    run(
        runs.preprocess(
            src, tgt, dest, f"{prefix_dir}/train", f"{prefix_dir}/valid", f"{prefix_dir}/test"
        ),
        os.path.join(os.path.dirname(dest), "preprocess.log"),
    )
    harness.write_json(os.path.join(dest, "prepared.json"), stamp, indent=None)


def prepare_synthetic(work: str, a) -> "tuple[str, str, str]":
    dest = os.path.join(work, "synthetic", "bin")
    stamp = {"data": "synthetic", "train": a.synthetic_train, "test": a.test_size, "seed": a.seed}
    if not _prepared(dest, stamp):
        log(f"writing the synthetic corpus ({a.synthetic_train} pairs) and binarizing it")
        prefixes = write_corpus(
            os.path.join(work, "synthetic", "raw"),
            train=a.synthetic_train,
            valid=200,
            test=a.test_size,
            seed=a.seed,
        )
        _preprocess(os.path.dirname(prefixes["train"]), "src", "tgt", dest, stamp)
    return dest, "src", "tgt"


MULTI30K_FILES = {"train": "train", "valid": "val", "test": "test_2016_flickr"}


def prepare_multi30k(work: str, a) -> "tuple[str, str, str]":
    folder, src, tgt = a.multi30k, a.src_lang, a.tgt_lang
    missing = [
        f"{name}.{lang}.gz"
        for name in MULTI30K_FILES.values()
        for lang in (src, tgt)
        if not os.path.exists(os.path.join(folder, f"{name}.{lang}.gz"))
    ]
    if not os.path.isdir(folder) or missing:
        raise SystemExit(
            f"--multi30k {folder}: "
            + ("no such folder" if not os.path.isdir(folder) else f"missing {', '.join(missing)}")
            + ". Point --multi30k at the raw Multi30K folder (train.en.gz, val.en.gz, "
            "test_2016_flickr.en.gz and the .de files), e.g. /work/shared/data/multi30k, or leave "
            "it out to use the synthetic corpus."
        )
    dest = os.path.join(work, "multi30k", "bin")
    stamp = {"data": os.path.abspath(folder), "src": src, "tgt": tgt, "spm_vocab": a.spm_vocab}
    if _prepared(dest, stamp):
        return dest, src, tgt
    import sentencepiece as spm

    raw, pieces = os.path.join(work, "multi30k", "raw"), os.path.join(work, "multi30k", "spm")
    os.makedirs(raw, exist_ok=True)
    os.makedirs(pieces, exist_ok=True)
    for split, name in MULTI30K_FILES.items():
        for lang in (src, tgt):
            with gzip.open(
                os.path.join(folder, f"{name}.{lang}.gz"), "rt", encoding="utf-8"
            ) as fin, open(os.path.join(raw, f"{split}.{lang}"), "w", encoding="utf-8") as fout:
                fout.writelines(line.strip() + "\n" for line in fin)
    log(f"training a joint sentencepiece model of {a.spm_vocab} pieces")
    model_prefix = os.path.join(work, "multi30k", "spm")
    spm.SentencePieceTrainer.train(
        input=f"{raw}/train.{src},{raw}/train.{tgt}",
        model_prefix=model_prefix,
        vocab_size=a.spm_vocab,
        character_coverage=1.0,
        model_type="unigram",
        num_threads=2,
        minloglevel=2,
    )
    sp = spm.SentencePieceProcessor(model_file=model_prefix + ".model")
    for split in MULTI30K_FILES:
        for lang in (src, tgt):
            lines = open(os.path.join(raw, f"{split}.{lang}"), encoding="utf-8").read().splitlines()
            with open(os.path.join(pieces, f"{split}.{lang}"), "w", encoding="utf-8") as f:
                f.writelines(" ".join(p) + "\n" for p in sp.encode(lines, out_type=str))
    _preprocess(pieces, src, tgt, dest, stamp)
    return dest, src, tgt


# ---------------------------------------------------------------------------------------------
# Training and generation through the real command lines
# ---------------------------------------------------------------------------------------------


def model_flags(a) -> List[str]:
    """Everything but --arch: identical for both systems."""
    return [
        *recipes.layers(a.encoder_layers, a.decoder_layers),
        *recipes.transformer_size(a.embed_dim, a.ffn_dim, a.heads),
        "--encoder-normalize-before",
        "--decoder-normalize-before",
        "--share-all-embeddings",
        *recipes.dropout("0.1", "0.1", "0.1"),
    ]


def train_run(a, data: str, arch: str, save_dir: str) -> runs.Run:
    return runs.Run.of(
        "train",
        data,
        Part("model", ["--arch", arch, *model_flags(a)]),
        ["--task", "translation"],
        recipes.device(a.device, a.precision),
        recipes.seed(a.seed),
        recipes.adam("1e-3"),
        recipes.inverse_sqrt(a.warmup_updates),
        recipes.label_smoothed(0.1),
        recipes.budget(max_tokens=a.max_tokens, max_update=a.max_update),
        recipes.json_log(a.log_interval),
        ["--num-workers", "0"],
        recipes.saving(disable_validation=True, no_epoch_checkpoints=True, save_dir=save_dir),
    )


def parse_train_wps(records: List[runs.Record], skip_updates: int) -> "tuple[float, int]":
    """Target words/s over the ``train_inner`` intervals that start at or after ``skip_updates``:
    sum of words / sum of times (each interval's time = its words / its wps)."""
    words = seconds = 0.0
    updates = 0
    prev = 0
    for stats in records:
        if stats["kind"] != "train_inner":
            continue
        n = int(stats["num_updates"])
        if prev >= skip_updates:
            w = float(stats["wpb"]) * (n - prev)
            words += w
            seconds += w / float(stats["wps"])
            updates += n - prev
        prev = n
    if not updates:
        raise SystemExit(
            f"no train_inner interval after update {skip_updates}: raise --max-update "
            "or lower --skip-updates / --log-interval"
        )
    return words / seconds, updates


def parse_gpu_peak_gib(records: List[runs.Record], total_gib: float) -> float:
    """Peak GPU memory of a fairseq-train run (GiB) from its ``train_inner`` lines: fairseq logs
    ``gb_free`` = device total - ``torch.cuda.max_memory_allocated()`` of the last update of each
    log interval (rounded to 0.1 GiB); nan when no line has it (a CPU run)."""
    free = [float(r["gb_free"]) for r in records if r["kind"] == "train_inner" and "gb_free" in r]
    return total_gib - min(free) if free else float("nan")


def generate(a, data: str, checkpoint: str, log_path: str, env) -> Dict[str, float]:
    decoded = run(
        runs.Run.of(
            "generate",
            data,
            recipes.decoding(path=checkpoint, gen_subset="test"),
            recipes.device(a.device, a.precision, "generate"),
            # every hypothesis gets exactly --gen-len tokens: both systems do the same decoding work,
            # whatever their (barely trained) models would emit
            recipes.decoding(beam=5, batch_size=a.gen_batch_size, min_len=a.gen_len),
            recipes.decoding(max_len_a=0, max_len_b=a.gen_len),
            ["--num-workers", "0", "--quiet"],
        ),
        log_path,
        env,
    )
    generated = decoded.generated
    m = generated.translated
    if not m:
        raise SystemExit(f"no 'Translated ... tokens/s' line in {log_path}")
    bleu = generated.bleu4
    return {
        "gen_tokens_per_s": m.tokens_per_s,
        "gen_tokens": m.tokens,
        "gen_seconds": m.seconds,
        "bleu": float(bleu) if bleu else float("nan"),
    }


def benchmark_training(a, data: str, env) -> Dict[str, List[Dict[str, float]]]:
    """Each system's figures of every repeat; the systems alternate (A, B, A, B, ...)."""

    def one_run(label: str, arch: str):
        def measure(rep: int) -> Dict[str, float]:
            run_dir = os.path.join(a.work_dir, "runs", f"{arch}_{rep}")
            shutil.rmtree(run_dir, ignore_errors=True)  # a checkpoint left there would be resumed
            os.makedirs(run_dir)
            log(f"repeat {rep + 1}/{a.repeats}: training {label} for {a.max_update} updates")
            t0 = time.time()
            trained = run(
                train_run(a, data, arch, run_dir), os.path.join(run_dir, "train.log"), env
            )
            wps, updates = parse_train_wps(trained.records, a.skip_updates)
            r = {
                "train_wps": wps,
                "timed_updates": updates,
                "train_max_rss_mib": trained.max_rss_kib / 1024,
                "train_wall_s": time.time() - t0,
            }
            if a.device == "cuda":
                total = torch.cuda.get_device_properties(0).total_memory / 2**30  # as fairseq's
                r["train_gpu_peak_gib"] = parse_gpu_peak_gib(trained.records, total)
            if not a.no_generate:
                log(f"repeat {rep + 1}/{a.repeats}: fairseq-generate with {label}")
                r.update(
                    generate(
                        a,
                        data,
                        os.path.join(run_dir, "checkpoint_last.pt"),
                        os.path.join(run_dir, "generate.log"),
                        env,
                    )
                )
            log("  " + ", ".join(f"{k}={v:.4g}" for k, v in r.items()))
            return r

        return measure

    return harness.alternated({arch: one_run(label, arch) for label, arch in SYSTEMS}, a.repeats)


# ---------------------------------------------------------------------------------------------
# In-process memory measurements
# ---------------------------------------------------------------------------------------------


def saved_bytes(fn, params) -> "tuple[object, int]":
    """``fn()``'s result and the bytes of the distinct storages autograd saved for backward while
    it ran (parameters excluded)."""
    param_ptrs = {p.untyped_storage().data_ptr() for p in params}
    storages: Dict[int, int] = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in param_ptrs:
            storages[st.data_ptr()] = st.nbytes()
        return t  # kept alive by the graph until backward: no address is reused meanwhile

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, sum(storages.values())


def saved_activation_bytes(fn, params) -> int:
    """Bytes of the distinct storages that autograd saves for backward while ``fn()`` runs
    (parameters excluded); then runs backward on ``fn``'s result."""
    loss, saved = saved_bytes(fn, params)
    loss.backward()
    return saved


def random_tokens(dictionary, bsz: int, length: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    t = torch.randint(dictionary.nspecial, len(dictionary), (bsz, length), generator=g)
    t[:, -1] = dictionary.eos()
    return t


def full_model_activations(a, data: str) -> "tuple[Dict[str, float], Dict[str, float]]":
    """Saved activations (MiB) of one training forward+backward of each full benchmark model, and
    on CUDA the peak GPU memory of that forward+backward above what was allocated before it (MiB;
    empty on CPU)."""
    from fairseq.data import Dictionary

    d = Dictionary.load(os.path.join(data, f"dict.{a.data_src}.txt"))
    src = random_tokens(d, a.act_batch, a.act_length, 0).to(a.device)
    prev = random_tokens(d, a.act_batch, a.act_length, 1).to(a.device)
    lengths = torch.full((a.act_batch,), a.act_length).to(a.device)
    out, peak = {}, {}
    for _, arch in SYSTEMS:
        model = harness.build_model(["--arch", arch, *model_flags(a)], d, a.device).train()

        def step(model=model):
            torch.manual_seed(0)  # same dropout masks for both
            logits, _ = model(src, lengths, prev)
            return logits.float().log_softmax(-1).mean()

        with PeakMemory(a.device) as mem:
            out[arch] = saved_activation_bytes(step, model.parameters()) / 2**20
        if mem.mib is not None:
            peak[arch] = mem.mib
    return out, peak


class RestackedDLCL:
    """Mixin: DLCL that stacks all earlier outputs at every layer and weights the stack, as the
    authors' code does (``torch.stack(layers) * w.view(-1, 1, 1, 1)``): autograd keeps one stacked
    copy per layer, O(L^2) activation memory.  Same values as fairseq_deep's DLCL."""

    def combine(self, row, entries):
        w = (
            self.weights()[row, : len(entries)]
            if self.softmax
            else self.weight[row, : len(entries)]
        )
        stacked = torch.stack(entries, 0)
        out = (stacked * w.view(-1, 1, 1, 1).to(stacked.dtype)).sum(0)
        return out if self.normalize_before else self.norms[row](out)


def encoder_memory(a) -> List[Dict[str, float]]:
    """Saved activations and time of one forward+backward through the encoder alone."""
    from fairseq_deep.modules.histories.layer_history import DynamicLinearCombination

    d = harness.dictionary(1000)
    src = random_tokens(d, a.act_batch, a.act_length, 0).to(a.device)
    lengths = torch.full((a.act_batch,), a.act_length).to(a.device)
    rows = []
    for layers in a.micro_layers:
        flags = model_flags(a)
        flags[flags.index("--encoder-layers") + 1] = str(layers)
        flags[flags.index("--decoder-layers") + 1] = "1"
        variants = [
            ("pre-norm (fairseq)", "transformer", False),
            ("DLCL (fairseq_deep)", "transformer_dlcl", False),
            ("DLCL, re-stacked (authors' code)", "transformer_dlcl", True),
        ]
        row = {"layers": layers}
        for name, arch, restack in variants:
            extra = ["--dlcl-stacks", "encoder"] if arch != "transformer" else []
            model = harness.build_model(["--arch", arch, *flags, *extra], d, a.device)
            enc = model.encoder.train()
            if restack:
                assert isinstance(enc.history, DynamicLinearCombination)
                enc.history.__class__ = type(
                    "RestackedDLCL", (RestackedDLCL, DynamicLinearCombination), {}
                )

            def step(enc=enc):
                torch.manual_seed(0)
                return enc(src, lengths)["encoder_out"][0].float().pow(2).mean()

            with PeakMemory(a.device) as mem:
                saved = saved_activation_bytes(step, enc.parameters())
            seconds = median_seconds(lambda: step().backward(), a.micro_timing_runs, a.device)
            row[name] = {"saved_mib": saved / 2**20, "fwd_bwd_ms": 1000 * seconds}
            if mem.mib is not None:
                row[name]["gpu_peak_mib"] = mem.mib
        rows.append(row)
        log(
            f"encoder memory, {layers} layers: "
            + ", ".join(f"{k}: {v['saved_mib']:.1f} MiB" for k, v in row.items() if k != "layers")
        )
    return rows


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------


def machine(device: str = "cpu") -> str:
    import fairseq

    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        usable = os.cpu_count()
    return (
        f"{platform.machine()}, {usable} usable cores (of {os.cpu_count()}), "
        f"torch {torch.__version__} ({torch.get_num_threads()} threads), fairseq "
        f"{getattr(fairseq, '__version__', '?')}, Python {platform.python_version()}"
        + (f"; {describe(device)}" if device != "cpu" else "")
    )


def _median(values):
    return statistics.median(values) if values else float("nan")


def training_table(a, results, activations, gpu_peak=None) -> str:
    (label_a, arch_a), (label_b, arch_b) = SYSTEMS
    rows = [("training target words/s (fairseq-train `wps`)", "train_wps", "{:.0f}")]
    if a.device == "cuda":
        rows += [
            (
                "peak GPU memory of fairseq-train (GiB; fairseq's `gb_free`, 0.1 GiB steps)",
                "train_gpu_peak_gib",
                "{:.1f}",
            ),
            ("peak host RSS of fairseq-train (MiB)", "train_max_rss_mib", "{:.0f}"),
        ]
    else:
        rows += [("peak RSS of fairseq-train (MiB)", "train_max_rss_mib", "{:.0f}")]
    if not a.no_generate:
        rows += [
            ("fairseq-generate tokens/s (beam 5)", "gen_tokens_per_s", "{:.1f}"),
            ("generated tokens", "gen_tokens", "{:.0f}"),
            ("BLEU after training (sanity check)", "bleu", "{:.2f}"),
        ]

    def spread(arch, key, fmt):
        """The range over the repeats, after the median."""
        if a.repeats <= 1:
            return ""
        values = [r[key] for r in results[arch]]
        return f" ({fmt.format(min(values))}-{fmt.format(max(values))})"

    lines = []
    for name, key, fmt in rows:
        va = _median([r[key] for r in results[arch_a]])
        vb = _median([r[key] for r in results[arch_b]])
        ratio = f"{vb / va:.3f}" if va else "n/a"
        lines.append(
            [
                name,
                f"{fmt.format(va)}{spread(arch_a, key, fmt)}",
                f"{fmt.format(vb)}{spread(arch_b, key, fmt)}",
                ratio,
            ]
        )
    if activations:
        va, vb = activations[arch_a], activations[arch_b]
        lines.append(
            [
                f"saved activations, one training fwd+bwd, {a.act_batch}x{a.act_length} tokens (MiB)",
                f"{va:.1f}",
                f"{vb:.1f}",
                f"{vb / va:.3f}",
            ]
        )
    if gpu_peak:
        va, vb = gpu_peak[arch_a], gpu_peak[arch_b]
        lines.append(
            [
                "peak GPU memory of that fwd+bwd above the model and batch (MiB)",
                f"{va:.1f}",
                f"{vb:.1f}",
                f"{vb / va:.3f}",
            ]
        )
    return harness.markdown_table(["measure", label_a, label_b, "ratio B/A"], lines, "lrrr")


def memory_table(rows) -> str:
    names = [k for k in rows[0] if k != "layers"]
    base = names[0]
    head = ["encoder layers", *(f"{n}: MiB (ratio)" for n in names), *(f"{n}: ms" for n in names)]
    gpu = "gpu_peak_mib" in rows[0][base]
    if gpu:
        head += [f"{n}: peak GPU MiB (ratio)" for n in names]
    lines = []
    for r in rows:
        cells = [
            f"{r[n]['saved_mib']:.1f} ({r[n]['saved_mib'] / r[base]['saved_mib']:.2f})"
            for n in names
        ]
        cells += [f"{r[n]['fwd_bwd_ms']:.0f}" for n in names]
        if gpu:
            cells += [
                f"{r[n]['gpu_peak_mib']:.1f} ({r[n]['gpu_peak_mib'] / r[base]['gpu_peak_mib']:.2f})"
                for n in names
            ]
        lines.append([r["layers"], *cells])
    return harness.markdown_table(head, lines, "r" * len(head))


def get_parser():
    p = harness.parser(__doc__, show_defaults=True)
    p.add_argument("--mode", choices=["all", "train", "memory"], default="all")
    harness.add_work_dir(
        p,
        os.path.join(harness.ROOT, "bench_runs", "dlcl_speed"),
        "data, checkpoints and logs (git-ignored under the repository)",
    )
    p.add_argument(
        "--multi30k", metavar="DIR", help="raw Multi30K folder instead of the synthetic corpus"
    )
    p.add_argument("--src-lang", default="en")
    p.add_argument("--tgt-lang", default="de")
    p.add_argument("--spm-vocab", type=int, default=8000)
    p.add_argument("--synthetic-train", type=int, default=20000)
    p.add_argument("--test-size", type=int, default=1000, help="synthetic test sentences")
    p.add_argument(
        "--gen-len",
        type=int,
        default=20,
        help="tokens of every generated hypothesis (forced with --min-len/--max-len-b)",
    )
    p.add_argument("--encoder-layers", type=int, default=12)
    p.add_argument("--decoder-layers", type=int, default=3)
    p.add_argument("--embed-dim", type=int, default=128)
    p.add_argument("--ffn-dim", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=2048)
    p.add_argument("--max-update", type=int, default=60)
    p.add_argument("--warmup-updates", type=int, default=100)
    p.add_argument("--log-interval", type=int, default=10)
    p.add_argument("--skip-updates", type=int, default=10, help="updates left out of the speed")
    harness.add_rounds(p, 2, flag="--repeats", help="runs of each system, alternated")
    p.add_argument("--no-generate", action="store_true")
    p.add_argument("--gen-batch-size", type=int, default=64)
    p.add_argument("--seed", type=int, default=1)
    harness.add_threads(p, help="OMP/MKL threads of every run (default: torch's)")
    add_device_argument(
        p,
        precision=True,
        note=(
            "On cuda the training table adds the peak GPU memory of fairseq-train (from fairseq's "
            "gb_free log field) and the in-process tables the peak of torch.cuda.max_memory_allocated; "
            "peak RSS is then host memory only"
        ),
    )
    p.add_argument("--act-batch", type=int, default=32, help="sentences of the in-process batch")
    p.add_argument("--act-length", type=int, default=24, help="tokens per sentence of that batch")
    p.add_argument("--micro-layers", type=int, nargs="+", default=[6, 12, 30])
    p.add_argument("--micro-timing-runs", type=int, default=2)
    harness.add_json(p, help="also write all numbers to this file (default: WORK_DIR/results.json)")
    return p


def main(argv=None):
    a = get_parser().parse_args(argv)
    device_from_args(a)
    if a.skip_updates % a.log_interval:
        raise SystemExit("--skip-updates must be a multiple of --log-interval")
    os.makedirs(a.work_dir, exist_ok=True)
    env = harness.thread_env(a.threads, dict(os.environ, PYTHONUNBUFFERED="1"))
    harness.set_threads(a.threads)
    report = {"machine": machine(a.device), "args": vars(a)}
    sections = [f"Machine: {report['machine']}"]

    if a.mode in ("all", "train"):
        data, a.data_src, _ = (prepare_multi30k if a.multi30k else prepare_synthetic)(a.work_dir, a)
        results = benchmark_training(a, data, env)
        activations, gpu_peak = full_model_activations(a, data)
        report.update(training=results, activations_mib=activations)
        if gpu_peak:
            report["activations_gpu_peak_mib"] = gpu_peak
        corpus = (
            f"Multi30K {a.src_lang}-{a.tgt_lang} (spm {a.spm_vocab})"
            if a.multi30k
            else f"synthetic ({a.synthetic_train} pairs)"
        )
        sections.append(
            f"### Training and decoding: {a.encoder_layers}+{a.decoder_layers} layers, d={a.embed_dim}, "
            f"ffn={a.ffn_dim}, {a.heads} heads; {corpus}; {a.max_update} updates of {a.max_tokens} "
            f"max tokens (speed over updates {a.skip_updates + 1}-{a.max_update}); "
            + (f"median of {a.repeats} alternated runs (min-max)" if a.repeats > 1 else "one run")
            + (
                f"; {a.device}, fairseq runs in {a.precision}"
                if (a.device, a.precision) != ("cpu", "fp32")
                else ""
            )
            + "\n\n"
            + training_table(a, results, activations, gpu_peak)
        )
    if a.mode in ("all", "memory"):
        rows = encoder_memory(a)
        report["encoder_memory"] = rows
        sections.append(
            f"### Encoder saved activations, one forward+backward of {a.act_batch}x{a.act_length} tokens, "
            f"d={a.embed_dim}, ffn={a.ffn_dim} (ratio to pre-norm)\n\n" + memory_table(rows)
        )

    path = harness.write_json(a.json or os.path.join(a.work_dir, "results.json"), report)
    print("\n\n".join(sections))
    print(f"\n(all numbers: {path})")


if __name__ == "__main__":
    main()
