"""Sentencepiece data: whether a data folder's dictionary holds sentencepiece pieces, and the
``spm.model`` to apply to raw text.

Without ``--bpe``, fairseq-interactive (and the hub's ``translate``) passes the input to the model
as it is: on a model trained on sentencepiece pieces (``fairseq-deep-prepare``'s data) whole words
become ``<unk>`` and the output keeps its ``▁`` pieces, with no error.  :func:`sentencepiece_to_apply`
looks at the data's dictionary: when its symbols are sentencepiece pieces and neither ``--bpe``
nor ``--post-process``/``--remove-bpe`` is given (those say the input is already pieces), it names
the ``spm.model`` found beside the data (``DATA/spm.model``, ``DATA/../spm.model``:
fairseq-deep-prepare's layout, or ``DATA/../spm/spm.model``: the quickstart's); where there is none
it stops with one line naming what to add.  Used by fairseq-deep-interactive
(:mod:`fairseq_deep.patches.interactive`) and the hub interface (:mod:`fairseq_deep.patches.hub`).
"""

import glob
import os

from ..errors import UserError

#: sentencepiece's word-boundary mark, the first character of a piece that starts a word
SPM_MARK = "\u2581"


def sentencepiece_dictionary(path: str, symbols: int = 1000, share: float = 0.3) -> bool:
    """Whether the fairseq dictionary ``path`` holds sentencepiece pieces: at least ``share`` of its
    first ``symbols`` symbols start with ``▁`` (a word-level or subword-nmt dictionary has none)."""
    seen = marked = 0
    with open(path, encoding="utf-8") as f:
        for line in f:
            if seen >= symbols:
                break
            symbol = line.split(" ", 1)[0]
            seen += 1
            marked += symbol.startswith(SPM_MARK)
    return seen > 0 and marked >= share * seen


def spm_model_beside(data_dir: str):
    """The sentencepiece model next to a data-bin folder, or None."""
    parent = os.path.dirname(os.path.abspath(data_dir))
    for path in (
        os.path.join(data_dir, "spm.model"),
        os.path.join(parent, "spm.model"),
        os.path.join(parent, "spm", "spm.model"),
    ):
        if os.path.isfile(path):
            return path
    return None


def _get(node, name, default=None):
    try:
        value = getattr(node, name)
    except Exception:  # noqa: BLE001 - an omegaconf node without the key
        return default
    return default if value is None else value


#: how to give the model, by where it is missing: (the fix, the input is pieces already)
HOW = {
    "cli": (
        "add --bpe sentencepiece --sentencepiece-model PATH/spm.model (fairseq-deep-prepare writes "
        "DESTDIR/spm.model)",
        "--post-process sentencepiece",
    ),
    "hub": (
        "pass bpe='sentencepiece', sentencepiece_model='PATH/spm.model' to from_pretrained "
        "(fairseq-deep-prepare writes DESTDIR/spm.model)",
        "post_process='sentencepiece'",
    ),
}


def sentencepiece_to_apply(cfg, how: str = "cli"):
    """The ``--sentencepiece-model`` to apply to ``cfg`` (fairseq-interactive's, or the hub's), or
    None when there is nothing to do; a :class:`~fairseq_deep.errors.UserError` when the data is
    sentencepiece data, no --bpe was given and no model lies beside it (``how`` the fix is worded:
    ``cli`` flags or ``hub`` keyword arguments)."""
    if _get(cfg, "bpe") is not None or _get(cfg.common_eval, "post_process") is not None:
        return None
    data = str(_get(cfg.task, "data", "")).split(os.pathsep)[0]
    if not data or not os.path.isdir(data):
        return None  # fairseq's own error
    src = _get(cfg.task, "source_lang")
    dicts = (
        [os.path.join(data, f"dict.{src}.txt")]
        if src
        else sorted(glob.glob(os.path.join(data, "dict.*.txt")))
    )
    dicts = [d for d in dicts if os.path.isfile(d)]
    if not dicts or not sentencepiece_dictionary(dicts[0]):
        return None
    model = spm_model_beside(data)
    if model is None:
        fix, pieces = HOW[how]
        raise UserError(
            f"{dicts[0]} holds sentencepiece pieces ('{SPM_MARK}...') but no --bpe was given, so the input "
            f"would not be split into pieces and the output would keep them: {fix}, or {pieces} if the "
            f"input is already pieces"
        )
    return model
