"""fairseq_deep.runs: a run as a value (its command line through fairseq's own parser and back, its
console form), the executor (log, append, timeout, watcher, a group stopped together, several
programs in one process), a real --log-format json training log read into records,
fairseq-generate's output by sentence id and scored with sacreBLEU."""

import sys
import threading
import time

import pytest
from helpers import TINY

from fairseq_deep import runs
from fairseq_deep.models import families
from fairseq_deep.runs import recipes

# the executor itself: real child processes (their peak memory, signals), not the tests' forks
pytestmark = pytest.mark.real_processes


def test_settings_become_options_that_fairseqs_parser_reads_back():
    from fairseq import options

    settings = {
        "optimizer": "adam",
        "adam_betas": "(0.9, 0.98)",
        "lr": 2e-3,
        "max_tokens": 4096,
        "keep_last_epochs": 5,
        "max_update": None,
        "cpu": True,
        "fp16": False,
        "label_smoothing": 0.1,
        "criterion": "label_smoothed_cross_entropy",
        "log_format": "json",
        "seed": 3,
    }
    argv = runs.flags(settings)
    assert argv[:4] == ["--optimizer", "adam", "--adam-betas", "(0.9, 0.98)"]
    assert "--max-update" not in argv and "--fp16" not in argv and argv.count("--cpu") == 1
    assert argv[argv.index("--lr") + 1] == "0.002"
    cmd = runs.command(runs.TRAIN, "DATA", "--arch", "transformer", *argv)
    assert cmd[:5] == [sys.executable, "-m", "fairseq_cli.train", "DATA", "--user-dir"]
    parsed = options.parse_args_and_arch(options.get_training_parser(), cmd[3:])
    assert (
        parsed.optimizer,
        parsed.adam_betas,
        parsed.lr,
        parsed.max_tokens,
        parsed.keep_last_epochs,
    ) == ("adam", "(0.9, 0.98)", [0.002], 4096, 5)
    assert (parsed.cpu, parsed.fp16, parsed.label_smoothing, parsed.log_format, parsed.seed) == (
        True,
        False,
        0.1,
        "json",
        3,
    )
    assert parsed.max_update == 0  # not given: fairseq's default
    assert runs.has_option(["--lr=1"], "--lr") and not runs.has_option(
        ["--lr-scheduler", "x"], "--lr"
    )
    assert runs.restore_flags("g.pt") == ["--restore-file", "g.pt", *runs.RESET]


LOG = """\
2026-01-01 10:00:00 | INFO | fairseq_cli.train | task: TranslationTask
2026-01-01 10:00:01 | INFO | train_inner | {"epoch": 1, "update": 0.5, "loss": "9.1", "num_updates": "10", "wall": "20"}
2026-01-01 10:00:02 | INFO | valid | {"epoch": 1, "valid_loss": "8.5", "valid_num_updates": "10", "valid_best_loss": "8.5"}
2026-01-01 10:00:03 | INFO | train | {"epoch": 1, "train_loss": "8.9", "train_num_updates": "12", "train_wall": "24"}
{"epoch": 2, "update": 1.2, "loss": "7.0", "num_updates": "14", "wall": "30"}
{"epoch": 2, "valid_loss": "7.5", "valid_num_updates": "14"}
"""  # noqa: E501  (fairseq's lines as it writes them)


def test_json_records_have_a_kind_and_numbers(tmp_path):
    path = tmp_path / "train.log"
    path.write_text(LOG)
    records = runs.parse_log(str(path))
    assert [r["kind"] for r in records] == ["train_inner", "valid", "train", "train_inner", "valid"]
    assert records[0] == {
        "kind": "train_inner",
        "epoch": 1,
        "update": 0.5,
        "loss": 9.1,
        "num_updates": 10,
        "wall": 20,
    }
    assert records[1] == {
        "kind": "valid",
        "epoch": 1,
        "loss": 8.5,
        "num_updates": 10,
        "best_loss": 8.5,
    }
    assert records[2]["num_updates"] == 12 and records[2]["loss"] == 8.9
    assert runs.series(records) == {
        "loss": [(10, 9.1), (14, 7.0)],
        "wall": [(10, 20), (14, 30)],
        "valid_loss": [(10, 8.5), (14, 7.5)],
        "valid_best_loss": [(10, 8.5)],
    }
    assert runs.last_update(str(path)) == 14 and runs.updates_done(records) == 14
    assert (
        runs.parse_log(str(tmp_path / "none.log")) == []
        and runs.last_update(str(tmp_path / "none")) is None
    )


