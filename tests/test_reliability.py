"""Issue 7.1, 7.4, 7.5: evaluation covers every sentence; bad input gets a clear answer; checkpoints
load safely.  End-to-end through the real ``fairseq-train`` / ``fairseq-generate`` where the
behaviour lives there, in-process (fairseq's own parser and loaders) where that is enough.
"""

import hashlib
import os
import pickle
import re
import shutil
import sys
import zipfile

import pytest
import torch
from fairseq import checkpoint_utils, options, tasks
from helpers import PLUGIN_DIR, TINY, build_model, parse_model_args, run_cli

import fairseq_deep  # noqa: F401
from fairseq_deep.errors import CheckpointError
from fairseq_deep.patches import safe_loading
from fairseq_deep.patches.evaluation_batches import batch_by_size_all
from fairseq_deep.patches.install import fairseq_original

N_LINES = 101  # valid and test of the synthetic corpus (conftest)
GENERATE = ["--beam", "1", "--max-len-a", "0", "--max-len-b", "3", "--cpu", "--num-workers", "0"]


def md5(path):
    return hashlib.md5(open(path, "rb").read()).hexdigest()


def train_argv(data, save_dir, arch="transformer_dlcl", *extra):
    return [
        sys.executable,
        "-m",
        "fairseq_cli.train",
        str(data),
        "--user-dir",
        PLUGIN_DIR,
        "--task",
        "translation",
        "--arch",
        arch,
        *TINY,
        "--encoder-layers",
        "2",
        "--decoder-layers",
        "2",
        "--optimizer",
        "adam",
        "--lr",
        "0.002",
        "--max-tokens",
        "400",
        "--max-update",
        "3",
        "--save-dir",
        str(save_dir),
        "--seed",
        "1",
        "--cpu",
        "--num-workers",
        "0",
        "--no-progress-bar",
        "--no-epoch-checkpoints",
        *extra,
    ]


def run(argv):
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    proc = run_cli(*argv, env=env, timeout=300, check=False)
    return proc.returncode, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def trained(synthetic_bin, tmp_path_factory):
    """A tiny transformer_dlcl after 3 updates, validated in batches of 8 sentences (so that the
    last of the 101 validation sentences form a batch of 5, which fairseq alone would drop)."""
    save = tmp_path_factory.mktemp("trained")
    rc, log = run(
        train_argv(
            synthetic_bin,
            save,
            "transformer_dlcl",
            "--batch-size-valid",
            "8",
            "--max-tokens-valid",
            "100000",
            "--required-batch-size-multiple",
            "8",
        )
    )
    assert rc == 0, log[-4000:]
    return save / "checkpoint_last.pt"


def load(path):
    return torch.load(path, map_location="cpu", weights_only=True)


# -- 1. evaluation covers every sentence ----------------------------------------------------------


def test_validation_counts_every_sentence(trained):
    """The 'valid' meters saved in the checkpoint: bsz summed over batches = sentences validated."""
    meters = {key: state for _, key, _, state in load(trained)["extra_state"]["metrics"]["valid"]}
    assert meters["bsz"]["sum"] == N_LINES  # fairseq alone: 96 (12 batches of 8)
    assert meters["bsz"]["count"] == 13 and meters["bsz"]["val"] == N_LINES - 96


@pytest.mark.parametrize(
    "batching",
    [
        ["--max-tokens", "150"],
        ["--max-sentences", "8", "--required-batch-size-multiple", "8"],  # = --batch-size 8
    ],
    ids=["max-tokens", "max-sentences-8-multiple-8"],
)
def test_generate_translates_every_line(synthetic_bin, trained, batching):
    rc, out = run(
        [
            "fairseq-generate",
            str(synthetic_bin),
            "--user-dir",
            PLUGIN_DIR,
            "--path",
            str(trained),
            *GENERATE,
            *batching,
        ]
    )
    assert rc == 0, out[-3000:]
    ids = sorted(int(i) for i in re.findall(r"^H-(\d+)\t", out, flags=re.M))
    assert ids == list(range(N_LINES))


