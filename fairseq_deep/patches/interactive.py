"""``fairseq-deep-interactive`` keeps going: every input line gets exactly one hypothesis; and it
does not translate raw text with a sentencepiece model as if it were pieces.  Installed by the
console script only (:func:`.scripts.install_interactive`), never by importing the package.

Replaces:

- ``fairseq_cli.interactive.make_batches``: fairseq-interactive translates an empty line as if it
  were a sentence (the model invents one), and a line longer than the model's maximum ends the
  whole session (``Size of sample #0 is invalid``), or, with
  ``--skip-invalid-size-inputs-valid-test``, silently gets no ``H-`` line.  Here a line longer than
  the model takes is cut to its maximum (with a warning naming the line), and an empty line gets
  an empty hypothesis (with a warning); the translation itself is fairseq's;
- ``fairseq_cli.interactive.main``: without ``--bpe`` on sentencepiece data
  (:func:`~fairseq_deep.data.sentencepiece_data.sentencepiece_to_apply`), it applies ``--bpe
  sentencepiece --sentencepiece-model M`` with the ``spm.model`` found beside the data, with a
  warning naming it, or stops with one line naming the flags to add.  The hub interface gets the
  same check (:mod:`.hub`), worded in its keyword arguments; and on an input without a line
  (empty stdin or ``--input`` file), where fairseq-interactive prints nothing, it says so in one
  warning line (exit status 0, as fairseq's).

Versions: every fairseq 0.12 (0.12.2 and ve-fairseq 0.12.3).

Pinned by: tests/test_interactive.py (``test_every_line_gets_one_hypothesis``,
``test_cut_line_equals_its_first_tokens``, the sentencepiece tests, ``test_empty_input_is_said``).
"""

import logging

import torch

from ..data.sentencepiece_data import sentencepiece_to_apply

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
    return {
        "tokens": torch.tensor([eos]),
        "score": torch.tensor(0.0),
        "alignment": [],
        "positional_scores": torch.tensor([0.0]),
        "attention": None,
    }


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
                    line_id + 1,
                    line_id,
                    len(t),
                    self.limit,
                    self.limit - 1,
                )
                tokens[i] = torch.cat([t[: self.limit - 1], t[-1:]])
                lengths[i] = self.limit
            elif len(t) <= 1:
                logger.warning(
                    "input line %d (S-%d) is empty: its hypothesis is empty", line_id + 1, line_id
                )
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
    kept_going.lines_seen = lambda: seen[0]
    return kept_going


def with_empty_input_said(main, lines_seen):
    """fairseq-interactive's ``main(cfg)``, which warns in one line when its input had no line
    (``lines_seen()``: the lines its ``make_batches`` was given)."""

    def said(cfg, *args, **kwargs):
        result = main(cfg, *args, **kwargs)
        if lines_seen() == 0:
            source = cfg.interactive.input
            logger.warning(
                "no input lines (%s was empty): nothing to translate",
                "stdin" if source == "-" else source,
            )
        return result

    said._fairseq_deep = True
    return said


def with_sentencepiece_check(main, reparse):
    """fairseq-interactive's ``main(cfg)``, which first applies :func:`sentencepiece_to_apply`:
    ``reparse(extra_argv)`` gives the cfg of the command line with ``extra_argv`` added."""

    def checked(cfg, *args, **kwargs):
        model = sentencepiece_to_apply(cfg)
        if model is not None:
            logger.warning(
                "the data is sentencepiece data and no --bpe was given: translating with "
                "--bpe sentencepiece --sentencepiece-model %s (found beside the data; "
                "give --bpe to choose)",
                model,
            )
            cfg = reparse(["--bpe", "sentencepiece", "--sentencepiece-model", model])
        return main(cfg, *args, **kwargs)

    checked._fairseq_deep = True
    return checked
