"""What a session with a lent GPU measures, in the one call of the device tool that its 15 minutes hold.

A GPU is lent to a session rarely and for 15 minutes of device time, start-up (a few minutes),
idle time and every call included, 10 minutes a command, with no package registry and only the
checkout on the machine (``../shared/gpu/README.md``).  This script turns that into one prepared
call of about 8 minutes that measures the most valuable things first and brings back what it
measured whatever happens inside it; what a window did not reach is what the next window runs,
told by the ledgers of what has been measured (``.ci/gpu/ledger.json`` for the steps,
``.ci/gpu/study_ledger.json`` for the study's groups: committed):

    # here, on the CPU machine, in the checkout the session was started in (the device tool
    # sends that one), once: fairseq's and fairscale's cp312 wheels, Multi30K de-en's raw text
    # and CTranslate2 (cp312, repacked as xz) into .gpu/ (git-ignored; 46 MiB, the device tool
    # carries 64 MiB)
    python .ci/gpu/gpu_session.py stage
    python .ci/gpu/gpu_session.py plan              # the next window: its group, its commands
    # then one call of the device tool, carry [".gpu"] (plan and stage print it):
    python3 .ci/gpu/gpu_session.py run --out $OUT
    # back here: the window's results into the ledgers, docs/study.md's section from them
    python .ci/gpu/gpu_session.py record OUT/window/summary.json --commit C --device "NVIDIA H100 ..."
    python .ci/gpu/gpu_session.py docs

A window runs, in order: the data (``data``: Multi30K de-en prepared on the GPU machine,
sentencepiece 8k joint, from the raw text that travels), then the next group of the study that
the study ledger holds no entry of (a step of its own, alone on the GPU: :mod:`gpu_study`), then
the steps of :data:`STEPS` that the ledger does not hold as measured (exit 0), in order, where
the budget leaves room (``--steps A,B`` names steps instead, ``--all`` ignores the ledgers).
Steps marked ``concurrent`` (correctness: tests, training runs whose losses are compared, not
timed) start together and share the GPU, within ``--concurrent-budget`` seconds of the window's
start; then the timed steps run one after another, alone on the GPU, until ``--budget`` (default
500 s, under the tool's 600 s with the wheels' install before it).  A step's timeout is cut to
what is left and a step that would get less than 30 s is skipped.  Each step runs in its own
process group in ``--work/window/STEP`` and is killed with its children at its timeout.  The
study's ``results.json`` and ``results.md`` are copied to ``OUT/window/STEP.results.*`` as each
system ends; at the end (or on SIGTERM) the window writes ``OUT/window/summary.md`` and
``summary.json`` (each step: exit status, seconds, the command) and ``OUT/window.tar.gz``: every
file of the work folders but checkpoints and binarized data, text files over 256 KiB cut to their
last 256 KiB.  Each step's stdout+stderr goes to ``--work/window/STEP/STEP.log``, inside the
tarball (the device tool brings back few files).

``run --tiny`` runs the window's data step and study group on this CPU at tiny size (width 16, a
few updates, the raw text of ``--raw``; a step's ``tiny`` options say how, and a step without is
left out): the window's own script and commands, checked before a GPU is spent on them
(tests/test_gpu_session.py).  Its results are no measurement: ``record``
refuses them for the committed study ledger (give ``--study-ledger FILE`` to look at them).

The plan's steps are :mod:`gpu_steps`, the study's groups :mod:`gpu_study`, the runner of a
window :mod:`gpu_window`; this file is the command line and the steps' ledger.  Plain files beside
each other, run as a script (Python puts this folder first on ``sys.path``); the steps' own
scripts run from the repository root, the checkout first on ``PYTHONPATH`` (fairscale's wheel
brings a top-level package named ``benchmarks`` too).

The concurrent steps fit one 80 GB GPU (issue 24): the precision matrices cap their concurrent runs
by an estimate of each run's GPU memory (``precision_matrix.estimate_gb``, the figures in
docs/precision.md) within ``--memory-gb``, decode a tenth of the test set (``--decode-shards 10``)
and delete each run's checkpoints once it is decoded; fully sharded training
(``fsdp_check.py``) runs 4 trainings at once at 2,048 tokens.
"""

