"""LSTM stacks with fast-forward connections (Zhou, Cao, Wang, Li, Xu, TACL 2016, Sec. 3.1).

* :class:`FFLSTMCell` is the "r" block of Eq. 4: it takes the feed-forward block f_t = [z, z_rho,
  z_phi, z_pi] directly (no input matrix), has the recurrent matrix W_r and the peephole-like
  vectors theta_rho, theta_phi, theta_pi; sigmoid gates, tanh input and output activations.
* :class:`FFLSTMLayer` is one layer: the "f" block W_f (applied to all time steps at once) and the
  cell, run forward or backward (Eq. 3, direction term (-1)^k) over right-padded sequences.
* :class:`FFLSTMStack` stacks layers with the fast-forward input of Eq. 6,
  f^k = W_f^k [Half(f^{k-1}), Dr(h^{k-1})] (``ff_mode="half"``), the whole f (``"whole"``, Eq. 5) or
  no F-F connection at all (``"none"``: f^k = W_f^k Dr(h^{k-1}), the standard stacked LSTM).

Recurrent parameters (W_r, theta) carry ``param_group = "recurrent"``; :mod:`fairseq_deep.optim.
deep_att_optimizer` gives them their own learning rate (Sec. 4.3).

Precision: the F-F path f^k = W_f^k [Half(f^{k-1}), Dr(h^{k-1})] is linear, nothing squashes it,
and at the paper's settings (N(0, 0.07^2) init, input width 3H = 1536) each layer multiplies the
variance of f by about 0.07^2 * 2H = 5.  Measured at initialisation (512 cells, Multi30k batch):
max |f| grows from 0.5 (encoder layer 1) to 4e2 (layer 9); Deep-ED's decoder, fed Max_t f, reaches
2.1e3 at its layer 1 and 2.3e5 at layer 7, beyond float16 (65504): in float16 f becomes inf at
decoder layer 6 and NaN from layer 7 on, so --fp16 and --amp could not train Deep-ED at all
(Deep-Att 9/7: 3.1e5 at decoder layer 7, inf from layer 5).  So
with float16/bfloat16 inputs (``--fp16``, ``--bf16``) or under autocast (``--amp``) the layers
compute in float32 with autocast off (:func:`wide_dtype`, :func:`no_autocast`, :func:`wide_linear`):
W_f, the recurrence of Eq. 4 (its cell state s sums over steps) and everything derived from f.
Their outputs stay float32; h lies in [-1, 1], and a caller may cast it back for the softmax.  The
casts are autograd's, so the gradients come back in each parameter's dtype.  Float32 and float64
inputs run exactly as before.  The gradients grow with depth too (W_f^T in the backward is as large
as W_f): unscaled, those of the bottom W_f biases, the embeddings and the attention's key projection
pass float16's range, so float16 parameters made fairseq's loss scale collapse (issue 24).  The
Deep-Att model therefore keeps every parameter but its output projection float32 under ``.half()``
(:class:`.precision.Float32UnderHalf`).

``impl="triton"`` (``--deep-att-cell-impl triton``; issue 16) runs the recurrence of Eq. 4 with one
fused Triton kernel per step, forward and backward (:mod:`.ff_lstm_triton`), on the same float32
tensors; ``"loop"`` is :func:`lstm_recurrence` (in training with the hand-written backward of
:class:`FFLSTMRecurrence`); the default ``"auto"`` takes triton on CUDA when it imports, the loop
otherwise (:mod:`.kernel_choice`; issue 24).
"""

from typing import Callable, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..common.growth import declare_layer
from ..common.precision import REDUCED, autocast_enabled, custom_bwd, custom_fwd, no_autocast
from .kernel_choice import DEFAULT as DEFAULT_IMPL
from .kernel_choice import IMPLS, scripted
from .kernel_choice import resolve as resolve_impl

FF_MODES = ("half", "whole", "none")
RECURRENT = "recurrent"


def wide_dtype(x: Tensor) -> torch.dtype:
    """The dtype the F-F path computes in: float32 for a float16/bfloat16 ``x`` or under autocast
    (see the module docstring), ``x``'s own dtype otherwise."""
    if x.dtype in REDUCED or (x.dtype == torch.float32 and autocast_enabled(x.device.type)):
        return torch.float32
    return x.dtype


