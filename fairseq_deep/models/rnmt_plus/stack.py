"""The layer loop of the recurrent stacks (RNMT+ encoder and decoder, Chen et al. 2018, Sec. 4.1).

The same start/push/readout loop as the Transformer's (:mod:`fairseq_deep.models.transformer_stack`),
over a :class:`~fairseq_deep.modules.histories.layer_history.LayerHistory`: the history starts from the *first layer's*
output y_1 (the embedding has another width, E instead of the layers' width), layer l >= 2 reads
``next_input()`` and its output is pushed; the stack returns ``readout()``.  With the residual
history this is the plain stack (layer l reads y_{l-1}); with ``--dlcl-stacks`` it is DLCL
(Wang et al. 2019, pre-norm Eq. 8) with y_1 as entry 0.

Each layer's output is dropped out before it is added to its input, from ``residual_start`` on
(1-based; 0 = no residual connections).
"""

from typing import Callable, List, Optional

import torch.nn.functional as F
from torch import Tensor

from ...modules.histories.layer_history import HistoryState, LayerHistory, build_dlcl


def has_residual(layer_index: int, residual_start: int) -> bool:
    """Layer ``layer_index`` (0-based) adds its input to its output (``residual_start`` is 1-based,
    0 = never)."""
    return residual_start > 0 and layer_index + 1 >= residual_start


def residual_role(stack, index: int) -> bool:
    """What a copy of layer ``index`` of an RNMT+ ``stack`` keeps when fairseq-deep-grow stacks
    layers (modules/common/growth.py): its residual connection."""
    return has_residual(index, stack.residual_start)


def build_history(args, stack: str, num_layers: int, dim: int) -> LayerHistory:
    """How layers 2..L of a recurrent stack read the layers below (``--dlcl-stacks``): the previous
    layer (residual history), or DLCL with the first layer's output as its entry 0."""
    return build_dlcl(args, stack, num_layers - 1, dim, normalize_before=True)


def layer_output(
    index: int, x: Tensor, y: Tensor, residual_start: int, dropout: float, training: bool
) -> Tensor:
    """The output of layer ``index`` whose LSTM read x and returned y: Dr(y), plus x where the layer
    has a residual connection."""
    y = F.dropout(y, p=dropout, training=training)
    return x + y if has_residual(index, residual_start) else y


def run_stack(
    history: LayerHistory,
    first: Tensor,
    num_layers: int,
    run_layer: Callable[[int, Tensor], Tensor],
    outputs: Optional[List[Tensor]] = None,
) -> HistoryState:
    """Layers 2..``num_layers`` over ``history``, from the first layer's output ``first``:
    ``run_layer(i, x)`` is layer i's output (:func:`layer_output`) on its input x.  Every layer's
    output, the first included, is appended to ``outputs`` when given.  Returns the state, whose
    ``readout()`` is what the stack returns."""
    states = history.start(first)
    if outputs is not None:
        outputs.append(first)
    for i in range(1, num_layers):
        x = run_layer(i, states.next_input())
        states.push(x)
        if outputs is not None:
            outputs.append(x)
    return states
