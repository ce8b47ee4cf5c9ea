"""Every shim for fairseq/torch versions, in one place.  Applied once, when fairseq_deep is imported.

1. Safe checkpoint loading (torch >= 2.6 loads with ``weights_only=True``): the exact types that
   fairseq checkpoints hold are allow-listed with ``torch.serialization.add_safe_globals``; the check
   stays on, so a checkpoint carrying anything else (e.g. a pickled callable) is still refused.
2. Evaluation covers every sentence: fairseq 0.12's ``batch_by_size`` drops the last batch when
   its size is not a multiple of ``--required-batch-size-multiple`` (fairseq issue #5036); we give
   the dropped sentences back as a final, smaller batch.
3. Clear checkpoint errors: a refused (unsafe) or truncated checkpoint, a checkpoint of another
   architecture, and one written by another plugin or other model code (a model nothing here
   registers; parameters that do not fit the model as this code builds it) stop with a message
   naming the file, the cause and the fix, instead of torch's advice to switch the weights-only
   check off, or fairseq's bare "please ensure that the architectures match".  Restoring a
   checkpoint for training (``Trainer.load_checkpoint``, which compares tensor shapes only) also
   compares the architecture options of our models (a head count, pre-/post-norm, DLCL's
   settings: :mod:`~fairseq_deep.model_options`) and refuses a difference, naming each option.
4. ``torchrun`` on CPU: fairseq divides by ``torch.cuda.device_count()``, keeps the default
   ``nccl`` backend, ignores torchrun's ``WORLD_SIZE`` when the default world size is 1, and passes
   ``device_ids`` to torch DDP, which rejects them for CPU modules.  Each fix applies only where
   no GPU exists (where fairseq would fail or silently run independent copies).

5. Mixed precision: ``--bf16`` on a GPU (or CPU) instead of a TPU (fairseq 0.12 sets ``--tpu``
   whenever ``--bf16`` is given; without torch_xla installed that can only be a mistake, so the
   TPU flag is dropped), decoding in bfloat16 (fairseq-generate/-interactive and the hub interface
   cast to half for ``--fp16`` only), ``--fp16`` with an optimizer that needs its parameter groups
   (``--optimizer deep_att``: flat float32 master weights would merge them, so fairseq's
   ``--fp16-no-flatten-grads`` is set for it) and ``--fp16`` on a machine without GPU (fairseq's
   flat master weights are allocated on ``torch.cuda.current_device()``), and a clear error for
   ``--memory-efficient-fp16`` with an optimizer that does not support it.  And ``--fp16`` on CPU
   (slow, but what CI can run): flat master weights and fairseq's gradient-overflow handling
   assume CUDA; on a machine without it they work on CPU.
6. fairseq 0.12.2's encoder layer (the official release, Python <= 3.10) carries a
   "BetterTransformer" fast path: eight extra parameters per layer (fused copies of the attention
   and FFN weights, filled when a state dict is loaded) and, in eval mode without grad, a fused
   kernel that expects batch-first input, a known mask type and fairseq's own sub-modules.  Our
   stacks call layers time-first, replace layer norms (post-norm DLCL, ReZero) and add parameters,
   so the fast path would decode wrong or crash, and the unused copies would stop DDP and inflate
   parameter counts.  :func:`without_better_transformer` turns it off for every encoder layer the
   package builds (on fairseq versions without it, it only drops the keys of 0.12.2 checkpoints):
   the same parameters, the same outputs and the same checkpoints on both stacks.
7. The hub interface on sentencepiece data: ``from_pretrained`` without ``bpe=`` would translate
   words as if they were pieces; :func:`hub_from_pretrained_checked` applies
   the ``spm.model`` beside the data (with a warning) or stops naming the arguments, as
   fairseq-deep-interactive does on the command line.

8. Fully sharded training (``--ddp-backend fully_sharded``, fairscale's FSDP) in bfloat16: fairseq
   0.12 refuses ``--bf16`` there with a flag check in ``Trainer.__init__`` (the model is not cast
   there under FSDP) and would hand FSDP float32 as its compute dtype; with ``--bf16`` FSDP now
   keeps float32 parameters and computes in bfloat16 (``mixed_precision``, as fairseq does for
   ``--fp16``), and the optimizer is the one fairseq builds for ``--fp16`` under FSDP
   (``MemoryEfficientFP16Optimizer`` over FSDP's float32 flat parameters), without a loss scale.
   ``--memory-efficient-bf16`` (bfloat16 parameters) stays refused.  And on one GPU: fairseq runs
   a world of one without initialising torch.distributed and hands FSDP a dummy process group,
   but fairscale 0.4 asks torch.distributed for a reduce-scatter group in FSDP's constructor
   (``torch.distributed is not yet initialized``) and fairseq's checkpoint loading broadcasts over
   the group; so a fully sharded run of one process gets a process group of one (fairseq's own
   ``distributed_init``, as for several GPUs, on a free local port), as ``torchrun`` would give it.
   fairscale's ``gather_full_optim_state_dict`` (fairseq calls it for every checkpoint) sizes its
   gather buffers by an attribute that fairscale makes only for sharded parameters: in a world of
   one it stopped the first checkpoint (``'FlatParameter' object has no attribute
   '_full_param_padded'``, seen on an H200); there the buffer is the parameter's own size.

Every shim wraps fairseq's own function and calls it; nothing here changes results on GPUs,
except that ``--bf16`` works there (also fully sharded).
"""

