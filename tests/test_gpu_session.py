""".ci/gpu/: the one planned device call of a GPU window (gpu_session.py), its steps
(gpu_steps.py), its runner (gpu_window.py) and its ledger (ledger.json).

No GPU here, so what can go wrong before a GPU minute is spent is tested: every step's command line
parses with the parser of the script it runs (a typo would cost a whole call), the study's groups
name systems that exist, the runner keeps to its budget (timeouts cut to what is left, steps
skipped, background steps and their children killed, the report and tarball written anyway, no
checkpoint in the tarball, the timed steps alone after the concurrent ones), ``stage`` fills
``.gpu/`` with what the window reads, and the ledger decides what the next window runs."""

import gzip
import importlib
import json
import os
import sys
import tarfile
import time

import gpu_session
import gpu_steps
import pytest
import torch
from gpu_steps import STEPS, Step, expand
from gpu_window import Phase

from fairseq_deep import study

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

VALUES = {"py": sys.executable, "data": "DATA", "spm": "SPM", "ref": "REF", "work": "WORK"}


@pytest.mark.parametrize("step", STEPS, ids=[s.name for s in STEPS])
def test_every_step_parses(monkeypatch, step):
    argv = expand(step.argv, VALUES)
    assert argv[0] == sys.executable
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # parse as on the GPU machine
    if argv[1] == "-m" and argv[2].startswith("benchmarks."):
        module = importlib.import_module(argv[2])
        parse = getattr(module, "get_parser", None)
        args = parse().parse_args(argv[3:]) if parse else module.parse_args(argv[3:])
        assert getattr(args, "device", "cuda") == "cuda"  # fsdp_check.py: CUDA only, no --device
    elif argv[1:3] == ["-m", "fairseq_deep.study"]:
        args = study.get_parser().parse_args(argv[3:])
        assert args.train_args == "--fp16" and args.minutes * 60 < step.timeout
        depths = study.parse_depths(args.depths) if args.depths else None  # N or E+D (modern)
        systems = [s for g in args.group for s in study.expand_group(g, depths)[1]]
        assert len(systems) <= args.jobs  # all at once: one wave within the budget
    else:
        assert argv[1:6] == ["-m", "pytest", "-q", "-m", "gpu"]
        assert {"tests/test_precision.py", "tests/test_ln_lstm_triton.py"} <= set(argv[8:])
    assert step.timeout <= 500