def with_dtype(module: nn.Module, dtype: torch.dtype) -> Callable:
    """``module`` itself, or (parameters of another dtype, e.g. float16 under --fp16) a function
    calling it with its parameters cast to ``dtype``; the gradients flow back to the parameters."""
    if all(p.dtype == dtype for p in module.parameters()):
        return module
    params = {n: p.to(dtype) for n, p in module.named_parameters()}
    return lambda *args: torch.func.functional_call(module, params, args)


def wide_linear(layer: nn.Module, x: Tensor) -> Tensor:
    """``layer(x)`` in :func:`wide_dtype` of ``x``, autocast off (plainly ``layer(x)`` in float32)."""
    dt = wide_dtype(x)
    with no_autocast(x):
        return with_dtype(layer, dt)(x.to(dt))


def mark(param: nn.Parameter, group: str) -> nn.Parameter:
    """Tag a parameter with its optimizer group (the attribute fairseq's composite optimizer reads)."""
    param.param_group = group
    return param


def lstm_recurrence(
    f: Tensor, w_r: Tensor, theta: Tensor, h: Tensor, s: Tensor
) -> Tuple[Tensor, Tensor, Tensor]:
    """Eq. 4 over T steps: f (T x B x 4H), w_r (4H x H), theta (3 x H), state h, s (B x H).

    One matmul per step for all four blocks of W_r.  Returns h of every step (T x B x H) and the
    final (h, s)."""
    w_t = w_r.t()
    th_rho, th_phi, th_pi = theta[0], theta[1], theta[2]
    outs: List[Tensor] = []
    for t in range(f.size(0)):
        z, z_rho, z_phi, z_pi = torch.addmm(f[t], h, w_t).chunk(4, dim=-1)
        s = (
            torch.tanh(z) * torch.sigmoid(z_rho + s * th_rho)
            + torch.sigmoid(z_phi + s * th_phi) * s
        )
        h = torch.tanh(s) * torch.sigmoid(z_pi + s * th_pi)
        outs.append(h)
    return torch.stack(outs), h, s


def _forward_saving(
    f: Tensor, w_r: Tensor, theta: Tensor, h: Tensor, s: Tensor
) -> Tuple[Tensor, Tensor, Tensor]:
    """:func:`lstm_recurrence`'s arithmetic, op for op (the same values, bit for bit), keeping what
    the backward needs: hs and ss (T+1 x B x H, the initial state first) and the activations
    [tanh z, sigmoid rho, sigmoid phi, sigmoid pi] of every step (T x B x 4H)."""
    w_t = w_r.t()
    H = h.size(1)
    th_rho, th_phi, th_pi = theta[0], theta[1], theta[2]
    hs: List[Tensor] = [h]
    ss: List[Tensor] = [s]
    acts: List[Tensor] = []
    for t in range(f.size(0)):
        a = torch.addmm(f[t], h, w_t)
        g = torch.tanh(a[:, :H])
        i = torch.sigmoid(a[:, H : 2 * H] + s * th_rho)
        fg = torch.sigmoid(a[:, 2 * H : 3 * H] + s * th_phi)
        s = g * i + fg * s
        o = torch.sigmoid(a[:, 3 * H :] + s * th_pi)
        h = torch.tanh(s) * o
        hs.append(h)
        ss.append(s)
        acts.append(torch.cat([g, i, fg, o], 1))
    return torch.stack(hs), torch.stack(ss), torch.stack(acts)


