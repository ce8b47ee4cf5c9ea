"""Safe checkpoint loading: the types a fairseq checkpoint holds, allow-listed for torch's
weights-only unpickler.

Replaces: nothing of fairseq's; it adds to torch's allow-list.  torch >= 2.6 loads with
``weights_only=True`` by default, and fairseq 0.12 (both stacks) calls ``torch.load`` without the
argument, so every fairseq checkpoint (an ``argparse.Namespace`` or omegaconf config, numpy
scalars) would be refused.  The exact types that fairseq checkpoints hold are allow-listed with
``torch.serialization.add_safe_globals``; the check stays on, so a checkpoint carrying anything
else (e.g. a pickled callable) is still refused (with a message: :mod:`.checkpoint_errors`).

Versions: torch >= 2.4 (``add_safe_globals``; torch 2.4, the newest for Python 3.8, loads
weights-only only when asked); ``typing.Any`` by name on Python < 3.10 needs torch >= 2.5.
Nothing to do on torch < 2.4.

Pinned by: tests/test_reliability.py (``test_allow_list_is_exactly_what_a_fairseq_checkpoint_holds``,
``test_pickled_callable_is_refused_and_not_run``, ``test_no_code_of_ours_turns_the_check_off``),
tests/test_old_checkpoints.py.
"""

import argparse
import collections
import re
import typing

import numpy as np
import torch


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
    types += [
        type(np.dtype(t)) for t in ("float64", "float32", "float16", "int64", "int32", "bool")
    ]
    try:  # the name numpy pickles its scalars under: numpy._core (numpy >= 2) or numpy.core
        from numpy._core.multiarray import scalar
    except ImportError:  # pragma: no cover - numpy < 2
        from numpy.core.multiarray import scalar
    types.append(scalar)
    return types


def _torch_version():
    return tuple(int(p) for p in re.findall(r"\d+", torch.__version__)[:2])


def _as_safe_global(obj):
    """``obj``, or ``(obj, "module.name")`` for an object torch cannot name (``typing.Any`` has no
    ``__qualname__`` before Python 3.10); torch < 2.5 takes no such pair (None: left out)."""
    if hasattr(obj, "__qualname__") and hasattr(obj, "__name__"):
        return obj
    if _torch_version() < (2, 5):
        return None
    return (obj, f"{obj.__module__}.{getattr(obj, '_name', None) or repr(obj).rsplit('.', 1)[-1]}")


def allow_fairseq_checkpoints():
    add = getattr(torch.serialization, "add_safe_globals", None)
    if add is None:  # torch < 2.4 has no weights-only default: nothing to do
        return
    # torch 2.4 (the newest for Python 3.8) does not load weights-only by default either; there a
    # checkpoint loaded with an explicit weights_only=True whose config holds typing.Any is refused
    add([g for g in map(_as_safe_global, checkpoint_safe_globals()) if g is not None])


def apply():
    allow_fairseq_checkpoints()
