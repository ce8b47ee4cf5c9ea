"""Fully sharded training (``--ddp-backend fully_sharded``, fairscale's FSDP) in bfloat16 and on
one GPU.

Replaces (each wrapper calls fairseq's or fairscale's function):

- ``Trainer.__init__``: fairseq 0.12 refuses ``--bf16`` under FSDP with a flag check (the model is
  not cast there under FSDP); the check is passed with ``--bf16`` off while it runs;
- ``fairscale.nn.enable_wrap`` (as fairseq's ``fsdp_enable_wrap`` calls it): fairseq hands FSDP
  float32 as its compute dtype unless ``--fp16``; under ``--bf16`` FSDP keeps float32 parameters
  and computes in bfloat16 (``mixed_precision``, as fairseq does for ``--fp16``);
- ``Trainer._build_optimizer``: under ``--bf16`` the optimizer is the one fairseq builds for
  ``--fp16`` under FSDP (``MemoryEfficientFP16Optimizer`` over FSDP's float32 flat parameters),
  which sees ``--bf16`` and takes no loss scale.  ``--memory-efficient-bf16`` (bfloat16
  parameters) stays refused (fairseq's refusal);
- in ``call_main`` (:func:`prepare_main`, run by :func:`.precision.call_main_prepared`): on one GPU
  fairseq runs a world of one without torch.distributed and hands FSDP a dummy process group, but
  fairscale 0.4 asks torch.distributed for a reduce-scatter group in FSDP's constructor
  (``torch.distributed is not yet initialized``) and fairseq's checkpoint loading broadcasts over
  the group; so one fully sharded process gets a process group of one (fairseq's own
  ``distributed_init``, on a free local port), as ``torchrun`` would give it;
- ``Trainer.consolidate_optimizer``: fairscale's ``gather_full_optim_state_dict`` (fairseq calls
  it for every checkpoint) sizes its gather buffers by an attribute that fairscale makes only for
  sharded parameters: in a world of one it stopped the first checkpoint (``'FlatParameter' object
  has no attribute '_full_param_padded'``, seen on an H200); there the buffer is the parameter's
  own size (a meta tensor: no memory).

Versions: fairseq 0.12 (0.12.2 and ve-fairseq 0.12.3) with fairscale 0.4 (0.4.13 tested); without
fairscale there is nothing to wrap.

Pinned by: tests/test_fully_sharded.py (``test_bf16_trains_fully_sharded_without_a_loss_scale``,
``test_through_call_main_one_process_gets_a_group_and_the_precision``; on a GPU
``test_fully_sharded_trains_as_c10d_on_a_gpu`` and benchmarks/fsdp_check.py).
"""

import contextlib
import functools
import logging
import socket

import torch
from fairseq.distributed import utils as distributed_utils

from .distributed_cpu import no_gpu
from .install import fairseq_original, install

logger = logging.getLogger(__name__)

#: True while a training ``main`` runs under ``--bf16 --ddp-backend fully_sharded`` (the model is
#: built, and wrapped, inside it, before any Trainer exists)
_FSDP_BF16 = False


def _fsdp_bf16(cfg) -> bool:
    """``--bf16 --ddp-backend fully_sharded`` (``--memory-efficient-bf16`` is left to fairseq's refusal)."""
    common, distributed = getattr(cfg, "common", None), getattr(cfg, "distributed_training", None)
    return (
        common is not None
        and distributed is not None
        and bool(getattr(common, "bf16", False))
        and not getattr(common, "memory_efficient_bf16", False)
        and getattr(distributed, "ddp_backend", None) == "fully_sharded"
    )


def main_with_fsdp_bf16(main, cfg, **kwargs):
    """fairseq's training ``main`` with FSDP's wrapping set to compute in bfloat16 (:func:`enable_wrap_bf16`)."""
    global _FSDP_BF16
    previous, _FSDP_BF16 = _FSDP_BF16, True
    try:
        return main(cfg, **kwargs)
    finally:
        _FSDP_BF16 = previous


