"""ResiDual (Xie, Zhang, Guo, Tan, Bian, Awadalla, Menezes, Qin, Yan 2023, "ResiDual: Transformer
with Dual Residual Connections", Sec. 3, Eq. 3-4): the Pre-Post-LN Transformer.

Two streams side by side, through every sublayer f_k (self-attention, encoder attention, FFN):

* the post-LN stream: x_{k+1} = LN(x_k + f_k(x_k)) (fairseq's post-norm sublayer, unchanged);
* the dual stream: d_{k+1} = d_k + f_k(x_k), the sublayers' outputs summed without any norm (the
  residual of a pre-LN Transformer, which keeps a lower bound on the gradient);

both starting from the embedding, x_1 = d_1 = y_0, and the stack's output is
x_N + LN(d_N) (Eq. 4).  f_k(x_k) is the sublayer's output after dropout, as the authors' code adds
it.  The final LN is the history's own (``dual_norm``; epsilon 1e-7 as the authors' code): with its
gain and bias 0 the model is the post-norm Transformer, exactly (tests/test_stream_schemes.py).

Granularity: per sublayer, as the paper, through fairseq's ``residual_connection``
(:mod:`~fairseq_deep.modules.schemes.residual_streams`): the post-LN stream is what fairseq's layer
computes, the dual stream is the pass's.  Incremental decoding keeps nothing: both streams are
position-wise.  Not in the paper's equations, not options here: the authors' code has a scale of
the x_N term (``enc_alpha``/``dec_alpha``, 1 in every configuration) and one of the whole dual
stream, its start and each addition (``*_res_input_norm_scale``: 1 by default, 0.05 in its OPUS
configuration).  Under the readout's LN a scale c of d is an epsilon e / c^2 instead of e, so
OPUS's 0.05 is this model with a dual-norm epsilon of 4e-5 instead of 1e-7 (docs/deep_schemes.md).
"""

from dataclasses import dataclass, field

import torch
from fairseq.dataclass import FairseqDataclass
from fairseq.modules import LayerNorm
from torch import Tensor

from ..common.growth import LAYERS, declare_layer, declare_part
from .residual_streams import StreamHistory, StreamLayer, StreamPass, mix_into, sublayer_names

NAME = "ResiDual (Xie et al. 2023)"


@dataclass
class ResiDualConfig(FairseqDataclass):
    """The ``--resi-dual`` option (Xie et al. 2023)."""

    resi_dual: bool = field(
        default=False,
        metadata={
            "help": "ResiDual (Xie et al. 2023): post-LN sublayers and a dual stream that sums "
            "their outputs without norm; the stack returns x_N + LN(d_N) (post-norm stacks)"
        },
    )


class ResiDualHistory(StreamHistory):
    """The two streams [x, d] of a ResiDual stack; the readout x_N + LN(d_N) (Eq. 4)."""

    combination = (
        "ResiDual: a post-LN stream and a dual stream of the sublayers' outputs, read out as "
        "x_N + LN(d_N) (Xie et al. 2023)"
    )

    def __init__(self, num_layers: int, embed_dim: int):
        super().__init__(num_layers, streams=2)
        self.dual_norm = LayerNorm(embed_dim, eps=1e-7)

    def reduce(self, streams: Tensor) -> Tensor:
        return streams[0] + self.dual_norm(streams[1])

    def hidden(self, y: Tensor) -> Tensor:
        return y[0]  # the post-LN stream: what the plain post-norm layer would have returned


class _ResiDualPass(StreamPass):
    def enter(self, streams: Tensor) -> Tensor:
        self.dual = streams[1]
        return streams[0]

    def connect(self, x: Tensor, residual: Tensor) -> Tensor:
        self.dual = self.dual + x  # d_{k+1} = d_k + f_k(x_k)
        return residual + x  # fairseq's layer norms this (post-LN)

    def leave(self, out: Tensor) -> Tensor:
        return torch.stack([out, self.dual])


class ResiDualLayer(StreamLayer):
    """fairseq's post-norm layer, with the dual stream of ResiDual beside it."""

    why_not_standard = (
        "ResiDual's stacks carry a second residual stream and return x_N + LN(d_N) "
        "(Xie et al. 2023), which no standard Transformer computes"
    )

    def stream_pass(self, sublayers) -> StreamPass:
        return _ResiDualPass()


def apply_resi_dual(layer) -> None:
    """Make a built fairseq post-norm layer a ResiDual layer."""
    mix_into(layer, ResiDualLayer, "--resi-dual")
    layer.stream_sublayers = sublayer_names(layer)


# fairseq-deep-grow: the dual norm does not depend on the depth (copied as it is); a new layer
# cannot be the identity, its sublayers being post-LN
declare_part(ResiDualHistory, identity=lambda history: LAYERS)
declare_layer(
    ResiDualLayer,
    identity=lambda layer: "its layers are ResiDual's post-LN layers (LN(x + 0) is not x)",
)
