"""fairseq-deep-interactive keeps going (issue 14, item 4): through the real console script, every
input line gets exactly one H- line; an over-long line is cut to the model's maximum with a
warning, an empty line gets an empty hypothesis with a warning, and the lines after them are
translated as if they were alone; on sentencepiece data without --bpe it applies the spm.model
beside the data or stops with one line (issue 26, item 6)."""

import os
import re
import sys

import pytest
from helpers import TINY, run_cli

MAX_SOURCE = 12  # tokens with </s>


@pytest.fixture(scope="module")
def model(synthetic_bin, tmp_path_factory):
    """A tiny transformer_dlcl with --max-source-positions 12, one epoch."""
    save = tmp_path_factory.mktemp("interactive") / "checkpoints"
    proc = run_cli(
        "fairseq-deep-train",
        str(synthetic_bin),
        "--arch",
        "transformer_dlcl",
        *TINY,
        "--encoder-layers",
        "2",
        "--decoder-layers",
        "2",
        "--share-all-embeddings",
        "--max-source-positions",
        str(MAX_SOURCE),
        "--max-target-positions",
        "64",
        "--skip-invalid-size-inputs-valid-test",
        "--optimizer",
        "adam",
        "--lr",
        "0.005",
        "--max-tokens",
        "3000",
        "--max-epoch",
        "1",
        "--seed",
        "1",
        "--cpu",
        "--num-workers",
        "0",
        "--save-dir",
        str(save),
        "--no-progress-bar",
        "--no-epoch-checkpoints",
    )
    (save / "train.log").write_text(proc.stdout + proc.stderr)
    return save / "checkpoint_last.pt"


def interactive(synthetic_bin, model, lines, *extra, env=None):
    proc = run_cli(
        "fairseq-deep-interactive",
        str(synthetic_bin),
        "--path",
        str(model),
        "--source-lang",
        "src",
        "--target-lang",
        "tgt",
        "--beam",
        "2",
        "--cpu",
        "--max-len-a",
        "1",
        "--max-len-b",
        "5",
        *extra,
        input="".join(line + "\n" for line in lines),
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    hyps = {}
    for line in proc.stdout.splitlines():
        m = re.match(r"H-(\d+)\t[^\t]*\t?(.*)$", line)
        if m:
            assert int(m.group(1)) not in hyps, f"two H- lines for input {m.group(1)}"
            hyps[int(m.group(1))] = m.group(2)
    return hyps, proc.stdout + proc.stderr


def test_every_line_gets_one_hypothesis(synthetic_bin, model):
    words = open(synthetic_bin / "dict.src.txt").read().split()[::2][4:40]
    short = " ".join(words[:5])
    long = " ".join(words * 3)  # 108 words: far over --max-source-positions 12
    lines = [short, "", long, short, "   ", short]
    hyps, log = interactive(synthetic_bin, model, lines, "--buffer-size", "2", "--batch-size", "2")
    assert sorted(hyps) == list(range(len(lines)))
    assert hyps[1] == "" and hyps[4] == ""  # never an invented sentence
    assert hyps[2].strip()  # the cut line is translated
    assert hyps[0] == hyps[3] == hyps[5]  # lines after a long or empty one are unaffected
    assert (
        f"input line 3 (S-2): {len(words) * 3 + 1} tokens with </s>, more than the model takes "
        f"({MAX_SOURCE}: --max-source-positions); translating its first {MAX_SOURCE - 1} tokens"
        in log
    )
    assert "input line 2 (S-1) is empty: its hypothesis is empty" in log
    assert "Traceback" not in log


def test_cut_line_equals_its_first_tokens(synthetic_bin, model):
    """A line cut to the maximum is translated as its first MAX_SOURCE - 1 words are."""
    words = open(synthetic_bin / "dict.src.txt").read().split()[::2][4:40]
    hyps, _ = interactive(
        synthetic_bin, model, [" ".join(words), " ".join(words[: MAX_SOURCE - 1])]
    )
    assert hyps[0] == hyps[1]


# -- sentencepiece data without --bpe (issue 26, item 6) ------------------------------------------


def spm_data(root, with_model: bool):
    """A data-bin folder whose dictionaries hold sentencepiece pieces (and ``spm.model`` beside it,
    where fairseq-deep-prepare writes it, when ``with_model``)."""
    data = root / "data-bin"
    data.mkdir(parents=True)
    pieces = ["\u2581the", "\u2581a", "s", "\u2581in", "\u2581man", "ing", "\u2581on", "."]
    for lang in ("src", "tgt"):
        (data / f"dict.{lang}.txt").write_text(
            "".join(f"{p} {100 - i}\n" for i, p in enumerate(pieces))
        )
    if with_model:
        (root / "spm.model").write_bytes(b"not read by this test")
    return data


def run_interactive_in_process(monkeypatch, data, *extra):
    """cli.interactive() on ``data`` with fairseq-interactive's main replaced by one that records the
    cfg it is given, and without the check of --path (nothing is loaded or translated)."""
    from fairseq_cli import interactive as fairseq_interactive

    from fairseq_deep import cli

    seen = []
    monkeypatch.setattr(fairseq_interactive, "main", lambda cfg: seen.append(cfg))
    monkeypatch.setitem(cli.CHECKS, "interactive", ())  # no checkpoint: model.pt is not read
    monkeypatch.setattr(fairseq_interactive, "make_batches", fairseq_interactive.make_batches)
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "fairseq-deep-interactive",
            str(data),
            "--path",
            "model.pt",
            "--source-lang",
            "src",
            "--target-lang",
            "tgt",
            *extra,
        ],
    )
    cli.interactive()
    assert len(seen) == 1
    return seen[0]