def _fully_sharded_process_group_of_one(cfg):
    """Under ``--ddp-backend fully_sharded``, where fairseq finds no launcher (torchrun, SLURM) and
    would run one process without torch.distributed: one process, in a process group of one."""
    distributed = getattr(cfg, "distributed_training", None)
    if (
        distributed is None
        or distributed.ddp_backend != "fully_sharded"
        or getattr(cfg.common, "tpu", False)
    ):
        return
    if distributed.distributed_init_method is None:
        distributed_utils.infer_init_method(
            distributed
        )  # fairseq's own (torchrun, SLURM, several GPUs)
    if distributed.distributed_init_method is not None or distributed.distributed_world_size != 1:
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    distributed.distributed_init_method = f"tcp://127.0.0.1:{port}"
    distributed.distributed_no_spawn = True
    distributed.distributed_rank = 0
    if (cfg.common.cpu or no_gpu()) and distributed.distributed_backend == "nccl":
        distributed.distributed_backend = "gloo"
    logger.info(
        "--ddp-backend fully_sharded on one process: a process group of one (%s)",
        distributed.distributed_init_method,
    )


def enable_wrap_bf16(*args, **kwargs):
    """fairscale's ``enable_wrap`` as fairseq's ``fsdp_enable_wrap`` calls it, which sets
    ``compute_dtype`` float16 under ``--fp16`` and float32 otherwise: under ``--bf16`` FSDP keeps
    float32 parameters and computes in bfloat16."""
    if _FSDP_BF16 and kwargs.get("compute_dtype") == torch.float32:
        kwargs.update(mixed_precision=True, compute_dtype=torch.bfloat16)
    return fairseq_original(enable_wrap_bf16)(*args, **kwargs)


@contextlib.contextmanager
def _flag(section, name: str, value: bool):
    previous = getattr(section, name)
    setattr(section, name, value)
    try:
        yield
    finally:
        setattr(section, name, previous)


def trainer_init_fsdp_bf16(self, cfg, *args, **kwargs):
    """``Trainer.__init__``, past its refusal of ``--bf16`` under FSDP: with ``--bf16`` switched
    off while it runs it does the same (the model is not cast under FSDP: FSDP casts)."""
    init = fairseq_original(trainer_init_fsdp_bf16)
    if not _fsdp_bf16(cfg):
        return init(self, cfg, *args, **kwargs)
    with _flag(cfg.common, "bf16", False):
        return init(self, cfg, *args, **kwargs)


def trainer_consolidate_optimizer_fsdp(self):
    """``Trainer.consolidate_optimizer``; under FSDP in a world of one, each flat parameter that
    fairscale left without ``_full_param_padded`` (not sharded) gets one for the call, a meta tensor
    of its own size (no memory): what ``_gather_optim_state`` reads to size its gather buffers."""
    consolidate = fairseq_original(trainer_consolidate_optimizer_fsdp)
    if not self.is_fsdp or getattr(self.model, "world_size", None) != 1:
        return consolidate(self)
    added = [p for p in self.model.parameters() if not hasattr(p, "_full_param_padded")]
    for p in added:
        p._full_param_padded = torch.empty(p.size(), dtype=p.dtype, device="meta")
    try:
        return consolidate(self)
    finally:
        for p in added:
            del p._full_param_padded


def trainer_build_optimizer_fsdp_bf16(self):
    """``Trainer._build_optimizer``; under FSDP with ``--bf16`` the optimizer fairseq builds for
    ``--fp16`` under FSDP (``MemoryEfficientFP16Optimizer``), which sees ``--bf16`` and takes no loss
    scale."""
    build = fairseq_original(trainer_build_optimizer_fsdp_bf16)
    if not _fsdp_bf16(self.cfg):
        return build(self)
    with _flag(self.cfg.common, "fp16", True):
        return build(self)


def prepare_main(cfg, main):
    """What fairseq's ``call_main`` needs under ``--ddp-backend fully_sharded`` (else ``main`` as
    it is): ``main`` with FSDP computing in bfloat16 under ``--bf16``, and one process in a process
    group of one."""
    if _fsdp_bf16(cfg):
        main = functools.partial(main_with_fsdp_bf16, main)  # picklable: spawned workers run it too
    _fully_sharded_process_group_of_one(cfg)
    return main


def apply():
    from fairseq import trainer

    install(trainer.Trainer, "__init__", trainer_init_fsdp_bf16)
    install(trainer.Trainer, "_build_optimizer", trainer_build_optimizer_fsdp_bf16)
    install(trainer.Trainer, "consolidate_optimizer", trainer_consolidate_optimizer_fsdp)
    try:
        import fairscale.nn
    except (
        ImportError
    ):  # fairseq's fully sharded backend needs it; without it there is nothing to wrap
        pass
    else:
        install(fairscale.nn, "enable_wrap", enable_wrap_bf16)
