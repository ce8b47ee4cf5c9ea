"""The fused Triton LN-LSTM loop (``--rnmt-lstm-impl triton``, issue 16) against the TorchScript loop.

On a CPU the kernels run in Triton's interpreter, which Triton switches on only when
``TRITON_INTERPRET=1`` is set before it is imported (its own library, ``tl.sum`` and the rest, is
jitted at import).  So the interpreter checks (``@interpreted``) run in a subprocess,
``python -m pytest tests/test_ln_lstm_triton.py -m "not gpu"`` with ``TRITON_INTERPRET=1``, started by
``test_interpreter_checks_in_a_subprocess``; this process never sets the variable, and its ``gpu``
tests compile for CUDA.  Run them directly with
``TRITON_INTERPRET=1 python -m pytest tests/test_ln_lstm_triton.py``.  Tiny sizes: the interpreter
runs every program in Python.

On a GPU: ``python -m pytest -m gpu tests/test_ln_lstm_triton.py`` (H = 512 and 1024, fp32 and autocast).
"""

import pytest
import torch
from helpers import (
    assert_same_scores_and_grads,
    interpreted,
    needs_triton,
    not_interpreted,
    random_batch,
    run_interpreted_tests,
    tiny_dictionary,
)

from fairseq_deep.modules.recurrent.ln_lstm import (
    LayerNormLSTM,
    LNLSTMRecurrence,
    _ln_lstm_recurrence,
)


@needs_triton
@not_interpreted
def test_interpreter_checks_in_a_subprocess():
    """Every @interpreted test of this file, in a pytest subprocess with TRITON_INTERPRET=1."""
    run_interpreted_tests(__file__)


def _inputs(T, D, B, H, dtype, device="cpu", seed=0):
    """xw, h0, c0, U, gamma, beta of the recurrence, leaves that want a gradient; non-trivial
    gamma and beta, and gates large enough that a clip of 0.3 binds."""
    g = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=1.0, shift=0.0):
        t = torch.randn(*shape, generator=g, dtype=torch.float64) * scale + shift
        return t.to(dtype=dtype, device=device).requires_grad_()

    return (
        rand(T, D, B, 4 * H),
        rand(D, B, H),
        rand(D, B, H),
        rand(D, H, 4 * H, scale=H**-0.5),
        rand(D, 1, 4 * H, scale=0.3, shift=1.0),
        rand(D, 1, 4 * H, scale=0.3),
    )


def _pad(T, D, B, seed=0):
    """T x D x B x 1 padding (True = padded) with padded and unpadded rows in every step."""
    g = torch.Generator().manual_seed(seed + 1)
    pad = torch.rand(T, D, B, 1, generator=g) < 0.35
    pad[:, :, 0] = False
    return pad


def _check_against_loop(inputs, pad, cell_clip, output_tanh, atol, rtol):
    """Outputs, final states and the gradients of every input: the fused Function against the
    loop's hand-written backward (itself tested against autograd in test_rnmt_plus.py), and the
    no-gradient path against the plain loop."""
    from fairseq_deep.modules.recurrent.ln_lstm_triton import TritonLNLSTMRecurrence, recurrence

    options = (pad, cell_clip, output_tanh, 1e-6)
    ref = LNLSTMRecurrence.apply(*inputs, *options)
    ours = TritonLNLSTMRecurrence.apply(*inputs, *options)
    g = torch.Generator().manual_seed(5)
    weights = [torch.randn(r.shape, generator=g, dtype=torch.float64).to(r) for r in ref]
    g_ref = torch.autograd.grad(sum((r * w).sum() for r, w in zip(ref, weights)), inputs)
    g_ours = torch.autograd.grad(sum((r * w).sum() for r, w in zip(ours, weights)), inputs)
    names = ["out", "h_n", "c_n", "d_xw", "d_h0", "d_c0", "d_U", "d_gamma", "d_beta"]
    for name, a, b in zip(names, ref + g_ref, ours + g_ours):
        assert b.dtype == a.dtype and b.shape == a.shape, name
        torch.testing.assert_close(b, a, atol=atol, rtol=rtol, msg=name)
    with torch.no_grad():
        plain = _ln_lstm_recurrence(*inputs, *options)
        fused = recurrence(*inputs, *options)
    for name, a, b in zip(names, plain, fused):
        torch.testing.assert_close(b, a, atol=atol, rtol=rtol, msg=f"no-gradient {name}")


