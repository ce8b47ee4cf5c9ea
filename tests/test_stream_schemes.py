"""Issue 41: the stream-level schemes (DenseFormer, hyper-connections and mHC, ResiDual, the ODE
Transformer's RK blocks) as settings of every Transformer stack.

Identities first: each scheme at its neutral setting is the plain model on the same parameters
(outputs and gradients); then what each promises (DenseFormer's DWA as the authors' accumulators
compute it, mHC's doubly stochastic mixing), incremental decoding under beam search (the ODE
decoder's per-evaluation caches follow the beam), the refused settings in one line, the
layer-weight plots.  Precision, both fairseq stacks, fully sharded wrapping and batch sizes: the
rows of benchmarks/precision_matrix.py; growing: tests/test_grow.py; export: tests/test_export.py;
the authors' package: tests/test_reference_hyper_connections.py.
"""

import pytest
import torch
from fairseq.sequence_generator import SequenceGenerator
from helpers import assert_incremental_equals_full, build_model, random_batch

from fairseq_deep.diagnostics.layer_weights import extract_layer_weights
from fairseq_deep.errors import UserError
from fairseq_deep.modules.schemes.denseformer import DenseFormerHistory
from fairseq_deep.modules.schemes.hyper_connections import HyperConnection, sinkhorn

DEPTH = ["--encoder-layers", "3", "--decoder-layers", "2"]


def scores_and_grads(model, batch):
    model.train()  # dropout is 0 in the tiny models: the training forward, with its gradients
    model.zero_grad()
    out = model(*batch)[0]
    out.log_softmax(-1).sum().backward()
    return out.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


def with_parameters_of(plain_arch, arch, extra, prepare=None):
    """(the plain model, the scheme's model holding the plain one's parameters and its own at
    their initial values, made neutral by ``prepare``)."""
    plain, task = build_model(plain_arch, DEPTH, seed=1)
    model, _ = build_model(arch, [*DEPTH, *extra], seed=2)
    missing, unexpected = model.load_state_dict(plain.state_dict(), strict=False)
    assert not unexpected and missing  # the scheme's own parameters only
    if prepare is not None:
        with torch.no_grad():
            prepare(model)
    return plain, model, random_batch(task.source_dictionary)


def _zero_dual_norm(model):
    for stack in (model.encoder, model.decoder):
        stack.history.dual_norm.weight.zero_()
        stack.history.dual_norm.bias.zero_()


def _euler(model):
    for stack in (model.encoder, model.decoder):
        for layer in stack.layers:
            layer.ode_gamma.copy_(torch.tensor([1.0, 0.0]))


NEUTRAL = [  # (plain arch, arch, flags, made neutral by, exact)
    # DWA weights at their initialisation: 1 on the current layer
    ("transformer_prenorm", "transformer_denseformer", [], None, True),
    (
        "transformer_prenorm",
        "transformer_denseformer",
        ["--denseformer-dilation", "2", "--denseformer-period", "2"],
        None,
        True,
    ),
    ("transformer_postnorm", "transformer_postnorm", ["--denseformer"], None, True),
    # one stream, the residual initialisation (A_m = A_r = B = 1; dynamic: its part 0)
    (
        "transformer_prenorm",
        "transformer_prenorm",
        ["--hyper-connections", "static", "--hc-streams", "1"],
        None,
        True,
    ),
    (
        "transformer_prenorm",
        "transformer_prenorm",
        ["--hyper-connections", "dynamic", "--hc-streams", "1"],
        None,
        True,
    ),
    # the dual stream's output off: LN(d_N) with gain and bias 0
    ("transformer_postnorm", "transformer_resi_dual", [], _zero_dual_norm, True),
    # RK2 with gamma = (1, 0): y + F_1 = layer(y), one Euler step (F_2 runs, weighted 0)
    (
        "transformer_prenorm",
        "transformer_prenorm",
        ["--ode-method", "rk2", "--ode-coefficients", "learned", "--ode-stacks", "both"],
        _euler,
        False,
    ),
]


