""".ci/gpu/: the one planned device call of a GPU window (gpu_session.py), its steps
(gpu_steps.py), the study's groups (gpu_study.py), its runner (gpu_window.py) and its ledgers
(ledger.json, study_ledger.json).

No GPU here, so what can go wrong before a GPU minute is spent is tested: every step's command line
parses with the parser of the script it runs (a typo would cost a whole call), the study's windows
fit one GPU and keep the systems a claim compares together, the runner keeps to its budget
(timeouts cut to what is left, steps skipped, background steps and their children killed, the
report and tarball written anyway, no checkpoint in the tarball, the setup and the group first and
alone, the timed steps alone after the concurrent ones, a study's results copied out as they
come), ``stage`` fills ``.gpu/`` with what the window reads, the ledgers decide what the next
window runs, a window's results go into the study ledger and docs/study.md's section is what the
ledger generates; and a whole window runs on this CPU at tiny size (``run --tiny``): the data
prepared from raw text, the next group's real command, its results recorded."""

import gzip
import importlib
import json
import os
import subprocess
import sys
import tarfile
import time
import zipfile

import gpu_own_data
import gpu_session
import gpu_steps
import gpu_study
import pytest
import torch
from gpu_steps import STEPS, Step, expand
from gpu_window import Phase

from fairseq_deep import study
from fairseq_deep.study import claims

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

VALUES = {
    "py": sys.executable,
    "raw": "RAW",
    "prepared": "PREPARED",
    "vocab": "8000",
    "data": "DATA",
    "spm": "SPM",
    "ref": "REF",
    "work": "WORK",
}
EVERY = gpu_session.all_steps()


@pytest.mark.parametrize("step", EVERY, ids=[s.name for s in EVERY])
def test_every_step_parses(monkeypatch, step):
    argv = expand(step.argv, VALUES)
    assert argv[0] == sys.executable
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # parse as on the GPU machine
    if argv[1] == "-m" and argv[2].startswith("benchmarks."):
        module = importlib.import_module(argv[2])
        parse = getattr(module, "get_parser", None)
        args = parse().parse_args(argv[3:]) if parse else module.parse_args(argv[3:])
        assert getattr(args, "device", "cuda") == "cuda"  # fsdp_check.py: CUDA only, no --device
        if argv[2] == "benchmarks.fsdp_check" and args.only:
            assert all(pair.split(":")[1] in module.MODES for pair in args.only)
        if argv[2] == "benchmarks.distill":  # issue 47: its training leaves time for the rest
            assert args.precision == "fp16" and args.systems == "distilled"
            assert (args.teacher_minutes + args.minutes) * 60 + 240 <= step.timeout
    elif argv[1:3] == ["-m", "fairseq_deep.study"]:
        args = study.get_parser().parse_args(argv[3:])
        assert (args.width, args.precision, args.valid_interval) == (512, "fp16", "epoch")
        assert args.patience > 0 and args.minutes * 60 + gpu_study.DECODE_S <= step.timeout
        depths = study.parse_depths(args.depths) if args.depths else None  # N or E+D (modern)
        systems = [s for g in args.group for s in study.expand_group(g, depths)[1]]
        assert len(systems) == args.jobs  # all at once, side by side
        assert step.first and step.live == ("results.json", "results.md")
    elif argv[1] == ".ci/gpu/gpu_own_data.py":  # issue 47: the own-data recipe as a user runs it
        args = gpu_own_data.get_parser().parse_args(argv[2:])
        assert (args.raw, args.work, args.precision) == ("RAW", "WORK", "--fp16")
        assert step.own_window and float(args.minutes) * 60 + 30 <= step.timeout
        assert set(gpu_own_data.console_scripts()) >= {"fairseq-deep-train", "fairseq-deep-prepare"}
    elif argv[1:3] == ["-m", "fairseq_deep.prepare"]:
        from fairseq_deep import prepare

        args = prepare.get_parser().parse_args(argv[3:])
        assert step.setup and args.vocab_size == 8000 and args.destdir == "PREPARED"
        assert args.trainpref == "RAW/train" and args.testpref == "RAW/test_2016_flickr"
    else:
        assert argv[1:6] == ["-m", "pytest", "-q", "-m", "gpu"]
        assert {"tests/test_precision.py", "tests/test_ln_lstm_triton.py"} <= set(argv[8:])
    assert step.timeout <= 500