TOL = {torch.float64: (1e-12, 1e-10), torch.float32: (2e-5, 1e-4)}

# (directions, dtype, padded, cell_clip, output_tanh): every option, each in float64 (tight) and
# the RNMT+ default (clip, no output tanh) and the classic cell in float32
CASES = [
    (1, torch.float64, False, 0.0, False),
    (2, torch.float64, True, 0.3, True),
    (2, torch.float64, True, 0.0, False),
    (1, torch.float64, True, 0.3, False),
    (2, torch.float32, True, 0.5, False),
    (1, torch.float32, False, 0.0, True),
]


@interpreted
@pytest.mark.parametrize(
    "D,dtype,padded,cell_clip,output_tanh",
    CASES,
    ids=[
        f"{'bi' if c[0] == 2 else 'uni'}-{str(c[1])[6:]}-{'pad' if c[2] else 'nopad'}"
        f"-clip{c[3]}-{'tanh' if c[4] else 'linear'}"
        for c in CASES
    ],
)
def test_fused_recurrence_equals_loop(D, dtype, padded, cell_clip, output_tanh):
    T, B, H = 3, 3, 5  # H not a power of two: the kernels' masked columns
    inputs = _inputs(T, D, B, H, dtype)
    pad = _pad(T, D, B) if padded else None
    _check_against_loop(inputs, pad, cell_clip, output_tanh, *TOL[dtype])


def _layer_pair(bidirectional, seed=0, **kw):
    torch.manual_seed(seed)
    loop = LayerNormLSTM(6, 8, bidirectional=bidirectional, **kw)
    with torch.no_grad():
        loop.ln_weight.uniform_(0.5, 1.5)
        loop.bias.uniform_(-0.5, 0.5)
    fused = LayerNormLSTM(6, 8, bidirectional=bidirectional, impl="triton", **kw)
    fused.load_state_dict(loop.state_dict())
    return loop, fused


def _grads(m, x):
    return {"x": x.grad, **{n: p.grad for n, p in m.named_parameters()}}


@interpreted
def test_layer_with_padding_mask_and_initial_state():
    """LayerNormLSTM(impl='triton') against impl='loop': a bidirectional layer with a left- and a
    right-padded sentence and a given initial state, outputs and every gradient."""
    loop, fused = _layer_pair(True, cell_clip=0.5)
    torch.manual_seed(1)
    x = torch.randn(5, 3, 6)
    mask = torch.zeros(5, 3, dtype=torch.bool)
    mask[3:, 1] = True
    mask[:2, 2] = True
    state = (torch.randn(2, 3, 8), torch.randn(2, 3, 8))
    results = []
    for m in (loop, fused):
        xi = x.clone().requires_grad_()
        out, (h, c) = m(xi, mask, state=state)
        (out.pow(2).sum() + h.sum() + 2 * c.sum()).backward()
        results.append((out, h, c, _grads(m, xi)))
    (out_a, h_a, c_a, g_a), (out_b, h_b, c_b, g_b) = results
    assert out_b[mask].abs().max() == 0
    for a, b in ((out_a, out_b), (h_a, h_b), (c_a, c_b)):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-4)
    for name in g_a:
        torch.testing.assert_close(g_b[name], g_a[name], atol=1e-5, rtol=1e-4, msg=name)