import argparse
import collections
import contextlib
import contextvars
import functools
import logging
import os
import pickle
import re
import socket
import traceback
import typing
import zipfile

import numpy as np
import torch

from fairseq import checkpoint_utils
from fairseq.data import Dictionary, data_utils
from fairseq.distributed import utils as distributed_utils

from .errors import CheckpointError, MissingFileError  # noqa: F401  (CheckpointError: also imported from here)
from . import interactive

logger = logging.getLogger(__name__)


# -- 1. safe checkpoint loading -------------------------------------------------------------------


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


# -- 2. evaluation covers every sentence ----------------------------------------------------------


def batch_by_size_all(indices, num_tokens_fn, num_tokens_vec=None, max_tokens=None,
                      max_sentences=None, required_batch_size_multiple=1, fixed_shapes=None):
    """fairseq's ``batch_by_size``, with the sentences of a dropped final batch given back."""
    if not isinstance(indices, np.ndarray):  # an iterator would be consumed by fairseq's call
        indices = np.fromiter(indices, dtype=np.int64, count=-1)
    batches = fairseq_original(batch_by_size_all)(
        indices, num_tokens_fn, num_tokens_vec=num_tokens_vec, max_tokens=max_tokens,
        max_sentences=max_sentences, required_batch_size_multiple=required_batch_size_multiple,
        fixed_shapes=fixed_shapes,
    )
    covered = sum(len(b) for b in batches)
    if covered < len(indices):
        seen = np.concatenate(batches) if len(batches) else np.empty(0, dtype=np.int64)
        missing = indices[~np.isin(indices, seen)].astype(np.int64)
        batches = list(batches) + [missing]
    return batches


# -- 3. clear checkpoint errors --------------------------------------------------------------------


def _raised_by_torch_load(exc: BaseException) -> bool:
    return any(f.filename.replace("\\", "/").endswith("torch/serialization.py")
               for f in traceback.extract_tb(exc.__traceback__))


#: this run's model options while ``Trainer.load_checkpoint`` restores a checkpoint (else None)
_RESTORING = contextvars.ContextVar("fairseq_deep_restoring", default=None)


def load_checkpoint_to_cpu_checked(path, *args, **kwargs):
    """fairseq's ``load_checkpoint_to_cpu``; a refused or unreadable file, or one whose model no
    loaded plugin registers, raises CheckpointError; so does, while the trainer restores it, one
    whose architecture options differ from this run's (:func:`trainer_load_checkpoint_checked`)."""
    state = _checked_load(fairseq_original(load_checkpoint_to_cpu_checked), path, *args, **kwargs)
    _check_model_registered(path, state)
    if _RESTORING.get() is not None:
        from .model_options import check_same_architecture, saved_model_options

        check_same_architecture(path, saved_model_options(state), _RESTORING.get())
    return state


