"""Running a study: every (system, seed) as a :class:`RunState`, ``--jobs`` at a time, each through
separate steps: :meth:`Study.train` (with :meth:`Study.grow_stages` before it for a grown system),
:meth:`Study.decode`, :meth:`Study.score` and :func:`record` (``result.json``, which a second
invocation finds and keeps); progress lines with :mod:`fairseq_deep.progress`'s ETA."""

import concurrent.futures
import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

from .. import runs
from ..errors import UserError
from ..prepare import read_lines as read_text
from ..progress import TrainingProgress
from .commands import generate_run, stage_runs, train_run
from .commands import precision as precision_of
from .systems import System

logger = logging.getLogger("fairseq_deep.study")


@dataclass
class RunState:
    system: System
    seed: int
    run_dir: str
    status: str = "queued"  # queued, training, decoding, done, failed
    started: Optional[float] = None
    start_update: Optional[int] = None
    error: Optional[str] = None
    result: Optional[dict] = None

    @property
    def label(self) -> str:
        return f"{self.system.key} seed {self.seed}"

    def path(self, name: str) -> str:
        return os.path.join(self.run_dir, name)

    def fail(self, error: str):
        self.error, self.status = error, "failed"


def learning_curve(series: dict) -> Tuple[List[List[float]], Optional[float]]:
    """([[update, seconds, valid loss], ...], updates per second) from a fairseq-train log's series
    (:func:`fairseq_deep.runs.series`).  Seconds are fairseq's ``wall`` clock of the training (the
    time ``--minutes`` budgets: validation included).  A validation's own record carries it, to
    0.01 s (``valid_wall``: :mod:`fairseq_deep.patches.validation_time`); a log without it (an
    older run's) has each validation's time interpolated linearly from the ``train_inner`` records'
    whole seconds (beyond the last record, at the last rate; records at 0 s, a run's first second,
    say nothing).  Updates/s is the last timed point's update over its time.  None where the log
    has no timed record."""
    own = dict(series.get("valid_wall", []))
    timed = sorted(
        {(u, w) for u, w in series.get("wall", []) if w > 0}
        | {(u, w) for u, w in own.items() if w > 0 and u > 0}
    )
    ups = timed[-1][0] / timed[-1][1] if timed else None

    def seconds(update: float) -> Optional[float]:
        if own.get(update, 0) > 0:
            return own[update]
        if not timed:
            return None
        below = [(u, w) for u, w in timed if u <= update]
        above = [(u, w) for u, w in timed if u >= update]
        if below and above:
            (u0, w0), (u1, w1) = below[-1], above[0]
            return w0 if u1 == u0 else w0 + (w1 - w0) * (update - u0) / (u1 - u0)
        if above:  # before the first record: from update 0 at time 0
            u1, w1 = above[0]
            return w1 * update / u1
        u0, w0 = below[-1]
        return w0 + (update - u0) / ups

    curve = [
        [u, None if seconds(u) is None else round(seconds(u), 2), v]
        for u, v in series.get("valid_loss", [])
    ]
    return curve, (round(ups, 4) if ups else None)


def parse_generate(text: str, n_test: int) -> Tuple[List[str], List[str]]:
    """(hypotheses, references) in input order from fairseq-generate's output text
    (:meth:`fairseq_deep.runs.Generated.in_order`)."""
    return runs.parse_generate(text).in_order(n_test)


def read_lines(path: str) -> Optional[List[str]]:
    """The lines of a text file the study wrote (hyp.txt, ref.txt), None where there is none."""
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def write_lines(path: str, lines: List[str]):
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in lines)


def record(
    run: RunState,
    hyps: List[str],
    refs: List[str],
    n_test: int,
    checkpoint: str,
    precision: str = "fp32",
):
    """The result of a scored run: scores (and sacreBLEU's signatures), updates, epochs, what
    stopped training, validation losses, the learning curve, training time, the precision; written
    to ``result.json`` (which a second invocation finds and keeps)."""
    write_lines(run.path("hyp.txt"), hyps)
    write_lines(run.path("ref.txt"), refs)
    with open(run.path("train.log"), encoding="utf-8", errors="replace") as f:
        log = f.read()
    records = runs.parse_log_lines(log.splitlines())
    series = runs.series(records)
    valid = [v for _, v in series.get("valid_loss", [])]
    with open(run.path("train.done")) as f:
        train_s = float(f.read().strip() or "nan")
    result = {
        **runs.score(hyps, refs),
        "sentences": len(hyps),
        "test_size": n_test,
        # the last validation comes after the last train_inner record (a --minutes stop)
        "updates": runs.updates_done(records),
        "epochs": runs.epochs_done(records),
        # plateau (--patience), time (--minutes), max_update; None: the log names no stop
        "stopped": runs.stop_reason(log),
        "precision": precision,
        "best_valid_loss": min(valid) if valid else None,
        "last_valid_loss": valid[-1] if valid else None,
        "train_seconds": round(train_s, 1),
        "checkpoint": os.path.basename(checkpoint),
    }
    result["curve"], result["updates_per_second"] = learning_curve(series)
    for d in run.system.stages:  # the earlier stages' updates and epochs too (each counts from 0)
        stage = runs.parse_log(run.path(f"stage_{d}.log"))
        result["updates"] += runs.updates_done(stage)
        result["epochs"] += runs.epochs_done(stage)
    with open(run.path("result.json"), "w") as f:
        json.dump(result, f, indent=1)
    run.result, run.status = result, "done"


