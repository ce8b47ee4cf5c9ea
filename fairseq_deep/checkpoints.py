"""A checkpoint loaded with this package's checks and errors, and what it holds: the one loader.

Every reader of a checkpoint loads it here: fairseq's own loader (``fairseq-generate``, the
trainer, the hub: :mod:`fairseq_deep.patches.checkpoint_errors` wraps ``load_checkpoint_to_cpu``
in :func:`checked` and :func:`check_registered`), the tools (``fairseq-deep-grow`` and
``-export``: :func:`load`; ``fairseq-deep-average-checkpoints``, ``-layer-weights``,
``fairseq-deep-train --model-from``, the own-data recipe: :func:`load_as_saved`) and the
hybrids' ``--hybrid-pretrained``.  A person's mistake ends in one
:class:`~fairseq_deep.errors.CheckpointError` (or :class:`~fairseq_deep.errors.MissingFileError`)
naming the file (and the option that named it), the cause and the fix:

- no such file; a file that ``torch.save`` did not write (a text file, ...);
- a refused (unsafe) file, where torch advises switching the weights-only check off;
- a truncated or unreadable one (torch's ``PytorchStreamReader failed ...``);
- a dict that is not a fairseq checkpoint (no ``model`` entry; fairseq's ``KeyError`` while it
  upgrades one);
- a model that no loaded plugin registers (another plugin's, a newer fairseq's; fairseq would say
  ``IndexError: Replacement index 1 out of range``);
- no model options (:func:`model_args`), a model that is not one of fairseq_deep's
  (:func:`family_of`);
- a fully sharded checkpoint saved with ``--use-sharded-state`` (each rank's shard in
  ``checkpoint_last-shardR.pt``; fairseq issues #4275, #4307) is read as one model
  (:func:`consolidated`: fairseq-generate, -interactive and the hub through
  :mod:`fairseq_deep.patches.checkpoint_errors`, the tools through :func:`load`), or refused in
  one line where a shard is missing.

torch's weights-only loading stays on (torch's default; :mod:`fairseq_deep.patches.safe_loading`
allow-lists the types a fairseq checkpoint holds).

Pinned by: tests/test_reliability.py (truncated, refused), tests/test_cli_errors.py (one line from
every script), tests/test_grow.py (``-k load``: every refusal of fairseq-deep-grow),
tests/test_export.py.
"""

import argparse
import copy
import os
import pickle
import re
import traceback
import zipfile
from typing import Callable, List, Optional, Tuple, TypeVar, Union

import torch
from fairseq import checkpoint_utils, utils

from .errors import CheckpointError, MissingFileError, import_optional

T = TypeVar("T")


def _where(path: str, option: Optional[str]) -> str:
    return f"{option} {path}" if option else str(path)


def _exists(path: str, option: Optional[str]):
    if not os.path.isfile(path):
        raise MissingFileError(f"{_where(path, option)}: no such checkpoint file")


def _fairseq_state(state, path: str, option: Optional[str]):
    if not isinstance(state, dict) or not isinstance(state.get("model"), dict):
        raise _not_fairseq(_where(path, option), "model")
    return state


def _not_fairseq(where: str, entry: str) -> CheckpointError:
    return CheckpointError(
        f"{where} is not a fairseq checkpoint: it has no {entry!r} entry. Use a checkpoint "
        f"written by fairseq-train (checkpoint_best.pt, checkpoint_last.pt) or by "
        f"fairseq-deep-average-checkpoints"
    )


def load(path: str, option: Optional[str] = None, arg_overrides=None) -> dict:
    """The state of the checkpoint ``path`` as fairseq's loader gives it (``load_checkpoint_to_cpu``:
    upgraded to this fairseq's format, ``arg_overrides`` applied to its options as fairseq
    applies them), with this package's checks; ``option``: the command-line option that named
    the file (``--checkpoint``), for the messages.  With the package imported, fairseq's function
    is itself wrapped in the same checks (patches/checkpoint_errors): a bad file is said once, by
    whichever check meets it first.  A fully sharded checkpoint's shards are read as one
    (:func:`consolidated`)."""
    state = consolidated(path, arg_overrides=arg_overrides, option=option)
    if state is not None:
        return _fairseq_state(state, path, option)
    _exists(path, option)
    state = checked(path, lambda: checkpoint_utils.load_checkpoint_to_cpu(path, arg_overrides))
    check_registered(path, state)
    return _fairseq_state(state, path, option)


