"""The fused Triton loop of the Deep-Att / Deep-ED cell (``--deep-att-cell-impl triton``, issue 16),
and the loop's own hand-written backward (``FFLSTMRecurrence``, issue 24), against
:func:`lstm_recurrence` (Zhou et al. 2016, Eq. 4) and autograd through it.

As in ``tests/test_ln_lstm_triton.py``: on a CPU the kernels run in Triton's interpreter, which
Triton switches on only when ``TRITON_INTERPRET=1`` is set before it is imported, so the
interpreter checks (``@interpreted``) run in a subprocess started by
``test_interpreter_checks_in_a_subprocess``; this process never sets the variable, and its ``gpu``
test compiles for CUDA.  Run them directly with
``TRITON_INTERPRET=1 python -m pytest tests/test_ff_lstm_triton.py``.  Tiny sizes: the interpreter
runs every program in Python.

On a GPU: ``python -m pytest -m gpu tests/test_ff_lstm_triton.py`` (H = 512 and 1024, fp32 and autocast).
"""

import pickle
import sys

import pytest
import torch
from helpers import (
    assert_same_scores_and_grads,
    interpreted,
    needs_triton,
    not_interpreted,
    random_batch,
    run_interpreted_tests,
)
from test_deep_att import build

from fairseq_deep.modules.recurrent import kernel_choice
from fairseq_deep.modules.recurrent.fast_forward_lstm import (
    FFLSTMCell,
    FFLSTMRecurrence,
    loop_recurrence,
    lstm_recurrence,
)

IMPL = ["--deep-att-cell-impl", "triton"]


@needs_triton
@not_interpreted
def test_interpreter_checks_in_a_subprocess():
    """Every @interpreted test of this file, in a pytest subprocess with TRITON_INTERPRET=1."""
    run_interpreted_tests(__file__)


def _inputs(T, B, H, dtype, seed=0, transposed=False):
    """f, W_r, theta, h0, s0 of the recurrence, leaves that want a gradient: nonzero theta (the
    model starts at zero, Sec. 4.3, but trains away from it) and a nonzero initial state.
    ``transposed``: f is a non-contiguous view (B x T x 4H transposed)."""
    g = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype)

    f = rand(B, T, 4 * H).transpose(0, 1) if transposed else rand(T, B, 4 * H)
    tensors = (f, rand(4 * H, H, scale=H**-0.5 * 2), rand(3, H), rand(B, H, scale=0.5), rand(B, H))
    return tuple(t.requires_grad_() for t in tensors)


def _outputs_and_grads(function, inputs):
    """``function(*inputs)`` (out, h_n, s_n) and the gradients of f, W_r, theta, h0 and s0 of a
    fixed random weighting of its outputs, for :func:`lstm_recurrence` and for ``function``."""
    ref, ours = lstm_recurrence(*inputs), function(*inputs)
    g = torch.Generator().manual_seed(5)
    weights = [torch.randn(r.shape, generator=g, dtype=torch.float64).to(r) for r in ref]
    g_ref = torch.autograd.grad(sum((r * w).sum() for r, w in zip(ref, weights)), inputs)
    g_ours = torch.autograd.grad(sum((r * w).sum() for r, w in zip(ours, weights)), inputs)
    return ref, ours, g_ref, g_ours


def _check_against_loop(inputs, atol, rtol):
    """Outputs, the final (h, s) and the gradients of f, W_r, theta, h0 and s0: the fused Function
    against autograd through :func:`lstm_recurrence`, and the no-gradient path against the loop."""
    from fairseq_deep.modules.recurrent.ff_lstm_triton import TritonFFLSTMRecurrence, recurrence

    ref, ours, g_ref, g_ours = _outputs_and_grads(TritonFFLSTMRecurrence.apply, inputs)
    names = ["out", "h_n", "s_n", "d_f", "d_w_r", "d_theta", "d_h0", "d_s0"]
    for name, a, b in zip(names, ref + g_ref, ours + g_ours):
        assert b.dtype == a.dtype and b.shape == a.shape, name
        torch.testing.assert_close(b, a, atol=atol, rtol=rtol, msg=name)
    with torch.no_grad():
        fused = recurrence(*inputs)
    for name, a, b in zip(names, ref, fused):
        torch.testing.assert_close(b, a.detach(), atol=atol, rtol=rtol, msg=f"no-gradient {name}")


