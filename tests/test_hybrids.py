"""Hybrids of RNMT+ and the Transformer (Chen et al. 2018, Sec. 6): incremental == full in-process;
every hybrid trains through the real fairseq-train and decodes with fairseq-generate; pre-trained
encoder parts load from checkpoints, and frozen parts receive no update."""

import re

import pytest
import torch
from fairseq import options, tasks
from helpers import PLUGIN_DIR, random_batch, run_cli, tiny_dictionary

TINY = [
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
    "--encoder-hidden-size",
    "8",
    "--decoder-hidden-size",
    "16",
    "--encoder-layers",
    "2",
    "--decoder-layers",
    "2",
    "--rnmt-encoder-layers",
    "2",
]
HYBRIDS = [
    "hybrid_transformer_rnmt",
    "hybrid_rnmt_transformer",
    "hybrid_cascaded",
    "hybrid_multicolumn",
]


@pytest.fixture(autouse=True)
def one_thread(monkeypatch):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    yield
    torch.set_num_threads(threads)


def build(arch, extra=()):
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(
        parser,
        [
            "dummy",
            "--task",
            "translation",
            "--arch",
            arch,
            "--cpu",
            *TINY,
            "--dropout",
            "0",
            *extra,
        ],
    )
    d = tiny_dictionary()
    task = tasks.translation.TranslationTask(args, d, d)
    torch.manual_seed(0)
    return task.build_model(args).eval(), d


@pytest.mark.parametrize(
    "arch,extra",
    [(a, []) for a in HYBRIDS]
    + [
        ("hybrid_multicolumn", ["--hybrid-columns", "rnmt,transformer,rnmt"]),
    ],
)
def test_hybrid_incremental_equals_full(arch, extra):
    model, d = build(arch, extra)
    src, lengths, prev = random_batch(d)
    with torch.no_grad():
        full, _ = model(src, lengths, prev)
        enc = model.encoder(src, lengths)
        state, steps = {}, []
        for t in range(prev.size(1)):
            steps.append(model.decoder(prev[:, : t + 1], enc, incremental_state=state)[0])
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-4)
    order = torch.tensor([2, 0, 1])
    re_enc = model.encoder.reorder_encoder_out(enc, order)
    torch.testing.assert_close(re_enc["encoder_out"][0], enc["encoder_out"][0][:, order])


def test_cascaded_has_no_positions_and_multicolumn_any_number_of_columns():
    model, _ = build("hybrid_cascaded")
    assert not any("embed_positions" in n for n, _ in model.named_parameters())
    assert len(model.encoder.transformer.layers) == 2 and model.encoder.rnmt.num_layers == 2
    model, _ = build("hybrid_multicolumn", ["--hybrid-columns", "rnmt,transformer,rnmt"])
    assert len(model.encoder.columns) == 3 and model.encoder.merge.in_features == 16 * 3
    with pytest.raises(ValueError, match="--hybrid-encoder cascaded but --hybrid-encoder rnmt"):
        build("hybrid_cascaded", ["--hybrid-encoder", "rnmt"])


TRANSFORMER_ONLY = {
    "--encoder-ffn-embed-dim",
    "--decoder-ffn-embed-dim",
    "--encoder-attention-heads",
    "--decoder-attention-heads",
}


def _flags(arch):
    if arch.startswith("hybrid"):
        return TINY
    pairs = zip(TINY[::2], TINY[1::2])
    return [x for k, v in pairs if k not in TRANSFORMER_ONLY for x in (k, v)]


def _train(data, save, arch, *extra, updates=2):
    return run_cli(
        "fairseq-train",
        str(data),
        "--user-dir",
        PLUGIN_DIR,
        "--arch",
        arch,
        *_flags(arch),
        "--source-lang",
        "src",
        "--target-lang",
        "tgt",
        "--cpu",
        "--optimizer",
        "adam",
        "--lr",
        "1e-3",
        "--criterion",
        "label_smoothed_cross_entropy",
        "--label-smoothing",
        "0.1",
        "--max-tokens",
        "500",
        "--max-update",
        str(updates),
        "--save-dir",
        str(save),
        "--no-epoch-checkpoints",
        "--no-save-optimizer-state",
        "--log-format",
        "simple",
        "--seed",
        "1",
        "--num-workers",
        "0",
        *extra,
    ).stdout


def _generate(data, ckpt):
    out = run_cli(
        "fairseq-generate",
        str(data),
        "--user-dir",
        PLUGIN_DIR,
        "--path",
        str(ckpt),
        "--source-lang",
        "src",
        "--target-lang",
        "tgt",
        "--gen-subset",
        "test",
        "--beam",
        "2",
        "--batch-size",
        "32",
        "--max-len-b",
        "10",
        "--cpu",
    ).stdout
    return [line for line in out.splitlines() if line.startswith("H-")]


def _params(ckpt, prefix):
    model = torch.load(ckpt, map_location="cpu")["model"]
    return {k[len(prefix) :]: v for k, v in model.items() if k.startswith(prefix)}


def _param_counts(log):
    """(all, trained) from fairseq-train's 'num. shared model params: N (num. trained: M)'."""
    m = re.search(r"num\. shared model params: ([\d,]+) \(num\. trained: ([\d,]+)\)", log)
    return int(m.group(1).replace(",", "")), int(m.group(2).replace(",", ""))


