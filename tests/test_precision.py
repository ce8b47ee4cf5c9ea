"""Mixed precision (issue 12), checked on CPU, where PyTorch runs float16 and bfloat16 too.

* every family, as a tiny model cast with ``.half()`` / ``.bfloat16()`` (what fairseq's ``--fp16`` /
  ``--bf16`` do to the model), runs forward and backward with finite outputs and gradients of the
  parameter dtype, and its log-probabilities stay near the float32 model's; under CPU autocast
  (bfloat16) likewise, with float32 gradients;
* incremental decoding equals the full pass in half and bfloat16 (tolerances below);
* the layer-normalized LSTM keeps what needs float32 in float32 in reduced precision (the CUDA
  crash of issue 12: CUDA's layer norm returns float32 statistics for half input, and the
  hand-written backward then multiplied float32 by half); its gradients match float32 autograd
  through the plain loop within the tolerances below, for uni/bi, padding, cell clip, tanh output.

The real ``fairseq-train``/``fairseq-generate`` in each precision are in test_precision_cli.py;
tests that need a CUDA GPU are marked ``gpu`` and skip without one.
"""

import pytest
import torch
import torch.nn.functional as F
from fairseq import options
from helpers import build_family, random_batch

from benchmarks.precision_matrix import FAMILIES  # one list of families for the script and tests
from fairseq_deep.modules.common.precision import Float32UnderHalf
from fairseq_deep.modules.recurrent.ln_lstm import LayerNormLSTM, _ln_lstm_recurrence

REDUCED = [torch.float16, torch.bfloat16]
DTYPE_IDS = ["fp16", "bf16"]
# Tolerances on log-probabilities (vocabulary of 24, |log p| ~ 3): |log p(reduced) - log p(float32)|
# and |incremental - full| within one precision.  Measured maxima over the families: 0.006 and 0.006
# in float16 (unit roundoff 2^-11), 0.044 and 0.035 in bfloat16 (2^-8); the bounds leave ~3x room.
LOGPROB_ATOL = {torch.float16: 0.02, torch.bfloat16: 0.1}
INCREMENTAL_ATOL = {torch.float16: 0.02, torch.bfloat16: 0.1}


def build(family, seed=0):
    return build_family(FAMILIES[family], seed)


def log_probs(model, src, lengths, prev):
    out = model(src, lengths, prev)
    return model.get_normalized_probs(out, log_probs=True)


