"""``fairseq-deep-interactive`` keeps going: every input line gets exactly one hypothesis.

fairseq-interactive translates an empty line as if it were a sentence (the model invents one), and
a line longer than the model's maximum ends the whole session (``Size of sample #0 is invalid``),
or, with ``--skip-invalid-size-inputs-valid-test``, silently gets no ``H-`` line.  Here a line
longer than the model takes is cut to its maximum (with a warning naming the line), and an empty
line gets an empty hypothesis (with a warning).  Installed by :func:`fairseq_deep.cli.interactive`
around fairseq's ``make_batches``; the translation itself is fairseq's.
"""

import logging

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