def test_steps_picks_a_subset(capsys):
    assert gpu_session.main(["run", "--steps", "dlcl_speed,rnmt_speed", "--list"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in listed] == ["data", "rnmt_speed", "dlcl_speed"]
    with pytest.raises(SystemExit, match="no step nope; the steps are data, study_wang"):
        gpu_session.main(["run", "--steps", "nope", "--list"])


def test_the_ledger_decides_the_next_window(tmp_path, capsys):
    """A window runs what the ledger lacks, in order; a step that takes a window of its own only
    when nothing else is left; ``record`` writes what a window measured (a skipped step stays)."""
    ledger = str(tmp_path / "ledger.json")
    ordinary = [s.name for s in STEPS if not s.own_window and not s.setup]
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
    study_ledger = str(tmp_path / "study_ledger.json")
    assert (
        gpu_session.main(["run", "--ledger", ledger, "--study-ledger", study_ledger, "--list"]) == 0
    )
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert listed == ["data", "study_wang", ordinary[-1]]


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


def _raw_multi30k(folder, train=300):
    """Raw text in Multi30K's file names (``train``, ``val``, ``test_2016_flickr``), a tiny
    vocabulary of German and English words aligned one to one."""
    german = "ein mann hund frau kind spielt läuft auf dem im park wasser rot blau groß klein"
    english = "a man dog woman child plays runs on the in park water red blue big small"
    words = list(zip(german.split(), english.split()))
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", train), ("val", 24), ("test_2016_flickr", 24)):
        rows = [[words[(i * 7 + k * 3) % len(words)] for k in range(3 + i % 5)] for i in range(n)]
        for side, lang in enumerate(("de", "en")):
            with gzip.open(folder / f"{split}.{lang}.gz", "wt") as f:
                f.writelines(" ".join(pair[side] for pair in row) + "\n" for row in rows)
    return folder


def test_stage_fills_the_gpu_folder(tmp_path, capsys):
    """``stage`` copies the wheels and Multi30K's raw text (a window prepares it on the GPU
    machine: git ignores .gpu/ and the device tool carries it), and prints the device call."""
    raw = _raw_multi30k(tmp_path / "raw")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "a-0-py3-none-any.whl").write_bytes(b"wheel")
    gpu = tmp_path / "gpu"
    argv = ["stage", "--gpu-dir", str(gpu), "--wheels", str(wheels), "--multi30k", str(raw)]
    argv += ["--ctranslate2", ""]  # without CTranslate2 (its own test: no registry in tests)
    gpu_session.main(argv)
    assert (gpu / "wheels" / "a-0-py3-none-any.whl").exists()
    assert sorted(p.name for p in (gpu / "multi30k").iterdir()) == sorted(gpu_session.RAW_FILES)
    printed = capsys.readouterr().out
    assert (
        gpu_session.DEVICE_COMMAND in printed
        and "python3 .ci/gpu/gpu_session.py run --out $OUT" in printed
    )
    args = gpu_session.get_parser().parse_args(["run"])  # the defaults point where stage wrote
    assert args.raw.endswith(os.path.join(".gpu", "multi30k"))
    values = gpu_session.values_of(args)
    assert values["ref"].endswith(os.path.join(".gpu", "multi30k", "test_2016_flickr.en.gz"))
    assert values["data"] == os.path.join(args.work, "m30k", "data-bin")
    (raw / "val.en.gz").unlink()
    with pytest.raises(SystemExit, match="lacks val.en.gz"):
        gpu_session.main(argv)


