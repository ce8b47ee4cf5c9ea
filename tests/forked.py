"""fairseq's programs started as forks of one process that has imported them already.

A fairseq program (``python -m fairseq_cli.train``, a ``fairseq-deep-*`` console script) spends 5-10 s
of CPU importing torch and fairseq before it does anything; a tiny model then trains and decodes in
one or two.  The suite starts a few hundred of them, so the tests run them here instead: one server
process per pytest session (started on first use) imports torch and fairseq's command-line modules
once, and each command runs in a fork of it, as the program a user starts would run:

- ``python -m MODULE``, ``python -c CODE``, ``python SCRIPT.py`` and the console scripts of this
  Python (a file whose ``#!`` line names it) are run the way the interpreter runs them: the module
  as ``__main__`` (``runpy``, as ``-m`` does), ``sys.argv`` as the program sees it, ``sys.path`` of a
  fresh interpreter with the program's first entry, the command's working directory, environment
  and stdin, its stdout and stderr in files of its own (or one, merged), a ``SystemExit`` or an
  uncaught exception turned into the exit status as the interpreter does, ``atexit`` run;
- the fork is a copy of a process that has run nothing but imports: no model, registry, logging
  handler, random state, default dtype or patch of one command reaches another (each is a fresh
  copy), ``fairseq_cli``'s modules are imported anew (their module-level logging set-up runs in the
  fork), the plugin (``--user-dir``) is imported by the command itself as in a new process, torch
  gets the command's ``OMP_NUM_THREADS``, and what importing fairseq does to the root logger in a
  new interpreter (a ``basicConfig`` in one of its modules: where the program has not configured
  logging before, fairseq's log lines go to stderr) is done where the program imports fairseq.

tests/test_forked.py compares a fork with a new interpreter: the same stdout, and the same stderr
less what a new interpreter prints while it imports fairseq (deprecation warnings).  That, and
environment variables read at start-up, are what a fork does not reproduce.  So a command runs in
a real subprocess (:func:`eligible` says which) when its environment differs from the server's in
a variable Python or a library reads at start-up (``PYTHON*`` other than PYTHONUNBUFFERED and a
plain PYTHONWARNINGS action, ``LD_*``, ``TORCH*`` but inductor's cache folder, ``TRITON_*``,
``CUDA_*``, ``MKL_*``, ``OPENBLAS_*``), when it has no ``OMP_NUM_THREADS``, or when its
interpreter is another Python;
and tests that pin what a user sees on a terminal (no warnings, no import noise:
tests/test_cli_errors.py; the console scripts without ``--user-dir``) start new interpreters
(``run_cli(..., fresh=True)``, ``subprocess.run``).  ``FAIRSEQ_DEEP_TESTS_FORK=0`` turns the
forks off (every command a new interpreter, as before).

The server speaks JSON lines over a pipe (a request: argv, cwd, env, files; an answer: the exit
status); a command's process group is killed on a timeout, as ``subprocess.run(timeout=...)``
would kill the process.  The server is this module too (``python -c "import forked; forked.serve()"``
in tests/); it imports nothing of the package.
"""

import atexit
import io
import json
import linecache
import logging
import os
import select
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import warnings

FORK_ENV = "FAIRSEQ_DEEP_TESTS_FORK"

#: what the server imports before it forks: the heavy imports of fairseq's programs (the modules
#: themselves are dropped again, so that ``-m`` and the console scripts import them as new), and
#: what they import only once they run: torch's compiler stack (torch.optim's first optimizer,
#: about 2.5 s), the plugins hydra looks for at its first config, fairseq's compiled helpers
PRELOAD = (
    "fairseq_cli.train",
    "fairseq_cli.generate",
    "fairseq_cli.interactive",
    "fairseq_cli.preprocess",
    "fairseq_cli.validate",
    "torch._dynamo",
    "torch.nn.utils._expanded_weights",
    "torch.utils.serialization",
    "fairseq.data.data_utils_fast",
    "fairseq.libbleu",
    "omegaconf._impl",
    "hydra._internal.core_plugins.basic_launcher",
    "hydra._internal.core_plugins.basic_sweeper",
    "hydra._internal.core_plugins.bash_completion",
    "hydra._internal.core_plugins.fish_completion",
    "hydra._internal.core_plugins.zsh_completion",
    "hydra._internal.core_plugins.file_config_source",
    "hydra._internal.core_plugins.importlib_resources_config_source",
    "hydra._internal.core_plugins.structured_config_source",
)