import argparse
import dataclasses
import glob
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from datetime import date
from typing import Dict, List, Optional

import gpu_study
from gpu_steps import ROOT, STEPS, Step, expand
from gpu_window import Phase

HERE = os.path.dirname(os.path.abspath(__file__))
GPU_DIR = os.path.join(ROOT, ".gpu")
SHARED = os.path.join(os.path.dirname(ROOT), "shared")
LEDGER = os.path.join(HERE, "ledger.json")
#: Multi30K's raw files that a window prepares (train, validation, the test set of the references)
RAW_FILES = [
    f"{split}.{lang}.gz" for split in ("train", "val", "test_2016_flickr") for lang in ("de", "en")
]


def stage(a):
    """Fill ``.gpu/``: the wheels and Multi30K de-en's raw text (a window prepares it there)."""
    wheels = os.path.join(a.gpu_dir, "wheels")
    os.makedirs(wheels, exist_ok=True)
    found = glob.glob(os.path.join(a.wheels, "*.whl"))
    if not found:
        raise SystemExit(
            f"gpu_session.py stage: no wheels in {a.wheels} (see ../shared/gpu/README.md)"
        )
    for w in found:
        shutil.copy(w, wheels)
    raw = os.path.join(a.gpu_dir, "multi30k")
    os.makedirs(raw, exist_ok=True)
    missing = [f for f in RAW_FILES if not os.path.isfile(os.path.join(a.multi30k, f))]
    if missing:
        raise SystemExit(f"gpu_session.py stage: {a.multi30k} lacks {', '.join(missing)}")
    for name in RAW_FILES:
        shutil.copy(os.path.join(a.multi30k, name), raw)
    if a.ctranslate2:
        print(stage_ctranslate2(a.gpu_dir, a.ctranslate2))
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


#: CTranslate2 for the GPU machine's Python (cp312), which has no registry: the wheel (41 MiB)
#: would take .gpu/ past the 64 MiB the device tool carries beside fairseq's, so ``stage``
#: repacks its files as xz (24 MiB) and ``run`` unpacks them where the steps import from
#: (:func:`unpack_ctranslate2`)
CT2_ARCHIVE, CT2_PYTHON = "ctranslate2-cp312.tar.xz", (3, 12)


def stage_ctranslate2(gpu_dir: str, requirement: str) -> str:
    """``requirement``'s cp312 manylinux wheel, fetched by pip from the registry, repacked as
    ``gpu_dir/CT2_ARCHIVE`` (its files as the wheel installs them); returns what was done."""
    target = os.path.join(gpu_dir, CT2_ARCHIVE)
    with tempfile.TemporaryDirectory() as tmp:
        fetch = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", tmp, requirement]
        fetch += ["--python-version", "3.12", "--platform", "manylinux_2_28_x86_64"]
        done = subprocess.run(fetch + ["--only-binary=:all:"], capture_output=True, text=True)
        wheels = glob.glob(os.path.join(tmp, "*.whl"))
        if done.returncode or not wheels:
            raise SystemExit(
                f"gpu_session.py stage: pip could not fetch {requirement} for cp312 "
                f"({(done.stderr.strip().splitlines() or ['no wheel'])[-1]}); give "
                "--ctranslate2 '' to stage without it (the distillation's CTranslate2 rows then "
                "fail)"
            )
        with zipfile.ZipFile(wheels[0]) as z, tarfile.open(target + ".tmp", "w:xz") as tar:
            for info in z.infolist():
                if info.is_dir():
                    continue
                member = tarfile.TarInfo(info.filename)
                member.size, member.mode = info.file_size, (info.external_attr >> 16) or 0o644
                with z.open(info) as f:
                    tar.addfile(member, f)
        os.replace(target + ".tmp", target)
        name = os.path.basename(wheels[0])
    return f"{target}: {name} repacked ({os.path.getsize(target) / 2**20:.1f} MiB)"