@interpreted
def test_step_and_inference_equal_the_loop():
    """The decoder's one-step path (``step``) and a no-gradient forward, unidirectional, with tanh."""
    loop, fused = _layer_pair(False, output_tanh=True)
    torch.manual_seed(2)
    gates = torch.randn(1, 2, 32)
    state = (torch.randn(1, 2, 8), torch.randn(1, 2, 8))
    x = torch.randn(3, 2, 6)
    with torch.no_grad():
        for a, b in zip(loop.step(gates, state), fused.step(gates, state)):
            torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-5)
        (out_a, (h_a, c_a)), (out_b, (h_b, c_b)) = loop(x), fused(x)
    for a, b in ((out_a, out_b), (h_a, h_b), (c_a, c_b)):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-5)


@interpreted
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_reduced_precision_runs_the_kernels_in_float32(dtype):
    """--bf16/--fp16: the fused loop runs in float32 as the TorchScript loop does, outputs and
    gradients come back in the model's dtype and equal the loop's (same float32 recurrence)."""
    loop, fused = _layer_pair(True, cell_clip=0.5)
    loop, fused = loop.to(dtype), fused.to(dtype)
    torch.manual_seed(3)
    x = torch.randn(4, 2, 6, dtype=dtype)
    mask = torch.zeros(4, 2, dtype=torch.bool)
    mask[3:, 1] = True
    results = []
    for m in (loop, fused):
        out, (h, c) = m(x, mask)
        assert out.dtype == h.dtype == c.dtype == dtype
        (out.float().pow(2).sum() + h.float().sum()).backward()
        results.append((out, h, c, {n: p.grad for n, p in m.named_parameters()}))
    (out_a, h_a, c_a, g_a), (out_b, h_b, c_b, g_b) = results
    for a, b in ((out_a, out_b), (h_a, h_b), (c_a, c_b)):
        torch.testing.assert_close(b.float(), a.float(), atol=1e-2, rtol=0)
    for name in g_a:
        assert g_b[name].dtype == dtype
        scale = g_a[name].float().abs().max().clamp_min(1e-6)
        assert ((g_b[name].float() - g_a[name].float()).abs().max() / scale).item() < 2e-2, name


@interpreted
def test_cpu_autocast_returns_float32():
    loop, fused = _layer_pair(False)
    x = torch.randn(3, 2, 6)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        out_a, _ = loop(x)
        out_b, (h, c) = fused(x)
    assert out_b.dtype == h.dtype == c.dtype == torch.float32
    torch.testing.assert_close(out_b, out_a, atol=1e-5, rtol=1e-4)


@needs_triton
@not_interpreted
def test_without_layer_norm_falls_back_to_the_loop():
    """--rnmt-no-layer-norm has no fused kernel: impl='triton' warns and runs the plain loop (so it
    runs on a CPU without the interpreter)."""
    torch.manual_seed(0)
    loop = LayerNormLSTM(4, 5, bidirectional=True, layer_norm=False)
    with pytest.warns(UserWarning, match="no kernel for cells without layer norm"):
        fused = LayerNormLSTM(4, 5, bidirectional=True, layer_norm=False, impl="triton")
    fused.load_state_dict(loop.state_dict())
    x = torch.randn(4, 2, 4)
    assert torch.equal(fused(x)[0], loop(x)[0])


@needs_triton
@not_interpreted
def test_cpu_without_the_interpreter_is_refused():
    layer = LayerNormLSTM(4, 5, impl="triton")
    with pytest.raises(
        RuntimeError, match=r"need a CUDA device or Triton's CPU interpreter \(TRITON_INTERPRET=1"
    ):
        layer(torch.randn(3, 2, 4))


@not_interpreted
def test_without_triton_the_option_says_what_to_do(monkeypatch):
    """The package imports and runs without triton; asking for the fused loop names the fix."""
    import sys

    monkeypatch.setitem(sys.modules, "triton", None)  # import triton -> ImportError
    monkeypatch.delitem(sys.modules, "fairseq_deep.modules.recurrent.ln_lstm_triton", raising=False)
    with pytest.raises(ImportError, match="needs the triton package.*--rnmt-lstm-impl loop"):
        LayerNormLSTM(4, 5, impl="triton")
    with pytest.raises(
        ValueError, match="--rnmt-lstm-impl 'cudnn': choose one of auto, loop, triton"
    ):
        LayerNormLSTM(4, 5, impl="cudnn")
    LayerNormLSTM(4, 5)(torch.randn(2, 1, 4))  # the default needs nothing


