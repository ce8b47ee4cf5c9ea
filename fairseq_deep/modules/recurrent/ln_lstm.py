"""Layer-normalized LSTM with per-gate layer normalization (Chen et al. 2018, Sec. 4.1).

The cell of RNMT+ is lingvo's ``LayerNormalizedLSTMCellSimple`` with ``output_nonlinearity=False``
(layer normalization of Ba et al. 2016, applied to each gate's pre-activation separately):

    [a_i; a_f; a_o; a_j] = W x_t + U h_{t-1}                       (one matmul for all gates)
    g_k  = LN(a_k) * gamma_k + b_k          for k in (i, f, o, j)  (per-gate layer norm)
    c_t  = sigmoid(g_f) * c_{t-1} + sigmoid(g_i) * tanh(g_j)       (clipped to +-cell_clip)
    h_t  = sigmoid(g_o) * c_t                                      ("no non-linearity on the output";
                                                                    tanh(c_t) with output_tanh=True)

Speed: the per-gate layer norm rules out the fused cuDNN/oneDNN LSTM kernel.  What can be done
outside the time loop is: ``W x_t`` for all steps and both directions is one matmul; the loop
itself is a TorchScript function (no Python per step), one ``baddbmm`` per step for all gates of
both directions at once, and one ``layer_norm`` call for the four gates.  Training runs the loop
through ``LNLSTMRecurrence``, a hand-written backward through time: one TorchScript loop back over
the steps (one matmul per step for dh_{t-1}, the layer norm's backward written out), then the
weight gradients of all steps at once (dU: one matmul over T*B rows; d gamma, d beta: one sum),
instead of autograd's ~20 graph nodes and a small dU matmul per step.  Inference (no gradient)
runs the plain loop, which saves nothing.

Precision: in float16 or bfloat16 (``--fp16``, ``--bf16``) and under autocast (``--amp``) the
recurrence runs in float32 (:func:`recurrence`): W x_t and the layer's other matmuls outside the
loop keep the model's precision.

Padding: a padded position leaves (h, c) unchanged and outputs zeros, so a left- or right-padded
sentence gives exactly the states of the unpadded one, in both directions.

``impl="triton"`` (``--rnmt-lstm-impl triton``; issue 16) runs the same loop with one fused Triton
kernel per step, forward and backward (:mod:`.ln_lstm_triton`); ``"loop"`` is the TorchScript loop
above; the default ``"auto"`` takes triton on CUDA when it imports, the loop otherwise
(:mod:`.kernel_choice`; issue 24).
"""

import warnings
from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..common.growth import declare_layer
from ..common.precision import custom_bwd, custom_fwd, in_float32_when_reduced
from .kernel_choice import DEFAULT as DEFAULT_IMPL
from .kernel_choice import IMPLS, scripted
from .kernel_choice import resolve as resolve_impl


def _cell_output(
    i: Tensor,
    f: Tensor,
    o: Tensor,
    j: Tensor,
    h: Tensor,
    c: Tensor,
    p: Optional[Tensor],
    cell_clip: float,
    output_tanh: bool,
) -> Tuple[Tensor, Tensor]:
    """(h_t, c_t) from the activated gates and (h_{t-1}, c_{t-1}); a padded position (p True)
    keeps the old state."""
    new_c = torch.addcmul(f * c, i, j)
    if cell_clip > 0:
        new_c = new_c.clamp(-cell_clip, cell_clip)
    if output_tanh:
        new_h = o * torch.tanh(new_c)
    else:
        new_h = o * new_c
    if p is not None:
        new_c = torch.where(p, c, new_c)
        new_h = torch.where(p, h, new_h)
    return new_h, new_c


