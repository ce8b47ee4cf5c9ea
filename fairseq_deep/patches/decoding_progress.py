"""The progress lines, the deadline and the subset of ``fairseq-deep-generate``: fairseq-generate's
loop, counted.

Replaces (installed by the console script only, :func:`.scripts.install_generate`; plain
``fairseq-generate`` is unchanged): the names ``tasks`` and ``progress_bar`` in
``fairseq_cli.generate`` by proxies of those modules.  The task that ``tasks.setup_task`` returns
records its batch iterator (the number of sentences; with :data:`~fairseq_deep.progress.DECODE_FRACTION_ENV`
the dataset's ``ordered_indices`` thinned to an evenly spaced subset), and the bar that
``progress_bar.progress_bar`` returns counts the sentences decoded into a
:class:`~fairseq_deep.progress.DecodingProgress` (a line with the ETA every 30 s: fairseq logs
decoding only at its end) and, under :data:`~fairseq_deep.progress.DEADLINE_ENV`, decodes what
the speed measured on the batches decoded so far says ends before it: every batch when they all
fit, else an evenly spaced subset of those left (:func:`~fairseq_deep.progress.decoding_plan`,
planned again after each batch), and starts no batch after it (the first batch is always
decoded; a warning says how many sentences were, and fairseq's generate ends as usual with what
it decoded).  The settings and what they mean: :mod:`fairseq_deep.progress`.

Versions: every fairseq 0.12 (0.12.2 and ve-fairseq 0.12.3): ``fairseq_cli.generate`` calls
``tasks.setup_task``, ``task.get_batch_iterator(dataset=...)`` and ``progress_bar.progress_bar``
through those module names.

Pinned by: tests/test_progress.py (``install_decoding_progress`` with fake clocks: the lines, the
deadline, the subsets: fixed, and sized by the speed measured), tests/test_own_data.py (the
deadline's warning read back).
"""

import logging
import time
from typing import Callable, List, Optional

from ..progress import (
    DEADLINE_ENV,
    DEADLINE_STOP,
    DECODE_FRACTION_ENV,
    DECODE_SUBSET,
    DECODE_WHOLE,
    DecodingProgress,
    deadline_from_env,
    decoding_plan,
    evenly_spaced,
    fraction_from_env,
    interval_seconds,
)

logger = logging.getLogger(
    "fairseq_deep.progress"
)  # the progress lines' logger (own_data's recipe shows it)


def _sample_sentences(sample) -> int:
    try:
        return int(sample["nsentences"]) if "nsentences" in sample else int(sample["id"].numel())
    except Exception:  # noqa: BLE001 - an empty or foreign sample
        return 0


class _CountingBar:
    """fairseq's progress bar, with an iterator that counts what it yields into ``progress`` and,
    given a ``deadline`` (a time of ``wall_clock``), decodes the batches that the speed measured
    says end before it and starts no batch after it (see the module's docstring): skipped batches
    are never given to fairseq's loop, and at the deadline it ends early, with a warning, as if the
    data had.  ``batches``: each batch's sentences in fairseq's order, when known."""

    def __init__(
        self,
        bar,
        progress: DecodingProgress,
        deadline: Optional[float] = None,
        wall_clock: Callable[[], float] = time.time,
        batches: Optional[List[int]] = None,
    ):
        self._bar = bar
        self._progress = progress
        self._deadline = deadline
        self._wall_clock = wall_clock
        self._batches = batches
        self._skip = set()
        self._decoded = [0, 0, 0.0]  # batches, sentences, seconds
        self._said = None  # DECODE_WHOLE or DECODE_SUBSET, once said
        self._whole = progress.total_sentences  # the plan's subset changes the progress's total

    def _out_of_time(self, last_batch_s: Optional[float]) -> bool:
        if self._deadline is None or last_batch_s is None:  # the first batch is always decoded
            return False
        return self._wall_clock() + last_batch_s > self._deadline

    def __iter__(self):
        last_batch_s = None
        iterator = iter(self._bar)
        index = -1
        while True:
            try:
                sample = next(iterator)
            except StopIteration:
                return
            index += 1
            if index in self._skip:  # left out by the plan: fairseq's loop never sees it
                continue
            if self._out_of_time(last_batch_s):
                self._stop()
                return
            started = self._wall_clock()
            yield sample
            last_batch_s = max(0.0, self._wall_clock() - started)
            sentences = _sample_sentences(sample)
            self._progress.step(sentences)  # the batch has been decoded
            self._plan(index, sentences, last_batch_s)

    def _plan(self, index: int, sentences: int, seconds: float):
        """After batch ``index``: the batches after it to decode, at the speed measured so far."""
        batches = self._batches
        if self._deadline is None or not batches or index >= len(batches):
            return
        done = self._decoded
        done[0] += 1
        done[1] += sentences
        done[2] += seconds
        if done[2] <= 0:
            return
        rate = done[1] / done[2]  # sentences per second, on this machine and this model
        rest = list(range(index + 1, len(batches)))
        left = self._deadline - self._wall_clock()
        if left <= 0:  # the deadline has passed: it stops decoding, and says so
            return
        chosen = [rest[i] for i in decoding_plan([batches[j] for j in rest], rate, left)]
        self._skip = set(rest) - set(chosen)
        p = self._progress
        p.total_sentences = p.sentences + sum(batches[j] for j in chosen)
        rest_sentences = sum(batches[j] for j in rest)
        rest_s = rest_sentences / rate
        measured = (
            f"at {rate:,.1f} sentences/s, measured on the {done[0]:,} "
            f"batch{'es' if done[0] > 1 else ''} decoded here, the {rest_sentences:,} sentences left "
            f"{{}} about {rest_s:,.0f} s, and {max(0.0, left):,.0f} s are left before the deadline "
            f"({DEADLINE_ENV})"
        )
        if not self._skip and self._said is None and rest:
            self._said = DECODE_WHOLE
            logger.info(f"{DECODE_WHOLE}: {measured.format('take')}")
        elif self._skip and self._said != DECODE_SUBSET:
            self._said = DECODE_SUBSET
            logger.warning(
                f"{DECODE_SUBSET} (the speed measured): {measured.format('would take')}: decoding "
                f"{p.total_sentences:,} of {sum(batches):,} sentences, evenly spaced batches of "
                f"the test set sorted by length (every length is in it); about {rest_s - left:,.0f} s more "
                "would decode all"
            )

    def _stop(self):
        p = self._progress
        done = (
            f"{p.sentences:,} of {self._whole:,} sentences"
            if self._whole
            else (
                f"{p.sentences:,} sentences ({p.batches:,} of {p.total_batches:,} batches)"
                if p.total_batches
                else f"{p.sentences:,} sentences"
            )
        )
        late = self._wall_clock() - self._deadline
        when = (
            f"it passed {late:.0f} s ago"
            if late >= 0
            else f"{-late:.0f} s left, less than the last batch took"
        )
        logger.warning(
            f"{DEADLINE_STOP} ({DEADLINE_ENV}; {when}): {done} decoded; the rest are not "
            "translated, and the scores below are of the decoded ones only"
        )

    def __len__(self):
        return len(self._bar)

    def __getattr__(self, name):
        return getattr(self._bar, name)