def _backward(
    d_out: Tensor, dh: Tensor, ds: Tensor, ss: Tensor, acts: Tensor, w_r: Tensor, theta: Tensor
) -> Tuple[Tensor, Tensor, Tensor]:
    """Backward through time of Eq. 4: the gradients of the pre-activations a = f_t + W_r h_{t-1}
    of every step (T x B x 4H, which is also df) and of the initial (h, s).  Per step, with
    s_t = g i + fg s_{t-1}, h_t = tanh(s_t) o (o's peephole reads s_t, i's and fg's s_{t-1})."""
    H = dh.size(1)
    th_rho, th_phi, th_pi = theta[0], theta[1], theta[2]
    das: List[Tensor] = []
    for t in range(acts.size(0) - 1, -1, -1):
        dh = dh + d_out[t]
        act = acts[t]
        g, i, fg, o = act[:, :H], act[:, H : 2 * H], act[:, 2 * H : 3 * H], act[:, 3 * H :]
        s_prev = ss[t]
        ts = torch.tanh(ss[t + 1])
        da_pi = dh * ts * o * (1 - o)
        ds = ds + dh * o * (1 - ts * ts) + da_pi * th_pi
        da_rho = ds * g * i * (1 - i)
        da_phi = ds * s_prev * fg * (1 - fg)
        da = torch.cat([ds * i * (1 - g * g), da_rho, da_phi, da_pi], 1)
        ds = ds * fg + da_rho * th_rho + da_phi * th_phi
        dh = torch.mm(da, w_r)
        das.append(da)
    das.reverse()
    return torch.stack(das), dh, ds


_forward_saving_scripted = scripted(_forward_saving)
_backward_scripted = scripted(_backward)


class FFLSTMRecurrence(torch.autograd.Function):
    """:func:`lstm_recurrence` with a hand-written backward through time (same arguments and
    results, the same forward values): one TorchScript loop back over the steps (one matmul per
    step for dh_{t-1}), then dW_r in one matmul over T*B rows and d theta in one sum, instead of
    autograd's ~30 graph nodes per step (a layer's fwd+bwd on a CPU: 0.37x -> 0.42x of nn.LSTM's at
    H 512, docs/deep_att.md).  Inputs of one dtype: :class:`FFLSTMCell` hands it float32 (or
    float64) with autocast off."""

    @staticmethod
    @custom_fwd
    def forward(ctx, f, w_r, theta, h, s):
        hs, ss, acts = _forward_saving_scripted(f, w_r, theta, h, s)
        ctx.save_for_backward(hs, ss, acts, w_r, theta)
        return hs[1:], hs[-1], ss[-1]

    @staticmethod
    @custom_bwd
    def backward(ctx, d_out, dh, ds):
        hs, ss, acts, w_r, theta = ctx.saved_tensors
        das, dh0, ds0 = _backward_scripted(d_out, dh, ds, ss, acts, w_r, theta)
        T, B, G = das.shape
        H = G // 4
        d_w_r = das.reshape(T * B, G).t().mm(hs[:-1].reshape(T * B, H))
        s_prev, s_new = ss[:-1], ss[1:]
        d_theta = torch.stack(
            [
                (das[..., H : 2 * H] * s_prev).sum((0, 1)),
                (das[..., 2 * H : 3 * H] * s_prev).sum((0, 1)),
                (das[..., 3 * H :] * s_new).sum((0, 1)),
            ]
        )
        return das, d_w_r, d_theta, dh0, ds0


def loop_recurrence(
    f: Tensor, w_r: Tensor, theta: Tensor, h: Tensor, s: Tensor
) -> Tuple[Tensor, Tensor, Tensor]:
    """The ``loop`` implementation: :class:`FFLSTMRecurrence` when a gradient is wanted, else
    :func:`lstm_recurrence` itself (inference saves nothing)."""
    if torch.is_grad_enabled() and any(t.requires_grad for t in (f, w_r, theta, h, s)):
        return FFLSTMRecurrence.apply(f, w_r, theta, h, s)
    return lstm_recurrence(f, w_r, theta, h, s)


def triton_recurrence() -> Callable:
    """:func:`.ff_lstm_triton.recurrence`, imported on first use: the package runs without triton."""
    try:
        from .ff_lstm_triton import recurrence as fused
    except ImportError as e:
        raise ImportError(
            f"--deep-att-cell-impl triton (FFLSTMCell(impl='triton')) needs the triton package, which did not "
            f"import ({e}): pip install triton (Linux, with a CUDA GPU), or use --deep-att-cell-impl loop (or "
            f"auto, the default; for a model saved with triton: --model-overrides \"{{'deep_att_cell_impl': 'loop'}}\")"
        ) from e
    return fused