def test_every_hybrid_trains_and_decodes_through_the_cli_and_frozen_parts_do_not_move(
    synthetic_bin, tmp_path
):
    rnmt = tmp_path / "rnmt"
    _train(synthetic_bin, rnmt, "rnmt_plus", updates=1)
    trans = tmp_path / "trans_rnmt"
    _train(synthetic_bin, trans, "hybrid_transformer_rnmt")
    assert len(_generate(synthetic_bin, trans / "checkpoint_last.pt")) == 101

    rt = tmp_path / "rnmt_trans"
    _train(synthetic_bin, rt, "hybrid_rnmt_transformer")
    assert len(_generate(synthetic_bin, rt / "checkpoint_last.pt")) == 101

    pre_rnmt = _params(rnmt / "checkpoint_last.pt", "encoder.")
    pre_trans = _params(trans / "checkpoint_last.pt", "encoder.")

    casc = tmp_path / "cascaded"
    log = _train(
        synthetic_bin,
        casc,
        "hybrid_cascaded",
        "--hybrid-pretrained",
        str(rnmt / "checkpoint_last.pt"),
        "--hybrid-freeze-pretrained",
    )
    total, trained = _param_counts(log)
    assert trained == total - sum(v.numel() for v in pre_rnmt.values())
    after = _params(casc / "checkpoint_last.pt", "encoder.rnmt.")
    assert after.keys() == pre_rnmt.keys()
    assert all(torch.equal(after[k], pre_rnmt[k]) for k in pre_rnmt), "a frozen RNMT+ weight moved"
    assert len(_generate(synthetic_bin, casc / "checkpoint_last.pt")) == 101

    multi = tmp_path / "multicolumn"
    _train(
        synthetic_bin,
        multi,
        "hybrid_multicolumn",
        "--hybrid-pretrained",
        f"{rnmt / 'checkpoint_last.pt'},{trans / 'checkpoint_last.pt'}",
        "--hybrid-freeze-pretrained",
    )
    for i, pre in enumerate((pre_rnmt, pre_trans)):
        after = _params(multi / "checkpoint_last.pt", f"encoder.columns.{i}.")
        assert after.keys() == pre.keys()
        assert all(torch.equal(after[k], pre[k]) for k in pre), (
            f"a frozen weight of column {i} moved"
        )
    merge_after = _params(multi / "checkpoint_last.pt", "encoder.merge.")
    assert merge_after  # the merge layer is trained
    assert len(_generate(synthetic_bin, multi / "checkpoint_last.pt")) == 101


# ---- the residual and initialisation schemes (issue 26) ----------------------------------------


@pytest.mark.parametrize("scheme", ["--deepnorm", "--admin", "--rezero"])
def test_residual_schemes_stop_with_one_line_on_a_hybrid(scheme):
    """The hybrids' Transformer parts are pre-norm, their RNMT+ parts LSTMs: a residual scheme
    does not apply, and says so (not an unknown flag, not a silently plain model)."""
    from fairseq_deep.errors import UserError

    with pytest.raises(
        UserError, match=f"{scheme} replaces .* a hybrid's Transformer parts are pre-norm"
    ):
        build("hybrid_transformer_rnmt", [scheme])


def _transformer_layers(model):
    """(index within its stack, stack size, layer) of every Transformer layer of a model."""
    from fairseq.modules.transformer_layer import (
        TransformerDecoderLayerBase,
        TransformerEncoderLayerBase,
    )

    found = []
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList):
            layers = [
                m
                for m in module
                if isinstance(m, (TransformerEncoderLayerBase, TransformerDecoderLayerBase))
            ]
            found += [(i, len(module), layer) for i, layer in enumerate(layers)]
    return found


@pytest.mark.parametrize(
    "arch,extra,expected",
    [
        ("hybrid_transformer_rnmt", [], 2),
        ("hybrid_rnmt_transformer", [], 2),
        ("hybrid_cascaded", [], 2),
        ("hybrid_multicolumn", ["--hybrid-columns", "transformer,rnmt,transformer"], 4),
    ],
)
def test_ds_init_reaches_every_transformer_layer_of_a_hybrid(arch, extra, expected):
    """DS-Init (Zhang et al. 2019): every weight of Transformer layer l within the Xavier range
    times alpha / sqrt(l) (l counted within each Transformer part); the RNMT+ parts keep theirs."""
    alpha = 0.01
    model, _ = build(arch, [*extra, "--ds-init", "--ds-init-alpha", str(alpha)])
    layers = _transformer_layers(model)
    assert len(layers) == expected
    for index, _, layer in layers:
        for linear in (m for m in layer.modules() if isinstance(m, torch.nn.Linear)):
            fan_out, fan_in = linear.weight.shape
            bound = alpha / (index + 1) ** 0.5 * (6 / (fan_in + fan_out)) ** 0.5
            assert 0.5 * bound < linear.weight.abs().max().item() <= bound
    plain, _ = build(arch, extra)
    for _, _, layer in _transformer_layers(plain):  # without --ds-init: fairseq's own, wider range
        assert (
            max(
                m.weight.abs().max().item()
                for m in layer.modules()
                if isinstance(m, torch.nn.Linear)
            )
            > 0.1
        )