class Study:
    def __init__(self, args, groups: Dict[str, Tuple[str, List[System]]]):
        self.args = args
        self.groups = groups
        self.n_test = runs.count_test_sentences(args.data)
        self.refs: Optional[List[str]] = read_text(args.ref) if args.ref else None
        if self.refs is not None and len(self.refs) != self.n_test:
            raise UserError(
                f"--ref {args.ref} has {len(self.refs)} lines, the test set {self.n_test} sentences"
            )
        self.runs = [
            RunState(s, seed, os.path.join(args.out, "runs", s.group, s.name, f"seed{seed}"))
            for _, systems in groups.values()
            for s in systems
            for seed in range(1, args.seeds + 1)
        ]
        self.lock = threading.Lock()
        #: called with each run as it ends (done or failed), one at a time: fairseq-deep-study
        #: rewrites results.json and results.md then, so that a study cut short keeps its table
        self.ended: Optional[Callable[[RunState], None]] = None
        # the running fairseq processes: stop() (Ctrl-C, SIGTERM) ends them and starts no more
        self.processes = runs.Processes()
        self.stopping = self.processes.stopping
        self.env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONWARNINGS="ignore")
        if "OMP_NUM_THREADS" not in os.environ:
            self.env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // args.jobs))

    # -- subprocesses --------------------------------------------------------------------------
    def execute(self, run: runs.Run, log_path: str, append: bool = True) -> runs.Result:
        """One fairseq (or fairseq-deep-grow) run, its command line first in its log."""
        return runs.execute(
            run, log_path, append=append, header=True, env=self.env, processes=self.processes
        )

    def _step(
        self, run: RunState, step: runs.Run, log_path: str, what: str, interrupted: str
    ) -> bool:
        """Run one fairseq (or fairseq-deep-grow) step; False (``run`` failed) unless it succeeded."""
        result = self.execute(step, log_path)
        if not result.ok and self.stopping.is_set():
            run.fail(f"interrupted ({interrupted})")
        elif not result.ok:
            run.fail(f"{what}: " + result.error())
        return result.ok

    def stop(self):
        """Start nothing more and end the running fairseq processes (fairseq resumes them from
        checkpoint_last.pt next time)."""
        self.processes.stop()

    # -- the steps of one run ------------------------------------------------------------------
    def grow_stages(self, run: RunState, steps: List[Tuple[str, runs.Run, str]], t0: float) -> bool:
        """The stages before a grown system's last one: train, grow, train, ... (each once)."""
        for name, step, done in steps:
            if os.path.exists(done):
                continue
            if not self._step(
                run, step, run.path(name + ".log"), name, "resumes from its last stage"
            ):
                return False
            if not name.startswith("grow_"):
                with open(done, "w") as f:
                    f.write(f"{time.time() - t0:.1f}\n")
        return True

    def train(self, run: RunState, train: runs.Run, steps: List[Tuple[str, runs.Run, str]]) -> bool:
        """fairseq-train (after the stages of a grown system); ``train.done`` holds its seconds."""
        with open(run.path("train_command.json"), "w") as f:
            json.dump(train.argv()[1:], f, indent=0)
        run.status, run.started = "training", time.time()
        run.start_update = runs.last_update(run.path("train.log")) or 0
        self.log_progress(only=run)
        t0 = time.time()
        if not self.grow_stages(run, steps, t0):
            return False
        if not self._step(
            run, train, run.path("train.log"), "fairseq-train", "resumes from checkpoint_last.pt"
        ):
            return False
        with open(run.path("train.done"), "w") as f:
            f.write(f"{time.time() - t0:.1f}\n")
        return True

    def decode(self, run: RunState) -> Optional[Tuple[runs.Generated, str]]:
        """fairseq-generate of the test set with ``--checkpoint``'s checkpoint (checkpoint_last.pt
        where there is none): (its output, the checkpoint), None where it failed."""
        run.status = "decoding"
        self.log_progress(only=run)
        checkpoint = run.path(f"checkpoint_{self.args.checkpoint}.pt")
        if not os.path.exists(checkpoint):
            checkpoint = run.path("checkpoint_last.pt")
        decode = generate_run(self.args, checkpoint, precision_of(self.args, run.system))
        result = self.execute(decode, run.path("generate.out"), False)
        generated = result.generated
        if not result.ok:
            run.fail("fairseq-generate: " + result.error())
            return None
        return generated, checkpoint

    def score(
        self, run: RunState, generated: runs.Generated
    ) -> Optional[Tuple[List[str], List[str]]]:
        """(hypotheses, references) in the test set's order, None where they do not match it."""
        try:
            hyps, t_refs = generated.in_order(self.n_test)
        except ValueError as e:
            run.fail(str(e))
            return None
        refs = self.refs if self.refs is not None else t_refs
        if not refs:
            run.fail("fairseq-generate printed no references (T- lines): give --ref")
            return None
        return hyps, refs

    def run_one(self, run: RunState):
        """Train, decode, score and record one run; a run with a result.json is kept as it is."""
        train, steps = train_run(self.args, run.system, run.seed, run.run_dir), []
        if (
            run.system.stages
        ):  # grown from shallower stages (the li group): stage, grow, ..., this one
            steps, train = stage_runs(self.args, run.system, run.seed, run.run_dir)
        cmd_path = run.path("train_command.json")
        if os.path.exists(cmd_path):
            with open(cmd_path) as f:
                if json.load(f) != train.argv()[1:]:
                    logger.warning(
                        "%s: the fairseq-train command differs from the one saved in %s; a finished "
                        "run keeps its scores, an unfinished one resumes from its checkpoint_last.pt "
                        "with the new command (delete the folder to start again)",
                        run.label,
                        cmd_path,
                    )
        if os.path.exists(run.path("result.json")):
            with open(run.path("result.json")) as f:
                run.result = json.load(f)
            run.status = "done"
            return
        os.makedirs(run.run_dir, exist_ok=True)
        if not os.path.exists(run.path("train.done")) and not self.train(run, train, steps):
            return
        if self.stopping.is_set():
            return
        decoded = self.decode(run)
        scored = decoded and self.score(run, decoded[0])
        if scored:
            record(run, *scored, self.n_test, decoded[1], precision_of(self.args, run.system))

    def _guarded(self, run: RunState):
        if self.stopping.is_set():
            return
        try:
            self.run_one(run)
        except Exception as e:  # one failed system must not stop the others
            logger.exception("%s failed", run.label)
            run.fail(f"{type(e).__name__}: {e}")
        self.log_progress(only=run)
        if self.ended is not None and not self.stopping.is_set():
            with self.lock:  # one at a time: what it writes, it writes whole
                try:
                    self.ended(run)
                except Exception:  # noqa: BLE001 - a partial table must not stop the runs
                    logger.exception("writing the results after %s failed", run.label)

    # -- progress ------------------------------------------------------------------------------
    def progress_line(self, run: RunState) -> str:
        if run.status in ("done", "failed", "queued"):
            extra = ""
            if run.status == "done" and run.result:
                extra = f", BLEU {run.result['bleu']:.2f}, chrF {run.result['chrf']:.2f}"
            elif run.status == "failed":
                extra = f": {run.error}"
            return f"{run.label}: {run.status}{extra}"
        line = f"{run.label}: {run.status}"
        if run.status != "training":
            return line
        update = runs.last_update(run.path("train.log"))
        line += f", update {update if update is not None else '-'}"
        if self.args.max_update:
            line += f"/{self.args.max_update}"
        elapsed = time.time() - (run.started or time.time())
        done = (update or 0) - (run.start_update or 0)
        rate = done / elapsed if update is not None and done > 0 and elapsed > 0 else None
        eta = TrainingProgress(
            max_update=self.args.max_update, stop_time_hours=self.args.minutes / 60
        )
        return f"{line}, {eta.eta(update or 0, rate, elapsed if self.args.minutes else None)}"

    def log_progress(self, only: Optional[RunState] = None):
        with self.lock:
            runs_ = [only] if only else self.runs
            counts = {
                s: sum(r.status == s for r in self.runs)
                for s in ("done", "failed", "training", "decoding", "queued")
            }
            if not only:
                logger.info("progress: " + ", ".join(f"{v} {k}" for k, v in counts.items() if v))
            for r in runs_:
                logger.info(self.progress_line(r))

    def run(self):
        stop = threading.Event()

        def monitor():
            while not stop.wait(self.args.progress_every):
                self.log_progress()

        thread = threading.Thread(target=monitor, daemon=True)
        thread.start()
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=self.args.jobs)
        try:
            for future in [pool.submit(self._guarded, r) for r in self.runs]:
                future.result()
        except KeyboardInterrupt:
            self.stop()
            logger.warning("interrupted: run the same command again to resume")
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
            stop.set()
        self.log_progress()

    # -- what the runs wrote -------------------------------------------------------------------
    def read_hyps(self, run: RunState) -> Optional[List[str]]:
        return read_lines(run.path("hyp.txt")) if run.status == "done" else None

    def read_run_refs(self, run: RunState) -> Optional[List[str]]:
        return self.refs if self.refs is not None else read_lines(run.path("ref.txt"))