def _saved_model_cfg(state):
    cfg = state.get("cfg") if isinstance(state, dict) else None
    if cfg is not None:
        return cfg.get("model") if hasattr(cfg, "get") else getattr(cfg, "model", None)
    return state.get("args") if isinstance(state, dict) else None


def _cfg_get(cfg, key):
    return cfg.get(key, None) if hasattr(cfg, "get") else getattr(cfg, key, None)


def _check_model_registered(path, state):
    """A checkpoint of another plugin (or of a newer fairseq) names a model that nothing here
    registers; fairseq would stop with ``IndexError: Replacement index 1 out of range``."""
    from fairseq.models import ARCH_MODEL_REGISTRY, MODEL_REGISTRY

    model_cfg = _saved_model_cfg(state)
    if model_cfg is None:
        return
    name = _cfg_get(model_cfg, "_name") or _cfg_get(model_cfg, "arch")
    if name is None or name in ARCH_MODEL_REGISTRY or name in MODEL_REGISTRY:
        return
    cfg = state.get("cfg") or {}
    common = cfg.get("common") if hasattr(cfg, "get") else None
    user_dir = (_cfg_get(common, "user_dir") if common is not None else None) or \
        _cfg_get(state.get("args") or argparse.Namespace(), "user_dir")
    import fairseq

    raise CheckpointError(
        f"{path} holds a model of --arch {name}, which neither fairseq {fairseq.__version__} nor a loaded "
        f"plugin registers: it was written "
        + (f"with the plugin --user-dir {user_dir}" if user_dir else "by another plugin or a newer fairseq")
        + ". Load it with the plugin and the fairseq that wrote it (fairseq_deep's architectures: "
          "fairseq-deep-list-archs)"
    )


def torch_load_checked(path):
    """``torch.load(path, map_location="cpu")`` (weights_only at torch's default) with the errors of
    :func:`load_checkpoint_to_cpu_checked`: for tools that read a checkpoint as it is saved
    (checkpoint averaging, layer-weight export)."""
    if not os.path.isfile(path):
        raise MissingFileError(f"{path}: no such checkpoint file")
    return _checked_load(torch.load, path, map_location="cpu")


def _checked_load(load, path, *args, **kwargs):
    try:
        return load(path, *args, **kwargs)
    except pickle.UnpicklingError as e:
        found = re.search(r"(?:Unsupported global: |unsupported )GLOBAL ([\w.]+)", str(e))
        what = f"a reference to {found.group(1)}" if found else "an object"
        raise CheckpointError(
            f"{path} was not loaded: it holds {what}, which is not among the types a fairseq "
            f"checkpoint contains; loading it could run code, so it is refused (torch.load with "
            f"weights_only=True). Use a checkpoint written by fairseq-train; do not load this file "
            f"with the weights-only check switched off (TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1) "
            f"unless you made it yourself."
        ) from e
    except FileNotFoundError:
        raise
    except KeyError as e:  # fairseq's upgrade of a dict that is not one of its checkpoints
        raise CheckpointError(
            f"{path} is not a fairseq checkpoint: it has no {e.args[0]!r} entry. Use a checkpoint "
            f"written by fairseq-train (checkpoint_best.pt, checkpoint_last.pt) or by "
            f"fairseq-deep-average-checkpoints"
        ) from e
    except (RuntimeError, OSError, EOFError, ValueError, zipfile.BadZipFile) as e:
        if not _raised_by_torch_load(e):
            raise
        size = os.path.getsize(path) if os.path.exists(path) else 0
        raise CheckpointError(
            f"{path} ({size} bytes) is not a complete checkpoint: torch could not read it "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else 'no detail'}). It was "
            f"probably truncated (an interrupted copy or save, a full disk). Use another checkpoint "
            f"(checkpoint_best.pt or an earlier checkpoint_N.pt), or copy the file again; to resume "
            f"training, pass --restore-file with a complete checkpoint."
        ) from e


