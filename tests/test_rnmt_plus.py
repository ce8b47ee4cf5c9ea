"""RNMT+ (Chen et al. 2018): the LN-LSTM cell against its equations, padding, incremental == full
(with beam reordering), presets against the parameter counts of Bapna et al. Tables 3-4."""

import pytest
import torch
from fairseq import options, tasks
from helpers import random_batch, tiny_dictionary

from fairseq_deep.models.rnmt_plus.encoder import reorder_encoder_out
from fairseq_deep.modules.recurrent.ln_lstm import LayerNormLSTM


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


SMALL = [
    "--encoder-embed-dim",
    "16",
    "--decoder-embed-dim",
    "16",
    "--encoder-hidden-size",
    "8",
    "--decoder-hidden-size",
    "16",
    "--decoder-layers",
    "3",
    "--dropout",
    "0",
]


def rnmt_args(arch="rnmt_plus", extra=(), small=True):
    parser = options.get_training_parser()
    argv = [
        "dummy-data",
        "--task",
        "translation",
        "--arch",
        arch,
        "--cpu",
        *(SMALL if small else []),
        *extra,
    ]
    return options.parse_args_and_arch(parser, argv)


def build(arch="rnmt_plus", extra=(), seed=1, dictionary=None):
    args = rnmt_args(arch, extra)
    d = dictionary or tiny_dictionary()
    task = tasks.translation.TranslationTask(args, d, d)
    torch.manual_seed(seed)
    return task.build_model(args).eval(), d


# ---------------------------------------------------------------------------------------------
# The cell
# ---------------------------------------------------------------------------------------------


def naive_ln_lstm(layer: LayerNormLSTM, x, direction=0, output_tanh=False, clip=0.0):
    """Per-gate layer-normalized LSTM written out step by step and gate by gate (lingvo's
    LayerNormalizedLSTMCellSimple), one direction, no padding."""
    H = layer.hidden_size
    W = layer.weight_ih[direction * 4 * H : (direction + 1) * 4 * H]  # 4H x I
    U = layer.weight_hh[direction].t()  # 4H x H
    gamma, beta = layer.ln_weight[direction], layer.bias[direction]
    T, B, _ = x.shape
    steps = range(T) if direction == 0 else reversed(range(T))
    out = [None] * T
    h = torch.zeros(B, H)
    c = torch.zeros(B, H)
    for t in steps:
        a = x[t] @ W.t() + h @ U.t()
        g = []
        for k in range(4):
            ak = a[:, k * H : (k + 1) * H]
            mu = ak.mean(-1, keepdim=True)
            var = ((ak - mu) ** 2).mean(-1, keepdim=True)
            g.append(
                (ak - mu) / torch.sqrt(var + layer.eps) * gamma[k * H : (k + 1) * H]
                + beta[k * H : (k + 1) * H]
            )
        i, f, o, j = g
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(j)
        if clip > 0:
            c = c.clamp(-clip, clip)
        h = torch.sigmoid(o) * (torch.tanh(c) if output_tanh else c)
        out[t] = h
    return torch.stack(out), h, c


