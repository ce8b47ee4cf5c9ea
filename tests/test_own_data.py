"""examples/own_data/run.sh and its decisions (fairseq_deep/own_data.py): every argument checked before
any work, the budget and sizes derived for the device, the checkpoints to average, one sacreBLEU line."""

import io
import os
import re
import shlex
import subprocess
import sys

import pytest

from fairseq_deep import own_data
from fairseq_deep.data.synthetic import write_corpus
from fairseq_deep.errors import UserError
from fairseq_deep.models import families

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN_SH = os.path.join(REPO, "examples", "own_data", "run.sh")


@pytest.fixture(scope="module")
def raw(tmp_path_factory):
    out = tmp_path_factory.mktemp("raw")
    write_corpus(str(out), train=50, valid=7, test=9, seed=2)
    return str(out)


def env_for(raw, tmp_path, **extra):
    return {
        "SRC": "src",
        "TGT": "tgt",
        "RAW": raw,
        "WORK": str(tmp_path / "work"),
        "DEVICE": "--cpu",
        **extra,
    }


def assignments(text):
    """The shell assignments of ``setup``: NAME=value and NAME=(a b c), as bash reads them."""
    values = {}
    for line in text.splitlines():
        name, _, value = line.partition("=")
        if value.startswith("("):
            values[name] = shlex.split(value[1:-1])
        else:
            values[name] = shlex.split(value)[0] if value else ""
    return values


#: a speed as measure_speed gives it (the real one: test_setup_times_the_recipes_model_here)
SPEED = own_data.Speed(encoder_s=0.1, step_s=0.05, forward_s=0.2, pieces=10)


def run_setup(argv, env, speed=SPEED):
    out, log = io.StringIO(), io.StringIO()
    own_data.setup(argv, env, out=out, log=log, measure=lambda *a: speed)
    return assignments(out.getvalue()), log.getvalue()