@pytest.mark.parametrize(
    "plain_arch,arch,extra,prepare,exact",
    NEUTRAL,
    ids=[
        "denseformer",
        "denseformer_2x2",
        "denseformer_postnorm",
        "shc_n1",
        "dhc_n1",
        "resi_dual",
        "ode_rk2_euler",
    ],
)
def test_at_its_neutral_setting_each_scheme_is_the_plain_model(
    plain_arch, arch, extra, prepare, exact
):
    plain, model, batch = with_parameters_of(plain_arch, arch, extra, prepare)
    out_plain, grads_plain = scores_and_grads(plain, batch)
    out, grads = scores_and_grads(model, batch)
    tol = dict(rtol=0, atol=0) if exact else dict(rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out, out_plain, **tol)
    for name, grad in grads_plain.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=1e-5, msg=name)


def test_the_neutral_settings_have_teeth():
    """The same models away from their neutral setting compute something else."""
    for arch, extra, change in [
        ("transformer_denseformer", [], lambda m: m.encoder.history.dwa_weight.add_(0.1)),
        ("transformer_resi_dual", [], lambda m: None),  # LN(d_N) at its initial gain 1
        (
            "transformer_prenorm",
            ["--hyper-connections", "static", "--hc-streams", "1"],
            lambda m: m.encoder.layers[0].hyper_connections[0].static.mul_(0.5),
        ),
    ]:
        plain_arch = (
            "transformer_postnorm" if arch == "transformer_resi_dual" else "transformer_prenorm"
        )
        plain, model, batch = with_parameters_of(plain_arch, arch, extra, change)
        assert not torch.allclose(
            scores_and_grads(model, batch)[0], scores_and_grads(plain, batch)[0]
        )


# -- DenseFormer: the authors' DWA -----------------------------------------------------------------


def authors_dwa(outputs, alphas, dilation, period):
    """The inputs of blocks 2.. and the output, as the authors' ``DWAModules`` forms them: after
    block i (0-based) its output joins accumulator (i+1) mod k; when (i+1) mod p == 0 the next input
    is ``alphas[i]`` (one weight per entry of that accumulator) times its entries."""
    accumulators = [[] for _ in range(dilation)]
    accumulators[0].append(outputs[0])
    inputs = []
    for i, y in enumerate(outputs[1:]):
        group = accumulators[(i + 1) % dilation]
        group.append(y)
        x = y
        if (i + 1) % period == 0:
            x = sum(a * e for a, e in zip(alphas[i], group))
        inputs.append(x)
    return inputs


@pytest.mark.parametrize("dilation,period", [(1, 1), (2, 1), (1, 3), (3, 2)])
@pytest.mark.parametrize("grad", [True, False], ids=["training", "inference"])
def test_denseformer_forms_the_authors_depth_weighted_averages(dilation, period, grad):
    L = 7
    history = DenseFormerHistory(L, 4, dilation, period)
    torch.manual_seed(0)
    with torch.no_grad():
        history.dwa_weight.copy_(torch.randn(L + 1, L + 1))
    outputs = [torch.randn(2, 3, 4) for _ in range(L + 1)]
    w = history.dwa_weight.detach()
    alphas = [w[r, r % dilation : r + 1 : dilation] for r in range(1, L + 1)]
    expected = authors_dwa(outputs, alphas, dilation, period)
    with torch.set_grad_enabled(grad):
        states = history.start(outputs[0])
        got = []
        for y in outputs[1:]:
            states.push(y)
            got.append(states.next_input())
    for r, (a, b) in enumerate(zip(got, expected)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=f"row {r + 1}")


# -- mHC: the residual mixing is doubly stochastic --------------------------------------------------


def test_sinkhorn_gives_doubly_stochastic_matrices():
    torch.manual_seed(0)
    logits = torch.randn(4, 10, 4)  # 10 matrices, 4 x 4, rows and columns at dimensions 0 and -1
    m = sinkhorn(logits, iters=20, rows=0, cols=-1)
    assert (m > 0).all()
    torch.testing.assert_close(m.sum(-1), torch.ones(4, 10), rtol=0, atol=1e-6)  # the last step
    torch.testing.assert_close(m.sum(0), torch.ones(10, 4), rtol=0, atol=1e-5)
    # logits far apart converge slowly (mHC-lite's point): what 20 iterations leave, 200 remove
    wide = 3 * logits
    assert (sinkhorn(wide, 20).sum(0) - 1).abs().max() > 1e-3
    torch.testing.assert_close(sinkhorn(wide, 200).sum(0), torch.ones(10, 4), rtol=0, atol=1e-5)


