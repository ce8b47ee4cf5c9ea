"""What the benchmark scripts share, written once.

The scripts are modules of the ``benchmarks`` package: run them from the repository root as
``python -m benchmarks.NAME ...``; they import this module and each other relatively, and nothing
edits ``sys.path``.

Options (each script keeps its own defaults and help):

* ``parser(__doc__)``: a script's argument parser, its docstring's first paragraph as the
  description (``full``: the whole docstring; ``epilog``; ``show_defaults``);
* ``add_device_argument(parser)``: ``--device`` (default: ``cuda`` when torch sees a CUDA device,
  else ``cpu``); ``precision=True`` adds ``--precision`` (fairseq's flags for the fairseq-train /
  fairseq-generate runs of a script: ``fp32`` (none), ``--fp16``, ``--memory-efficient-fp16``,
  ``--amp``, ``--bf16``);
* ``add_threads``, ``add_json``, ``add_work_dir``; ``add_rounds``: rounds in which the systems
  alternate (``--rounds``, or ``--repeats`` / ``--runs`` where a script named it so);
  ``add_calls_per_round``: ``--repeats``, the calls timed within a round (their median).

Device:

* ``device_from_args(args)``: checks the choice (``--device cuda`` without a CUDA device, or
  ``--precision amp`` on CPU, stop with a one-line error) and returns the ``torch.device``;
* ``train_flags`` / ``generate_flags`` / ``parse_flags``: what the device and precision add to a
  fairseq command line (``--cpu`` on CPU, exactly as the scripts passed before; on CUDA one GPU:
  :func:`fairseq_deep.runs.recipes.device`);
* ``describe(device)``: the device in words, for a report.

Timing:

* ``clock(device)``: ``time.perf_counter()`` after ``torch.cuda.synchronize()`` on CUDA, so that an
  in-process timing waits for the kernels it started; ``timed(fn, device)``, ``median_seconds``;
* ``alternated(measures, rounds)``: every measure once a round, in turn (A B C, A B C, ...), so
  that a slow moment of a shared machine hits all alike; ``interleaved_seconds``: the median
  seconds a call of each function, so measured;
* ``PeakMemory(device)``: peak CUDA memory allocated while a block runs (MiB, above what was
  allocated when it started); ``None`` on CPU.

Output: ``markdown_table`` (and ``markdown_row``), ``write_json``, ``logger(name)`` (progress lines
on stderr).  Models in process: ``dictionary``, ``build_model``, ``tiny_model`` (the tests' tiny
sizes: ``TINY``, ``TINY_RNMT``, ``TINY_DEEP_ATT``) and ``random_batch`` (the tests' batches):
``tests/helpers.py`` takes them from here; no benchmark imports the tests.

fairseq's runs (their command lines, settings, execution and output) are
:mod:`fairseq_deep.runs`'s: :class:`~fairseq_deep.runs.Run`, its :mod:`~fairseq_deep.runs.recipes`
and :func:`~fairseq_deep.runs.execute`.
"""

import argparse
import json
import os
import statistics
import sys
import time
from typing import Callable, Dict, List, Mapping, Optional, Sequence

import torch

# (fairseq_deep is imported inside the functions that need it: refactor_fingerprint.py imports this
# module before it imports the package, from --package-dir where it is told to)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

DEVICES = ("cuda", "cpu")

#: the precisions of --precision (fairseq_deep.runs.recipes.PRECISIONS: their flags)
PRECISION_NAMES = ("fp32", "fp16", "memory_efficient_fp16", "amp", "bf16")

#: the tests' tiny sizes (dropout off): the Transformer families', RNMT+'s (and the hybrids' RNMT+
#: parts'), Deep-Att's; tests/helpers.py and the benchmarks that build the tests' models take them
#: from here.  They are the widths of the families' declarations (``tiny_sizes``) written out, not
#: read from them, because refactor_fingerprint.py builds the same tiny models with two versions of
#: the package, this module imported before either: an older version may declare other tiny sizes,
#: or none (the declarations came with issue 39); tests/test_families.py checks that they agree.
TINY = [
    "--encoder-embed-dim",
    "16",
    "--decoder-embed-dim",
    "16",
    "--encoder-ffn-embed-dim",
    "32",
    "--decoder-ffn-embed-dim",
    "32",
    "--encoder-attention-heads",
    "2",
    "--decoder-attention-heads",
    "2",
    "--dropout",
    "0",
    "--attention-dropout",
    "0",
    "--activation-dropout",
    "0",
]
TINY_RNMT = [
    "--encoder-embed-dim",
    "16",
    "--decoder-embed-dim",
    "16",
    "--encoder-hidden-size",
    "16",
    "--decoder-hidden-size",
    "32",
    "--dropout",
    "0",
    "--attention-dropout",
    "0",
]
TINY_DEEP_ATT = [
    "--encoder-embed-dim",
    "16",
    "--decoder-embed-dim",
    "16",
    "--encoder-hidden-size",
    "16",
    "--decoder-hidden-size",
    "16",
    "--dropout",
    "0",
]