#: environment variables read at start-up (a command whose values differ runs in a real subprocess),
#: less those a fork applies itself: TORCHINDUCTOR_CACHE_DIR is read where inductor first caches
#: something, and torch writes its default into the environment then (a test that compiles once
#: would otherwise send every later command of its worker to a new interpreter)
_STARTUP_PREFIXES = ("PYTHON", "LD_", "TRITON_", "CUDA_", "TORCH", "MKL_", "OPENBLAS_")
_APPLIED = {
    "PYTHONUNBUFFERED",
    "PYTHONWARNINGS",
    "PYTHONDONTWRITEBYTECODE",
    "TORCHINDUCTOR_CACHE_DIR",
}
_SIMPLE_WARNING_ACTIONS = {"ignore", "default", "always", "module", "once", "error"}


# ---- the client (in the pytest process) ------------------------------------------------------------


def _startup_env(env):
    return {
        k: v
        for k, v in env.items()
        if k.startswith(_STARTUP_PREFIXES) and k not in _APPLIED and k != FORK_ENV
    }


def _script_python(path):
    """The interpreter a script's ``#!`` line names (None: not a Python script)."""
    try:
        with open(path, "rb") as f:
            first = f.readline(400).decode(errors="replace").strip()
    except OSError:
        return None
    if not first.startswith("#!"):
        return None
    words = shlex.split(first[2:])
    return words[0] if words and "python" in os.path.basename(words[0]) else None


def _which(program, env):
    if os.sep in program:
        return program
    for d in env.get("PATH", os.defpath).split(os.pathsep):
        candidate = os.path.join(d, program)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def _same_python(path):
    """``path`` is this interpreter, in this environment (a virtual environment's python links to
    its base interpreter: the folders must match too)."""
    if path is None:
        return False
    real = os.path.realpath
    return real(path) == real(sys.executable) and real(os.path.dirname(path)) == real(
        os.path.dirname(sys.executable)
    )


def eligible(argv, env):
    """The fork's form of ``argv`` (["-m", MODULE, *args], ["-c", CODE, *args], [SCRIPT, *args])
    where a fork runs it as a new interpreter would, else None (a real subprocess)."""
    if os.environ.get(FORK_ENV, "1") == "0" or not hasattr(os, "fork") or not argv:
        return None
    server = Server._instance
    server_env = server.startup_env if server is not None else _startup_env(os.environ)
    if "OMP_NUM_THREADS" not in env or _startup_env(env) != server_env:
        return None
    warn = env.get("PYTHONWARNINGS", "")
    if warn and not set(warn.split(",")) <= _SIMPLE_WARNING_ACTIONS:
        return None
    program, rest = argv[0], list(argv[1:])
    if _same_python(_which(program, env)) and rest:
        if rest[0] in ("-m", "-c") and len(rest) >= 2:
            return rest
        if not rest[0].startswith("-") and rest[0].endswith(".py"):
            return rest
        return None
    path = _which(program, env)
    if path and not path.endswith(".py") and _same_python(_script_python(path)):
        return [path, *rest]  # a console script of this Python
    return None


