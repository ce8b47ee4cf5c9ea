"""transformer_agg (Dou et al. 2018): special settings that are fairseq's Transformer, the AGG
equation, the wiring of the hierarchical tree, incremental == full decoding for every decoder
variant, beam search with multi-layer attention caches, initialisation from a baseline, CLI."""

import os

import pytest
import torch
import torch.nn.functional as F
from helpers import PLUGIN_DIR, build_model, dtype_marker, parse_model_args, random_batch, run_cli
from torch import nn

from fairseq_deep.checkpoint_init import load_matching
from fairseq_deep.modules.common.better_transformer import without_better_transformer_keys
from fairseq_deep.modules.histories.layer_aggregation import (
    AggregationNode,
    DenseHistory,
    HierarchicalAggregationHistory,
    IterativeAggregationHistory,
    LinearCombinationHistory,
    TreeNode,
    hierarchical_plan,
)

PRENORM = ["--encoder-normalize-before", "--decoder-normalize-before"]
LAYERS = ["--encoder-layers", "3", "--decoder-layers", "3"]


def _outputs(model, dictionary, **batch_kw):
    src, lengths, prev = random_batch(dictionary, **batch_kw)
    with torch.no_grad():
        return model(src, lengths, prev)[0]


def _load_baseline(model, ref):
    report = load_matching(model, ref.state_dict())
    assert not report.unused, report.unused
    return report


# --------------------------------------------------------------------------- identities


@pytest.mark.parametrize(
    "arch,norm,flags",
    [
        ("transformer_agg_baseline", [], []),
        ("transformer_agg_baseline", PRENORM, []),
        ("transformer_mla3", [], ["--mla-layers", "1"]),  # k = 1: attention over layer l-1 only
        ("transformer_hier_agg", PRENORM, ["--agg-encoder", "none", "--agg-decoder", "none"]),
        ("transformer_linear_agg", [], []),  # W_L = I, others 0: the model it is initialised from
        ("transformer_linear_agg", PRENORM, []),
    ],
)
def test_special_settings_are_fairseq_transformer(arch, norm, flags):
    ref, task = build_model("transformer", [*LAYERS, *norm], seed=1)
    ours, _ = build_model(arch, [*LAYERS, *norm, *flags], seed=2)
    report = _load_baseline(ours, ref)
    assert all(".history.weights." in k for k in report.fresh), report.fresh
    d = task.source_dictionary
    torch.testing.assert_close(_outputs(ours, d), _outputs(ref, d), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "arch",
    ["transformer_dense", "transformer_iterative_agg", "transformer_hier_agg", "transformer_mla2"],
)
def test_techniques_change_the_output(arch):
    """Guards the identities above: each technique computes something else."""
    ref, task = build_model("transformer", LAYERS, seed=1)
    ours, _ = build_model(arch, LAYERS, seed=2)
    _load_baseline(ours, ref)
    d = task.source_dictionary
    assert not torch.allclose(_outputs(ours, d), _outputs(ref, d), atol=1e-3)


# --------------------------------------------------------------------------- AGG and histories


def _ln(x, node):
    return F.layer_norm(x, x.shape[-1:], node.layer_norm.weight, node.layer_norm.bias, 1e-5)


@pytest.mark.parametrize(
    "n,act,residual,top",
    [
        (2, "ff_sigmoid", "all", 0),
        (3, "ff_sigmoid", "all", 1),
        (2, "ff_relu", "all", 0),
        (3, "ff_sigmoid", "top", 1),
        (2, "ff_sigmoid", "none", 0),
    ],
)
def test_agg_node_is_equation_7(n, act, residual, top):
    """AGG(x, y[, z]) = LN(FF([x; y; z]) + x + y + z), FF = W2 act(W1 . + b1) + b2 (Eq. 7)."""
    torch.manual_seed(0)
    node = AggregationNode(n, 8, hidden_dim=12, function=act, residual=residual, top=top).eval()
    with torch.no_grad():
        node.layer_norm.weight.uniform_(0.5, 1.5), node.layer_norm.bias.uniform_(-0.5, 0.5)
    xs = [torch.randn(5, 2, 8) for _ in range(n)]
    z = torch.cat(xs, -1)
    h = z @ node.fc1.weight.t() + node.fc1.bias
    h = torch.sigmoid(h) if act == "ff_sigmoid" else h.clamp(min=0)
    h = h @ node.fc2.weight.t() + node.fc2.bias
    res = {"all": sum(xs), "top": xs[top], "none": 0}[residual]
    torch.testing.assert_close(node(xs), _ln(h + res, node))


