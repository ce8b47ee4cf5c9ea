"""What the recurrent layers need to know about mixed precision, in one place.

Under ``--fp16``/``--bf16`` fairseq casts the whole model to float16/bfloat16; under ``--amp`` it
runs the forward in CUDA autocast.  The layer-normalized LSTM (``ln_lstm``) and the fast-forward
stacks (``fast_forward_lstm``) keep parts of their computation in float32 in both cases; these
helpers say when.
"""

import torch

REDUCED = (torch.float16, torch.bfloat16)


def autocast_enabled(device_type: str) -> bool:
    """Whether autocast is on for ``device_type`` ("cuda", "cpu", ...)."""
    try:
        return torch.is_autocast_enabled(device_type)
    except TypeError:  # pragma: no cover - torch < 2.4
        return torch.is_autocast_cpu_enabled() if device_type == "cpu" else torch.is_autocast_enabled()
