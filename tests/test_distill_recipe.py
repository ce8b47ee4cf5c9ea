"""examples/distill/run.sh and its decisions (fairseq_deep/distill_recipe.py): the commands parse
with each program's own parser, the student takes the teacher's width and the flags given, the
budget is split as said, bad input is one line before any work, and a dry run of run.sh (the
console scripts stubbed) runs the steps in order with the commands printed in full."""

import argparse
import io
import os
import shlex
import shutil
import subprocess
import sys

import pytest
from helpers import run_cli
from test_distill import TEACHER, preprocess
from test_own_data import assignments

from fairseq_deep import distill_recipe as dr
from fairseq_deep import own_data
from fairseq_deep.data.synthetic import write_corpus
from fairseq_deep.errors import UserError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN_SH = os.path.join(REPO, "examples", "distill", "run.sh")


@pytest.fixture(scope="module")
def setting(tmp_path_factory):
    """Raw text, its data-bin and a tiny DLCL teacher (width 16) trained on it."""
    root = tmp_path_factory.mktemp("recipe")
    prefixes = write_corpus(str(root / "raw"), train=60, valid=8, test=8, seed=4)
    preprocess(prefixes, root / "bin", "--joined-dictionary")
    run_cli("fairseq-deep-train", str(root / "bin"), *TEACHER, "--save-dir", str(root / "ck"))
    return {
        "root": root,
        "raw": root / "raw",
        "bin": str(root / "bin"),
        "teacher": str(root / "ck" / "checkpoint_last.pt"),
    }


def env_for(setting, tmp_path, **extra):
    raw = setting["raw"]
    return {
        "TEACHER": setting["teacher"],
        "DATA_BIN": setting["bin"],
        "REF": str(raw / "test.tgt"),
        "SOURCE": str(raw / "test.src"),
        "WORK": str(tmp_path / "work"),
        "DEVICE": "--cpu",
        "MINUTES": "10",
        **extra,
    }


def run_setup(argv, env):
    out, log = io.StringIO(), io.StringIO()
    dr.setup(argv, env, out=out, log=log, translate_script="translate.py")
    return assignments(out.getvalue()), log.getvalue()


def test_the_commands_parse_with_their_programs_parsers_and_take_the_teachers_width(
    setting, tmp_path
):
    env = env_for(setting, tmp_path)
    values, log = run_setup(["--encoder-layers", "12", "--decoder-layers", "1"], env)
    work = env["WORK"]
    distilled = os.path.join(work, "distilled")
    student = own_data.check_train_command(values["STUDENT"][1:])
    assert values["STUDENT"][:2] == ["fairseq-deep-train", distilled]
    assert student.arch == own_data.STUDENT_ARCH and student.encoder_embed_dim == 16
    assert (student.encoder_layers, student.decoder_layers) == (12, 1)  # the flags win
    assert student.save_dir == values["SAVE"] and os.path.dirname(student.save_dir).startswith(work)
    assert own_data.why_not_served(student) is None  # the student exports
    distill = dr.check_distill_command(values["DISTILL"])
    assert values["DISTILL"][:2] == ["fairseq-deep-distill", setting["bin"]]
    assert distill.destdir == distilled and distill.beam == 5 and distill.cpu
    assert "--path" not in values["DISTILL"]  # run.sh adds the teacher
    generate = values["GENERATE"]
    assert generate[:2] == ["fairseq-deep-generate", distilled]
    export = values["EXPORT"]
    assert export[:5] == [
        "fairseq-deep-export",
        "--data",
        distilled,
        "--out",
        os.path.join(work, "ctranslate2"),
    ]
    translate = values["TRANSLATE"]
    assert translate[:2] == ["translate.py", os.path.join(work, "ctranslate2")]
    assert "--fastest" in translate  # the export's choice of backend, compute type and threads
    for decoding, timing in (("--beam", "--beam"), ("--max-len-a", "--max-len-a")):
        # served with the decoding it was timed with, fairseq-generate's
        value = generate[generate.index(decoding) + 1]
        assert translate[translate.index(decoding) + 1] == value
        assert export[export.index("--timing-" + timing[2:]) + 1] == value
    assert (
        translate[translate.index("--batch") + 1] == export[export.index("--timing-batch-size") + 1]
    )
    # the budget's split, said at the start
    assert values["BUDGET_S"] == "600" and values["DISTILL_S"] == str(int(600 * dr.DISTILL_SHARE))
    assert values["RESERVE_S"] == str(int(600 * own_data.DECODE_SHARE))
    assert f"MINUTES=10: {values['DISTILL_S']} s for distillation" in log
    assert f"a {own_data.STUDENT_ARCH} student at width 16" in log
    # WIDTH given wins over the teacher's
    values, _ = run_setup([], {**env, "WIDTH": "32"})
    assert own_data.check_train_command(values["STUDENT"][1:]).encoder_embed_dim == 32


