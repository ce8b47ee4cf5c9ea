"""The Deep-Att / Deep-ED cell's time loop with one fused Triton kernel per step (issue 16).

``FFLSTMCell(impl="triton")``, ``--deep-att-cell-impl triton``, and the default ``auto`` on CUDA
(:mod:`.kernel_choice`); otherwise the Python loop :func:`.fast_forward_lstm.lstm_recurrence`,
whose arithmetic this module repeats (Zhou et al. 2016, Eq. 4):

    [z, z_rho, z_phi, z_pi] = f_t + h_{t-1} W_r^T                       (one matmul, all four blocks)
    s_t = tanh(z) * sigmoid(z_rho + s_{t-1} theta_rho) + sigmoid(z_phi + s_{t-1} theta_phi) * s_{t-1}
    h_t = tanh(s_t) * sigmoid(z_pi + s_t theta_pi)          (the output gate reads the new s_t)

Forward, per step: one ``addmm`` (f_t + h_{t-1} W_r^T, cuBLAS on a GPU, written where training
keeps it) and one kernel for everything else: the three gates with their peepholes, the tanh of z
and of s_t, the state update and the output.  Training saves the pre-activations [z, z_rho, z_phi,
z_pi] and the states s_t (h_t is the output); the backward recomputes the activations from them.

Backward, per step in reverse: one kernel (the gradients of the four pre-activations, which are the
gradient of f_t, ds_{t-1}, and the step's theta products) and one matmul ``dh_{t-1} = dz_t W_r``;
after the loop the parameter gradients of all steps at once (dW_r: one matmul over T*B rows;
d theta: one sum of the saved products).

The cell has no layer norm, so each (batch row, unit) is independent: the kernels run one program
per BLOCK elements of the B x H state.  They compute in the dtype of their inputs, float32 or
float64: :class:`.fast_forward_lstm.FFLSTMCell` hands them float32 under float16/bfloat16 and
autocast (its :func:`~.fast_forward_lstm.wide_dtype`), as it does the loop.  Triton compiles for
CUDA; on a CPU it runs only in its interpreter (``TRITON_INTERPRET=1`` before triton is imported;
slow, for tests), as for the LN-LSTM kernels of :mod:`.ln_lstm_triton`, with the device check and
activations of :mod:`.triton_common`.
"""

from typing import Dict, Tuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..common.precision import custom_bwd, custom_fwd
from .triton_common import check_device as _check_device
from .triton_common import sigmoid as _sigmoid
from .triton_common import tanh as _tanh

OPTION = "--deep-att-cell-impl"


@triton.jit
def _load_step(Z, S_PREV, THETA, n, H, mask):
    """Element n (= b * H + j) of a step: the pre-activations z, z_rho, z_phi, z_pi (Z: B x 4H),
    s_{t-1} (S_PREV: B x H) and theta_rho, theta_phi, theta_pi (THETA: 3 x H)."""
    b = n // H
    j = n - b * H
    zrow = Z + b * 4 * H + j
    z = tl.load(zrow, mask=mask, other=0.0)
    z_rho = tl.load(zrow + H, mask=mask, other=0.0)
    z_phi = tl.load(zrow + 2 * H, mask=mask, other=0.0)
    z_pi = tl.load(zrow + 3 * H, mask=mask, other=0.0)
    s_prev = tl.load(S_PREV + n, mask=mask, other=0.0)
    th_rho = tl.load(THETA + j, mask=mask, other=0.0)
    th_phi = tl.load(THETA + H + j, mask=mask, other=0.0)
    th_pi = tl.load(THETA + 2 * H + j, mask=mask, other=0.0)
    return b, j, z, z_rho, z_phi, z_pi, s_prev, th_rho, th_phi, th_pi


@triton.jit
def _fwd_step(Z, S_PREV, THETA, S_OUT, H_OUT, N, H, BLOCK: tl.constexpr):
    """One step, elements [pid * BLOCK, pid * BLOCK + BLOCK) of the B x H state.  Z: B x 4H (f_t +
    h_{t-1} W_r^T); S_PREV, S_OUT, H_OUT: B x H; THETA: 3 x H; all contiguous, N = B * H."""
    n = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = n < N
    b, j, z, z_rho, z_phi, z_pi, s_prev, th_rho, th_phi, th_pi = _load_step(
        Z, S_PREV, THETA, n, H, mask
    )
    s = _tanh(z) * _sigmoid(z_rho + s_prev * th_rho) + _sigmoid(z_phi + s_prev * th_phi) * s_prev
    h = _tanh(s) * _sigmoid(z_pi + s * th_pi)
    tl.store(S_OUT + n, s, mask=mask)
    tl.store(H_OUT + n, h, mask=mask)


