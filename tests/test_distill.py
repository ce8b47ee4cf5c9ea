"""Sequence-level distillation (issue 46, item 1): the teacher (fairseq_deep/teacher.py) is the
model fairseq loads, and a teacher of other dictionaries is one line; ``fairseq-deep-distill``
writes a data-bin fairseq-train reads, whose targets are fairseq-generate's hypotheses of the
training split, the same in 2 shards as in one and after a kill -9 and a rerun, byte for byte;
--keep-original doubles the pairs; a foreign --destdir and a mismatching teacher are one line and
write nothing."""

import json
import os
import shutil

import numpy as np
import pytest
import torch
from fairseq import checkpoint_utils, tasks
from fairseq.data import data_utils
from helpers import python_module, random_batch, run_cli, tiny_dictionary
from test_cli_errors import assert_user_error
from test_grow import save_tiny

from fairseq_deep import distill as ds
from fairseq_deep import teacher
from fairseq_deep.data.synthetic import write_corpus
from fairseq_deep.errors import CheckpointError
from fairseq_deep.models.families import TINY_TRANSFORMER

#: a tiny post-norm DLCL teacher trained for a few updates (its outputs, not its quality, matter)
TEACHER = [
    "--arch",
    "transformer_dlcl",
    *TINY_TRANSFORMER,  # the Transformer families' tiny sizes, at 2 + 1 layers (a later value wins)
    "--encoder-layers",
    "2",
    "--decoder-layers",
    "1",
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


@pytest.mark.parametrize("arch", ["rnmt_plus", "deep_att", "hybrid_multicolumn", "transformer_ta"])
def test_a_teacher_of_every_family_is_the_model_fairseq_loads(arch, tmp_path):
    """RNMT+, Deep-Att, a hybrid whose encoder has two embeddings, transparent attention: the
    same outputs as fairseq's loading; a source dictionary of another size is refused."""
    path = str(tmp_path / "teacher.pt")
    _, task = save_tiny(arch, [], path)
    ours = teacher.load(path, task)
    models, _ = checkpoint_utils.load_model_ensemble([path], task=task)
    batch = random_batch(task.source_dictionary)
    with torch.no_grad():
        torch.testing.assert_close(ours(*batch)[0], models[0].eval()(*batch)[0])
    bigger = tasks.translation.TranslationTask(
        task.cfg, tiny_dictionary(30), task.target_dictionary
    )
    with pytest.raises(CheckpointError, match="source dictionary has 24 symbols .* has 34"):
        teacher.load(path, bigger)


# ---------------------------------------------------------------------------------------------
# fairseq-deep-distill
# ---------------------------------------------------------------------------------------------

PROG = "fairseq-deep-distill"
#: beam 2, 10 batches of 16 (the last one short), 5 chunks of 2 batches
DECODE = ["--beam", "2", "--batch-size", "16", "--max-len-a", "1", "--max-len-b", "5", "--cpu"]
CHUNKS = ["--chunk-batches", "2"]


def distill(setting, out, *extra, data=None, env=None, check=True):
    return run_cli(
        *python_module("fairseq_deep.distill"),
        str(data or setting["bin"]),
        "--path",
        str(setting["teacher"]),
        "--destdir",
        str(out),
        *DECODE,
        *extra,
        env=env,
        check=check,
    )


def train_targets(folder, dictionary):
    return [
        item.tolist()
        for item in data_utils.load_indexed_dataset(str(folder / "train.src-tgt.tgt"), dictionary)
    ]


def dictionary(setting):
    return translation_task(setting["bin"]).target_dictionary


def files(folder):
    """{name: bytes} of a folder's files (the lock file apart: empty)."""
    return {
        name: (folder / name).read_bytes() for name in sorted(os.listdir(folder)) if name != ds.LOCK
    }


def same_data_bin(folder, reference) -> bool:
    """The same files, byte for byte, and the same identity in the stamp (its command names the
    --destdir)."""
    got, want = files(folder), files(reference)
    identity = [json.loads(f.pop(ds.STAMP))["identity"] for f in (got, want)]
    return got == want and identity[0] == identity[1]


@pytest.fixture(scope="module")
def reference(setting):
    """The uninterrupted one-shard run."""
    out = setting["root"] / "reference"
    distill(setting, out, *CHUNKS)
    return out


def hypotheses(stdout):
    """{sentence id: hypothesis} of fairseq-generate's H- lines."""
    found = {}
    for line in stdout.splitlines():
        if line.startswith("H-"):
            key, _score, text = line.split("\t")
            found[int(key[2:])] = text
    return found


def test_targets_are_fairseq_generate_hypotheses_of_the_training_split(setting, reference):
    generated = hypotheses(
        run_cli(
            "fairseq-deep-generate",
            str(setting["bin"]),
            "--path",
            str(setting["teacher"]),
            "--gen-subset",
            "train",
            *DECODE,
        ).stdout
    )
    d = dictionary(setting)
    targets = train_targets(reference, d)
    assert len(targets) == len(generated) == 150
    assert [d.string(torch.tensor(t)) for t in targets] == [generated[i] for i in range(150)]
    assert all(t[-1] == d.eos() for t in targets)
    originals = train_targets(setting["bin"], d)
    assert targets != originals  # the teacher's, not the data's
    given, written = files(setting["bin"]), files(reference)
    assert set(written) == {n for n in given if n != "preprocess.log"} | {ds.STAMP}
    for name, content in given.items():  # the sources, dictionaries, valid and test as given
        if name != "preprocess.log" and not (name.startswith("train.") and ".tgt." in name):
            assert written[name] == content, name
    stamp = json.loads(written[ds.STAMP])
    assert stamp["identity"]["teacher"]["path"] == str(setting["teacher"])
    assert stamp["command"].startswith(PROG + " ")


def test_fairseq_train_reads_the_distilled_data_bin_at_once(setting, reference):
    proc = run_cli(
        "fairseq-deep-train",
        str(reference),
        *[a if a != "30" else "3" for a in TEACHER],  # --max-update 3
        "--save-dir",
        str(setting["root"] / "student"),
    )
    assert "num_updates 3" in proc.stdout + proc.stderr
    assert (setting["root"] / "student" / "checkpoint_last.pt").is_file()


def test_two_shards_as_separate_processes_equal_one(setting, reference):
    out = setting["root"] / "two_shards"
    first = distill(setting, out, *CHUNKS, "--num-shards", "2", "--shard-id", "1")
    assert "1 of 2 shards done" in first.stdout
    assert not (out / "train.src-tgt.tgt.bin").exists()
    distill(setting, out, *CHUNKS, "--num-shards", "2", "--shard-id", "0")
    got, want = files(out), files(reference)
    assert set(got) == set(want)
    for name in want:
        if name != ds.STAMP:  # the identity too, but for the shards
            assert got[name] == want[name], name
    assert not (out / ds.WORK).exists()


def test_a_run_killed_midway_and_run_again_equals_the_uninterrupted_run(setting, reference):
    out = setting["root"] / "killed"
    env = dict(os.environ, **{ds.KILL_AFTER_ENV: "2"})
    killed = distill(setting, out, *CHUNKS, env=env, check=False)
    assert killed.returncode in (-9, 137), (killed.returncode, killed.stderr[-2000:])
    progress = json.loads((out / ds.WORK / "shard0-of1" / "progress.json").read_text())
    assert progress["chunks_done"] == 2 and progress["chunks"] == 5
    assert not (out / "train.src-tgt.tgt.bin").exists()
    chunks = sorted((out / ds.WORK / "shard0-of1").glob("chunk*.npz"))
    assert len(chunks) == 2  # the third, decoded in part, was lost with the process
    kept = sum(len(np.load(c)["ids"]) for c in chunks)
    again = distill(setting, out, *CHUNKS)
    assert "2 written by an earlier run, skipped" in again.stdout
    left = 150 - kept  # decoded once more, no more
    assert f"progress: {left}/{left} sentences (100.0%)" in again.stdout
    assert same_data_bin(out, reference)
    assert "is complete: nothing to do" in distill(setting, out, *CHUNKS).stdout
    assert same_data_bin(out, reference)


def test_keep_original_puts_the_original_pairs_before_the_distilled_ones(setting, reference):
    out = setting["root"] / "kept"
    distill(setting, out, *CHUNKS, "--keep-original")
    d = dictionary(setting)
    targets = train_targets(out, d)
    assert targets == train_targets(setting["bin"], d) + train_targets(reference, d)
    sources = [
        t.tolist() for t in data_utils.load_indexed_dataset(str(out / "train.src-tgt.src"), d)
    ]
    original = [
        t.tolist()
        for t in data_utils.load_indexed_dataset(str(setting["bin"] / "train.src-tgt.src"), d)
    ]
    assert sources == original + original


def test_a_foreign_destdir_is_one_line_and_left_as_it_was(setting, reference):
    out = setting["root"] / "foreign"
    shutil.copytree(reference, out)
    before = files(out)
    proc = distill(setting, out, "--beam", "3", *CHUNKS, check=False)
    assert_user_error(proc, PROG, "holds another run's distillation", "generation", alone=True)
    assert files(out) == before
    (out / "notes.txt").write_text("mine")
    os.remove(out / ds.STAMP)
    proc = distill(setting, out, *CHUNKS, check=False)
    assert_user_error(proc, PROG, "did not write", alone=True)


def test_a_teacher_of_other_dictionaries_is_one_line_and_writes_nothing(setting):
    out = setting["root"] / "never"
    proc = distill(setting, out, *CHUNKS, data=setting["other_bin"], check=False)
    assert_user_error(proc, PROG, "the teacher's source dictionary has", "--srcdict", alone=True)
    assert not out.exists()


def test_bf16_targets_are_fairseq_generate_hypotheses_in_bf16(setting):
    out = setting["root"] / "bf16"
    distill(setting, out, "--bf16")
    generated = hypotheses(
        run_cli(
            "fairseq-deep-generate",
            str(setting["bin"]),
            "--path",
            str(setting["teacher"]),
            "--gen-subset",
            "train",
            *DECODE,
            "--bf16",
        ).stdout
    )
    d = dictionary(setting)
    targets = [d.string(torch.tensor(t)) for t in train_targets(out, d)]
    assert targets == [generated[i] for i in range(150)]


def test_empty_hypotheses_are_kept(setting):
    """At a length limit of 0 the teacher's every hypothesis is its end of sentence: each pair
    keeps one, an empty target."""
    out = setting["root"] / "empty"
    proc = distill(setting, out, "--max-len-a", "0", "--max-len-b", "0", "--min-len", "0")
    d = dictionary(setting)
    assert train_targets(out, d) == [[d.eos()]] * 150
    assert "(150 empty hypotheses kept)" in proc.stdout
