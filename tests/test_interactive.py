"""fairseq-deep-interactive keeps going (issue 14, item 4): through the real console script, every
input line gets exactly one H- line; an over-long line is cut to the model's maximum with a
warning, an empty line gets an empty hypothesis with a warning, and the lines after them are
translated as if they were alone."""

import re
import subprocess

import pytest

from helpers import TINY, run_cli

MAX_SOURCE = 12  # tokens with </s>


@pytest.fixture(scope="module")
def model(synthetic_bin, tmp_path_factory):
    """A tiny transformer_dlcl with --max-source-positions 12, one epoch."""
    save = tmp_path_factory.mktemp("interactive") / "checkpoints"
    run_cli("fairseq-deep-train", str(synthetic_bin), "--arch", "transformer_dlcl", *TINY,
            "--encoder-layers", "2", "--decoder-layers", "2", "--share-all-embeddings",
            "--max-source-positions", str(MAX_SOURCE), "--max-target-positions", "64",
            "--skip-invalid-size-inputs-valid-test", "--optimizer", "adam", "--lr", "0.005",
            "--max-tokens", "3000", "--max-epoch", "1", "--seed", "1", "--cpu", "--num-workers", "0",
            "--save-dir", str(save), "--no-progress-bar", "--no-epoch-checkpoints")
    return save / "checkpoint_last.pt"


def interactive(synthetic_bin, model, lines, *extra):
    proc = subprocess.run(
        ["fairseq-deep-interactive", str(synthetic_bin), "--path", str(model), "--source-lang", "src",
         "--target-lang", "tgt", "--beam", "2", "--cpu", "--max-len-a", "1", "--max-len-b", "5", *extra],
        input="".join(line + "\n" for line in lines), capture_output=True, text=True,
        env={**__import__("os").environ, "OMP_NUM_THREADS": "1"},
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
    assert f"input line 3 (S-2): {len(words) * 3 + 1} tokens with </s>, more than the model takes " \
           f"({MAX_SOURCE}: --max-source-positions); translating its first {MAX_SOURCE - 1} tokens" in log
    assert "input line 2 (S-1) is empty: its hypothesis is empty" in log
    assert "Traceback" not in log


def test_cut_line_equals_its_first_tokens(synthetic_bin, model):
    """A line cut to the maximum is translated as its first MAX_SOURCE - 1 words are."""
    words = open(synthetic_bin / "dict.src.txt").read().split()[::2][4:40]
    hyps, _ = interactive(synthetic_bin, model, [" ".join(words), " ".join(words[: MAX_SOURCE - 1])])
    assert hyps[0] == hyps[1]
