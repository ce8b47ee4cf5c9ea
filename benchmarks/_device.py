"""``--device cuda|cpu`` and ``--precision`` of every benchmark script, written once.

* ``add_device_argument(parser)``: ``--device`` (default: ``cuda`` when torch sees a CUDA device,
  else ``cpu``); ``precision=True`` adds ``--precision`` (fairseq's flags for the fairseq-train /
  fairseq-generate runs of a script: ``fp32`` (none), ``--fp16``, ``--memory-efficient-fp16``,
  ``--amp``, ``--bf16``).
* ``device_from_args(args)``: checks the choice (``--device cuda`` without a CUDA device, or
  ``--precision amp`` on CPU, stop with a one-line error) and returns the ``torch.device``.
* ``train_flags`` / ``generate_flags``: what the device and precision add to a fairseq command
  line (``--cpu`` on CPU, exactly as the scripts passed before; on CUDA one GPU).
* ``clock(device)``: ``time.perf_counter()`` after ``torch.cuda.synchronize()`` on CUDA, so that an
  in-process timing waits for the kernels it started.
* ``PeakMemory(device)``: peak CUDA memory allocated while a block runs (MiB, above what was
  allocated when it started); ``None`` on CPU.
"""

import statistics
import time

import torch

DEVICES = ("cuda", "cpu")

# --precision: (fairseq-train flags, fairseq-generate flags); fairseq-generate has no --amp, so
# AMP-trained models decode in --fp16 (precision_matrix.py uses the same table)
PRECISIONS = {
    "fp32": ([], []),
    "fp16": (["--fp16"], ["--fp16"]),
    "memory_efficient_fp16": (["--memory-efficient-fp16"], ["--fp16"]),
    "amp": (["--amp"], ["--fp16"]),
    "bf16": (["--bf16"], ["--bf16"]),
}

CUDA_ONLY_PRECISIONS = {"amp": "fairseq's --amp is CUDA autocast; on CPU it trains in float32"}


def median_seconds(fn, repeats: int, device) -> float:
    """Seconds per call of ``fn``: the median of ``repeats`` calls, each timed with :func:`clock`."""
    times = []
    for _ in range(repeats):
        t0 = clock(device)
        fn()
        times.append(clock(device) - t0)
    return statistics.median(times)


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def add_device_argument(parser, precision: bool = False, note: str = ""):
    """Add ``--device`` (and ``--precision`` when ``precision``) to an argparse parser; ``note``:
    what the script measures differently, or not at all, on one of the devices."""
    parser.add_argument(
        "--device", choices=DEVICES, default=default_device(),
        help="where models run: fairseq runs get --cpu on cpu; in-process models and batches go to "
             "the device, timings synchronize CUDA before reading the clock (default: cuda when "
             "torch sees a CUDA device, else cpu; here: %(default)s)" + (". " + note if note else ""))
    if precision:
        parser.add_argument(
            "--precision", choices=list(PRECISIONS), default="fp32",
            help="fairseq's precision flag for the fairseq-train and fairseq-generate runs "
                 "(fp16: --fp16, amp: --amp, bf16: --bf16; amp is CUDA only, and decodes with "
                 "--fp16); in-process measurements stay float32 (default: %(default)s)")
    return parser


def device_from_args(args) -> torch.device:
    """The ``torch.device`` of ``args.device``; stops with one line where it cannot run here."""
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"error: --device cuda, but torch {torch.__version__} sees no CUDA device "
                         "(torch.cuda.is_available() is False); run on a GPU machine or pass --device cpu")
    precision = getattr(args, "precision", "fp32")
    if args.device == "cpu" and precision in CUDA_ONLY_PRECISIONS:
        raise SystemExit(f"error: --precision {precision} needs --device cuda "
                         f"({CUDA_ONLY_PRECISIONS[precision]}); use fp32, fp16 or bf16 on CPU")
    return torch.device(args.device)


def train_flags(device: str, precision: str = "fp32"):
    """Device and precision flags of a fairseq-train run: ``--cpu`` on CPU; on CUDA
    ``--distributed-world-size 1`` (one GPU, as the in-process measurements use; fairseq would
    otherwise train data-parallel on every visible GPU)."""
    return (["--cpu"] if device == "cpu" else ["--distributed-world-size", "1"]) + PRECISIONS[precision][0]


def generate_flags(device: str, precision: str = "fp32"):
    """Device and precision flags of a fairseq-generate run."""
    return (["--cpu"] if device == "cpu" else []) + PRECISIONS[precision][1]


def parse_flags(device: str):
    """The device flag of an in-process ``options.parse_args_and_arch`` (``--cpu`` on CPU, as the
    scripts passed before; it does not change the model that is built)."""
    return ["--cpu"] if device == "cpu" else []


def clock(device) -> float:
    """``time.perf_counter()``, after waiting for the device's queued kernels on CUDA."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


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
            self.mib = (torch.cuda.max_memory_allocated(self.device) - self._base) / 2 ** 20
        return False


def describe(device) -> str:
    """The device, in words, for a report."""
    device = torch.device(device)
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} (CUDA {torch.version.cuda})"
    return "CPU"
