"""What the recurrent layers need to know about mixed precision, in one place.

Under ``--fp16``/``--bf16`` fairseq casts the whole model to float16/bfloat16; under ``--amp`` it
runs the forward in CUDA autocast.  The layer-normalized LSTM (``ln_lstm``) and the fast-forward
stacks (``fast_forward_lstm``) keep parts of their computation in float32 in both cases; these
helpers say when.  DLCL's custom autograd row (``layer_history``) uses :func:`no_autocast` too.
"""

from contextlib import nullcontext

import torch

REDUCED = (torch.float16, torch.bfloat16)


def autocast_enabled(device_type: str) -> bool:
    """Whether autocast is on for ``device_type`` ("cuda", "cpu", ...)."""
    try:
        return torch.is_autocast_enabled(device_type)
    except TypeError:  # pragma: no cover - torch < 2.4
        return torch.is_autocast_cpu_enabled() if device_type == "cpu" else torch.is_autocast_enabled()


def no_autocast(x: torch.Tensor):
    """Autocast off for ``x``'s device while it is on (the code inside chooses its own dtypes); a
    no-op context otherwise."""
    if autocast_enabled(x.device.type):
        return torch.autocast(device_type=x.device.type, enabled=False)
    return nullcontext()
