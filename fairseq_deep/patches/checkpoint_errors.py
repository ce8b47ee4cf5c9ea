"""Checkpoint errors that name the file, the cause and the fix (error messages, not version shims).

Replaces, each by a wrapper that calls fairseq's function and rewrites only its failure:

- ``fairseq.checkpoint_utils.load_checkpoint_to_cpu``: a refused (unsafe) file, where torch
  advises switching the weights-only check off; a truncated or unreadable one (torch's
  ``PytorchStreamReader failed ...``); a dict that is not a fairseq checkpoint (fairseq's
  ``KeyError``); a model that no loaded plugin registers (another plugin's, a newer fairseq's:
  fairseq's ``IndexError: Replacement index 1 out of range``) -> :class:`~fairseq_deep.errors.CheckpointError`;
- ``fairseq.checkpoint_utils.load_model_ensemble_and_task`` (fairseq-generate, -interactive, the
  hub): parameters that do not fit the model as this code builds it (torch's "Error(s) in loading
  state_dict", or 0.12.2's ``KeyError`` of a missing q/k/v weight) -> the file and the first keys;
  a fully sharded checkpoint saved with ``--use-sharded-state``, which fairseq misreads (its first
  shard's flat parameters loaded into the model: "Missing key(s) ... Unexpected key(s):
  flat_param_0"; fairseq issues #4275, #4307), is read as one by the one loader
  (:func:`fairseq_deep.checkpoints.consolidated`), or refused in one line where a shard is missing;
- ``fairseq.trainer.Trainer.load_checkpoint`` (``--restore-file``, a resumed ``--save-dir``,
  ``--finetune-from-model``; fairseq compares tensor shapes only, then says "please ensure that
  the architectures match"): every architecture option of our models is compared with the
  checkpoint's (:mod:`~fairseq_deep.model_options`) and a difference stops before any parameter is
  loaded, naming each option with both values; and the training time a restored checkpoint brings,
  which ``--stop-time-hours`` counts, is logged (fairseq says nothing).

The checks and messages of a loaded file are the package's one checkpoint loader's
(:mod:`fairseq_deep.checkpoints`, which the tools load with); this module puts them around
fairseq's functions.

Versions: every fairseq 0.12 (0.12.2 and ve-fairseq 0.12.3) and torch; the refused-file message
matters from torch 2.6 (weights-only by default).

Pinned by: tests/test_reliability.py (truncated, refused, another architecture), tests/test_cli_errors.py
(``test_checkpoint_of_another_plugin_or_other_model_code``, one line from every script),
tests/test_continue.py (``test_a_changed_architecture_option_is_named_with_both_values``,
``test_mismatch_names_the_tensors_that_differ``), tests/test_grow.py, tests/test_export.py.
"""

import contextvars
import inspect
import logging
import re
import traceback
import typing

from fairseq import checkpoint_utils

from ..checkpoints import (
    check_consolidated,
    check_registered,
    checked,
    consolidated,
    saved_model_options,
    shard_files,
)
from ..errors import CheckpointError
from ..model_options import check_same_architecture, describe, differences
from ..progress import hms
from .install import fairseq_original, install

logger = logging.getLogger(__name__)


#: this run's model options while ``Trainer.load_checkpoint`` restores a checkpoint (else None)
_RESTORING = contextvars.ContextVar("fairseq_deep_restoring", default=None)


def load_checkpoint_to_cpu_checked(path, *args, **kwargs):
    """fairseq's ``load_checkpoint_to_cpu``; a refused or unreadable file, or one whose model no
    loaded plugin registers, raises CheckpointError; so does, while the trainer restores it, one
    whose architecture options differ from this run's (:func:`trainer_load_checkpoint_checked`)."""
    original = fairseq_original(load_checkpoint_to_cpu_checked)
    state = checked(path, lambda: original(path, *args, **kwargs))
    check_registered(path, state)
    if _RESTORING.get() is not None:
        check_same_architecture(path, saved_model_options(state), _RESTORING.get())
    return state


def load_model_ensemble_and_task_checked(filenames, *args, **kwargs):
    """fairseq's ``load_model_ensemble_and_task`` (fairseq-generate, -interactive, the hub):
    parameters that do not fit the model (a checkpoint of other model code: a newer fairseq or
    fairseq_deep, another plugin) raise CheckpointError naming the file and the keys.  A fully
    sharded checkpoint saved with ``--use-sharded-state`` (fairseq issues #4275, #4307: fairseq
    loads its first shard's flat parameters into the model, or consolidates the shards only when
    told their number and then loses the tied embeddings) is read as one
    (:func:`~fairseq_deep.checkpoints.consolidated`), whatever ``--checkpoint-shard-count``."""
    original = fairseq_original(load_model_ensemble_and_task_checked)
    bound = inspect.signature(original).bind(filenames, *args, **kwargs)
    bound.apply_defaults()
    given = bound.arguments
    if given["state"] is None and any(shard_files(f, given["suffix"]) for f in filenames):
        return _load_sharded(original, given)
    try:
        return original(filenames, *args, **kwargs)
    except KeyError as e:
        # fairseq 0.12.2's encoder layer reads its q/k/v weights from the state dict before torch
        # matches the keys: a missing one is a KeyError there
        if not any(
            f.name == "_load_from_state_dict" for f in traceback.extract_tb(e.__traceback__)
        ):
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