def test_mhc_mixing_in_a_forward_is_doubly_stochastic():
    model, task = build_model("transformer_mhc", DEPTH)
    seen = []
    original = HyperConnection.coefficients

    def record(self, streams):
        alpha, beta = original(self, streams)
        seen.append((alpha, beta))
        return alpha, beta

    HyperConnection.coefficients = record
    try:
        with torch.no_grad():
            for layer in model.encoder.layers:
                for p in layer.hyper_connections.parameters():
                    p.add_(torch.randn_like(p))  # away from the initialisation
            model(*random_batch(task.source_dictionary))
    finally:
        HyperConnection.coefficients = original
    assert len(seen) == 3 * 2 + 2 * 3  # every sublayer of both stacks
    for alpha, beta in seen:
        res = alpha[..., 1:]  # n x T x B x n: [source stream, ..., new stream]
        assert (res >= 0).all() and (alpha[..., 0] > 0).all() and (alpha[..., 0] < 1).all()
        assert ((beta > 0) & (beta < 2)).all()
        torch.testing.assert_close(res.sum(-1), torch.ones_like(res[..., 0]), atol=1e-5, rtol=0)
        torch.testing.assert_close(res.sum(0), torch.ones_like(res[0]), atol=1e-3, rtol=0)


# -- incremental decoding ------------------------------------------------------------------------

DECODING = [
    # under transparent attention: it reads each layer's hidden state (the streams' sum; ResiDual's
    # post-LN stream)
    ("transformer_ta_prenorm", ["--hyper-connections", "mhc"]),
    ("transformer_ta", ["--resi-dual"]),
    ("transformer_denseformer", ["--denseformer-dilation", "2", "--denseformer-period", "2"]),
    ("transformer_hc", []),
    ("transformer_mhc", []),
    ("transformer_prenorm", ["--hyper-connections", "static"]),
    ("transformer_resi_dual", []),
    ("transformer_ode_rk2", ["--ode-stacks", "both"]),
    ("transformer_ode_rk4", ["--ode-stacks", "decoder"]),
    (
        "transformer_prenorm",
        ["--ode-method", "rk2", "--ode-coefficients", "learned", "--ode-stacks", "both"],
    ),
]


@pytest.mark.parametrize("arch,extra", DECODING)
def test_incremental_decoding_equals_full(arch, extra):
    model, task = build_model(arch, [*DEPTH, *extra])
    assert_incremental_equals_full(model, task.source_dictionary)


@pytest.mark.parametrize(
    "arch,extra",
    [
        ("transformer_ode_rk2", ["--ode-stacks", "both"]),
        ("transformer_ode_rk4", ["--ode-stacks", "decoder"]),
        ("transformer_mhc", []),
    ],
)
def test_beam_search_scores_equal_the_full_forward_of_each_hypothesis(arch, extra):
    """fairseq's beam search reorders the decoder's cached state at every step; an RK block's
    evaluations 2.. keep caches of their own, which must follow (else the scores of the
    hypotheses would be computed from other beams' histories)."""
    model, task = build_model(arch, [*DEPTH, *extra])
    d = task.source_dictionary
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))  # a model whose beams differ
    src, lengths, _ = random_batch(d, bsz=3, src_len=6)
    sample = {"net_input": {"src_tokens": src, "src_lengths": lengths}}
    generator = SequenceGenerator([model], d, beam_size=4, max_len_a=0, max_len_b=7)
    with torch.no_grad():
        hypos = generator.generate([model], sample)
        for i, beams in enumerate(hypos):
            for hypo in beams:
                tokens = hypo["tokens"]
                prev = torch.cat([tokens.new_tensor([d.eos()]), tokens[:-1]])[None]
                out = model(src[i : i + 1], lengths[i : i + 1], prev)
                lp = model.get_normalized_probs(out, log_probs=True)[0]
                full = lp.gather(-1, tokens[:, None])[:, 0]
                torch.testing.assert_close(hypo["positional_scores"], full, rtol=1e-4, atol=1e-4)


