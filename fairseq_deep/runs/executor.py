"""Where fairseq runs: :func:`execute` starts one :class:`~.run.Run` (or any command) as a
process, its output into a log (or kept), with a timeout, an environment and a watcher of its lines,
and gives back one :class:`Result`: the command, exit status, wall time, the log, and what it
printed read as training records, generated translations and the error that stopped it.
:class:`Processes` holds the runs that go on at once (a study's ``--jobs``): ``stop()`` ends them
all and starts no more (Ctrl-C, SIGTERM).  :func:`execute_together` runs several programs one
after the other in one Python process (fairseq's ``cli_main`` each: a start-up of fairseq saved per
run, and each program's peak memory measured)."""

import json
import os
import shlex
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Union

from .logs import Record, last_error, parse_log_lines
from .run import Run
from .translations import Generated, parse_generate

#: the line :func:`execute_together`'s driver prints after each program, then its figures as json
MARK = "=== fairseq_deep.runs: program ended: "


class RunFailed(SystemExit):
    """A run that had to succeed failed (:meth:`Result.check`): the command, its exit status and
    the end of its output."""


@dataclass
class Result:
    """What a run gave back: ``command`` (the argv), ``returncode`` (None: stopped by its timeout,
    ``timed_out``, or never started, ``stopped``), wall ``seconds``, the ``log`` its output went
    to, the peak resident memory of its process (``max_rss_kib``; :func:`execute_together`: its
    ``peaks``, GiB of GPU and host memory), and its output (:attr:`output`, read as
    :attr:`records`, :attr:`generated` and :attr:`error`)."""

    command: List[str]
    returncode: Optional[int]
    seconds: float = 0.0
    log: Optional[str] = None
    timed_out: bool = False
    stopped: bool = False
    max_rss_kib: Optional[int] = None
    peaks: Dict[str, float] = field(default_factory=dict)
    #: the output where it was kept, not logged
    text: Optional[str] = None
    #: where this run's output begins in ``log`` (a log appended to)
    offset: int = 0

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    @cached_property
    def output(self) -> str:
        """Everything the run printed (stdout and stderr, as they came)."""
        if self.text is not None:
            return self.text
        if self.log is None:
            return ""
        with open(self.log, "rb") as f:
            f.seek(self.offset)
            return f.read().decode("utf-8", "replace")

    def tail(self, chars: int = 20000) -> str:
        """The last ``chars`` characters of :attr:`output` (a long log is not read whole)."""
        if self.text is not None or self.log is None:
            return self.output[-chars:]
        with open(self.log, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(self.offset, f.tell() - 4 * chars))
            return f.read().decode("utf-8", "replace")[-chars:]

    @cached_property
    def records(self) -> List[Record]:
        """fairseq-train's ``--log-format json`` records (:func:`~.logs.parse_log_lines`)."""
        return parse_log_lines(self.output.splitlines())

    @cached_property
    def generated(self) -> Generated:
        """fairseq-generate's output by sentence id (:func:`~.translations.parse_generate`)."""
        return parse_generate(self.output)

    def error(self, limit: int = 300) -> str:
        """Why the run failed: its timeout, or the line of its output that names the error."""
        if self.timed_out:
            return f"stopped by its timeout after {self.seconds:.0f} s"
        return last_error(self.tail(), limit)

    def check(self) -> "Result":
        """This result if the run succeeded, else :class:`RunFailed` with the command, its exit
        status and the end of its output."""
        if not self.ok:
            status = "timed out" if self.timed_out else self.returncode
            raise RunFailed(
                f"command failed ({status}): {' '.join(self.command)}\n{self.tail(4000)}"
            )
        return self


#: how :func:`execute` starts a process (``subprocess.Popen``'s arguments).  The tests replace it
#: with a stand-in that runs fairseq's programs in forks of a process that has imported them
#: (tests/forked.py: ``popen_for_runs``), as they run their own commands.
start_process: Callable[..., subprocess.Popen] = subprocess.Popen


class Processes:
    """Runs that go on at once and end together: :meth:`stop` (on Ctrl-C or SIGTERM) terminates
    every running one, and :func:`execute` starts none after it."""

    def __init__(self):
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.running = set()

    def stop(self):
        with self.lock:
            self.stopping.set()
            for proc in self.running:
                proc.terminate()


def _reap(proc: subprocess.Popen) -> Optional[int]:
    """Wait for ``proc``; its peak resident memory (KiB, of this child alone: ``os.wait4``; None
    for a process that is not a child of this one: :data:`start_process`'s stand-in)."""
    if not isinstance(proc, subprocess.Popen):
        proc.wait()
        return None
    try:
        _, status, usage = os.wait4(proc.pid, 0)
    except ChildProcessError:  # reaped already (a terminate() polled it): its status is known
        proc.wait()
        return None
    proc.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_maxrss