@pytest.mark.parametrize("dtype", REDUCED, ids=DTYPE_IDS)
@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_trains_in_reduced_precision(family, dtype):
    model, d = build(family)
    src, lengths, prev = random_batch(d)
    with torch.no_grad():
        reference = log_probs(model.eval(), src, lengths, prev)
    model = model.to(
        dtype
    )  # eval(): no dropout, so that the two precisions compute the same function
    lp = log_probs(model, src, lengths, prev)
    assert torch.isfinite(lp).all()
    torch.testing.assert_close(lp.float(), reference, atol=LOGPROB_ATOL[dtype], rtol=0)
    F.nll_loss(lp.view(-1, lp.size(-1)).float(), prev.view(-1), reduction="sum").backward()
    grads = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    assert all(
        p.grad is None or (p.grad.dtype == p.dtype and torch.isfinite(p.grad).all())
        for _, p in grads
    )
    # every parameter takes the cast, but Deep-Att's under float16: all but its output projection stay
    # float32 there (issue 24, tests/test_deep_att_fp16.py)
    kept = dtype == torch.float16 and isinstance(model.encoder, Float32UnderHalf)
    assert all(
        p.dtype == (torch.float32 if kept and "output_projection" not in n else dtype)
        for n, p in grads
    )
    assert sum(p.grad is not None for _, p in grads) >= 0.9 * len(grads)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_trains_under_cpu_autocast(family):
    model, d = build(family)
    src, lengths, prev = random_batch(d)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        lp = log_probs(model, src, lengths, prev)
        loss = F.nll_loss(lp.view(-1, lp.size(-1)).float(), prev.view(-1), reduction="sum")
    loss.backward()
    assert torch.isfinite(lp).all() and torch.isfinite(loss)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(g.dtype == torch.float32 and torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("dtype", REDUCED, ids=DTYPE_IDS)
@pytest.mark.parametrize("family", list(FAMILIES))
def test_incremental_equals_full_in_reduced_precision(family, dtype):
    model, d = build(family)
    model = model.to(dtype).eval()
    src, lengths, prev = random_batch(d)
    with torch.no_grad():
        full = log_probs(model, src, lengths, prev)
        enc = model.encoder(src, lengths)
        state, steps = {}, []
        for t in range(prev.size(1)):
            out = model.decoder(prev[:, : t + 1], enc, incremental_state=state)
            steps.append(model.get_normalized_probs(out, log_probs=True))
    torch.testing.assert_close(
        torch.cat(steps, 1).float(), full.float(), atol=INCREMENTAL_ATOL[dtype], rtol=0
    )


# -- the layer-normalized LSTM --------------------------------------------------------------------

# relative to the largest float32 gradient of each parameter
LSTM_GRAD_RTOL = {torch.float16: 1e-2, torch.bfloat16: 5e-2}


def _lstm_case(bidirectional, padded, cell_clip, output_tanh, seed=0):
    torch.manual_seed(seed)
    m = LayerNormLSTM(
        6, 8, bidirectional=bidirectional, cell_clip=cell_clip, output_tanh=output_tanh
    )
    x = torch.randn(7, 3, 6)
    pad = None
    if padded:
        pad = torch.zeros(7, 3, dtype=torch.bool)
        pad[5:, 1] = True
        pad[:2, 2] = True
    return m, x, pad


def _plain_loop_grads(m, x, pad):
    """float32 autograd through the plain (TorchScript-free) loop: the reference."""
    D, H = m.num_directions, m.hidden_size
    xw = m.input_gates(x)
    h = c = x.new_zeros(D, x.size(1), H)
    p = None
    if pad is not None:
        p = pad.view(7, 1, 3, 1)
        p = torch.cat([p, p.flip(0)], 1) if D == 2 else p
    out, hn, cn = _ln_lstm_recurrence(
        xw,
        h,
        c,
        m.weight_hh,
        m.ln_weight.unsqueeze(1),
        m.bias.unsqueeze(1),
        p,
        m.cell_clip,
        m.output_tanh,
        m.eps,
    )
    out = torch.cat([out[:, 0], out[:, 1].flip(0)], -1) if D == 2 else out[:, 0]
    if pad is not None:
        out = out.masked_fill(pad.unsqueeze(-1), 0.0)
    (out.pow(2).sum() + hn.sum() + cn.sum()).backward()
    return {n: q.grad.clone() for n, q in m.named_parameters()}


def _ln_lstm_nodes(tensor):
    """The LNLSTMRecurrence nodes of tensor's autograd graph."""
    seen, stack, found = set(), [tensor.grad_fn], []
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if type(node).__name__ == "LNLSTMRecurrenceBackward":
            found.append(node)
        stack.extend(next_fn for next_fn, _ in node.next_functions)
    return found


@pytest.mark.parametrize("dtype", REDUCED, ids=DTYPE_IDS)
@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
def test_ln_lstm_backward_state_is_float32_in_reduced_precision(bidirectional, dtype):
    """Regression test of the CUDA crash: what the hand-written backward saved had mixed dtypes
    there.  Now the recurrence's saved state is float32 on every device."""
    m, x, pad = _lstm_case(bidirectional, True, 0.0, False)
    m = m.to(dtype)
    out, _ = m(x.to(dtype).requires_grad_(), pad)
    nodes = _ln_lstm_nodes(out)
    assert len(nodes) == 1
    saved = [t for t in nodes[0].saved_tensors if t is not None and t.is_floating_point()]
    assert saved and all(t.dtype == torch.float32 for t in saved)
    out.float().sum().backward()
    assert all(p.grad.dtype == dtype for p in m.parameters())


@pytest.mark.parametrize("dtype", REDUCED, ids=DTYPE_IDS)
@pytest.mark.parametrize(
    "bidirectional,padded,cell_clip,output_tanh",
    [
        (False, False, 0.0, False),
        (True, True, 0.0, False),
        (False, True, 0.5, False),
        (True, False, 0.5, True),
    ],
)
def test_ln_lstm_reduced_precision_gradients_match_float32(
    bidirectional, padded, cell_clip, output_tanh, dtype
):
    m, x, pad = _lstm_case(bidirectional, padded, cell_clip, output_tanh)
    reference = _plain_loop_grads(m, x, pad)
    m.zero_grad()
    m = m.to(dtype)
    out, (hn, cn) = m(x.to(dtype), pad)
    assert out.dtype == hn.dtype == cn.dtype == dtype
    (out.float().pow(2).sum() + hn.float().sum() + cn.float().sum()).backward()
    for name, p in m.named_parameters():
        assert p.grad.dtype == dtype
        scale = reference[name].abs().max().clamp_min(1e-6)
        assert ((p.grad.float() - reference[name]).abs().max() / scale).item() < LSTM_GRAD_RTOL[
            dtype
        ], name


def test_ln_lstm_float32_is_untouched_by_the_precision_path():
    """float32 takes the same path as before: bitwise equal to the plain loop's outputs."""
    m, x, pad = _lstm_case(True, True, 0.5, False)
    with torch.no_grad():
        out, _ = m(x, pad)
        D = 2
        p = pad.view(7, 1, 3, 1)
        p = torch.cat([p, p.flip(0)], 1)
        ref, _, _ = _ln_lstm_recurrence(
            m.input_gates(x),
            x.new_zeros(D, 3, 8),
            x.new_zeros(D, 3, 8),
            m.weight_hh,
            m.ln_weight.unsqueeze(1),
            m.bias.unsqueeze(1),
            p,
            m.cell_clip,
            m.output_tanh,
            m.eps,
        )
    ref = torch.cat([ref[:, 0], ref[:, 1].flip(0)], -1).masked_fill(pad.unsqueeze(-1), 0.0)
    assert torch.equal(out, ref)


def test_ln_lstm_under_cpu_autocast_returns_float32_and_matches():
    m, x, pad = _lstm_case(True, True, 0.0, False)
    with torch.no_grad():
        reference, _ = m(x, pad)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out, (h, c) = m(x, pad)
    assert out.dtype == h.dtype == c.dtype == torch.float32
    # only W x_t (outside the loop) runs in bfloat16
    torch.testing.assert_close(out, reference, atol=5e-2, rtol=0)


# -- on a CUDA GPU --------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", REDUCED, ids=DTYPE_IDS)
@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
def test_ln_lstm_backward_on_cuda_in_reduced_precision(bidirectional, dtype):
    """The crash of issue 12 (``expected scalar type Float but found Half`` at the first backward)."""
    m, x, pad = _lstm_case(bidirectional, True, 0.5, False)
    reference = _plain_loop_grads(m, x, pad)
    m.zero_grad()
    m = m.cuda().to(dtype)
    out, (hn, cn) = m(x.cuda().to(dtype), pad.cuda())
    (out.float().pow(2).sum() + hn.float().sum() + cn.float().sum()).backward()
    for name, p in m.named_parameters():
        scale = reference[name].abs().max().clamp_min(1e-6)
        assert (
            (p.grad.float().cpu() - reference[name]).abs().max() / scale
        ).item() < LSTM_GRAD_RTOL[dtype]


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["fp16", "bf16", "amp"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_trains_on_cuda(family, mode):
    model, d = build(family)
    model = model.cuda().train()
    if mode != "amp":
        model = model.to(torch.float16 if mode == "fp16" else torch.bfloat16)
    src, lengths, prev = (t.cuda() for t in random_batch(d))
    with torch.autocast("cuda", dtype=torch.float16, enabled=mode == "amp"):
        lp = log_probs(model, src, lengths, prev)
        loss = F.nll_loss(lp.view(-1, lp.size(-1)).float(), prev.view(-1), reduction="sum")
    loss.backward()
    assert torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_bf16_decoding_casts_the_model_and_fp32_does_not():
    """fairseq-generate/-interactive and the hub call ``prepare_for_inference_``; fairseq casts to
    half for --fp16 only, the precision shim casts to bfloat16 for --bf16."""
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    for flags, dtype in (([], torch.float32), (["--bf16"], torch.bfloat16)):
        model, _ = build("transformer_dlcl")
        args = options.parse_args_and_arch(
            options.get_generation_parser(), ["dummy", "--cpu", *flags]
        )
        model.prepare_for_inference_(convert_namespace_to_omegaconf(args))
        assert {p.dtype for p in model.parameters()} == {dtype}
