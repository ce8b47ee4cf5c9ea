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
both directions at once, and one ``layer_norm`` call for the four gates.

Padding: a padded position leaves (h, c) unchanged and outputs zeros, so a left- or right-padded
sentence gives exactly the states of the unpadded one, in both directions.
"""

import warnings
from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn


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
        ifo = torch.sigmoid(gates[:, :, :3 * H])  # one call for the three sigmoid gates
        i, f, o = ifo.chunk(3, 2)
        j = torch.tanh(gates[:, :, 3 * H:])
        new_c = torch.addcmul(f * c, i, j)
        if cell_clip > 0:
            new_c = new_c.clamp(-cell_clip, cell_clip)
        if output_tanh:
            new_h = o * torch.tanh(new_c)
        else:
            new_h = o * new_c
        if pad is not None:
            p = pad[t]
            new_c = torch.where(p, c, new_c)
            new_h = torch.where(p, h, new_h)
        outputs.append(new_h)
        h = new_h
        c = new_c
    return torch.stack(outputs), h, c


def _script(fn):
    """TorchScript the loop (no Python per step); eager where TorchScript is unavailable."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # torch >= 2.9 deprecates it
            return torch.jit.script(fn)
    except Exception:  # pragma: no cover - a torch without TorchScript
        return fn


ln_lstm_recurrence = _script(_ln_lstm_recurrence)


class LayerNormLSTM(nn.Module):
    """One LSTM layer of per-gate layer-normalized cells, uni- or bidirectional (the two
    directions' cells run in the same loop).  Input T x B x I; output T x B x (D * H), the forward
    direction's outputs first (Chen et al.: "the outputs of the forward layer and the backward
    layer are concatenated").

    Parameters: ``weight_ih`` (D*4H x I), ``weight_hh`` (D x H x 4H), ``ln_weight`` (gamma, 1 at
    init) and ``bias`` (beta, 0 at init), both D x 4H; gate order (i, f, o, j): the three sigmoid
    gates first, so that one sigmoid call covers them (lingvo orders them j, i, f, o).
    """

    def __init__(self, input_size: int, hidden_size: int, bidirectional: bool = False,
                 cell_clip: float = 0.0, output_tanh: bool = False, eps: float = 1e-6,
                 init_scale: Optional[float] = None):
        super().__init__()
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.num_directions = 2 if bidirectional else 1
        self.cell_clip = float(cell_clip or 0.0)
        self.output_tanh = output_tanh
        self.eps = eps
        D, H = self.num_directions, hidden_size
        self.weight_ih = nn.Parameter(torch.empty(D * 4 * H, input_size))
        self.weight_hh = nn.Parameter(torch.empty(D, H, 4 * H))
        self.ln_weight = nn.Parameter(torch.ones(D, 4 * H))
        self.bias = nn.Parameter(torch.zeros(D, 4 * H))
        self.reset_parameters(init_scale)

    def reset_parameters(self, init_scale: Optional[float] = None):
        # lingvo's default for RNMT+ is uniform(-0.04, 0.04); torch.nn.LSTM's is 1/sqrt(H).
        bound = init_scale if init_scale is not None else self.hidden_size ** -0.5
        nn.init.uniform_(self.weight_ih, -bound, bound)
        nn.init.uniform_(self.weight_hh, -bound, bound)
        nn.init.ones_(self.ln_weight)
        nn.init.zeros_(self.bias)

    @property
    def output_size(self) -> int:
        return self.num_directions * self.hidden_size

    def extra_repr(self) -> str:
        return (f"{self.input_size}, {self.hidden_size}, directions={self.num_directions}, "
                f"cell_clip={self.cell_clip}, output_tanh={self.output_tanh}")

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

    def forward(self, x: Tensor, padding_mask: Optional[Tensor] = None,
                state: Optional[Tuple[Tensor, Tensor]] = None,
                xw: Optional[Tensor] = None) -> Tuple[Tensor, Tuple[Tensor, Tensor]]:
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
        out, h, c = ln_lstm_recurrence(
            gates_in, h, c, self.weight_hh, self.ln_weight.unsqueeze(1), self.bias.unsqueeze(1),
            pad, self.cell_clip, self.output_tanh, self.eps,
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
        out, h, c = ln_lstm_recurrence(
            gates_in.unsqueeze(0), state[0], state[1], self.weight_hh,
            self.ln_weight.unsqueeze(1), self.bias.unsqueeze(1), None, self.cell_clip,
            self.output_tanh, self.eps,
        )
        return h, c