@needs_triton
@not_interpreted
def test_kernels_compile_for_an_h100():
    """What the interpreter does not check: Triton's compiler takes both kernels to an sm_90 cubin
    (ahead of time, no GPU needed), float32, every option on, the launch configuration of H = 1024."""
    import triton

    from fairseq_deep.modules.recurrent import ln_lstm_triton as fused

    try:
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
    except ImportError as e:  # pragma: no cover - another triton's API
        pytest.skip(f"no ahead-of-time compile API in triton {triton.__version__}: {e}")
    options = fused._launch_options(1024)
    for kernel, extra in ((fused._fwd_step, {"SAVE": True}), (fused._bwd_step, {})):
        const = dict(HAS_PAD=True, OUTPUT_TANH=True, CLIP=True, BLOCK_H=options["BLOCK_H"], **extra)
        signature = {
            name: "constexpr"
            if name in const
            else "i32"
            if name in ("B", "H")
            else "*u8"
            if name == "PAD"
            else "*fp32"
            for name in kernel.arg_names
        }
        compiled = triton.compile(
            ASTSource(fn=kernel, signature=signature, constexprs=const),
            target=GPUTarget("cuda", 90, 32),
            options={"num_warps": options["num_warps"]},
        )
        assert compiled.asm.get("cubin"), kernel.__name__


# -- the option, through fairseq's parser and the model --------------------------------------------


def _model(extra):
    from fairseq import options, tasks

    parser = options.get_training_parser()
    argv = [
        "dummy-data",
        "--task",
        "translation",
        "--arch",
        "rnmt_plus",
        "--cpu",
        "--encoder-embed-dim",
        "8",
        "--decoder-embed-dim",
        "8",
        "--encoder-hidden-size",
        "4",
        "--decoder-hidden-size",
        "8",
        "--encoder-layers",
        "2",
        "--decoder-layers",
        "2",
        "--rnmt-attention-heads",
        "2",
        "--dropout",
        "0",
        *extra,
    ]
    args = options.parse_args_and_arch(parser, argv)
    d = tiny_dictionary()
    torch.manual_seed(1)
    return tasks.translation.TranslationTask(args, d, d).build_model(args).eval(), d


@not_interpreted
def test_the_option_defaults_to_auto_which_is_the_loop_on_a_cpu():
    """``auto`` (issue 24) everywhere; on a CPU without Triton's interpreter it equals ``loop`` bit for bit."""
    model, d = _model([])
    layers = list(model.encoder.layers) + list(model.decoder.layers)
    assert {layer.impl for layer in layers} == {"auto"}
    loop, _ = _model(["--rnmt-lstm-impl", "loop"])
    assert {layer.impl for layer in list(loop.encoder.layers) + list(loop.decoder.layers)} == {
        "loop"
    }
    loop.load_state_dict(model.state_dict())
    src, lengths, prev = random_batch(d, bsz=2, src_len=4, tgt_len=3, seed=0)
    with torch.no_grad():
        assert torch.equal(model(src, lengths, prev)[0], loop(src, lengths, prev)[0])


@interpreted
def test_auto_takes_the_kernels_where_triton_runs_and_equals_the_loop():
    """Under Triton's interpreter (as on a CUDA device) the default ``auto`` runs the fused kernels
    and gives the loop's scores and gradients."""
    from fairseq_deep.modules.recurrent import kernel_choice

    assert kernel_choice.resolve("auto", torch.zeros(1)) == "triton"
    loop, d = _model(["--rnmt-lstm-impl", "loop"])
    auto, _ = _model([])
    auto.load_state_dict(loop.state_dict())
    src, lengths, prev = random_batch(d, bsz=2, src_len=4, tgt_len=3, seed=0)
    assert_same_scores_and_grads(loop, auto, (src, lengths, prev))