def unpack_ctranslate2(gpu_dir: str, work: str) -> Optional[str]:
    """The staged CTranslate2 (:func:`stage_ctranslate2`) unpacked into ``work/site``, that folder
    put on the steps' ``PYTHONPATH``; only on the Python it was built for (elsewhere the one
    installed serves), and where it was staged.  Returns the folder, or None."""
    archive = os.path.join(gpu_dir, CT2_ARCHIVE)
    if sys.version_info[:2] != CT2_PYTHON or not os.path.isfile(archive):
        return None
    site = os.path.join(work, "site")
    with tarfile.open(archive) as tar:
        tar.extractall(site, filter="data")
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join(paths + [site])
    return site


#: the device tool's command: the wheels (fairseq, fairscale and their pure-Python needs), then a window
#: (the checkout first on PYTHONPATH: fairscale's wheel brings a top-level package named benchmarks too)
DEVICE_COMMAND = (
    "python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/wheels/*.whl"
    " && export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 && nvidia-smi -L && python3 "
    ".ci/gpu/gpu_session.py run --out $OUT"
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
    """The steps of :data:`STEPS` a window runs after its group: those the ledger does not hold as
    measured, in order (the setup steps aside: every window runs them); a step that takes a window
    of its own once nothing else is left."""
    left = [s for s in STEPS if not s.setup and not measured(ledger.get(s.name))]
    return [s for s in left if not s.own_window] or left[:1]


def window(ledger: Dict[str, Dict], study_ledger: List[Dict]) -> List[Step]:
    """What the next window runs: the setup steps, the study's next group (the first part without
    an entry in the study ledger), then :func:`pending`'s steps; with every group run, the steps
    alone (a step of a window of its own once nothing else is left)."""
    setup = [s for s in STEPS if s.setup]
    part = gpu_study.next_part(study_ledger)
    if part is None:
        return setup + pending(ledger)
    group = [s for s in gpu_study.steps() if s.name == part.name]
    return setup + group + [s for s in pending(ledger) if not s.own_window]


def all_steps() -> List[Step]:
    """Every step: the setup, the study's parts, then :data:`STEPS`' others."""
    return [s for s in STEPS if s.setup] + gpu_study.steps() + [s for s in STEPS if not s.setup]


def record(a):
    """The summary of a window (``OUT/window/summary.json``) into the ledgers: a step that ran gets
    its status, the date, the commit and the device in ledger.json (a skipped one and the setup
    stay as they were); a study group's results go into the study ledger, one entry per system."""
    ledger = read_ledger(a.ledger)
    with open(a.summary) as f:
        rows = json.load(f)
    study = ""
    if any(row["step"].startswith("study_") for row in rows):  # first: it may refuse the window
        added = gpu_study.record(a.summary, a.date, a.commit, a.device, a.study_ledger)
        study = f"; {added} study entries into {a.study_ledger} (then: gpu_session.py docs)"
    setup = {s.name for s in STEPS if s.setup}
    for row in rows:
        if row["status"].startswith("skipped") or row["step"] in setup:
            continue
        if row["step"].startswith("study_"):  # the study ledger's (below)
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
        f"{a.ledger}: {sum(measured(v) for v in ledger.values())} of {len(STEPS) - len(setup)} "
        "steps measured; next: " + (", ".join(s.name for s in pending(ledger)) or "nothing") + study
    )


