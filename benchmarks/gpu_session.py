"""What a session with a lent GPU measures, in the one call of the device tool that its 15 minutes hold.

A GPU is lent to a session rarely and for 15 minutes of device time, start-up (a few minutes),
idle time and every call included, 10 minutes a command, with no package registry and only the
checkout on the machine (``../shared/gpu/README.md``).  This script turns that into one prepared
call of about 8 minutes that measures the most valuable things first and brings back one tarball
whatever happens inside it; what a window did not reach is what the next window runs, told by the
ledger of what has been measured (``benchmarks/gpu_ledger.json``, committed):

    # here, on the CPU machine, once: fairseq's and fairscale's cp312 wheels and binarized
    # Multi30K de-en into .gpu/ (git-ignored; 24 MiB, the device tool carries 64 MiB)
    python -m benchmarks.gpu_session stage
    python -m benchmarks.gpu_session plan              # what the next window runs (the ledger's gaps)
    # then one call of the device tool, carry [".gpu"] (the stage prints it):
    python3 -m benchmarks.gpu_session run --out $OUT
    # back here: the window's results into the ledger (then commit it with the docs' tables)
    python -m benchmarks.gpu_session record OUT/window/summary.json --commit $(git rev-parse --short HEAD)

A window takes the steps of :data:`STEPS` that the ledger does not hold as measured (exit 0), in
order (``--steps A,B`` names them instead, ``--all`` ignores the ledger).  Steps marked
``concurrent`` (correctness: tests, training runs whose losses are compared, not timed) start at once
and share the GPU, within ``--concurrent-budget`` seconds; then the timed steps run one after
another, alone on the GPU, until ``--budget`` (default 500 s, under the tool's 600 s with the
wheels' install before it).  A step's timeout is cut to what is left and a step that would get less
than 30 s is skipped.  Each step runs in its own process group in ``--work/window/STEP`` and is
killed with its children at its timeout.  At the end (or on SIGTERM) the window writes
``OUT/window/summary.md`` and ``summary.json`` (each step: exit status, seconds, the command) and
``OUT/window.tar.gz``: every file of the work folders but checkpoints and binarized data, text
files over 256 KiB cut to their last 256 KiB.  Each step's stdout+stderr goes to
``--work/window/STEP/STEP.log``, inside the tarball (the device tool brings back few files).

The concurrent steps fit one 80 GB GPU (issue 24): the precision matrices cap their concurrent runs
by an estimate of each run's GPU memory (``precision_matrix.estimate_gb``, the figures in
docs/precision.md) within ``--memory-gb``, decode a tenth of the test set (``--decode-shards 10``)
and delete each run's checkpoints once it is decoded; fully sharded training
(``fsdp_check.py``) runs 4 trainings at once at 2,048 tokens.
"""

if __name__ == "__main__" and not __package__:  # run as a file, the package's imports would fail
    raise SystemExit(
        "benchmarks/gpu_session.py is a module of the benchmarks package: run it from the "
        "repository root as python -m benchmarks.gpu_session"
    )

import glob
import io
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from datetime import date
from typing import Dict, List, Optional

from . import harness

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = harness.ROOT
GPU_DIR = os.path.join(ROOT, ".gpu")
SHARED = os.path.join(os.path.dirname(ROOT), "shared")


@dataclass
class Step:
    """One command of the plan.  ``argv`` may hold ``{py}`` (the Python running this script),
    ``{data}`` (binarized data), ``{spm}``, ``{ref}`` (raw test references), ``{work}`` (the
    step's own folder).  A ``concurrent`` step starts at once and runs beside the others; the
    others are timed and run alone, once every concurrent step has ended."""

    name: str
    issue: int
    argv: List[str]
    timeout: int
    concurrent: bool = False
    #: takes a window of its own: a window runs it only when nothing else is pending (or when named)
    own_window: bool = False


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

