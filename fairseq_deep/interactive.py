"""``fairseq-deep-interactive`` keeps going: every input line gets exactly one hypothesis; and it
does not translate raw text with a sentencepiece model as if it were pieces.

fairseq-interactive translates an empty line as if it were a sentence (the model invents one), and
a line longer than the model's maximum ends the whole session (``Size of sample #0 is invalid``),
or, with ``--skip-invalid-size-inputs-valid-test``, silently gets no ``H-`` line.  Here a line
longer than the model takes is cut to its maximum (with a warning naming the line), and an empty
line gets an empty hypothesis (with a warning).  Installed by :func:`fairseq_deep.cli.interactive`
around fairseq's ``make_batches``; the translation itself is fairseq's.

Without ``--bpe``, fairseq-interactive passes the input to the model as it is: on a model trained
on sentencepiece pieces (``fairseq-deep-prepare``'s data) whole words become ``<unk>`` and the
output keeps its ``▁`` pieces, with no error.  :func:`with_sentencepiece_check` (around fairseq's
``main(cfg)``) looks at the data's dictionary: when its symbols are sentencepiece pieces and neither
``--bpe`` nor ``--post-process``/``--remove-bpe`` is given (those say the input is already pieces),
it applies ``--bpe sentencepiece --sentencepiece-model M`` with the ``spm.model`` found beside the
data (``DATA/spm.model``, ``DATA/../spm.model``: fairseq-deep-prepare's layout, or
``DATA/../spm/spm.model``: the quickstart's), with a warning naming it; where there is none it stops
with one line naming the flags to add.  The hub interface (``Model.from_pretrained``) gets the same
check (``compat.hub_from_pretrained_checked``), worded in its keyword arguments.
"""

import glob
import logging
import os

import torch

logger = logging.getLogger("fairseq_deep.interactive")


def source_limit(max_positions):
    """The longest source (in tokens, with ``</s>``) of fairseq's resolved ``max_positions``."""
    if max_positions is None:
        return None
    if isinstance(max_positions, (tuple, list)):
        return source_limit(max_positions[0]) if max_positions else None
    if isinstance(max_positions, dict):  # multilingual tasks: the smallest source limit
        limits = [source_limit(v) for v in max_positions.values()]
        limits = [x for x in limits if x is not None]
        return min(limits) if limits else None
    return int(max_positions)


def empty_hypothesis(eos: int):
    return {"tokens": torch.tensor([eos]), "score": torch.tensor(0.0), "alignment": [],
            "positional_scores": torch.tensor([0.0]), "attention": None}


class _KeptGoing:
    """The task's tokenization and inference step, wrapped on the task instance."""

    def __init__(self, task):
        self.task = task
        self.first_id = 0
        self.limit = None
        self._tokens_and_lengths = task.get_interactive_tokens_and_lengths
        self._inference_step = task.inference_step
        task.get_interactive_tokens_and_lengths = self.tokens_and_lengths
        task.inference_step = self.inference_step

    def tokens_and_lengths(self, lines, encode_fn):
        tokens, lengths = self._tokens_and_lengths(lines, encode_fn)
        for i, t in enumerate(tokens):
            line_id = self.first_id + i
            if self.limit is not None and len(t) > self.limit:
                logger.warning(
                    "input line %d (S-%d): %d tokens with </s>, more than the model takes "
                    "(%d: --max-source-positions); translating its first %d tokens",
                    line_id + 1, line_id, len(t), self.limit, self.limit - 1)
                tokens[i] = torch.cat([t[: self.limit - 1], t[-1:]])
                lengths[i] = self.limit
            elif len(t) <= 1:
                logger.warning("input line %d (S-%d) is empty: its hypothesis is empty", line_id + 1, line_id)
        return tokens, lengths

    def inference_step(self, generator, models, sample, *args, **kwargs):
        hypos = self._inference_step(generator, models, sample, *args, **kwargs)
        src = sample["net_input"]["src_tokens"]
        dictionary = self.task.source_dictionary
        words = (src.ne(dictionary.pad()) & src.ne(dictionary.eos())).sum(dim=1)
        eos = self.task.target_dictionary.eos()
        for i in range(len(hypos)):
            if int(words[i]) == 0:
                hypos[i] = [empty_hypothesis(eos)]
        return hypos


def make_batches_kept_going(make_batches):
    """fairseq-interactive's ``make_batches(lines, cfg, task, max_positions, encode_fn)``, with
    over-long lines cut and empty lines given an empty hypothesis."""
    seen = [0]

    def kept_going(lines, cfg, task, max_positions, encode_fn):
        state = getattr(task, "_fairseq_deep_kept_going", None)
        if state is None:
            state = task._fairseq_deep_kept_going = _KeptGoing(task)
        state.first_id = seen[0]
        state.limit = source_limit(max_positions)
        seen[0] += len(lines)
        yield from make_batches(lines, cfg, task, max_positions, encode_fn)

    kept_going._fairseq_deep = True
    return kept_going


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
    for path in (os.path.join(data_dir, "spm.model"), os.path.join(parent, "spm.model"),
                 os.path.join(parent, "spm", "spm.model")):
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
HOW = {"cli": ("add --bpe sentencepiece --sentencepiece-model PATH/spm.model (fairseq-deep-prepare writes "
               "DESTDIR/spm.model)", "--post-process sentencepiece"),
       "hub": ("pass bpe='sentencepiece', sentencepiece_model='PATH/spm.model' to from_pretrained "
               "(fairseq-deep-prepare writes DESTDIR/spm.model)", "post_process='sentencepiece'")}


def sentencepiece_to_apply(cfg, how: str = "cli"):
    """The ``--sentencepiece-model`` to apply to ``cfg`` (fairseq-interactive's, or the hub's), or
    None when there is nothing to do; a :class:`~fairseq_deep.errors.UserError` when the data is
    sentencepiece data, no --bpe was given and no model lies beside it (``how`` the fix is worded:
    ``cli`` flags or ``hub`` keyword arguments)."""
    from .errors import UserError

    if _get(cfg, "bpe") is not None or _get(cfg.common_eval, "post_process") is not None:
        return None
    data = str(_get(cfg.task, "data", "")).split(os.pathsep)[0]
    if not data or not os.path.isdir(data):
        return None  # fairseq's own error
    src = _get(cfg.task, "source_lang")
    dicts = [os.path.join(data, f"dict.{src}.txt")] if src else sorted(glob.glob(os.path.join(data, "dict.*.txt")))
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


def with_sentencepiece_check(main, reparse):
    """fairseq-interactive's ``main(cfg)``, which first applies :func:`sentencepiece_to_apply`:
    ``reparse(extra_argv)`` gives the cfg of the command line with ``extra_argv`` added."""

    def checked(cfg, *args, **kwargs):
        model = sentencepiece_to_apply(cfg)
        if model is not None:
            logger.warning("the data is sentencepiece data and no --bpe was given: translating with "
                           "--bpe sentencepiece --sentencepiece-model %s (found beside the data; "
                           "give --bpe to choose)", model)
            cfg = reparse(["--bpe", "sentencepiece", "--sentencepiece-model", model])
        return main(cfg, *args, **kwargs)

    checked._fairseq_deep = True
    return checked
