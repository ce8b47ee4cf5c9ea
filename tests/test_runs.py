"""fairseq_deep.runs: command lines from settings (through fairseq's own parser and back), a real
--log-format json training log read into records, fairseq-generate's output by sentence id and
scored with sacreBLEU."""

import sys

import pytest
from helpers import TINY, run_cli

from fairseq_deep import runs


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
    out = run_cli(*train, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    records = runs.parse_log_lines((out.stdout + out.stderr).splitlines())
    kinds = {r["kind"] for r in records}
    assert {"train_inner", "valid"} <= kinds, records
    inner = [r["num_updates"] for r in records if r["kind"] == "train_inner"]
    assert inner == [1, 2, 3, 4]
    assert [r["num_updates"] for r in records if r["kind"] == "valid"][:2] == [2, 4]
    assert all(
        isinstance(r["loss"], float) for r in records if r["kind"] != "train" and "loss" in r
    )
    generate = runs.command(
        runs.GENERATE,
        str(synthetic_bin),
        *runs.flags(
            {
                "path": str(save / "checkpoint_last.pt"),
                "gen_subset": "test",
                "beam": 2,
                "batch_size": 64,
                "max_len_a": 0,
                "max_len_b": 12,
                "cpu": True,
                "num_workers": 0,
            }
        ),
    )
    gen = run_cli(*generate, timeout=300, check=False)
    assert gen.returncode == 0, gen.stderr[-3000:]
    generated = runs.parse_generate(gen.stdout)
    n = runs.count_test_sentences(str(synthetic_bin))
    hyps, refs = generated.in_order(n)
    assert len(hyps) == len(refs) == n == 101
    scores = runs.score(hyps, refs)
    assert 0 <= scores["bleu"] <= 100 and 0 <= scores["chrf"] <= 100
    assert generated.bleu4 is not None
    translated = runs.parse_translated(
        gen.stderr
    )  # a log line: on stderr, the translations on stdout
    assert translated.sentences == n and translated.tokens > 0