# -- settings that make no sense stop in one line ----------------------------------------------------


@pytest.mark.parametrize(
    "arch,extra,words",
    [
        ("transformer_denseformer", ["--resi-dual"], "each redefine the residual stream"),
        ("transformer_postnorm", ["--hyper-connections", "dynamic"], "takes pre-norm layers"),
        ("transformer_prenorm", ["--resi-dual"], "takes post-norm layers"),
        ("transformer_postnorm", ["--ode-method", "rk2"], "takes pre-norm layers"),
        (
            "transformer_dlcl",
            ["--denseformer"],
            "replaces the encoder's layer history, which is already DLCL",
        ),
        (
            "transformer_dense",
            [
                "--encoder-normalize-before",
                "--decoder-normalize-before",
                "--hyper-connections",
                "static",
            ],
            "dense connections",
        ),
        (
            "transformer_mla3",
            ["--encoder-normalize-before", "--decoder-normalize-before", "--ode-method", "rk2"],
            "rewires the sublayers",
        ),
        (
            "transformer_deepnorm",
            ["--resi-dual"],
            "--deepnorm each replace the residual connection",
        ),
        ("transformer_ode_rk4", ["--ode-coefficients", "gated"], "combines two evaluations"),
        (
            "transformer_denseformer",
            ["--denseformer-period", "0"],
            "--denseformer-period must be at least 1",
        ),
        ("transformer_hc", ["--hc-streams", "0"], "--hc-streams must be at least 1"),
        ("transformer_denseformer", ["--encoder-layerdrop", "0.1"], "--encoder-layerdrop"),
    ],
)
def test_settings_that_make_no_sense_stop_with_one_line(arch, extra, words):
    with pytest.raises((UserError, ValueError)) as e:
        build_model(arch, [*DEPTH, *extra])
    assert words in str(e.value) and "\n" not in str(e.value), str(e.value)


# -- the layer-weight plots -------------------------------------------------------------------------


def test_layer_weight_kinds_read_dwa_and_hyper_connection_matrices():
    args = ["--denseformer-dilation", "2", "--denseformer-period", "2"]
    model, _ = build_model("transformer_denseformer", [*DEPTH, *args])
    from helpers import parse_model_args

    records = extract_layer_weights(
        model.state_dict(), parse_model_args("transformer_denseformer", [*DEPTH, *args])
    )
    assert [r["key"] for r in records] == [
        "encoder.history.dwa_weight",
        "decoder.history.dwa_weight",
    ]
    enc = records[0]
    assert enc["kind"] == "denseformer"
    torch.testing.assert_close(enc["matrix"], model.encoder.history.weights().detach())
    # row 1 (after block 1): no DWA with period 2, the identity; row 2 reads y0 and y2 (dilation 2)
    assert enc["valid"][1].tolist() == [False, True, False, False]
    assert enc["valid"][2].tolist() == [True, False, True, False]

    for kind in ("static", "mhc"):
        flags = [*DEPTH, "--hyper-connections", kind]
        model, _ = build_model("transformer_prenorm", flags)
        records = extract_layer_weights(
            model.state_dict(), parse_model_args("transformer_prenorm", flags)
        )
        assert len(records) == 3 * 2 + 2 * 3 and {r["kind"] for r in records} == {
            "hyper_connections"
        }
        first = records[0]
        assert first["key"] == "encoder.layers.0.hyper_connections.0.static"
        m, valid = first["matrix"], first["valid"]
        assert m.shape == (5, 5) and not valid[0, 0]
        if (
            kind == "static"
        ):  # the initialisation: A_m = e_0 (row 0: h0 reads stream 1), A_r = I, B = 1
            assert m[0].tolist() == [0, 1, 0, 0, 0]
            assert m[1:, 0].tolist() == [1, 1, 1, 1]
            assert torch.equal(m[1:, 1:], torch.eye(4))
        else:  # mhc: the constrained matrices, H_res doubly stochastic
            torch.testing.assert_close(m[1:, 1:].sum(0), torch.ones(4), rtol=0, atol=1e-6)
            torch.testing.assert_close(m[1:, 1:].sum(1), torch.ones(4), rtol=0, atol=1e-3)