@interpreted
def test_rnmt_plus_with_triton_equals_the_loop():
    """--rnmt-lstm-impl triton reaches every LSTM of the encoder and decoder and gives the loop's
    scores, with a padded source, in a full forward and in incremental decoding."""
    loop, d = _model([])
    fused, _ = _model(["--rnmt-lstm-impl", "triton"])
    assert {layer.impl for layer in list(fused.encoder.layers) + list(fused.decoder.layers)} == {
        "triton"
    }
    fused.load_state_dict(loop.state_dict())
    src, lengths, prev = random_batch(d, bsz=2, src_len=4, tgt_len=3, seed=0)
    with torch.no_grad():
        a = loop(src, lengths, prev)[0]
        b = fused(src, lengths, prev)[0]
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-4)
        enc = fused.encoder(src, lengths)
        state, steps = {}, []
        for t in range(prev.size(1)):
            steps.append(fused.decoder(prev[:, : t + 1], enc, incremental_state=state)[0])
    torch.testing.assert_close(torch.cat(steps, 1), a, atol=1e-5, rtol=1e-4)


# -- on a CUDA GPU ----------------------------------------------------------------------------------


@pytest.mark.gpu
@needs_triton
@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "autocast"])
@pytest.mark.parametrize("H", [512, 1024])
@not_interpreted
def test_triton_equals_loop_on_cuda(H, bidirectional, autocast):
    """The compiled kernels on CUDA at the papers' widths (H = 512; 1024: the other launch
    configuration), fp32 and under autocast (fp16: W x_t in half precision, the loop in float32
    either way): outputs, states, every gradient, the no-gradient forward and one step against the
    TorchScript loop, with padding and the RNMT+ default cell clip."""
    T, B = 20, 16
    torch.manual_seed(0)
    loop = LayerNormLSTM(H, H, bidirectional=bidirectional, cell_clip=10.0).cuda()
    with torch.no_grad():
        loop.ln_weight.uniform_(0.5, 1.5)
        loop.bias.uniform_(-0.5, 0.5)
    fused = LayerNormLSTM(H, H, bidirectional=bidirectional, cell_clip=10.0, impl="triton").cuda()
    fused.load_state_dict(loop.state_dict())
    torch.manual_seed(4)
    x = torch.randn(T, B, H, device="cuda")
    mask = torch.zeros(T, B, dtype=torch.bool, device="cuda")
    mask[15:, 1] = True
    mask[:5, 2] = True
    results = []
    for m in (loop, fused):
        xi = x.clone().requires_grad_()
        with torch.autocast("cuda", dtype=torch.float16, enabled=autocast):
            out, (h, c) = m(xi, mask)
        assert out.dtype == torch.float32
        (out.pow(2).sum() + h.sum() + c.sum()).backward()
        results.append((out, h, c, _grads(m, xi)))
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.float16, enabled=autocast):
            results[-1] += (m(x, mask)[0], m.step(m.input_gates(x[:1])[0], (h, c)))
    (out_a, h_a, c_a, g_a, inf_a, step_a), (out_b, h_b, c_b, g_b, inf_b, step_b) = results
    for name, a, b in (
        ("out", out_a, out_b),
        ("h", h_a, h_b),
        ("c", c_a, c_b),
        ("inference", inf_a, inf_b),
        ("step h", step_a[0], step_b[0]),
        ("step c", step_a[1], step_b[1]),
    ):
        torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-3, msg=name)
    # relative to each gradient's largest entry; under autocast W x_t and its gradients run in
    # float16 for both (a float32 difference of the loops can round to the next float16 there)
    bound = 1e-2 if autocast else 1e-3
    for name in g_a:
        scale = g_a[name].abs().max().clamp_min(1e-6)
        assert ((g_b[name] - g_a[name]).abs().max() / scale).item() < bound, name