def test_shim_gives_back_exactly_what_fairseq_drops():
    """fairseq 0.12.3 alone batches 101 sentences by 8 into 12 batches (96 sentences); the shim
    keeps those batches unchanged and adds the 5 dropped sentences as a last batch.  The official
    0.12.2 keeps all 101 (the drop came later, fairseq #5036): there the shim changes nothing."""
    import fairseq
    import numpy as np

    sizes = np.arange(N_LINES) % 13 + 1
    kwargs = dict(max_sentences=8, required_batch_size_multiple=8)
    theirs = fairseq_original(batch_by_size_all)(np.arange(N_LINES), lambda i: sizes[i], **kwargs)
    ours = batch_by_size_all(np.arange(N_LINES), lambda i: sizes[i], **kwargs)
    if fairseq.__version__ == "0.12.2":
        assert [b.tolist() for b in ours] == [b.tolist() for b in theirs]
        assert sum(map(len, ours)) == N_LINES
        return
    assert sum(map(len, theirs)) == 96
    assert [b.tolist() for b in ours[:-1]] == [b.tolist() for b in theirs]
    assert ours[-1].tolist() == list(range(96, N_LINES))


@pytest.mark.parametrize(
    "max_sentences,max_tokens,multiple",
    [(8, None, 8), (16, None, 8), (None, 150, 8), (7, 200, 3), (101, None, 8), (1, None, 1)],
)
def test_evaluation_iterator_yields_every_sentence(
    synthetic_bin, max_sentences, max_tokens, multiple
):
    """fairseq's own batch iterator over the binarized valid set, as validate/generate build it."""
    args = options.parse_args_and_arch(
        options.get_training_parser(),
        [str(synthetic_bin), "--task", "translation", "--arch", "transformer_dlcl", "--cpu"],
    )
    task = tasks.setup_task(args)
    task.load_dataset("valid")
    itr = task.get_batch_iterator(
        dataset=task.dataset("valid"),
        max_tokens=max_tokens,
        max_sentences=max_sentences,
        required_batch_size_multiple=multiple,
        ignore_invalid_inputs=False,
    ).next_epoch_itr(shuffle=False)
    ids = sorted(i for batch in itr for i in batch["id"].tolist())
    assert ids == list(range(N_LINES))


# -- 4. bad input gets a clear answer -------------------------------------------------------------


def argparse_parser_for(arch):
    import argparse

    from fairseq.models import ARCH_MODEL_REGISTRY

    parser = argparse.ArgumentParser()
    ARCH_MODEL_REGISTRY[arch].add_args(parser)
    return parser


@pytest.mark.parametrize("arch", ["transformer_dlcl"])
def test_every_option_of_ours_refuses_an_unknown_value(arch, capsys):
    ours = [
        a
        for a in argparse_parser_for(arch)._actions
        if any(o.startswith(("--dlcl-", "--ta-", "--agg-", "--ff-")) for o in a.option_strings)
    ]
    assert ours
    for action in ours:
        flag = action.option_strings[0]
        with pytest.raises(SystemExit):
            parse_model_args(arch, [flag, "no-such-value"])
        err = capsys.readouterr().err
        if action.choices:  # a choice: argparse names the option and lists the valid values
            assert f"argument {flag}: invalid choice: 'no-such-value'" in err
            assert all(str(c) in err for c in action.choices)
        else:  # a switch takes no value
            assert "unrecognized arguments: no-such-value" in err


def test_unknown_arch_is_refused(capsys):
    with pytest.raises(SystemExit):
        parse_model_args("transformer_dlcl_31l")
    assert "invalid choice: 'transformer_dlcl_31l'" in capsys.readouterr().err


def test_preset_with_conflicting_depth_names_the_fix():
    with pytest.raises(
        ValueError,
        match=r"--arch transformer_dlcl_30l has 30 encoder layers but "
        r"--encoder-layers 12 was given: drop --encoder-layers, or use "
        r"--arch transformer_dlcl --encoder-layers 12",
    ):
        build_model("transformer_dlcl_30l", ["--encoder-layers", "12"])


def test_checkpoint_of_another_arch_is_refused_and_kept(synthetic_bin, trained, tmp_path):
    save = tmp_path / "resume"
    save.mkdir()
    shutil.copy(trained, save / "checkpoint_last.pt")
    before = md5(save / "checkpoint_last.pt")
    rc, log = run(train_argv(synthetic_bin, save, "transformer_prenorm", "--max-update", "6"))
    assert rc != 0
    message = log.strip().splitlines()[-1]
    assert message.startswith("fairseq_deep.errors.CheckpointError:"), message
    # issue 32: the options that differ, with both values (the two models were named alike before)
    assert (
        "holds a model whose architecture differs from this run's: --dlcl-stacks (checkpoint both, this run none)"
        in message
        and "--model-from" in message
    )
    assert os.listdir(save) == ["checkpoint_last.pt"] and md5(save / "checkpoint_last.pt") == before