def test_stage_repacks_ctranslate2_and_a_window_imports_it(tmp_path, monkeypatch):
    """CTranslate2's cp312 wheel (pip's, here a fake one) is repacked as xz into .gpu/, its files
    and their modes as the wheel installs them; a window on that Python unpacks it onto its steps'
    PYTHONPATH, and a step imports it from there; on another Python it is left packed."""
    fetched = []

    def pip_download(argv, **kwargs):
        fetched.append(argv)
        with zipfile.ZipFile(os.path.join(argv[argv.index("-d") + 1], "ct2-9-cp312.whl"), "w") as z:
            for name, mode, data in (
                ("fake_ct2/__init__.py", 0o644, b"VERSION = '9'\n"),
                ("fake_ct2.libs/lib.so", 0o755, b"\x7fELF"),
            ):
                info = zipfile.ZipInfo(name)
                info.external_attr = mode << 16
                z.writestr(info, data)
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(gpu_session.subprocess, "run", pip_download)
    gpu = tmp_path / "gpu"
    gpu.mkdir()
    said = gpu_session.stage_ctranslate2(str(gpu), "ctranslate2==9")
    assert "ct2-9-cp312.whl repacked" in said and "ctranslate2==9" in fetched[0]
    assert fetched[0][fetched[0].index("--python-version") + 1] == "3.12"
    with tarfile.open(gpu / gpu_session.CT2_ARCHIVE) as tar:
        assert {m.name: m.mode for m in tar.getmembers()} == {
            "fake_ct2/__init__.py": 0o644,
            "fake_ct2.libs/lib.so": 0o755,
        }
    monkeypatch.setenv("PYTHONPATH", "ROOT")
    monkeypatch.setattr(gpu_session, "CT2_PYTHON", (2, 7))  # another Python: left packed
    assert gpu_session.unpack_ctranslate2(str(gpu), str(tmp_path / "w")) is None
    monkeypatch.setattr(gpu_session, "CT2_PYTHON", tuple(sys.version_info[:2]))
    site = gpu_session.unpack_ctranslate2(str(gpu), str(tmp_path / "w"))
    assert os.environ["PYTHONPATH"] == os.pathsep.join(["ROOT", site])
    monkeypatch.undo()  # the real subprocess.run: a step sees the unpacked package
    step = [sys.executable, "-c", "import fake_ct2; print(fake_ct2.VERSION)"]
    env = dict(os.environ, PYTHONPATH=site)
    assert subprocess.run(step, env=env, capture_output=True, text=True).stdout == "9\n"
    failed = subprocess.CompletedProcess([], 1, "", "ERROR: No matching distribution found\n")
    monkeypatch.setattr(gpu_session.subprocess, "run", lambda argv, **kw: failed)
    with pytest.raises(SystemExit, match="could not fetch ctranslate2==9 .*No matching distri"):
        gpu_session.stage_ctranslate2(str(gpu), "ctranslate2==9")


def test_the_own_data_recipe_runs_as_a_new_user_at_tiny_size(tmp_path):
    """Issue 47, item 2: the window's step runs examples/own_data/run.sh as README says, through
    launchers of the console scripts (the GPU machine has none), on Multi30K's raw files linked
    under run.sh's names: here at tiny size on this CPU (``run --tiny``), to the sacreBLEU line."""
    raw = _raw_multi30k(tmp_path / "raw", train=120)
    out, work = tmp_path / "out", tmp_path / "work"
    argv = ["run", "--tiny", "--steps", "own_data_fp16", "--out", str(out), "--raw", str(raw)]
    argv += ["--vocab-size", "40", "--work", str(work), "--ledger", str(tmp_path / "l.json")]
    assert gpu_session.main(argv) == 0
    summary = json.loads((out / "window" / "summary.json").read_text())
    assert [(r["step"], r["status"]) for r in summary] == [
        ("data", "exit 0"),
        ("own_data_fp16", "exit 0"),
    ]
    step = work / "window" / "own_data_fp16"
    assert sorted(os.listdir(step / "raw")) == sorted(
        f"{split}.{lang}.gz" for split in ("train", "val", "test") for lang in ("de", "en")
    )
    assert os.path.realpath(step / "raw" / "test.en.gz") == str(raw / "test_2016_flickr.en.gz")
    assert set(os.listdir(step / "bin")) == {"python", *gpu_own_data.console_scripts()}
    with tarfile.open(out / "window.tar.gz") as tar:
        score = tar.extractfile("window/own_data_fp16/run/score.txt").read().decode()
        log = tar.extractfile("window/own_data_fp16/own_data_fp16.log").read().decode()
    assert score.startswith("sacreBLEU BLEU = ") and "run.sh: done in" in log
    assert "MINUTES=0 PRECISION= " in log and "DEVICE=--cpu" in log


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