def test_run_sh_stops_on_a_mistyped_arch_in_one_line_before_preparing(raw, tmp_path):
    env = dict(
        os.environ,
        **env_for(raw, tmp_path),
        OMP_NUM_THREADS="1",
        PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]),
    )
    proc = subprocess.run(
        ["bash", RUN_SH, "transformer_dlcx"],
        env=env,
        capture_output=True,
        text=True,
        cwd=str(tmp_path),
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("run.sh: error: --arch transformer_dlcx"), (
        proc.stderr
    )
    assert "did you mean transformer_dlcl" in lines[0]  # issue 32
    assert not (tmp_path / "work").exists() and proc.stdout == ""  # nothing prepared, nothing said


@pytest.mark.parametrize(
    "argv, env_extra, names",
    [
        (["transformer_dlcl", "--no-such-flag"], {}, "--no-such-flag"),
        (["transformer_dlcl", "--encoder-layers", "six"], {}, "--encoder-layers"),
        (["transformer_dlcl"], {"TGT": "src"}, "both 'src'"),
        (["transformer_dlcl"], {"TGT": "de"}, "train.de"),
        (["transformer_dlcl"], {"MINUTES": "ten"}, "MINUTES=ten"),
        (["transformer_dlcl"], {"RAW": "/no/such/folder"}, "RAW=/no/such/folder"),
    ],
)
def test_setup_names_each_mistake_before_any_work(raw, tmp_path, argv, env_extra, names):
    with pytest.raises(UserError, match=re.escape(names)):
        run_setup(argv, {**env_for(raw, tmp_path), **env_extra})
    assert not (tmp_path / "work").exists()


@pytest.mark.parametrize(
    "emptied, fragment", [("test.tgt", "test.src has 9 lines and"), ("valid", "is empty")]
)
def test_empty_inputs_are_refused_before_any_folder_is_made(raw, tmp_path, emptied, fragment):
    """Issue 32: an empty test.fr passed and left an empty work folder."""
    import shutil

    mine = tmp_path / "raw"
    shutil.copytree(raw, mine)
    for name in os.listdir(mine):
        if name.startswith(emptied):
            (mine / name).write_text("")
    with pytest.raises(UserError, match=re.escape(fragment)):
        run_setup(["transformer_dlcl"], {**env_for(str(mine), tmp_path)})
    assert not (tmp_path / "work").exists()


def multi30k_names(raw, tmp_path):
    """RAW as Multi30k names its files: val.* for valid.*, test_2016_flickr.* for test.*, gzipped."""
    import gzip

    mine = tmp_path / "m30k"
    mine.mkdir()
    for split, name in (("train", "train"), ("valid", "val"), ("test", "test_2016_flickr")):
        for lang in ("src", "tgt"):
            with open(os.path.join(raw, f"{split}.{lang}"), "rb") as f, gzip.open(
                mine / f"{name}.{lang}.gz", "wb"
            ) as g:
                g.write(f.read())
    return mine


def test_multi30ks_own_names_are_taken_or_named(raw, tmp_path):
    """Issue 46: RAW without valid.* but with Multi30k's val.* validates on them, and says so;
    without test.*, the error names the test_2016_flickr.* found beside it and what to do."""
    mine = multi30k_names(raw, tmp_path)
    with pytest.raises(UserError) as e:
        run_setup(["transformer_dlcl"], env_for(str(mine), tmp_path))
    assert str(e.value) == (
        f"no file {mine}/test.src (or {mine}/test.src.gz); {mine} holds test_2016_flickr.src.gz: "
        "name (or link) the one to use test.src.gz"
    )
    assert not (tmp_path / "work").exists()
    for lang in ("src", "tgt"):
        os.symlink(mine / f"test_2016_flickr.{lang}.gz", mine / f"test.{lang}.gz")
    values, log = run_setup(["transformer_dlcl"], env_for(str(mine), tmp_path))
    assert values["PREFIX_VALID"] == str(mine / "val") and values["PREFIX_TEST"] == str(
        mine / "test"
    )
    assert (
        f"run.sh: the valid set is {mine}/val.src.gz and {mine}/val.tgt.gz (no valid.src, "
        f"valid.tgt in {mine}: val.* taken instead)"
    ) in log.splitlines()
    # valid.* where they are: taken, val.* beside them left alone
    (mine / "valid.src").write_text("a b\n")
    (mine / "valid.tgt").write_text("c d\n")
    values, log = run_setup(["transformer_dlcl"], env_for(str(mine), tmp_path))
    assert values["PREFIX_VALID"] == str(mine / "valid") and "taken instead" not in log
    # half of val.*: not taken, and named
    (mine / "valid.tgt").unlink()
    (mine / "val.tgt.gz").unlink()
    with pytest.raises(UserError, match=re.escape(f"no file {mine}/valid.tgt (or")):
        run_setup(["transformer_dlcl"], env_for(str(mine), tmp_path))


def test_an_earlier_runs_files_are_kept_with_one_number(tmp_path):
    """Issue 46: a second run in the same WORK overwrote the first's train.log, generate.out,
    score.txt and test.hyp; they are kept as NAME.N, N the first number none of them has, so that
    one run's files share it."""
    work = tmp_path / "work"
    assert own_data.earlier_run(str(work)) == (0, [])
    work.mkdir()
    assert own_data.earlier_run(str(work)) == (0, [])
    for name in ("train.log", "score.txt"):
        (work / name).write_text("run 2")
    (work / "generate.out.1").write_text("run 1")  # the first run's, a failed decoding: no score
    n, renamed = own_data.earlier_run(str(work))
    assert n == 2 and renamed == [
        (str(work / "train.log"), str(work / "train.log.2")),
        (str(work / "score.txt"), str(work / "score.txt.2")),
    ]
    assert set(own_data.RUN_FILES) == {"train.log", "generate.out", "score.txt", "test.hyp"}


def fake_checkpoint(updates, warmup, max_update=0, seconds=383.0):
    return {
        "model": {},
        "optimizer_history": [{"num_updates": updates}],
        "cfg": {
            "lr_scheduler": {"warmup_updates": warmup},
            "optimization": {"max_update": max_update},
        },
        "extra_state": {"previous_training_time": seconds},
    }


def test_a_training_that_ends_before_its_warmup_does_is_said_with_what_to_do(tmp_path):
    """Issue 46: 383 of 400 warm-up updates fitted the budget, and nothing said so (training's
    early warning foresaw the end of warm-up at the speed of its first updates).  Decoding's
    checkpoint step says so, with the MINUTES that reach it at the run's speed (383 updates in
    383 s: 400 s, and the recipe's 120 s outside training: MINUTES=9) or a shorter warm-up."""
    warning = own_data.short_of_warmup(fake_checkpoint(383, 400), "MINUTES 120")
    assert warning == (
        "training ended after 383 updates, before the end of warm-up (--warmup-updates 400): the "
        "learning rate never reached its peak. A larger MINUTES (MINUTES=9 reaches it at this run's "
        "speed), or a shorter warm-up (WARMUP=191 or less), trains past it"
    )
    assert "A larger MINUTES, or" in own_data.short_of_warmup(fake_checkpoint(383, 400))
    assert "A larger MAX_UPDATE (400 or more)" in own_data.short_of_warmup(
        fake_checkpoint(300, 400, max_update=300)
    )
    for state in (fake_checkpoint(400, 400), fake_checkpoint(383, 0), {"model": {}}):
        assert own_data.short_of_warmup(state) is None
    save = tmp_path / "save"
    save.mkdir()
    import torch

    torch.save(fake_checkpoint(383, 400), save / "checkpoint_last.pt")
    log = io.StringIO()
    assert own_data.checkpoint(str(save), 0, log=log) == str(save / "checkpoint_best.pt")
    first = log.getvalue().splitlines()[0]
    assert first.startswith("run.sh: warning: training ended after 383 updates, before the end of")


def test_decodings_reserve_is_the_speed_measured_and_at_most_its_share(raw, tmp_path):
    """Issue 40: the seconds kept for decoding are those of the speed measured on this machine
    (the encoder and the steps of beam search of the recipe's model, to the length bound), at
    most DECODE_SHARE of the budget; more, and setup says so with the MINUTES that keep enough."""
    values, log = run_setup(["transformer_dlcl"], {**env_for(raw, tmp_path), "MINUTES": "30"})
    bound = SPEED.decoding_s(9)  # one batch: 0.1 s + (1.2 x 10 + 11) steps x 0.05 s
    assert bound == pytest.approx(0.1 + 23 * 0.05)
    assert int(values["DECODE_ALL_S"]) == 2 and "up to" not in log  # ceil(1.25 s): all of it kept
    assert "decoding 1 s" in log and "50 ms a step of beam search of 128 sentences" in log
    slow = own_data.Speed(encoder_s=1.0, step_s=2.0, forward_s=0.2, pieces=10)  # 47 s a batch
    values, log = run_setup(["transformer_dlcl"], {**env_for(raw, tmp_path), "MINUTES": "3"}, slow)
    assert (
        int(values["DECODE_ALL_S"]) == 47 and float(values["DECODE_SHARE"]) == own_data.DECODE_SHARE
    )
    # what training's warning of a budget too small to learn is told (FAIRSEQ_DEEP_RECIPE_BUDGET)
    assert int(values["RESERVE_FIXED_S"]) + own_data.DECODE_SHARE * 180 == pytest.approx(
        int(values["RESERVE_S"]), abs=1
    )
    line = [x for x in log.splitlines() if "could take up to" in x][0]
    assert "decoding all 9 test sentences could take up to 47 s" in line
    assert "36 s are kept for it" in line and "MINUTES=4 keeps enough for all" in line  # 47 / 0.2 s
    assert "DECODE_FRACTION" not in values  # how much is decoded is decoding's decision, measured


def test_setup_times_the_recipes_model_here():
    """measure_speed on the recipe's model (tiny here): a forward of a batch, its encoder and
    steps of fairseq's beam search, timed; the bound grows with the test set."""
    settings = own_data.settings_from_env({"WIDTH": "32"}, "cpu")
    cmd = own_data.train_command(
        settings,
        families.spec("transformer_dlcl"),
        "d",
        "s",
        ["--encoder-layers", "2", "--decoder-layers", "2"],
    )
    speed = own_data.measure_speed(own_data.check_train_command(cmd), 50, 3, 2, "cpu")
    assert speed.pieces == 5 and speed.batch == own_data.DECODE_BATCH  # round(1.3 x 3) + 1
    assert speed.encoder_s > 0 and speed.step_s > 0 and speed.forward_s > 0
    assert speed.decoding_s(1000) == 8 * speed.decoding_s(128) and speed.decoding_s(
        129
    ) > speed.decoding_s(128)


def test_setup_derives_the_cpu_budget_width_and_commands(raw, tmp_path):
    values, log = run_setup(["transformer_dlcl", "--encoder-layers", "3"], env_for(raw, tmp_path))
    assert values["DEVICE_KIND"] == "cpu" and values["BUDGET_S"] == "1800"  # 30 minutes in all
    assert 0 < int(values["RESERVE_S"]) < 1800
    train = values["TRAIN"]
    i = train.index("--encoder-embed-dim")
    assert train[i + 1] == "128" and "--cpu" in train and train[-2:] == ["--encoder-layers", "3"]
    assert (
        "--no-epoch-checkpoints" not in train
        and train[train.index("--keep-last-epochs") + 1] == "5"
    )
    assert "--stop-time-hours" not in train  # run.sh adds it after preparation, from what is left
    assert train[train.index("--save-dir") + 1].endswith(
        os.path.join("checkpoints", "transformer_dlcl_w128")
    )
    gen = values["GENERATE"]
    assert gen[gen.index("--post-process") + 1] == "sentencepiece" and "--max-len-a" in gen
    assert "width 128" in log and "30 minutes" in log


def test_budget_and_sizes_follow_the_device_and_the_environment():
    cpu, cuda = own_data.settings_from_env({}, "cpu"), own_data.settings_from_env({}, "cuda")
    assert (cpu.minutes, cpu.width, cpu.max_update) == (30, 128, 0)
    assert (cuda.width, cuda.max_update) == (512, 50000) and cuda.minutes >= 240
    mine = own_data.settings_from_env({"MINUTES": "2.5", "WIDTH": "128", "BEAM": "4"}, "cpu")
    assert (mine.minutes, mine.width, mine.beam) == (2.5, 128, 4)
    with pytest.raises(UserError, match="MINUTES=0 and MAX_UPDATE=0"):
        own_data.settings_from_env({"MINUTES": "0"}, "cpu")
    # the reserve (run.sh trains for the rest): start-ups, validation and decoding at the speed measured
    parts = own_data.reserve_parts(SPEED, 1000, 11, 500, 22, startup_s=20, max_tokens=2560)
    assert parts["start-ups"] == 70 and parts["decoding"] == SPEED.decoding_s(1000)
    assert parts["last update"] == pytest.approx(
        3 * 0.2 * 2560 / (128 * 10)
    )  # 2 batches' forward, x 3
    assert parts["validation"] == pytest.approx(500 / 128 * 0.2 * 2)  # sentences twice as long
    assert "--max-update" in own_data.train_command(
        cuda, families.spec("transformer_dlcl"), "d", "s", []
    )
    assert "--max-update" not in own_data.train_command(
        cpu, families.spec("transformer_dlcl"), "d", "s", []
    )


def test_checkpoints_averaged_are_the_last_of_the_second_half():
    epochs = [(f"checkpoint{e}.pt", 100 * e) for e in range(3, 8)]  # kept: epochs 3-7
    assert own_data.choose_checkpoints(750, epochs, 5) == [
        "checkpoint4.pt",
        "checkpoint5.pt",
        "checkpoint6.pt",
        "checkpoint7.pt",
        "checkpoint_last.pt",
    ]
    assert own_data.choose_checkpoints(750, epochs, 3) == [
        "checkpoint6.pt",
        "checkpoint7.pt",
        "checkpoint_last.pt",
    ]
    # stopped at an epoch's end: checkpoint_last is that epoch, not counted twice
    assert own_data.choose_checkpoints(700, epochs, 2) == ["checkpoint6.pt", "checkpoint_last.pt"]
    assert own_data.choose_checkpoints(250, [("checkpoint1.pt", 100)], 5) == []  # first half only
    assert own_data.choose_checkpoints(750, epochs, 0) == []


def test_score_prints_one_sacrebleu_line_and_says_what_fairseqs_bleu_is(tmp_path):
    ref = tmp_path / "ref.txt"
    ref.write_text("a small house .\nthe cat sat on the mat .\n")
    gen = tmp_path / "generate.out"
    gen.write_text(
        "S-1\tx\nH-1\t-0.1\tthe cat sat on the mat .\nD-1\t-0.1\tthe cat sat on the mat .\n"
        "D-0\t-0.2\ta small house .\n"
        "2026-01-01 | INFO | fairseq_cli.generate | Generate test with beam=5: BLEU4 = 87.50, 90/80\n"
    )
    out = io.StringIO()
    score = own_data.score(str(ref), str(gen), str(tmp_path / "hyp"), out=out)
    assert score == pytest.approx(100.0)
    assert (tmp_path / "hyp").read_text() == ref.read_text()  # input order
    lines = out.getvalue().splitlines()
    assert (
        len(lines) == 2 and lines[0].startswith("sacreBLEU BLEU = 100.00") and "nrefs:1" in lines[0]
    )
    assert "BLEU4 = 87.50" in lines[1] and "sacreBLEU" in lines[1]
    gen.write_text("D-5\t-0.2\ta small house .\n")
    with pytest.raises(UserError, match="1 hypotheses for 2 test sentences.*ids 5"):
        own_data.score(str(ref), str(gen), str(tmp_path / "hyp"), out=out)


def test_score_on_the_sentences_decoded_before_the_deadline_says_so(tmp_path):
    """Issue 26: decoding stopped at FAIRSEQ_DEEP_DEADLINE: sentences 1 and 3 of 4 decoded are
    scored against references 1 and 3 (by the ids of the S-/H-/D- lines), and the line says so."""
    ref = tmp_path / "ref.txt"
    ref.write_text(
        "one two three four\nthe cat sat on the mat .\nfive six seven eight\na small house is here .\n"
    )
    gen = tmp_path / "generate.out"
    gen.write_text(
        "2026-01-01 | WARNING | fairseq_deep.progress | decoding stopped at the deadline "
        "(FAIRSEQ_DEEP_DEADLINE; it passed 3 s ago): 2 of 4 sentences decoded\n"
        "S-3\tx\nH-3\t-0.1\ta small house is here .\nD-3\t-0.1\ta small house is here .\n"
        "S-1\ty\nH-1\t-0.1\tthe cat sat on the mat .\nD-1\t-0.1\tthe cat sat on the mat .\n"
    )
    out = io.StringIO()
    assert own_data.score(str(ref), str(gen), str(tmp_path / "hyp"), out=out) == pytest.approx(
        100.0
    )
    line = out.getvalue().splitlines()[0]
    assert line.startswith(
        "sacreBLEU on 2 of 4 test sentences (the budget ran out while decoding; "
        "a larger MINUTES decodes all): BLEU = 100.00"
    ), line
    # the translations keep the test set's lines: an empty one for each sentence not decoded
    assert (
        tmp_path / "hyp"
    ).read_text() == "\nthe cat sat on the mat .\n\na small house is here .\n"
    # fewer hypotheses without the deadline's warning: said too, with another reason
    gen.write_text("D-1\t-0.1\tthe cat sat on the mat .\n")
    own_data.score(str(ref), str(gen), str(tmp_path / "hyp"), out=out)
    assert (
        "sacreBLEU on 1 of 4 test sentences (fairseq-generate decoded only these" in out.getvalue()
    )
    # a subset decoded on purpose (issue 32)
    gen.write_text(
        "2026-01-01 | INFO | fairseq_deep.progress | decoding a subset (FAIRSEQ_DEEP_DECODE_FRACTION=0.5): "
        "...\nD-1\t-0.1\tthe cat sat on the mat .\n"
    )
    own_data.score(str(ref), str(gen), str(tmp_path / "hyp"), out=out)
    assert (
        "sacreBLEU on 1 of 4 test sentences (a subset of every length, as FAIRSEQ_DEEP_DECODE_FRACTION asked)"
        in out.getvalue()
    )
    # a subset sized by the decoding speed measured (issue 40)
    gen.write_text(
        "2026-01-01 | WARNING | fairseq_deep.progress | decoding a subset (the speed measured): at 3.0 "
        "sentences/s ...\nD-1\t-0.1\tthe cat sat on the mat .\n"
    )
    own_data.score(str(ref), str(gen), str(tmp_path / "hyp"), out=out)
    assert (
        "sacreBLEU on 1 of 4 test sentences (a subset of every length, as much as the time left allowed at "
        "the decoding speed measured; " in out.getvalue()
    )


STUBS = {  # fairseq-deep-* stand-ins for a dry run of run.sh: they record what they are given
    "fairseq-deep-prepare": 'mkdir -p "$WORK"\n',
    "fairseq-deep-train": 'echo "$*" > "$STUB_OUT/train.args"\n'
    # fairseq's configuration and model printout (the log only), a progress line (shown)
    "echo \"2026-01-01 | INFO | fairseq_cli.train | {'_name': None, 'common': {}}\"\n"
    'echo "TransformerDLCLModel("\n'
    'echo "2026-01-01 | INFO | fairseq_deep.progress | progress: update 1 | ETA 0:00:09"\n'
    'while [ $# -gt 0 ]; do [ "$1" = --save-dir ] && save=$2; shift; done\n'
    'mkdir -p "$save" && "$STUB_PYTHON" -c "import sys, torch; torch.save({\'model\': {}, '
    "'optimizer_history': [{'num_updates': 3}]}, sys.argv[1])\" \"$save/checkpoint_last.pt\"\n",
    # the deadline it is given, and an output cut short by it: sentence 2 of the 9 decoded
    "fairseq-deep-generate": 'echo "${FAIRSEQ_DEEP_DEADLINE-unset}" > "$STUB_OUT/deadline"\n'
    'echo "2026-01-01 | WARNING | fairseq_deep.progress | decoding stopped at the deadline '
    '(FAIRSEQ_DEEP_DEADLINE; it passed 1 s ago): 1 of 9 sentences decoded"\n'
    'ref=$(sed -n 3p "$STUB_REF"); printf "S-2\\tx\\nH-2\\t-0.1\\t%s\\nD-2\\t-0.1\\t%s\\n" "$ref" "$ref"\n',
}


def test_run_sh_gives_decoding_the_budgets_end_as_its_deadline(raw, tmp_path):
    """Issue 26: a dry run of run.sh (the fairseq-deep-* commands stubbed): fairseq-deep-generate
    gets FAIRSEQ_DEEP_DEADLINE = the run's start + MINUTES * 60 - MARGIN_S, training keeps its
    --stop-time-hours, and the score of what was decoded before the deadline says so."""
    import time

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in STUBS.items():
        (bin_dir / name).write_text("#!/usr/bin/env bash\nset -eu\n" + body)
        (bin_dir / name).chmod(0o755)
    env = dict(
        os.environ,
        **env_for(raw, tmp_path),
        MINUTES="3",
        VOCAB="100",  # setup times the model: a small one (prepare is stubbed)
        AVERAGE="0",
        OMP_NUM_THREADS="1",
        STUB_OUT=str(tmp_path),
        STUB_REF=os.path.join(raw, "test.tgt"),
        STUB_PYTHON=sys.executable,
        PATH=os.pathsep.join([str(bin_dir), os.path.dirname(sys.executable), os.environ["PATH"]]),
        PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]),
    )
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "score.txt").write_text("the first run's score\n")  # issue 46: kept
    before = int(time.time())
    proc = subprocess.run(
        ["bash", RUN_SH], env=env, capture_output=True, text=True, cwd=str(tmp_path)
    )
    after = int(time.time())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    deadline = int((tmp_path / "deadline").read_text())
    end = 180 - own_data.END_MARGIN_S
    assert before + end <= deadline <= after + end  # START + BUDGET_S - MARGIN_S
    assert "--stop-time-hours" in (tmp_path / "train.args").read_text()
    assert (
        "sacreBLEU on 1 of 9 test sentences (the budget ran out while decoding; a larger MINUTES decodes all): "
        "BLEU = 100.00" in proc.stdout
    ), proc.stdout
    assert (
        "decoding stopped at the deadline" in proc.stdout
    )  # shown as decoding's progress lines are
    # issue 32: the training command in full, the progress on the console, fairseq's configuration in the log only
    shown = [x for x in proc.stdout.splitlines() if x.startswith("   fairseq-deep-train ")]
    assert (
        len(shown) == 1
        and "--stop-time-hours" in shown[0]
        and "--arch transformer_dlcl" in shown[0]
    )
    tokens = shlex.split(
        shown[0]
    )  # copy-pasteable: the shell gives fairseq-deep-train what run.sh gave it
    assert " ".join(tokens[1:]) == (tmp_path / "train.args").read_text().strip()
    assert tokens[tokens.index("--adam-betas") + 1] == "(0.9, 0.98)"
    assert (
        "progress: update 1" in proc.stdout
        and "'common'" not in proc.stdout
        and "DLCLModel(" not in proc.stdout
    )
    assert "'common'" in (tmp_path / "work" / "train.log").read_text()
    assert (tmp_path / "work" / "score.txt.1").read_text() == "the first run's score\n"
    assert "sacreBLEU on 1 of 9" in (tmp_path / "work" / "score.txt").read_text()
    assert (
        f"run.sh: the earlier run's files in {tmp_path / 'work'} are kept (this run writes new "
        "ones): score.txt as score.txt.1"
    ) in proc.stderr
    # issue 46: DLCL does not export; said at the start, the distil-and-serve commands at the end
    assert "run.sh: transformer_dlcl does not export to CTranslate2 (" in proc.stderr
    ends = proc.stdout[proc.stdout.index("CTranslate2 cannot serve this model") :].splitlines()[1:]
    distill, student, export = (shlex.split(line) for line in ends[:3])
    ckpt = str(tmp_path / "work" / "checkpoints" / "transformer_dlcl_w128" / "checkpoint_best.pt")
    assert distill[0] == "fairseq-deep-distill" and distill[-2:] == ["--path", ckpt]
    assert student[0] == "fairseq-deep-train" and "--stop-time-hours" in student
    assert student[student.index("--stop-time-hours") + 1] == shown_flag(shown[0])
    assert export[0] == "fairseq-deep-export"