@pytest.mark.parametrize(
    "change, words",
    [
        ({"DATA_BIN": ""}, "set DATA_BIN too"),
        ({"TEACHER": "/nonexistent/ck.pt"}, "/nonexistent/ck.pt"),
        ({"DATA_BIN": "/nonexistent"}, "DATA_BIN=/nonexistent: no such folder"),
        ({"REF": "/nonexistent/ref"}, "REF=/nonexistent/ref: no such file"),
        ({"SOURCE": ""}, "set SOURCE too"),
        ({"STUDENT_ARCH": "transformer_dlcl"}, "CTranslate2 cannot serve it"),
        ({"STUDENT_ARCH": "transformer_prenrm"}, "transformer_prenorm"),
        ({"TEACHER": ""}, "set TEACHER=CK.pt DATA_BIN=DIR, or SRC"),
        ({"MINUTES": "x"}, "MINUTES=x: not a number"),
    ],
)
def test_each_mistake_is_one_line_before_any_work(setting, tmp_path, change, words):
    env = {**env_for(setting, tmp_path), **change}
    with pytest.raises(UserError, match=None) as e:
        run_setup([], env)
    assert words in str(e.value) and "\n" not in str(e.value)
    assert not os.path.exists(env["WORK"])


def test_a_student_flag_fairseq_does_not_know_is_one_line(setting, tmp_path):
    with pytest.raises(UserError) as e:
        run_setup(["--encoder-layerz", "3"], env_for(setting, tmp_path))
    assert "--encoder-layerz" in str(e.value)


def test_without_a_teacher_the_own_data_recipe_trains_one(setting, tmp_path):
    env = env_for(setting, tmp_path, TEACHER="", DATA_BIN="", REF="", SOURCE="")
    env.update(SRC="src", TGT="tgt", RAW=str(setting["raw"]), TEACHER_MINUTES="7")
    values, log = run_setup([], env)
    work = env["WORK"]
    assert values["TEACHER"] == "" and values["TEACHER_MINUTES"] == "7"
    assert values["DATA_BIN"] == os.path.join(work, "teacher", "data-bin")
    assert values["REF"] == str(setting["raw"] / "test.tgt")
    assert "--spm" in values["TRANSLATE"]
    assert "a transformer_dlcl teacher trained first by examples/own_data/run.sh" in log
    # the teacher it distils: the average the own-data recipe wrote, else its best
    save = tmp_path / "t" / "checkpoints" / "transformer_dlcl_w128"
    save.mkdir(parents=True)
    (save / "checkpoint_best.pt").write_text("")
    assert dr.own_teacher(str(tmp_path / "t")) == str(save / "checkpoint_best.pt")
    (save / "checkpoint_average.pt").write_text("")
    assert dr.own_teacher(str(tmp_path / "t")) == str(save / "checkpoint_average.pt")
    with pytest.raises(UserError, match="no transformer_dlcl checkpoint"):
        dr.own_teacher(str(tmp_path / "none"))


