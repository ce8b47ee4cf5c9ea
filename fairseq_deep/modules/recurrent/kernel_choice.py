"""Which time loop the recurrent cells run (``--rnmt-lstm-impl``, ``--deep-att-cell-impl``; issue 24).

``auto`` (the default of both options) is decided at every forward call from the tensors' device:
the fused Triton kernels (:mod:`.ln_lstm_triton`, :mod:`.ff_lstm_triton`) on a CUDA device when
triton imports (and under Triton's CPU interpreter, ``TRITON_INTERPRET=1``, which a user sets
on purpose), the loop otherwise.  The two compute the same arithmetic (tests/test_ln_lstm_triton.py,
tests/test_ff_lstm_triton.py), so a model trained with one decodes with the other and a checkpoint
saved with ``auto`` runs on any device.  ``loop`` and ``triton`` force one; checkpoints written
before ``auto`` existed store ``loop`` and keep it.  Does not import triton until asked.
"""

import functools
import warnings

import torch
from torch import Tensor

IMPLS = ("auto", "loop", "triton")
DEFAULT = "auto"


@functools.lru_cache(maxsize=None)
def triton_mode() -> str:
    """ "" when triton does not import, "interpreter" under TRITON_INTERPRET=1, else "gpu"."""
    try:
        from .triton_common import INTERPRETED
    except ImportError:
        return ""
    return "interpreter" if INTERPRETED else "gpu"


def resolve(impl: str, x: Tensor) -> str:
    """``loop`` or ``triton`` for ``impl`` on ``x``'s device."""
    if impl != "auto":
        return impl
    mode = triton_mode()
    if mode and (x.device.type == "cuda" or mode == "interpreter"):
        return "triton"
    return "loop"


def scripted(fn):
    """The loop ``fn`` compiled by TorchScript (no Python per time step), as the ``loop``
    implementations run it; ``fn`` itself where TorchScript is unavailable."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # torch >= 2.9 deprecates it
            return torch.jit.script(fn)
    except Exception:  # pragma: no cover - a torch without TorchScript
        return fn