def execute(
    run: Union[Run, Sequence[str]],
    log: Optional[str] = None,
    *,
    append: bool = False,
    header: bool = False,
    timeout: Optional[float] = None,
    env: Optional[Mapping[str, str]] = None,
    watch: Optional[Callable[[str], None]] = None,
    processes: Optional[Processes] = None,
    cwd: Optional[str] = None,
    launcher: Optional[Sequence[str]] = None,
) -> Result:
    """Run ``run`` (a :class:`~.run.Run`, started as :meth:`~.run.Run.argv` with
    ``launcher``, or a command) with stdout and stderr together into ``log`` (``append``: after
    what it holds; ``header``: a first line ``# COMMAND``), or kept in the result when there is no
    log; each line also to ``watch``.  ``timeout``: seconds until the process is killed (the result
    then says ``timed_out``); ``processes``: the group that :meth:`Processes.stop` ends together.
    Ctrl-C (KeyboardInterrupt) terminates the process and goes on."""
    argv = run.argv(launcher) if isinstance(run, Run) else list(run)
    group = processes or Processes()
    start = time.monotonic()
    out = open(log, "a" if append else "w", encoding="utf-8") if log else None
    kept: List[str] = []
    timed_out = threading.Event()
    try:
        if out is not None and header:
            out.write("# " + " ".join(shlex.quote(c) for c in argv) + "\n")
        if out is not None:
            out.flush()
        offset = out.tell() if out is not None else 0
        piped = out is None or watch is not None
        with group.lock:
            if group.stopping.is_set():
                return Result(argv, None, 0.0, log, stopped=True, offset=offset)
            proc = start_process(
                argv,
                stdout=subprocess.PIPE if piped else out,
                stderr=subprocess.STDOUT,
                env=None if env is None else dict(env),
                cwd=cwd,
                text=piped,
                encoding="utf-8" if piped else None,
                errors="replace" if piped else None,
            )
            group.running.add(proc)

        def kill():
            timed_out.set()
            proc.kill()

        timer = threading.Timer(timeout, kill) if timeout else None
        if timer is not None:
            timer.daemon = True
            timer.start()
        try:
            if piped:
                for line in proc.stdout:
                    if out is not None:
                        out.write(line)
                        out.flush()
                    else:
                        kept.append(line)
                    if watch is not None:
                        watch(line)
                proc.stdout.close()
            rss = _reap(proc)
        except KeyboardInterrupt:
            proc.terminate()
            proc.wait()
            raise
        finally:
            if timer is not None:
                timer.cancel()
            with group.lock:
                group.running.discard(proc)
    finally:
        if out is not None:
            out.close()
    return Result(
        argv,
        None if timed_out.is_set() else proc.returncode,
        time.monotonic() - start,
        log,
        timed_out=timed_out.is_set(),
        stopped=group.stopping.is_set() and proc.returncode != 0,
        max_rss_kib=rss,
        text="".join(kept) if out is None else None,
        offset=offset,
    )


#: :func:`execute_together`'s process: fairseq's logging set up as fairseq_cli.train sets it up
#: (before fairseq is imported: importing it logs), then each program's ``cli_main`` with its
#: arguments, the peak GPU memory kept across fairseq's resets of it (it resets after every
#: update, for its ``gb_free``), and after each a line ``MARK {"status": ..., ...}``; the first
#: program that fails ends the process with its status
DRIVER = """\
import importlib, json, logging, os, resource, sys, time, traceback
logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s",
    datefmt="%Y-%m-%d %H:%M:%S", level=os.environ.get("LOGLEVEL", "INFO").upper(), stream=sys.stdout)
import torch
programs, mark = json.loads(sys.argv[1]), sys.argv[2]
peaks, reset = [0], torch.cuda.reset_peak_memory_stats
def keep_peak(*args, **kwargs):
    peaks.append(torch.cuda.max_memory_allocated())
    return reset(*args, **kwargs)
torch.cuda.reset_peak_memory_stats = keep_peak
status = 0
for module, name, args in programs:
    sys.argv, peaks[:], start = [name, *args], [0], time.monotonic()
    try:
        importlib.import_module(module).cli_main()
        status = 0
    except SystemExit as e:
        status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except Exception:
        traceback.print_exc()
        status = 1
    sys.stderr.flush()
    gpu = max(peaks + [torch.cuda.max_memory_allocated() if torch.cuda.is_available() else 0])
    print(mark + json.dumps({"status": status, "seconds": round(time.monotonic() - start, 3),
        "peak_gpu_gb": round(gpu / 2**30, 3),
        "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3)}), flush=True)
    if status:
        break
sys.exit(status)
"""


def together_command(runs: Sequence[Run]) -> List[str]:
    """The command of :func:`execute_together`: this Python running :data:`DRIVER` on the runs."""
    programs = [[r.spec.module, r.spec.console, r.arguments()] for r in runs]
    return [sys.executable, "-c", DRIVER, json.dumps(programs), MARK]


def execute_together(runs: Sequence[Run], log: Optional[str] = None, **kwargs) -> List[Result]:
    """The runs one after the other in one Python process (:data:`DRIVER`), as :func:`execute`
    runs one (its keyword arguments; ``timeout`` caps them all together): a :class:`Result` for each
    run that started (a run after a failed one does not), each with its own part of the output, its
    status, seconds (the first's with the process's start-up) and ``peaks`` (``peak_gpu_gb``,
    ``peak_rss_gb``: the process's so far)."""
    whole = execute(together_command(runs), log, **kwargs)
    results, rest = [], whole.output
    for run in runs:
        before, marker, rest = rest.partition(MARK)
        if not marker:  # the process ended (timed out, killed, stopped) inside this run
            results.append(
                Result(
                    run.argv(),
                    None if whole.timed_out else whole.returncode,
                    whole.seconds - sum(r.seconds for r in results),
                    log,
                    timed_out=whole.timed_out,
                    stopped=whole.stopped,
                    text=before,
                )
            )
            break
        line, _, rest = rest.partition("\n")
        figures = json.loads(line)
        status = figures.pop("status")
        results.append(
            Result(run.argv(), status, figures.pop("seconds"), log, peaks=figures, text=before)
        )
        if status:
            break
    if results and not results[-1].timed_out and results[-1].returncode is not None:
        # the first run's time includes the process's start-up, as a run of its own would
        results[0].seconds = whole.seconds - sum(r.seconds for r in results[1:])
    return results