# -- each layer against its paper's equations, written out -----------------------------------------


def test_resi_dual_layers_are_the_authors_forward():
    """microsoft/ResiDual's layer, per sublayer f: res = res + f(x) (after dropout), x = LN(x +
    f(x)); here with fairseq's modules of our layer, encoder and decoder."""
    model, task = build_model("transformer_resi_dual", DEPTH)
    src, lengths, prev = random_batch(task.source_dictionary)
    pad = src.eq(task.source_dictionary.pad())
    torch.manual_seed(0)
    T, B, C = src.size(1), src.size(0), model.encoder.layers[0].embed_dim
    x, d = torch.randn(T, B, C), torch.randn(T, B, C)
    enc = model.encoder.layers[0]
    with torch.no_grad():
        out = enc(torch.stack([x, d]), encoder_padding_mask=pad)
        f = enc.self_attn(query=x, key=x, value=x, key_padding_mask=pad, need_weights=False)[0]
        d1, x1 = d + f, enc.self_attn_layer_norm(x + f)
        f = enc.fc2(enc.activation_fn(enc.fc1(x1)))
        d2, x2 = d1 + f, enc.final_layer_norm(x1 + f)
    torch.testing.assert_close(out, torch.stack([x2, d2]), rtol=1e-5, atol=1e-6)

    dec = model.decoder.layers[1]
    memory = torch.randn(T, B, C)
    t = prev.size(1)
    y, e = torch.randn(t, B, C), torch.randn(t, B, C)
    mask = model.decoder.buffered_future_mask(y)
    with torch.no_grad():
        out, _, _ = dec(torch.stack([y, e]), memory, pad, None, self_attn_mask=mask)
        f = dec.self_attn(query=y, key=y, value=y, attn_mask=mask, need_weights=False)[0]
        e, y = e + f, dec.self_attn_layer_norm(y + f)
        f = dec.encoder_attn(
            query=y, key=memory, value=memory, key_padding_mask=pad, static_kv=True
        )[0]
        e, y = e + f, dec.encoder_attn_layer_norm(y + f)
        f = dec.fc2(dec.activation_fn(dec.fc1(y)))
        e, y = e + f, dec.final_layer_norm(y + f)
    torch.testing.assert_close(out, torch.stack([y, e]), rtol=1e-5, atol=1e-6)
    # the readout: x_N + LN(d_N)
    history = model.encoder.history
    torch.testing.assert_close(history.start(x).readout(), x + history.dual_norm(x), rtol=0, atol=0)


@pytest.mark.parametrize("method", ["rk4", "rk2"])
def test_an_rk_block_is_the_runge_kutta_step_of_the_plain_layer(method):
    coefficients = "fixed" if method == "rk4" else "gated"
    flags = [*DEPTH, "--ode-method", method, "--ode-coefficients", coefficients]
    model, task = build_model("transformer_prenorm", flags)
    layer = model.encoder.layers[1]
    src, _, _ = random_batch(task.source_dictionary)
    pad = src.eq(task.source_dictionary.pad())
    y = torch.randn(src.size(1), src.size(0), layer.embed_dim)

    def F(v):  # fairseq's own layer, less its identity
        return type(layer).scheme_base.forward(layer, v, pad) - v

    with torch.no_grad():
        out = layer(y, pad)
        f1 = F(y)
        if method == "rk4":
            f2 = F(y + f1 / 2)
            f3 = F(y + f2 / 2)
            f4 = F(y + f3)
            expected = y + (f1 + 2 * f2 + 2 * f3 + f4) / 6
        else:
            f2 = F(y + f1)
            g = torch.sigmoid(layer.ode_gate(torch.cat([f1, f2], -1)))
            expected = y + g * f1 + (1 - g) * f2
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