class Server:
    """The fork server of this pytest process (one; started on first use, stopped at exit)."""

    _instance = None
    _instance_lock = threading.Lock()

    @classmethod
    def get(cls):
        with cls._instance_lock:
            if cls._instance is None or cls._instance.proc.poll() is not None:
                cls._instance = cls()
                atexit.register(cls._instance.close)
            return cls._instance

    def __init__(self):
        env = dict(os.environ)
        env.setdefault("OMP_NUM_THREADS", "1")
        env.pop("PYTHONWARNINGS", None)  # applied per command
        self.startup_env = _startup_env(env)
        # stderr: the imports' warnings go nowhere (no command's output holds them)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "import forked; forked.serve()"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            cwd=os.path.dirname(os.path.abspath(__file__)),
        )
        self.lock = threading.Lock()
        self.pending = {}  # id -> [event, status]
        self.next_id = 0
        ready = self.proc.stdout.readline()
        if json.loads(ready or "{}").get("ready") is not True:
            raise RuntimeError(f"the fork server did not start: {ready!r}")
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            answer = json.loads(line)
            with self.lock:
                slot = self.pending.get(answer["id"])
            if slot is not None:
                slot[1] = answer["status"]
                slot[0].set()
        with self.lock:  # the server is gone: nothing more will come
            for slot in self.pending.values():
                if slot[1] is None:
                    slot[1] = "server gone"
                    slot[0].set()

    def _send(self, message):
        self.proc.stdin.write((json.dumps(message) + "\n").encode())
        self.proc.stdin.flush()

    def submit(self, form, cwd, env, stdin_path, stdout_path, stderr_path):
        """Start one command in a fork; its id (for :meth:`wait` and :meth:`kill`)."""
        with self.lock:
            self.next_id += 1
            ident = self.next_id
            self.pending[ident] = [threading.Event(), None]
            self._send(
                {
                    "id": ident,
                    "argv": form,
                    "cwd": cwd,
                    "env": env,
                    "stdin": stdin_path,
                    "stdout": stdout_path,
                    "stderr": stderr_path,
                }
            )
        return ident

    def kill(self, ident):
        """SIGKILL to the command's process group (once it has ended: nothing)."""
        with self.lock:
            if ident in self.pending and self.pending[ident][1] is None:
                self._send({"kill": ident})

    def wait(self, ident, timeout=None):
        """The exit status (negative: the signal that ended it), None while it still runs after
        ``timeout`` seconds."""
        with self.lock:
            event, _ = self.pending[ident]
        if not event.wait(timeout):
            return None
        with self.lock:
            status = self.pending[ident][1]
        if status == "server gone":
            raise RuntimeError("the fork server stopped while a command ran")
        return status

    def forget(self, ident):
        with self.lock:
            self.pending.pop(ident, None)

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def run(argv, cwd=None, env=None, input=None, timeout=None, merge_stderr=False):
    """``subprocess.run(argv, capture_output=True, text=True, ...)`` (with ``merge_stderr``:
    stderr=STDOUT), in a fork of the server where :func:`eligible` allows, else in a real
    subprocess.  A ``subprocess.CompletedProcess``; ``subprocess.TimeoutExpired`` on a timeout."""
    argv = [os.fspath(a) for a in argv]
    env = dict(os.environ if env is None else env)
    form = eligible(argv, env)
    if form is None:
        streams = (
            {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT}
            if merge_stderr
            else {"capture_output": True}
        )
        return _real_run(argv, cwd=cwd, env=env, input=input, timeout=timeout, text=True, **streams)
    server = Server.get()
    with tempfile.TemporaryDirectory(prefix="fairseq_deep_fork_") as tmp:
        paths = {name: os.path.join(tmp, name) for name in ("stdin", "stdout", "stderr")}
        with open(paths["stdin"], "w") as f:
            f.write(input or "")
        ident = server.submit(
            form,
            os.path.abspath(cwd or os.getcwd()),
            env,
            paths["stdin"],
            paths["stdout"],
            paths["stdout"] if merge_stderr else paths["stderr"],
        )
        try:
            status = server.wait(ident, timeout)
            if status is None:  # ran past the timeout: killed, as subprocess.run kills
                server.kill(ident)
                server.wait(ident)
        finally:
            server.forget(ident)
        out = _read_text(paths["stdout"])
        err = None if merge_stderr else _read_text(paths["stderr"])
    if status is None:
        raise subprocess.TimeoutExpired(argv, timeout, output=out, stderr=err)
    return subprocess.CompletedProcess(argv, status, out, err)