def load_model_ensemble_and_task_checked(filenames, *args, **kwargs):
    """fairseq's ``load_model_ensemble_and_task`` (fairseq-generate, -interactive, the hub):
    parameters that do not fit the model (a checkpoint of other model code: a newer fairseq or
    fairseq_deep, another plugin) raise CheckpointError naming the file and the keys."""
    try:
        return fairseq_original(load_model_ensemble_and_task_checked)(filenames, *args, **kwargs)
    except KeyError as e:
        # fairseq 0.12.2's encoder layer reads its q/k/v weights from the state dict before torch
        # matches the keys: a missing one is a KeyError there
        if not any(f.name == "_load_from_state_dict" for f in traceback.extract_tb(e.__traceback__)):
            raise
        raise CheckpointError(
            f"{', '.join(map(str, filenames))}: the checkpoint's parameters do not fit the model as this "
            f"code builds it (missing ({e.args[0]}, ...)): it was written by other model code (a newer or "
            f"older fairseq or fairseq_deep, another plugin). Load it with the versions that wrote it"
        ) from e
    except RuntimeError as e:
        text = str(e)
        if not text.startswith("Error(s) in loading state_dict"):
            raise
        parts = _state_dict_mismatch(text)
        model = text.splitlines()[0].rsplit(" for ", 1)[-1].rstrip(":")
        raise CheckpointError(
            f"{', '.join(map(str, filenames))}: the checkpoint's parameters do not fit {model} as this "
            f"code builds it ({'; '.join(parts) or 'different names or shapes'}): it was written by "
            f"other model code (a newer or older fairseq or fairseq_deep, another plugin). Load it with "
            f"the versions that wrote it"
        ) from e


def _state_dict_mismatch(text: str) -> typing.List[str]:
    """What torch's "Error(s) in loading state_dict" says, short: the first tensors of another
    shape (both shapes), and the counts and first names of missing and unexpected keys."""
    shapes = re.findall(r"size mismatch for ([^:]+): copying a param with shape torch\.Size\(\[([^\]]*)\]\) "
                        r"from checkpoint, the shape in current model is torch\.Size\(\[([^\]]*)\]\)", text)
    shown = [f"{name}: checkpoint {a.replace(', ', 'x')}, this model {b.replace(', ', 'x')}"
             for name, a, b in shapes[:2]]
    parts = [f"{len(shapes)} of another shape ({', '.join(shown)}{', ...' if len(shapes) > 2 else ''})"] if shapes else []
    keys = {kind: re.findall(r'"([^"]+)"', found.group(1)) for kind in ("Missing", "Unexpected")
            for found in [re.search(kind + r" key\(s\) in state_dict: (.*?)(?:\.\s*$|\.\s*\n)", text, re.S | re.M)]
            if found}
    return parts + [f"{len(v)} {kind.lower()} ({', '.join(v[:3])}{', ...' if len(v) > 3 else ''})"
                    for kind, v in keys.items()]