#: the study: the central comparison of each paper, one seed, 4.5 minutes per system at width 256
#: (16 systems at once; the baselines postnorm_6, baseline_6, transformer, noff_2x2 and baseline
#: come with their groups)
STUDY_GROUPS = [
    "wang:postnorm_20,prenorm_20,dlcl_20,dlcl_postnorm_20",
    "bapna:baseline_16,ta_16",
    "chen:rnmt_plus",
    "zhou:ff_5x3,noff_5x3",
    "dou:hierarchical,mla2",
]

#: Everything a GPU window measures, most valuable first (issue 31's order): the -m gpu tests, the
#: 1,000-update fp16 runs and fully sharded training beside each other; then the speed ratios one
#: at a time (the issue's targets); then the 40-update precision matrix and the study, which take a
#: window of their own.  The timeouts of the timed steps are each step's own need.
STEPS: List[Step] = [
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
    # what a decoding step costs on CUDA: the launch- and compute-bound floors of the targets above
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
        ),
        90,
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
    # a window of their own
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
    Step(
        "study",
        31,
        [
            "{py}",
            "-m",
            "fairseq_deep.study",
            "--data",
            "{data}",
            "--spm",
            "{spm}",
            "--ref",
            "{ref}",
            "--out",
            "{work}",
            *[w for g in STUDY_GROUPS for w in ("--group", g)],
            "--depths",
            "6,16,20",
            "--width",
            "256",
            "--minutes",
            "4.5",
            "--seeds",
            "1",
            "--jobs",
            "16",
            "--train-args=--fp16",
            "--progress-every",
            "60",
        ],
        480,
        concurrent=True,
        own_window=True,
    ),
]

LEDGER = os.path.join(HERE, "gpu_ledger.json")


#: kept out of the tarball: checkpoints, binarized data, models
SKIPPED_SUFFIXES = (".pt", ".bin", ".idx", ".model", ".whl")
CUT_BYTES = 256 * 1024


def expand(argv: List[str], values: Dict[str, str]) -> List[str]:
    return [a.format(**values) for a in argv]