def test_sentencepiece_dictionary_is_recognised(tmp_path, synthetic_bin):
    from fairseq_deep.data.sentencepiece_data import sentencepiece_dictionary, spm_model_beside

    data = spm_data(tmp_path, with_model=True)
    assert sentencepiece_dictionary(str(data / "dict.src.txt"))
    assert not sentencepiece_dictionary(
        str(synthetic_bin / "dict.src.txt")
    )  # a word-level dictionary
    assert spm_model_beside(str(data)) == str(tmp_path / "spm.model")


def test_sentencepiece_model_beside_the_data_is_applied(tmp_path, monkeypatch, capfd):
    data = spm_data(tmp_path, with_model=True)
    cfg = run_interactive_in_process(monkeypatch, data)
    assert cfg.bpe._name == "sentencepiece" and cfg.bpe.sentencepiece_model == str(
        tmp_path / "spm.model"
    )
    out = capfd.readouterr()
    assert (
        "no --bpe was given: translating with --bpe sentencepiece --sentencepiece-model"
        in out.out + out.err
    )
    # --bpe or --post-process given: the command line as it is
    cfg = run_interactive_in_process(
        monkeypatch, data, "--bpe", "sentencepiece", "--sentencepiece-model", "x.model"
    )
    assert cfg.bpe.sentencepiece_model == "x.model"
    cfg = run_interactive_in_process(monkeypatch, data, "--post-process", "sentencepiece")
    assert cfg.bpe is None


def test_sentencepiece_data_without_a_model_is_refused(tmp_path, monkeypatch, capfd):
    data = spm_data(tmp_path, with_model=False)
    with pytest.raises(SystemExit) as exit_:
        run_interactive_in_process(monkeypatch, data)
    assert exit_.value.code == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fairseq-deep-interactive: error: "), err
    assert (
        str(data / "dict.src.txt") in err[0]
        and "--bpe sentencepiece --sentencepiece-model" in err[0]
    )


# -- the same check in the hub interface (Model.from_pretrained) ----------------------------------


def hub_load(monkeypatch, data, **cfg_values):
    """fairseq's ``hub_utils.from_pretrained`` (our shim around it) on ``data``, with the loading
    itself replaced by a cfg as fairseq's would give it (nothing is loaded)."""
    from fairseq import hub_utils
    from omegaconf import OmegaConf

    from fairseq_deep.patches import install
    from fairseq_deep.patches.hub import hub_from_pretrained_checked

    cfg = OmegaConf.create(
        {
            "bpe": None,
            "common_eval": {"post_process": None},
            "task": {"data": str(data), "source_lang": "src"},
            **cfg_values,
        }
    )
    monkeypatch.setitem(
        install._ORIGINAL,
        hub_from_pretrained_checked,
        lambda *args, **kwargs: {"args": cfg, "task": object(), "models": []},
    )
    return hub_utils.from_pretrained("unused", data_name_or_path=str(data))["args"]