# float64: the interpreter runs it (numpy), so the check is exact to rounding; float32 to a few
# ulps (the kernels' exp-based sigmoid and tanh round differently from torch's)
TOL = {torch.float64: (1e-12, 1e-10), torch.float32: (1e-5, 1e-4)}

# (T, B, H, dtype, transposed f): T = 1 is the decoder's step; H = 5 is not a power of two and
# B * H = 15 leaves masked lanes in the one program
CASES = [
    (4, 3, 5, torch.float64, False),
    (1, 2, 4, torch.float64, False),
    (3, 2, 16, torch.float64, True),
    (5, 3, 8, torch.float32, False),
    (1, 3, 5, torch.float32, True),
]


@interpreted
@pytest.mark.parametrize(
    "T,B,H,dtype,transposed",
    CASES,
    ids=[f"T{c[0]}-B{c[1]}-H{c[2]}-{str(c[3])[6:]}{'-strided' if c[4] else ''}" for c in CASES],
)
def test_fused_recurrence_equals_loop(T, B, H, dtype, transposed):
    _check_against_loop(_inputs(T, B, H, dtype, transposed=transposed), *TOL[dtype])


@interpreted
def test_only_some_outputs_get_a_gradient():
    """A loss on the outputs alone (the final state unused, as in the encoder) and on the final
    state alone (gradients of the other outputs are zeros)."""
    from fairseq_deep.modules.recurrent.ff_lstm_triton import TritonFFLSTMRecurrence

    inputs = _inputs(3, 2, 4, torch.float64, seed=1)
    for pick in (lambda r: r[0].pow(2).sum(), lambda r: r[2].sum() - r[1].sum()):
        g_ref = torch.autograd.grad(pick(lstm_recurrence(*inputs)), inputs)
        g_ours = torch.autograd.grad(pick(TritonFFLSTMRecurrence.apply(*inputs)), inputs)
        for a, b in zip(g_ref, g_ours):
            torch.testing.assert_close(b, a, atol=1e-12, rtol=1e-10)


# -- the loop's own training path: a backward written out (issue 24) --------------------------------


@not_interpreted
@pytest.mark.parametrize("T", [1, 6])
def test_hand_written_backward_equals_autograd_through_eq4(T):
    """The loop's training path (FFLSTMRecurrence: a backward written out, dW_r and d theta summed
    over all steps at once) gives autograd's gradients through lstm_recurrence, for f, W_r, every
    theta (the output gate's peephole reads s_t, the others s_{t-1}) and the initial (h, s)."""
    ref, ours, g_ref, g_ours = _outputs_and_grads(
        FFLSTMRecurrence.apply, _inputs(T, 3, 4, torch.float64)
    )
    for a, b in zip(ref, ours):
        assert torch.equal(a, b)
    for name, a, b in zip(("f", "W_r", "theta", "h0", "s0"), g_ref, g_ours):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-12, msg=name)


@not_interpreted
def test_loop_trains_through_the_hand_written_backward_with_the_same_values():
    """In float32 the training path's forward is lstm_recurrence's, bit for bit; without a gradient
    the loop is lstm_recurrence itself."""
    inputs = _inputs(5, 3, 4, torch.float32)
    out = loop_recurrence(*inputs)
    assert out[0].grad_fn is not None and "FFLSTMRecurrence" in type(out[0].grad_fn).__name__
    for a, b in zip(out, lstm_recurrence(*inputs)):
        assert torch.equal(a, b)
    with torch.no_grad():
        assert loop_recurrence(*inputs)[0].grad_fn is None


def _cell_pair(H=6, seed=0):
    torch.manual_seed(seed)
    loop = FFLSTMCell(H)
    with torch.no_grad():
        loop.weight_r.normal_(0, 1.2 * H**-0.5)
        loop.theta.normal_(0, 1.0)
    fused = FFLSTMCell(H, impl="triton")
    fused.load_state_dict(loop.state_dict())
    return loop, fused