def load_as_saved(path: str, option: Optional[str] = None, require_model: bool = True):
    """The state of the checkpoint ``path`` as it was saved (``torch.load`` to the CPU, weights-only
    at torch's default), with this package's checks: for tools that write it back (checkpoint
    averaging) or read a part of it (layer weights, model options); ``require_model=False``: also
    what is not a fairseq checkpoint (a bare state dict), for the caller to judge."""
    _exists(path, option)
    state = checked(path, lambda: torch.load(path, map_location="cpu"))
    return _fairseq_state(state, path, option) if require_model else state


# ---------------------------------------------------------------------------------------------
# a fully sharded checkpoint (--ddp-backend fully_sharded --use-sharded-state), read as one
# ---------------------------------------------------------------------------------------------

_SHARD = re.compile(r"^(?P<base>.+)-shard(?P<rank>\d+)\.pt$")


def shard_files(path: str, suffix: str = "") -> List[str]:
    """The files of the fully sharded checkpoint that ``path`` names, in rank order: ``path``
    itself being one of them (``checkpoint_best-shard0.pt``), or ``path`` being the name fairseq
    gives the checkpoint as a whole (``checkpoint_best.pt``, with ``--checkpoint-suffix``
    ``suffix``) where only its shards exist (fairseq writes ``checkpoint_best{suffix}-shardR.pt``
    for rank R); ``[]`` for any other checkpoint."""
    found = _SHARD.match(path)
    if found:
        base = found.group("base")
    elif path.endswith(".pt") and not os.path.isfile(path):
        base = path[: -len(".pt")] + suffix
    else:
        return []
    files = []
    while os.path.isfile(f"{base}-shard{len(files)}.pt"):
        files.append(f"{base}-shard{len(files)}.pt")
    return files


def _sharded_world(state) -> Optional[int]:
    """The world size a fully sharded checkpoint saved with --use-sharded-state was trained in
    (None: not such a checkpoint)."""
    cfg = state.get("cfg") if isinstance(state, dict) else None
    distributed = _cfg_get(cfg, "distributed_training") if cfg is not None else None
    if (
        "fsdp_metadata" not in state
        or not distributed
        or not _cfg_get(distributed, "use_sharded_state")
    ):
        return None
    return int(_cfg_get(distributed, "distributed_world_size") or 1)


def consolidated(
    path: str, suffix: str = "", arg_overrides=None, option: Optional[str] = None
) -> Optional[dict]:
    """The state of the fully sharded checkpoint ``path`` names (:func:`shard_files`) as the
    state of one model: fairscale's ``consolidate_shard_weights`` of every rank's shard (each
    loaded with fairseq's loader and this package's checks, ``arg_overrides`` applied as fairseq
    applies them), with every parameter that the model shares under another name (the tied
    embeddings) filled in; fairscale 0.4 fills in those of the last wrapped module only, so that
    a model with wrapped layers lost its tied output projection.  The optimizer's state and the
    shards' metadata are left out (the state decodes and seeds other tools; training resumes from
    the shards themselves).  None where ``path`` names no such checkpoint; a missing shard, or
    fairscale missing, is refused in one line."""
    files = shard_files(path, suffix)
    if not files:
        return None
    states = [
        checked(f, lambda f=f: checkpoint_utils.load_checkpoint_to_cpu(f, arg_overrides))
        for f in files
    ]
    world = _sharded_world(states[0])
    if world is None:
        raise CheckpointError(
            f"{_where(files[0], option)} is not a shard of a fully sharded checkpoint (no "
            "--use-sharded-state in its options): give the checkpoint fairseq-train wrote"
        )
    base = files[0][: -len("-shard0.pt")]
    if len(files) != world:
        raise CheckpointError(
            f"{_where(path, option)}: a fully sharded checkpoint of {world} shards "
            f"(--use-sharded-state), {len(files)} found ({base}-shard0.pt ...): copy every "
            f"{os.path.basename(base)}-shardR.pt, R = 0 ... {world - 1}, into {os.path.dirname(base) or '.'}"
        )
    fsdp = import_optional(
        "fairscale.nn.data_parallel",
        f"reading the fully sharded checkpoint {base}-shardR.pt",
        "fairscale (pip install -e '.[scale]')",
    ).FullyShardedDataParallel
    metadata = [s["fsdp_metadata"] for s in states]
    full = fsdp.consolidate_shard_weights(
        shard_weights=[s["model"] for s in states], shard_metadata=metadata, strict=False
    )
    for module in metadata[0]["param_metadata"]:
        prefix = module["fsdp_path"] + "." if module["fsdp_path"] else ""
        for source, target in module["shared_param_info"]:
            if prefix + source in full:
                full[prefix + target] = full[prefix + source]
    state = {
        k: v for k, v in states[0].items() if k not in ("fsdp_metadata", "last_optimizer_state")
    }
    state["model"] = full
    check_registered(files[0], state)
    return state