CUDA_ONLY_PRECISIONS = {"amp": "fairseq's --amp is CUDA autocast; on CPU it trains in float32"}


# ---------------------------------------------------------------------------------------------
# Options
# ---------------------------------------------------------------------------------------------


class _RawDescriptionAndDefaults(
    argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter
):
    pass


def parser(
    doc: str, full: bool = False, show_defaults: bool = False, epilog: Optional[str] = None
) -> argparse.ArgumentParser:
    """A script's argument parser: the first paragraph of its docstring ``doc`` as the description
    (``full``: the whole docstring, as written); ``epilog``: text after the options, as written;
    ``show_defaults``: each option's default after its help."""
    raw = full or epilog is not None
    formatter = {
        (False, False): argparse.HelpFormatter,
        (True, False): argparse.RawDescriptionHelpFormatter,
        (False, True): argparse.ArgumentDefaultsHelpFormatter,
        (True, True): _RawDescriptionAndDefaults,
    }[raw, show_defaults]
    return argparse.ArgumentParser(
        description=doc if full else doc.split("\n\n")[0], epilog=epilog, formatter_class=formatter
    )


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def add_device_argument(parser, precision: bool = False, note: str = ""):
    """Add ``--device`` (and ``--precision`` when ``precision``) to an argparse parser; ``note``:
    what the script measures differently, or not at all, on one of the devices."""
    parser.add_argument(
        "--device",
        choices=DEVICES,
        default=default_device(),
        help="where models run: fairseq runs get --cpu on cpu; in-process models and batches go to "
        "the device, timings synchronize CUDA before reading the clock (default: cuda when "
        "torch sees a CUDA device, else cpu; here: %(default)s)" + (". " + note if note else ""),
    )
    if precision:
        parser.add_argument(
            "--precision",
            choices=list(PRECISION_NAMES),
            default="fp32",
            help="fairseq's precision flag for the fairseq-train and fairseq-generate runs "
            "(fp16: --fp16, amp: --amp, bf16: --bf16; amp is CUDA only, and decodes with "
            "--fp16); in-process measurements stay float32 (default: %(default)s)",
        )
    return parser


def add_threads(parser, default=None, help=None):
    """``--threads N``: torch's threads (``set_threads``) and/or the OMP/MKL threads of a script's
    subprocesses (``thread_env``), as the script's ``help`` says."""
    parser.add_argument("--threads", type=int, default=default, help=help)


def add_json(parser, default=None, help=None):
    """``--json PATH``: where the script also writes its numbers (``write_json``)."""
    parser.add_argument("--json", default=default, help=help)


def add_work_dir(parser, default, help=None):
    """``--work-dir DIR``: the script's data, runs, logs and ``results.json``."""
    parser.add_argument("--work-dir", default=default, help=help)


def add_rounds(parser, default, flag="--rounds", help=None):
    """The number of rounds in which the systems alternate (``alternated``), under the name the
    script has always used (``--rounds``, ``--repeats``, ``--runs``)."""
    parser.add_argument(flag, type=int, default=default, help=help)


def add_calls_per_round(parser, default, help=None):
    """``--repeats``: the calls timed within one round of ``interleaved_seconds`` (their median)."""
    parser.add_argument("--repeats", type=int, default=default, help=help)


def set_threads(threads: Optional[int]):
    """torch's intra-op threads, where ``threads`` names a number (0 or None: torch's default)."""
    if threads:
        torch.set_num_threads(threads)