def plan(a):
    """The next window (its group, its device call, its commands), then every group and step."""
    ledger, study_ledger = read_ledger(a.ledger), gpu_study.read_ledger(a.study_ledger)
    steps = window(ledger, study_ledger)
    part = gpu_study.next_part(study_ledger)
    where = argparse.Namespace(work="/tmp/gpu_session", raw=".gpu/multi30k", vocab_size=8000)
    values = dict(values_of(where), py="python3")
    print('The next window (carry [".gpu"], timeout_s 560; .gpu/ from gpu_session.py stage):')
    print(f"  {DEVICE_COMMAND}")
    if part is not None:
        print(
            f"runs the data, then the study's {part.group} group"
            + (f" (window {part.index} of {part.of})" if part.of > 1 else "")
            + f": {part.name}, {len(part.systems)} systems side by side "
            f"({', '.join(part.systems)}; {part.memory_gb:g} GB estimated), "
            f"{gpu_study.MINUTES:g} minutes each or to a plateau; its command:"
        )
        work = f"{where.work}/window/{part.name}"
        argv = expand(gpu_study.study_argv(part), dict(values, work=work))
        print("  " + " ".join(shlex.quote(x) for x in argv))
    rest = [s.name for s in steps if not s.setup and not s.first]
    print("then, where the budget leaves room: " + (", ".join(rest) or "nothing"))
    print("\nThe study's groups (gpu_study.py; the ledger .ci/gpu/study_ledger.json):")
    done = {e["part"]: e for e in study_ledger}
    for p in gpu_study.parts():
        e = done.get(p.name)
        state = f"run {e['date']} at {e['commit']} on {e['device']}" if e else "to run"
        print(f"  {p.name:22} {len(p.systems)} systems, {p.memory_gb:5.1f} GB  {state}")
    print("\nThe steps (gpu_steps.py; the ledger .ci/gpu/ledger.json):")
    for step in STEPS:
        entry = ledger.get(step.name)
        done_ = (
            f"measured {entry['date']} at {entry['commit']} on {entry['device']}"
            if measured(entry)
            else "every window"
            if step.setup
            else "to run"
        )
        kind = (
            "setup"
            if step.setup
            else "own window"
            if step.own_window
            else "concurrent"
            if step.concurrent
            else "timed"
        )
        print(f"  {step.name:22} {kind:10} {step.timeout:4d} s  {done_}")
    return 0


def _interrupt(signum, frame):
    raise KeyboardInterrupt


#: where a window finds Multi30K's raw text (stage puts it there) and its vocabulary's size
VALUES = {"raw": os.path.join(GPU_DIR, "multi30k"), "vocab": "8000"}


def values_of(a) -> Dict[str, str]:
    """The placeholders' values of a window: the raw text, where it is prepared, the data."""
    prepared = os.path.join(a.work, "m30k")
    return {
        "py": sys.executable,
        "raw": a.raw,
        "prepared": prepared,
        "vocab": str(a.vocab_size),
        "data": os.path.join(prepared, "data-bin"),
        "spm": os.path.join(prepared, "spm.model"),
        "ref": os.path.join(a.raw, "test_2016_flickr.en.gz"),
    }


def tiny(step: Step) -> Step:
    """A step of the window at tiny size on this CPU: its ``tiny`` options after its own (the
    study's groups: :data:`gpu_study.TINY_ARGS`), run alone; the setup as it is."""
    if step.setup:
        return step
    return dataclasses.replace(step, argv=step.argv + step.tiny, first=True)