def trainer_load_checkpoint_checked(self, filename, *args, **kwargs):
    """fairseq's ``Trainer.load_checkpoint`` (``--restore-file``, a resumed ``--save-dir``,
    ``--finetune-from-model``; fairseq compares the shapes of the tensors only): a checkpoint
    whose model differs from this run's in an architecture option (the head count, pre-/post-norm,
    the DLCL settings, ... :mod:`~fairseq_deep.model_options`) stops before any parameter is
    loaded, naming each option with both values; parameters that do not fit otherwise name the
    options or the first tensors that differ."""
    token = _RESTORING.set(self.cfg.model)
    try:
        extra_state = fairseq_original(trainer_load_checkpoint_checked)(self, filename, *args, **kwargs)
        _say_training_time(self, filename)
        return extra_state
    except Exception as e:
        if not str(e).startswith("Cannot load model parameters from checkpoint"):
            raise
        from .model_options import describe, differences, saved_model_options

        cause = str(e.__context__) if e.__context__ is not None else ""
        try:
            found = describe(differences(saved_model_options(fairseq_original(load_checkpoint_to_cpu_checked)(
                filename)), self.cfg.model))
        except Exception:  # noqa: BLE001 - the options are a courtesy; the tensors are named below
            found = ""
        what = (f"its model options differ from this run's: {found}" if found else
                "; ".join(_state_dict_mismatch(cause)) or (cause.strip().splitlines() or ["?"])[0][:300])
        raise CheckpointError(
            f"{filename}: the checkpoint's parameters do not fit the model of this run ({what}). Fix: train "
            f"with the checkpoint's model options (fairseq-deep-train --model-from {filename} takes them all), "
            f"or start a new model in another --save-dir (the checkpoint was not modified)"
        ) from e
    finally:
        _RESTORING.reset(token)


def _say_training_time(trainer, filename):
    """Log the training time a restored checkpoint brings, which fairseq's ``--stop-time-hours``
    counts (``cumulative_training_time``), and what is left of it: fairseq says nothing, and a
    budget spent by an earlier run trains one update."""
    from .progress import hms

    stop_s = (trainer.cfg.optimization.stop_time_hours or 0) * 3600
    spent = getattr(trainer, "_previous_training_time", 0) or 0
    if stop_s <= 0 or spent <= 0:
        return
    left = stop_s - spent
    say = logger.info if left > 0.1 * stop_s else logger.warning
    say("%s trained %s already, which --stop-time-hours %g counts: %s", filename, hms(spent),
        stop_s / 3600, f"{hms(left)} left" if left > 0 else
        "nothing is left, training stops after one update (raise --stop-time-hours; fairseq-deep-grow "
        "writes a checkpoint with no training time unless given --keep-training-time)")


def infer_language_pair_checked(path):
    """fairseq's ``infer_language_pair``; a folder without binarized data stops with what it needs
    (fairseq: "Could not infer language pair, please provide it explicitly")."""
    src, tgt = fairseq_original(infer_language_pair_checked)(path)
    if src is None or tgt is None:
        dicts = sorted(f for f in os.listdir(path) if re.fullmatch(r"dict\..+\.txt", f)) if os.path.isdir(path) else []
        raise MissingFileError(
            f"{path}: cannot tell the language pair: no binarized data (<split>.<src>-<tgt>.<lang>.idx) "
            f"in it{'' if os.path.isdir(path) else ' (no such directory)'}"
            + (f"; dictionaries found: {', '.join(dicts)}" if dicts else "")
            + ". Pass --source-lang and --target-lang (hub: source_lang=, target_lang=) and a data "
              "directory holding dict.<src>.txt and dict.<tgt>.txt (the --destdir of fairseq-preprocess)"
        )
    return src, tgt


def load_dictionary_checked(cls, f):
    """fairseq's ``Dictionary.load``; a missing dictionary file names itself and where it comes from."""
    try:
        return fairseq_original(load_dictionary_checked)(cls, f)
    except FileNotFoundError as e:
        if not isinstance(f, str) or isinstance(e, MissingFileError):
            raise
        folder = os.path.dirname(f) or "."
        found = sorted(x for x in os.listdir(folder) if re.fullmatch(r"dict\..+\.txt", x)) if os.path.isdir(folder) else []
        raise MissingFileError(
            f"{f}: no such dictionary"
            + (f" (found in {folder}: {', '.join(found)}; check --source-lang/--target-lang)" if found
               else f" ({folder} has no dict.<lang>.txt{'' if os.path.isdir(folder) else ': no such directory'})")
            + ". Pass the data directory written by fairseq-preprocess (--destdir), which holds "
              "dict.<src>.txt and dict.<tgt>.txt of the model's training data"
        ) from e