def test_series_are_those_of_the_text_parser_on_json_logs():
    from fairseq_deep.diagnostics.plot_training import parse_log_lines

    console = [
        line for line in LOG.splitlines() if "|" in line
    ]  # plot_training reads either form alone
    assert runs.series(runs.parse_log_lines(console)) == parse_log_lines(console)


GENERATE = """\
S-1\tb c
T-1\tB C D E F
H-1\t-0.2\tb c
D-1\t-0.2\tB C D E F
P-1\t-0.1 -0.3
S-0\ta
T-0\tA B C D E
H-0\t-0.5\ta
D-0\t-0.5\tA B C D E
D-0\t-0.9\tA A
2026-01-01 10:00:05 | INFO | fairseq_cli.generate | Translated 1,002 sentences (25,050 tokens) in 12.5s (80.16 sentences/s, 2004.00 tokens/s)
Generate test with beam=5: BLEU4 = 12.34, 50.0/20.0/10.0/5.0 (BP=1.000, ratio=1.000, syslen=3, reflen=3)
"""  # noqa: E501  (fairseq's lines as it writes them)


def test_generate_output_by_id_and_in_order(tmp_path):
    path = tmp_path / "generate.out"
    path.write_text(GENERATE)
    generated = runs.read_generate(str(path))
    assert generated.detok == {1: "B C D E F", 0: "A B C D E"}  # --nbest: the first hypothesis
    assert generated.tokens == {1: "b c", 0: "a"} and generated.sources == {1: "b c", 0: "a"}
    assert generated.bleu4 == "12.34" and runs.hypotheses_by_id(str(path)) == {
        0: "A B C D E",
        1: "B C D E F",
    }
    assert generated.translated == runs.Translated(1002, 25050, 12.5, 80.16, 2004.0)
    assert (
        runs.parse_translated(GENERATE) == generated.translated
        and runs.parse_translated("S-0\ta") is None
    )
    assert generated.in_order(2) == (["A B C D E", "B C D E F"], ["A B C D E", "B C D E F"])
    with pytest.raises(ValueError, match="missing ids \\[2\\]"):
        generated.in_order(3)
    scores = runs.score(*generated.in_order(2))
    assert scores["bleu"] == pytest.approx(100.0) and scores["chrf"] == pytest.approx(100.0)