def _ln_lstm_recurrence(
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
    """The time loop.  xw: T x D x B x 4H (the input part of the gates, W x_t, per direction D);
    h, c: D x B x H; w_hh: D x H x 4H; gamma, beta: D x 1 x 4H; pad: T x D x B x 1 (True = padding)
    or None.  Returns the outputs T x D x B x H and the last (h, c)."""
    T = xw.size(0)
    D = h.size(0)
    B = h.size(1)
    H = h.size(2)
    outputs: List[Tensor] = []
    for t in range(T):
        gates = torch.baddbmm(xw[t], h, w_hh)
        gates = F.layer_norm(gates.view(D, B, 4, H), [H], None, None, eps).view(D, B, 4 * H)
        gates = torch.addcmul(beta, gates, gamma)
        ifo = torch.sigmoid(gates[:, :, : 3 * H])  # one call for the three sigmoid gates
        i, f, o = ifo.chunk(3, 2)
        j = torch.tanh(gates[:, :, 3 * H :])
        h, c = _cell_output(
            i, f, o, j, h, c, None if pad is None else pad[t], cell_clip, output_tanh
        )
        outputs.append(h)
    return torch.stack(outputs), h, c


def _ln_lstm_forward_saving(
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
) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The loop of ``_ln_lstm_recurrence``, same arithmetic, keeping what the backward needs, all
    direction-first: hs, cs (D x T+1 x B x H, the initial state first), the normalized gates xhat
    (D x T x B x 4H), their 1/std (D x T x B x 4 x 1) and the gate activations (D x T x B x 4H)."""
    T = xw.size(0)
    D = h.size(0)
    B = h.size(1)
    H = h.size(2)
    hs: List[Tensor] = [h]
    cs: List[Tensor] = [c]
    xhats: List[Tensor] = []
    rstds: List[Tensor] = []
    acts: List[Tensor] = []
    for t in range(T):
        a = torch.baddbmm(xw[t], h, w_hh)
        xhat, _, rstd = torch.native_layer_norm(a.view(D, B, 4, H), [H], None, None, eps)
        xhat = xhat.view(D, B, 4 * H)
        gates = torch.addcmul(beta, xhat, gamma)
        act = torch.cat([torch.sigmoid(gates[:, :, : 3 * H]), torch.tanh(gates[:, :, 3 * H :])], 2)
        i, f, o, j = act.chunk(4, 2)
        h, c = _cell_output(
            i, f, o, j, h, c, None if pad is None else pad[t], cell_clip, output_tanh
        )
        hs.append(h)
        cs.append(c)
        xhats.append(xhat)
        rstds.append(rstd)
        acts.append(act)
    return (
        torch.stack(hs, 1),
        torch.stack(cs, 1),
        torch.stack(xhats, 1),
        torch.stack(rstds, 1),
        torch.stack(acts, 1),
    )


def _ln_lstm_backward(
    d_out: Tensor,
    dh: Tensor,
    dc: Tensor,
    cs: Tensor,
    xhats: Tensor,
    rstds: Tensor,
    acts: Tensor,
    w_hh: Tensor,
    gamma: Tensor,
    pad: Optional[Tensor],
    cell_clip: float,
    output_tanh: bool,
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """Backward through time.  d_out: T x D x B x H (gradient of the outputs), dh, dc: D x B x H
    (of the last state).  Returns, direction-first, the gradients of the gate pre-activations
    ``a = W x + U h`` (D x T x B x 4H) and of the post-norm gates ``g`` (D x T x B x 4H), and of
    the initial (h, c)."""
    T = d_out.size(0)
    D = dh.size(0)
    B = dh.size(1)
    H = dh.size(2)
    w_t = w_hh.transpose(1, 2).contiguous()  # a transposed operand makes bmm ~1.5x slower
    das: List[Tensor] = []
    dgs: List[Tensor] = []
    for t in range(T - 1, -1, -1):
        dh = dh + d_out[t]
        act = acts[:, t]
        i, f, o, j = act.chunk(4, 2)
        c_prev = cs[:, t]
        c_new = cs[:, t + 1]
        dh_skip = dh
        dc_skip = dc
        if pad is not None:  # a padded step copied (h, c) through: so does its gradient
            p = pad[t]
            zero = torch.zeros_like(dh)
            dh_skip = torch.where(p, dh, zero)
            dc_skip = torch.where(p, dc, zero)
            dh = torch.where(p, zero, dh)
            dc = torch.where(p, zero, dc)
        if output_tanh:  # h = o * tanh(c)
            tc = torch.tanh(c_new)
            do = dh * tc
            dc = dc + dh * o * (1 - tc * tc)
        else:  # h = o * c
            do = dh * c_new
            dc = torch.addcmul(dc, dh, o)
        if cell_clip > 0:  # clamp passes the gradient only where it did not clip
            dc = dc * (torch.addcmul(f * c_prev, i, j).abs() <= cell_clip)
        # c = f * c_prev + i * j; gate order (i, f, o, j), sigmoid'(x) = s - s^2, tanh'(x) = 1 - j^2
        dg = torch.empty_like(act)
        torch.mul(dc, j, out=dg[:, :, :H])
        torch.mul(dc, c_prev, out=dg[:, :, H : 2 * H])
        dg[:, :, 2 * H : 3 * H] = do
        torch.mul(dc, i, out=dg[:, :, 3 * H :])
        s = act[:, :, : 3 * H]
        dg[:, :, : 3 * H] *= s - s * s
        dg[:, :, 3 * H :] *= 1 - j * j
        # g = gamma * LN(a) + beta, per gate: da = rstd * (dx - mean(dx) - xhat * mean(dx * xhat))
        dx = (dg * gamma).view(D, B, 4, H)
        xhat = xhats[:, t].view(D, B, 4, H)
        da = rstds[:, t] * (
            dx - dx.mean(-1, keepdim=True) - xhat * (dx * xhat).mean(-1, keepdim=True)
        )
        da = da.view(D, B, 4 * H)
        dh = torch.bmm(da, w_t)
        dc = dc * f
        if pad is not None:
            dh = dh + dh_skip
            dc = dc + dc_skip
        das.append(da)
        dgs.append(dg)
    das.reverse()
    dgs.reverse()
    return torch.stack(das, 1), torch.stack(dgs, 1), dh, dc


ln_lstm_recurrence = scripted(_ln_lstm_recurrence)
_forward_saving = scripted(_ln_lstm_forward_saving)
_backward = scripted(_ln_lstm_backward)


class LNLSTMRecurrence(torch.autograd.Function):
    """``ln_lstm_recurrence`` with a hand-written backward through time (same arguments and
    results), for inputs of one dtype; :func:`recurrence` runs it in float32 for reduced-precision
    inputs.  Under CUDA autocast (``--amp``) the loop runs in float32, as the layer norm would."""

    @staticmethod
    @custom_fwd
    def forward(ctx, xw, h, c, w_hh, gamma, beta, pad, cell_clip, output_tanh, eps):
        hs, cs, xhats, rstds, acts = _forward_saving(
            xw, h, c, w_hh, gamma, beta, pad, cell_clip, output_tanh, eps
        )
        ctx.save_for_backward(hs, cs, xhats, rstds, acts, w_hh, gamma, pad)
        ctx.options = (cell_clip, output_tanh)
        return hs[:, 1:].transpose(0, 1), hs[:, -1], cs[:, -1]

    @staticmethod
    @custom_bwd
    def backward(ctx, d_out, dh, dc):
        hs, cs, xhats, rstds, acts, w_hh, gamma, pad = ctx.saved_tensors
        D, T, B, H = xhats.size(0), xhats.size(1), xhats.size(2), hs.size(3)
        das, dgs, dh0, dc0 = _backward(
            d_out, dh, dc, cs, xhats, rstds, acts, w_hh, gamma, pad, *ctx.options
        )
        # the weight gradients of all steps at once
        d_w_hh = torch.bmm(
            hs[:, :-1].reshape(D, T * B, H).transpose(1, 2), das.view(D, T * B, 4 * H)
        )
        dgs = dgs.view(D, T * B, 4 * H)
        d_gamma = (dgs * xhats.view(D, T * B, 4 * H)).sum(1, keepdim=True)
        d_beta = dgs.sum(1, keepdim=True)
        return das.transpose(0, 1), dh0, dc0, d_w_hh, d_gamma, d_beta, None, None, None, None


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
        return LNLSTMRecurrence.apply(xw, h, c, w_hh, gamma, beta, pad, cell_clip, output_tanh, eps)
    return ln_lstm_recurrence(xw, h, c, w_hh, gamma, beta, pad, cell_clip, output_tanh, eps)


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
    """The time loop: through ``LNLSTMRecurrence`` when a gradient is wanted, else the plain loop.

    Mixed precision: with a float16/bfloat16 input (``--fp16``, ``--bf16``) or under autocast
    (``--amp``), the loop runs in float32 with autocast off: the layer-norm statistics, the gates
    and the cell state c_t, which accumulates over all steps, never round to 16 bits, and the
    saved state of the hand-written backward has one dtype on every device (CUDA's layer norm
    returns float32 statistics for half input, which the backward's matmul then refused).  The
    casts are autograd's own, so the gradients come back in each input's dtype.  Outputs return
    in the input's dtype, or in float32 under autocast (as autocast's float32 ops do).  Float32
    and float64 inputs run as they are."""
    return in_float32_when_reduced(
        _loop, (xw, h, c, w_hh, gamma, beta), pad, cell_clip, output_tanh, eps
    )


def _plain_lstm_recurrence(
    xw: Tensor,
    h: Tensor,
    c: Tensor,
    w_hh: Tensor,
    pad: Optional[Tensor],
    cell_clip: float,
    output_tanh: bool,
) -> Tuple[Tensor, Tensor, Tensor]:
    """The time loop without layer norm (``LayerNormLSTM(layer_norm=False)``; Chen et al. Table 4,
    "- Layer Norm"): gates = xw_t + h_{t-1} U, xw already holding W x_t + b; same gate order and
    cell as :func:`_ln_lstm_recurrence`.  Autograd differentiates it."""
    T = xw.size(0)
    H = h.size(2)
    outputs: List[Tensor] = []
    for t in range(T):
        gates = torch.baddbmm(xw[t], h, w_hh)
        ifo = torch.sigmoid(gates[:, :, : 3 * H])
        i, f, o = ifo.chunk(3, 2)
        j = torch.tanh(gates[:, :, 3 * H :])
        h, c = _cell_output(
            i, f, o, j, h, c, None if pad is None else pad[t], cell_clip, output_tanh
        )
        outputs.append(h)
    return torch.stack(outputs), h, c


plain_lstm_recurrence = scripted(_plain_lstm_recurrence)


def triton_recurrence():
    """:func:`.ln_lstm_triton.recurrence`, imported on first use: the package runs without triton."""
    try:
        from .ln_lstm_triton import recurrence as fused
    except ImportError as e:
        raise ImportError(
            f"--rnmt-lstm-impl triton (LayerNormLSTM(impl='triton')) needs the triton package, which did not "
            f"import ({e}): pip install triton (Linux, with a CUDA GPU), or use --rnmt-lstm-impl loop (or "
            f"auto, the default; for a model saved with triton: --model-overrides \"{{'rnmt_lstm_impl': 'loop'}}\")"
        ) from e
    return fused


def plain_recurrence(
    xw: Tensor,
    h: Tensor,
    c: Tensor,
    w_hh: Tensor,
    pad: Optional[Tensor],
    cell_clip: float,
    output_tanh: bool,
) -> Tuple[Tensor, Tensor, Tensor]:
    """:func:`plain_lstm_recurrence` with :func:`recurrence`'s precision rule: in float32 for
    float16/bfloat16 inputs and under autocast, outputs back in the input's dtype (float32 under
    autocast)."""
    return in_float32_when_reduced(
        plain_lstm_recurrence, (xw, h, c, w_hh), pad, cell_clip, output_tanh
    )


class LayerNormLSTM(nn.Module):
    """One LSTM layer of per-gate layer-normalized cells, uni- or bidirectional (the two
    directions' cells run in the same loop).  Input T x B x I; output T x B x (D * H), the forward
    direction's outputs first (Chen et al.: "the outputs of the forward layer and the backward
    layer are concatenated").

    Parameters: ``weight_ih`` (D*4H x I), ``weight_hh`` (D x H x 4H), ``ln_weight`` (gamma, 1 at
    init) and ``bias`` (beta, 0 at init), both D x 4H; gate order (i, f, o, j): the three sigmoid
    gates first, so that one sigmoid call covers them (lingvo orders them j, i, f, o).

    ``layer_norm=False`` (Chen et al. 2018, Table 4, "- Layer Norm"; ``--rnmt-no-layer-norm``):
    the gates are W x_t + U h_{t-1} + b, no layer norm and no ``ln_weight`` (it is None); the loop
    is :func:`plain_recurrence` (autograd's backward).  ``layer_norm=True`` is unchanged.

    ``impl`` (``--rnmt-lstm-impl``): ``"auto"`` (default; :mod:`.kernel_choice`) the fused kernels on
    CUDA when triton imports, the loop otherwise, decided at each call; ``"loop"`` the TorchScript
    loop, ``"triton"`` the fused Triton kernels of :mod:`.ln_lstm_triton` (same arithmetic; CUDA, or
    Triton's CPU interpreter with ``TRITON_INTERPRET=1``).  Without layer norm there is no fused
    kernel: ``layer_norm=False`` runs :func:`plain_recurrence` whatever ``impl`` says.
    """

    impl = "loop"  # the class default: a module pickled before the option existed

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        bidirectional: bool = False,
        cell_clip: float = 0.0,
        output_tanh: bool = False,
        eps: float = 1e-6,
        init_scale: Optional[float] = None,
        layer_norm: bool = True,
        impl: str = DEFAULT_IMPL,
    ):
        super().__init__()
        if impl not in IMPLS:
            raise ValueError(f"--rnmt-lstm-impl {impl!r}: choose one of {', '.join(IMPLS)}")
        if impl == "triton" and layer_norm:
            triton_recurrence()  # a missing triton stops here, not at the first batch
        elif impl == "triton":
            warnings.warn(
                "--rnmt-lstm-impl triton has no kernel for cells without layer norm "
                "(--rnmt-no-layer-norm): they run the loop",
                stacklevel=2,
            )
        self.impl = impl
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.num_directions = 2 if bidirectional else 1
        self.cell_clip = float(cell_clip or 0.0)
        self.output_tanh = output_tanh
        self.eps = eps
        self.use_layer_norm = layer_norm
        D, H = self.num_directions, hidden_size
        self.weight_ih = nn.Parameter(torch.empty(D * 4 * H, input_size))
        self.weight_hh = nn.Parameter(torch.empty(D, H, 4 * H))
        if layer_norm:
            self.ln_weight = nn.Parameter(torch.ones(D, 4 * H))
        else:
            self.register_parameter("ln_weight", None)
        self.bias = nn.Parameter(torch.zeros(D, 4 * H))
        self.reset_parameters(init_scale)

    def reset_parameters(self, init_scale: Optional[float] = None):
        # lingvo's default for RNMT+ is uniform(-0.04, 0.04); torch.nn.LSTM's is 1/sqrt(H).
        bound = init_scale if init_scale is not None else self.hidden_size**-0.5
        nn.init.uniform_(self.weight_ih, -bound, bound)
        nn.init.uniform_(self.weight_hh, -bound, bound)
        if self.ln_weight is not None:
            nn.init.ones_(self.ln_weight)
        nn.init.zeros_(self.bias)

    @property
    def output_size(self) -> int:
        return self.num_directions * self.hidden_size

    def extra_repr(self) -> str:
        return (
            f"{self.input_size}, {self.hidden_size}, directions={self.num_directions}, "
            f"cell_clip={self.cell_clip}, output_tanh={self.output_tanh}"
            + ("" if self.use_layer_norm else ", layer_norm=False")
            + ("" if self.impl == DEFAULT_IMPL else f", impl={self.impl}")
        )

    def _recurrence(self, x: Tensor):
        """The layer-norm loop of ``self.impl`` for ``x``'s device (:func:`.kernel_choice.resolve`)."""
        return recurrence if resolve_impl(self.impl, x) == "loop" else triton_recurrence()

    def zero_state(self, batch_size: int, like: Tensor) -> Tuple[Tensor, Tensor]:
        z = like.new_zeros(self.num_directions, batch_size, self.hidden_size)
        return z, z

    def input_gates(self, x: Tensor) -> Tensor:
        """W x_t for all steps and directions: T x B x I -> T x D x B x 4H (backward direction in
        reversed time)."""
        T, B, _ = x.shape
        D, H = self.num_directions, self.hidden_size
        xw = F.linear(x, self.weight_ih).view(T, B, D, 4 * H).transpose(1, 2)
        if D == 2:
            xw = torch.stack([xw[:, 0], xw[:, 1].flip(0)], dim=1)
        return xw.contiguous()

    def forward(
        self,
        x: Tensor,
        padding_mask: Optional[Tensor] = None,
        state: Optional[Tuple[Tensor, Tensor]] = None,
        xw: Optional[Tensor] = None,
    ) -> Tuple[Tensor, Tuple[Tensor, Tensor]]:
        """x: T x B x I; padding_mask: T x B (True = padding) or None; state: (h, c), each
        D x B x H (zeros when None); xw: precomputed extra input gates T x D x B x 4H added to
        W x_t (a decoder feeds a per-step context through it).

        Returns the output T x B x (D * H) and the last state (h, c)."""
        T, B, _ = x.shape
        D = self.num_directions
        gates_in = self.input_gates(x)
        if xw is not None:
            gates_in = gates_in + xw
        h, c = self.zero_state(B, x) if state is None else state
        pad = None
        if padding_mask is not None and bool(padding_mask.any()):
            p = padding_mask.view(T, 1, B, 1)
            pad = torch.cat([p, p.flip(0)], dim=1) if D == 2 else p
        if self.use_layer_norm:
            out, h, c = self._recurrence(gates_in)(
                gates_in,
                h,
                c,
                self.weight_hh,
                self.ln_weight.unsqueeze(1),
                self.bias.unsqueeze(1),
                pad,
                self.cell_clip,
                self.output_tanh,
                self.eps,
            )
        else:
            out, h, c = plain_recurrence(
                gates_in + self.bias.unsqueeze(1),
                h,
                c,
                self.weight_hh,
                pad,
                self.cell_clip,
                self.output_tanh,
            )
        if D == 2:
            out = torch.cat([out[:, 0], out[:, 1].flip(0)], dim=-1)  # T x B x 2H
        else:
            out = out[:, 0]
        if pad is not None:
            out = out.masked_fill(padding_mask.unsqueeze(-1), 0.0)
        return out, (h, c)

    def step(self, gates_in: Tensor, state: Tuple[Tensor, Tensor]) -> Tuple[Tensor, Tensor]:
        """One step from precomputed input gates (D x B x 4H) and state (h, c): the new (h, c)."""
        if not self.use_layer_norm:
            out, h, c = plain_recurrence(
                (gates_in + self.bias.unsqueeze(1)).unsqueeze(0),
                state[0],
                state[1],
                self.weight_hh,
                None,
                self.cell_clip,
                self.output_tanh,
            )
            return h, c
        out, h, c = self._recurrence(gates_in)(
            gates_in.unsqueeze(0),
            state[0],
            state[1],
            self.weight_hh,
            self.ln_weight.unsqueeze(1),
            self.bias.unsqueeze(1),
            None,
            self.cell_clip,
            self.output_tanh,
            self.eps,
        )
        return h, c


# fairseq-deep-grow (modules/common/growth.py): an LSTM layer has no branch that 0 turns off
declare_layer(
    LayerNormLSTM, identity=lambda layer: "its layers are LSTM layers, which have no zero branch"
)
