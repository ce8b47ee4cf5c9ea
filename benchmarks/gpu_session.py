"""What a session with a lent GPU measures for issues 12, 15 and 16, in three calls of the device tool.

A GPU is lent to a session rarely and for 30 minutes of device time, 10 minutes a command, with
no package registry and only the checkout on the machine (``../shared/gpu/README.md``).  This script
turns that into three planned calls, each under its own time budget, each bringing back one
tarball of logs and tables whatever happens inside it:

    # here, on the CPU machine, once: fairseq's cp312 wheels and binarized Multi30K de-en into
    # .gpu/ (git-ignored; 24 MiB, the device tool carries 64 MiB)
    python benchmarks/gpu_session.py stage
    # then three calls of the device tool, each with carry [".gpu"] (the stage prints them):
    python3 benchmarks/gpu_session.py run check --out $OUT    # issue 12: -m gpu tests, precision matrix
    python3 benchmarks/gpu_session.py run speed --out $OUT    # issue 16: kernel and model speed ratios
    python3 benchmarks/gpu_session.py run study --out $OUT    # issue 15: 16 systems of the 5 papers

``run`` executes the phase's steps (``--list`` shows them, ``--dry-run`` prints the commands,
``--steps A,B`` runs only those, e.g. what a cut phase did not reach):
steps marked background start at once and run beside the later ones (the correctness runs of the
check phase share the GPU); timed steps run one after another, alone.  No step may outlast the
phase's ``--budget`` (default 535 s, under the tool's 600 s with the wheels' install before it): a
step's timeout is cut to what is left and a step that would get less than 30 s is skipped.  Each
step runs in its own process group in ``--work/PHASE/STEP`` and is killed with its children at its
timeout.  At the end (or on SIGTERM) the phase writes ``OUT/PHASE/summary.md`` (each step: exit
status, seconds, the command) and ``OUT/PHASE.tar.gz``: every file of the work folders but
checkpoints and binarized data, text files over 256 KiB cut to their last 256 KiB.  Each step's
stdout+stderr goes to ``--work/PHASE/STEP/STEP.log``, so that it (and a table a benchmark prints
only there, e.g. rnmt_speed's) is inside the tarball and the output folder holds two files per
phase, whatever the number of steps (the device tool brings back few files; issue 24).

The plan fits one 80 GB GPU and 10-minute commands (issue 24): the precision matrices cap their
concurrent runs by an estimate of each run's GPU memory (``precision_matrix.estimate_gb``, the
figures in docs/precision.md) within ``--memory-gb``, decode a tenth of the test set
(``--decode-shards 10``) and delete each run's checkpoints once it is decoded; the 1,000-update
runs are the two families whose loss scale collapsed, at 2,048 tokens a batch, beside the
40-update matrix; the speed phase's steps add up to its budget.
"""

import argparse
import glob
import io
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from typing import Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
GPU_DIR = os.path.join(ROOT, ".gpu")
SHARED = os.path.join(os.path.dirname(ROOT), "shared")


@dataclass
class Step:
    """One command of a phase.  ``argv`` may hold ``{py}`` (the Python running this script),
    ``{data}`` (binarized data), ``{spm}``, ``{ref}`` (raw test references), ``{work}`` (the
    step's own folder)."""

    name: str
    issue: int
    argv: List[str]
    timeout: int
    background: bool = False


def _gpu_test_files() -> List[str]:
    """The test files with GPU-marked tests (only these are collected: the GPU machine lacks some
    packages that other test files import, e.g. matplotlib)."""
    files = sorted(glob.glob(os.path.join(ROOT, "tests", "test_*.py")))
    return [os.path.relpath(f, ROOT) for f in files if "pytest.mark.gpu" in open(f).read()]


def _bench(script: str, *args: str) -> List[str]:
    return ["{py}", os.path.join("benchmarks", script + ".py"), *args]


#: issues 12 and 24, 1,000 updates in fp16 beside fp32 and AMP: the two recipes whose loss scale
#: collapsed (Deep-Att, Deep-ED; issue 24 keeps their parameters float32 under --fp16).  RNMT+ and
#: the post-norm DLCL, run here before, kept their scale and left the plan: 16 runs at once did not
#: reach 1,000 updates.  6 runs, 5.0 or 7.9 GB each (estimate_gb), at 2,048 tokens a batch
COLLAPSE_FAMILIES = ["deep_att_ff+deep_att_optim", "deep_ed_ff"]