class FFLSTMCell(nn.Module):
    """(h_t, s_t) = LSTM(f_t, h_{t-1}, s_{t-1}) of Eq. 4.  Parameters start at zero (Sec. 4.3).

    ``impl`` (``--deep-att-cell-impl``): ``"auto"`` (default; :mod:`.kernel_choice`) triton on CUDA when
    it imports, the loop otherwise, decided at each call; ``"loop"`` :func:`lstm_recurrence`, ``"triton"``
    the fused kernels of :mod:`.ff_lstm_triton` (same arithmetic; CUDA, or Triton's CPU interpreter
    with ``TRITON_INTERPRET=1``)."""

    impl = "loop"  # the class default: a module pickled before the option existed

    def __init__(self, hidden_size: int, impl: str = DEFAULT_IMPL):
        super().__init__()
        if impl not in IMPLS:
            raise ValueError(f"--deep-att-cell-impl {impl!r}: choose one of {', '.join(IMPLS)}")
        if impl == "triton":
            triton_recurrence()  # a missing triton stops here, not at the first batch
        self.impl = impl
        self.hidden_size = hidden_size
        self.weight_r = mark(nn.Parameter(torch.zeros(4 * hidden_size, hidden_size)), RECURRENT)
        # rows: theta_rho (input gate), theta_phi (forget gate), theta_pi (output gate)
        self.theta = mark(nn.Parameter(torch.zeros(3, hidden_size)), RECURRENT)

    def extra_repr(self) -> str:
        return "" if self.impl == DEFAULT_IMPL else f"impl={self.impl}"

    def zero_state(self, bsz: int, like: Tensor) -> Tuple[Tensor, Tensor]:
        z = like.new_zeros(bsz, self.hidden_size)
        return z, z

    def forward(self, f: Tensor, state: Optional[Tuple[Tensor, Tensor]] = None):
        """f: T x B x 4H.  Returns (h of all steps, (h_T, s_T))."""
        h, s = state if state is not None else self.zero_state(f.size(1), f)
        dt = wide_dtype(f)
        loop = loop_recurrence if resolve_impl(self.impl, f) == "loop" else triton_recurrence()
        with no_autocast(f):
            out, h, s = loop(f.to(dt), self.weight_r.to(dt), self.theta.to(dt), h.to(dt), s.to(dt))
        return out, (h, s)


def reverse_index(lengths: Tensor, max_len: int) -> Tensor:
    """T x B index that reverses each right-padded sequence within its length and leaves the pad
    positions where they are (an involution: applying it twice is the identity)."""
    t = torch.arange(max_len, device=lengths.device)[:, None]
    rev = lengths[None, :] - 1 - t
    return torch.where(rev >= 0, rev, t)


def gather_time(x: Tensor, index: Tensor) -> Tensor:
    """x: T x B x C, index: T x B -> x[index[t, b], b]."""
    return x.gather(0, index[:, :, None].expand(-1, -1, x.size(-1)))


class FFLSTMLayer(nn.Module):
    """The f block (W_f, with the bias) and the r block (Eq. 4) of one layer, in one direction."""

    def __init__(
        self, input_size: int, hidden_size: int, reverse: bool = False, impl: str = DEFAULT_IMPL
    ):
        super().__init__()
        self.input_size, self.hidden_size, self.reverse = input_size, hidden_size, reverse
        self.proj = nn.Linear(input_size, 4 * hidden_size)  # W_f
        self.cell = FFLSTMCell(hidden_size, impl=impl)

    def forward(self, x: Tensor, rev_index: Optional[Tensor] = None, state=None):
        """x: T x B x input_size, right-padded; rev_index from :func:`reverse_index` (needed when
        the layer runs backward).  Returns f (T x B x 4H), h (T x B x H) in input order, and the
        final state (h, s) of the recurrence (polluted by trailing pads in padded batches), all
        in :func:`wide_dtype` of x."""
        f = wide_linear(self.proj, x)
        if self.reverse:
            if rev_index is None:
                rev_index = reverse_index(
                    x.new_full((x.size(1),), x.size(0), dtype=torch.long), x.size(0)
                )
            h, state = self.cell(gather_time(f, rev_index), state)
            h = gather_time(h, rev_index)
        else:
            h, state = self.cell(f, state)
        return f, h, state