class Phase:
    """Runs the steps of one phase within ``budget`` seconds; see the module docstring."""

    def __init__(
        self,
        name: str,
        steps: List[Step],
        out: str,
        work: str,
        values: Dict[str, str],
        budget: float,
        reserve: float = 25.0,
        min_step: float = 30.0,
        concurrent_budget: Optional[float] = None,
    ):
        self.name, self.steps, self.values = name, steps, values
        self.out, self.work = os.path.join(out, name), os.path.join(work, name)
        self.deadline = time.monotonic() + budget - reserve
        #: the concurrent steps end by then (the timed ones get the rest)
        self.concurrent_deadline = min(
            self.deadline, time.monotonic() + (concurrent_budget or budget)
        )
        self.min_step = min_step
        self.rows: List[Dict] = []
        self.running: List[tuple] = []  # (row, Popen, own deadline)

    def _start(self, step: Step) -> Optional[tuple]:
        left = (self.concurrent_deadline if step.concurrent else self.deadline) - time.monotonic()
        row = {"step": step, "status": "skipped", "seconds": 0.0, "timeout": 0.0}
        self.rows.append(row)
        if left < self.min_step:
            row["status"] = f"skipped ({left:.0f} s left of the budget)"
            return None
        work = os.path.join(self.work, step.name)
        os.makedirs(work, exist_ok=True)
        argv = expand(step.argv, dict(self.values, work=work))
        row.update(argv=argv, timeout=min(step.timeout, left), start=time.monotonic())
        log = open(
            os.path.join(work, f"{step.name}.log"), "w"
        )  # into the tarball, not the output folder
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        proc = subprocess.Popen(
            argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        log.close()
        print(f"[{self.name}] {step.name}: started (timeout {row['timeout']:.0f} s)", flush=True)
        return row, proc, row["start"] + row["timeout"]

    def _finish(self, row, proc, stopped: str = ""):
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()
        row["seconds"] = time.monotonic() - row["start"]
        row["status"] = (
            f"{stopped} after {row['seconds']:.0f} s" if stopped else f"exit {proc.returncode}"
        )
        print(f"[{self.name}] {row['step'].name}: {row['status']}", flush=True)

    def _wait(self, items: list):
        """Wait until every item of ``items`` has ended or reached its deadline."""
        while items:
            now = time.monotonic()
            for item in list(items):
                row, proc, end = item
                if proc.poll() is not None or now >= end:
                    self._finish(row, proc, "" if proc.poll() is not None else "timed out")
                    items.remove(item)
            if items:
                time.sleep(0.5)

    def run(self):
        os.makedirs(self.out, exist_ok=True)
        try:
            for step in sorted(
                self.steps, key=lambda st: not st.concurrent
            ):  # concurrent ones first
                if not step.concurrent and self.running:
                    self._wait(self.running)  # a timed step runs alone
                    self.running = []
                started = self._start(step)
                if started is not None:
                    self.running.append(started)
                    if not step.concurrent:
                        self._wait([started])
                        self.running.remove(started)
            self._wait(self.running)
        except KeyboardInterrupt:  # SIGTERM or Ctrl-C: stop what runs, still write the report
            for row, proc, _ in self.running:
                self._finish(row, proc, "stopped (SIGTERM)")
        finally:
            self.report()

    def report(self):
        table = harness.markdown_table(
            ["step", "issue", "status", "seconds", "command"],
            [
                [
                    r["step"].name,
                    r["step"].issue,
                    r["status"],
                    f"{r['seconds']:.0f}",
                    "`" + " ".join(shlex.quote(a) for a in r.get("argv", [])) + "`",
                ]
                for r in self.rows
            ],
        )
        lines = [f"# Phase {self.name}", "", *table.splitlines()]
        with open(os.path.join(self.out, "summary.md"), "w") as f:
            f.write("\n".join(lines) + "\n")
        harness.write_json(
            os.path.join(self.out, "summary.json"),
            [
                {"step": r["step"].name, "status": r["status"], "seconds": round(r["seconds"], 1)}
                for r in self.rows
            ],
        )
        with tarfile.open(
            os.path.join(os.path.dirname(self.out), f"{self.name}.tar.gz"), "w:gz"
        ) as tar:
            for path in sorted(glob.glob(os.path.join(self.work, "**", "*"), recursive=True)):
                if (
                    os.path.isfile(path)
                    and not path.endswith(SKIPPED_SUFFIXES)
                    and "checkpoint" not in path
                ):
                    _add_cut(tar, path, os.path.relpath(path, os.path.dirname(self.work)))
        print("\n".join(lines), flush=True)


def _add_cut(tar: tarfile.TarFile, path: str, name: str):
    """``path`` into ``tar`` as ``name``; a file over CUT_BYTES as its last CUT_BYTES."""
    size = os.path.getsize(path)
    if size <= CUT_BYTES:
        tar.add(path, arcname=name)
        return
    with open(path, "rb") as f:
        f.seek(size - CUT_BYTES)
        data = b"[... cut: the last %d of %d bytes]\n" % (CUT_BYTES, size) + f.read()
    info = tarfile.TarInfo(name)
    info.size, info.mtime = len(data), int(os.path.getmtime(path))
    tar.addfile(info, io.BytesIO(data))


def stage(a):
    """Fill ``.gpu/``: the wheels, Multi30K binarized (sentencepiece 8k joint), the raw references."""
    wheels = os.path.join(a.gpu_dir, "wheels")
    os.makedirs(wheels, exist_ok=True)
    found = glob.glob(os.path.join(a.wheels, "*.whl"))
    if not found:
        raise SystemExit(
            f"gpu_session.py stage: no wheels in {a.wheels} (see ../shared/gpu/README.md)"
        )
    for w in found:
        shutil.copy(w, wheels)
    data = os.path.join(a.gpu_dir, "m30k")
    if not os.path.isfile(os.path.join(data, "spm.model")):
        src, tgt = a.pair.split("-")
        m = a.multi30k
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "fairseq_deep.prepare",
                "-s",
                src,
                "-t",
                tgt,
                "--trainpref",
                f"{m}/train",
                "--validpref",
                f"{m}/val",
                "--testpref",
                f"{m}/{a.test}",
                "--destdir",
                data,
                "--vocab-size",
                str(a.vocab_size),
            ],
            capture_output=True,
            text=True,
        )
        if done.returncode:
            raise SystemExit(
                f"gpu_session.py stage: fairseq_deep.prepare failed:\n{done.stderr[-3000:]}"
            )
        shutil.copy(os.path.join(m, f"{a.test}.{tgt}.gz"), os.path.join(data, "ref.gz"))
    shutil.rmtree(os.path.join(data, "spm"), ignore_errors=True)  # the pieces: data-bin has them
    size = sum(
        os.path.getsize(p)
        for p in glob.glob(os.path.join(a.gpu_dir, "**", "*"), recursive=True)
        if os.path.isfile(p)
    )
    if size > 60 * 2**20:
        raise SystemExit(
            f"{a.gpu_dir} holds {size / 2**20:.0f} MiB: the device tool carries 64 MiB at most"
        )
    print(f'{a.gpu_dir}: {size / 2**20:.1f} MiB. The device call (carry [".gpu"], timeout_s 560):')
    print(f"  {DEVICE_COMMAND}")