def test_a_real_training_log_and_translation(synthetic_bin, tmp_path, monkeypatch):
    """fairseq-train with --log-format json read into records; fairseq-generate's output scored."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    save = tmp_path / "ckpt"
    train = runs.command(
        runs.TRAIN,
        str(synthetic_bin),
        "--arch",
        "transformer_prenorm",
        *TINY,
        *runs.flags(
            {
                "encoder_layers": 1,
                "decoder_layers": 1,
                "optimizer": "adam",
                "lr": 5e-3,
                "lr_scheduler": "inverse_sqrt",
                "warmup_updates": 2,
                "max_tokens": 3000,
                "max_update": 4,
                "save_dir": str(save),
                "log_format": "json",
                "log_interval": 1,
                "validate_interval_updates": 2,
                "no_epoch_checkpoints": True,
                "cpu": True,
                "num_workers": 0,
                "seed": 1,
            }
        ),
    )
    decode = runs.Run.of(
        "generate",
        str(synthetic_bin),
        {
            "path": str(save / "checkpoint_last.pt"),
            "gen_subset": "test",
            "beam": 2,
            "batch_size": 64,
            "max_len_a": 0,
            "max_len_b": 12,
            "cpu": True,
            "num_workers": 0,
        },
    )
    # both programs in one process (one start-up of fairseq), each with its own result
    trained, gen = runs.execute_together(
        [runs.run_of(train), decode], str(tmp_path / "both.log"), timeout=300
    )
    assert trained.ok and trained.peaks["peak_rss_gb"] > 0, trained.tail(3000)
    records = trained.records
    kinds = {r["kind"] for r in records}
    assert {"train_inner", "valid"} <= kinds, records
    inner = [r["num_updates"] for r in records if r["kind"] == "train_inner"]
    assert inner == [1, 2, 3, 4]
    assert [r["num_updates"] for r in records if r["kind"] == "valid"][:2] == [2, 4]
    assert all(
        isinstance(r["loss"], float) for r in records if r["kind"] != "train" and "loss" in r
    )
    assert gen.ok and "Translated" not in trained.output, gen.tail(3000)
    generated = gen.generated
    n = runs.count_test_sentences(str(synthetic_bin))
    hyps, refs = generated.in_order(n)
    assert len(hyps) == len(refs) == n == 101
    scores = runs.score(hyps, refs)
    assert 0 <= scores["bleu"] <= 100 and 0 <= scores["chrf"] <= 100
    assert generated.bleu4 is not None
    translated = generated.translated
    assert translated.sentences == n and translated.tokens > 0
    assert generated.scores.keys() == generated.tokens.keys()


def test_a_run_is_one_value_with_two_printed_forms():
    """The settings compose in order (a later value wins, as fairseq reads them); the command that
    runs and the one a document prints are the same run; fairseq's parser reads the recipes."""
    from fairseq import options

    spec = families.spec("transformer_dlcl")
    run = runs.Run.of(
        "train",
        "DATA",
        runs.Part("model", ["--arch", "transformer_dlcl"]),
        recipes.width(spec, 128),
        *recipes.study(0.002, 400),
        recipes.label_smoothed(0.1),
        recipes.json_log(10),
        {"max_tokens": 2048, "cpu": True, "fp16": False},
        arch=spec,
    ).plus(["--lr", "0.003"])
    assert run.arch is spec and run.without("size").arch is spec  # the --arch, resolved once
    assert run == runs.Run(run.program, run.data, run.parts)  # what it runs is the value
    assert run.argv()[:6] == [
        sys.executable,
        "-m",
        "fairseq_cli.train",
        "DATA",
        "--user-dir",
        runs.PLUGIN_DIR,
    ]
    assert run.argv()[6:] == run.args == run.console()[2:]
    assert run.console()[:2] == ["fairseq-deep-train", "DATA"]
    assert run.console(ours=False)[:4] == ["fairseq-train", "DATA", "--user-dir", runs.PLUGIN_DIR]
    assert run.shell().startswith(
        "fairseq-deep-train DATA --arch transformer_dlcl --encoder-embed-dim 128"
    )
    assert "--adam-betas '(0.9, 0.98)'" in run.shell()
    assert run.value("--lr") == "0.003" and run.part("optimizer")[-1] == "0.002"
    assert run.part("schedule") == [
        "--lr-scheduler",
        "inverse_sqrt",
        "--warmup-updates",
        "400",
        "--warmup-init-lr",
        "1e-07",
    ]
    assert (
        runs.run_of(run.argv()).argv() == run.argv()
        and run.has("size")
        and run.without("size").has("size") is False
    )
    # asked by part, not by words: the --lr of a plain list is no "lr" part, Adam's is "optimizer"
    assert run.has("optimizer") and not run.has("lr") and run.has("flags")
    parsed = options.parse_args_and_arch(options.get_training_parser(), run.argv()[3:])
    assert (parsed.lr, parsed.adam_betas, parsed.adam_eps, parsed.warmup_init_lr) == (
        [0.003],
        "(0.9, 0.98)",
        1e-8,
        1e-7,
    )
    assert (parsed.encoder_ffn_embed_dim, parsed.decoder_attention_heads, parsed.log_format) == (
        512,
        2,
        "json",
    )
    assert (parsed.criterion, parsed.max_tokens, parsed.cpu, parsed.fp16) == (
        "label_smoothed_cross_entropy",
        2048,
        True,
        False,
    )
    # the family's paper recipe (models/rnmt_plus/model.py: settings) at the study's lr, warmup
    optimizer, schedule = recipes.paper(families.spec("rnmt_plus"), 1e-3, 320)
    assert (optimizer.name, schedule.name) == ("optimizer", "schedule")
    assert recipes.paper(families.spec("transformer_dlcl"), 1e-3, 320) is None  # it declares none
    parsed = options.parse_args_and_arch(
        options.get_training_parser(),
        ["DATA", "--user-dir", runs.PLUGIN_DIR, "--arch", "rnmt_plus", *optimizer, *schedule],
    )
    assert (parsed.lr, parsed.rnmt_base_lr, parsed.warmup_updates, parsed.adam_eps) == (
        [0.0032],
        1e-4,
        10,
        1e-6,
    )
    assert runs.preprocess("de", "en", "bin", "raw/train", testpref="raw/test").console() == [
        "fairseq-preprocess",
        "--source-lang",
        "de",
        "--target-lang",
        "en",
        "--trainpref",
        "raw/train",
        "--testpref",
        "raw/test",
        "--destdir",
        "bin",
        "--joined-dictionary",
        "--workers",
        "1",
    ]
    assert runs.grow("a.pt", "b.pt", 12).argv()[1:3] == ["-m", "fairseq_deep.grow"]
    with pytest.raises(ValueError, match="no program"):
        runs.Run("trian")