def thread_env(threads: Optional[int], env: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """A subprocess environment: ``env`` (default ``os.environ``) with ``OMP_NUM_THREADS`` and
    ``MKL_NUM_THREADS`` set to ``threads`` (0 or None: left as they are)."""
    env = dict(os.environ if env is None else env)
    if threads:
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    return env


# ---------------------------------------------------------------------------------------------
# Device
# ---------------------------------------------------------------------------------------------


def device_from_args(args) -> torch.device:
    """The ``torch.device`` of ``args.device``; stops with one line where it cannot run here."""
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit(
            f"error: --device cuda, but torch {torch.__version__} sees no CUDA device "
            "(torch.cuda.is_available() is False); run on a GPU machine or pass --device cpu"
        )
    precision = getattr(args, "precision", "fp32")
    if args.device == "cpu" and precision in CUDA_ONLY_PRECISIONS:
        raise SystemExit(
            f"error: --precision {precision} needs --device cuda "
            f"({CUDA_ONLY_PRECISIONS[precision]}); use fp32, fp16 or bf16 on CPU"
        )
    return torch.device(args.device)


def train_flags(device: str, precision: str = "fp32") -> List[str]:
    """Device and precision flags of a fairseq-train run: ``--cpu`` on CPU; on CUDA
    ``--distributed-world-size 1`` (one GPU, as the in-process measurements use; fairseq would
    otherwise train data-parallel on every visible GPU) (:func:`fairseq_deep.runs.recipes.device`)."""
    from fairseq_deep.runs import recipes

    return list(recipes.device(device, precision, "train"))


def generate_flags(device: str, precision: str = "fp32") -> List[str]:
    """Device and precision flags of a fairseq-generate run."""
    from fairseq_deep.runs import recipes

    return list(recipes.device(device, precision, "generate"))


def parse_flags(device: str):
    """The device flag of an in-process ``options.parse_args_and_arch`` (``--cpu`` on CPU, as the
    scripts passed before; it does not change the model that is built)."""
    return ["--cpu"] if device == "cpu" else []


def describe(device) -> str:
    """The device, in words, for a report."""
    device = torch.device(device)
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} (CUDA {torch.version.cuda})"
    return "CPU"


# ---------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------


def clock(device) -> float:
    """``time.perf_counter()``, after waiting for the device's queued kernels on CUDA."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def timed(fn: Callable, device):
    """``(fn(), the seconds it took)``, timed with :func:`clock`."""
    start = clock(device)
    out = fn()
    return out, clock(device) - start


def median_seconds(fn: Callable, repeats: int, device) -> float:
    """Seconds per call of ``fn``: the median of ``repeats`` calls, each timed with :func:`clock`."""
    return statistics.median(timed(fn, device)[1] for _ in range(repeats))


def alternated(
    measures: Mapping[str, Callable[[int], object]], rounds: int, shuffle=None
) -> Dict[str, List]:
    """Each measure's results over ``rounds`` rounds, in which every measure is called once, in
    turn (A B C, A B C, ...: a slow moment of a shared machine hits all alike), with the round's
    index.  ``shuffle`` (a ``random.Random``) shuffles the order of every round instead, so that no
    measure always runs first or right after another."""
    results = {name: [] for name in measures}
    for r in range(rounds):
        order = list(measures.items())
        if shuffle is not None:
            shuffle.shuffle(order)
        for name, measure in order:
            results[name].append(measure(r))
    return results


def interleaved_seconds(
    fns: Mapping[str, Callable], rounds: int, repeats: int, device, warmup: int = 0
) -> Dict[str, float]:
    """{name: seconds per call}: ``warmup`` calls of every fn in turn (TorchScript profiling runs,
    Triton compilation, cuDNN plans, the allocator), then ``rounds`` alternated rounds, each timing
    ``repeats`` calls of every fn (their median); the median over the rounds."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    clock(device)  # waits for the warm-up's kernels
    times = alternated(
        {name: (lambda r, fn=fn: median_seconds(fn, repeats, device)) for name, fn in fns.items()},
        rounds,
    )
    return {name: statistics.median(ts) for name, ts in times.items()}


