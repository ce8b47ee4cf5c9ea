"""The tests' fork server (tests/forked.py) runs a program as a new interpreter runs it: the same
output, exit status and streams, less the warnings printed while fairseq is imported."""

import os
import re
import subprocess
import sys

import forked
import pytest

from fairseq_deep import runs

ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")


def _fresh(argv, **kwargs):
    return subprocess.run(argv, capture_output=True, text=True, env=ENV, **kwargs)


def _normalised(text):
    text = re.sub(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", "TIME", text)
    return re.sub(r"\.(fresh|fork)\b", ".OUT", text).splitlines()


def test_a_fairseq_program_prints_what_it_prints_in_a_new_interpreter(tmp_path):
    """fairseq-preprocess (its logging set up before fairseq is imported) and fairseq-generate's
    refusal without the plugin (fairseq's import sets logging up): stdout equal, stderr equal but
    for what importing fairseq prints in a new interpreter."""
    raw = tmp_path / "raw"
    raw.mkdir()
    for side in ("src", "tgt"):
        (raw / f"train.{side}").write_text("a b c\nb c d e\n")
    noise = _fresh([sys.executable, "-c", "import fairseq"]).stderr.splitlines()
    commands = {
        "preprocess": lambda out: [
            *(sys.executable, "-m", "fairseq_cli.preprocess"),
            *("--source-lang", "src", "--target-lang", "tgt", "--workers", "1"),
            *("--trainpref", str(raw / "train"), "--destdir", str(tmp_path / out)),
        ],
        "generate": lambda out: [
            *("fairseq-generate", str(tmp_path / "preprocess.fresh"), "--cpu"),
            *("--path", str(tmp_path / "no_checkpoint.pt"), "--gen-subset", "train"),
        ],
    }
    for name, command in commands.items():
        fresh = _fresh(command(f"{name}.fresh"))
        fork = forked.run(command(f"{name}.fork"), env=ENV)
        assert fork.returncode == fresh.returncode, (name, fork.stderr[-2000:])
        assert _normalised(fork.stdout) == _normalised(fresh.stdout), name
        fresh_err = [line for line in fresh.stderr.splitlines() if line not in noise]
        assert _normalised("\n".join(fresh_err)) == _normalised(fork.stderr), name
    assert fresh.returncode != 0  # generate's refusal: a traceback ending in the same line


def test_exit_status_streams_timeout_and_kill():
    python = [sys.executable, "-c"]
    assert forked.eligible([*python, "pass"], ENV)  # these run in forks, not as new interpreters
    code = "import sys; print(sys.stdin.read().upper()); print('e', file=sys.stderr); sys.exit(3)"
    proc = forked.run([*python, code], env=ENV, input="abc\n")
    assert (proc.returncode, proc.stdout, proc.stderr) == (3, "ABC\n\n", "e\n")
    proc = forked.run([*python, "import sys; sys.exit('bye')"], env=ENV)
    assert (proc.returncode, proc.stderr) == (1, "bye\n")
    proc = forked.run([*python, "1 / 0"], env=ENV)
    fresh = subprocess.run([*python, "1 / 0"], env=ENV, capture_output=True, text=True)
    assert proc.returncode == fresh.returncode == 1
    # the interpreter's own traceback (Python >= 3.13 adds -c's source line and its carets)
    assert proc.stderr.splitlines()[1:] == fresh.stderr.splitlines()[1:]
    assert proc.stderr.splitlines()[-1] == "ZeroDivisionError: division by zero"
    with pytest.raises(subprocess.TimeoutExpired):
        forked.run([*python, "import time; time.sleep(60)"], env=ENV, timeout=0.5)
    started = forked.popen(
        [*python, "import time\nprint('up', flush=True)\ntime.sleep(60)"], env=ENV
    )
    assert next(started.stdout) == "up\n"
    started.kill()
    assert started.wait() == -9


def test_a_variable_torch_writes_while_running_keeps_commands_in_forks():
    """torch writes TORCHINDUCTOR_CACHE_DIR into the environment where inductor first caches
    something (read there, not at start-up): the commands after it still run in forks; another
    TORCH* variable of the command's own sends it to a new interpreter."""
    command = [sys.executable, "-c", "pass"]
    assert forked.eligible(command, dict(ENV, TORCHINDUCTOR_CACHE_DIR="/tmp/inductor_cache"))
    assert forked.eligible(command, dict(ENV, TORCH_SHOW_CPP_STACKTRACES="1")) is None


def test_what_the_package_starts_runs_in_a_fork(tmp_path):
    """conftest.py's forked_runs: a command that fairseq_deep.runs.execute starts (the study's,
    prepare's, a benchmark's) runs in a fork of the server, which has imported torch, its output
    kept or appended to a log as a real process's would be."""
    code = "import sys; print('torch' in sys.modules)"
    kept = runs.execute([sys.executable, "-c", code])
    assert kept.ok and kept.output == "True\n", kept.output
    log = tmp_path / "run.log"
    logged = runs.execute([sys.executable, "-c", code], str(log), header=True)
    assert logged.ok and log.read_text().splitlines()[1:] == ["True"], log.read_text()


@pytest.mark.real_processes
def test_a_test_marked_real_processes_gets_a_new_interpreter():
    code = "import sys; print('torch' in sys.modules)"
    assert runs.execute([sys.executable, "-c", code]).output == "False\n"
