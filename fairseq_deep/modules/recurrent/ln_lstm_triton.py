"""The layer-normalized LSTM's time loop with one fused Triton kernel per step (issue 16).

``LayerNormLSTM(impl="triton")``, ``--rnmt-lstm-impl triton``, and the default ``auto`` on CUDA
(:mod:`.kernel_choice`); otherwise the TorchScript loop of :mod:`.ln_lstm`, whose arithmetic this
module repeats exactly (Chen et al. 2018, Sec. 4.1, lingvo's ``LayerNormalizedLSTMCellSimple``):

    a_t  = W x_t + U h_{t-1}                                 (W x_t: one matmul before the loop)
    g_k  = gamma_k * (a_k - mean(a_k)) / sqrt(var(a_k) + eps) + beta_k,   k in (i, f, o, j)
    c_t  = sigmoid(g_f) * c_{t-1} + sigmoid(g_i) * tanh(g_j)  (clipped to +-cell_clip when > 0)
    h_t  = sigmoid(g_o) * c_t                                 (tanh(c_t) with output_tanh)
    a padded step keeps (h, c)

Forward, per step: one matmul ``U h_{t-1}`` (cuBLAS, both directions in one ``bmm``) and one kernel
for everything else: the add of W x_t, the four gates' layer norms, gains and biases, the
activations, the cell update with its clipping, the output and the padding select.  Training saves
the pre-norm gates a_t and the states; the backward recomputes the layer norm from a_t.

Backward, per step in reverse: one kernel (the cell's and the layer norm's backward, the padding
pass-through of dh and dc, dc_{t-1}) and one matmul ``dh_{t-1} += da_t U^T``; after the loop the
weight gradients of all steps at once (dU: one matmul over T*B rows; d gamma, d beta: one sum).

One program per (batch row, direction) holds the row's 4 x H gates in registers (H up to a few
thousand).  The kernels compute in the dtype of their inputs: float32 or float64 (the precision rule
of :func:`.ln_lstm.recurrence` runs float16/bfloat16 and autocast in float32 before they are
reached).  Triton compiles for CUDA; on a CPU it runs only in its interpreter (``TRITON_INTERPRET=1``,
slow, for tests), and Triton reads ``TRITON_INTERPRET`` once, when it is imported.
"""

from typing import Dict, Optional, Tuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..common.precision import custom_bwd, custom_fwd, in_float32_when_reduced
from .triton_common import check_device as _check_device
from .triton_common import sigmoid as _sigmoid
from .triton_common import tanh as _tanh

OPTION = "--rnmt-lstm-impl"


@triton.jit
def _gates(a, gamma, beta, gate, mask, eps, H):
    """The cell's gates from its pre-norm gates a (4 x BLOCK_H, order i, f, o, j): per-gate layer
    norm (biased variance), gain and bias, sigmoid for i, f, o and tanh for j.  Returns the
    normalized a, 1/std per gate, and the activations i, f, o, j (the forward and backward
    kernels' shared part)."""
    mean = tl.sum(a, axis=1) / H
    diff = tl.where(mask, a - mean[:, None], 0.0)
    var = tl.sum(diff * diff, axis=1) / H
    rstd = 1.0 / tl.sqrt(var + eps)
    xhat = diff * rstd[:, None]
    g = xhat * gamma + beta
    act = tl.where(gate[:, None] < 3, _sigmoid(g), _tanh(g))
    i = tl.sum(tl.where(gate[:, None] == 0, act, 0.0), axis=0)
    f = tl.sum(tl.where(gate[:, None] == 1, act, 0.0), axis=0)
    o = tl.sum(tl.where(gate[:, None] == 2, act, 0.0), axis=0)
    j = tl.sum(tl.where(gate[:, None] == 3, act, 0.0), axis=0)
    return xhat, rstd, i, f, o, j