#: GPU memory (GB) each matrix of the check phase may plan for; with the -m gpu tests' few GB
#: beside them they stay under the 80 GB of an H100
COLLAPSE_MEMORY_GB, MATRIX_MEMORY_GB = 40, 34

#: the study phase: the central comparison of each paper, one seed, 4.5 minutes per system at width 256
#: (16 systems at once; the baselines postnorm_6, baseline_6, transformer, noff_2x2 and baseline
#: come with their groups)
STUDY_GROUPS = ["wang:postnorm_20,prenorm_20,dlcl_20,dlcl_postnorm_20", "bapna:baseline_16,ta_16",
                "chen:rnmt_plus", "zhou:ff_5x3,noff_5x3", "dou:hierarchical,mla2"]

PHASES: Dict[str, List[Step]] = {
    "check": [
        Step("gpu_tests", 12, ["{py}", "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider",
                                  *_gpu_test_files()],
             300, background=True),
        Step("collapse_1000", 12, _bench(
            "precision_matrix", "--data", "{data}", "--scale", "paper", "--updates", "1000", "--log-interval", "50",
            "--precisions", "fp16", "fp32", "amp", "--families", *COLLAPSE_FAMILIES, "--max-tokens", "2048",
            "--jobs", "6", "--memory-gb", str(COLLAPSE_MEMORY_GB), "--decode-shards", "10", "--beam", "4",
            "--run-timeout", "420", "--work-dir", "{work}"), 470, background=True),
        Step("matrix_40", 12, _bench(
            "precision_matrix", "--data", "{data}", "--scale", "paper", "--updates", "40",
            "--precisions", "fp16", "amp", "bf16", "memory_efficient_fp16", "--jobs", "8",
            "--memory-gb", str(MATRIX_MEMORY_GB), "--decode-shards", "10", "--beam", "4",
            "--run-timeout", "120", "--work-dir", "{work}"), 470),
    ],
    # in the order of the issue's targets; the timeouts add up to the default budget less its reserve
    # (510 s).  dlcl_decode_step and ta_depth overhead were measured (issue 24) and left the plan;
    # dlcl_speed got 140 s for 60 updates (it was cut at 150 s doing 100)
    "speed": [
        Step("ln_lstm_kernel", 16, _bench("ln_lstm_kernel", "--device", "cuda", "--json", "{work}/ln_lstm_kernel.json"),
             65),
        Step("ff_lstm_kernel", 16, _bench("ln_lstm_kernel", "--device", "cuda", "--cell", "ff",
                                          "--json", "{work}/ff_lstm_kernel.json"), 40),
        Step("rnmt_speed", 16, _bench("rnmt_speed", "--device", "cuda", "--hidden", "512", "--encoder-layers", "6",
                                      "--decoder-layers", "6", "--batch", "64", "--rounds", "3", "--repeats", "2"), 85),
        Step("deep_att_speed", 16, _bench("deep_att_speed", "--device", "cuda", "--json", "{work}/deep_att.json"), 45),
        Step("deep_att_speed_triton", 16, _bench("deep_att_speed", "--device", "cuda", "--cell-impl", "triton",
                                                 "--json", "{work}/deep_att_triton.json"), 45),
        Step("aggregation_speed", 16, _bench(
            "aggregation_speed", "--device", "cuda", "--embed-dim", "512", "--ffn-dim", "2048", "--heads", "8",
            "--batch", "64", "--gen-batch", "64", "--rounds", "3", "--json", "{work}/aggregation.json"), 55),
        Step("dlcl_speed", 16, _bench(
            "dlcl_speed", "--device", "cuda", "--precision", "fp16", "--mode", "train", "--embed-dim", "512",
            "--ffn-dim", "2048", "--heads", "8", "--max-tokens", "8192", "--max-update", "60",
            "--skip-updates", "20", "--log-interval", "10", "--repeats", "2", "--synthetic-train", "10000",
            "--work-dir", "{work}"), 140),
        # what a decoding step costs on CUDA (fairseq's LSTMCell is one fused cell there, not on a CPU):
        # the launch- and compute-bound floors of the aggregation and recurrent generation targets
        Step("step_cost", 24, _bench("step_cost", "--device", "cuda", "--phase", "decode", "--gen-batch", "64",
                                     "--repeats", "3", "--json", "{work}/step_cost.json"), 35),
    ],
    "study": [
        Step("study", 15, ["{py}", "-m", "fairseq_deep.study", "--data", "{data}", "--spm", "{spm}", "--ref", "{ref}",
                           "--out", "{work}", *[w for g in STUDY_GROUPS for w in ("--group", g)],
                           "--depths", "6,16,20", "--width", "256", "--minutes", "4.5", "--seeds", "1",
                           "--jobs", "16", "--train-args=--fp16", "--progress-every", "60"], 480),
    ],
}