class Started:
    """A command running in a fork, its stdout and stderr merged (what ``subprocess.Popen(argv,
    stdout=PIPE, stderr=STDOUT, text=True)`` gives, as far as the tests use it): ``stdout``
    iterates over its lines as they are written, ``send_signal``/``kill``/``terminate``,
    ``poll``, ``wait``, ``returncode``.  With ``out`` (a file's path) the output is appended to
    that file instead (``stdout`` None), as ``Popen(argv, stdout=FILE, stderr=STDOUT)`` writes it."""

    def __init__(self, argv, form, cwd, env, out=None):
        self.args = argv
        self.server = Server.get()
        self.tmp = tempfile.TemporaryDirectory(prefix="fairseq_deep_fork_")
        stdin = os.path.join(self.tmp.name, "stdin")
        open(stdin, "w").close()
        self.out = out or os.path.join(self.tmp.name, "stdout")
        if out is None:
            open(self.out, "w").close()
        self.ident = self.server.submit(form, cwd, env, stdin, self.out, self.out)
        self.returncode = None
        self.stdout = (
            None if out else self._lines(open(self.out, encoding="utf-8", errors="replace"))
        )

    def _lines(self, f):
        with f:
            pending = ""
            while True:
                ended = self.poll() is not None
                chunk = f.read()
                pending += chunk
                *lines, pending = pending.split("\n")
                for line in lines:
                    yield line + "\n"
                if ended and not chunk:
                    break
                if not chunk:
                    time.sleep(0.02)
            if pending:
                yield pending

    def poll(self):
        return self.wait(0) if self.returncode is None else self.returncode

    def send_signal(self, sig):
        if sig != signal.SIGKILL:
            raise NotImplementedError("a forked command is stopped with SIGKILL only")
        self.kill()

    def kill(self):
        self.server.kill(self.ident)

    terminate = kill  # a fork is stopped with SIGKILL only

    def wait(self, timeout=None):
        if self.returncode is None:
            status = self.server.wait(self.ident, timeout)
            if status is None:
                if timeout == 0:
                    return None
                raise subprocess.TimeoutExpired(self.args, timeout)
            self.returncode = status
            self.server.forget(self.ident)
        return self.returncode