@triton.jit
def _fwd_step(
    XW,
    HU,
    H_PREV,
    C_PREV,
    PAD,
    GAMMA,
    BETA,
    SCALARS,
    A_OUT,
    H_OUT,
    C_OUT,
    B,
    H,
    HAS_PAD: tl.constexpr,
    SAVE: tl.constexpr,
    OUTPUT_TANH: tl.constexpr,
    CLIP: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    """One step of one (batch row, direction): program ids (b, d).  XW, HU, A_OUT: D x B x 4H;
    H_PREV, C_PREV, H_OUT, C_OUT: D x B x H; PAD: D x B (uint8); GAMMA, BETA: D x 4H; SCALARS:
    (cell_clip, eps) in the compute dtype.  All contiguous."""
    b = tl.program_id(0)
    d = tl.program_id(1)
    row = d * B + b
    cols = tl.arange(0, BLOCK_H)
    gate = tl.arange(0, 4)
    col_ok = cols < H
    offs = gate[:, None] * H + cols[None, :]  # 4 x BLOCK_H, gate order (i, f, o, j)
    mask = (gate[:, None] < 4) & col_ok[None, :]
    a = tl.load(XW + row * 4 * H + offs, mask=mask, other=0.0) + tl.load(
        HU + row * 4 * H + offs, mask=mask, other=0.0
    )
    if SAVE:
        tl.store(A_OUT + row * 4 * H + offs, a, mask=mask)
    clip = tl.load(SCALARS)
    eps = tl.load(SCALARS + 1)
    # per-gate layer norm (biased variance, as torch's layer_norm)
    gamma = tl.load(GAMMA + d * 4 * H + offs, mask=mask, other=0.0)
    beta = tl.load(BETA + d * 4 * H + offs, mask=mask, other=0.0)
    xhat, rstd, i, f, o, j = _gates(a, gamma, beta, gate, mask, eps, H)
    c_prev = tl.load(C_PREV + row * H + cols, mask=col_ok, other=0.0)
    c = f * c_prev + i * j
    if CLIP:
        c = tl.minimum(tl.maximum(c, -clip), clip)
    if OUTPUT_TANH:
        h = o * _tanh(c)
    else:
        h = o * c
    if HAS_PAD:
        p = tl.load(PAD + row) != 0
        h = tl.where(p, tl.load(H_PREV + row * H + cols, mask=col_ok, other=0.0), h)
        c = tl.where(p, c_prev, c)
    tl.store(H_OUT + row * H + cols, h, mask=col_ok)
    tl.store(C_OUT + row * H + cols, c, mask=col_ok)


@triton.jit
def _bwd_step(
    D_OUT,
    DH,
    DC,
    A,
    C_PREV,
    PAD,
    GAMMA,
    BETA,
    SCALARS,
    DA,
    DG,
    DGX,
    B,
    H,
    HAS_PAD: tl.constexpr,
    OUTPUT_TANH: tl.constexpr,
    CLIP: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    """The backward of one step of one (batch row, direction).  Reads the gradient of the step's
    output (D_OUT) and of its state (DH, DC: the carry from step t+1), the saved gates A and
    c_{t-1}; writes da (DA), dg (DG, the gradient of the post-norm gates) and dg * xhat (DGX), and
    overwrites DC with dc_{t-1} and DH with the part of dh_{t-1} that skips the cell (a padded
    step's dh, else 0): the caller adds da U^T."""
    b = tl.program_id(0)
    d = tl.program_id(1)
    row = d * B + b
    cols = tl.arange(0, BLOCK_H)
    gate = tl.arange(0, 4)
    col_ok = cols < H
    offs = gate[:, None] * H + cols[None, :]
    mask = (gate[:, None] < 4) & col_ok[None, :]
    clip = tl.load(SCALARS)
    eps = tl.load(SCALARS + 1)
    # the forward again, from the saved pre-norm gates
    a = tl.load(A + row * 4 * H + offs, mask=mask, other=0.0)
    gamma = tl.load(GAMMA + d * 4 * H + offs, mask=mask, other=0.0)
    beta = tl.load(BETA + d * 4 * H + offs, mask=mask, other=0.0)
    xhat, rstd, i, f, o, j = _gates(a, gamma, beta, gate, mask, eps, H)
    c_prev = tl.load(C_PREV + row * H + cols, mask=col_ok, other=0.0)
    c_raw = f * c_prev + i * j
    c = c_raw
    if CLIP:
        c = tl.minimum(tl.maximum(c, -clip), clip)
    # the gradients
    dh = tl.load(DH + row * H + cols, mask=col_ok, other=0.0) + tl.load(
        D_OUT + row * H + cols, mask=col_ok, other=0.0
    )
    dc_in = tl.load(DC + row * H + cols, mask=col_ok, other=0.0)
    dh_cell = dh
    dc = dc_in
    if HAS_PAD:  # a padded step copied (h, c) through: so does its gradient
        p = tl.load(PAD + row) != 0
        dh_cell = tl.where(p, 0.0, dh)
        dc = tl.where(p, 0.0, dc_in)
    if OUTPUT_TANH:  # h = o * tanh(c)
        tc = _tanh(c)
        do = dh_cell * tc
        dc = dc + dh_cell * o * (1.0 - tc * tc)
    else:  # h = o * c
        do = dh_cell * c
        dc = dc + dh_cell * o
    if CLIP:  # clamp passes the gradient only where it did not clip
        dc = tl.where(tl.abs(c_raw) <= clip, dc, 0.0)
    # c = f * c_prev + i * j; sigmoid' = s (1 - s), tanh' = 1 - j^2
    dgi = dc * j * (i - i * i)
    dgf = dc * c_prev * (f - f * f)
    dgo = do * (o - o * o)
    dgj = dc * i * (1.0 - j * j)
    dg = tl.where(
        gate[:, None] == 0,
        dgi[None, :],
        tl.where(
            gate[:, None] == 1,
            dgf[None, :],
            tl.where(gate[:, None] == 2, dgo[None, :], dgj[None, :]),
        ),
    )
    dg = tl.where(mask, dg, 0.0)
    # g = gamma * LN(a) + beta, per gate: da = rstd * (dx - mean(dx) - xhat * mean(dx * xhat))
    dx = dg * gamma
    m1 = tl.sum(dx, axis=1) / H
    m2 = tl.sum(dx * xhat, axis=1) / H
    da = rstd[:, None] * (dx - m1[:, None] - xhat * m2[:, None])
    tl.store(DA + row * 4 * H + offs, da, mask=mask)
    tl.store(DG + row * 4 * H + offs, dg, mask=mask)
    tl.store(DGX + row * 4 * H + offs, dg * xhat, mask=mask)
    dc_prev = dc * f
    dh_skip = dh * 0.0
    if HAS_PAD:
        dc_prev = tl.where(p, dc_in, dc_prev)
        dh_skip = tl.where(p, dh, 0.0)
    tl.store(DC + row * H + cols, dc_prev, mask=col_ok)
    tl.store(DH + row * H + cols, dh_skip, mask=col_ok)


def check_device(x: Tensor):
    """Triton needs a CUDA tensor, or its interpreter."""
    _check_device(x, OPTION, "LayerNormLSTM(impl='triton')")


_SCALARS: Dict[Tuple, Tensor] = {}


def _scalars(cell_clip: float, eps: float, like: Tensor) -> Tensor:
    """(cell_clip, eps) as a tensor of the compute dtype (so that float64 clips at exactly
    cell_clip), cached: no host-to-device copy per call."""
    key = (float(cell_clip), float(eps), like.dtype, like.device)
    t = _SCALARS.get(key)
    if t is None:
        t = _SCALARS[key] = torch.tensor([cell_clip, eps], dtype=like.dtype, device=like.device)
    return t


def _launch_options(H: int) -> Dict:
    """One program holds 4 x BLOCK_H gates: more warps for wider rows (untuned)."""
    block = triton.next_power_of_2(H)
    return {"BLOCK_H": block, "num_warps": 4 if block <= 256 else 8 if block <= 1024 else 16}


def _forward(
    xw: Tensor,
    h0: Tensor,
    c0: Tensor,
    w_hh: Tensor,
    gamma: Tensor,
    beta: Tensor,
    pad: Optional[Tensor],
    cell_clip: float,
    output_tanh: bool,
    eps: float,
    save: bool,
) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
    """The time loop.  Returns hs (T x D x B x H, the outputs), cs (T x D x B x H when ``save``, else
    2 x D x B x H with c_T at [(T - 1) % 2]) and, when ``save``, the pre-norm gates a (T x D x B x 4H)."""
    T, D, B, G = xw.shape
    H = G // 4
    hs = xw.new_empty(T, D, B, H)
    cs = xw.new_empty(T if save else 2, D, B, H)
    a_all = xw.new_empty(T, D, B, G) if save else None
    hu = xw.new_empty(D, B, G)
    scalars = _scalars(cell_clip, eps, xw)
    options = dict(
        HAS_PAD=pad is not None,
        SAVE=save,
        OUTPUT_TANH=bool(output_tanh),
        CLIP=cell_clip > 0,
        **_launch_options(H),
    )
    # the per-step views, made at once (less Python per step: the launches are what a step costs)
    xws, hss, css = xw.unbind(0), hs.unbind(0), cs.unbind(0)
    pads = [scalars] * T if pad is None else pad.unbind(0)
    a_s = a_all.unbind(0) if save else [hu] * T
    h, c = h0, c0
    for t in range(T):
        torch.bmm(h, w_hh, out=hu)
        c_out = css[t] if save else css[t % 2]
        _fwd_step[(B, D)](
            xws[t], hu, h, c, pads[t], gamma, beta, scalars, a_s[t], hss[t], c_out, B, H, **options
        )
        h, c = hss[t], c_out
    return hs, cs, a_all


def _prepare(xw, h, c, w_hh, gamma, beta, pad):
    check_device(xw)
    dtype = xw.dtype
    if dtype not in (torch.float32, torch.float64) or any(
        t.dtype != dtype for t in (h, c, w_hh, gamma, beta)
    ):
        raise TypeError(
            f"the Triton LN-LSTM loop runs in float32 or float64, one dtype for all inputs; got "
            f"{[t.dtype for t in (xw, h, c, w_hh, gamma, beta)]}"
        )
    D, G = w_hh.size(0), w_hh.size(2)
    tensors = [t.contiguous() for t in (xw, h, c, w_hh)]
    tensors += [gamma.reshape(D, G).contiguous(), beta.reshape(D, G).contiguous()]
    if pad is not None:
        pad = pad.reshape(pad.size(0), D, -1).to(torch.uint8).contiguous()  # T x D x B
    return tensors, pad


class TritonLNLSTMRecurrence(torch.autograd.Function):
    """``ln_lstm_recurrence`` (same arguments and results) with the fused kernels, forward and
    backward; float32 or float64 inputs of one dtype, on CUDA (or in Triton's interpreter)."""

    @staticmethod
    @custom_fwd
    def forward(ctx, xw, h, c, w_hh, gamma, beta, pad, cell_clip, output_tanh, eps):
        (xw, h0, c0, w, g, bt), pad8 = _prepare(xw, h, c, w_hh, gamma, beta, pad)
        hs, cs, a_all = _forward(xw, h0, c0, w, g, bt, pad8, cell_clip, output_tanh, eps, save=True)
        ctx.save_for_backward(hs, cs, a_all, h0, c0, w, g, bt, pad8)
        ctx.options = (cell_clip, output_tanh, eps)
        ctx.gamma_shape = gamma.shape
        return hs, hs[-1], cs[-1]

    @staticmethod
    @custom_bwd
    def backward(ctx, d_out, dh, dc):
        hs, cs, a_all, h0, c0, w, gamma, beta, pad = ctx.saved_tensors
        cell_clip, output_tanh, eps = ctx.options
        T, D, B, G = a_all.shape
        H = G // 4
        d_out = d_out.contiguous()
        dh = dh.clone(memory_format=torch.contiguous_format)  # both overwritten step by step
        dc = dc.clone(memory_format=torch.contiguous_format)
        da = torch.empty_like(a_all)
        dg = torch.empty_like(a_all)
        dgx = torch.empty_like(a_all)
        w_t = w.transpose(1, 2).contiguous()
        scalars = _scalars(cell_clip, eps, a_all)
        options = dict(
            HAS_PAD=pad is not None,
            OUTPUT_TANH=bool(output_tanh),
            CLIP=cell_clip > 0,
            **_launch_options(H),
        )
        d_outs, a_s, das, dgs, dgxs = (
            d_out.unbind(0),
            a_all.unbind(0),
            da.unbind(0),
            dg.unbind(0),
            dgx.unbind(0),
        )
        c_prevs = (c0,) + cs.unbind(0)[:-1]
        pads = [scalars] * T if pad is None else pad.unbind(0)
        for t in range(T - 1, -1, -1):
            _bwd_step[(B, D)](
                d_outs[t],
                dh,
                dc,
                a_s[t],
                c_prevs[t],
                pads[t],
                gamma,
                beta,
                scalars,
                das[t],
                dgs[t],
                dgxs[t],
                B,
                H,
                **options,
            )
            dh.baddbmm_(das[t], w_t)  # dh_{t-1} = (padded: dh_t) + da_t U^T
        # the weight gradients of all steps at once
        h_prev = torch.cat([h0.unsqueeze(0), hs[:-1]]) if T > 1 else h0.unsqueeze(0)
        d_w = torch.bmm(
            h_prev.transpose(0, 1).reshape(D, T * B, H).transpose(1, 2),
            da.transpose(0, 1).reshape(D, T * B, G),
        )
        d_gamma = dgx.sum((0, 2)).view(ctx.gamma_shape)
        d_beta = dg.sum((0, 2)).view(ctx.gamma_shape)
        return da, dh, dc, d_w, d_gamma, d_beta, None, None, None, None


def _loop(
    xw: Tensor,
    h: Tensor,
    c: Tensor,
    w_hh: Tensor,
    gamma: Tensor,
    beta: Tensor,
    pad: Optional[Tensor],
    cell_clip: float,
    output_tanh: bool,
    eps: float,
) -> Tuple[Tensor, Tensor, Tensor]:
    if torch.is_grad_enabled() and any(t.requires_grad for t in (xw, h, c, w_hh, gamma, beta)):
        return TritonLNLSTMRecurrence.apply(
            xw, h, c, w_hh, gamma, beta, pad, cell_clip, output_tanh, eps
        )
    (xw, h0, c0, w, g, bt), pad8 = _prepare(xw, h, c, w_hh, gamma, beta, pad)
    hs, cs, _ = _forward(xw, h0, c0, w, g, bt, pad8, cell_clip, output_tanh, eps, save=False)
    return hs, hs[-1], cs[(hs.size(0) - 1) % 2]


def recurrence(
    xw: Tensor,
    h: Tensor,
    c: Tensor,
    w_hh: Tensor,
    gamma: Tensor,
    beta: Tensor,
    pad: Optional[Tensor],
    cell_clip: float,
    output_tanh: bool,
    eps: float,
) -> Tuple[Tensor, Tensor, Tensor]:
    """:func:`.ln_lstm.recurrence` (same arguments, results and precision rule: float16/bfloat16
    and autocast run in float32) with the fused Triton kernels."""
    return in_float32_when_reduced(
        _loop, (xw, h, c, w_hh, gamma, beta), pad, cell_clip, output_tanh, eps
    )