def test_self_attention_node_is_position_wise():
    torch.manual_seed(0)
    node = AggregationNode(3, 8, function="self_attn", num_heads=2).eval()
    xs = [torch.randn(5, 2, 8) for _ in range(3)]
    out = node(xs)
    xs2 = [x.clone() for x in xs]
    xs2[1][0, 0] += 1.0  # another position of another input
    out2 = node(xs2)
    assert out.shape == (5, 2, 8)
    assert not torch.allclose(out[0, 0], out2[0, 0])
    torch.testing.assert_close(out[1:], out2[1:])
    torch.testing.assert_close(out[0, 1], out2[0, 1])


def _drive(history, ys, emb):
    """Run a history over given layer outputs; returns (inputs of layers 1..L, readout)."""
    state = history.start(emb)
    inputs = []
    for y in ys:
        inputs.append(state.next_input())
        state.push(y)
    return inputs, state.readout()


def test_dense_connection_is_equation_4():
    torch.manual_seed(0)
    emb, ys = torch.randn(4, 8), [torch.randn(4, 8) for _ in range(5)]
    inputs, out = _drive(DenseHistory(5, "outputs"), ys, emb)
    assert inputs[0] is emb
    for l in range(1, 5):  # layer l+1 reads y_1 + ... + y_l
        torch.testing.assert_close(inputs[l], sum(ys[:l]))
    torch.testing.assert_close(out, sum(ys))
    # literal recursion H^l = y_l + sum_{i<l} H^i
    inputs, out = _drive(DenseHistory(5, "states"), ys, emb)
    H = []
    for y in ys:
        H.append(y + sum(H) if H else y)
    for l in range(1, 5):
        torch.testing.assert_close(inputs[l], H[l - 1])
    torch.testing.assert_close(out, H[-1])


def test_linear_combination_is_equation_5():
    torch.manual_seed(0)
    hist = LinearCombinationHistory(4, 8, init="avg")
    for w in hist.weights:
        nn.init.normal_(w.weight)
    emb, ys = torch.randn(3, 8), [torch.randn(3, 8) for _ in range(4)]
    inputs, out = _drive(hist, ys, emb)
    assert inputs[0] is emb and all(
        inputs[l] is ys[l - 1] for l in range(1, 4)
    )  # residual backbone
    torch.testing.assert_close(out, sum(y @ w.weight.t() for y, w in zip(ys, hist.weights)))


class _Tag(nn.Module):
    """A node that records its inputs' tags and outputs tag 100 + its index."""

    def __init__(self, idx, n, top, log):
        super().__init__()
        self.idx, self.n, self.top, self.log = idx, n, top, log

    def forward(self, inputs):
        self.log.append((self.idx, [int(x[0]) for x in inputs]))
        return torch.full_like(inputs[0], 100.0 + self.idx)


def _tagged(history_cls, L):
    log, count = [], iter(range(1, 100))
    hist = history_cls(L, lambda n, top: _Tag(next(count), n, top, log))
    ys = [torch.full((2,), float(l)) for l in range(1, L + 1)]
    inputs, out = _drive(hist, ys, torch.zeros(2))
    return hist, log, [int(x[0]) for x in inputs], int(out[0])


def test_iterative_aggregation_chain():
    """A^1 = H^1, A^l = AGG(H^l, A^{l-1}) (Eq. 6); the backbone is untouched."""
    _, log, inputs, out = _tagged(IterativeAggregationHistory, 4)
    assert log == [(1, [2, 1]), (2, [3, 101]), (3, [4, 102])]
    assert inputs == [0, 1, 2, 3] and out == 103