# -- the study at Base width, one group a window (issue 38) ----------------------------------------


#: the study's groups in the issue's order (issue 47), with their --depths: the papers' groups, then
#: the modern group at each of its two shapes, each shape a group of windows of its own
ORDER = [
    ("wang", "6,30"), ("depth", "6,18"), ("bapna", "6,16"), ("dou", ""), ("chen", ""),
    ("zhou", ""), ("li", ""), ("modern", "18+18"), ("modern", "48+6"),
]  # fmt: skip


def _depths(depths):
    return study.parse_depths(depths) if depths else None


def test_study_windows_fit_one_gpu_and_keep_what_a_claim_compares_together():
    """The groups in the issue's order (the modern group at 18+18, then at 48+6), each split into
    the fewest windows whose estimated memory fits an H100 (systems_gb), the baseline in each (at
    each shape pre-norm of that shape), every selected system in exactly one window, the two
    systems a claim compares (not the baseline) in the same, each window's command running
    exactly its systems; the windows' names tell the shapes apart and are file names and
    ``run --steps`` words."""
    assert [(g, d) for g, _, d in gpu_study.ORDER] == ORDER
    parts = gpu_study.parts()
    assert [(p.group, p.depths) for p in parts] == sorted(
        ((p.group, p.depths) for p in parts), key=ORDER.index
    )
    for group, subset, depths in gpu_study.ORDER:
        mine = [p for p in parts if (p.group, p.depths) == (group, depths)]
        spec = f"{group}:{subset}" if subset else group
        baseline, systems = study.expand_group(spec, _depths(depths))
        others = sorted(s.name for s in systems if s.name != baseline)
        assert sorted(s for p in mine for s in p.systems if s != baseline) == others
        name = f"study_{group}" + (f"_{depths}" if group == "modern" else "")
        assert [p.name for p in mine] == (
            [name] if len(mine) == 1 else [f"{name}_{i + 1}" for i in range(len(mine))]
        )
        for p in mine:
            assert baseline in p.systems and p.memory_gb <= gpu_study.MEMORY_GB
            assert len(p.systems) <= gpu_study.MAX_JOBS
            assert (p.index, p.of, p.baseline) == (mine.index(p) + 1, len(mine), baseline)
            _, expanded = study.expand_group(p.spec, _depths(depths))
            assert [s.name for s in expanded] == list(p.systems)  # the window's command runs these
            argv = gpu_study.study_argv(p)
            assert argv[argv.index("--group") + 1] == p.spec
            assert (argv[argv.index("--depths") + 1] if depths else "") == depths
        for c in claims.of_group(group):
            where = {s: p.name for p in mine for s in p.systems if s != baseline}
            if c.than and c.than != baseline and c.system in where:
                assert where[c.system] == where[c.than], c
    names = [p.name for p in parts]
    assert len(set(names)) == len(names)
    assert all(n.replace("_", "").replace("+", "").isalnum() and "," not in n for n in names)
    assert names[:3] == ["study_wang", "study_depth_1", "study_depth_2"]
    modern = [p for p in parts if p.group == "modern"]
    assert {p.baseline for p in modern} == {"prenorm_18+18", "prenorm_48+6"}
    assert names[-len(modern) :] == [p.name for p in modern]  # after the papers' groups
    assert modern[0].name == "study_modern_18+18_1" and modern[-1].name.startswith(
        "study_modern_48+6_"
    )


