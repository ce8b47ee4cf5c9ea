"""Every shim for fairseq/torch versions, in one place.  Applied once, when fairseq_deep is imported.

1. Safe checkpoint loading (torch >= 2.6 loads with ``weights_only=True``): the exact types that
   fairseq checkpoints hold are allow-listed with ``torch.serialization.add_safe_globals``; the check
   stays on, so a checkpoint carrying anything else (e.g. a pickled callable) is still refused.
2. Evaluation covers every sentence: fairseq 0.12's ``batch_by_size`` drops the last batch when
   its size is not a multiple of ``--required-batch-size-multiple`` (fairseq issue #5036); we give
   the dropped sentences back as a final, smaller batch.
"""

import argparse
import collections
import logging
import typing

import numpy as np
import torch

from fairseq.data import data_utils

logger = logging.getLogger(__name__)


def checkpoint_safe_globals():
    """Exactly the classes a fairseq checkpoint's pickle references beyond torch's own allow-list.

    * ``argparse.Namespace``: ``cfg["model"]`` of checkpoints written from the command line;
    * omegaconf containers and their metadata: checkpoints whose ``cfg`` was saved as a DictConfig
      (older fairseq, hydra entry points);
    * numpy scalars and dtypes: values such as ``best`` or ``val_loss`` when they came out of numpy.
    """
    from omegaconf import base, dictconfig, listconfig, nodes

    types = [
        argparse.Namespace,
        collections.defaultdict,
        typing.Any,
        dictconfig.DictConfig,
        listconfig.ListConfig,
        base.ContainerMetadata,
        base.Metadata,
        nodes.AnyNode,
        nodes.StringNode,
        nodes.IntegerNode,
        nodes.FloatNode,
        nodes.BooleanNode,
        np.dtype,
    ]
    types += [type(np.dtype(t)) for t in ("float64", "float32", "float16", "int64", "int32", "bool")]
    try:  # the name numpy pickles its scalars under: numpy._core (numpy >= 2) or numpy.core
        from numpy._core.multiarray import scalar
    except ImportError:  # pragma: no cover - numpy < 2
        from numpy.core.multiarray import scalar
    types.append(scalar)
    return types


def allow_fairseq_checkpoints():
    add = getattr(torch.serialization, "add_safe_globals", None)
    if add is None:  # torch < 2.4 loads with weights_only=False: nothing to do
        return
    add(checkpoint_safe_globals())


def batch_by_size_all(indices, num_tokens_fn, num_tokens_vec=None, max_tokens=None,
                      max_sentences=None, required_batch_size_multiple=1, fixed_shapes=None):
    """fairseq's ``batch_by_size``, with the sentences of a dropped final batch given back."""
    batches = _fairseq_batch_by_size(
        indices, num_tokens_fn, num_tokens_vec=num_tokens_vec, max_tokens=max_tokens,
        max_sentences=max_sentences, required_batch_size_multiple=required_batch_size_multiple,
        fixed_shapes=fixed_shapes,
    )
    indices = np.asarray(indices if isinstance(indices, np.ndarray) else list(indices), dtype=np.int64)
    covered = sum(len(b) for b in batches)
    if covered < len(indices):
        seen = np.concatenate(batches) if batches else np.empty(0, dtype=np.int64)
        missing = indices[~np.isin(indices, seen)]
        batches = list(batches) + [missing]
    return batches


_fairseq_batch_by_size = data_utils.batch_by_size


def apply():
    allow_fairseq_checkpoints()
    if data_utils.batch_by_size is not batch_by_size_all:
        data_utils.batch_by_size = batch_by_size_all


apply()