def test_steps_picks_a_subset(capsys):
    assert gpu_session.main(["run", "--steps", "dlcl_speed,rnmt_speed", "--list"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in listed] == ["rnmt_speed", "dlcl_speed"]
    with pytest.raises(SystemExit, match="no step nope; the steps are gpu_tests"):
        gpu_session.main(["run", "--steps", "nope", "--list"])


def test_the_ledger_decides_the_next_window(tmp_path, capsys):
    """A window runs what the ledger lacks, in order; a step that takes a window of its own only
    when nothing else is left; ``record`` writes what a window measured (a skipped step stays)."""
    ledger = str(tmp_path / "ledger.json")
    ordinary = [s.name for s in STEPS if not s.own_window]
    assert [s.name for s in gpu_session.pending({})] == ordinary
    summary = tmp_path / "summary.json"
    summary.write_text(
        json.dumps(
            [{"step": n, "status": "exit 0", "seconds": 1.0} for n in ordinary[:-1]]
            + [{"step": ordinary[-1], "status": "skipped (9 s left)", "seconds": 0}]
        )
    )
    gpu_session.main(
        ["record", str(summary), "--commit", "abc1234", "--device", "H", "--ledger", ledger]
    )
    entries = gpu_session.read_ledger(ledger)
    assert entries[ordinary[0]] == {
        "date": entries[ordinary[0]]["date"],
        "commit": "abc1234",
        "device": "H",
        "status": "exit 0",
        "seconds": 1.0,
    }
    assert [s.name for s in gpu_session.pending(entries)] == [ordinary[-1]]
    entries[ordinary[-1]] = dict(entries[ordinary[0]])
    own = [s.name for s in STEPS if s.own_window]
    assert [s.name for s in gpu_session.pending(entries)] == own[:1]
    capsys.readouterr()
    assert gpu_session.main(["run", "--ledger", ledger, "--list"]) == 0
    assert capsys.readouterr().out.split()[0] == ordinary[-1]


def test_the_committed_ledger_names_only_steps_of_the_plan():
    entries = gpu_session.read_ledger()
    assert set(entries) <= {s.name for s in STEPS}
    for entry in entries.values():
        assert {"date", "commit", "device", "status"} <= set(entry)


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for a parent that never reaps it, as in a container, is dead)."""
    time.sleep(0.2)
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _py(code):
    return ["{py}", "-c", code]


def test_runner_keeps_to_its_budget(tmp_path):
    grandchild = tmp_path / "grandchild.pid"
    steps = [
        # background: spawns a grandchild; both must be gone when the phase ends
        Step(
            "bg",
            0,
            _py(
                f"import subprocess,sys,time; p=subprocess.Popen([sys.executable,'-c','import time; "
                f"time.sleep(60)']); open({str(grandchild)!r},'w').write(str(p.pid)); time.sleep(60)"
            ),
            timeout=60,
            concurrent=True,
        ),
        Step(
            "writes",
            0,
            _py(
                "import os; w=r'{work}'; open(os.path.join(w,'table.md'),'w').write('| a |');"
                "open(os.path.join(w,'checkpoint_last.pt'),'w').write('x');"
                "open(os.path.join(w,'big.log'),'w').write('y'*300000); print('done')"
            ),
            timeout=30,
        ),
        Step("slow", 0, _py("import time; time.sleep(60)"), timeout=2),
        Step("late", 0, _py("print('never')"), timeout=30),
    ]
    t0 = time.monotonic()
    phase = Phase(
        "t",
        steps,
        str(tmp_path / "out"),
        str(tmp_path / "work"),
        {"py": sys.executable},
        budget=10,
        reserve=0,
        min_step=1.5,
        concurrent_budget=3,
    )
    phase.run()
    assert time.monotonic() - t0 < 20
    status = {r["step"].name: r["status"] for r in phase.rows}
    assert status["writes"] == "exit 0" and status["slow"].startswith("timed out")
    assert status["late"].startswith("skipped") or status["late"] == "exit 0"
    assert status["bg"].startswith("timed out")
    rows = {r["step"].name: r for r in phase.rows}
    assert (
        rows["writes"]["start"] >= rows["bg"]["start"] + rows["bg"]["seconds"] - 0.5
    )  # alone, after it
    assert not _alive(int(grandchild.read_text()))
    summary = (tmp_path / "out" / "t" / "summary.md").read_text()
    assert "| slow | 0 | timed out" in summary and "| writes | 0 | exit 0 |" in summary
    assert sorted(os.listdir(tmp_path / "out" / "t")) == [
        "summary.json",
        "summary.md",
    ]  # logs: in the tarball
    assert {
        r["step"]: r["status"]
        for r in json.loads((tmp_path / "out" / "t" / "summary.json").read_text())
    } == status
    with tarfile.open(tmp_path / "out" / "t.tar.gz") as tar:
        names = tar.getnames()
        assert "t/writes/table.md" in names and not any("checkpoint" in n for n in names)
        assert tar.extractfile("t/writes/writes.log").read().decode().strip() == "done"
        big = tar.extractfile("t/writes/big.log").read()
        assert big.startswith(b"[... cut") and len(big) < 300000


def test_stage_fills_the_gpu_folder(tmp_path, capsys):
    raw = tmp_path / "raw"
    raw.mkdir()
    for split, n in (("train", 300), ("val", 20), ("test", 20)):
        for lang, word in (("de", "hallo welt"), ("en", "hello world")):
            with gzip.open(raw / f"{split}.{lang}.gz", "wt") as f:
                f.writelines(f"{word} {i} {word[::-1]}\n" for i in range(n))
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "a-0-py3-none-any.whl").write_bytes(b"wheel")
    gpu = tmp_path / "gpu"
    gpu_session.main(
        [
            "stage",
            "--gpu-dir",
            str(gpu),
            "--wheels",
            str(wheels),
            "--multi30k",
            str(raw),
            "--test",
            "test",
            "--vocab-size",
            "60",
        ]
    )
    assert (gpu / "wheels" / "a-0-py3-none-any.whl").exists()
    assert (gpu / "m30k" / "spm.model").exists() and (gpu / "m30k" / "ref.gz").exists()
    assert (gpu / "m30k" / "data-bin" / "test.de-en.de.idx").exists()
    printed = capsys.readouterr().out
    assert (
        gpu_session.DEVICE_COMMAND in printed
        and "python3 .ci/gpu/gpu_session.py run --out $OUT" in printed
    )
    args = gpu_session.get_parser().parse_args(["run"])  # the defaults point where stage wrote
    assert args.data.endswith(os.path.join(".gpu", "m30k", "data-bin"))


def test_a_step_without_enough_budget_is_skipped(tmp_path):
    ran = tmp_path / "ran"
    steps = [Step("first", 0, _py(f"open({str(ran)!r}, 'w').write('x')"), timeout=30)]
    phase = Phase(
        "t",
        steps,
        str(tmp_path / "out"),
        str(tmp_path / "work"),
        {"py": sys.executable},
        budget=5,
        reserve=0,
        min_step=30,
    )
    phase.run()
    assert phase.rows[0]["status"].startswith("skipped") and not ran.exists()
    assert "| first | 0 | skipped" in (tmp_path / "out" / "t" / "summary.md").read_text()


def test_a_window_leaves_few_files_and_every_log_in_the_tarball(tmp_path):
    """Issue 24: the device tool brings back few files: the output folder gets the summaries and the
    tarball whatever the number of steps; each step's output goes into the tarball."""
    steps = [
        Step(
            s.name, s.issue, _py(f"print('table of {s.name}')"), timeout=30, concurrent=s.concurrent
        )
        for s in STEPS
    ]
    Phase(
        "window",
        steps,
        str(tmp_path / "out"),
        str(tmp_path / "work"),
        {"py": sys.executable},
        budget=120,
        reserve=0,
        min_step=1,
    ).run()
    files = [os.path.join(d, f) for d, _, fs in os.walk(tmp_path / "out") for f in fs]
    assert len(files) <= 7, files
    with tarfile.open(tmp_path / "out" / "window.tar.gz") as tar:
        for s in STEPS:
            log = tar.extractfile(f"window/{s.name}/{s.name}.log").read().decode()
            assert log.strip() == f"table of {s.name}"


