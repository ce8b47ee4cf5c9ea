"""Hyper-connections (Zhu, Huang, Huang, Zeng, Mao, Wu, Min, Zhou, ICLR 2025, "Hyper-Connections")
and manifold-constrained hyper-connections (Xie, Wei, Cao et al., DeepSeek-AI 2025, "mHC:
Manifold-Constrained Hyper-Connections").

The residual stream is widened to n streams H = [h_1 .. h_n] (n x d; H^0 = n copies of the
embedding), and every sublayer T (self-attention, encoder attention, FFN: the paper's "layers",
each with its pre-norm inside) reads and writes them through a matrix (Zhu et al. Eq. 1-5)::

    HC = [[0,   B  ],      h_0 = A_m^T H             (width connection: the sublayer's input)
          [A_m, A_r]]      H'  = B^T T(h_0) + A_r^T H  (depth connection)

A_m (n x 1), A_r (n x n), B (1 x n), stored as one (n+1) x (n+1) parameter ``static`` whose
corner is unused.  Initialisation (Sec. 3.3): A_m = e_{k mod n} for the k-th sublayer of the
stack (counted from 0 over the layers' sublayers), A_r = I, B = 1, so that with n = 1 the stack
*is* the pre-norm Transformer.  The stack's readout is the sum of the last streams, then the
stack's final layer norm (as the paper's "sum of the rows of H").

* **static** (SHC): HC is learned and the same for every token.
* **dynamic** (DHC, Eq. 10-13): with H̄ = LN(H) (per stream),
  B(H) = s_β tanh(H̄ W_β)^T + B, [A_m(H) A_r(H)] = s_α tanh(H̄ [W_m W_r]) + [A_m A_r],
  W initialised to 0 and s_α = s_β = 0.01 (the paper's Algorithm 2), so DHC starts as SHC.
* **mhc** (Xie et al. Sec. 4): the same input-dependent coefficients, without tanh, on an
  RMS-normalised H, then constrained: H_pre = σ(A_m(H)), H_post = 2σ(B(H)), and H_res =
  Sinkhorn-Knopp(A_r(H)) (Eq. 8-9: exp, then rows and columns normalised in turn, ``sinkhorn_iters``
  times, 20 in the paper), a doubly stochastic matrix, so that the residual mixing neither grows
  nor shrinks the streams' mean over depth; scales α_pre, α_res, α_post start at 0.01.  The
  coefficients are computed per stream from that stream's normalised vector, as the
  ``hyper-connections`` package (0.4.11, ``ManifoldConstrainedHyperConnections``) does; the mHC
  paper computes all n^2 + 2n of them from the flattened n·d vector, with one RMSNorm over n·d.
  What this module computes is checked against that package on copied weights
  (tests/test_reference_hyper_connections.py).

Only pre-norm stacks: T includes its sublayer's pre-norm (with post-norm T would not end before
the norm).  Granularity: per sublayer, as the paper, through fairseq's ``residual_connection``
(:mod:`~fairseq_deep.modules.schemes.residual_streams`).  Incremental decoding keeps no stream state (the
streams are position-wise).
"""

from dataclasses import dataclass, field
from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F
from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.modules import LayerNorm
from torch import Tensor, nn

from ..common.growth import LAYERS, declare_layer, declare_part
from ..common.layer_weight_kinds import LayerWeightKind, cfg_value
from ..common.precision import no_autocast
from .residual_streams import StreamHistory, StreamLayer, StreamPass, mix_into, sublayer_names

KINDS = ("none", "static", "dynamic", "mhc")


@dataclass
class HyperConnectionsConfig(FairseqDataclass):
    """The ``--hyper-connections`` and ``--hc-*`` options (Zhu et al. 2025; Xie et al. 2025)."""

    hyper_connections: ChoiceEnum(list(KINDS)) = field(
        default="none",
        metadata={
            "help": "n residual streams joined by learned width and depth connections per sublayer: "
            "static (SHC) or dynamic (DHC) hyper-connections (Zhu et al. 2025), or mhc: the "
            "manifold-constrained form, its residual mixing doubly stochastic (Xie et al. 2025); "
            "pre-norm stacks"
        },
    )
    hc_streams: int = field(
        default=4, metadata={"help": "the expansion rate n: how many residual streams"}
    )
    hc_sinkhorn_iters: int = field(
        default=20,
        metadata={"help": "Sinkhorn-Knopp iterations of mhc's residual mixing (t_max, 20 in mHC)"},
    )


