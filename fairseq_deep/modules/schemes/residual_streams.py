"""Several residual streams through fairseq's own Transformer layers: what hyper-connections (Zhu
et al. 2025) and ResiDual (Xie et al. 2023) share.

Such a stack carries n streams of width d between its layers instead of one: a single tensor
``S`` of shape n x T x B x d, so that the layer loop of ``models/transformer_stack.py``, fairseq's
activation checkpointing (which hands autograd the tensor arguments of a layer) and fully sharded
wrapping see an ordinary tensor.  Two parts:

* a :class:`StreamHistory` (a :class:`~fairseq_deep.modules.histories.layer_history.LayerHistory`):
  ``start(y_0)`` expands the embedding into the streams (``expand``), each layer maps S to S, and
  the readout reduces the last streams to one state (``reduce``); ``hidden(S)`` is what a layer's
  output is to the rest of the model (the encoder states that transparent attention reads, the
  decoder's inner states);
* a layer mixin, :class:`StreamLayer`: the layer takes S, runs fairseq's own ``forward`` on the
  input of its first sublayer, and every call of ``residual_connection(x, residual)`` (fairseq's
  layers make one per sublayer, in order: self-attention, encoder attention, feed-forward) hands
  the sublayer's output to a :class:`StreamPass`, which updates the streams and returns what
  fairseq's code goes on with (the next sublayer's input); the layer returns the streams.  The
  pass lives in a context variable, not on the module, for the duration of one forward: the layer
  is re-entrant, and activation checkpointing's second forward sets its own.  This is the
  granularity of both papers: one connection per sublayer, with nothing of fairseq's ``forward``
  rewritten.

The streams of a position depend on that position's layer outputs only, so incremental decoding
keeps no stream state: each step computes the new position's streams from its embedding, and the
attention layers cache their keys and values (of each sublayer's input) as in fairseq.
"""

from contextvars import ContextVar
from typing import Dict, List, Sequence, Tuple

from fairseq.modules.transformer_layer import (
    TransformerDecoderLayerBase,
    TransformerEncoderLayerBase,
)
from torch import Tensor, nn

from ...errors import UserError
from ..histories.layer_history import HistoryState, LayerHistory

#: fairseq's own layers: a scheme that rewires their sublayers takes these and nothing mixed in
FAIRSEQ_LAYERS = (TransformerEncoderLayerBase, TransformerDecoderLayerBase)


class StreamHistory(LayerHistory):
    """The history of a stack whose layers carry n streams (one tensor, n x T x B x d)."""

    def __init__(self, num_layers: int, streams: int):
        super().__init__(num_layers)
        self.streams = streams

    def start(self, embedding: Tensor) -> HistoryState:
        return StreamState(self, embedding)

    def expand(self, embedding: Tensor) -> Tensor:
        """The streams before the first layer: n copies of the embedding (a view)."""
        return embedding.unsqueeze(0).expand(self.streams, *embedding.shape)

    def reduce(self, streams: Tensor) -> Tensor:
        """The stack's readout from the last streams."""
        raise NotImplementedError

    def hidden(self, y: Tensor) -> Tensor:
        raise NotImplementedError


class StreamState(HistoryState):
    """One forward pass of a :class:`StreamHistory`: the streams after the last layer run."""

    def __init__(self, history: StreamHistory, embedding: Tensor):
        super().__init__(history, embedding)
        self.streams = history.expand(embedding)

    def push(self, y: Tensor) -> None:
        self.streams = y
        self.count += 1

    def next_input(self) -> Tensor:
        return self.streams

    def readout(self) -> Tensor:
        return self.history.reduce(self.streams)


class StreamPass:
    """One forward of a stream layer: what its ``residual_connection`` calls do to the streams.

    ``enter(S)`` returns the first sublayer's input; ``connect(x, residual)`` takes sublayer k's
    output x (after dropout) and its input ``residual``, and returns what fairseq's layer goes on
    with; ``leave(out)`` takes fairseq's output of the layer and returns the streams."""

    def enter(self, streams: Tensor) -> Tensor:
        raise NotImplementedError

    def connect(self, x: Tensor, residual: Tensor) -> Tensor:
        raise NotImplementedError

    def leave(self, out: Tensor) -> Tensor:
        raise NotImplementedError


_PASS: ContextVar[StreamPass] = ContextVar("stream_pass")


class StreamLayer:
    """Mixin of fairseq's Transformer layer (module docstring): ``forward`` takes and returns the
    streams; ``residual_connection`` is the pass's ``connect``.  A scheme subclasses it and says
    what one forward does (``stream_pass``)."""

    #: the sublayers, in the order fairseq's forward runs them (set when the mixin is applied)
    stream_sublayers: Tuple[str, ...] = ()

    def stream_pass(self, sublayers: Sequence[int]) -> StreamPass:
        """The pass of one forward that runs the sublayers of these indices (into
        ``stream_sublayers``)."""
        raise NotImplementedError

    def forward(self, streams, *args, **kwargs):
        run = self.stream_pass(running_sublayers(self, args, kwargs))
        token = _PASS.set(run)
        try:
            out = super().forward(run.enter(streams), *args, **kwargs)
        finally:
            _PASS.reset(token)
        if isinstance(out, tuple):  # the decoder's (x, attn, state), the encoder's (x, fc_result)
            return (run.leave(out[0]), *out[1:])
        return run.leave(out)

    def residual_connection(self, x, residual):
        return _PASS.get().connect(x, residual)


def sublayer_names(layer: nn.Module) -> Tuple[str, ...]:
    """The sublayers of a fairseq layer in the order its forward runs them."""
    cross = ("encoder_attn",) if getattr(layer, "encoder_attn", None) is not None else ()
    return ("self_attn", *cross, "ffn")


def running_sublayers(layer, args, kwargs) -> List[int]:
    """The indices (into ``layer.stream_sublayers``) of the sublayers one call runs: a decoder layer
    skips its encoder attention when it is given no encoder output (fairseq's forward says
    ``if self.encoder_attn is not None and encoder_out is not None``)."""
    names = layer.stream_sublayers
    encoder_out = kwargs["encoder_out"] if "encoder_out" in kwargs else (args[0] if args else None)
    return [i for i, n in enumerate(names) if n != "encoder_attn" or encoder_out is not None]


_CLASSES: Dict[Tuple[type, type], type] = {}


def mix_into(layer: nn.Module, mixin: type, what: str) -> nn.Module:
    """Make ``layer`` (fairseq's own layer class, nothing mixed in) an instance of ``mixin`` + its
    class (one class per pair, made once); ``what`` names the option for the refusal."""
    base = type(layer)
    if base not in FAIRSEQ_LAYERS:
        raise UserError(
            f"{what} rewires the sublayers of fairseq's own Transformer layers; this stack's layers "
            f"are {base.__name__} (multi-layer attention, --ta-no-encoder-residual or a residual "
            "scheme that replaces the residual connection): drop one of the two"
        )
    key = (mixin, base)
    if key not in _CLASSES:
        _CLASSES[key] = type(
            mixin.__name__ + base.__name__,
            (mixin, base),
            {"__module__": mixin.__module__, "scheme_base": base, "__doc__": mixin.__doc__},
        )
    layer.__class__ = _CLASSES[key]
    return layer