@triton.jit
def _bwd_step(D_OUT, DH, DS, Z, S_PREV, S, THETA, DZ, DTH, N, H, BLOCK: tl.constexpr):
    """The backward of one step.  Reads the gradient of the step's output (D_OUT) and of its state
    (DH, DS: the carry from step t+1), the saved pre-activations Z and s_{t-1}, s_t; writes dz (DZ,
    B x 4H: the gradient of f_t, and of h_{t-1} W_r^T), the theta products (DTH, B x 3H: dz_rho
    s_{t-1}, dz_phi s_{t-1}, dz_pi s_t) and overwrites DS with ds_{t-1}.  The caller computes
    dh_{t-1} = dz W_r."""
    n = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = n < N
    b, j, z, z_rho, z_phi, z_pi, s_prev, th_rho, th_phi, th_pi = _load_step(
        Z, S_PREV, THETA, n, H, mask
    )
    s = tl.load(S + n, mask=mask, other=0.0)
    # the forward again, from the saved pre-activations
    tz = _tanh(z)
    i = _sigmoid(z_rho + s_prev * th_rho)
    f = _sigmoid(z_phi + s_prev * th_phi)
    ts = _tanh(s)
    o = _sigmoid(z_pi + s * th_pi)
    dh = tl.load(DH + n, mask=mask, other=0.0) + tl.load(D_OUT + n, mask=mask, other=0.0)
    # h = tanh(s) * o, o = sigmoid(z_pi + s theta_pi): s reaches h twice
    dz_pi = dh * ts * (o - o * o)
    ds = tl.load(DS + n, mask=mask, other=0.0) + dh * o * (1.0 - ts * ts) + dz_pi * th_pi
    # s = tanh(z) * i + f * s_prev, i and f read s_prev through their peepholes
    dz = ds * i * (1.0 - tz * tz)
    dz_rho = ds * tz * (i - i * i)
    dz_phi = ds * s_prev * (f - f * f)
    ds_prev = ds * f + dz_rho * th_rho + dz_phi * th_phi
    zrow = DZ + b * 4 * H + j
    tl.store(zrow, dz, mask=mask)
    tl.store(zrow + H, dz_rho, mask=mask)
    tl.store(zrow + 2 * H, dz_phi, mask=mask)
    tl.store(zrow + 3 * H, dz_pi, mask=mask)
    trow = DTH + b * 3 * H + j
    tl.store(trow, dz_rho * s_prev, mask=mask)
    tl.store(trow + H, dz_phi * s_prev, mask=mask)
    tl.store(trow + 2 * H, dz_pi * s, mask=mask)
    tl.store(DS + n, ds_prev, mask=mask)


def check_device(x: Tensor):
    """The LN-LSTM kernels' check (CUDA, or Triton's interpreter), naming this option."""
    _check_device(x, OPTION, "FFLSTMCell(impl='triton')")


def _launch_options(N: int) -> Dict:
    """Elementwise over the N = B x H state: BLOCK elements per program (untuned)."""
    return {"BLOCK": min(1024, triton.next_power_of_2(N)), "num_warps": 4}


def _grid(N: int, options: Dict) -> Tuple[int]:
    return (triton.cdiv(N, options["BLOCK"]),)


def _forward(
    f: Tensor, w_r: Tensor, theta: Tensor, h0: Tensor, s0: Tensor, save: bool
) -> Tuple[Tensor, Tensor, Tensor]:
    """The time loop.  Returns hs (T x B x H, the outputs), ss (T x B x H when ``save``, else
    2 x B x H with s_T at [(T - 1) % 2]) and zs (the pre-activations: T x B x 4H when ``save``,
    else the last step's B x 4H)."""
    T, B, G = f.shape
    H = G // 4
    N = B * H
    hs = f.new_empty(T, B, H)
    ss = f.new_empty(T if save else 2, B, H)
    zs = f.new_empty(T, B, G) if save else f.new_empty(B, G)
    w_t = w_r.t()
    options = _launch_options(N)
    grid = _grid(N, options)
    fs, hss, sss = f.unbind(0), hs.unbind(0), ss.unbind(0)
    z_s = zs.unbind(0) if save else [zs] * T
    h, s = h0, s0
    for t in range(T):
        torch.addmm(fs[t], h, w_t, out=z_s[t])
        s_out = sss[t] if save else sss[t % 2]
        _fwd_step[grid](z_s[t], s, theta, s_out, hss[t], N, H, **options)
        h, s = hss[t], s_out
    return hs, ss, zs