# -- 4. torchrun on CPU ----------------------------------------------------------------------------


def _no_gpu() -> bool:
    return torch.cuda.device_count() == 0


def infer_init_method_cpu(cfg, *args, **kwargs):
    """Under torchrun without GPUs, take the world size from torchrun (as fairseq does on GPUs)."""
    launched = all(k in os.environ for k in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK"))
    if (_no_gpu() and launched and cfg.distributed_init_method is None
            and cfg.distributed_world_size == 1 and int(os.environ["WORLD_SIZE"]) > 1):
        cfg.distributed_world_size = int(os.environ["WORLD_SIZE"])
    return fairseq_original(infer_init_method_cpu)(cfg, *args, **kwargs)


def torch_launch_init_cpu(cfg):
    """fairseq's torchrun init, without the division by zero GPUs and with gloo instead of nccl."""
    if not _no_gpu():
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
            super().__init__(module, *args, device_ids=device_ids, output_device=output_device, **kwargs)

    return DistributedDataParallel


# -- 5. mixed precision -----------------------------------------------------------------------------


def _has_torch_xla() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch_xla") is not None


def call_main_compat(cfg, main, **kwargs):
    """fairseq's ``call_main``, after taking back the ``--tpu`` that ``--bf16`` implied where no
    TPU runtime (torch_xla) is installed; and, under ``--ddp-backend fully_sharded``, with FSDP
    computing in bfloat16 under ``--bf16`` and a process group of one on one GPU (shim 8)."""
    common = cfg.common
    if getattr(common, "bf16", False) and getattr(common, "tpu", False) and not _has_torch_xla():
        logger.info("--bf16 without torch_xla: training in bfloat16 on %s, not on a TPU",
                    "CPU" if common.cpu or _no_gpu() else "the GPU")
        common.tpu = False
    if _fsdp_bf16(cfg):
        main = functools.partial(main_with_fsdp_bf16, main)  # picklable: spawned workers run it too
    _fully_sharded_process_group_of_one(cfg)
    return fairseq_original(call_main_compat)(cfg, main, **kwargs)


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
        if needs_groups or _no_gpu():
            logger.info("--fp16: float32 master weights per parameter (--fp16-no-flatten-grads) %s",
                        f"for --optimizer {name}, which keeps parameter groups" if needs_groups
                        else "since there is no GPU")
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


def memory_efficient_fp16_build_optimizer(cls, cfg, params, **kwargs):
    """``MemoryEfficientFP16Optimizer.build_optimizer`` with an error that names the alternative."""
    try:
        return fairseq_original(memory_efficient_fp16_build_optimizer)(cls, cfg, params, **kwargs)
    except ValueError as e:
        if "Unsupported optimizer" not in str(e):
            raise
        name = getattr(cfg.optimizer, "_name", "?")
        raise ValueError(
            f"--memory-efficient-fp16 needs an optimizer that keeps float32 state for float16 "
            f"parameters; --optimizer {name} does not. Use --fp16 (float32 master weights) or "
            f"--amp instead.") from None


# -- 6. no BetterTransformer fast path in our encoder layers ---------------------------------------

#: the fused copies that fairseq 0.12.2's TransformerEncoderLayerBase adds for its fast path
BETTER_TRANSFORMER_PARAMS = ("in_proj_weight", "in_proj_bias", "out_proj_weight", "out_proj_bias",
                             "fc1_weight", "fc1_bias", "fc2_weight", "fc2_bias")


def without_better_transformer(layer):
    """``layer`` (a fairseq encoder layer, or a subclass) without fairseq 0.12.2's fast path.

    Removes the layer's fused parameter copies (never trained: they are only filled on loading),
    keeps the fused kernel from being chosen (``can_use_fastpath``; the stacks of this package also
    never enter fairseq's nested-tensor encoder loop), and drops those keys from any state dict
    the layer loads, whether 0.12.2's ``_load_from_state_dict`` just made them or a checkpoint
    written on 0.12.2 holds them.  Returns the layer."""
    for name in BETTER_TRANSFORMER_PARAMS:
        if name in layer._parameters:
            del layer._parameters[name]
    if hasattr(layer, "can_use_fastpath"):
        layer.can_use_fastpath = False
    if _drop_better_transformer_keys not in layer._load_state_dict_pre_hooks.values():
        layer._register_load_state_dict_pre_hook(_drop_better_transformer_keys)
    return layer


def _drop_better_transformer_keys(state_dict, prefix, *args):
    """Load-state-dict pre-hook: runs after 0.12.2's ``_load_from_state_dict`` added the fused
    copies and before torch matches keys, so neither stack sees them as unexpected."""
    for name in BETTER_TRANSFORMER_PARAMS:
        state_dict.pop(prefix + name, None)


def without_better_transformer_keys(state_dict):
    """A copy of ``state_dict`` without the fused copies of fairseq 0.12.2's encoder layers (a
    checkpoint of fairseq's own ``transformer`` written on 0.12.2 holds them, zeros unless it was
    loaded before): the entries ``P.in_proj_weight``, ... of every layer ``P`` that has
    ``P.self_attn.q_proj.weight``."""
    suffix = "self_attn.q_proj.weight"
    fused = {prefix + name for prefix in (k[:-len(suffix)] for k in state_dict if k.endswith("." + suffix))
             for name in BETTER_TRANSFORMER_PARAMS}
    return type(state_dict)((k, v) for k, v in state_dict.items() if k not in fused)


# -- 7. the hub interface on sentencepiece data ---------------------------------------------------


def hub_from_pretrained_checked(model_name_or_path, checkpoint_file="model.pt", data_name_or_path=".",
                                archive_map=None, **kwargs):
    """fairseq's ``hub_utils.from_pretrained`` (``Model.from_pretrained``, the hub interface), then
    :func:`~fairseq_deep.interactive.sentencepiece_to_apply`: without ``bpe=`` the hub's
    ``translate`` passes words to a model that knows sentencepiece pieces (``<unk>`` everywhere,
    pieces in the output, no error), so the ``spm.model`` beside the data is applied, with a
    warning, or the load stops naming the arguments to give."""
    from omegaconf import open_dict

    from .quiet import quiet_pin_memory

    if not torch.cuda.is_available():
        quiet_pin_memory()  # torch's warning on every translate(): fairseq's batches ask for pinned memory
    loaded = fairseq_original(hub_from_pretrained_checked)(
        model_name_or_path, checkpoint_file, data_name_or_path, archive_map, **kwargs)
    cfg = loaded["args"]
    if loaded["task"] is None or isinstance(cfg, dict):  # fairseq's vocoders: no text in or out
        return loaded
    model = interactive.sentencepiece_to_apply(cfg, how="hub")
    if model is not None:
        interactive.logger.warning(
            "the data is sentencepiece data and no bpe= was given: translating with bpe='sentencepiece', "
            "sentencepiece_model=%r (found beside the data; pass bpe= to choose)", model)
        with open_dict(cfg):
            cfg.bpe = {"_name": "sentencepiece", "sentencepiece_model": model}
    return loaded


# -- 8. bf16 with fully sharded training -----------------------------------------------------------

#: True while a training ``main`` runs under ``--bf16 --ddp-backend fully_sharded`` (the model is
#: built, and wrapped, inside it, before any Trainer exists)
_FSDP_BF16 = False


def _fsdp_bf16(cfg) -> bool:
    """``--bf16 --ddp-backend fully_sharded`` (``--memory-efficient-bf16`` is left to fairseq's refusal)."""
    common, distributed = getattr(cfg, "common", None), getattr(cfg, "distributed_training", None)
    return (common is not None and distributed is not None and bool(getattr(common, "bf16", False))
            and not getattr(common, "memory_efficient_bf16", False)
            and getattr(distributed, "ddp_backend", None) == "fully_sharded")


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
    if distributed is None or distributed.ddp_backend != "fully_sharded" or getattr(cfg.common, "tpu", False):
        return
    if distributed.distributed_init_method is None:
        distributed_utils.infer_init_method(distributed)  # fairseq's own (torchrun, SLURM, several GPUs)
    if distributed.distributed_init_method is not None or distributed.distributed_world_size != 1:
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    distributed.distributed_init_method = f"tcp://127.0.0.1:{port}"
    distributed.distributed_no_spawn = True
    distributed.distributed_rank = 0
    if (cfg.common.cpu or _no_gpu()) and distributed.distributed_backend == "nccl":
        distributed.distributed_backend = "gloo"
    logger.info("--ddp-backend fully_sharded on one process: a process group of one (%s)",
                distributed.distributed_init_method)


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


# -- apply -----------------------------------------------------------------------------------------

_ORIGINAL = {}  # each shim -> the fairseq function it stands in for


def fairseq_original(shim):
    """The fairseq function that ``shim`` replaced (and calls)."""
    return _ORIGINAL[shim]


def _install(owner, name, shim, as_classmethod=False):
    """Put ``shim`` in place of ``owner.name``, once (importing the plugin twice changes nothing)."""
    current = getattr(owner, name)
    if getattr(current, "_fairseq_deep", False):
        return
    _ORIGINAL[shim] = current.__func__ if as_classmethod else current
    shim._fairseq_deep = True
    setattr(owner, name, classmethod(shim) if as_classmethod else shim)


def apply():
    from fairseq import hub_utils, trainer
    from fairseq.models import BaseFairseqModel, distributed_fairseq_model
    from fairseq.optim.fp16_optimizer import FP16Optimizer, MemoryEfficientFP16Optimizer

    allow_fairseq_checkpoints()
    for owner, name, shim, as_classmethod in [
        (data_utils, "batch_by_size", batch_by_size_all, False),                          # 2
        (checkpoint_utils, "load_checkpoint_to_cpu", load_checkpoint_to_cpu_checked, False),  # 3
        (checkpoint_utils, "load_model_ensemble_and_task", load_model_ensemble_and_task_checked, False),
        (data_utils, "infer_language_pair", infer_language_pair_checked, False),
        (Dictionary, "load", load_dictionary_checked, True),
        (trainer.Trainer, "load_checkpoint", trainer_load_checkpoint_checked, False),
        (distributed_utils, "infer_init_method", infer_init_method_cpu, False),             # 4
        (distributed_utils, "_infer_torch_distributed_launch_init", torch_launch_init_cpu, False),
        (trainer.Trainer, "train_step", trainer_train_step_cpu_fp16, False),                # 5
        (distributed_utils, "call_main", call_main_compat, False),
        (BaseFairseqModel, "prepare_for_inference_", prepare_for_inference_bf16, False),
        (FP16Optimizer, "build_optimizer", fp16_build_optimizer, True),
        (MemoryEfficientFP16Optimizer, "build_optimizer", memory_efficient_fp16_build_optimizer, True),
        (hub_utils, "from_pretrained", hub_from_pretrained_checked, False),               # 7
        (trainer.Trainer, "__init__", trainer_init_fsdp_bf16, False),                       # 8
        (trainer.Trainer, "_build_optimizer", trainer_build_optimizer_fsdp_bf16, False),
        (trainer.Trainer, "consolidate_optimizer", trainer_consolidate_optimizer_fsdp, False),
    ]:
        _install(owner, name, shim, as_classmethod)
    try:
        import fairscale.nn
    except ImportError:  # fairseq's fully sharded backend needs it; without it there is nothing to wrap
        pass
    else:
        _install(fairscale.nn, "enable_wrap", enable_wrap_bf16)
    if not getattr(distributed_fairseq_model.DistributedDataParallel, "_fairseq_deep_cpu", False):
        ddp = _ddp_for_cpu_modules(distributed_fairseq_model.DistributedDataParallel)
        ddp._fairseq_deep_cpu = True
        distributed_fairseq_model.DistributedDataParallel = ddp

apply()
