"""What a GPU window measures: the steps of the plan, most valuable first (:data:`STEPS`).

A step is one command line, run from the repository root by :mod:`gpu_window` within the window's
budget; :mod:`gpu_session` picks the steps the ledger does not hold as measured.  The steps' own
scripts are fairseq-deep-prepare (the data, every window: :data:`DATA`), the benchmarks (``{py} -m
benchmarks.NAME``) and the ``-m gpu`` tests; the study's groups are steps too, one per window
(:mod:`gpu_study`).  tests/test_gpu_session.py parses every step's command line with its script's
own parser.
"""

import glob
import os
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

#: the repository root (the steps run there)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclass
class Step:
    """One command of the plan.  ``argv`` may hold ``{py}`` (the Python running this script),
    ``{raw}`` (Multi30K's raw text, carried), ``{prepared}`` (where :data:`DATA` prepares it),
    ``{vocab}``, ``{data}`` (binarized data), ``{spm}``, ``{ref}`` (raw test references),
    ``{work}`` (the step's own folder).  A ``setup`` step runs first in every window, alone,
    whatever the ledger holds (a failed one skips the rest); a ``first`` step (a study group) runs
    next, alone; a ``concurrent`` step starts with the others of its kind and runs beside them; the
    others are timed and run alone, once every concurrent step has ended."""

    name: str
    issue: int
    argv: List[str]
    timeout: int
    concurrent: bool = False
    #: takes a window of its own: a window runs it only when nothing else is pending (or when named)
    own_window: bool = False
    setup: bool = False
    first: bool = False
    #: files of its work folder that the window copies into its output folder as they change
    #: (``OUT/window/STEP.FILE``): what it has measured comes back even if the call is cut
    live: Tuple[str, ...] = ()
    #: what ``gpu_session.py run --tiny`` adds to its command to run it on this CPU at tiny size
    #: (the last value of an option wins); a step without is left out of a tiny window
    tiny: Optional[List[str]] = None


def expand(argv: List[str], values: Dict[str, str]) -> List[str]:
    """A step's command line with its placeholders (``{py}``, ``{data}``, ...) filled."""
    return [a.format(**values) for a in argv]


def _gpu_test_files() -> List[str]:
    """The test files with GPU-marked tests (only these are collected: the GPU machine lacks some
    packages that other test files import, e.g. matplotlib)."""
    files = sorted(glob.glob(os.path.join(ROOT, "tests", "test_*.py")))
    return [os.path.relpath(f, ROOT) for f in files if "pytest.mark.gpu" in open(f).read()]


def _bench(script: str, *args: str) -> List[str]:
    """The command of a benchmark script: ``{py} -m benchmarks.SCRIPT ARGS`` (run from the root)."""
    return ["{py}", "-m", f"benchmarks.{script}", *args]


#: issues 12 and 24, 1,000 updates in fp16 beside fp32 and AMP: the two recipes whose loss scale
#: collapsed (Deep-Att, Deep-ED; issue 24 keeps their parameters float32 under --fp16).  6 runs,
#: 5.0 or 7.9 GB each (estimate_gb), at 2,048 tokens a batch
COLLAPSE_FAMILIES = ["deep_att_ff+deep_att_optim", "deep_ed_ff"]

#: GPU memory (GB) each matrix may plan for; with the -m gpu tests and fully sharded training
#: beside them they stay under the 80 GB of an H100
COLLAPSE_MEMORY_GB, MATRIX_MEMORY_GB = 40, 34

#: Multi30K de-en, sentencepiece 8k joint, prepared on the GPU machine from the raw text that
#: travels in .gpu/multi30k (gpu_session.py stage): every window's first step
DATA = Step(
    "data",
    38,
    [
        "{py}",
        "-m",
        "fairseq_deep.prepare",
        "-s",
        "de",
        "-t",
        "en",
        "--trainpref",
        "{raw}/train",
        "--validpref",
        "{raw}/val",
        "--testpref",
        "{raw}/test_2016_flickr",
        "--destdir",
        "{prepared}",
        "--vocab-size",
        "{vocab}",
        "--workers",
        "8",
        "--quiet",
    ],
    90,
    setup=True,
)

