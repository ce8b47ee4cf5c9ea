"""Mixed precision where fairseq 0.12 assumes a TPU, a GPU or a flat optimizer.

Replaces (each wrapper calls fairseq's function):

- ``fairseq.distributed.utils.call_main``: fairseq 0.12 sets ``--tpu`` whenever ``--bf16`` is
  given; without torch_xla installed that can only be a mistake, so the TPU flag is dropped and
  ``--bf16`` trains on the GPU (or CPU).  The same wrapper runs what fully sharded training needs
  (:func:`.fully_sharded.prepare_main`: fairseq's ``call_main`` can be wrapped once);
- ``BaseFairseqModel.prepare_for_inference_``: fairseq-generate, -interactive and the hub cast to
  half for ``--fp16`` only; under ``--bf16`` the model is cast to bfloat16;
- ``FP16Optimizer.build_optimizer``: fairseq's flat float32 master weights are allocated on
  ``torch.cuda.current_device()`` and merge the parameter groups: without a GPU, and for an
  optimizer that needs its groups (``--optimizer deep_att``: ``needs_param_groups``), fairseq's own
  ``--fp16-no-flatten-grads`` is set;
- ``Trainer.train_step``: fairseq's handling of a gradient overflow under ``--fp16`` (skip the
  update, halve the loss scale) calls ``.cuda()``; without CUDA it works on CPU (slow, but what CI
  can run).

The refusal of ``--memory-efficient-fp16`` with an unsupported optimizer is reworded in
:mod:`.usage_errors`.  Nothing here changes results on GPUs, except that ``--bf16`` works there.

Versions: every fairseq 0.12 (0.12.2 and ve-fairseq 0.12.3); torch_xla not installed.

Pinned by: tests/test_precision_cli.py (every family trains and decodes under --fp16/--bf16 on
CPU through the command line; ``test_deep_att_optimizer_keeps_its_groups_under_fp16``),
tests/test_precision.py (``test_bf16_decoding_casts_the_model_and_fp32_does_not``),
tests/test_fully_sharded.py (``test_through_call_main_one_process_gets_a_group_and_the_precision``).
"""

import logging

import torch
from fairseq.distributed import utils as distributed_utils

from .distributed_cpu import no_gpu
from .fully_sharded import prepare_main
from .install import fairseq_original, install

logger = logging.getLogger(__name__)


def _has_torch_xla() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch_xla") is not None


def call_main_prepared(cfg, main, **kwargs):
    """fairseq's ``call_main``, after taking back the ``--tpu`` that ``--bf16`` implied where no
    TPU runtime (torch_xla) is installed; and, under ``--ddp-backend fully_sharded``, with FSDP
    computing in bfloat16 under ``--bf16`` and a process group of one on one GPU
    (:func:`.fully_sharded.prepare_main`)."""
    common = cfg.common
    if getattr(common, "bf16", False) and getattr(common, "tpu", False) and not _has_torch_xla():
        logger.info(
            "--bf16 without torch_xla: training in bfloat16 on %s, not on a TPU",
            "CPU" if common.cpu or no_gpu() else "the GPU",
        )
        common.tpu = False
    main = prepare_main(cfg, main)
    return fairseq_original(call_main_prepared)(cfg, main, **kwargs)


def prepare_for_inference_bf16(self, cfg, *args, **kwargs):
    """fairseq's ``prepare_for_inference_``, then a cast to bfloat16 under ``--bf16`` (fairseq
    casts to half under ``--fp16`` itself and ignores ``--bf16`` when decoding)."""
    fairseq_original(prepare_for_inference_bf16)(self, cfg, *args, **kwargs)
    common = getattr(cfg, "common", None)
    if common is not None and getattr(common, "bf16", False) and not getattr(common, "fp16", False):
        self.to(dtype=torch.bfloat16)


def fp16_build_optimizer(cls, cfg, params, **kwargs):
    """``FP16Optimizer.build_optimizer`` with float32 master weights per parameter (not one flat
    buffer) where flat ones cannot work: without a GPU, and for an optimizer that needs its
    parameter groups (fairseq would stop and ask for ``--fp16-no-flatten-grads``)."""
    common = cfg.common
    if not getattr(common, "fp16_no_flatten_grads", False) and not getattr(common, "bf16", False):
        from fairseq.optim import OPTIMIZER_REGISTRY

        name = getattr(cfg.optimizer, "_name", None)
        needs_groups = getattr(OPTIMIZER_REGISTRY.get(name), "needs_param_groups", False)
        if needs_groups or no_gpu():
            logger.info(
                "--fp16: float32 master weights per parameter (--fp16-no-flatten-grads) %s",
                f"for --optimizer {name}, which keeps parameter groups"
                if needs_groups
                else "since there is no GPU",
            )
            common.fp16_no_flatten_grads = True
    return fairseq_original(fp16_build_optimizer)(cls, cfg, params, **kwargs)


def trainer_train_step_cpu_fp16(self, *args, **kwargs):
    """fairseq's ``Trainer.train_step``; on a machine without CUDA, under ``--fp16``, its handling of
    a gradient overflow (skip the update, halve the loss scale) works as on a GPU instead of
    failing at ``torch.tensor(0.0).cuda()``: ``Tensor.cuda`` is the identity meanwhile, which
    changes nothing else where no CUDA exists (it could only raise)."""
    if torch.cuda.is_available() or not (self.cfg.common.fp16 or self.cfg.common.bf16):
        return fairseq_original(trainer_train_step_cpu_fp16)(self, *args, **kwargs)
    cuda = torch.Tensor.cuda
    torch.Tensor.cuda = lambda tensor, *a, **k: tensor
    try:
        return fairseq_original(trainer_train_step_cpu_fp16)(self, *args, **kwargs)
    finally:
        torch.Tensor.cuda = cuda


def apply():
    from fairseq import trainer
    from fairseq.models import BaseFairseqModel
    from fairseq.optim.fp16_optimizer import FP16Optimizer

    install(trainer.Trainer, "train_step", trainer_train_step_cpu_fp16)
    install(distributed_utils, "call_main", call_main_prepared)
    install(BaseFairseqModel, "prepare_for_inference_", prepare_for_inference_bf16)
    install(FP16Optimizer, "build_optimizer", fp16_build_optimizer, as_classmethod=True)