@interpreted
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_reduced_precision_runs_the_kernels_in_float32(dtype):
    """--bf16/--fp16: the cell hands the kernels float32, as it does the loop; outputs are float32
    and equal the loop's, the parameters' gradients come back in their dtype."""
    loop, fused = _cell_pair()
    loop, fused = loop.to(dtype), fused.to(dtype)
    torch.manual_seed(3)
    f = torch.randn(4, 2, 24, dtype=dtype)
    state = (torch.randn(2, 6, dtype=dtype), torch.randn(2, 6, dtype=dtype))
    results = []
    for m in (loop, fused):
        out, (h, s) = m(f, state)
        assert out.dtype == h.dtype == s.dtype == torch.float32
        (out.pow(2).sum() + s.sum()).backward()
        results.append((out, h, s, {n: p.grad for n, p in m.named_parameters()}))
    (out_a, h_a, s_a, g_a), (out_b, h_b, s_b, g_b) = results
    for a, b in ((out_a, out_b), (h_a, h_b), (s_a, s_b)):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-4)
    for name in g_a:
        assert g_b[name].dtype == dtype
        torch.testing.assert_close(
            g_b[name].float(), g_a[name].float(), atol=2e-2, rtol=2e-2, msg=name
        )


@interpreted
def test_cpu_autocast_runs_the_kernels_in_float32():
    loop, fused = _cell_pair()
    f = torch.randn(3, 2, 24)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        out_a, _ = loop(f)
        out_b, (h, s) = fused(f)
    assert out_b.dtype == h.dtype == s.dtype == torch.float32
    torch.testing.assert_close(out_b, out_a, atol=1e-5, rtol=1e-4)


# -- the option, through fairseq's parser and the model --------------------------------------------


def _cells(model):
    return [m for m in model.modules() if isinstance(m, FFLSTMCell)]


def _model_pair(arch="deep_att_ff"):
    loop, d, _ = build(arch)
    fused, _, _ = build(arch, IMPL)
    fused.load_state_dict(loop.state_dict())
    return loop, fused, d


@interpreted
def test_deep_att_with_triton_equals_the_loop():
    """--deep-att-cell-impl triton reaches every cell (encoder columns, the decoder's step-by-step
    layer 1 and its other layers) and gives the loop's scores and the gradients of every parameter,
    with a left-padded source and perturbed recurrent parameters."""
    loop, fused, d = _model_pair()
    assert {c.impl for c in _cells(fused)} == {"triton"} and len(_cells(fused)) == 3 * 2 + 2
    src, lengths, prev = random_batch(d, bsz=2, src_len=5, tgt_len=4, seed=0)
    assert_same_scores_and_grads(loop, fused, (src, lengths, prev))


@interpreted
@pytest.mark.parametrize("arch", ["deep_att_ff", "deep_ed_ff"])
def test_incremental_decoding_with_triton_equals_full_decoding(arch):
    """One step at a time through fairseq's incremental state (T = 1 per call) with the fused cell
    equals the loop's full forward."""
    loop, fused, d = _model_pair(arch)
    src, lengths, prev = random_batch(d, bsz=2, src_len=4, tgt_len=3, seed=1)
    with torch.no_grad():
        full = loop(src, lengths, prev)[0]
        enc = fused.encoder(src, lengths)
        state, steps = {}, []
        for t in range(prev.size(1)):
            steps.append(fused.decoder(prev[:, : t + 1], enc, incremental_state=state)[0])
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-4)


@not_interpreted
def test_the_option_defaults_to_auto_which_is_the_loop_on_a_cpu_and_exact():
    """Default (and arguments saved before the option): every cell is ``auto`` (issue 24), which on a
    CPU without Triton's interpreter runs :func:`lstm_recurrence` bit for bit."""
    model, _, args = build("deep_att_ff")
    assert args.deep_att_cell_impl == "auto" and {c.impl for c in _cells(model)} == {"auto"}
    assert kernel_choice.resolve("auto", torch.zeros(1)) == "loop"
    cell = FFLSTMCell(6)
    with torch.no_grad():
        cell.weight_r.normal_(0, 0.5), cell.theta.normal_(0, 0.5)
    f, h, s = torch.randn(3, 2, 24), torch.randn(2, 6), torch.randn(2, 6)
    out, (h_n, s_n) = cell(f, (h, s))
    for a, b in zip((out, h_n, s_n), lstm_recurrence(f, cell.weight_r, cell.theta, h, s)):
        assert torch.equal(a, b)