def test_the_plan_takes_the_groups_in_the_issues_order(tmp_path, capsys):
    """The next window is the first of wang, depth, bapna, dou, chen, zhou, li, then modern at
    18+18 and at 48+6 (a group split over windows: its windows in turn) that the study ledger
    holds no entry of, whatever else it holds; ``plan`` names it, and with the committed ledger
    empty, wang comes first."""
    order = ["wang", "depth", "bapna", "dou", "chen", "zhou", "li", "modern"]
    parts = gpu_study.parts()
    assert [(g, d) for g, _, d in gpu_study.ORDER] == ORDER
    assert sorted({p.group for p in parts}, key=order.index) == order
    assert [p.group for p in parts] == sorted((p.group for p in parts), key=order.index)
    ledger = []
    for i, part in enumerate(parts):
        assert gpu_study.next_part(ledger) == part
        plan_ledger = tmp_path / f"study{i}.json"
        gpu_study.write_ledger(ledger, str(plan_ledger))
        capsys.readouterr()
        gpu_session.main(["plan", "--ledger", str(tmp_path / "none.json"),
                          "--study-ledger", str(plan_ledger)])  # fmt: skip
        out = capsys.readouterr().out
        assert f"then the study's {part.group} group" in out and f": {part.name}, " in out
        if part.depths:
            assert f" --depths {part.depths} " in out
        ledger.append({"part": part.name, "group": part.group, "system": part.baseline,
                       "date": "2026-12-01", "commit": "c0ffee0", "device": "H"})  # fmt: skip
    assert gpu_study.next_part(ledger) is None
    # an entry of a later group does not make an earlier one done
    assert gpu_study.next_part([{"part": parts[-1].name}]) == parts[0]
    # one shape of a group run does not make the other done
    first = [p for p in parts if p.depths == "48+6"][0]
    done = [{"part": p.name} for p in parts if p.depths != "48+6"]
    assert gpu_study.next_part(done) == first
    if not gpu_study.read_ledger():
        assert gpu_study.next_part(gpu_study.read_ledger()).name == "study_wang"


def test_the_modern_group_has_each_schemes_claim_at_both_shapes():
    """At each shape of the plan (18+18, 48+6) every scheme of the modern group but pre-norm (the
    baseline there) has its paper's claim against pre-norm of that shape, once, unless it is
    listed as making none; each claim names a system of the group at its shape, and the
    generated section shows it in the window that trains it."""
    shapes = [d for g, _, d in gpu_study.ORDER if g == "modern"]
    assert shapes == ["18+18", "48+6"]
    declared = claims.of_group("modern")
    none = set(claims.NO_CLAIM_AGAINST_PRENORM)
    section, parts = gpu_study.section([]), gpu_study.parts()
    for shape in shapes:
        baseline, systems = study.expand_group("modern", study.parse_depths(shape))
        assert baseline == f"prenorm_{shape}"
        schemes = {s.name[: -len(shape) - 1] for s in systems if s.name != baseline}
        assert {s.name for s in systems} == {baseline} | {f"{p}_{shape}" for p in schemes}
        mine = [c for c in declared if c.system.endswith(f"_{shape}")]
        claimed = [c.system[: -len(shape) - 1] for c in mine]
        assert len(set(claimed)) == len(claimed) and not set(claimed) & none
        assert set(claimed) | none == schemes
        for c in mine:
            assert c.than is None and c.direction in ("above", "not_below"), c
            (part,) = [p for p in parts if c.system in p.systems]
            assert part.baseline == baseline and part.depths == shape
            assert (
                f"| `{c.system}` {c.direction.replace('_', ' ')} `{baseline}` | not yet run | "
                f"- | - | - | `run --steps {part.name}` |"
            ) in section
    assert all(any(c.system.endswith(f"_{shape}") for shape in shapes) for c in declared)


def test_a_ledger_entry_round_trips(tmp_path):
    """An entry written to the study ledger reads back equal, and the section from the file is the
    section from the entries; recording the same window twice adds nothing."""
    results = _results({"postnorm_6": (30.0, None), "dlcl_30": (33.5, 0.001)})
    entries = gpu_study.entries(results, "study_wang", "2026-12-01", "c0ffee0", "NVIDIA H100",
                                {"dlcl_30": {"prenorm_30": 0.01}})  # fmt: skip
    path = str(tmp_path / "study.json")
    gpu_study.write_ledger(entries, path)
    assert gpu_study.read_ledger(path) == entries
    assert gpu_study.section(gpu_study.read_ledger(path)) == gpu_study.section(entries)
    assert entries[1]["p_against"] == {"prenorm_30": 0.01} and entries[0]["p"] is None
    summary = _window_out(tmp_path, results)
    added = [gpu_study.record(str(summary), "2026-12-01", "c0ffee0", "H", path) for _ in "12"]
    assert added == [2, 0] and len(gpu_study.read_ledger(path)) == 4


