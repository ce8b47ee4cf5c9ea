"""What a session with a lent GPU measures, in the one call of the device tool that its 15 minutes hold.

A GPU is lent to a session rarely and for 15 minutes of device time, start-up (a few minutes),
idle time and every call included, 10 minutes a command, with no package registry and only the
checkout on the machine (``../shared/gpu/README.md``).  This script turns that into one prepared
call of about 8 minutes that measures the most valuable things first and brings back one tarball
whatever happens inside it; what a window did not reach is what the next window runs, told by the
ledger of what has been measured (``.ci/gpu/ledger.json``, committed):

    # here, on the CPU machine, once: fairseq's and fairscale's cp312 wheels and binarized
    # Multi30K de-en into .gpu/ (git-ignored; 24 MiB, the device tool carries 64 MiB)
    python .ci/gpu/gpu_session.py stage
    python .ci/gpu/gpu_session.py plan              # what the next window runs (the ledger's gaps)
    # then one call of the device tool, carry [".gpu"] (the stage prints it):
    python3 .ci/gpu/gpu_session.py run --out $OUT
    # back here: the window's results into the ledger (then commit it with the docs' tables)
    python .ci/gpu/gpu_session.py record OUT/window/summary.json --commit $(git rev-parse --short HEAD)

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

The plan's steps are :mod:`gpu_steps`, the runner of a window :mod:`gpu_window`; this file is the
command line and the ledger.  Plain files beside each other, run as a script (Python puts this
folder first on ``sys.path``); the steps' own scripts run from the repository root, the checkout
first on ``PYTHONPATH`` (fairscale's wheel brings a top-level package named ``benchmarks`` too).

The concurrent steps fit one 80 GB GPU (issue 24): the precision matrices cap their concurrent runs
by an estimate of each run's GPU memory (``precision_matrix.estimate_gb``, the figures in
docs/precision.md) within ``--memory-gb``, decode a tenth of the test set (``--decode-shards 10``)
and delete each run's checkpoints once it is decoded; fully sharded training
(``fsdp_check.py``) runs 4 trainings at once at 2,048 tokens.
"""

import argparse
import glob
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
from datetime import date
from typing import Dict, List, Optional

from gpu_steps import ROOT, STEPS, Step, expand
from gpu_window import Phase

HERE = os.path.dirname(os.path.abspath(__file__))
GPU_DIR = os.path.join(ROOT, ".gpu")
SHARED = os.path.join(os.path.dirname(ROOT), "shared")
LEDGER = os.path.join(HERE, "ledger.json")


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
    " && export PYTHONPATH=$PWD:/tmp/site && nvidia-smi -L && python3 .ci/gpu/gpu_session.py run "
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
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
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