@pytest.mark.parametrize(
    "L,nodes,inputs,out",
    [
        # 6 layers: A1 = AGG(H1, H2), A2 = AGG(H3, H4, A1), A3 = AGG(H5, H6, A2); A1 -> layer 3, A2 -> layer 5
        (6, [(1, [1, 2]), (2, [3, 4, 101]), (3, [5, 6, 102])], [0, 1, 101, 3, 102, 5], 103),
        # 7 layers: the odd layer 7 forms the last sub-tree alone: A4 = AGG(H7, A3), A3 -> layer 7
        (
            7,
            [(1, [1, 2]), (2, [3, 4, 101]), (3, [5, 6, 102]), (4, [7, 103])],
            [0, 1, 101, 3, 102, 5, 103],
            104,
        ),
        (2, [(1, [1, 2])], [0, 1], 101),
        (1, [], [0], 1),
    ],
)
def test_hierarchical_tree_wiring(L, nodes, inputs, out):
    hist, log, got_inputs, got_out = _tagged(HierarchicalAggregationHistory, L)
    assert log == nodes
    assert got_inputs == inputs and got_out == out
    # three inputs exactly where the paper has AGG(H^{2i-1}, H^{2i}, A^{i-1}); top = the deepest layer
    assert [(m.n, m.top) for m in hist.nodes] == [
        (len(x), len(x) - 2 if x[-1] > 100 else len(x) - 1) for _, x in nodes
    ]


def test_hierarchical_plan_for_six_and_seven_layers():
    assert hierarchical_plan(6) == [
        TreeNode((1, 2), False, 3),
        TreeNode((3, 4), True, 5),
        TreeNode((5, 6), True, None),
    ]
    assert hierarchical_plan(7)[-1] == TreeNode((7,), True, None)
    for L in range(2, 13):  # every layer is in exactly one node, the last node is the output
        plan = hierarchical_plan(L)
        assert [l for n in plan for l in n.layers] == list(range(1, L + 1))
        assert plan[-1].feeds_layer is None and all(n.feeds_layer for n in plan[:-1])


# --------------------------------------------------------------------------- incremental decoding