# fairseq-deep-grow (modules/common/growth.py): a copy runs in the direction of its place (Deep-Att's
# interleaved encoder alternates them); an LSTM layer has no branch that 0 turns off
declare_layer(
    FFLSTMLayer,
    role=lambda layer: layer.reverse,
    identity=lambda layer: "its layers are F-F LSTM layers, which have no zero branch",
)


def ff_input(f_prev: Tensor, h_prev: Tensor, ff_mode: str) -> Tensor:
    """Input of W_f^k for k > 1 (Eq. 6): [Half(f^{k-1}), h^{k-1}] ("half": the FIRST half of the
    elements of f, i.e. [z, z_rho]), [f^{k-1}, h^{k-1}] ("whole", Eq. 5) or h^{k-1} ("none").
    h_prev is already dropped out (Dr)."""
    if ff_mode == "half":
        return torch.cat([f_prev[..., : f_prev.size(-1) // 2], h_prev], dim=-1)
    if ff_mode == "whole":
        return torch.cat([f_prev, h_prev], dim=-1)
    return h_prev


def ff_input_size(hidden_size: int, ff_mode: str) -> int:
    return {"half": 2 * hidden_size, "whole": 4 * hidden_size, "none": 0}[ff_mode] + hidden_size


class FFLSTMStack(nn.Module):
    """A column of LSTM layers joined by F-F connections (Eq. 5, 6).

    ``directions``: one bool per layer, True = the layer runs backward.  For the interleaved
    bi-directional encoder (Eq. 3) layer k of column 1 runs forward when k is odd; the paper's
    direction term (-1)^k.  Dropout (Dr) is applied to h where it leaves the layer.  ``impl``:
    every cell's recurrence (:class:`FFLSTMCell`)."""

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        directions: List[bool],
        ff_mode: str = "half",
        dropout: float = 0.0,
        impl: str = DEFAULT_IMPL,
    ):
        super().__init__()
        if ff_mode not in FF_MODES:
            raise ValueError(f"--ff-mode must be one of {FF_MODES}, got {ff_mode!r}")
        self.hidden_size, self.ff_mode, self.dropout = hidden_size, ff_mode, dropout
        sizes = [input_size] + [ff_input_size(hidden_size, ff_mode)] * (len(directions) - 1)
        self.layers = nn.ModuleList(
            FFLSTMLayer(n, hidden_size, reverse=r, impl=impl) for n, r in zip(sizes, directions)
        )

    def drop(self, h: Tensor) -> Tensor:
        return F.dropout(h, p=self.dropout, training=self.training)

    def forward(
        self, x: Optional[Tensor], lengths: Optional[Tensor] = None, states=None, first=None
    ):
        """x: T x B x C right-padded (lengths: B).  ``states``: one (h, s) per layer, or None.
        ``first``: (f, h, state) of layer 1 when the caller ran it itself (the Deep-Att decoder,
        whose layer-1 input depends on its own previous output); x is then ignored.

        Returns the top f, the top h (not dropped), the final state of every layer, and ``last_h``
        (B x H): the top layer's h at the last real step of its processing order; all in
        :func:`wide_dtype` of the input (float32 for float16/bfloat16 input)."""
        T = x.size(0) if first is None else first[0].size(0)
        rev = (
            reverse_index(lengths, T)
            if lengths is not None and any(layer.reverse for layer in self.layers)
            else None
        )
        new_states = []
        f = h = None
        for k, layer in enumerate(self.layers):
            if k == 0 and first is not None:
                f, h, st = first
            else:
                state = states[k] if states is not None else None
                inp = x if k == 0 else ff_input(f, self.drop(h), self.ff_mode)
                f, h, st = layer(inp, rev, state)
            new_states.append(st)
        if lengths is None:
            last_h = new_states[-1][0]
        else:
            last = (lengths - 1) if not self.layers[-1].reverse else torch.zeros_like(lengths)
            last_h = h.gather(0, last[None, :, None].expand(1, -1, h.size(-1)))[0]
        return f, h, new_states, last_h