#: the console scripts, stubbed: each records its arguments; training saves the teacher as the
#: student's checkpoints; generate prints the references as hypotheses
STUBS = {
    "fairseq-deep-distill": 'printf "%q " "$@" > "$STUB_OUT/distill.args"\n',
    "fairseq-deep-train": 'printf "%q " "$@" > "$STUB_OUT/train.args"\n'
    'save=$(python -c "import sys; a = sys.argv[1:]; print(a[a.index(\'--save-dir\') + 1])" "$@")\n'
    'mkdir -p "$save"; cp "$STUB_TEACHER" "$save/checkpoint_last.pt"\n'
    'cp "$STUB_TEACHER" "$save/checkpoint_best.pt"; echo "2026 | INFO | train | done training"\n',
    "fairseq-deep-generate": 'printf "%q " "$@" > "$STUB_OUT/generate.args"\n'
    'n=0; while IFS= read -r ref; do printf "S-%d\\tx\\nH-%d\\t-0.1\\t%s\\nD-%d\\t-0.1\\t%s\\n" '
    '"$n" "$n" "$ref" "$n" "$ref"; n=$((n + 1)); done < "$STUB_REF"\n',
    "fairseq-deep-export": 'printf "%q " "$@" > "$STUB_OUT/export.args"\n'
    'out=$(python -c "import sys; a = sys.argv[1:]; print(a[a.index(\'--out\') + 1])" "$@")\n'
    'mkdir -p "$out"; echo "{}" > "$out/fairseq_deep_export.json"\n',
}
#: CTranslate2's translator, stubbed: the references
TRANSLATE = (
    'import os, sys\nsys.stdin.read()\nsys.stdout.write(open(os.environ["STUB_REF"]).read())\n'
)


