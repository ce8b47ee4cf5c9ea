"""A checkpoint's history kept through training: grown from, continued, averaged.

fairseq-train saves a fresh ``extra_state`` each time (``Trainer.state_dict``: the meters and the
training time; ``checkpoint_utils.save_checkpoint`` adds the data iterator and the best loss), so
what a restored checkpoint recorded of its past is lost at the next save: a grown model continued
with ``--restore-file`` came out with no trace of the growth (the export's record said
``"grown": []``).  The package's history lives in ``extra_state`` under :data:`HISTORY`:

- ``grown``: one entry per ``fairseq-deep-grow`` (:mod:`fairseq_deep.grow` writes it);
- ``continued``: one entry per training run that started from another run's checkpoint
  (``--restore-file`` of a file that is not this ``--save-dir``'s own, ``--finetune-from-model``,
  ``--continue-once``): the file, its updates, what was reset (written here);
- ``averaged``: one entry per ``fairseq-deep-average-checkpoints``: every input and its updates
  (:func:`record_averaged`).

Replaces, each by a wrapper that calls fairseq's function:

- ``fairseq.checkpoint_utils.load_checkpoint`` (fairseq-train's restore): the restored
  checkpoint's history is kept on the trainer, a ``continued`` entry added when the checkpoint is
  another run's;
- ``fairseq.trainer.Trainer.state_dict`` (every checkpoint fairseq-train saves): that history
  written into ``extra_state``.

A run resumed from its own ``checkpoint_last.pt`` keeps its history and adds nothing.

Versions: every fairseq 0.12 (0.12.2 and ve-fairseq 0.12.3).

Pinned by: tests/test_export.py (``test_the_record_names_grown_continued_and_averaged``: grow,
continue a few updates, resume, average, export), tests/test_grow_families.py (every family's
grown checkpoint keeps its ``grown`` entry through training and resuming).
"""

import copy
import os
from typing import Dict, List, Sequence

from fairseq import checkpoint_utils

from .install import fairseq_original, install

#: the keys of ``extra_state`` that hold the history, oldest entry first in each
HISTORY = ("grown", "continued", "averaged")


def history_of(state) -> Dict[str, list]:
    """``{"grown": [...], "continued": [...], "averaged": [...]}`` of a checkpoint's state (lists
    absent from it are empty)."""
    extra = (state or {}).get("extra_state") or {}
    return {key: list(extra.get(key) or []) for key in HISTORY}


def num_updates(state) -> int:
    """The updates a checkpoint's state has trained (its last optimizer record's), 0 without one."""
    records = (state or {}).get("optimizer_history") or [{}]
    return int(records[-1].get("num_updates", 0) or 0)


def record_averaged(state, inputs: Sequence[str], updates: Sequence[int]):
    """``state`` (the average, written over the newest input's state) with an ``averaged`` entry:
    every input file and its updates.  The history of the newest input comes along with its
    ``extra_state``."""
    extra = dict(state.get("extra_state") or {})
    extra["averaged"] = list(extra.get("averaged") or []) + [
        {
            "inputs": [os.path.abspath(p) for p in inputs],
            "num_updates": [int(u) for u in updates],
        }
    ]
    state["extra_state"] = extra
    return state


def _restored_path(cfg, trainer) -> str:
    """The file fairseq's ``load_checkpoint`` restores (its own rule, before it runs)."""
    suffix = trainer.checkpoint_suffix
    if cfg.restore_file == "checkpoint_last.pt":
        path = os.path.join(cfg.save_dir, f"checkpoint_last{suffix}.pt")
        if not os.path.exists(path):
            if getattr(cfg, "continue_once", None) is not None:
                return cfg.continue_once
            if cfg.finetune_from_model is not None:
                return cfg.finetune_from_model
        return path
    return cfg.restore_file.replace(".pt", suffix + ".pt") if suffix else cfg.restore_file


def _own(path: str, save_dir: str) -> bool:
    """Whether ``path`` is a checkpoint of the run that saves into ``save_dir``."""
    return os.path.dirname(os.path.abspath(path)) == os.path.abspath(save_dir)


def load_checkpoint_with_history(cfg, trainer, **passthrough_args):
    """fairseq's ``checkpoint_utils.load_checkpoint`` (fairseq-train's restore); the restored
    checkpoint's history is kept on the trainer (``Trainer.state_dict`` saves it), with a
    ``continued`` entry when the checkpoint is another run's."""
    path = _restored_path(cfg, trainer)
    extra_state, epoch_itr = fairseq_original(load_checkpoint_with_history)(
        cfg, trainer, **passthrough_args
    )
    if extra_state is None:  # nothing restored: a fresh run
        return extra_state, epoch_itr
    history = {key: copy.deepcopy(list(extra_state.get(key) or [])) for key in HISTORY}
    if not _own(path, cfg.save_dir):
        finetune = cfg.finetune_from_model is not None and path == cfg.finetune_from_model
        reset = {
            "optimizer": finetune or bool(cfg.reset_optimizer),
            "lr_scheduler": finetune or bool(cfg.reset_lr_scheduler),
            "dataloader": finetune or bool(cfg.reset_dataloader),
            "meters": finetune or bool(cfg.reset_meters),
        }
        records = trainer._optim_history or [{}]
        history["continued"].append(
            {
                "from": os.path.abspath(path),
                "num_updates": int(records[-1].get("num_updates", 0) or 0),
                "save_dir": os.path.abspath(cfg.save_dir),
                "reset": sorted(k for k, v in reset.items() if v),
            }
        )
    trainer._fairseq_deep_history = history
    return extra_state, epoch_itr


def trainer_state_dict_with_history(self):
    """fairseq's ``Trainer.state_dict`` with the restored checkpoint's history in ``extra_state``."""
    state = fairseq_original(trainer_state_dict_with_history)(self)
    history: Dict[str, List] = getattr(self, "_fairseq_deep_history", None) or {}
    for key, entries in history.items():
        if entries:
            state["extra_state"][key] = copy.deepcopy(entries)
    return state


def apply():
    from fairseq import trainer

    install(checkpoint_utils, "load_checkpoint", load_checkpoint_with_history)
    install(trainer.Trainer, "state_dict", trainer_state_dict_with_history)