def _perturb(model, seed=0):
    """Move the new parameters away from their initial values (so that, e.g., an LN is not identity)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".history." in name or "lower_attention" in name:
                p.add_(0.3 * torch.randn(p.shape, generator=g))


DECODER_VARIANTS = [
    ["--agg-decoder", "dense"],
    ["--agg-decoder", "dense", "--agg-dense-sum", "states"],
    ["--agg-decoder", "linear", "--agg-linear-init", "avg"],
    ["--agg-decoder", "iterative"],
    ["--agg-decoder", "iterative", "--agg-function", "self_attn", "--agg-residual", "top"],
    ["--agg-decoder", "hierarchical"],  # 3 layers: an odd count
    [
        "--agg-decoder",
        "hierarchical",
        "--decoder-layers",
        "4",
        "--agg-function",
        "ff_relu",
        "--agg-residual",
        "none",
    ],
    ["--agg-decoder", "hierarchical", *PRENORM],
    ["--mla-layers", "2"],
    ["--mla-layers", "3", "--mla-stacks", "decoder", "--agg-function", "self_attn"],
    ["--mla-layers", "3", "--agg-decoder", "hierarchical", "--agg-encoder", "iterative", *PRENORM],
]


@pytest.mark.parametrize("flags", DECODER_VARIANTS, ids=lambda f: " ".join(f))
def test_incremental_decoding_equals_full_pass(flags):
    model, task = build_model("transformer_agg", [*LAYERS, *flags])
    _perturb(model)
    src, lengths, prev = random_batch(task.source_dictionary, tgt_len=6)
    with torch.no_grad():
        enc = model.encoder(src, lengths)
        full, _ = model.decoder(prev, encoder_out=enc)
        state = {}
        steps = [
            model.decoder(prev[:, : t + 1], encoder_out=enc, incremental_state=state)[0]
            for t in range(prev.size(1))
        ]
    assert all(s.size(1) == 1 for s in steps)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=1e-5)


def test_mla_caches_keys_and_values_per_lower_layer():
    model, task = build_model(
        "transformer_mla3", ["--decoder-layers", "3", "--encoder-layers", "1"]
    )
    src, lengths, prev = random_batch(task.source_dictionary, tgt_len=4)
    with torch.no_grad():
        enc = model.encoder(src, lengths)
        state = {}
        for t in range(4):
            model.decoder(prev[:, : t + 1], encoder_out=enc, incremental_state=state)
    attns = [
        a
        for layer in model.decoder.layers
        if hasattr(layer, "lower_attention")
        for a in layer.lower_attention.attns
    ]
    assert len(attns) == 1 + 2  # layer 2 attends to 1 extra layer (the embedding), layer 3 to 2
    for a in attns:
        buf = a._get_input_buffer(state)
        assert buf["prev_key"].shape[2] == 4  # bsz x heads x 4 positions x head_dim


def test_beam_search_scores_equal_full_pass():
    """Beam search reorders every cache (the extra attentions' too): its positional scores are the
    full forward pass's log-probabilities of the hypotheses it returns."""
    from fairseq.sequence_generator import SequenceGenerator

    model, task = build_model("transformer_mla3", [*LAYERS, "--agg-decoder", "hierarchical"])
    _perturb(model)
    d = task.target_dictionary
    src, lengths, _ = random_batch(task.source_dictionary, bsz=2)
    gen = SequenceGenerator([model], d, beam_size=3, max_len_b=6, normalize_scores=False)
    with torch.no_grad():
        hyps = gen.forward({"net_input": {"src_tokens": src, "src_lengths": lengths}})
        for i, beam in enumerate(hyps):
            for h in beam:
                tokens = h["tokens"].unsqueeze(0)
                prev = torch.cat([tokens.new_full((1, 1), d.eos()), tokens[:, :-1]], dim=1)
                out = model(src[i : i + 1], lengths[i : i + 1], prev)
                lp = model.get_normalized_probs(out, log_probs=True)[0]
                full = lp.gather(-1, tokens[0].unsqueeze(-1)).squeeze(-1)
                torch.testing.assert_close(h["positional_scores"], full, rtol=1e-4, atol=1e-4)


# --------------------------------------------------------------------------- training signals


def test_gradients_reach_every_new_parameter_and_the_embeddings():
    model, task = build_model(
        "transformer_hier_agg",
        [
            "--encoder-layers",
            "5",
            "--decoder-layers",
            "4",
            "--mla-layers",
            "2",
            "--agg-decoder",
            "linear",
        ],
    )
    model.train()
    src, lengths, prev = random_batch(task.source_dictionary)
    out, _ = model(src, lengths, prev)
    out.log_softmax(-1).mean().backward()
    emb = model.encoder.embed_tokens.weight.grad
    assert emb is not None and emb.abs().sum() > 0
    for name, p in model.named_parameters():
        if ".history." in name or "lower_attention" in name:
            assert p.grad is not None and torch.isfinite(p.grad).all(), name
            assert p.grad.abs().sum() > 0, name


def test_parameters_of_the_presets():
    """Rows 2-7 of Table 1 add what the paper says: nothing (dense), L matrices (linear), L-1
    two-input nodes (iterative), L/2 nodes (hierarchical), 1 or 2 attentions per layer (MLA)."""

    def count(arch):
        # AGG width d (--agg-ffn-dim 0, the default before issue 15); the default width (the
        # stack's FFN width) is counted in test_audit_aggregation.py
        m, _ = build_model(
            arch, ["--encoder-layers", "6", "--decoder-layers", "6", "--agg-ffn-dim", "0"]
        )
        return sum(p.numel() for p in m.parameters())

    base = count("transformer_agg_baseline")
    d, h = 16, 16  # TINY embed dim; AGG hidden = d with --agg-ffn-dim 0
    node = lambda n: n * d * h + h + h * d + d + 2 * d  # noqa: E731
    attn = 4 * (d * d + d)
    assert count("transformer_dense") == base
    assert count("transformer_linear_agg") == base + 2 * 6 * d * d
    assert count("transformer_iterative_agg") == base + 2 * 5 * node(2)
    assert count("transformer_hier_agg") == base + 2 * (node(2) + 2 * node(3))
    assert count("transformer_mla2") == base + 2 * 5 * (attn + node(2))
    assert count("transformer_mla3") == base + 2 * ((attn + node(2)) + 4 * (2 * attn + node(3)))


# --------------------------------------------------------------------------- options and presets


def test_presets_fill_defaults_only():
    a = parse_model_args("transformer_hier_agg")
    assert (a.agg_encoder, a.agg_decoder, a.mla_layers, a.agg_function) == (
        "hierarchical",
        "hierarchical",
        1,
        "ff_sigmoid",
    )
    assert not a.encoder_normalize_before  # the paper's post-norm Transformer
    b = parse_model_args("transformer_hier_agg", ["--agg-decoder", "none", "--agg-residual", "top"])
    assert (b.agg_encoder, b.agg_decoder, b.agg_residual) == ("hierarchical", "none", "top")
    assert parse_model_args("transformer_mla3").mla_layers == 3
    from fairseq import options

    parser = options.get_training_parser()
    big = options.parse_args_and_arch(
        parser, ["x", "--task", "translation", "--arch", "transformer_hier_agg_big"]
    )
    assert (big.encoder_embed_dim, big.encoder_ffn_embed_dim, big.encoder_attention_heads) == (
        1024,
        4096,
        16,
    )
    assert big.agg_encoder == "hierarchical"


def test_bad_options_name_the_option(capsys):
    with pytest.raises(SystemExit):
        parse_model_args("transformer_agg", ["--agg-encoder", "tree"])
    assert "--agg-encoder" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--mla-layers"):
        build_model("transformer_agg", ["--mla-layers", "0"])


def test_init_from_baseline_loads_matching_and_reports_fresh():
    ref, _ = build_model("transformer", LAYERS, seed=1)
    ours, _ = build_model(
        "transformer_hier_agg", [*LAYERS, "--mla-layers", "2", "--init-from-pretrained"], seed=2
    )
    state = ref.state_dict()
    ours.load_state_dict(dict(state), strict=True)  # fairseq's call, accepted thanks to the option
    report = ours.init_report
    # on fairseq 0.12.2 the baseline also holds its layers' fused copies: neither loaded nor unused
    weights = without_better_transformer_keys(state)
    assert not report.unused and set(report.loaded) == set(weights)
    assert report.fresh and all(".history." in k or "lower_attention" in k for k in report.fresh)
    for k, v in weights.items():
        assert dtype_marker(k) or torch.equal(ours.state_dict()[k], v), k
    assert "lower_attention" in report.summary() and "*" in report.summary()
    with pytest.raises(RuntimeError):  # without the option a baseline is refused, as fairseq does
        build_model("transformer_hier_agg", LAYERS)[0].load_state_dict(dict(state), strict=True)
    wide, _ = build_model(
        "transformer", [*LAYERS, "--encoder-embed-dim", "32", "--decoder-embed-dim", "32"]
    )
    with pytest.raises(ValueError, match="--init-from-pretrained.*other shapes"):
        ours.load_state_dict(wide.state_dict())


# --------------------------------------------------------------------------- command line


def _train(data, save_dir, arch, *extra):
    return run_cli(
        "fairseq-train",
        str(data),
        "--user-dir",
        PLUGIN_DIR,
        "--task",
        "translation",
        "--arch",
        arch,
        "--encoder-layers",
        "2",
        "--decoder-layers",
        "3",
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
        "--optimizer",
        "adam",
        "--lr",
        "1e-3",
        "--max-tokens",
        "500",
        "--max-update",
        "2",
        "--no-epoch-checkpoints",
        "--save-dir",
        str(save_dir),
        "--cpu",
        "--num-workers",
        "0",
        "--log-format",
        "simple",
        "--log-interval",
        "1",
        "--seed",
        "1",
        *extra,
    )


def test_cli_baseline_then_aggregation_with_diversity_then_generate(synthetic_bin, tmp_path):
    """The paper's procedure: train a Transformer, initialise the proposed model from it, train
    with the diversity regularizer, translate with beam search."""
    _train(
        synthetic_bin,
        tmp_path / "base",
        "transformer",
        "--criterion",
        "label_smoothed_cross_entropy",
        "--disable-validation",
    )
    base = tmp_path / "base" / "checkpoint_last.pt"
    proc = _train(
        synthetic_bin,
        tmp_path / "agg",
        "transformer_hier_agg",
        "--mla-layers",
        "2",
        "--criterion",
        "label_smoothed_cross_entropy_with_diversity",
        "--label-smoothing",
        "0.1",
        "--finetune-from-model",
        str(base),
        "--init-from-pretrained",
    )
    log = proc.stdout + proc.stderr
    assert "start fresh" in log and "history.nodes" in log and "lower_attention" in log
    assert "diversity" in log
    gen = run_cli(
        "fairseq-generate",
        str(synthetic_bin),
        "--user-dir",
        PLUGIN_DIR,
        "--path",
        str(tmp_path / "agg" / "checkpoint_last.pt"),
        "--beam",
        "2",
        "--max-tokens",
        "500",
        "--max-len-a",
        "1.2",
        "--max-len-b",
        "5",  # an untrained model would go to 200 tokens
        "--cpu",
        "--gen-subset",
        "test",
    )
    hyps = [line for line in gen.stdout.splitlines() if line.startswith("H-")]
    assert len(hyps) == 101
    assert os.path.exists(tmp_path / "agg" / "checkpoint_best.pt")