@pytest.mark.parametrize("keep", [0.0, 0.5, 0.99])
def test_truncated_checkpoint_names_file_cause_and_fix(trained, tmp_path, keep):
    data = open(trained, "rb").read()
    path = tmp_path / "checkpoint_best.pt"
    path.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(
        CheckpointError,
        match=r"is not a complete checkpoint.*truncated.*"
        r"Use another checkpoint",
    ) as e:
        checkpoint_utils.load_model_ensemble_and_task([str(path)])
    assert str(path) in str(e.value)


def test_truncated_checkpoint_last_stops_training_and_is_kept(synthetic_bin, trained, tmp_path):
    save = tmp_path / "resume"
    save.mkdir()
    data = open(trained, "rb").read()
    (save / "checkpoint_last.pt").write_bytes(data[: len(data) // 2])
    rc, log = run(train_argv(synthetic_bin, save, "transformer_dlcl", "--max-update", "6"))
    assert rc != 0
    assert "is not a complete checkpoint" in log.strip().splitlines()[-1]
    assert os.listdir(save) == ["checkpoint_last.pt"]
    assert (save / "checkpoint_last.pt").read_bytes() == data[: len(data) // 2]


@pytest.fixture(scope="module")
def bad_data(synthetic_bin, tmp_path_factory):
    """The synthetic test set with an empty line (both sides), an empty source line, and one
    source of 120 words, binarized with the corpus dictionaries."""
    root = tmp_path_factory.mktemp("bad_data")
    raw = synthetic_bin.parent / "raw"
    src = open(raw / "test.src").read().splitlines()
    tgt = open(raw / "test.tgt").read().splitlines()
    src[3] = tgt[3] = ""
    src[5] = ""
    src[7] = " ".join((src[0].split() * 20)[:120])
    (root / "test.src").write_text("\n".join(src) + "\n")
    (root / "test.tgt").write_text("\n".join(tgt) + "\n")
    run_cli(
        "fairseq-preprocess",
        "--source-lang",
        "src",
        "--target-lang",
        "tgt",
        "--testpref",
        str(root / "test"),
        "--destdir",
        str(root / "bin"),
        "--workers",
        "1",
        "--srcdict",
        str(synthetic_bin / "dict.src.txt"),
        "--tgtdict",
        str(synthetic_bin / "dict.tgt.txt"),
    )
    return root / "bin"


def test_too_long_sentence_stops_generation_with_the_fix(bad_data, trained):
    rc, log = run(
        [
            "fairseq-generate",
            str(bad_data),
            "--user-dir",
            PLUGIN_DIR,
            "--path",
            str(trained),
            *GENERATE,
            "--max-tokens",
            "4000",
            "--max-source-positions",
            "64",
        ]
    )
    assert rc != 0
    assert re.search(
        r"Size of sample #7 is invalid .* since max_positions=\(64, \d+\), skip this "
        r"example with --skip-invalid-size-inputs-valid-test",
        log.strip().splitlines()[-1],
    )


def test_skip_invalid_sizes_translates_every_other_line(bad_data, trained):
    rc, log = run(
        [
            "fairseq-generate",
            str(bad_data),
            "--user-dir",
            PLUGIN_DIR,
            "--path",
            str(trained),
            *GENERATE,
            "--max-tokens",
            "4000",
            "--max-source-positions",
            "64",
            "--skip-invalid-size-inputs-valid-test",
        ]
    )
    assert rc == 0, log[-3000:]
    assert "1 samples have invalid sizes and will be skipped" in log and "sample ids=[7]" in log
    ids = sorted(int(i) for i in re.findall(r"^H-(\d+)\t", log, flags=re.M))
    assert ids == [i for i in range(N_LINES) if i != 7]  # empty lines 3 and 5 are translated


# -- 5. safe checkpoint loading -------------------------------------------------------------------


class _Payload:
    """Unpickling this runs os.system(command): what a malicious checkpoint would carry."""

    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


def _malicious_checkpoint(trained, path, marker, inside_real_checkpoint=True):
    state = load(trained) if inside_real_checkpoint else {}
    state.setdefault("extra_state", {})["payload"] = _Payload(f"touch {marker}")
    torch.save(state, path)
    assert b"system" in zipfile.ZipFile(path).read(
        zipfile.ZipFile(path).namelist()[0].split("/")[0] + "/data.pkl"
    )


# torch < 2.6 (the newest on Python 3.8 is 2.4) loads full pickles by default (no weights-only check),
# and so do fairseq and the package there: a pickled callable runs, as with plain fairseq (README, Installation)
WEIGHTS_ONLY_BY_DEFAULT = pytest.mark.skipif(
    safe_loading._torch_version() < (2, 6),
    reason="torch < 2.6 does not load weights-only by default",
)


@WEIGHTS_ONLY_BY_DEFAULT
@pytest.mark.parametrize("inside", [True, False], ids=["in-a-real-checkpoint", "alone"])
def test_pickled_callable_is_refused_and_not_run(trained, tmp_path, inside):
    path, marker = tmp_path / "evil.pt", tmp_path / "PWNED"
    _malicious_checkpoint(trained, path, marker, inside)
    with pytest.raises(
        CheckpointError,
        match=r"evil\.pt was not loaded: it holds a reference to "
        r"posix\.system.*refused \(torch\.load with weights_only=True\)",
    ):
        checkpoint_utils.load_model_ensemble_and_task([str(path)])
    with pytest.raises(pickle.UnpicklingError):  # the plain torch.load refuses it too
        torch.load(path, weights_only=True)
    assert not marker.exists()


@WEIGHTS_ONLY_BY_DEFAULT
def test_fairseq_generate_refuses_a_pickled_callable(synthetic_bin, trained, tmp_path):
    path, marker = tmp_path / "evil.pt", tmp_path / "PWNED"
    _malicious_checkpoint(trained, path, marker)
    rc, log = run(
        [
            "fairseq-generate",
            str(synthetic_bin),
            "--user-dir",
            PLUGIN_DIR,
            "--path",
            str(path),
            *GENERATE,
            "--max-tokens",
            "1000",
        ]
    )
    assert rc != 0
    assert "CheckpointError: " in log and "posix.system" in log.strip().splitlines()[-1]
    assert not marker.exists() and "H-0" not in log


@WEIGHTS_ONLY_BY_DEFAULT
def test_allow_list_is_exactly_what_a_fairseq_checkpoint_holds(trained):
    """Every global a checkpoint written by fairseq-train references is allow-listed: the
    checkpoint loads with weights_only=True and nothing outside the list is needed."""
    registered = torch.serialization.get_safe_globals()
    torch.serialization.clear_safe_globals()  # what torch alone would refuse
    try:
        needed = set(torch.serialization.get_unsafe_globals_in_checkpoint(str(trained)))
    finally:
        torch.serialization.clear_safe_globals()
        torch.serialization.add_safe_globals(registered)
    named = [
        safe_loading._as_safe_global(t) for t in safe_loading.checkpoint_safe_globals()
    ]  # typing.Any by name on 3.8/3.9
    allowed = {
        g[1] if isinstance(g, tuple) else f"{g.__module__}.{g.__qualname__}"
        for g in named
        if g is not None
    }
    assert needed and needed <= allowed, needed - allowed
    state = checkpoint_utils.load_checkpoint_to_cpu(str(trained))
    assert any("history" in k for k in state["model"])


def test_no_code_of_ours_turns_the_check_off():
    """Neither the package nor its tests, benchmarks and examples load a checkpoint with the check
    switched off: what fairseq checkpoints hold is allow-listed (patches/safe_loading.py)."""
    pattern = re.compile(  # the argument, or the variable set in an environment or a shell script
        r"weights_only\s*=\s*False\s*[,)]"
        r"|environ[^\n]*TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD[\"']?\]?\s*(=[^=]|,)"
        r"|^\s*(export\s+)?TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=",
        re.M,
    )
    repository = os.path.dirname(PLUGIN_DIR)
    for folder in ("fairseq_deep", "tests", "benchmarks", "examples"):
        for root, _, files in os.walk(os.path.join(repository, folder)):
            for name in files:
                path = os.path.join(root, name)
                if name.endswith((".py", ".sh")) and path != os.path.abspath(__file__):
                    text = open(path, encoding="utf-8").read()
                    assert not pattern.search(text), path
