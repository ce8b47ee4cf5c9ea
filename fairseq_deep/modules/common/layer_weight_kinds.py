"""What a learned layer-weight matrix is, for the plots of Wang et al. (2019, Sec. 6.4, Fig. 5) and
Bapna et al. (2018, Fig. 1-4): :class:`LayerWeightKind`.

A module whose parameters weigh the layers of a stack (DLCL's W, transparent attention's W)
declares its kind beside its own code (``DLCL_WEIGHTS`` in :mod:`.layer_history`,
``TRANSPARENT_WEIGHTS`` in :mod:`.transparent_attention`); each model family names the kinds its
models hold (``layer_weights`` of :class:`fairseq_deep.models.families.Family`), and
``fairseq-deep-layer-weights`` (:mod:`fairseq_deep.diagnostics.layer_weights`) reads them from the
family registry: the tool names no technique.
"""

import argparse
from dataclasses import dataclass
from typing import Any, Callable, List, Tuple

from torch import Tensor


@dataclass(frozen=True)
class LayerWeightKind:
    """How to recognise one technique's weight matrix and turn it into the matrix that is plotted.

    ``matches(key, tensor)`` says whether a state-dict entry is of this kind; ``effective(tensor,
    cfg)`` returns ``(matrix, valid)``: the weights in plotting orientation (rows = readers, columns
    = layers read, y_0 first) and a bool matrix of the entries that exist (False: structurally
    absent, e.g. the upper triangle of DLCL); ``labels(matrix)`` returns ``(row_labels,
    col_labels)``.
    """

    name: str
    suffix: str
    description: str
    matches: Callable[[str, Tensor], bool]
    effective: Callable[[Tensor, Any], Tuple[Tensor, Tensor]]
    labels: Callable[[Tensor], Tuple[List[str], List[str]]]
    #: hide small entries by default, as Fig. 5 of Wang et al. does for DLCL (a softmax over many
    #: layers, as transparent attention's, has every entry small: it is shown whole)
    mask_small: bool = True


def cfg_value(cfg, name: str, default=None):
    """``name`` from a checkpoint's model config: an argparse.Namespace, dict or omegaconf node."""
    if cfg is None:
        return default
    if isinstance(cfg, argparse.Namespace) or not hasattr(cfg, "get"):
        return getattr(cfg, name, default)
    try:
        value = cfg.get(name, default)
    except Exception:  # pragma: no cover - a struct-mode omegaconf node without the key
        value = default
    return default if value is None else value


def layer_labels(n_cols: int) -> List[str]:
    """y_0 (the embedding), y_1, ... y_{n-1}."""
    return ["y0 (emb)"] + [f"y{k}" for k in range(1, n_cols)]