def test_the_next_window_is_the_next_group_then_what_the_ledger_lacks():
    parts = gpu_study.parts()
    first = gpu_session.window({}, [])
    assert [s.name for s in first[:2]] == ["data", parts[0].name]
    assert [s.name for s in first[2:]] == [
        s.name for s in gpu_session.pending({}) if not s.own_window
    ]
    ran = [{"part": parts[0].name, "system": "x"}]
    assert [s.name for s in gpu_session.window({}, ran)[:2]] == ["data", parts[1].name]
    every = [{"part": p.name} for p in parts]
    assert gpu_study.next_part(every) is None
    assert [s.name for s in gpu_session.window({}, every)] == [
        "data",
        *(s.name for s in gpu_session.pending({})),
    ]


def test_setup_and_group_run_first_alone_and_a_groups_results_come_out_as_they_come(tmp_path):
    """The setup step, then the group, each alone, then the concurrent ones; the group's live file
    is in the output folder while it runs (each version whole); a failed setup skips the rest."""
    stamp = tmp_path / "stamps"
    stamp.mkdir()

    def mark(name, code=""):
        return _py(f"import time; open(r'{stamp}/{name}', 'w').write(str(time.time())); {code}")

    copied = tmp_path / "seen"
    watch = (
        "import os, time; w=r'{work}'; "
        "open(os.path.join(w,'results.json.tmp'),'w').write('1'); "
        "os.replace(os.path.join(w,'results.json.tmp'), os.path.join(w,'results.json')); "
        f"out=r'{tmp_path}/out/t/grp.results.json'; "
        "end=time.time()+10\n"
        "while not os.path.exists(out) and time.time()<end: time.sleep(0.1)\n"
        f"open(r'{copied}','w').write(open(out).read() if os.path.exists(out) else 'none')"
    )
    steps = [
        Step("conc", 0, mark("conc"), 30, concurrent=True),
        Step("grp", 0, ["{py}", "-c", watch], 30, first=True, live=("results.json",)),
        Step("setup", 0, mark("setup", "time.sleep(0.5)"), 30, setup=True),
    ]
    phase = Phase(
        "t", steps, str(tmp_path / "out"), str(tmp_path / "work"), {"py": sys.executable}, 60,
        reserve=0, min_step=1,
    )  # fmt: skip
    phase.run()
    rows = {r["step"].name: r for r in phase.rows}
    assert [r["step"].name for r in phase.rows] == ["setup", "grp", "conc"]
    assert all(r["status"] == "exit 0" for r in phase.rows)
    assert rows["grp"]["start"] >= rows["setup"]["start"] + rows["setup"]["seconds"] - 0.5
    assert rows["conc"]["start"] >= rows["grp"]["start"] + rows["grp"]["seconds"] - 0.5
    assert copied.read_text() == "1"  # copied while the step ran
    assert (tmp_path / "out" / "t" / "grp.results.json").read_text() == "1"

    failed = [Step("setup", 0, _py("raise SystemExit(3)"), 30, setup=True), steps[0]]
    phase = Phase(
        "u", failed, str(tmp_path / "out"), str(tmp_path / "work"), {"py": sys.executable}, 60,
        reserve=0, min_step=1,
    )  # fmt: skip
    phase.run()
    assert [r["status"] for r in phase.rows] == ["exit 3", "skipped (the setup step setup failed)"]


def _window_out(tmp_path, results, hyps=None):
    """A window's output folder as a device call brings it back: summary.json, the study's live
    results.json and the tarball with the runs' hypotheses."""
    out = tmp_path / "out" / "window"
    out.mkdir(parents=True)
    (out / "summary.json").write_text(
        json.dumps([{"step": "data", "status": "exit 0", "seconds": 30.0},
                    {"step": "study_wang", "status": "exit 0", "seconds": 390.0}])
    )  # fmt: skip
    (out / "study_wang.results.json").write_text(json.dumps(results))
    with tarfile.open(tmp_path / "out" / "window.tar.gz", "w:gz") as tar:
        for name, lines in (hyps or {}).items():
            path = tmp_path / "h.txt"
            path.write_text("\n".join(lines) + "\n")
            tar.add(path, arcname=f"window/study_wang/runs/wang/{name}")
    return out / "summary.json"


