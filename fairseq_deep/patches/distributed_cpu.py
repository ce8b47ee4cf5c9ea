"""``torchrun`` on a machine without GPUs: several CPU processes train one model.

Replaces, where no GPU exists only (where fairseq would fail or silently run independent copies;
on GPUs each calls fairseq's own):

- ``fairseq.distributed.utils.infer_init_method``: fairseq ignores torchrun's ``WORLD_SIZE`` when
  the default world size is 1 (two independent trainings); it is taken from torchrun, as fairseq
  does on GPUs;
- ``fairseq.distributed.utils._infer_torch_distributed_launch_init``: fairseq divides the rank by
  ``torch.cuda.device_count()`` (zero) and keeps the ``nccl`` backend; here no division, and gloo;
- ``fairseq.models.distributed_fairseq_model.DistributedDataParallel`` (torch's DDP as fairseq
  imports it): fairseq passes ``device_ids``, which torch rejects for a module on CPU; a subclass
  drops them for such a module.

Versions: every fairseq 0.12 and torch 2.

Pinned by: tests/test_distributed.py (``test_two_processes_equal_update_freq_two``: two torchrun
processes on CPU train as one with ``--update-freq 2``).
"""

import logging
import os

import torch
from fairseq.distributed import utils as distributed_utils

from .install import fairseq_original, install

logger = logging.getLogger(__name__)


def no_gpu() -> bool:
    return torch.cuda.device_count() == 0


def infer_init_method_cpu(cfg, *args, **kwargs):
    """Under torchrun without GPUs, take the world size from torchrun (as fairseq does on GPUs)."""
    launched = all(k in os.environ for k in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK"))
    if (
        no_gpu()
        and launched
        and cfg.distributed_init_method is None
        and cfg.distributed_world_size == 1
        and int(os.environ["WORLD_SIZE"]) > 1
    ):
        cfg.distributed_world_size = int(os.environ["WORLD_SIZE"])
    return fairseq_original(infer_init_method_cpu)(cfg, *args, **kwargs)


def torch_launch_init_cpu(cfg):
    """fairseq's torchrun init, without the division by zero GPUs and with gloo instead of nccl."""
    if not no_gpu():
        return fairseq_original(torch_launch_init_cpu)(cfg)
    cfg.distributed_init_method = "env://"
    cfg.distributed_world_size = int(os.environ["WORLD_SIZE"])
    cfg.distributed_rank = int(os.environ["RANK"])
    cfg.device_id = 0
    cfg.distributed_no_spawn = True
    if cfg.distributed_backend == "nccl":
        logger.info("no GPU: using the gloo backend instead of nccl")
        cfg.distributed_backend = "gloo"


def _ddp_for_cpu_modules(ddp_class):
    class DistributedDataParallel(ddp_class):
        """torch DDP that drops fairseq's ``device_ids`` for a module on CPU (torch rejects them)."""

        def __init__(self, module, *args, device_ids=None, output_device=None, **kwargs):
            if all(p.device.type == "cpu" for p in module.parameters()):
                device_ids = output_device = None
            super().__init__(
                module, *args, device_ids=device_ids, output_device=output_device, **kwargs
            )

    return DistributedDataParallel


def apply():
    from fairseq.models import distributed_fairseq_model

    install(distributed_utils, "infer_init_method", infer_init_method_cpu)
    install(distributed_utils, "_infer_torch_distributed_launch_init", torch_launch_init_cpu)
    if not getattr(distributed_fairseq_model.DistributedDataParallel, "_fairseq_deep_cpu", False):
        ddp = _ddp_for_cpu_modules(distributed_fairseq_model.DistributedDataParallel)
        ddp._fairseq_deep_cpu = True
        distributed_fairseq_model.DistributedDataParallel = ddp