def sinkhorn(logits: Tensor, iters: int, rows: int = 0, cols: int = -1) -> Tensor:
    """Sinkhorn-Knopp (Xie et al. Eq. 9) over the matrices of dimensions ``rows`` x ``cols`` of
    ``logits``, in float32: M = exp(logits) (less its maximum over ``rows``, for range), then
    ``iters`` times each column of M divided by its sum over ``rows``, and each row by its sum over
    ``cols`` (the order of the hyper-connections package): every row sums to 1, every column to 1
    within what the iterations leave."""
    m = logits.float()
    m = (m - m.amax(dim=rows, keepdim=True).detach()).exp()
    for _ in range(iters):
        m = m / m.sum(dim=rows, keepdim=True)
        m = m / m.sum(dim=cols, keepdim=True)
    return m


class RMSNorm(nn.Module):
    """x / rms(x) * weight, computed as x / ||x|| * sqrt(d) (0 stays 0, no epsilon), as the
    hyper-connections package normalises; float32."""

    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return F.normalize(x.float(), dim=-1) * (x.size(-1) ** 0.5) * self.weight.float()


class HyperConnection(nn.Module):
    """The hyper-connection of one sublayer (module docstring): ``width(H)`` -> (its input h_0,
    the mixed streams A_r^T H, B); ``depth(out, mixed, B)`` -> H'.  H is n x ... x d."""

    def __init__(self, kind: str, streams: int, dim: int, index: int, sinkhorn_iters: int = 20):
        super().__init__()
        self.kind, self.n, self.dim, self.sinkhorn_iters = kind, streams, dim, sinkhorn_iters
        static = torch.zeros(streams + 1, streams + 1)
        static[0, 1:] = 1.0  # B = 1
        static[1 + index % streams, 0] = 1.0  # A_m = e_{k mod n}
        static[1:, 1:] = torch.eye(streams)  # A_r = I
        self.static = nn.Parameter(static)
        if kind == "static":
            return
        self.norm = LayerNorm(dim) if kind == "dynamic" else RMSNorm(dim)
        self.dynamic_alpha = nn.Parameter(torch.zeros(dim, streams + 1))  # [W_m W_r]
        self.dynamic_beta = nn.Parameter(torch.zeros(dim))  # W_beta
        # s_alpha (mhc: alpha_pre, alpha_res) and s_beta (mhc: alpha_post)
        self.alpha_scale = nn.Parameter(torch.full((1 if kind == "dynamic" else 2,), 0.01))
        self.beta_scale = nn.Parameter(torch.full((1,), 0.01))

    def coefficients(self, streams: Tensor) -> Tuple[Tensor, Tensor]:
        """(alpha, beta): alpha[s, ..., 0] = A_m, alpha[s, ..., 1 + t] = A_r[s, t] and beta[s, ...]
        = B[s] for streams of shape n x ... x d (static: without the token dimensions)."""
        alpha, beta = self.static[1:, :], self.static[0, 1:]
        if self.kind == "static":
            return alpha, beta
        n = self.n
        with no_autocast(streams):
            normed = self.norm(streams if self.kind == "dynamic" else streams.float())
            a = normed @ self.dynamic_alpha.to(normed.dtype)
            b = normed @ self.dynamic_beta.to(normed.dtype)
            shape = (n,) + (1,) * (streams.dim() - 2)
            if self.kind == "dynamic":
                alpha = torch.tanh(a) * self.alpha_scale + alpha.view(*shape, n + 1)
                return alpha, torch.tanh(b) * self.beta_scale + beta.view(shape)
            scale = torch.cat([self.alpha_scale[:1], self.alpha_scale[1:].expand(n)]).float()
            alpha = a * scale + alpha.float().view(*shape, n + 1)
            beta = b * self.beta_scale.float() + beta.float().view(shape)
            alpha = torch.cat(
                [alpha[..., :1].sigmoid(), sinkhorn(alpha[..., 1:], self.sinkhorn_iters, rows=0)],
                dim=-1,
            )
            return alpha, 2 * beta.sigmoid()

    def width(self, streams: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        alpha, beta = self.coefficients(streams)
        alpha = alpha.to(streams.dtype)
        if alpha.dim() == 2:  # static: one matrix for every token
            mix = torch.einsum("sk,s...->k...", alpha, streams)
        else:
            mix = torch.einsum("s...k,s...d->k...d", alpha, streams)
        return mix[0], mix[1:], beta

    def depth(self, out: Tensor, mixed: Tensor, beta: Tensor) -> Tensor:
        beta = beta.to(out.dtype).reshape(*beta.shape, *(1,) * (out.dim() + 1 - beta.dim()))
        return beta * out.unsqueeze(0) + mixed


class HyperConnectionHistory(StreamHistory):
    """The n streams of a hyper-connected stack; the readout is their sum."""

    combination = (
        "hyper-connections: n residual streams mixed by learned matrices (Zhu et al. 2025)"
    )

    def reduce(self, streams: Tensor) -> Tensor:
        return streams.sum(0)

    hidden = reduce


class _HyperPass(StreamPass):
    def __init__(self, connections: List[HyperConnection]):
        self.connections = iter(connections)
        self.streams: Optional[Tensor] = None

    def _next_input(self, streams: Tensor) -> Optional[Tensor]:
        self.hc = next(self.connections, None)
        if self.hc is None:
            return None
        h, self.mixed, self.beta = self.hc.width(streams)
        return h

    def enter(self, streams: Tensor) -> Tensor:
        return self._next_input(streams)

    def connect(self, x: Tensor, residual: Tensor) -> Tensor:
        self.streams = self.hc.depth(x, self.mixed, self.beta)
        following = self._next_input(self.streams)
        return x if following is None else following  # after the last sublayer: not read

    def leave(self, out: Tensor) -> Tensor:
        return self.streams


class HyperConnectedLayer(StreamLayer):
    """fairseq's pre-norm layer whose sublayers read and write n streams (module docstring)."""

    why_not_standard = (
        "hyper-connections carry n residual streams mixed by learned matrices (Zhu et al. 2025), "
        "which no standard Transformer computes"
    )

    def stream_pass(self, sublayers) -> StreamPass:
        return _HyperPass([self.hyper_connections[i] for i in sublayers])


def apply_hyper_connections(layer: nn.Module, opts: HyperConnectionsConfig, index: int) -> None:
    """Make layer ``index`` (0-based) of a pre-norm stack a hyper-connected layer."""
    mix_into(layer, HyperConnectedLayer, f"--hyper-connections {opts.hyper_connections}")
    layer.stream_sublayers = names = sublayer_names(layer)
    layer.hyper_connections = nn.ModuleList(
        HyperConnection(
            opts.hyper_connections,
            opts.hc_streams,
            layer.embed_dim,
            index * len(names) + j,
            opts.hc_sinkhorn_iters,
        )
        for j in range(len(names))
    )


def _identity(layer: nn.Module):
    return (
        "its layers are hyper-connected: a copied layer's stream mixing A_r is not the identity, "
        "and set to 0 it would drop the streams"
    )


# fairseq-deep-grow: the connections travel with their layer (stack, interleave); the history has
# no tensors of its own
declare_part(HyperConnectionHistory, identity=lambda history: LAYERS)
declare_layer(HyperConnectedLayer, identity=_identity)


# (d) Hyper-connections, Zhu et al. 2025 Eq. 1-5: `<stack>.layers.<l>.hyper_connections.<k>.static`,
# the (n+1) x (n+1) matrix [[0, B], [A_m, A_r]] of sublayer k, shown transposed: each row a reader
# (the sublayer's input h_0, the new stream t), each column what it reads (the sublayer's output,
# the old stream s).  Dynamic hyper-connections add an input-dependent part to it; for mHC the
# constrained matrices are shown (sigmoid, 2 sigmoid, Sinkhorn-Knopp), at that part's 0.


def _hc_matches(key: str, w: Tensor) -> bool:
    return ".hyper_connections." in key and key.endswith(".static") and w.dim() == 2


def _hc_effective(w: Tensor, cfg):
    m = w.detach().float().cpu().clone()
    if cfg_value(cfg, "hyper_connections", "static") == "mhc":
        m[1:, :1] = m[1:, :1].sigmoid()
        m[:1, 1:] = 2 * m[:1, 1:].sigmoid()
        m[1:, 1:] = sinkhorn(m[1:, 1:], int(cfg_value(cfg, "hc_sinkhorn_iters", 20)))
    m[0, 0] = 0.0
    valid = torch.ones_like(m, dtype=torch.bool)
    valid[0, 0] = False
    return m.t().contiguous(), valid.t().contiguous()


def _hc_labels(m: Tensor):
    streams = [f"stream {s}" for s in range(1, m.shape[0])]
    return ["input h0"] + [f"new {s}" for s in streams], ["output T(h0)"] + streams


HYPER_CONNECTION_WEIGHTS = LayerWeightKind(
    name="hyper_connections",
    suffix="hyper_connections.<k>.static",
    description="hyper-connections of one sublayer (Zhu et al. 2025, Eq. 1-5; mHC: Xie et al. "
    "2025), shown transposed: rows the sublayer's input and the new streams, columns the "
    "sublayer's output and the old streams",
    matches=_hc_matches,
    effective=_hc_effective,
    labels=_hc_labels,
)