@interpreted
def test_auto_takes_the_kernels_where_triton_runs_and_equals_the_loop():
    """Under Triton's interpreter (as on a CUDA device) ``auto`` runs the fused cell: scores and
    gradients of the default model equal those of ``loop``."""
    assert kernel_choice.resolve("auto", torch.zeros(1)) == "triton"
    loop, _, _ = build("deep_att_ff", ["--deep-att-cell-impl", "loop"])
    auto, d, _ = build("deep_att_ff")
    auto.load_state_dict(loop.state_dict())
    src, lengths, prev = random_batch(d, bsz=2, src_len=5, tgt_len=4, seed=0)
    assert_same_scores_and_grads(loop, auto, (src, lengths, prev))


@not_interpreted
def test_checkpoints_keep_their_choice(tmp_path):
    """A fairseq checkpoint that stored ``loop`` (the default before issue 24) builds loop cells; one
    whose arguments predate the option builds ``auto`` (the same numbers); a triton one decodes with
    the loop by ``--model-overrides``; a pickled cell without the attribute is the loop (the class
    default)."""
    from fairseq import checkpoint_utils

    model, d, args = build("deep_att_ff")
    del args.deep_att_cell_impl
    path = str(tmp_path / "old.pt")
    history = [
        {
            "criterion_name": "CrossEntropyCriterion",
            "optimizer_name": "Adam",
            "lr_scheduler_state": {},
            "num_updates": 0,
        }
    ]
    torch.save(
        {
            "args": args,
            "model": model.state_dict(),
            "optimizer_history": history,
            "extra_state": {"train_iterator": None},
        },
        path,
    )
    from fairseq import tasks

    task = tasks.translation.TranslationTask(args, d, d)
    (loaded,), _ = checkpoint_utils.load_model_ensemble([path], task=task)
    assert {c.impl for c in _cells(loaded)} == {"auto"}
    args.deep_att_cell_impl = "loop"
    torch.save(
        {
            "args": args,
            "model": model.state_dict(),
            "optimizer_history": history,
            "extra_state": {"train_iterator": None},
        },
        path,
    )
    (loaded,), _ = checkpoint_utils.load_model_ensemble([path], task=task)
    assert {c.impl for c in _cells(loaded)} == {"loop"}
    # a model trained with triton decodes with the loop by --model-overrides, as the docs say
    args.deep_att_cell_impl = "triton"
    torch.save(
        {
            "args": args,
            "model": model.state_dict(),
            "optimizer_history": history,
            "extra_state": {"train_iterator": None},
        },
        path,
    )
    (loaded,), _ = checkpoint_utils.load_model_ensemble([path], task=task)
    assert {c.impl for c in _cells(loaded)} == {"triton"}
    (loaded,), _ = checkpoint_utils.load_model_ensemble(
        [path], task=task, arg_overrides={"deep_att_cell_impl": "loop"}
    )
    assert {c.impl for c in _cells(loaded)} == {"loop"}
    cell = FFLSTMCell(4)
    del cell.impl  # a cell pickled before the option: no instance attribute
    old = pickle.loads(pickle.dumps(cell))
    assert "impl" not in vars(old) and old.impl == "loop"
    old(torch.randn(2, 1, 16))


@needs_triton
@not_interpreted
def test_cpu_without_the_interpreter_is_refused():
    cell = FFLSTMCell(4, impl="triton")
    with pytest.raises(
        RuntimeError,
        match=r"--deep-att-cell-impl triton .*need a CUDA device or Triton's CPU "
        r"interpreter \(TRITON_INTERPRET=1.*--deep-att-cell-impl loop",
    ):
        cell(torch.randn(3, 2, 16))


