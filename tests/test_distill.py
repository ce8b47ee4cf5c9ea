"""Sequence-level distillation (issue 46, item 1): the teacher (fairseq_deep/teacher.py) is the
model fairseq loads, and a teacher of other dictionaries is one line."""

import pytest
import torch
from fairseq import checkpoint_utils, tasks
from helpers import python_module, run_cli

from fairseq_deep import teacher
from fairseq_deep.data.synthetic import write_corpus
from fairseq_deep.errors import CheckpointError

#: a tiny post-norm DLCL teacher trained for a few updates (its outputs, not its quality, matter)
TEACHER = [
    "--arch",
    "transformer_dlcl",
    "--encoder-layers",
    "2",
    "--decoder-layers",
    "1",
    "--encoder-embed-dim",
    "16",
    "--decoder-embed-dim",
    "16",
    "--encoder-ffn-embed-dim",
    "32",
    "--decoder-ffn-embed-dim",
    "32",
    "--encoder-attention-heads",
    "2",
    "--decoder-attention-heads",
    "2",
    "--share-all-embeddings",
    "--dropout",
    "0",
    "--optimizer",
    "adam",
    "--lr",
    "0.005",
    "--lr-scheduler",
    "inverse_sqrt",
    "--warmup-updates",
    "5",
    "--max-tokens",
    "1024",
    "--max-update",
    "30",
    "--criterion",
    "cross_entropy",
    "--seed",
    "1",
    "--cpu",
    "--num-workers",
    "0",
    "--no-progress-bar",
    "--no-epoch-checkpoints",
    "--disable-validation",
]


def preprocess(raw_prefixes, destdir, *extra):
    run_cli(
        *python_module("fairseq_cli.preprocess"),
        "--source-lang",
        "src",
        "--target-lang",
        "tgt",
        "--trainpref",
        raw_prefixes["train"],
        "--validpref",
        raw_prefixes["valid"],
        "--testpref",
        raw_prefixes["test"],
        "--destdir",
        str(destdir),
        "--workers",
        "1",
        *extra,
    )


@pytest.fixture(scope="module")
def setting(tmp_path_factory):
    """A small data-bin (150 training pairs), a teacher trained on it, and a data-bin of the
    same text with other dictionaries (separate source and target dictionaries)."""
    root = tmp_path_factory.mktemp("distill")
    prefixes = write_corpus(str(root / "raw"), train=150, valid=20, test=20, seed=3)
    preprocess(prefixes, root / "bin", "--joined-dictionary")
    preprocess(prefixes, root / "other_bin", "--nwordssrc", "12")
    run_cli("fairseq-deep-train", str(root / "bin"), *TEACHER, "--save-dir", str(root / "ck"))
    return {
        "root": root,
        "bin": root / "bin",
        "other_bin": root / "other_bin",
        "teacher": root / "ck" / "checkpoint_last.pt",
    }


def translation_task(data):
    from argparse import Namespace

    return tasks.setup_task(
        Namespace(task="translation", data=str(data), source_lang="src", target_lang="tgt")
    )


def test_teacher_is_the_model_fairseq_loads(setting):
    task = translation_task(setting["bin"])
    ours = teacher.load(str(setting["teacher"]), task)
    models, _ = checkpoint_utils.load_model_ensemble([str(setting["teacher"])], task=task)
    theirs = models[0].eval()
    assert not ours.training and not any(p.requires_grad for p in ours.parameters())
    assert type(ours) is type(theirs)
    d = task.source_dictionary
    src = torch.randint(d.nspecial, len(d), (3, 7), generator=torch.Generator().manual_seed(0))
    src[:, -1] = d.eos()
    lengths = torch.full((3,), 7)
    prev = torch.cat([torch.full((3, 1), d.eos()), src[:, :4]], dim=1)
    with torch.no_grad():
        torch.testing.assert_close(ours(src, lengths, prev)[0], theirs(src, lengths, prev)[0])
    assert ours(src, lengths, prev)[0].abs().sum() > 0
    as_bf16 = teacher.load(str(setting["teacher"]), task, dtype=torch.bfloat16)
    assert {p.dtype for p in as_bf16.parameters()} == {torch.bfloat16}


def test_teacher_of_other_dictionaries_is_one_line(setting):
    task = translation_task(setting["other_bin"])
    with pytest.raises(CheckpointError) as e:
        teacher.load(str(setting["teacher"]), task)
    text = str(e.value)
    assert "\n" not in text
    assert f"has {len(task.source_dictionary)}" in text and "dict.src.txt" in text
    assert "--srcdict" in text