def test_run_sh_dry_run_runs_the_steps_in_order_and_resumes(setting, tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in STUBS.items():
        (bin_dir / name).write_text("#!/usr/bin/env bash\nset -eu\n" + body)
        (bin_dir / name).chmod(0o755)
    (tmp_path / "translate.py").write_text(TRANSLATE)
    env = dict(
        os.environ,
        **env_for(setting, tmp_path),
        AVERAGE="0",
        OMP_NUM_THREADS="1",
        STUB_OUT=str(tmp_path),
        STUB_REF=str(setting["raw"] / "test.tgt"),
        STUB_TEACHER=setting["teacher"],
        TRANSLATE_SCRIPT=str(tmp_path / "translate.py"),
        PATH=os.pathsep.join([str(bin_dir), os.path.dirname(sys.executable), os.environ["PATH"]]),
        PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]),
    )
    proc = subprocess.run(
        ["bash", RUN_SH, "--decoder-layers", "1"], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    steps = [line for line in out.splitlines() if line.startswith("== ")]
    assert [s[:6] for s in steps] == ["== 1/5", "== 2/5", "== 3/5", "== 4/5", "== 5/5"]
    distill = shlex.split((tmp_path / "distill.args").read_text())
    assert distill[-2:] == ["--path", setting["teacher"]]
    # every command printed in full: the shell gives the program what run.sh gave it
    for name, program in (("distill", "fairseq-deep-distill"), ("train", "fairseq-deep-train")):
        shown = [x for x in out.splitlines() if x.startswith(f"   {program} ")]
        assert len(shown) == 1, out
        assert shlex.split(shown[0])[1:] == shlex.split((tmp_path / f"{name}.args").read_text())
    train = shlex.split((tmp_path / "train.args").read_text())
    assert "--stop-time-hours" in train and train[-4:-2] == ["--decoder-layers", "1"]
    assert "export.args" in os.listdir(tmp_path)
    # both scores: fairseq-generate's and CTranslate2's translations are the references here
    assert "sacreBLEU BLEU = 100.00" in out, out  # the own-data recipe's score line
    ct2 = out[out.index("== 5/5") :]  # fairseq-deep-score's BLEU and chrF lines
    assert "BLEU|nrefs:1|" in ct2 and ct2.count("= 100.00") == 2, out
    # again: the export is kept, the rest runs again (distill and train resume by themselves)
    os.remove(tmp_path / "export.args")
    proc = subprocess.run(["bash", RUN_SH], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "an earlier run's export): kept" in proc.stdout
    assert not (tmp_path / "export.args").exists()
    shutil.rmtree(tmp_path / "work")


def test_run_sh_is_valid_bash():
    subprocess.run(["bash", "-n", RUN_SH], check=True)


# ------------------------------------------------------------------ benchmarks/distill.py's logic


def test_the_benchmarks_plan_gives_every_student_system_the_same_minutes():
    from benchmarks import distill as bench

    plan = bench.plan_minutes(10, 30, 2, bench.SYSTEMS)
    assert {plan[name] for name in bench.SYSTEMS} == {10.0}
    assert plan["teacher 1"] == plan["teacher 2"] == 30.0
    assert plan["total"] == 2 * 30 + len(bench.SYSTEMS) * 10
    assert bench.plan_minutes(5, 30, 0, ["original"]) == {"original": 5.0, "total": 5.0}
    # a checkpoint's clock off the budget by more than the tolerance is flagged, with why
    ok = 600 * (1 - bench.TIME_TOLERANCE) + 1
    off = bench.unequal_time({"original": 600.0, "word": ok, "gpkd": 300.0, "x": None}, 10)
    assert off == ["gpkd: trained 300 s of 600 s", "x: training time unknown"]


def test_the_benchmarks_table_and_results_are_written_from_the_results(tmp_path):
    from benchmarks import distill as bench

    refs = ["a small dog runs .", "two men sit on a bench .", "the cat sleeps ."] * 4
    hyps = {
        "teacher": list(refs),
        "original": ["a dog ."] * 12,
        "distilled": list(refs[:11]) + ["x"],
    }
    scores = bench.compare(refs, hyps, n_samples=50)
    assert scores["teacher"]["bleu"] == pytest.approx(100.0)
    assert "bleu_p" not in scores["original"] and 0 <= scores["distilled"]["bleu_p"] <= 1
    results = {
        "systems": {
            name: {
                "what": name,
                "minutes": 10.0,
                "updates": 1234,
                **scores[name],
                "sentences_per_s": 10.0 * (i + 1),
                "speed_ratio": float(i + 1),
            }
            for i, name in enumerate(hyps)
        },
        "notes": ["not equal time: gpkd: trained 300 s of 600 s"],
    }
    text = bench.write_results(results, str(tmp_path))
    lines = text.splitlines()
    assert lines[0].startswith("| system | what | train min | updates | BLEU | chrF |")
    row = {line.split("|")[1].strip(): line for line in lines[2:5]}
    assert set(row) == set(hyps)
    assert "| 100.00 |" in row["teacher"] and "| 3.00x |" in row["distilled"]
    assert "1,234" in row["original"] and "| - |" in row["original"]  # no p against itself
    assert text.endswith("- not equal time: gpkd: trained 300 s of 600 s")
    assert (tmp_path / "results.md").read_text() == text + "\n"
    import json

    assert json.loads((tmp_path / "results.json").read_text())["systems"]["teacher"]["bleu"] == (
        pytest.approx(100.0)
    )


def test_the_export_command_parses_with_fairseq_deep_exports_parser(setting, tmp_path, capsys):
    """fairseq-deep-export's parser is built in its cli_main: the recipe's command (the checkpoint
    run.sh adds, here one that does not exist) gets past it to the checkpoint's check, while a
    mistyped option stops in the parser."""
    from fairseq_deep import export

    values, _ = run_setup([], env_for(setting, tmp_path))
    missing = str(tmp_path / "student.pt")
    with pytest.raises(SystemExit):
        export.cli_main([*values["EXPORT"][1:], "--checkpoint", missing])
    assert f"--checkpoint {missing}: no such checkpoint file" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        export.cli_main([*values["EXPORT"][1:], "--checkpoint", missing, "--outt", "x"])
    assert "--outt" in capsys.readouterr().err


def test_run_sh_stops_a_distillation_past_its_share_and_says_to_run_again(setting, tmp_path):
    """MINUTES's share for distillation ends it (timeout, Ctrl-C's signal: distill resumes from its
    chunks); run.sh says so in one line, exit status 3, and trains nothing."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub = bin_dir / "fairseq-deep-distill"
    stub.write_text("#!/usr/bin/env bash\nsleep 30\n")
    stub.chmod(0o755)
    env = dict(
        os.environ,
        **env_for(setting, tmp_path, MINUTES="0.05"),  # 3 s: 1 s for distillation
        PATH=os.pathsep.join([str(bin_dir), os.path.dirname(sys.executable), os.environ["PATH"]]),
        PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]),
    )
    proc = subprocess.run(["bash", RUN_SH], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "run.sh: distillation did not end in its 1 s of MINUTES; run the same command again: it "
        "resumes where it stopped (or give a larger MINUTES)"
    )
    assert "== 2/5" not in proc.stdout


def test_the_benchmark_refuses_a_distilled_folder_it_cannot_vouch_for(tmp_path, capsys):
    """--distilled reuses another run's distillation: only fairseq-deep-distill's output (its
    distill.json) and with the --teacher that wrote it, refused before anything is prepared."""
    from benchmarks import distill as bench
    from fairseq_deep import serving

    teacher = tmp_path / "teacher.pt"
    teacher.write_bytes(b"")
    folder = tmp_path / "distilled"
    folder.mkdir()
    work = tmp_path / "work"
    for extra in ([], ["--teacher", str(teacher)]):
        with pytest.raises(SystemExit, match="distill.json"):
            bench.main(["--work-dir", str(work), "--distilled", str(folder)] + extra)
    assert not work.exists()
    row = {
        "backend": "CT2_USE_MKL=0",
        "compute_type": "int8",
        "intra_threads": 1,
        "inter_threads": 2,
    }
    assert serving.setting_name(row) == "CT2_USE_MKL=0 int8, intra_threads 1, inter_threads 2"
    assert serving.setting_name({**row, "backend": None}).startswith("int8, ")


def test_the_benchmark_reads_the_distillations_speed_and_extrapolates_it_to_wmt(tmp_path):
    """Issue 47, item 4: the teacher's translation of the training set, as fairseq-deep-distill's
    last progress line reports it, and the hours a WMT-sized set would take at that rate, in
    results.json and as a note under the table; none from a log without a progress line."""
    from benchmarks import distill as bench

    log = (
        "... | fairseq_deep.progress | progress: 1,792/2,000 sentences (89.6%) | 15.4 sentences/s"
        " | elapsed 0:01:56 | ETA 0:00:14\n"
        "... | fairseq_deep.distill | progress: 2,000/2,000 sentences (100.0%) | 1,250.0 "
        "sentences/s | elapsed 0:00:02 | ETA 0:00:00\n"
    )
    d = bench.distillation_speed(log, 9.5, 15.0)
    assert (d["sentences"], d["decoded"], d["sentences_per_s"]) == (2000, 2000, 1250.0)
    assert d["wmt_hours"] == pytest.approx(bench.WMT_PAIRS / 1250 / 3600)  # 1.0 hour
    assert bench.distillation_speed("... is complete: nothing to do\n", 3.0, 15.0) is None
    text = bench.write_results({"systems": {}, "distillation": d}, str(tmp_path))
    assert text.endswith(
        "- the teacher translated the training set (2,000 sentences, 15.0 source pieces each) at "
        "1,250.0 sentences/s (10 s with its start); a WMT-sized set (4.5M pairs) would take 1.0 "
        "hours at that rate, longer as its sentences are longer"
    )


def test_ctranslate2_failing_on_a_device_is_one_line_and_leaves_the_rows_out(monkeypatch):
    """CTranslate2 that cannot run where the benchmark asks (on a GPU machine whose CUDA is of
    another major version than its build's) leaves its two rows out with why in one line; the
    run's other figures are kept (main writes them, then exits non-zero)."""
    from benchmarks import distill as bench
    from benchmarks import export_speed

    def missing(*args, **kwargs):
        raise RuntimeError("Library libcublas.so.12 is not found or cannot be loaded")

    monkeypatch.setattr(export_speed, "ctranslate2_translate", missing)
    rows = bench.ctranslate2_rows(
        argparse.Namespace(device="cuda", compute_type="default"), "m", []
    )
    assert rows == {
        "failed": "CTranslate2 on cuda failed: RuntimeError: Library libcublas.so.12 is not found "
        "or cannot be loaded"
    }


def test_a_student_trained_its_minutes_already_is_not_trained_again(tmp_path, monkeypatch):
    """Run again on the same work folder, the benchmark reuses a student whose checkpoint's clock
    has reached its minutes (fairseq resumed past --stop-time-hours would make one more update
    and save it, changing the published model); one short of them resumes."""
    from benchmarks import distill as bench
    from fairseq_deep.runs import Run

    started = []
    monkeypatch.setattr(bench, "run", lambda what, log, threads: started.append(what))
    base = Run.of("train", str(tmp_path / "data"), ["--arch", "transformer_prenorm"])
    a = argparse.Namespace(threads=1)
    # the stamp of a run with these options (a checkpoint without one is never reused)
    save = tmp_path / "checkpoints" / "original"
    save.mkdir(parents=True)
    words = base.plus(bench.recipes.budget(stop_time_hours=10 / 60)).arguments()
    bench.harness.write_json(str(save / "run.json"), words)
    for seconds, runs in ((600.0, 0), (590.0, 1)):
        monkeypatch.setattr(bench, "train_seconds", lambda path, s=seconds: s)
        best = bench.train(a, str(tmp_path), "original", base, 10)
        assert best == str(tmp_path / "checkpoints" / "original" / "checkpoint_best.pt")
        assert len(started) == runs
