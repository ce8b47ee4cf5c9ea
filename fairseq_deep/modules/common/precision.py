"""What the recurrent layers need to know about mixed precision, in one place.

Under ``--fp16``/``--bf16`` fairseq casts the whole model to float16/bfloat16; under ``--amp`` it
runs the forward in CUDA autocast.  The layer-normalized LSTM (``ln_lstm``) and the fast-forward
stacks (``fast_forward_lstm``) keep parts of their computation in float32 in both cases; these
helpers say when.  DLCL's custom autograd row (``layer_history``) uses :func:`no_autocast` too.
The fused Triton loops (``ln_lstm_triton``, ``ff_lstm_triton``) take :data:`custom_fwd` /
:data:`custom_bwd` and :func:`in_float32_when_reduced` from here, as the loops they replace do.
"""

from contextlib import nullcontext
from typing import Tuple

import torch
from torch import Tensor

REDUCED = (torch.float16, torch.bfloat16)


def autocast_enabled(device_type: str) -> bool:
    """Whether autocast is on for ``device_type`` ("cuda", "cpu", ...)."""
    try:
        return torch.is_autocast_enabled(device_type)
    except TypeError:  # pragma: no cover - torch < 2.4
        return (
            torch.is_autocast_cpu_enabled() if device_type == "cpu" else torch.is_autocast_enabled()
        )


def no_autocast(x: torch.Tensor):
    """Autocast off for ``x``'s device while it is on (the code inside chooses its own dtypes); a
    no-op context otherwise."""
    if autocast_enabled(x.device.type):
        return torch.autocast(device_type=x.device.type, enabled=False)
    return nullcontext()


# decorators of an autograd Function's forward/backward: under CUDA autocast it runs in float32
if hasattr(torch.amp, "custom_fwd"):  # torch >= 2.4
    custom_fwd = torch.amp.custom_fwd(device_type="cuda", cast_inputs=torch.float32)
    custom_bwd = torch.amp.custom_bwd(device_type="cuda")
else:  # pragma: no cover - older torch
    custom_fwd = torch.cuda.amp.custom_fwd(cast_inputs=torch.float32)
    custom_bwd = torch.cuda.amp.custom_bwd


def in_float32_when_reduced(loop, tensors, *options) -> Tuple[Tensor, Tensor, Tensor]:
    """``loop(*tensors, *options)`` under the precision rule of :func:`.ln_lstm.recurrence` (a
    recurrent time loop returning (out, h_n, c_n)): float16/bfloat16 inputs or autocast run the
    loop in float32 with autocast off; outputs return in the inputs' dtypes (float32 under
    autocast).  ``tensors`` starts with (xw, h, c)."""
    xw, h, c = tensors[:3]
    device_type = xw.device.type
    autocast = autocast_enabled(device_type)
    if not autocast and all(t.dtype not in REDUCED for t in tensors):
        return loop(*tensors, *options)
    with torch.autocast(device_type=device_type, enabled=False):
        out, h_n, c_n = loop(*(t.float() for t in tensors), *options)
    if autocast:
        return out, h_n, c_n
    return out.to(xw.dtype), h_n.to(h.dtype), c_n.to(c.dtype)


def keeping_float32(fn):
    """``fn`` of :meth:`torch.nn.Module._apply` (what ``.half()``, ``.to(...)``, ``.cuda()`` apply to
    every parameter, gradient and buffer), except that a float32 tensor ``fn`` would make float16
    stays float32, moved to ``fn``'s device: the values are kept exactly.  bfloat16 and every other
    cast pass through."""

    def apply(t):
        out = fn(t)
        if t.dtype == torch.float32 and out.dtype == torch.float16:
            return t.to(device=out.device)
        return out

    return apply


class Float32UnderHalf:
    """Mixin for an ``nn.Module`` whose parameters stay float32 when the model is cast to float16
    (fairseq's ``--fp16`` calls ``model.half()``): their gradients are then accumulated in float32
    and do not overflow where the float16 ones would (Deep-Att's fast-forward stacks, whose
    unscaled gradients pass 65504; see :mod:`.fast_forward_lstm`).  fairseq's FP16Optimizer keeps
    float32 master copies of every parameter and takes float32 ones as they are."""

    def _apply(self, fn, recurse=True):
        return super()._apply(keeping_float32(fn), recurse)