def popen(argv, cwd=None, env=None):
    """:class:`Started` in a fork where :func:`eligible` allows, else ``subprocess.Popen`` (stdout
    a pipe, stderr merged into it, text)."""
    argv = [os.fspath(a) for a in argv]
    env = dict(os.environ if env is None else env)
    form = eligible(argv, env)
    if form is None:
        return subprocess.Popen(
            argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
    return Started(argv, form, os.path.abspath(cwd or os.getcwd()), env)


def _read_text(path):
    with open(path) as f:  # subprocess's text mode: the locale's encoding, universal newlines
        return f.read()


_real_run = subprocess.run


def popen_for_runs(argv, stdout=None, stderr=None, env=None, cwd=None, **text_args):
    """A stand-in for ``subprocess.Popen`` as ``fairseq_deep.runs.execute`` calls it
    (``runs.executor.start_process``; conftest.py's ``forked_runs``): stderr merged into stdout,
    which is a pipe (text) or an open file; the command in a fork where :func:`eligible` allows
    (one intra-op thread, as :func:`run`'s commands), else the real ``subprocess.Popen``."""
    argv = [os.fspath(a) for a in argv]
    forked_env = dict(os.environ if env is None else env)
    forked_env.setdefault("OMP_NUM_THREADS", "1")
    form = eligible(argv, forked_env)
    if (
        form is None
        or stderr is not subprocess.STDOUT
        or text_args.get("encoding") not in (None, "utf-8")
    ):
        return subprocess.Popen(argv, stdout=stdout, stderr=stderr, env=env, cwd=cwd, **text_args)
    out = None if stdout is subprocess.PIPE else stdout.name
    return Started(argv, form, os.path.abspath(cwd or os.getcwd()), forked_env, out=out)


# ---- the server (python tests/forked.py) ----------------------------------------------------------


def serve():
    control_out = os.fdopen(os.dup(1), "w", buffering=1)
    control_in = os.dup(0)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)  # a stray print of an import must not reach the protocol
    fresh_path = list(sys.path[1:])  # a new interpreter's sys.path, less the program's own entry
    startup_filters = len(warnings.filters)

    root = logging.getLogger()
    try:  # fairseq's import configures logging where nothing did before: the basicConfig of one of
        import fairseq  # noqa: F401  its modules (which one, and how, differs between versions)
    except Exception:
        pass
    import_logging = _basic_config_of(root)
    for name in PRELOAD:
        try:
            __import__(name)
        except Exception:  # another stack may lack one: its programs then import what they need
            pass
    for name in [m for m in sys.modules if m.startswith("fairseq_cli.")]:
        del sys.modules[name]
        delattr(sys.modules["fairseq_cli"], name.split(".", 1)[1])
    for handler in list(root.handlers):  # as before any program configured it
        root.removeHandler(handler)
    root.setLevel(logging.WARNING)

    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    children = {}  # pid -> request id
    buffer = b""
    control_out.write(json.dumps({"ready": True}) + "\n")
    open_input = True
    while open_input or children:
        readable, _, _ = select.select([control_in, wake_r] if open_input else [wake_r], [], [])
        if wake_r in readable:
            os.read(wake_r, 4096)
        if control_in in readable:
            chunk = os.read(control_in, 1 << 16)
            if not chunk:  # the pytest process is done: stop what still runs
                open_input = False
                for pid in children:
                    _kill_group(pid)
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                request = json.loads(line)
                if "kill" in request:
                    for pid, ident in children.items():
                        if ident == request["kill"]:
                            _kill_group(pid)
                    continue
                pid = os.fork()
                if pid == 0:
                    os.close(control_out.fileno())
                    os.close(control_in)
                    os.close(wake_r)
                    os.close(wake_w)
                    _child(request, fresh_path, startup_filters, import_logging)  # never returns
                children[pid] = request["id"]
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            ident = children.pop(pid, None)
            if ident is not None:
                control_out.write(json.dumps({"id": ident, "status": _exit_status(status)}) + "\n")