def check_consolidated(model, state_dict: dict, path: str):
    """A model loaded (not strictly) from :func:`consolidated`'s state holds every parameter: each
    of its own that the state lacks is another name of one the state has (a tied embedding), and
    the state holds nothing the model lacks; else a CheckpointError naming the first keys."""
    own = model.state_dict()
    loaded = {own[k].data_ptr() for k in own if k in state_dict}
    missing = [k for k in own if k not in state_dict and own[k].data_ptr() not in loaded]
    unexpected = [k for k in state_dict if k not in own]
    if missing or unexpected:
        raise CheckpointError(
            f"{path}: the fully sharded checkpoint's parameters do not fit the model as this code "
            f"builds it ({len(missing)} missing ({', '.join(missing[:3])}), {len(unexpected)} "
            f"unexpected ({', '.join(unexpected[:3])})): load it with the versions that wrote it"
        )


def peek(path: str, option: Optional[str] = None) -> Optional[dict]:
    """The state of the checkpoint ``path`` as saved, its tensors mapped from the file rather than
    read (``torch.load(mmap=True)``: fast whatever the model's size), with this package's checks:
    what the console scripts check before fairseq prints or creates anything (a missing, truncated,
    foreign or unregistered checkpoint; its model options).  None for a file of torch's legacy
    format, which cannot be mapped (fairseq's loader checks it when it reads it)."""
    _exists(path, option)
    with open(path, "rb") as f:
        legacy = f.read(1) == b"\x80"  # a pickle: torch's format before the zip archive
    if legacy:
        return None
    state = checked(path, lambda: torch.load(path, map_location="cpu", mmap=True))
    check_registered(path, state)
    return _fairseq_state(state, path, option)


def check_paths(args):
    """fairseq-generate's and -interactive's ``--path`` (checkpoints separated by ``:``), each
    :func:`peek`-ed: a mistake is said before fairseq prints its configuration."""
    for path in utils.split_paths(getattr(args, "path", None) or ""):
        # a local file (fairseq's PathManager also reads URLs); a fully sharded checkpoint's
        # shards are checked as they are read (:func:`consolidated`)
        if path and "://" not in path and not shard_files(path):
            peek(path, "--path")


def _raised_by_torch_load(exc: BaseException) -> bool:
    return any(
        f.filename.replace("\\", "/").endswith("torch/serialization.py")
        for f in traceback.extract_tb(exc.__traceback__)
    )


def _written_by_torch(path: str) -> bool:
    """Whether ``path`` starts as a file of ``torch.save`` (a zip archive, or a pickle: torch's
    legacy format); an empty file counts (a save cut short, said as such by :func:`checked`)."""
    with open(path, "rb") as f:
        head = f.read(4)
    return not head or head.startswith(b"PK\x03\x04") or head[:1] == b"\x80"


def checked(path: str, load: Callable[[], T]) -> T:
    """``load()`` of the checkpoint ``path``, its failures said as :class:`CheckpointError` (the
    file, the cause and the fix); a file that torch did not write is refused before it is read."""
    if os.path.isfile(path) and not _written_by_torch(path):
        raise CheckpointError(
            f"{path} is not a checkpoint (not a file torch.save wrote): give a checkpoint "
            "written by fairseq-train"
        )
    try:
        return load()
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
        raise _not_fairseq(path, e.args[0]) from e
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


def _saved_model_cfg(state):
    cfg = state.get("cfg") if isinstance(state, dict) else None
    if cfg is not None:
        return cfg.get("model") if hasattr(cfg, "get") else getattr(cfg, "model", None)
    return state.get("args") if isinstance(state, dict) else None


def _cfg_get(cfg, key):
    return cfg.get(key, None) if hasattr(cfg, "get") else getattr(cfg, key, None)


def check_registered(path: str, state):
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
    user_dir = (_cfg_get(common, "user_dir") if common is not None else None) or _cfg_get(
        state.get("args") or argparse.Namespace(), "user_dir"
    )
    import fairseq

    raise CheckpointError(
        f"{path} holds a model of --arch {name}, which neither fairseq {fairseq.__version__} nor a loaded "
        f"plugin registers: it was written "
        + (
            f"with the plugin --user-dir {user_dir}"
            if user_dir
            else "by another plugin or a newer fairseq"
        )
        + ". Load it with the plugin and the fairseq that wrote it (fairseq_deep's architectures: "
        "fairseq-deep-list-archs)"
    )