def _python(code: str):
    return [sys.executable, "-c", code]


def test_named_settings_parse_back_and_name_their_part():
    """The budget, saving, decoding, learning-rate and seed recipes: each a part of a fixed name,
    its options in the order given, read back by fairseq's parsers; a misspelt option is refused."""
    from fairseq import options

    from fairseq_deep.runs.run import Variable

    train = runs.Run.of(
        "train",
        "DATA",
        runs.Part("model", ["--arch", "transformer_dlcl"]),
        recipes.adam("1e-12", betas=None),
        recipes.fixed(),
        recipes.clip_norm("0.5"),
        recipes.budget(max_tokens=512, max_update=7, stop_time_hours=None, max_epoch=3),
        recipes.saving(save_dir="S", no_epoch_checkpoints=True, keep_last_epochs=2),
        recipes.seed(5),
        recipes.learning_rate("0.25"),
    )
    assert [p.name for p in train.parts] == [
        "model",
        "optimizer",
        "schedule",
        "clipping",
        "budget",
        "saving",
        "seed",
        "lr",
    ]
    assert train.part("budget") == ["--max-tokens", "512", "--max-update", "7", "--max-epoch", "3"]
    assert "--adam-betas" not in train.args  # betas=None: fairseq's own
    parsed = options.parse_args_and_arch(options.get_training_parser(), train.argv()[3:])
    assert (parsed.optimizer, parsed.adam_betas, parsed.lr_scheduler, parsed.lr) == (
        "adam",
        (0.9, 0.999),  # fairseq's default, not a string given
        "fixed",
        [0.25],  # a later value wins
    )
    assert (parsed.clip_norm, parsed.max_tokens, parsed.max_update, parsed.max_epoch) == (
        0.5,
        512,
        7,
        3,
    )
    assert (parsed.save_dir, parsed.no_epoch_checkpoints, parsed.keep_last_epochs) == ("S", True, 2)
    assert (parsed.seed, train.has("budget"), train.has("decoding")) == (5, True, False)
    generate = runs.Run.of(
        "generate",
        "DATA",
        recipes.decoding(path="c.pt", gen_subset="test", beam=3, lenpen=1.5),
        recipes.decoding(max_len_a="0", max_len_b=9, batch_size=16),
    )
    parsed = options.parse_args_and_arch(options.get_generation_parser(), generate.argv()[3:])
    assert (parsed.path, parsed.gen_subset, parsed.beam, parsed.lenpen) == ("c.pt", "test", 3, 1.5)
    assert (parsed.max_len_a, parsed.max_len_b, parsed.batch_size) == (0, 9, 16)
    for recipe in (recipes.budget, recipes.saving, recipes.decoding):
        with pytest.raises(TypeError, match="max_tokenz"):
            recipe(max_tokenz=1)
    # a budget left to the reader of a printed command: a shell variable stays one
    assert recipes.budget(max_update=Variable("MAX_UPDATE")).name == "budget"
    assert runs.shell(recipes.budget(max_update=Variable("MAX_UPDATE"))) == (
        '--max-update "$MAX_UPDATE"'
    )
    # a person's own words replace a recipe where they name what it sets
    assert recipes.gives(["--optimizer=sgd"], "optimizer") and not recipes.gives(
        ["--lr-scheduler", "fixed"], "optimizer"
    )


def test_execute_logs_appends_times_out_and_watches(tmp_path):
    log = str(tmp_path / "run.log")
    first = runs.execute(_python("print('one')"), log, header=True)
    assert first.ok and first.output == "one\n" and first.seconds > 0 and first.max_rss_kib > 0
    seen = []
    failed = runs.execute(
        _python(
            "import sys; print('two'); print('| WARNING | an Error in a log line'); "
            "print('ValueError: what stopped it', file=sys.stderr); "
            "print('| INFO | Error in the line after it'); sys.exit(3)"
        ),
        log,
        append=True,
        watch=seen.append,
    )
    assert failed.returncode == 3 and not failed.ok and failed.output.startswith("two\n")
    assert failed.error() == "ValueError: what stopped it" and seen[0] == "two\n"
    with open(log) as f:
        text = f.read()
    assert text.startswith("# ") and "one\ntwo\n" in text  # the header, then both runs
    with pytest.raises(runs.RunFailed, match="command failed \\(3\\)"):
        failed.check()
    kept = runs.execute(_python("import time; print('x', flush=True); time.sleep(30)"), timeout=1)
    assert kept.timed_out and kept.returncode is None and kept.seconds < 20 and kept.output == "x\n"
    assert kept.error().startswith("stopped by its timeout")