def test_hub_interface_applies_the_sentencepiece_model_beside_the_data(
    tmp_path, monkeypatch, caplog
):
    import sentencepiece
    from fairseq.data import encoders

    root = tmp_path / "prep"
    data = spm_data(root, with_model=False)
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(
            ["the man in the street", "a man on a horse", "the men are walking"] * 20
        ),
        model_prefix=str(root / "spm"),
        vocab_size=20,
        minloglevel=2,
    )
    cfg = hub_load(monkeypatch, data)
    assert cfg.bpe._name == "sentencepiece" and cfg.bpe.sentencepiece_model == str(
        root / "spm.model"
    )
    assert "no bpe= was given: translating with bpe='sentencepiece'" in caplog.text
    # what the hub interface then builds splits words into the model's pieces
    assert encoders.build_bpe(cfg.bpe).encode("the man").split()[0].startswith("\u2581")
    # given bpe= or post_process=: as it is
    assert (
        hub_load(
            monkeypatch, data, bpe={"_name": "sentencepiece", "sentencepiece_model": "x"}
        ).bpe.sentencepiece_model
        == "x"
    )
    assert hub_load(monkeypatch, data, common_eval={"post_process": "sentencepiece"}).bpe is None


def test_hub_interface_refuses_sentencepiece_data_without_a_model(
    tmp_path, monkeypatch, synthetic_bin
):
    from fairseq_deep.errors import UserError

    data = spm_data(tmp_path, with_model=False)
    with pytest.raises(
        UserError,
        match="pass bpe='sentencepiece', sentencepiece_model='PATH/spm.model' to "
        "from_pretrained .*or post_process='sentencepiece'",
    ):
        hub_load(monkeypatch, data)
    assert hub_load(monkeypatch, synthetic_bin).bpe is None  # word-level data: nothing to do


CONFIG = re.compile(r"\{'_name': None, 'common': \{")  # fairseq's whole configuration (10 kB)


def test_configuration_is_kept_off_a_normal_run(synthetic_bin, model):
    """Issue 46, item 7: fairseq-deep-train and -interactive printed fairseq's whole configuration
    as their second line; it is logged at DEBUG level (LOGLEVEL=DEBUG shows it)."""
    train_log = (model.parent / "train.log").read_text()
    assert not any(CONFIG.search(line) for line in train_log.splitlines())
    for normal in ("| task: ", "| model: ", "| criterion: ", "| num. shared model params: "):
        assert normal in train_log, normal
    assert re.search(r"\| progress: update 1\b", train_log)  # the progress line remains
    words = open(synthetic_bin / "dict.src.txt").read().split()[::2][4:9]
    hyps, log = interactive(synthetic_bin, model, [" ".join(words)])
    assert sorted(hyps) == [0]
    assert not any(CONFIG.search(line) for line in log.splitlines())
    assert "| loading model(s) from " in log
    _, debug_log = interactive(
        synthetic_bin, model, [" ".join(words)], env=dict(os.environ, LOGLEVEL="DEBUG")
    )
    shown = [line for line in debug_log.splitlines() if CONFIG.search(line)]
    assert len(shown) == 1 and "| DEBUG | fairseq_cli.interactive | " in shown[0]


def test_empty_input_is_said(synthetic_bin, model):
    """Issue 46, item 7: on an empty stdin fairseq-interactive prints nothing; one warning line
    says so, exit status 0 (as fairseq's)."""
    hyps, log = interactive(synthetic_bin, model, [])
    assert hyps == {}
    said = [line for line in log.splitlines() if "no input lines" in line]
    assert len(said) == 1, log[-2000:]
    assert said == [
        said[0].split(" | WARNING | ")[0]
        + " | WARNING | fairseq_deep.interactive | no input lines (stdin was empty): "
        "nothing to translate"
    ], log[-2000:]
    assert "Traceback" not in log