# ---------------------------------------------------------------------------------------------
# what a checkpoint holds: its model options, its family
# ---------------------------------------------------------------------------------------------


def as_namespace(cfg) -> Optional[argparse.Namespace]:
    """A copy of a model's options (a Namespace, a DictConfig or a dict) as a Namespace."""
    if cfg is None:
        return None
    if isinstance(cfg, argparse.Namespace):
        return copy.deepcopy(cfg)
    from omegaconf import OmegaConf  # fairseq's configuration library

    if OmegaConf.is_config(cfg):
        return argparse.Namespace(**OmegaConf.to_container(cfg, resolve=True, enum_to_str=True))
    return argparse.Namespace(**dict(cfg))


def saved_model_options(state) -> Optional[argparse.Namespace]:
    """The model options of a checkpoint's state (``cfg.model``, or ``args`` of older fairseq)."""
    if not isinstance(state, dict):
        return None
    cfg = state.get("cfg")
    model = None
    if cfg is not None:
        model = cfg.get("model", None) if hasattr(cfg, "get") else getattr(cfg, "model", None)
    return as_namespace(model if model is not None else state.get("args"))


def model_args(state, path: str, option: Optional[str] = None) -> argparse.Namespace:
    """The saved model options of a checkpoint's ``state`` as a namespace (a copy), or a
    :class:`CheckpointError` when it holds none."""
    saved = saved_model_options(state)
    if saved is None:
        raise CheckpointError(
            f"{_where(path, option)} holds no model options (no cfg.model, no args): give a "
            "checkpoint written by fairseq-train"
        )
    return saved


def family_of(
    args,
    path: str,
    tool: str,
    fairseqs_own: Union[str, Callable[[str], str]],
    error: type = CheckpointError,
    option: Optional[str] = None,
) -> Tuple[str, str]:
    """(arch, model name) of the fairseq_deep model that ``args`` (a checkpoint's model options)
    describe, or an ``error`` that says what ``tool`` takes ("fairseq-deep-grow grows"); for a model
    of fairseq's own, ``fairseqs_own`` says what to do (or gives it from fairseq's model name)."""
    from fairseq.models import ARCH_MODEL_NAME_REGISTRY, ARCH_MODEL_REGISTRY

    where = _where(path, option)
    arch = getattr(args, "arch", None) or getattr(args, "_name", None)
    if arch not in ARCH_MODEL_REGISTRY:
        raise error(
            f"{where} holds a model of --arch {arch}, which nothing loaded registers: {tool} the "
            "models of fairseq_deep (fairseq-deep-list-archs)"
        )
    family = ARCH_MODEL_NAME_REGISTRY[arch]
    if ARCH_MODEL_REGISTRY[arch].__module__.split(".")[0] != "fairseq_deep":
        advice = fairseqs_own(family) if callable(fairseqs_own) else fairseqs_own
        raise error(
            f"{where} holds fairseq's own --arch {arch}, not a model of fairseq_deep: {advice}"
        )
    return arch, family


def of_another_model(state: dict, model_state: dict, args: argparse.Namespace) -> dict:
    """A copy of the checkpoint ``state`` that holds another model (what fairseq-deep-grow and
    fairseq-deep-extract write): its parameters ``model_state`` and options ``args`` (in ``cfg``'s
    model and the old ``args``); the optimizer's state dropped (the old model's shapes: the next
    run resets it), EMA dropped, the training clock at 0 (the next run's --stop-time-hours is its
    own).  ``extra_state`` is a fresh dict the caller may add to."""
    from omegaconf import OmegaConf

    out = dict(state)
    out["model"] = model_state
    cfg = state.get("cfg")
    if cfg is not None:
        cfg = (
            OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
            if OmegaConf.is_config(cfg)
            else dict(cfg)
        )
        cfg["model"] = args
        out["cfg"] = cfg
    if state.get("args") is not None:
        out["args"] = args
    out["last_optimizer_state"] = None
    extra = dict(state.get("extra_state") or {})
    for stale in ("ema", "ema_fp32_params"):
        extra.pop(stale, None)
    extra["previous_training_time"] = 0.0
    out["extra_state"] = extra
    return out