def _results(scores):
    """A study's results.json of the wang window: system -> (BLEU, p against the baseline)."""
    systems = {}
    for name, (bleu, p) in scores.items():
        seed = (
            {"error": bleu, "status": "failed"}
            if isinstance(bleu, str)
            else {"bleu": bleu, "chrf": bleu + 20, "epochs": 9, "updates": 1200,
                  "stopped": "plateau" if name == "postnorm_6" else "time",
                  "best_valid_loss": 3.5, "bleu_signature": "nrefs:1|tok:13a",
                  "chrf_signature": "nrefs:1|nc:6"}
        )  # fmt: skip
        systems[name] = {
            "arch": f"transformer_{name}",
            "flags": [],
            "precision": "fp16",
            "seeds": {"1": seed},
            **({"paired_bs": {"1": {"bleu_p": p, "chrf_p": p}}} if p is not None else {}),
        }
    return {
        "settings": {"width": 512, "minutes": 4.5},
        "groups": {"wang": {"baseline": "postnorm_6", "systems": systems}},
    }


def test_a_window_goes_into_the_study_ledger_and_the_docs_say_which_claims_hold(tmp_path, capsys):
    """``record`` writes one entry per system (epochs, updates, plateau or budget, best valid
    loss, BLEU with its signature, chrF, p), tests a claim against another system on the
    hypotheses the window brought back, and the section says holds / does not hold / not yet run
    with the numbers compared; the plan then names the next group."""
    refs = [f"a man plays in the park number {i}" for i in range(30)]
    worse = [r.replace("plays", "runs").replace("park", "water") for r in refs]
    summary = _window_out(
        tmp_path,
        _results({"postnorm_6": (30.0, None), "postnorm_30": ("FloatingPointError: Minimum loss "
                  "scale reached (0.0001).", None), "prenorm_30": (31.0, 0.2),
                  "dlcl_30": (33.5, 0.001)}),
        {"dlcl_30/seed1/hyp.txt": refs, "prenorm_30/seed1/hyp.txt": worse,
         "prenorm_30/seed1/ref.txt": refs},
    )  # fmt: skip
    ledger, study_ledger = str(tmp_path / "ledger.json"), str(tmp_path / "study.json")
    gpu_session.main(
        ["record", str(summary), "--commit", "abc1234", "--device", "NVIDIA H100",
         "--date", "2026-12-01", "--ledger", ledger, "--study-ledger", study_ledger]
    )  # fmt: skip
    entries = {e["system"]: e for e in gpu_study.read_ledger(study_ledger)}
    assert set(entries) == {"postnorm_6", "postnorm_30", "prenorm_30", "dlcl_30"}
    assert gpu_session.read_ledger(ledger) == {}  # the study's steps are the study ledger's
    dlcl = entries["dlcl_30"]
    assert {k: dlcl[k] for k in ("part", "date", "commit", "device", "epochs", "updates")} == {
        "part": "study_wang", "date": "2026-12-01", "commit": "abc1234",
        "device": "NVIDIA H100", "epochs": 9, "updates": 1200,
    }  # fmt: skip
    assert (dlcl["plateau"], entries["postnorm_6"]["plateau"], dlcl["p"]) == (False, True, 0.001)
    assert dlcl["bleu_signature"] == "nrefs:1|tok:13a" and dlcl["p_against"]["prenorm_30"] < 0.05
    assert entries["postnorm_30"]["error"].startswith("FloatingPointError")

    text = gpu_study.section(gpu_study.read_ledger(study_ledger))
    rows = {line.split("|")[2].strip(): line for line in text.splitlines() if "| `" in line}
    assert "**holds** (training diverged)" in rows["`postnorm_30` below `postnorm_6`"]
    assert "**does not hold** (+1.00 BLEU, p = 0.200)" in rows["`prenorm_30` above `postnorm_6`"]
    assert (
        "**holds** (+3.50 BLEU, p = 0.001) | 33.50 | 30.00 | 0.001 |"
        in rows["`dlcl_30` above `postnorm_6`"]
    )
    assert "**holds** (+2.50 BLEU, p = 0.0" in rows["`dlcl_30` above `prenorm_30`"]
    assert "| not yet run | - | - | - | `run --steps study_depth_1` |" in text
    assert (
        "| study_wang | `dlcl_30` | 2026-12-01 | abc1234 | NVIDIA H100 | fp16 | 9 | 1200 |" in text
    )
    assert "`nrefs:1|tok:13a`" in text and "Run: 1 of 1." in text

    capsys.readouterr()
    gpu_session.main(["plan", "--ledger", ledger, "--study-ledger", study_ledger])
    plan = capsys.readouterr().out
    assert "then the study's depth group (window 1 of 2): study_depth_1" in plan
    assert "study_wang             4 systems" in plan and "run 2026-12-01 at abc1234" in plan


