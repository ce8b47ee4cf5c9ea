"""A GPU window run within its budget: the steps of one phase, each in its own process group, and
the report and tarball written whatever happens (:class:`Phase`; gpu_session.py's ``run``).

The ``setup`` steps run first, one at a time (a failed one skips the rest of the phase), then the
``first`` ones (a study group), each alone; then the steps marked ``concurrent`` start at once and
share the GPU, within the concurrent budget (counted from the phase's start); then the timed steps
run one after another, alone on the GPU, until the budget.  A step's timeout is cut to what is left
and a step that would get less than ``min_step`` seconds is skipped; each is killed with its
children at its timeout.  A step's ``live`` files are copied to ``OUT/NAME/STEP.FILE`` whenever
they change, while it runs.  At the end (or on SIGTERM: :exc:`KeyboardInterrupt`) the phase writes
``OUT/NAME/summary.md`` and ``summary.json`` (each step: exit status, seconds, the command) and
``OUT/NAME.tar.gz``: every file of the work folders but checkpoints and binarized data, text files
over 256 KiB cut to their last 256 KiB.  Each step's stdout+stderr goes to
``WORK/NAME/STEP/STEP.log``, inside the tarball (the device tool brings back few files).
"""

import glob
import io
import json
import os
import shlex
import shutil
import signal
import subprocess
import tarfile
import time
from typing import Dict, List, Optional

from gpu_steps import ROOT, Step, expand

#: kept out of the tarball: checkpoints, binarized data, models
SKIPPED_SUFFIXES = (".pt", ".bin", ".idx", ".model", ".whl")
CUT_BYTES = 256 * 1024


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
        self.failed_setup: Optional[str] = None
        self.copied: Dict[str, float] = {}  # live file -> the mtime copied

    def _start(self, step: Step) -> Optional[tuple]:
        alone = step.setup or step.first or not step.concurrent
        left = (self.deadline if alone else self.concurrent_deadline) - time.monotonic()
        row = {"step": step, "status": "skipped", "seconds": 0.0, "timeout": 0.0}
        self.rows.append(row)
        if self.failed_setup:
            row["status"] = f"skipped (the setup step {self.failed_setup} failed)"
            return None
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

    def _copy_live(self, step: Step):
        """The step's ``live`` files that changed since last copied, into the output folder."""
        for name in step.live:
            source = os.path.join(self.work, step.name, name)
            try:
                mtime = os.path.getmtime(source)
            except OSError:
                continue
            if self.copied.get(source) != mtime:
                target = os.path.join(self.out, f"{step.name}.{name}")
                shutil.copyfile(source, target + ".tmp")
                os.replace(target + ".tmp", target)
                self.copied[source] = mtime

    def _wait(self, items: list):
        """Wait until every item of ``items`` has ended or reached its deadline."""
        while items:
            now = time.monotonic()
            for item in list(items):
                row, proc, end = item
                self._copy_live(row["step"])
                if proc.poll() is not None or now >= end:
                    self._finish(row, proc, "" if proc.poll() is not None else "timed out")
                    self._copy_live(row["step"])
                    items.remove(item)
            if items:
                time.sleep(0.5)

    def run(self):
        os.makedirs(self.out, exist_ok=True)
        order = {True: 0, False: 1}
        try:  # setup, then first, then concurrent, then timed steps
            for step in sorted(
                self.steps,
                key=lambda st: (order[st.setup], order[st.first], order[st.concurrent]),
            ):
                alone = step.setup or step.first or not step.concurrent
                if alone and self.running:
                    self._wait(self.running)  # a timed step runs alone
                    self.running = []
                started = self._start(step)
                if started is not None:
                    self.running.append(started)
                    if alone:
                        self._wait([started])
                        self.running.remove(started)
                        if step.setup and started[0]["status"] != "exit 0":
                            self.failed_setup = step.name
            self._wait(self.running)
        except KeyboardInterrupt:  # SIGTERM or Ctrl-C: stop what runs, still write the report
            for row, proc, _ in self.running:
                self._finish(row, proc, "stopped (SIGTERM)")
                self._copy_live(row["step"])
        finally:
            self.report()

    def report(self):
        rows = [
            [
                r["step"].name,
                r["step"].issue,
                r["status"],
                f"{r['seconds']:.0f}",
                "`" + " ".join(shlex.quote(a) for a in r.get("argv", [])) + "`",
            ]
            for r in self.rows
        ]
        table = [["step", "issue", "status", "seconds", "command"], ["---"] * 5, *rows]
        lines = [
            f"# Phase {self.name}",
            "",
            *("| " + " | ".join(map(str, r)) + " |" for r in table),
        ]
        with open(os.path.join(self.out, "summary.md"), "w") as f:
            f.write("\n".join(lines) + "\n")
        with open(os.path.join(self.out, "summary.json"), "w") as f:
            json.dump(
                [
                    {
                        "step": r["step"].name,
                        "status": r["status"],
                        "seconds": round(r["seconds"], 1),
                    }
                    for r in self.rows
                ],
                f,
                indent=1,
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
