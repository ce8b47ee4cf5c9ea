"""Gradient-flow diagnostics: the grad-norm ratio r_t of Bapna et al. (2018), Sec. 2.3.

    r_t = ||dL/dh_1|| / ||dL/dh_N||

with h_1 the output of the first encoder layer and h_N that of the last one, for the loss L of
update t.  :class:`GradNormRatioProbe` measures it on any encoder-decoder model without changing
the model: during one forward/backward it puts a forward hook on the first and the last encoder
layer, and a gradient hook on their outputs, which adds up ``||dL/dh||^2`` (over all the
micro-batches and workers of an update, when the sums are reduced as fairseq reduces logging
outputs).  Outside the ``with`` block no hook is installed: switched off, the diagnostic costs
nothing.

Which layers: ``encoder.grad_norm_layers()`` when the encoder defines it (a model whose layers
are not ``encoder.layers`` says so there), else ``encoder.layers[0]`` and ``encoder.layers[-1]``.
"""

import math
from typing import Dict, List, Tuple

import torch
from torch import Tensor, nn

from ..modules.histories.transparent_attention import TransparentReadout

FIRST_KEY = "_gnorm_ratio_first_sq"
LAST_KEY = "_gnorm_ratio_last_sq"
TA_COUNT_KEY = "_ta_weights_n"


def unwrap_model(model: nn.Module) -> nn.Module:
    """The model inside DDP / fairseq's distributed wrappers."""
    while hasattr(model, "module") and isinstance(model.module, nn.Module):
        model = model.module
    return model


def encoder_end_layers(model: nn.Module) -> Tuple[nn.Module, nn.Module]:
    """The first and the last layer of the model's encoder (h_1 and h_N of Sec. 2.3)."""
    model = unwrap_model(model)
    encoder = getattr(model, "encoder", None)
    if encoder is not None and hasattr(encoder, "grad_norm_layers"):
        return encoder.grad_norm_layers()
    layers = getattr(encoder, "layers", None)
    if isinstance(layers, (nn.ModuleList, nn.Sequential, list)) and len(layers) > 0:
        return layers[0], layers[-1]
    raise ValueError(
        f"--log-grad-norm-ratio: the encoder of {type(model).__name__} has no 'layers' list; give "
        "it a method grad_norm_layers() that returns its first and last layer modules"
    )


def _first_tensor(output):
    if torch.is_tensor(output):
        return output
    if isinstance(output, (tuple, list)) and len(output) > 0 and torch.is_tensor(output[0]):
        return output[0]
    return None


class GradNormRatioProbe:
    """Context manager: while active, sums ||dL/dh_1||^2 and ||dL/dh_N||^2 of the backward passes."""

    def __init__(self, model: nn.Module):
        self.first_layer, self.last_layer = encoder_end_layers(model)
        self.sq: Dict[str, List[Tensor]] = {"first": [], "last": []}
        self._handles = []

    def _forward_hook(self, which: str):
        def hook(module, inputs, output):
            h = _first_tensor(output)
            if h is not None and h.requires_grad:
                h.register_hook(lambda g: self.sq[which].append(g.detach().float().pow(2).sum()))

        return hook

    def __enter__(self):
        self._handles = [
            self.first_layer.register_forward_hook(self._forward_hook("first")),
            self.last_layer.register_forward_hook(self._forward_hook("last")),
        ]
        return self

    def __exit__(self, *exc):
        for handle in self._handles:
            handle.remove()
        self._handles = []
        return False

    def squared_norms(self) -> Tuple[float, float]:
        first = float(sum(t.item() for t in self.sq["first"]))
        last = float(sum(t.item() for t in self.sq["last"]))
        return first, last

    def logging_output(self) -> Dict[str, float]:
        first, last = self.squared_norms()
        return {FIRST_KEY: first, LAST_KEY: last}


def grad_norm_ratio(logging_outputs) -> float:
    """r_t from (summed) logging outputs; nan when there is no gradient at h_N."""
    first = sum(float(log.get(FIRST_KEY, 0.0)) for log in logging_outputs)
    last = sum(float(log.get(LAST_KEY, 0.0)) for log in logging_outputs)
    if last <= 0:
        return float("nan")
    return math.sqrt(first / last)


def transparent_weights_logging(model: nn.Module, columns: str = "last") -> Dict[str, float]:
    """s_{i,j} (Eq. 1, no dropout) of every transparent readout of the model, as logging-output
    entries ``ta_s{i}_{j}`` (i = 0 the embedding, j = 1..M the attention module), plus a count.

    ``columns``: ``last`` (j = M only, Fig. 4 of Bapna et al.) or ``all``.
    """
    readouts = [m for m in unwrap_model(model).modules() if isinstance(m, TransparentReadout)]
    out: Dict[str, float] = {}
    if not readouts:
        return out
    out[TA_COUNT_KEY] = 1.0
    for k, readout in enumerate(readouts):
        prefix = "ta" if len(readouts) == 1 else f"ta{k}"
        with torch.no_grad():
            s = readout.weights().cpu()
        cols = range(s.shape[1]) if columns == "all" else [s.shape[1] - 1]
        for j in cols:
            for i in range(s.shape[0]):
                out[f"{prefix}_s{i}_{j + 1}"] = float(s[i, j])
    return out


def is_ta_weight_key(key: str) -> bool:
    head = key.split("_s", 1)[0]
    return key.startswith("ta") and "_s" in key and (head == "ta" or head[2:].isdigit())