def _prepare(f, w_r, theta, h, s):
    check_device(f)
    dtype = f.dtype
    tensors = (f, w_r, theta, h, s)
    if dtype not in (torch.float32, torch.float64) or any(t.dtype != dtype for t in tensors):
        raise TypeError(
            f"the Triton Deep-Att cell runs in float32 or float64, one dtype for all inputs (FFLSTMCell "
            f"hands it float32 under float16/bfloat16 and autocast); got {[t.dtype for t in tensors]}"
        )
    return [t.contiguous() for t in tensors]


class TritonFFLSTMRecurrence(torch.autograd.Function):
    """``lstm_recurrence`` (same arguments and results) with the fused kernels, forward and
    backward; float32 or float64 inputs of one dtype, on CUDA (or in Triton's interpreter)."""

    @staticmethod
    @custom_fwd
    def forward(ctx, f, w_r, theta, h, s):
        f, w_r, theta, h0, s0 = _prepare(f, w_r, theta, h, s)
        hs, ss, zs = _forward(f, w_r, theta, h0, s0, save=True)
        ctx.save_for_backward(hs, ss, zs, w_r, theta, h0, s0)
        return hs, hs[-1], ss[-1]

    @staticmethod
    @custom_bwd
    def backward(ctx, d_out, dh, ds):
        hs, ss, zs, w_r, theta, h0, s0 = ctx.saved_tensors
        T, B, G = zs.shape
        H = G // 4
        N = B * H
        d_out = d_out.contiguous()
        dh = dh.clone(memory_format=torch.contiguous_format)  # both overwritten step by step
        ds = ds.clone(memory_format=torch.contiguous_format)
        dz = torch.empty_like(zs)
        dth = zs.new_empty(T, B, 3 * H)
        options = _launch_options(N)
        grid = _grid(N, options)
        d_outs, z_s, s_s, dzs, dths = (
            d_out.unbind(0),
            zs.unbind(0),
            ss.unbind(0),
            dz.unbind(0),
            dth.unbind(0),
        )
        s_prevs = (s0,) + s_s[:-1]
        for t in range(T - 1, -1, -1):
            _bwd_step[grid](
                d_outs[t],
                dh,
                ds,
                z_s[t],
                s_prevs[t],
                s_s[t],
                theta,
                dzs[t],
                dths[t],
                N,
                H,
                **options,
            )
            torch.mm(dzs[t], w_r, out=dh)  # dh_{t-1} = dz_t W_r
        # the parameter gradients of all steps at once
        h_prev = torch.cat([h0.unsqueeze(0), hs[:-1]]) if T > 1 else h0.unsqueeze(0)
        d_w = torch.mm(dz.view(T * B, G).t(), h_prev.reshape(T * B, H))
        d_theta = dth.sum((0, 1)).view(3, H)
        return dz, d_w, d_theta, dh, ds


def recurrence(
    f: Tensor, w_r: Tensor, theta: Tensor, h: Tensor, s: Tensor
) -> Tuple[Tensor, Tensor, Tensor]:
    """:func:`.fast_forward_lstm.lstm_recurrence` (same arguments and results: h of every step
    T x B x H, the final h and s) with the fused Triton kernels; float32 or float64."""
    if torch.is_grad_enabled() and any(t.requires_grad for t in (f, w_r, theta, h, s)):
        return TritonFFLSTMRecurrence.apply(f, w_r, theta, h, s)
    f, w_r, theta, h0, s0 = _prepare(f, w_r, theta, h, s)
    hs, ss, _ = _forward(f, w_r, theta, h0, s0, save=False)
    return hs, hs[-1], ss[(hs.size(0) - 1) % 2]