def test_the_committed_section_is_what_the_ledger_generates():
    """docs/study.md's "At Base width on a GPU" is generated from .ci/gpu/study_ledger.json: after
    a window is recorded (or a group or claim changes), run python .ci/gpu/gpu_session.py docs."""
    with open(gpu_study.DOC, encoding="utf-8") as f:
        committed = gpu_study.committed_section(f.read())
    generated = gpu_study.section(gpu_study.read_ledger())
    assert committed == generated, "run: python .ci/gpu/gpu_session.py docs"
    if not gpu_study.read_ledger():  # no group has run yet: every claim is still to run
        assert "**holds**" not in committed and "not yet run" in committed


def test_a_whole_window_runs_on_this_cpu_at_tiny_size(tmp_path, capsys, monkeypatch):
    """``run --tiny``: the window's own script on this CPU: Multi30K-named raw text prepared by the
    data step, the next group's real command (its systems side by side, epoch validation,
    patience, the best checkpoint decoded, scored against the raw references, bootstrapped) at
    width 16 for a few updates, its results copied out as they come and recorded into a study
    ledger (never the committed one: a CPU run is refused there), after which the plan names the
    group that follows."""
    raw = _raw_multi30k(tmp_path / "raw", train=200)
    out, study_ledger = tmp_path / "out", str(tmp_path / "study.json")
    common = ["--raw", str(raw), "--vocab-size", "40", "--work", str(tmp_path / "work")]
    common += ["--ledger", str(tmp_path / "ledger.json"), "--study-ledger", study_ledger]
    assert gpu_session.main(["run", "--tiny", "--out", str(out), *common]) == 0
    first = gpu_study.parts()[0]
    summary = json.loads((out / "window" / "summary.json").read_text())
    assert [(r["step"], r["status"]) for r in summary] == [
        ("data", "exit 0"),
        (first.name, "exit 0"),
    ]
    assert sorted(os.listdir(out / "window")) == sorted(
        ["summary.json", "summary.md", f"{first.name}.results.json", f"{first.name}.results.md"]
    )
    gpu_session.main(
        ["record", str(out / "window" / "summary.json"), "--commit", "tiny", "--device", "CPU",
         "--ledger", str(tmp_path / "ledger.json"), "--study-ledger", study_ledger]
    )  # fmt: skip
    entries = gpu_study.read_ledger(study_ledger)
    assert [e["system"] for e in entries] == list(first.systems)
    monkeypatch.setattr(gpu_study, "STUDY_LEDGER", study_ledger)  # as if the committed one
    with pytest.raises(SystemExit, match="ran on the CPU .* holds GPU windows only"):
        gpu_study.record(str(out / "window" / "summary.json"), "d", "tiny", "CPU", study_ledger)
    assert gpu_study.read_ledger(study_ledger) == entries
    for e in entries:
        assert "bleu" in e, e
        assert e["epochs"] >= 0 and e["updates"] > 0 and e["stopped"] in ("plateau", "max_update")
        assert e["precision"] == "fp32" and e["bleu_signature"].startswith("nrefs:1")
        assert (e["p"] is None) == (e["system"] == first.baseline)
    # wang's claim of DLCL against pre-norm: tested on the hypotheses in the window's tarball
    assert first.name == "study_wang"
    by_system = {e["system"]: e for e in entries}
    assert set(by_system["dlcl_30"]["p_against"]) == {"prenorm_30"}
    assert gpu_study.next_part(entries).name == gpu_study.parts()[1].name