def test_the_plan_fits_one_gpu_and_its_budget():
    """The first window's concurrent steps plan within 80 GB together (estimate_gb, --memory-gb),
    decode a subset, delete checkpoints (the default), and the 1,000-update runs need no more
    concurrent runs than fit their share; the first window's concurrent block and its first timed
    steps (the LSTM kernels and rnmt_speed, as an H200 took them) fit the default budget."""
    from benchmarks import precision_matrix as pm

    for step in STEPS:
        if "precision_matrix" not in " ".join(step.argv):
            continue
        args = pm.get_parser().parse_args(expand(step.argv, VALUES)[3:])
        assert args.memory_gb > 0 and args.decode_shards >= 10 and not args.keep_checkpoints
        runs = [pm.estimate_gb(f, args.max_tokens) for f in args.families for _ in args.precisions]
        assert max(runs) <= args.memory_gb
        if args.updates >= 1000:  # every run at once: none waits for a slot and misses its 1,000
            assert len(runs) <= args.jobs and sum(runs) <= args.memory_gb
    first = gpu_session.pending({})
    assert (
        gpu_steps.COLLAPSE_MEMORY_GB + 4 * 10 <= 80
    )  # the fully sharded runs: 4 at once, under 10 GB each
    args = gpu_session.get_parser().parse_args(["run"])
    concurrent = max(s.timeout for s in first if s.concurrent)
    assert concurrent <= args.concurrent_budget
    timed = [s for s in first if not s.concurrent]
    assert args.concurrent_budget + sum(s.timeout for s in timed[:3]) <= args.budget - 25
