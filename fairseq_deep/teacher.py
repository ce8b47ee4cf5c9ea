"""A teacher for distillation: any checkpoint the package loads, on the data it is to teach.

``fairseq-deep-distill`` (sequence-level distillation, :mod:`fairseq_deep.distill`) and the
word-level distillation criterion load their teacher with :func:`load`:

- the checkpoint is read by the package's one loader (:func:`fairseq_deep.checkpoints.load`: its
  checks and one-line errors; an averaged, grown, continued or fully sharded checkpoint as that
  loader reads it; any family), and its model built by fairseq's own loader
  (``checkpoint_utils.load_model_ensemble_and_task`` with that state and the given task): the
  model ``fairseq-generate`` decodes with, parameter for parameter;
- on the task of the data-bin being distilled (its dictionaries), after a check that the
  teacher's dictionaries are the data-bin's: a teacher trained on other dictionaries would read
  the data's token ids as other words (fairseq would stop later with a size mismatch of its
  embeddings, or, when the sizes agree by chance, translate garbage).  What is compared is what
  every family stores, the number of rows of its token embeddings (the source side: every
  ``encoder.*embed_tokens.weight``, one per column of a multi-column hybrid) and of its embeddings
  and output projection on the target side, against ``len(task.source_dictionary)`` and
  ``len(task.target_dictionary)`` (:func:`check_dictionaries`);
- in eval mode, frozen (no parameter requires a gradient: a teacher is never trained, and the
  word-level criterion's optimizer never sees it), on the device and in the dtype asked for.

Pinned by: tests/test_distill.py (``-k teacher``: the model equals fairseq's own loading, a
mismatching dictionary is one line).
"""

import os
import re
from typing import Dict, List, Optional, Tuple

from fairseq import utils

from . import checkpoints
from .errors import CheckpointError

#: the parameters whose rows are the source / target dictionary's symbols, in every family
#: (Transformer families, RNMT+, Deep-Att, the hybrids' encoders and columns)
SOURCE_ROWS = re.compile(r"^encoder\.(?:.+\.)?embed_tokens\.weight$")
TARGET_ROWS = re.compile(
    r"^decoder\.(?:(?:.+\.)?embed_tokens\.weight|output_projection\.(?:weight|bias))$"
)


def dictionary_rows(model_state: dict) -> Dict[str, List[Tuple[str, int]]]:
    """``{"source": [(key, rows), ...], "target": [...]}``: the parameters of a checkpoint's
    ``model`` state whose rows are a dictionary's symbols, and their number of rows."""
    found = {"source": [], "target": []}
    for key, value in model_state.items():
        shape = getattr(value, "shape", None)
        if not shape:
            continue
        for side, pattern in (("source", SOURCE_ROWS), ("target", TARGET_ROWS)):
            if pattern.match(key):
                found[side].append((key, int(shape[0])))
    return found


def _dictionary_file(task, side: str) -> str:
    """The data-bin's dictionary file of ``side`` (``DATA/dict.de.txt``), for the messages."""
    lang = task.cfg.source_lang if side == "source" else task.cfg.target_lang
    if lang is None:  # a task built around its dictionaries (a test's, the hub's)
        return f"the task's {side} dictionary"
    return os.path.join(utils.split_paths(task.cfg.data)[0], f"dict.{lang}.txt")


def check_dictionaries(state: dict, task, path: str, option: Optional[str] = "--path"):
    """A :class:`CheckpointError` (one line: both counts and the fix) where the checkpoint's
    dictionaries are not the sizes of ``task``'s (:data:`SOURCE_ROWS`, :data:`TARGET_ROWS`)."""
    where = f"{option} {path}" if option else str(path)
    sizes = {"source": len(task.source_dictionary), "target": len(task.target_dictionary)}
    for side, rows in dictionary_rows(state["model"]).items():
        for key, count in rows:
            if count != sizes[side]:
                raise CheckpointError(
                    f"{where}: the teacher's {side} dictionary has {count} symbols ({key}) but "
                    f"{_dictionary_file(task, side)} has {sizes[side]}: the teacher was trained on "
                    "other dictionaries. Give the data-bin binarized with the teacher's "
                    "dictionaries (fairseq-preprocess --srcdict/--tgtdict with the teacher's "
                    "dict.*.txt)"
                )


def freeze(model):
    """``model`` in eval mode with no parameter requiring a gradient (in place); returns it."""
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    return model.eval()


def load(
    path: str,
    task,
    overrides: Optional[dict] = None,
    device=None,
    dtype=None,
    option: Optional[str] = "--path",
):
    """The teacher in the checkpoint ``path`` (module docstring) built on ``task`` (its
    dictionaries, checked against the checkpoint's), ``overrides`` applied to its options as
    fairseq's ``--model-overrides`` are; in eval mode, frozen, moved to ``device`` and cast to
    ``dtype`` (``torch.float16``, ``torch.bfloat16``; None: as saved, float32).  ``option``: the
    command-line option that named the file, for the messages."""
    from fairseq import checkpoint_utils

    state = checkpoints.load(path, option, arg_overrides=overrides)
    check_dictionaries(state, task, path, option)
    shards = checkpoints.shard_files(path)
    sharded = bool(shards)
    models, _cfg, _task = checkpoint_utils.load_model_ensemble_and_task(
        [shards[0] if sharded else path],  # a file that exists (fairseq checks it), state given
        arg_overrides=overrides,
        task=task,
        strict=not sharded,
        state=state,
    )
    model = models[0]
    if sharded:  # loaded not strictly: fairscale keeps a tied parameter under one name
        checkpoints.check_consolidated(model, state["model"], path)
    if device is not None or dtype is not None:
        model.to(device=device, dtype=dtype)
    return freeze(model)
