"""What the fused Triton loops share (:mod:`.ln_lstm_triton`, :mod:`.ff_lstm_triton`): the
activations as Triton functions and the device check.  Imports triton: only those two modules,
themselves imported on first use, import this one."""

import triton
import triton.language as tl
from torch import Tensor


@triton.jit
def sigmoid(x):
    return 1.0 / (1.0 + tl.exp(-x))


@triton.jit
def tanh(x):
    e = tl.exp(-2.0 * tl.abs(x))  # without overflow
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0, -t, t)


# Triton fixes the mode when it is imported: its own library (tl.sum, ...) and the kernels are
# interpreted if TRITON_INTERPRET=1 was set then, compiled for the GPU otherwise.
INTERPRETED = type(sigmoid).__name__ == "InterpretedFunction"
_LIBRARY_INTERPRETED = type(tl.sum).__name__ == "InterpretedFunction"


def check_device(x: Tensor, option: str, module: str):
    """Triton needs a CUDA tensor, or its interpreter.  ``option`` and ``module``: the switch that
    chose the kernels (``--rnmt-lstm-impl``, ``--deep-att-cell-impl``), for the message."""
    if INTERPRETED != _LIBRARY_INTERPRETED:
        raise RuntimeError(
            "TRITON_INTERPRET changed between the import of triton and of fairseq_deep's Triton kernels: "
            "set it (or not) before anything imports triton"
        )
    if x.device.type != "cuda" and not INTERPRETED:
        raise RuntimeError(
            f"{option} triton ({module}) runs Triton kernels, which need a CUDA "
            f"device or Triton's CPU interpreter (TRITON_INTERPRET=1 before triton is imported; slow: for "
            f"tests); the tensors are on {x.device}.  Use {option} loop (the default) on a CPU."
        )