def shown_flag(command: str, flag: str = "--stop-time-hours") -> str:
    words = shlex.split(command)
    return words[words.index(flag) + 1]


def test_setup_says_whether_the_model_exports_and_how_to_serve_one_that_does_not(raw, tmp_path):
    """Issue 46, item 7: the recipe says at its start which families CTranslate2 serves; for one it
    does not, the commands run.sh prints at its end distil the model into a student that exports:
    the teacher's translations of the training set with the recipe's decoding, a pre-norm
    Transformer trained on them by the recipe's settings (a model that exports: asked of the
    student's own command), the student exported."""
    env = env_for(raw, tmp_path, WIDTH="32")
    work, data_bin = env["WORK"], os.path.join(env["WORK"], "data-bin")
    values, log = run_setup(["transformer_dlcl"], env)
    assert values["SERVE"] == "distill"
    assert "run.sh: transformer_dlcl does not export to CTranslate2 (" in log
    assert (
        "the end of this run prints the commands that distil it into a transformer_prenorm" in log
    )
    distill, student, export = (values[f"SERVE_{n}"] for n in ("DISTILL", "STUDENT", "EXPORT"))
    distilled = os.path.join(work, "distilled")
    assert distill[:2] == ["fairseq-deep-distill", data_bin]
    assert distill[distill.index("--destdir") + 1] == distilled
    assert shown_flag(" ".join(distill), "--beam") == shown_flag(
        " ".join(values["GENERATE"]), "--beam"
    )
    assert "--gen-subset" not in distill and "--cpu" in distill  # the training split, on the CPU
    from fairseq import options

    from fairseq_deep.distill import add_distill_args

    parsed = options.parse_args_and_arch(  # the command fairseq-deep-distill parses
        add_distill_args(options.get_generation_parser()), [*distill[1:], "--path", "T.pt"]
    )
    assert (parsed.data, parsed.destdir, parsed.train_subset) == (data_bin, distilled, "train")
    assert (parsed.beam, parsed.max_len_a, parsed.max_len_b, parsed.cpu) == (5, 1.2, 10, True)
    assert student[:2] == ["fairseq-deep-train", distilled]
    parsed = own_data.check_train_command(student[1:])
    assert parsed.arch == own_data.STUDENT_ARCH and parsed.encoder_embed_dim == 32
    assert own_data.why_not_served(parsed) is None  # the student exports
    assert export[:7] == [
        "fairseq-deep-export",
        "--checkpoint",
        os.path.join(parsed.save_dir, "checkpoint_best.pt"),
        "--data",
        distilled,
        "--out",
        os.path.join(work, "ctranslate2"),
    ]
    # the export times the ways to serve with the recipe's decoding
    assert shown_flag(" ".join(export), "--timing-max-len-a") == shown_flag(
        " ".join(values["GENERATE"]), "--max-len-a"
    )

    values, log = run_setup(["transformer_prenorm"], env)
    assert values["SERVE"] == "export" and "SERVE_DISTILL" not in values
    assert "run.sh: transformer_prenorm exports to CTranslate2 (fairseq-deep-export" in log
    assert values["SERVE_EXPORT"][:5] == [
        "fairseq-deep-export",
        "--data",
        data_bin,
        "--out",
        os.path.join(work, "ctranslate2"),
    ]
    values, log = run_setup(["transformer"], env)
    assert values["SERVE"] == "" and "ct2-fairseq-converter converts" in log


def test_run_sh_is_valid_bash():
    subprocess.run(["bash", "-n", RUN_SH], check=True)
    assert (
        sys.executable
    )  # (the script itself runs end to end in the own-data smoke run, not in CI)