#: Everything a GPU window measures besides the study's groups (which come first, one a window:
#: gpu_study.py), most valuable first (issue 31's order): the -m gpu tests, the 1,000-update fp16
#: runs and fully sharded training beside each other; then the speed ratios one at a time (the
#: issue's targets); then the 40-update precision matrix, which takes a window of its own.  The
#: timeouts of the timed steps are each step's own need.
STEPS: List[Step] = [
    DATA,
    Step(
        "gpu_tests",
        31,
        ["{py}", "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", *_gpu_test_files()],
        240,
        concurrent=True,
    ),
    Step(
        "collapse_1000",
        31,
        _bench(
            "precision_matrix",
            "--data",
            "{data}",
            "--scale",
            "paper",
            "--updates",
            "1000",
            "--log-interval",
            "50",
            "--precisions",
            "fp16",
            "fp32",
            "amp",
            "--families",
            *COLLAPSE_FAMILIES,
            "--max-tokens",
            "2048",
            "--jobs",
            "6",
            "--memory-gb",
            str(COLLAPSE_MEMORY_GB),
            "--decode-shards",
            "10",
            "--beam",
            "4",
            "--run-timeout",
            "260",
            "--work-dir",
            "{work}",
        ),
        280,
        concurrent=True,
    ),
    Step(
        "fsdp_check",
        31,
        _bench(
            "fsdp_check",
            "--data",
            "{data}",
            "--work",
            "{work}/runs",
            "--json",
            "{work}/fsdp.json",
            "--jobs",
            "4",
            "--budget",
            "260",
        ),
        280,
        concurrent=True,
    ),
    # fairseq issues #4275, #4307: a fully sharded run saved with --use-sharded-state (a shard per
    # GPU) decodes with fairseq-generate (the shards consolidated on loading) and resumes
    Step(
        "fsdp_sharded_state",
        38,
        _bench(
            "fsdp_check",
            "--data",
            "{data}",
            "--work",
            "{work}/runs",
            "--json",
            "{work}/fsdp_sharded.json",
            "--only",
            "dlcl_30_6:c10d_fp32",
            "dlcl_30_6:fsdp_fp32_sharded",
            "--budget",
            "200",
        ),
        220,
        concurrent=True,
    ),
    # timed, alone: in the order of the issue's targets.  dlcl_speed got 140 s for 60 updates
    Step(
        "ln_lstm_kernel",
        31,
        _bench("ln_lstm_kernel", "--device", "cuda", "--json", "{work}/ln_lstm_kernel.json"),
        65,
    ),
    Step(
        "ff_lstm_kernel",
        31,
        _bench(
            "ln_lstm_kernel",
            "--device",
            "cuda",
            "--cell",
            "ff",
            "--json",
            "{work}/ff_lstm_kernel.json",
        ),
        40,
    ),
    Step(
        "rnmt_speed",
        31,
        _bench(
            "rnmt_speed",
            "--device",
            "cuda",
            "--hidden",
            "512",
            "--encoder-layers",
            "6",
            "--decoder-layers",
            "6",
            "--batch",
            "64",
            "--rounds",
            "3",
            "--repeats",
            "2",
        ),
        85,
    ),
    Step(
        "deep_att_speed",
        31,
        _bench("deep_att_speed", "--device", "cuda", "--json", "{work}/deep_att.json"),
        45,
    ),
    Step(
        "aggregation_speed",
        31,
        _bench(
            "aggregation_speed",
            "--device",
            "cuda",
            "--embed-dim",
            "512",
            "--ffn-dim",
            "2048",
            "--heads",
            "8",
            "--batch",
            "64",
            "--gen-batch",
            "64",
            "--rounds",
            "3",
            "--json",
            "{work}/aggregation.json",
        ),
        55,
    ),
    # what a decoding step costs on CUDA: the launch- and compute-bound floors of the targets above,
    # and a profile of each system's decoding (issue 38/47: where the time goes in the decoding
    # steps whose GPU targets were missed: Deep-Att, MLA-3, linear and iterative aggregation)
    Step(
        "step_cost",
        31,
        _bench(
            "step_cost",
            "--device",
            "cuda",
            "--phase",
            "decode",
            "--gen-batch",
            "64",
            "--repeats",
            "3",
            "--json",
            "{work}/step_cost.json",
            "--profile",
            "{work}/profile.md",
        ),
        120,
    ),
    Step(
        "deep_att_speed_triton",
        31,
        _bench(
            "deep_att_speed",
            "--device",
            "cuda",
            "--cell-impl",
            "triton",
            "--json",
            "{work}/deep_att_triton.json",
        ),
        45,
    ),
    Step(
        "dlcl_speed",
        31,
        _bench(
            "dlcl_speed",
            "--device",
            "cuda",
            "--precision",
            "fp16",
            "--mode",
            "train",
            "--embed-dim",
            "512",
            "--ffn-dim",
            "2048",
            "--heads",
            "8",
            "--max-tokens",
            "8192",
            "--max-update",
            "60",
            "--skip-updates",
            "20",
            "--log-interval",
            "10",
            "--repeats",
            "2",
            "--synthetic-train",
            "10000",
            "--work-dir",
            "{work}",
        ),
        140,
    ),
    # issue 47: what mHC's Sinkhorn-Knopp iterations cost on a GPU (the CPU's kernel counts:
    # docs/deep_schemes.md), training and decoding, against hyper-connections and pre-norm
    Step(
        "mhc_sinkhorn",
        47,
        _bench(
            "step_cost",
            "--device",
            "cuda",
            "--group",
            "schemes",
            "--gen-batch",
            "64",
            "--repeats",
            "3",
            "--json",
            "{work}/mhc_sinkhorn.json",
        ),
        75,
    ),
    # a window of their own.  Issue 47, item 2: the own-data recipe as a new user runs it on a GPU
    # (fp16, the recipe's CUDA defaults: a 30-layer DLCL at Base width, a short MINUTES; run.sh
    # itself keeps to MINUTES, decoding included)
    Step(
        "own_data_fp16",
        47,
        ["{py}", ".ci/gpu/gpu_own_data.py", "--raw", "{raw}", "--work", "{work}"]
        + ["--arch", "transformer_dlcl_30l", "--minutes", "6", "--precision=--fp16"],
        420,
        own_window=True,
        tiny=["--arch", "transformer_dlcl", "--minutes", "0", "--precision=", "--env"]
        + ["DEVICE=--cpu", "WIDTH=16", "MAX_UPDATE=4", "VOCAB=40", "MAX_TOKENS=512", "WARMUP=2"]
        + ["BEAM=1", "AVERAGE=0"],
    ),
    Step(
        "matrix_40",
        31,
        _bench(
            "precision_matrix",
            "--data",
            "{data}",
            "--scale",
            "paper",
            "--updates",
            "40",
            "--precisions",
            "fp16",
            "amp",
            "bf16",
            "memory_efficient_fp16",
            "--jobs",
            "8",
            "--memory-gb",
            str(MATRIX_MEMORY_GB),
            "--decode-shards",
            "10",
            "--beam",
            "4",
            "--run-timeout",
            "120",
            "--work-dir",
            "{work}",
        ),
        470,
        concurrent=True,
        own_window=True,
    ),
    # issue 47, item 4: distillation on a GPU: the deep teacher's (24 + 6 DLCL, Base width, fp16)
    # translation of the training set (sentences/s, the hours a WMT-sized set would take) and the
    # student's CTranslate2 speed (gpu_session.py stage carries CTranslate2) against the teacher's
    # fairseq-generate; the minutes of training are short: the step measures speed, not quality
    Step(
        "distill_gpu",
        47,
        _bench(
            "distill",
            "--device",
            "cuda",
            "--precision",
            "fp16",
            "--multi30k",
            "{raw}",
            "--work-dir",
            "{work}",
            "--teacher-layers",
            "24",
            "6",
            "--width",
            "512",
            "--teacher-minutes",
            "1.5",
            "--minutes",
            "0.75",
            "--systems",
            "distilled",
            "--threads",
            "4",
        ),
        440,
        own_window=True,
        live=("results.json", "results.md"),
    ),
]