def _exit_status(status):
    """``subprocess``'s returncode of a wait status (os.waitstatus_to_exitcode, Python >= 3.9)."""
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def _kill_group(pid):
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _child(request, fresh_path, startup_filters, import_logging):
    """Run one command in this fork, as a new interpreter would run it, and exit."""
    code = 1
    try:
        os.setpgid(0, 0)  # its own process group: a timeout kills what it started too
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        env = request["env"]
        unbuffered = bool(env.get("PYTHONUNBUFFERED"))
        fd_in = os.open(request["stdin"], os.O_RDONLY)
        fd_out = os.open(request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        fd_err = (
            fd_out
            if request["stderr"] == request["stdout"]
            else os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        )
        for fd, target in ((fd_in, 0), (fd_out, 1), (fd_err, 2)):
            os.dup2(fd, target)
        sys.stdin = sys.__stdin__ = open(0, closefd=False)
        sys.stdout = sys.__stdout__ = _text_stream(1, write_through=unbuffered)
        sys.stderr = sys.__stderr__ = _text_stream(2, line_buffering=True)
        os.environ.clear()
        os.environ.update(env)
        os.chdir(request["cwd"])
        _apply_warning_options(env.get("PYTHONWARNINGS", ""), startup_filters)
        if import_logging is not None:
            _on_first_fairseq_import(import_logging)
        if (
            "torch" in sys.modules
        ):  # imported by the server: its threads as the command's start-up sets them
            sys.modules["torch"].set_num_threads(int(env["OMP_NUM_THREADS"]))
        code = _run_program(request["argv"], fresh_path)
    except SystemExit as stop:
        code = _exit_code(stop.code)
    except BaseException:  # what the interpreter does with an uncaught exception
        kind, value, tb = sys.exc_info()
        traceback.print_exception(kind, value, _program_frames(tb))
        code = 1
    finally:
        try:
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _program_frames(tb):
    """The traceback without this module's and runpy's frames, as the interpreter prints it."""
    kept = []
    while tb is not None:
        if tb.tb_frame.f_code.co_filename not in _OWN_FRAMES:
            kept.append(tb)
        tb = tb.tb_next
    for first, second in zip(kept, kept[1:]):
        first.tb_next = second
    if kept:
        kept[-1].tb_next = None
    return kept[0] if kept else None


_OWN_FRAMES = {__file__, getattr(__import__("runpy"), "__file__", ""), "<frozen runpy>"}


def _text_stream(fd, write_through=False, line_buffering=False):
    raw = open(fd, "wb", buffering=0, closefd=False)
    return io.TextIOWrapper(
        raw if write_through else io.BufferedWriter(raw),
        errors="backslashreplace" if fd == 2 else None,
        write_through=write_through,
        line_buffering=line_buffering,
    )


def _basic_config_of(root):
    """``logging.basicConfig``'s arguments that give the root logger its handler (None: none)."""
    if len(root.handlers) != 1 or type(root.handlers[0]) is not logging.StreamHandler:
        return None
    handler = root.handlers[0]
    streams = {id(sys.stderr): "stderr", id(sys.__stderr__): "stderr", id(sys.stdout): "stdout"}
    if id(handler.stream) not in streams:
        return None
    formatter = handler.formatter or logging.Formatter()
    return {
        "stream": streams[id(handler.stream)],
        "format": formatter._fmt,
        "datefmt": formatter.datefmt,
        "level": root.level,
    }


def _on_first_fairseq_import(config):
    """What importing fairseq did to the root logger in a new interpreter (``basicConfig(**config)``:
    a handler unless the program configured logging before, as fairseq_cli.train does), done where
    the program imports fairseq (an ``import`` statement of fairseq or one of its modules)."""
    import builtins

    original = builtins.__import__

    def first_import(name, globals=None, locals=None, fromlist=(), level=0):
        if level == 0 and (name == "fairseq" or name.startswith("fairseq.")):
            builtins.__import__ = original
            logging.basicConfig(**dict(config, stream=getattr(sys, config["stream"])))
        return original(name, globals, locals, fromlist, level)

    builtins.__import__ = first_import


def _apply_warning_options(value, startup_filters):
    """PYTHONWARNINGS's actions where a new interpreter puts them: after the filters the imports
    added, before the built-in ones."""
    if not value:
        return
    sys.warnoptions[:] = value.split(",")
    position = len(warnings.filters) - startup_filters
    for action in sys.warnoptions:
        warnings.filters.insert(position, (action, None, Warning, None, 0))
    mutated = getattr(warnings, "_filters_mutated", None) or getattr(
        warnings, "_filters_mutated_lock_held", None
    )
    if mutated is not None:  # the C module's cache of the filters
        mutated()


def _exit_code(code):
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _run_program(argv, fresh_path):
    import runpy

    if argv[0] == "-m":
        sys.argv = ["-m", *argv[2:]]
        sys.path[:] = [os.getcwd(), *fresh_path]
        runpy._run_module_as_main(argv[1], alter_argv=True)
    elif argv[0] == "-c":
        sys.argv = ["-c", *argv[2:]]
        sys.path[:] = ["", *fresh_path]
        main = sys.modules["__main__"].__dict__
        for key in [k for k in main if k not in ("__builtins__",)]:
            del main[key]
        main.update(__name__="__main__", __doc__=None, __spec__=None, __loader__=None)
        if "<string>" in linecache.cache:  # Python >= 3.13 keeps -c's code for its tracebacks
            code = argv[1] if argv[1].endswith("\n") else argv[1] + "\n"
            linecache.cache["<string>"] = (len(code), None, code.splitlines(True), "<string>")
        exec(compile(argv[1], "<string>", "exec"), main)
    else:
        sys.argv = list(argv)
        sys.path[:] = [os.path.dirname(os.path.abspath(argv[0])), *fresh_path]
        runpy.run_path(argv[0], run_name="__main__")
    return 0