@not_interpreted
def test_without_triton_the_option_says_what_to_do(monkeypatch):
    """The package imports and runs without triton; asking for the fused cell names the fix."""
    monkeypatch.setitem(sys.modules, "triton", None)  # import triton -> ImportError
    for name in (
        "fairseq_deep.modules.recurrent.ff_lstm_triton",
        "fairseq_deep.modules.recurrent.ln_lstm_triton",
    ):
        monkeypatch.delitem(sys.modules, name, raising=False)
    with pytest.raises(ImportError, match="needs the triton package.*--deep-att-cell-impl loop"):
        FFLSTMCell(4, impl="triton")
    with pytest.raises(
        ValueError, match="--deep-att-cell-impl 'cudnn': choose one of auto, loop, triton"
    ):
        FFLSTMCell(4, impl="cudnn")
    FFLSTMCell(4)(torch.randn(2, 1, 16))  # the default needs nothing


@needs_triton
@not_interpreted
def test_kernels_compile_for_an_h100():
    """What the interpreter does not check: Triton's compiler takes both kernels to an sm_90 cubin
    (ahead of time, no GPU needed), float32, the launch configuration of B x H = 128 x 512."""
    import triton

    from fairseq_deep.modules.recurrent import ff_lstm_triton as fused

    try:
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
    except ImportError as e:  # pragma: no cover - another triton's API
        pytest.skip(f"no ahead-of-time compile API in triton {triton.__version__}: {e}")
    options = fused._launch_options(128 * 512)
    for kernel in (fused._fwd_step, fused._bwd_step):
        const = {"BLOCK": options["BLOCK"]}
        signature = {
            name: "constexpr" if name in const else "i32" if name in ("N", "H") else "*fp32"
            for name in kernel.arg_names
        }
        compiled = triton.compile(
            ASTSource(fn=kernel, signature=signature, constexprs=const),
            target=GPUTarget("cuda", 90, 32),
            options={"num_warps": options["num_warps"]},
        )
        assert compiled.asm.get("cubin"), kernel.__name__


# -- on a CUDA GPU ----------------------------------------------------------------------------------


@pytest.mark.gpu
@needs_triton
@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "autocast"])
@pytest.mark.parametrize("H", [512, 1024])
@not_interpreted
def test_triton_equals_loop_on_cuda(H, autocast, monkeypatch):
    """The compiled kernels on CUDA at the paper's widths (Table 6: 512 and 1024), fp32 and under
    float16 autocast (the cell runs in float32 either way): outputs, the final state, the gradients
    of f, the initial state and the parameters, the no-gradient forward and one step (T = 1), against
    the loop, with nonzero theta and initial state."""
    T, B = 20, 16
    monkeypatch.setattr(
        torch.backends.cuda.matmul, "allow_tf32", False
    )  # fp32 means fp32, for both
    loop, fused = (m.cuda() for m in _cell_pair(H))
    torch.manual_seed(4)
    f = torch.randn(T, B, 4 * H, device="cuda")
    state = (torch.randn(B, H, device="cuda") * 0.5, torch.randn(B, H, device="cuda"))
    results = []
    for m in (loop, fused):
        fi = f.clone().requires_grad_()
        st = tuple(t.clone().requires_grad_() for t in state)
        with torch.autocast("cuda", dtype=torch.float16, enabled=autocast):
            out, (h, s) = m(fi, st)
        assert out.dtype == torch.float32
        (out.pow(2).sum() + h.sum() + s.sum()).backward()
        grads = {
            "f": fi.grad,
            "h0": st[0].grad,
            "s0": st[1].grad,
            **{n: p.grad for n, p in m.named_parameters()},
        }
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.float16, enabled=autocast):
            inference = m(f, state)[0]
            step = m(f[:1], (h, s))
        results.append((out, h, s, grads, inference, step))
    (out_a, h_a, s_a, g_a, inf_a, step_a), (out_b, h_b, s_b, g_b, inf_b, step_b) = results
    for name, a, b in (
        ("out", out_a, out_b),
        ("h", h_a, h_b),
        ("s", s_a, s_b),
        ("inference", inf_a, inf_b),
        ("step out", step_a[0], step_b[0]),
        ("step s", step_a[1][1], step_b[1][1]),
    ):
        torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-3, msg=name)
    for name in g_a:  # relative to each gradient's largest entry
        scale = g_a[name].abs().max().clamp_min(1e-6)
        assert ((g_b[name] - g_a[name]).abs().max() / scale).item() < 1e-3, name