@pytest.mark.parametrize("output_tanh,clip", [(False, 0.0), (True, 0.0), (False, 0.5)])
def test_ln_lstm_matches_equations(output_tanh, clip):
    torch.manual_seed(0)
    layer = LayerNormLSTM(5, 6, bidirectional=True, output_tanh=output_tanh, cell_clip=clip)
    with torch.no_grad():  # non-trivial gamma and beta
        layer.ln_weight.uniform_(0.5, 1.5)
        layer.bias.uniform_(-0.5, 0.5)
    x = torch.randn(7, 3, 5)
    out, (h, c) = layer(x)
    fw, hf, cf = naive_ln_lstm(layer, x, 0, output_tanh, clip)
    bw, hb, cb = naive_ln_lstm(layer, x, 1, output_tanh, clip)
    torch.testing.assert_close(out, torch.cat([fw, bw], -1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(h, torch.stack([hf, hb]), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(c, torch.stack([cf, cb]), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("left", [True, False])
def test_ln_lstm_padding_is_exact(left):
    """A padded sentence gets the outputs of the same sentence alone, in both directions."""
    torch.manual_seed(0)
    layer = LayerNormLSTM(4, 5, bidirectional=True)
    x = torch.randn(6, 2, 4)
    mask = torch.zeros(6, 2, dtype=torch.bool)
    if left:
        mask[:2, 1] = True
        real = slice(2, 6)
    else:
        mask[4:, 1] = True
        real = slice(0, 4)
    out, _ = layer(x, mask)
    alone, _ = layer(x[real, 1:2])
    torch.testing.assert_close(out[real, 1:2], alone, atol=1e-6, rtol=1e-5)
    assert out[mask].abs().max() == 0
    torch.testing.assert_close(out[:, 0:1], layer(x[:, 0:1])[0], atol=1e-6, rtol=1e-5)


def test_ln_lstm_gradients_reach_every_parameter():
    layer = LayerNormLSTM(4, 5, bidirectional=True)
    x = torch.randn(6, 2, 4, requires_grad=True)
    layer(x)[0].pow(2).sum().backward()
    for name, p in [("x", x), *layer.named_parameters()]:
        assert p.grad is not None and p.grad.abs().sum() > 0, name


@pytest.mark.parametrize("directions", [1, 2])
@pytest.mark.parametrize(
    "clip,output_tanh,padded", [(0.0, False, False), (0.3, True, True), (0.0, False, True)]
)
def test_hand_written_backward_equals_autograd(directions, clip, output_tanh, padded):
    """LNLSTMRecurrence (backward through time by hand) against autograd through the plain loop:
    same outputs, same gradients for every input incl. the initial state, in float64."""
    from fairseq_deep.modules.recurrent.ln_lstm import LNLSTMRecurrence, _ln_lstm_recurrence

    torch.manual_seed(directions)
    T, D, B, H = 6, directions, 3, 5
    kw = dict(dtype=torch.double, requires_grad=True)
    inputs = (
        torch.randn(T, D, B, 4 * H, **kw),
        torch.randn(D, B, H, **kw),
        torch.randn(D, B, H, **kw),
        torch.randn(D, H, 4 * H, **kw),
        (1 + 0.1 * torch.randn(D, 1, 4 * H, dtype=torch.double)).requires_grad_(),
        (0.1 * torch.randn(D, 1, 4 * H, dtype=torch.double)).requires_grad_(),
    )
    pad = (torch.rand(T, D, B, 1) < 0.3) if padded else None
    options = (pad, clip, output_tanh, 1e-6)
    ref = _ln_lstm_recurrence(*inputs, *options)
    ours = LNLSTMRecurrence.apply(*inputs, *options)
    weights = [torch.randn_like(r) for r in ref]
    g_ref = torch.autograd.grad(sum((r * w).sum() for r, w in zip(ref, weights)), inputs)
    g_ours = torch.autograd.grad(sum((r * w).sum() for r, w in zip(ours, weights)), inputs)
    for a, b in zip(ref + g_ref, ours + g_ours):
        torch.testing.assert_close(b, a, atol=1e-12, rtol=1e-10)


def _graph_nodes(fn, seen=None):
    """Names of the autograd nodes reachable from ``fn``."""
    seen = set() if seen is None else seen
    if fn is not None and fn not in seen:
        seen.add(fn)
        for child, _ in fn.next_functions:
            _graph_nodes(child, seen)
    return {type(f).__name__ for f in seen}


def test_training_and_inference_loops_agree():
    """With a gradient the layer runs LNLSTMRecurrence, without one the plain loop: same numbers."""
    layer = LayerNormLSTM(4, 5, bidirectional=True, cell_clip=2.0)
    x = torch.randn(7, 3, 4)
    mask = torch.zeros(7, 3, dtype=torch.bool)
    mask[5:, 1] = True
    with torch.no_grad():
        plain, (h, c) = layer(x, mask)
    trained, (h2, c2) = layer(x, mask)
    assert "LNLSTMRecurrenceBackward" in _graph_nodes(trained.grad_fn)
    for a, b in ((plain, trained), (h, h2), (c, c2)):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-5)


# ---------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------

VARIANTS = [
    ("rnmt_plus", ["--encoder-layers", "3"]),
    ("rnmt_plus_512_ta", []),
    ("rnmt_plus_512_nores_12l", []),
    ("rnmt_plus", ["--encoder-layers", "2", "--share-all-embeddings", "--rnmt-output-tanh"]),
    ("rnmt_plus", ["--encoder-layers", "3", "--dlcl-stacks", "both"]),
]


@pytest.mark.parametrize("arch,extra", VARIANTS)
def test_incremental_equals_full_with_beam_reordering(arch, extra):
    model, d = build(arch, extra)
    src, lengths, prev = random_batch(d, bsz=3, src_len=7, tgt_len=6)
    with torch.no_grad():
        full, extra_full = model(src, lengths, prev)
        enc = model.encoder(src, lengths)
        state = {}
        steps = []
        for t in range(3):
            steps.append(model.decoder(prev[:, : t + 1], enc, incremental_state=state)[0])
        # reorder as beam search does, then go on with the permuted batch
        order = torch.tensor([2, 0, 1])
        model.decoder.reorder_incremental_state_scripting(state, order)
        enc = reorder_encoder_out(enc, order)
        for t in range(3, prev.size(1)):
            steps.append(model.decoder(prev[order, : t + 1], enc, incremental_state=state)[0])
    first = torch.cat(steps[:3], 1)
    rest = torch.cat(steps[3:], 1)
    torch.testing.assert_close(first, full[:, :3], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(rest, full[order, 3:], atol=1e-5, rtol=1e-4)
    assert extra_full["attn"][0].shape == (3, prev.size(1), src.size(1))
    assert len(extra_full["inner_states"]) == model.decoder.num_layers + 1


def test_encoder_out_convention_and_reordering():
    model, d = build(extra=["--encoder-layers", "3"])
    src, lengths, _ = random_batch(d, bsz=3, src_len=7)
    out = model.encoder(src, lengths, return_all_hiddens=True)
    T, B = src.size(1), src.size(0)
    assert out["encoder_out"][0].shape == (T, B, 16)
    assert out["encoder_padding_mask"][0].shape == (B, T)
    assert len(out["encoder_states"]) == 4 and all(
        s.shape[:2] == (T, B) for s in out["encoder_states"]
    )
    order = torch.tensor([1, 2, 0])
    re = model.encoder.reorder_encoder_out(out, order)
    for key, tensors in out.items():
        for a, b in zip(tensors, re[key]):
            dim = 0 if key in ("encoder_padding_mask", "encoder_embedding", "src_lengths") else 1
            assert torch.equal(b, a.index_select(dim, order)), key


@pytest.mark.parametrize("extra", [[], ["--dlcl-stacks", "encoder"]])
def test_padded_source_gives_the_same_translation_scores(extra):
    """Left padding (fairseq's default) does not change a sentence's decoder output."""
    model, d = build(extra=["--encoder-layers", "3", *extra])
    src, lengths, prev = random_batch(d, bsz=3, src_len=7, tgt_len=5)  # last source has 2 pads
    with torch.no_grad():
        batch_out, _ = model(src, lengths, prev)
        alone, _ = model(src[-1:, 2:], lengths[-1:], prev[-1:])
    torch.testing.assert_close(batch_out[-1:], alone, atol=1e-5, rtol=1e-4)


def test_transparent_attention_gradients_reach_every_encoder_layer():
    model, d = build("rnmt_plus_512_ta_12l")
    model.train()
    src, lengths, prev = random_batch(d)
    model(src, lengths, prev)[0].logsumexp(-1).sum().backward()
    enc = model.encoder
    assert enc.transparent_attention.weight.shape == (12, 1)
    assert enc.transparent_attention.weight.grad.abs().sum() > 0
    for layer in enc.layers:
        assert layer.weight_hh.grad.abs().sum() > 0
    assert enc.embed_tokens.weight.grad.abs().sum() > 0


# ---------------------------------------------------------------------------------------------
# Layer combination (DLCL, Wang et al. 2019) on the recurrent stacks: a flag
# ---------------------------------------------------------------------------------------------


def test_dlcl_with_residual_weights_and_no_layer_norm_is_rnmt_plus():
    """--dlcl-stacks both with W = residual (W[l, l-1] = 1) and no layer norm is the plain model."""
    depth = ["--encoder-layers", "4", "--decoder-layers", "4"]
    plain, d = build(extra=depth)
    dlcl, _ = build(
        extra=[*depth, "--dlcl-stacks", "both", "--dlcl-init", "residual", "--dlcl-no-layer-norm"]
    )
    missing, unexpected = dlcl.load_state_dict(plain.state_dict(), strict=False)
    assert not unexpected and all(".history." in k for k in missing) and missing
    src, lengths, prev = random_batch(d, bsz=3, src_len=7, tgt_len=5)
    with torch.no_grad():
        torch.testing.assert_close(
            dlcl(src, lengths, prev)[0], plain(src, lengths, prev)[0], atol=0, rtol=0
        )
    dlcl.train(), plain.train()
    dlcl(src, lengths, prev)[0].sum().backward()  # the training path (autograd weighted sums) too
    plain(src, lengths, prev)[0].sum().backward()
    for (name, a), b in zip(
        plain.named_parameters(), [p for n, p in dlcl.named_parameters() if ".history." not in n]
    ):
        torch.testing.assert_close(
            b.grad, a.grad, atol=1e-6, rtol=1e-5, msg=lambda m, n=name: f"{n}: {m}"
        )


def test_dlcl_weights_learn_in_both_recurrent_stacks():
    model, d = build(extra=["--encoder-layers", "3", "--dlcl-stacks", "both"])
    model.train()
    src, lengths, prev = random_batch(d)
    model(src, lengths, prev)[0].logsumexp(-1).sum().backward()
    for stack, layers in ((model.encoder, 3), (model.decoder, 3)):
        w = stack.history.weight
        assert w.shape == (layers, layers)  # rows: layers 2..L, then the readout; y_1..y_{L}
        lower = torch.ones(layers, layers, dtype=torch.bool).tril()
        assert w.grad[lower].abs().min() > 0 and not w.grad[~lower].any()
    with pytest.raises(ValueError, match="--rnmt-transparent and --dlcl-stacks"):
        build("rnmt_plus_512_ta", ["--dlcl-stacks", "encoder"])


def test_presets_fill_defaults_and_fix_what_their_name_says():
    args = rnmt_args("rnmt_plus", small=False)
    assert (
        args.encoder_hidden_size,
        args.decoder_hidden_size,
        args.encoder_layers,
        args.decoder_layers,
        args.rnmt_attention_heads,
        args.rnmt_encoder_residual_start,
    ) == (1024, 1024, 6, 8, 4, 3)
    args = rnmt_args("rnmt_plus_512_16l", ["--dropout", "0.1"], small=False)
    assert (
        args.encoder_layers,
        args.encoder_hidden_size,
        args.dropout,
        args.attention_dropout,
    ) == (16, 512, 0.1, 0.1)
    assert rnmt_args("rnmt_plus_512_nores", small=False).rnmt_encoder_residual_start == 0
    assert rnmt_args("rnmt_plus_512_ta_20l", small=False).rnmt_transparent
    assert rnmt_args("rnmt_plus_512", ["--encoder-layers", "9"], small=False).encoder_layers == 9
    with pytest.raises(
        ValueError, match="--encoder-layers 12 .*--arch rnmt_plus_512 --encoder-layers 9"
    ):
        rnmt_args("rnmt_plus_512_12l", ["--encoder-layers", "9"], small=False)


@pytest.mark.parametrize(
    "arch,millions",
    [
        ("rnmt_plus_512", 128),
        ("rnmt_plus_512_12l", 165),
        ("rnmt_plus_512_16l", 191),
        ("rnmt_plus_512_20l", 216),
        ("rnmt_plus", 379),
    ],
)
def test_parameter_counts_match_bapna_tables_3_4(arch, millions):
    """With a 32k vocabulary and untied embeddings, our presets have the sizes Bapna et al. report."""
    args = rnmt_args(arch, small=False)
    d = tiny_dictionary(32000 - 4)
    task = tasks.translation.TranslationTask(args, d, d)
    with torch.device("meta"):
        model = task.build_model(args)
    assert abs(sum(p.numel() for p in model.parameters()) / 1e6 - millions) < 1.0
