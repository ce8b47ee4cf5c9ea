"""Issue 15: examples/rnmt_plus/run.sh passes Chen et al.'s (2018) per-pair hyper-parameters
(App. A.2-A.6), and every command it builds parses with fairseq-train's own parser."""

import os
import stat
import subprocess

import pytest
from fairseq import options

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN = os.path.join(ROOT, "examples", "rnmt_plus", "run.sh")
MODELS = [
    "rnmt_plus",
    "rnmt_plus_enfr",
    "transformer_base",
    "transformer_big",
    "hybrid_transformer_rnmt",
    "hybrid_rnmt_transformer",
    "hybrid_cascaded",
    "hybrid_multicolumn",
]


def recipe(tmp_path, model, pair="en_de"):
    """The fairseq-train argv that run.sh builds for `model` (fairseq-train stubbed)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    stub = bin_dir / "fairseq-train"
    stub.write_text('#!/usr/bin/env bash\nfor a in "$@"; do printf "%s\\0" "$a"; done\n')
    stub.chmod(stub.stat().st_mode | stat.S_IEXEC)
    env = dict(
        os.environ,
        PATH=f"{bin_dir}:{os.environ['PATH']}",
        DATA=str(tmp_path / "data"),
        GPUS="8",
        PAIR=pair,
        RNMT_CKPT="rnmt.pt",
        TRANS_CKPT="trans.pt",
        SAVE=str(tmp_path / "ckpt"),
    )
    out = subprocess.run(
        ["bash", RUN, model], cwd=ROOT, env=env, capture_output=True, check=True
    ).stdout
    return out.decode().split("\0")[:-1]


def value(argv, flag):
    return argv[len(argv) - 1 - argv[::-1].index(flag) + 1] if flag in argv else None


@pytest.mark.parametrize("pair", ["en_de", "en_fr"])
@pytest.mark.parametrize("model", MODELS)
def test_recipes_parse(tmp_path, model, pair):
    argv = recipe(tmp_path, model, pair)
    args = options.parse_args_and_arch(options.get_training_parser(), argv)
    assert args.arch.startswith(
        model.split("_enfr")[0]
        .replace("transformer_base", "transformer_prenorm")
        .replace("transformer_big", "transformer_prenorm_big")
    )


@pytest.mark.parametrize(
    "model", ["hybrid_transformer_rnmt", "hybrid_rnmt_transformer", "hybrid_cascaded"]
)
def test_hybrids_keep_each_components_dropout(tmp_path, model):
    """App. A.4-A.5: each component its own model's rates (A.2, A.3)."""
    fr = recipe(tmp_path, model, "en_fr")
    assert [
        value(fr, f)
        for f in (
            "--hybrid-transformer-dropout",
            "--attention-dropout",
            "--activation-dropout",
            "--hybrid-rnmt-dropout",
            "--hybrid-rnmt-attention-dropout",
        )
    ] == ["0.1", "0.1", "0.1", "0.2", "0.2"]
    de = recipe(tmp_path, model, "en_de")
    assert [
        value(de, f)
        for f in (
            "--hybrid-transformer-dropout",
            "--attention-dropout",
            "--activation-dropout",
            "--hybrid-rnmt-dropout",
            "--hybrid-rnmt-attention-dropout",
        )
    ] == ["0.3", "0", "0", "0.3", "0.3"]


def test_multicolumn_schedule_of_appendix_a6(tmp_path):
    de = options.parse_args_and_arch(
        options.get_training_parser(), recipe(tmp_path, "hybrid_multicolumn", "en_de")
    )
    assert (de.lr_scheduler, de.warmup_updates, de.rnmt_decay_start, de.rnmt_decay_end) == (
        "rnmt_plus",
        50,
        300000,
        900000,
    )
    assert (de.dropout, de.attention_dropout, de.activation_dropout, de.l2_regularization) == (
        0.3,
        0.3,
        0.3,
        1e-5,
    )
    fr = options.parse_args_and_arch(
        options.get_training_parser(), recipe(tmp_path, "hybrid_multicolumn", "en_fr")
    )
    assert (fr.lr_scheduler, fr.noam_r0, fr.warmup_updates) == ("noam", 1.0, 10000)
    assert (fr.dropout, fr.attention_dropout, fr.activation_dropout) == (0.0, 0.0, 0.0)
    assert not getattr(fr, "l2_regularization", 0) and not fr.weight_decay


@pytest.mark.parametrize(
    "model", ["rnmt_plus", "rnmt_plus_enfr", "transformer_base", "transformer_big"]
)
def test_chen_recipes_keep_separate_embeddings(tmp_path, model):
    """Chen et al. Table 3 counts separate embeddings (RNMT+ 378.9M; shared: 283.5M)."""
    argv = recipe(tmp_path, model)
    assert "--share-all-embeddings" not in argv
    assert not options.parse_args_and_arch(options.get_training_parser(), argv).share_all_embeddings