#: the device tool's command: the wheels (fairseq, fairscale and their pure-Python needs), then a window
#: (the checkout first on PYTHONPATH: fairscale's wheel brings a top-level package named benchmarks too)
DEVICE_COMMAND = (
    "python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/wheels/*.whl"
    " && export PYTHONPATH=$PWD:/tmp/site && nvidia-smi -L && python3 -m benchmarks.gpu_session run "
    "--out $OUT"
)


def read_ledger(path: str = LEDGER) -> Dict[str, Dict]:
    """What has been measured: step -> {date, commit, device, status, seconds} of its last window."""
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f)


def measured(entry: Optional[Dict]) -> bool:
    return bool(entry) and entry.get("status") == "exit 0"


def pending(ledger: Dict[str, Dict]) -> List[Step]:
    """The steps a window runs: those the ledger does not hold as measured, in :data:`STEPS`' order;
    a step that takes a window of its own once nothing else is left."""
    left = [s for s in STEPS if not measured(ledger.get(s.name))]
    return [s for s in left if not s.own_window] or left[:1]


def record(a):
    """The summary of a window (``OUT/window/summary.json``) into the ledger: a step that ran gets
    its status, the date, the commit and the device; one the window skipped stays as it was."""
    ledger = read_ledger(a.ledger)
    with open(a.summary) as f:
        rows = json.load(f)
    for row in rows:
        if row["status"].startswith("skipped"):
            continue
        ledger[row["step"]] = {
            "date": a.date,
            "commit": a.commit,
            "device": a.device,
            "status": row["status"],
            "seconds": row["seconds"],
        }
    with open(a.ledger, "w") as f:
        json.dump(ledger, f, indent=1, sort_keys=True)
        f.write("\n")
    print(
        f"{a.ledger}: {sum(measured(v) for v in ledger.values())} of {len(STEPS)} steps measured; next: "
        + (", ".join(s.name for s in pending(ledger)) or "nothing")
    )


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def get_parser():
    p = harness.parser(__doc__, epilog=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("stage", help="fill .gpu/ on this (CPU) machine")
    s.add_argument("--gpu-dir", default=GPU_DIR)
    s.add_argument("--wheels", default=os.path.join(SHARED, "gpu", "wheels"))
    s.add_argument("--multi30k", default=os.path.join(SHARED, "data", "multi30k"))
    s.add_argument("--pair", default="de-en")
    s.add_argument("--test", default="test_2016_flickr")
    s.add_argument("--vocab-size", type=int, default=8000)
    r = sub.add_parser("run", help="run a window (on the GPU machine)")
    r.add_argument(
        "--out", default=os.environ.get("OUT", os.path.join(ROOT, "bench_runs", "gpu_out"))
    )
    r.add_argument(
        "--work", default="/tmp/gpu_session", help="checkpoints and logs (not brought back)"
    )
    r.add_argument("--data", default=os.path.join(GPU_DIR, "m30k", "data-bin"))
    r.add_argument("--spm", default=os.path.join(GPU_DIR, "m30k", "spm.model"))
    r.add_argument("--ref", default=os.path.join(GPU_DIR, "m30k", "ref.gz"))
    r.add_argument("--budget", type=float, default=500, help="seconds for the whole window")
    r.add_argument(
        "--concurrent-budget",
        type=float,
        default=280,
        help="seconds for the concurrent steps; the timed ones get the rest",
    )
    r.add_argument(
        "--steps", help="comma-separated step names: run these (default: what the ledger lacks)"
    )
    r.add_argument("--all", action="store_true", help="every step, whatever the ledger holds")
    r.add_argument("--ledger", default=LEDGER)
    r.add_argument("--list", action="store_true", help="list the steps and stop")
    r.add_argument("--dry-run", action="store_true", help="print the commands and stop")
    sub.add_parser(
        "plan", help="what the next window runs (the steps the ledger lacks)"
    ).add_argument("--ledger", default=LEDGER)
    c = sub.add_parser("record", help="a window's summary.json into the ledger")
    c.add_argument("summary")
    c.add_argument("--commit", required=True, help="the commit the window ran")
    c.add_argument("--device", default="one NVIDIA GPU")
    c.add_argument("--date", default=date.today().isoformat())
    c.add_argument("--ledger", default=LEDGER)
    return p


def main(argv=None):
    a = get_parser().parse_args(argv)
    if a.command == "stage":
        return stage(a)
    if a.command == "record":
        return record(a)
    if a.command == "plan":
        ledger = read_ledger(a.ledger)
        for step in STEPS:
            entry = ledger.get(step.name)
            done = (
                f"measured {entry['date']} at {entry['commit']} on {entry['device']}"
                if measured(entry)
                else "to run"
            )
            kind = "own window" if step.own_window else "concurrent" if step.concurrent else "timed"
            print(f"{step.name:22} {kind:10} {step.timeout:4d} s  {done}")
        return 0
    values = {"py": sys.executable, "data": a.data, "spm": a.spm, "ref": a.ref}
    steps = STEPS if a.all else pending(read_ledger(a.ledger))
    if a.steps:
        wanted = a.steps.split(",")
        unknown = set(wanted) - {s.name for s in STEPS}
        if unknown:
            raise SystemExit(
                f"gpu_session.py: no step {', '.join(sorted(unknown))}; the steps are "
                + ", ".join(s.name for s in STEPS)
            )
        steps = [s for s in STEPS if s.name in wanted]
    for step in steps if (a.list or a.dry_run) else []:
        line = f"{step.name} (issue {step.issue}, {step.timeout} s{', concurrent' if step.concurrent else ''})"
        print(
            line
            if a.list
            else line
            + ":\n  "
            + " ".join(
                shlex.quote(x)
                for x in expand(
                    step.argv, dict(values, work=os.path.join(a.work, "window", step.name))
                )
            )
        )
    if a.list or a.dry_run:
        return 0
    signal.signal(signal.SIGTERM, _interrupt)
    Phase(
        "window", steps, a.out, a.work, values, a.budget, concurrent_budget=a.concurrent_budget
    ).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