def _installed(distribution: str) -> Optional[str]:
    """The version of ``distribution`` installed here, or None."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


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
    here = _installed("ctranslate2")  # the version the CPU's tests and benchmarks run
    s.add_argument(
        "--ctranslate2",
        default=f"ctranslate2=={here}" if here else "ctranslate2",
        help="CTranslate2 to stage for the GPU machine (a pip requirement; '' : none)",
    )
    r = sub.add_parser("run", help="run a window (on the GPU machine)")
    r.add_argument(
        "--out", default=os.environ.get("OUT", os.path.join(ROOT, "bench_runs", "gpu_out"))
    )
    r.add_argument(
        "--work", default="/tmp/gpu_session", help="checkpoints and logs (not brought back)"
    )
    r.add_argument("--raw", default=VALUES["raw"], help="Multi30K de-en's raw text (stage's)")
    r.add_argument("--vocab-size", type=int, default=int(VALUES["vocab"]))
    r.add_argument("--budget", type=float, default=500, help="seconds for the whole window")
    r.add_argument(
        "--concurrent-budget",
        type=float,
        default=280,
        help="seconds for the concurrent steps; the timed ones get the rest",
    )
    r.add_argument(
        "--steps", help="comma-separated step names: run these (default: what the ledgers lack)"
    )
    r.add_argument("--all", action="store_true", help="every step, whatever the ledgers hold")
    r.add_argument("--ledger", default=LEDGER)
    r.add_argument("--study-ledger", default=gpu_study.STUDY_LEDGER)
    r.add_argument("--list", action="store_true", help="list the steps and stop")
    r.add_argument("--dry-run", action="store_true", help="print the commands and stop")
    r.add_argument(
        "--tiny",
        action="store_true",
        help="on this CPU: the data step and the window's steps that have tiny options (the study "
        "group: width 16, a few updates) at tiny size, a check of the window's script; the other "
        "steps are left out",
    )
    pl = sub.add_parser("plan", help="what the next window runs (what the ledgers lack)")
    pl.add_argument("--ledger", default=LEDGER)
    pl.add_argument("--study-ledger", default=gpu_study.STUDY_LEDGER)
    c = sub.add_parser("record", help="a window's summary.json into the ledgers")
    c.add_argument("summary")
    c.add_argument("--commit", required=True, help="the commit the window ran")
    c.add_argument("--device", required=True, help="the GPU, as the device tool names it")
    c.add_argument("--date", default=date.today().isoformat())
    c.add_argument("--ledger", default=LEDGER)
    c.add_argument("--study-ledger", default=gpu_study.STUDY_LEDGER)
    d = sub.add_parser(
        "docs", help="docs/study.md's section 'At Base width on a GPU' from the ledger"
    )
    d.add_argument("--study-ledger", default=gpu_study.STUDY_LEDGER)
    d.add_argument("--doc", default=gpu_study.DOC)
    return p


def main(argv=None):
    a = get_parser().parse_args(argv)
    if a.command == "stage":
        return stage(a)
    if a.command == "record":
        return record(a)
    if a.command == "plan":
        return plan(a)
    if a.command == "docs":
        changed = gpu_study.write_doc(a.study_ledger, a.doc)
        print(f"{a.doc}: {'rewritten' if changed else 'unchanged'} from {a.study_ledger}")
        return 0
    values = values_of(a)
    every = all_steps()
    steps = every if a.all else window(read_ledger(a.ledger), gpu_study.read_ledger(a.study_ledger))
    if a.steps:
        wanted = a.steps.split(",")
        unknown = set(wanted) - {s.name for s in every}
        if unknown:
            raise SystemExit(
                f"gpu_session.py: no step {', '.join(sorted(unknown))}; the steps are "
                + ", ".join(s.name for s in every)
            )
        steps = [s for s in every if s.setup or s.name in wanted]
    if a.tiny:
        steps = [tiny(s) for s in steps if s.setup or s.tiny is not None]
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
    site = unpack_ctranslate2(GPU_DIR, a.work)
    if site:
        print(f"CTranslate2 unpacked into {site} (on the steps' PYTHONPATH)", flush=True)
    signal.signal(signal.SIGTERM, _interrupt)
    phase = Phase(
        "window", steps, a.out, a.work, values, a.budget, concurrent_budget=a.concurrent_budget
    )
    phase.run()
    return 0 if all(r["status"] == "exit 0" for r in phase.rows) or not a.tiny else 1


if __name__ == "__main__":
    sys.exit(main())