class _Proxy:
    """A module's attributes, some replaced."""

    def __init__(self, module, **replaced):
        self._module = module
        self.__dict__.update(replaced)

    def __getattr__(self, name):
        return getattr(self._module, name)


def _sentences_in(epoch_batch_iterator) -> Optional[int]:
    try:
        return int(sum(len(b) for b in epoch_batch_iterator.frozen_batches))
    except Exception:  # noqa: BLE001 - another iterator: batches are counted instead
        return None


def _batch_sizes(epoch_batch_iterator) -> Optional[List[int]]:
    """Each batch's sentences in fairseq's order, or None for another iterator."""
    try:
        return [len(b) for b in epoch_batch_iterator.frozen_batches]
    except Exception:  # noqa: BLE001 - another iterator: the deadline alone
        return None


def _decode_a_subset(dataset, fraction: float):
    """``dataset.ordered_indices`` (fairseq's order, by length) thinned to an evenly spaced
    ``fraction`` of it, on the instance, so that fairseq batches the subset only; the ids (lines of
    the test set) stay the same."""
    ordered_indices = dataset.ordered_indices

    def subset():
        indices = ordered_indices()
        chosen = indices[evenly_spaced(len(indices), fraction)]
        logger.info(
            f"{DECODE_SUBSET} ({DECODE_FRACTION_ENV}={fraction:g}): {len(chosen):,} of {len(indices):,} "
            "sentences, evenly spaced over the test set sorted by length (every length is in it)"
        )
        return chosen

    dataset.ordered_indices = subset


def install_decoding_progress(
    generate_module,
    interval: Optional[float] = None,
    clock: Callable[[], float] = time.monotonic,
    deadline: Optional[float] = None,
    wall_clock: Callable[[], float] = time.time,
    fraction: Optional[float] = None,
):
    """Make ``generate_module`` (``fairseq_cli.generate``) log :class:`DecodingProgress` lines and
    stop at ``deadline`` (a Unix time, by default from :data:`DEADLINE_ENV`; see the module's
    docstring): its ``tasks.setup_task`` returns a task whose ``get_batch_iterator`` is recorded
    (the number of sentences), its ``progress_bar.progress_bar`` a bar that counts the sentences
    and ends at the deadline.  Idempotent."""
    if isinstance(generate_module.progress_bar, _Proxy):
        return
    interval = interval_seconds() if interval is None else interval
    deadline = deadline_from_env() if deadline is None else deadline
    fraction = fraction_from_env() if fraction is None else fraction
    if interval <= 0 and deadline is None and fraction is None:
        return
    real_tasks, real_bars = generate_module.tasks, generate_module.progress_bar
    recorded = []

    def setup_task(*args, **kwargs):
        task = real_tasks.setup_task(*args, **kwargs)
        get_batch_iterator = task.get_batch_iterator

        def recording(*a, **kw):
            dataset = kw.get("dataset", a[0] if a else None)
            if fraction is not None and hasattr(dataset, "ordered_indices"):
                _decode_a_subset(dataset, fraction)
            itr = get_batch_iterator(*a, **kw)
            recorded.append(itr)
            return itr

        task.get_batch_iterator = recording
        return task

    def progress_bar(iterator, *args, **kwargs):
        bar = real_bars.progress_bar(iterator, *args, **kwargs)
        total = _sentences_in(recorded[-1]) if recorded else None
        try:
            batches = len(iterator)
        except TypeError:
            batches = None
        sizes = _batch_sizes(recorded[-1]) if recorded else None
        return _CountingBar(
            bar,
            DecodingProgress(total, batches, interval=interval, clock=clock),
            deadline=deadline,
            wall_clock=wall_clock,
            batches=sizes if sizes is not None and len(sizes) == batches else None,
        )

    generate_module.tasks = _Proxy(real_tasks, setup_task=setup_task)
    generate_module.progress_bar = _Proxy(real_bars, progress_bar=progress_bar)