#: kept out of the tarball: checkpoints, binarized data, models
SKIPPED_SUFFIXES = (".pt", ".bin", ".idx", ".model", ".whl")
CUT_BYTES = 256 * 1024


def expand(argv: List[str], values: Dict[str, str]) -> List[str]:
    return [a.format(**values) for a in argv]


class Phase:
    """Runs the steps of one phase within ``budget`` seconds; see the module docstring."""

    def __init__(self, name: str, steps: List[Step], out: str, work: str, values: Dict[str, str],
                 budget: float, reserve: float = 25.0, min_step: float = 30.0):
        self.name, self.steps, self.values = name, steps, values
        self.out, self.work = os.path.join(out, name), os.path.join(work, name)
        self.deadline = time.monotonic() + budget - reserve
        self.min_step = min_step
        self.rows: List[Dict] = []
        self.running: List[tuple] = []  # (row, Popen, own deadline)

    def _start(self, step: Step) -> Optional[tuple]:
        left = self.deadline - time.monotonic()
        row = {"step": step, "status": "skipped", "seconds": 0.0, "timeout": 0.0}
        self.rows.append(row)
        if left < self.min_step:
            row["status"] = f"skipped ({left:.0f} s left of the budget)"
            return None
        work = os.path.join(self.work, step.name)
        os.makedirs(work, exist_ok=True)
        argv = expand(step.argv, dict(self.values, work=work))
        row.update(argv=argv, timeout=min(step.timeout, left), start=time.monotonic())
        log = open(os.path.join(work, f"{step.name}.log"), "w")  # into the tarball, not the output folder
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
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
        row["status"] = f"{stopped} after {row['seconds']:.0f} s" if stopped else f"exit {proc.returncode}"
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
            for step in self.steps:
                started = self._start(step)
                if started is not None:
                    self.running.append(started)
                    if not step.background:
                        self._wait([started])
                        self.running.remove(started)
            self._wait(self.running)
        except KeyboardInterrupt:  # SIGTERM or Ctrl-C: stop what runs, still write the report
            for row, proc, _ in self.running:
                self._finish(row, proc, "stopped (SIGTERM)")
        finally:
            self.report()

    def report(self):
        lines = [f"# Phase {self.name}", "", "| step | issue | status | seconds | command |", "| --- | --- | --- | --- | --- |"]
        for r in self.rows:
            cmd = " ".join(shlex.quote(a) for a in r.get("argv", []))
            lines.append(f"| {r['step'].name} | {r['step'].issue} | {r['status']} | {r['seconds']:.0f} | `{cmd}` |")
        with open(os.path.join(self.out, "summary.md"), "w") as f:
            f.write("\n".join(lines) + "\n")
        with tarfile.open(os.path.join(os.path.dirname(self.out), f"{self.name}.tar.gz"), "w:gz") as tar:
            for path in sorted(glob.glob(os.path.join(self.work, "**", "*"), recursive=True)):
                if os.path.isfile(path) and not path.endswith(SKIPPED_SUFFIXES) and "checkpoint" not in path:
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
        raise SystemExit(f"gpu_session.py stage: no wheels in {a.wheels} (see ../shared/gpu/README.md)")
    for w in found:
        shutil.copy(w, wheels)
    data = os.path.join(a.gpu_dir, "m30k")
    if not os.path.isfile(os.path.join(data, "spm.model")):
        src, tgt = a.pair.split("-")
        m = a.multi30k
        done = subprocess.run([sys.executable, "-m", "fairseq_deep.prepare", "-s", src, "-t", tgt, "--trainpref",
                               f"{m}/train", "--validpref", f"{m}/val", "--testpref", f"{m}/{a.test}", "--destdir",
                               data, "--vocab-size", str(a.vocab_size)], capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"gpu_session.py stage: fairseq_deep.prepare failed:\n{done.stderr[-3000:]}")
        shutil.copy(os.path.join(m, f"{a.test}.{tgt}.gz"), os.path.join(data, "ref.gz"))
    shutil.rmtree(os.path.join(data, "spm"), ignore_errors=True)  # the pieces: data-bin has them
    size = sum(os.path.getsize(p) for p in glob.glob(os.path.join(a.gpu_dir, "**", "*"), recursive=True)
               if os.path.isfile(p))
    if size > 60 * 2 ** 20:
        raise SystemExit(f"{a.gpu_dir} holds {size / 2 ** 20:.0f} MiB: the device tool carries 64 MiB at most")
    setup = ("python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/wheels/*.whl"
             " && export PYTHONPATH=/tmp/site:$PWD && nvidia-smi -L && ")
    print(f"{a.gpu_dir}: {size / 2 ** 20:.1f} MiB. The three device calls (carry [\".gpu\"], timeout_s 600):")
    for phase in PHASES:
        print(f"  {setup}python3 benchmarks/gpu_session.py run {phase} --out $OUT")


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def get_parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("stage", help="fill .gpu/ on this (CPU) machine")
    s.add_argument("--gpu-dir", default=GPU_DIR)
    s.add_argument("--wheels", default=os.path.join(SHARED, "gpu", "wheels"))
    s.add_argument("--multi30k", default=os.path.join(SHARED, "data", "multi30k"))
    s.add_argument("--pair", default="de-en")
    s.add_argument("--test", default="test_2016_flickr")
    s.add_argument("--vocab-size", type=int, default=8000)
    r = sub.add_parser("run", help="run one phase (on the GPU machine)")
    r.add_argument("phase", choices=list(PHASES))
    r.add_argument("--out", default=os.environ.get("OUT", os.path.join(ROOT, "bench_runs", "gpu_out")))
    r.add_argument("--work", default="/tmp/gpu_session", help="checkpoints and logs (not brought back)")
    r.add_argument("--data", default=os.path.join(GPU_DIR, "m30k", "data-bin"))
    r.add_argument("--spm", default=os.path.join(GPU_DIR, "m30k", "spm.model"))
    r.add_argument("--ref", default=os.path.join(GPU_DIR, "m30k", "ref.gz"))
    r.add_argument("--budget", type=float, default=535, help="seconds for the whole phase")
    r.add_argument("--steps", help="comma-separated step names: run only these (e.g. what a cut phase "
                                   "did not reach, in a later call)")
    r.add_argument("--list", action="store_true", help="list the steps and stop")
    r.add_argument("--dry-run", action="store_true", help="print the commands and stop")
    return p


def main(argv=None):
    a = get_parser().parse_args(argv)
    if a.command == "stage":
        return stage(a)
    values = {"py": sys.executable, "data": a.data, "spm": a.spm, "ref": a.ref}
    steps = PHASES[a.phase]
    if a.steps:
        wanted = a.steps.split(",")
        unknown = set(wanted) - {s.name for s in steps}
        if unknown:
            raise SystemExit(f"gpu_session.py: no step {', '.join(sorted(unknown))} in phase {a.phase}; it has "
                             + ", ".join(s.name for s in steps))
        steps = [s for s in steps if s.name in wanted]
    for step in steps if (a.list or a.dry_run) else []:
        line = f"{step.name} (issue {step.issue}, {step.timeout} s{', background' if step.background else ''})"
        print(line if a.list else line + ":\n  " + " ".join(
            shlex.quote(x) for x in expand(step.argv, dict(values, work=os.path.join(a.work, a.phase, step.name)))))
    if a.list or a.dry_run:
        return 0
    signal.signal(signal.SIGTERM, _interrupt)
    Phase(a.phase, steps, a.out, a.work, values, a.budget).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