def _load_sharded(original, given: dict):
    """fairseq's loader on each file in turn, a fully sharded one as :func:`consolidated` reads
    it (loaded not strictly: fairscale keeps a tied parameter under one name; then checked)."""
    ensemble, cfg, task = [], None, given["task"]
    for filename in given["filenames"]:
        state = consolidated(filename, given["suffix"], given["arg_overrides"])
        models, cfg, task = original(
            [filename],
            given["arg_overrides"],
            task,
            given["strict"] if state is None else False,
            given["suffix"],
            given["num_shards"] if state is None else 1,
            state,
        )
        if state is not None:
            check_consolidated(models[0], state["model"], filename)
        ensemble += models
    return ensemble, cfg, task


def _state_dict_mismatch(text: str) -> typing.List[str]:
    """What torch's "Error(s) in loading state_dict" says, short: the first tensors of another
    shape (both shapes), and the counts and first names of missing and unexpected keys."""
    shapes = re.findall(
        r"size mismatch for ([^:]+): copying a param with shape torch\.Size\(\[([^\]]*)\]\) "
        r"from checkpoint, the shape in current model is torch\.Size\(\[([^\]]*)\]\)",
        text,
    )
    shown = [
        f"{name}: checkpoint {a.replace(', ', 'x')}, this model {b.replace(', ', 'x')}"
        for name, a, b in shapes[:2]
    ]
    parts = (
        [f"{len(shapes)} of another shape ({', '.join(shown)}{', ...' if len(shapes) > 2 else ''})"]
        if shapes
        else []
    )
    keys = {
        kind: re.findall(r'"([^"]+)"', found.group(1))
        for kind in ("Missing", "Unexpected")
        for found in [
            re.search(kind + r" key\(s\) in state_dict: (.*?)(?:\.\s*$|\.\s*\n)", text, re.S | re.M)
        ]
        if found
    }
    return parts + [
        f"{len(v)} {kind.lower()} ({', '.join(v[:3])}{', ...' if len(v) > 3 else ''})"
        for kind, v in keys.items()
    ]


def trainer_load_checkpoint_checked(self, filename, *args, **kwargs):
    """fairseq's ``Trainer.load_checkpoint`` (``--restore-file``, a resumed ``--save-dir``,
    ``--finetune-from-model``; fairseq compares the shapes of the tensors only): a checkpoint
    whose model differs from this run's in an architecture option (the head count, pre-/post-norm,
    the DLCL settings, ... :mod:`~fairseq_deep.model_options`) stops before any parameter is
    loaded, naming each option with both values; parameters that do not fit otherwise name the
    options or the first tensors that differ."""
    token = _RESTORING.set(self.cfg.model)
    try:
        extra_state = fairseq_original(trainer_load_checkpoint_checked)(
            self, filename, *args, **kwargs
        )
        _say_training_time(self, filename)
        return extra_state
    except Exception as e:
        if not str(e).startswith("Cannot load model parameters from checkpoint"):
            raise
        cause = str(e.__context__) if e.__context__ is not None else ""
        try:
            found = describe(
                differences(
                    saved_model_options(fairseq_original(load_checkpoint_to_cpu_checked)(filename)),
                    self.cfg.model,
                )
            )
        except Exception:  # noqa: BLE001 - the options are a courtesy; the tensors are named below
            found = ""
        what = (
            f"its model options differ from this run's: {found}"
            if found
            else "; ".join(_state_dict_mismatch(cause))
            or (cause.strip().splitlines() or ["?"])[0][:300]
        )
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
    stop_s = (trainer.cfg.optimization.stop_time_hours or 0) * 3600
    spent = getattr(trainer, "_previous_training_time", 0) or 0
    if stop_s <= 0 or spent <= 0:
        return
    left = stop_s - spent
    say = logger.info if left > 0.1 * stop_s else logger.warning
    say(
        "%s trained %s already, which --stop-time-hours %g counts: %s",
        filename,
        hms(spent),
        stop_s / 3600,
        f"{hms(left)} left"
        if left > 0
        else "nothing is left, training stops after one update (raise --stop-time-hours; fairseq-deep-grow "
        "writes a checkpoint with no training time unless given --keep-training-time)",
    )


def apply():
    from fairseq import trainer

    install(checkpoint_utils, "load_checkpoint_to_cpu", load_checkpoint_to_cpu_checked)
    install(checkpoint_utils, "load_model_ensemble_and_task", load_model_ensemble_and_task_checked)
    install(trainer.Trainer, "load_checkpoint", trainer_load_checkpoint_checked)