def test_a_group_stops_together_and_starts_no_more():
    group = runs.Processes()
    results = []
    worker = threading.Thread(
        target=lambda: results.append(
            runs.execute(_python("import time; time.sleep(30)"), processes=group)
        )
    )
    worker.start()
    while not group.running:
        time.sleep(0.05)
    group.stop()
    worker.join(20)
    assert results[0].stopped and results[0].returncode != 0
    late = runs.execute(_python("print(1)"), processes=group)
    assert late.stopped and late.returncode is None


def test_last_error_names_what_was_raised():
    text = (
        "2026 | INFO | train | ok\nTraceback (most recent call last):\n  x\n"
        "torch.cuda.OutOfMemoryError: CUDA out of memory\n2026 | WARNING | an Error after it\n"
    )
    assert runs.last_error(text) == "torch.cuda.OutOfMemoryError: CUDA out of memory"
    assert runs.last_error("a\n| WARNING | an Error here\nlast") == "| WARNING | an Error here"
    assert runs.last_error("a\nlast line\n") == "last line" and runs.last_error("") == ""
    assert len(runs.last_error("ValueError: " + "x" * 500, limit=200)) == 200
    assert runs.parse_params("| num. shared model params: 1,234 (num. trained: 1,234)") == 1234
    assert runs.parse_loaded_update("Loaded checkpoint c.pt (epoch 2 @ 40 updates)") == 40
    assert runs.count_overflows("gradient overflow detected, ...\ngradient overflow detected") == 2
    assert runs.parse_params("nothing") is None and runs.parse_loaded_update("") is None


def test_documents_print_the_commands_the_code_builds():
    """docs/grow.md's command that continues training a grown model is what fairseq-deep-grow
    prints (grow_report's run, console form); the benchmarks' --precision names are the recipes'."""
    import argparse
    import re
    from pathlib import Path

    from benchmarks import harness
    from fairseq_deep.grow_report import next_runs

    doc = (Path(__file__).resolve().parents[1] / "docs" / "grow.md").read_text()
    shown = re.search(
        r"^(fairseq-deep-train DATA --model-from grown\.pt .*?) <the shallow run's other training "
        r"options, printed> (.*?) \[--task",
        doc,
        re.M | re.S,
    )
    summary = {"data": None, "model_options": argparse.Namespace(arch="transformer_dlcl")}
    # a shallow run of 4,000 warm-up updates and a budget: the restart's warm-up, the budget left to variables
    shallow = ["--warmup-updates", "4000", "--max-update", "20000", "--stop-time-hours", "2"]
    from_checkpoint, _ = next_runs(summary, "grown.pt", shallow)
    words = " ".join(shown.group(1, 2)).replace("\\\n", " ")
    assert " ".join(words.split()) == from_checkpoint.shell()
    assert from_checkpoint.shell().endswith(
        '--warmup-updates 1000 --max-update "$MAX_UPDATE" --stop-time-hours "$STOP_TIME_HOURS"'
    )
    assert harness.PRECISION_NAMES == tuple(recipes.PRECISIONS)


def test_records_timed_from_the_start_of_training():
    started = "2026-01-01 09:59:58 | INFO | fairseq.trainer | begin training epoch 1\n"
    started += "2026-01-01 09:59:59 | INFO | fairseq_cli.train | Start iterating over samples\n"
    timed = runs.timed_records((started + LOG).splitlines())
    assert [(s, r["kind"]) for s, r in timed] == [
        (2.0, "train_inner"),
        (3.0, "valid"),
        (4.0, "train"),
    ]
    assert [s for s, _ in runs.timed_records(LOG.splitlines())] == [0.0, 1.0, 2.0]  # no start line


def test_runs_together_stop_at_the_first_failure_and_at_the_timeout(tmp_path):
    bad = runs.Run.of("preprocess", None, ["--no-such-option"])
    never = runs.Run.of("preprocess", None, ["--help"])
    (failed,) = runs.execute_together([bad, never], str(tmp_path / "both.log"))
    assert failed.returncode == 2 and "--no-such-option" in failed.error()
    (cut,) = runs.execute_together([bad, never], timeout=0.5)
    assert cut.timed_out and cut.returncode is None and cut.error().startswith("stopped by")
