"""Issue 15 (audit of Dou et al. 2018 against the code): the AGG node's hidden width and its
parameter counts (Sec. 4.2), dropout on F's output (Eq. 7) as a choice."""

import pytest
import torch
from fairseq import options, tasks
from helpers import build_model, tiny_dictionary

from fairseq_deep.modules.histories.layer_aggregation import AggregationNode


def _base_params(arch, extra=()):
    """Parameters of a Base preset (6+6 layers, d 512, FFN 2048) on a tiny vocabulary."""
    d = tiny_dictionary()
    args = options.parse_args_and_arch(
        options.get_training_parser(),
        ["x", "--task", "translation", "--arch", arch, "--cpu", *extra],
    )
    model = tasks.translation.TranslationTask(args, d, d).build_model(args)
    return sum(p.numel() for p in model.parameters())


def _nodes(model):
    return [m for m in model.modules() if isinstance(m, AggregationNode)]


@pytest.mark.parametrize("arch", ["transformer_iterative_agg", "transformer_hier_agg"])
def test_agg_width_defaults_to_the_stacks_ffn_width(arch):
    model, _ = build_model(arch, ["--encoder-ffn-embed-dim", "24", "--decoder-ffn-embed-dim", "20"])
    nodes = _nodes(model)
    assert nodes
    assert {n.fc1.out_features for n in _nodes(model.encoder)} == {24}
    assert {n.fc1.out_features for n in _nodes(model.decoder)} == {20}
    old, _ = build_model(arch, ["--agg-ffn-dim", "0"])  # what checkpoints made before saved
    assert {n.fc1.out_features for n in _nodes(old)} == {model.cfg.encoder.embed_dim}
    given, _ = build_model(arch, ["--agg-ffn-dim", "7"])
    assert {n.fc1.out_features for n in _nodes(given)} == {7}


def test_mla_nodes_keep_width_d():
    model, _ = build_model("transformer_mla2", ["--encoder-ffn-embed-dim", "24"])
    assert {n.fc1.out_features for n in _nodes(model)} == {model.cfg.encoder.embed_dim}


def test_base_parameter_counts_fall_in_the_papers_range():
    """Dou et al. Sec. 4.2: the strategies other than dense add 14.7M to 33.6M parameters (Base).
    The linear combination (12 d x d matrices, 3.15M) cannot reach the range at any width."""
    base = _base_params("transformer_agg_baseline")
    extra = {
        a: _base_params(a) - base
        for a in (
            "transformer_dense",
            "transformer_linear_agg",
            "transformer_iterative_agg",
            "transformer_hier_agg",
            "transformer_mla2",
            "transformer_mla3",
        )
    }
    assert extra["transformer_dense"] == 0
    assert extra["transformer_linear_agg"] == 12 * 512 * 512
    for arch in (
        "transformer_iterative_agg",
        "transformer_hier_agg",
        "transformer_mla2",
        "transformer_mla3",
    ):
        assert 14.7e6 <= extra[arch] <= 33.6e6, (arch, extra[arch])
    # the README's figures
    assert round(extra["transformer_iterative_agg"] / 1e6, 2) == 31.49
    assert round(extra["transformer_hier_agg"] / 1e6, 2) == 23.09
    assert round(extra["transformer_mla2"] / 1e6, 2) == 18.39
    assert round(extra["transformer_mla3"] / 1e6, 2) == 28.89


# --------------------------------------------------------------------------- item 8: dropout on F


@pytest.mark.parametrize(
    "arch", ["transformer_iterative_agg", "transformer_hier_agg", "transformer_mla2"]
)
def test_agg_dropout_defaults_to_the_models_dropout_and_zero_is_eq7(arch):
    """Eq. 7 has no dropout on FF's output; --agg-dropout 0 is Eq. 7 as written, the default is the
    model's --dropout."""
    default, _ = build_model(arch, ["--dropout", "0.3"])
    assert {n.dropout_module.p for n in _nodes(default)} == {0.3}
    given, _ = build_model(arch, ["--dropout", "0.3", "--agg-dropout", "0.1"])
    assert {n.dropout_module.p for n in _nodes(given)} == {0.1}
    eq7, _ = build_model(arch, ["--dropout", "0.3", "--agg-dropout", "0"])
    assert {n.dropout_module.p for n in _nodes(eq7)} == {0.0}


def test_agg_dropout_zero_node_is_deterministic_in_training():
    """With --agg-dropout 0 an AGG node in training mode computes LN(FF([x; y]) + x + y) exactly."""
    model, _ = build_model("transformer_iterative_agg", ["--dropout", "0.5", "--agg-dropout", "0"])
    node = _nodes(model)[0].train()
    x, y = torch.randn(3, 16), torch.randn(3, 16)
    expected = node.layer_norm(node.fc2(torch.sigmoid(node.fc1(torch.cat([x, y], -1)))) + x + y)
    torch.testing.assert_close(node([x, y]), expected, rtol=0, atol=0)
    noisy, _ = build_model("transformer_iterative_agg", ["--dropout", "0.5"])
    node = _nodes(noisy)[0].train()
    expected = node.layer_norm(node.fc2(torch.sigmoid(node.fc1(torch.cat([x, y], -1)))) + x + y)
    assert not torch.equal(node([x, y]), expected)