class PeakMemory:
    """``with PeakMemory(device) as m: ...``; then ``m.mib`` is the peak of
    ``torch.cuda.max_memory_allocated`` during the block minus what was allocated when it began
    (activations, gradients, optimizer state, workspace: not the parameters and inputs that were
    already there), in MiB; ``None`` on CPU."""

    def __init__(self, device):
        self.device = torch.device(device)
        self.mib = None

    def __enter__(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
        return self

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.mib = (torch.cuda.max_memory_allocated(self.device) - self._base) / 2**20
        return False


# ---------------------------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------------------------


def markdown_row(cells: Sequence) -> str:
    """``| a | b | c |``: one row of a markdown table (``str`` of each cell)."""
    return "| " + " | ".join(str(c) for c in cells) + " |"


def markdown_table(header: Sequence, rows: Sequence[Sequence], align: str = "") -> str:
    """A markdown table: ``header`` the column names, ``rows`` the cells (``str`` of each),
    ``align`` a letter a column: ``l`` left (``---``), ``r`` right (``---:``); columns it leaves
    out are left-aligned."""
    rule = ["---:" if a == "r" else "---" for a in align.ljust(len(header), "l")]
    return "\n".join([markdown_row(header), markdown_row(rule), *(markdown_row(r) for r in rows)])


def write_json(path: str, obj, indent: int = 1, **kwargs) -> str:
    """``obj`` as JSON into ``path`` (``json.dump``'s ``kwargs``: ``default``, ``sort_keys``);
    returns ``path``."""
    with open(path, "w") as f:
        json.dump(obj, f, indent=indent, **kwargs)
    return path


def logger(name: str) -> Callable[[str], None]:
    """``log(msg)``: a progress line ``[name] msg`` on stderr (stdout keeps the tables)."""

    def log(msg: str):
        print(f"[{name}] {msg}", file=sys.stderr, flush=True)

    return log


# ---------------------------------------------------------------------------------------------
# Models in process
# ---------------------------------------------------------------------------------------------


def dictionary(symbols: int):
    """A fairseq ``Dictionary`` of its special symbols and ``symbols`` words ``w0``, ``w1``, ..."""
    from fairseq.data import Dictionary

    d = Dictionary()
    for i in range(symbols):
        d.add_symbol(f"w{i}")
    return d


def build_model(argv: Sequence[str], dictionary, device="cpu", seed: int = 1):
    """A model built as fairseq-train builds it, in process: fairseq's parser and ``--arch``
    presets on ``argv`` (``--arch`` and the model's flags), a translation task with ``dictionary``
    on both sides, torch's seed ``seed`` before the build; on ``device``."""
    from fairseq import options, tasks

    args = options.parse_args_and_arch(
        options.get_training_parser(),
        ["unused", "--task", "translation", *parse_flags(torch.device(device).type), *argv],
    )
    task = tasks.translation.TranslationTask(args, dictionary, dictionary)
    torch.manual_seed(seed)
    return task.build_model(args).to(device)


def tiny_model(arch: str, extra: Sequence[str] = (), dictionary=None, seed: int = 1):
    """A tiny model of ``arch`` (the tests' sizes of its family, :func:`tiny_flags`; ``extra``
    after them), in eval mode, and its translation task (a dictionary of 20 words unless given),
    torch's seed ``seed`` before the build.  fairseq's own architectures come without fairseq
    0.12.2's fused encoder fast path, as ours do (once a state dict is loaded, 0.12.2's own
    Transformer takes it and, with torch 2.x, fails on a padded batch)."""
    from fairseq import options, tasks

    from fairseq_deep.modules.common.better_transformer import without_better_transformer

    args = options.parse_args_and_arch(
        options.get_training_parser(),
        ["dummy-data", "--task", "translation", "--arch", arch, "--cpu", *tiny_flags(arch), *extra],
    )
    d = dictionary or tiny_dictionary()
    task = tasks.translation.TranslationTask(args, d, d)
    torch.manual_seed(seed)
    model = task.build_model(args)
    if not type(model).__module__.startswith("fairseq_deep"):
        for layer in getattr(model.encoder, "layers", []):
            without_better_transformer(layer)
    return model.eval(), task


def tiny_flags(arch: str) -> List[str]:
    """The tests' tiny sizes for a model family, by its ``--arch``."""
    if arch.startswith("rnmt_plus"):
        return TINY_RNMT
    if arch.startswith(("deep_att", "deep_ed")):
        return TINY_DEEP_ATT
    return TINY


def tiny_dictionary(n_symbols: int = 20):
    """The tests' dictionary: fairseq's specials and ``w0`` ... ``w{n-1}``."""
    return dictionary(n_symbols)


def random_batch(dictionary, bsz=3, src_len=7, tgt_len=5, seed=0, pad_last=True):
    """Token batches with real symbols and, when pad_last, padding on the left of one source
    (fairseq's left-padded source) and on the right of one target."""
    g = torch.Generator().manual_seed(seed)
    lo = dictionary.nspecial
    src = torch.randint(lo, len(dictionary), (bsz, src_len), generator=g)
    src[:, -1] = dictionary.eos()
    prev = torch.randint(lo, len(dictionary), (bsz, tgt_len), generator=g)
    prev[:, 0] = dictionary.eos()
    lengths = torch.full((bsz,), src_len)
    if pad_last and bsz > 1:
        src[-1, :2] = dictionary.pad()
        lengths[-1] = src_len - 2
    return src, lengths, prev
