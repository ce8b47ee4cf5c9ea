"""Progress lines with an ETA for ``fairseq-deep-train`` and ``fairseq-deep-generate``.

fairseq logs training statistics every ``--log-interval`` updates (100 by default: minutes apart
on a CPU) and decoding only at its end; its tqdm bar shows only on a terminal, not through
``| tee log``.  Our two scripts add one line through fairseq's logging (``logger.info``, so it
goes where fairseq's own lines go, and a pipe gets it at once) after the first update (or batch)
and then at most every :data:`INTERVAL_ENV` seconds (30 by default; 0 turns the lines off)::

    progress: update 1,200/20,000 (6.0%) | epoch 3 (45%) | 3,456 words/s | 0.52 updates/s | elapsed 0:38:27 | ETA 10:01:00 (--max-update 20000)
    progress: 384/1,000 sentences (38.4%) | 12.8 sentences/s | elapsed 0:00:30 | ETA 0:00:48

Training: the ETA is the soonest of the ends fairseq stops at: ``--max-update`` (updates left at
the rate of this run), ``--max-epoch`` (epochs left at the same rate) and ``--stop-time-hours``
(fairseq's cumulative training time against the budget).  Rates are means since the first update
of this process (validation and checkpoint time included, as in the wall-clock time to the end).

This module counts and words the lines; how fairseq's loops feed it is a patch that only the
console scripts install, never an import of the package (plain ``fairseq-train --user-dir`` is
unchanged): :mod:`fairseq_deep.patches.training_progress` (around ``fairseq_cli.train.train`` and
the trainer's ``train_step``) and :mod:`fairseq_deep.patches.decoding_progress` (around
``fairseq_cli.generate``'s progress bar and task: the sentences decoded, the deadline and the
subset below).  Both take a ``clock`` (tests use a fake one).

A budget too small to learn: after its first updates (:data:`BUDGET_CHECK_UPDATES`) a run with
``--stop-time-hours`` checks, at the rate measured, how many updates the budget reaches; where that
is short of the end of warm-up (``--warmup-updates``; without warm-up, :data:`FEW_UPDATES`), it says
so at once, with the training time (and, under a recipe that sets :data:`RECIPE_BUDGET_ENV`, the
recipe's setting, ``MINUTES=N``) that would reach it, or a warm-up of at most half the updates in
reach.

A deadline for decoding: :data:`DEADLINE_ENV` (``FAIRSEQ_DEEP_DEADLINE``, a Unix time in seconds,
e.g. ``$(( $(date +%s) + 600 ))``) makes ``fairseq-deep-generate``'s batch iterator start no batch
once the deadline has passed, nor one that the last batch's time says would end after it (the
first batch is always decoded: a score needs sentences, and fairseq's summary divides by the
decoding time).  A warning says how many of how many sentences were decoded, and fairseq's
generate ends as usual with what it decoded (its "Translated N sentences" and BLEU lines).
examples/own_data/run.sh sets it so that the run ends within ``MINUTES``.

How much of the test set a deadline leaves time for is measured, never guessed: after each batch
decoded, the speed measured so far on this machine and this model (sentences per second of the
batches decoded) gives the time of the batches still to come (:func:`decoding_plan`).  When they
end before the deadline, all of them are decoded (said once, after the first batch, as
:data:`DECODE_WHOLE` with the speed); only when they do not is the rest thinned to an evenly
spaced subset of its batches sized by that speed (fairseq's batches are in order of length, so
every length is in it), said as :data:`DECODE_SUBSET` with the speed, the estimate and the time
that would decode all.  The plan is made again after every batch.  Sentences, not source tokens,
are the unit: on Multi30k (1,000 sentences, a 30-layer encoder at width 128 on a CPU) the first
batch, the shortest, decoded 18.5 sentences/s and the whole set 20.9, where its 164 source
tokens/s foretold twice the time for the rest (most of a step's cost, the beam's bookkeeping and
the output layer over the vocabulary, does not grow with the source).

A fixed subset: :data:`DECODE_FRACTION_ENV` (``FAIRSEQ_DEEP_DECODE_FRACTION=f``, 0 < f < 1)
decodes an evenly spaced fraction f of the test set's sentences in fairseq's order, which is by
length (the dataset's ``ordered_indices``, from which fairseq makes its batches), so the subset
holds every length, and says so (a quick look at a large test set; run.sh does not set it).
"""  # noqa: E501  (a progress line as it is printed)

import logging
import math
import os
import re
import time
from typing import Callable, List, Optional, Sequence, Tuple

logger = logging.getLogger("fairseq_deep.progress")

#: the environment variable with the seconds between two progress lines (0: none)
INTERVAL_ENV = "FAIRSEQ_DEEP_PROGRESS_SECONDS"
DEFAULT_INTERVAL = 30.0
#: the environment variable with the Unix time (seconds) after which decoding starts no batch
DEADLINE_ENV = "FAIRSEQ_DEEP_DEADLINE"
#: the start of the warning logged when decoding stops at the deadline (own_data's score looks for it)
DEADLINE_STOP = "decoding stopped at the deadline"
#: the environment variable with the fraction of the sentences to decode (evenly spaced; unset: all)
DECODE_FRACTION_ENV = "FAIRSEQ_DEEP_DECODE_FRACTION"
#: the start of the line logged when decoding a subset (own_data's score looks for it)
DECODE_SUBSET = "decoding a subset"
#: the start of the line logged when, at the speed measured, the whole test set ends before the deadline
DECODE_WHOLE = "decoding the whole test set"
#: the environment variable with a recipe's budget setting, the seconds of it that are neither
#: training's nor decoding's, and decoding's whole estimate and largest share ("MINUTES 120 324 0.2":
#: examples/own_data/run.sh), for the warning of a budget too small to learn
RECIPE_BUDGET_ENV = "FAIRSEQ_DEEP_RECIPE_BUDGET"
#: updates after the first at which the budget is judged (or 60 s and 3 updates, whichever first)
BUDGET_CHECK_UPDATES = 10
#: what a run without warm-up should reach at least
FEW_UPDATES = 2000


def interval_seconds() -> float:
    value = os.environ.get(INTERVAL_ENV, "")
    try:
        return float(value) if value.strip() else DEFAULT_INTERVAL
    except ValueError:
        logger.warning(
            "%s=%r is not a number of seconds: using %g", INTERVAL_ENV, value, DEFAULT_INTERVAL
        )
        return DEFAULT_INTERVAL


def deadline_from_env() -> Optional[float]:
    """:data:`DEADLINE_ENV` as a Unix time, or None (unset, empty or not a number: a warning)."""
    value = os.environ.get(DEADLINE_ENV, "").strip()
    if not value:
        return None
    try:
        deadline = float(value)
    except ValueError:
        deadline = float("nan")
    if not math.isfinite(deadline):
        logger.warning(
            "%s=%r is not a Unix time in seconds: decoding has no deadline", DEADLINE_ENV, value
        )
        return None
    return deadline


def hms(seconds: Optional[float]) -> str:
    """``H:MM:SS`` (``?`` for an unknown or infinite time)."""
    if seconds is None or not math.isfinite(seconds):
        return "?"
    seconds = max(0, int(round(seconds)))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class Ticker:
    """Says when a line is due: at the first call, then when ``interval`` seconds have passed."""

    def __init__(self, interval: float, clock: Callable[[], float] = time.monotonic):
        self.interval = interval
        self.clock = clock
        self.start = clock()
        self.last = None

    def due(self, final: bool = False) -> bool:
        if self.interval <= 0:
            return False
        now = self.clock()
        if self.last is None or final or now - self.last >= self.interval:
            self.last = now
            return True
        return False


class BudgetCheck:
    """Whether ``--stop-time-hours`` reaches the end of warm-up at the rate of the first updates;
    :meth:`warning` returns the one warning (once), or None."""

    def __init__(
        self, stop_time_hours=0.0, warmup_updates=0, max_update=0, recipe: Optional[str] = None
    ):
        self.stop_s = (stop_time_hours or 0.0) * 3600.0
        self.warmup = int(warmup_updates or 0)
        self.target = self.warmup or FEW_UPDATES
        if max_update:
            self.target = min(self.target, int(max_update))  # a run capped lower asks for no more
        self.recipe = recipe  # "MINUTES 120 324 0.2": recipe_minutes
        self.done = self.stop_s <= 0

    def warning(
        self,
        num_updates: int,
        updates_measured: int,
        seconds_measured: float,
        training_seconds: Optional[float],
    ) -> Optional[str]:
        if self.done or training_seconds is None or updates_measured < 1 or seconds_measured <= 0:
            return None
        if updates_measured < BUDGET_CHECK_UPDATES and not (
            seconds_measured >= 60 and updates_measured >= 3
        ):
            return None
        self.done = True
        rate = updates_measured / seconds_measured
        reached = num_updates + rate * max(0.0, self.stop_s - training_seconds)
        if reached >= self.target:
            return None
        needed = training_seconds + (self.target - num_updates) / rate
        what = (
            f"the end of warm-up (--warmup-updates {self.warmup:,})"
            if self.warmup
            else f"{self.target:,} updates"
        )
        text = (
            f"a budget too small to learn: at {rate:.3g} updates/s, --stop-time-hours {self.stop_s / 3600:.3g} ends "
            f"training after about {reached:,.0f} updates, before {what}: the model will hardly have learnt. "
            f"About {hms(needed)} of training reach it (--stop-time-hours {needed / 3600:.3g})"
        )
        minutes = recipe_minutes(self.recipe, needed)
        if minutes is not None:
            text += f"; {minutes} would"
        if self.warmup and self.target == self.warmup:
            text += f"; or a shorter warm-up (--warmup-updates {max(1, int(reached) // 2)} or less)"
        return text


def recipe_minutes(recipe: Optional[str], training_s: float) -> Optional[str]:
    """``NAME=M``: the recipe's budget (:data:`RECIPE_BUDGET_ENV`, ``"NAME FIXED [DECODE SHARE]"``:
    its seconds outside training, and decoding's seconds for the whole test set, of which it takes
    at most SHARE of the budget) that leaves ``training_s`` to training; None without a recipe."""
    try:
        name, fixed, *decoding = (recipe or "").split()
        total = training_s + float(fixed)
        budget = total
        if decoding:
            decode_all, share = float(decoding[0]), float(decoding[1])
            budget = (
                total / (1 - share)
                if share * total / (1 - share) <= decode_all
                else total + decode_all
            )
    except (ValueError, IndexError, ZeroDivisionError):
        return None
    return f"{name}={math.ceil(budget / 60)}"


class TrainingProgress:
    """Counts updates and words of one ``fairseq-train`` run and logs a line with the ETA.

    ``max_update``, ``max_epoch``, ``stop_time_hours``: fairseq's (0 or None: no such bound)."""

    def __init__(
        self,
        max_update=0,
        max_epoch=0,
        stop_time_hours=0.0,
        interval: float = DEFAULT_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
        budget: Optional[BudgetCheck] = None,
    ):
        self.budget = budget or BudgetCheck()
        self.max_update = max_update or 0
        self.max_epoch = max_epoch or 0
        self.stop_time_hours = stop_time_hours or 0.0
        self.ticker = Ticker(interval, clock)
        self.clock = clock
        self.first = None  # (clock, num_updates) after the first update of this process
        self.words = 0.0
        self.epoch = None
        self.epoch_fraction = None  # of the current epoch's batches done
        self.updates_per_epoch = None
        self.epoch_itr = None  # fairseq's epoch iterator of the epoch being trained

    def set_epoch(
        self, epoch: int, fraction_done: Optional[float], updates_per_epoch: Optional[float]
    ):
        self.epoch, self.epoch_fraction, self.updates_per_epoch = (
            epoch,
            fraction_done,
            updates_per_epoch,
        )

    def step(self, num_updates: int, words: float = 0.0, training_seconds: Optional[float] = None):
        """After an update: ``num_updates`` done in all, ``words`` (target tokens) in this one,
        ``training_seconds``: fairseq's cumulative training time (for ``--stop-time-hours``)."""
        now = self.clock()
        if self.first is None:
            self.first = (now, num_updates, self.ticker.start)
        else:
            self.words += words or 0.0
        if self.ticker.due():
            logger.info(self.line(num_updates, training_seconds, now))
        warning = self.budget.warning(
            num_updates, num_updates - self.first[1], now - self.first[0], training_seconds
        )
        if warning:
            logger.warning("progress: %s", warning)

    def line(
        self,
        num_updates: int,
        training_seconds: Optional[float] = None,
        now: Optional[float] = None,
    ) -> str:
        now = self.clock() if now is None else now
        t0, u0, start = (
            self.first if self.first is not None else (now, num_updates, self.ticker.start)
        )
        elapsed = now - start
        span = now - t0
        if span > 0 and num_updates > u0:
            rate = (num_updates - u0) / span  # since the first update: start-up left out
        else:  # after the first update: its time, start-up included (an overestimate)
            rate = 1.0 / (t0 - start) if t0 > start and num_updates > 0 else None
        parts = [
            f"update {num_updates:,}"
            + (
                f"/{self.max_update:,} ({100.0 * num_updates / self.max_update:.1f}%)"
                if self.max_update
                else ""
            )
        ]
        if self.epoch is not None:
            parts.append(
                f"epoch {self.epoch}"
                + (
                    f" ({100.0 * self.epoch_fraction:.0f}%)"
                    if self.epoch_fraction is not None
                    else ""
                )
            )
        if span > 0 and self.words > 0:
            parts.append(f"{self.words / span:,.0f} words/s")
        if rate is not None:
            parts.append(f"{rate:.3g} updates/s")
        parts.append(f"elapsed {hms(elapsed)}")
        parts.append(self.eta(num_updates, rate, training_seconds))
        return "progress: " + " | ".join(parts)

    def eta(
        self, num_updates: int, rate: Optional[float], training_seconds: Optional[float]
    ) -> str:
        ends = []  # (seconds left, why)
        if self.max_update and rate:
            ends.append(
                (max(0, self.max_update - num_updates) / rate, f"--max-update {self.max_update}")
            )
        if self.max_epoch and rate and self.epoch is not None and self.updates_per_epoch:
            epochs_left = max(0.0, self.max_epoch - self.epoch + 1.0 - (self.epoch_fraction or 0.0))
            ends.append(
                (epochs_left * self.updates_per_epoch / rate, f"--max-epoch {self.max_epoch}")
            )
        if self.stop_time_hours and training_seconds is not None:
            ends.append(
                (
                    max(0.0, self.stop_time_hours * 3600.0 - training_seconds),
                    f"--stop-time-hours {self.stop_time_hours:g}",
                )
            )
        if ends:
            left, why = min(ends)
            return f"ETA {hms(left)} ({why})"
        if not (self.max_update or self.max_epoch or self.stop_time_hours):
            return "no ETA (no --max-update, --max-epoch or --stop-time-hours)"
        return "ETA after the second update"


class DecodingProgress:
    """Counts the sentences of a decoding run and logs a line with the ETA."""

    def __init__(
        self,
        total_sentences: Optional[int],
        total_batches: Optional[int] = None,
        interval: float = DEFAULT_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.total_sentences = total_sentences
        self.total_batches = total_batches
        self.ticker = Ticker(interval, clock)
        self.clock = clock
        self.sentences = 0
        self.batches = 0

    def step(self, sentences: int):
        self.sentences += sentences
        self.batches += 1
        if self.ticker.due():
            logger.info(self.line())

    def line(self) -> str:
        elapsed = self.clock() - self.ticker.start
        rate = self.sentences / elapsed if elapsed > 0 else None
        if self.total_sentences:
            done, total, what = self.sentences, self.total_sentences, "sentences"
        elif self.total_batches:  # the number of sentences is unknown: batches
            done, total, what = self.batches, self.total_batches, "batches"
        else:
            done, total, what = self.sentences, None, "sentences"
        head = f"{done:,}" + (
            f"/{total:,} {what} ({100.0 * done / total:.1f}%)" if total else f" {what}"
        )
        parts = [head]
        if rate:
            parts.append(f"{rate:,.1f} sentences/s")
        parts.append(f"elapsed {hms(elapsed)}")
        if total and done:
            parts.append(f"ETA {hms(elapsed * (total - done) / done)}")
        return "progress: " + " | ".join(parts)


#: :meth:`DecodingProgress.line` with a total of sentences and a rate: done, total, sentences/s
DECODING_LINE = re.compile(
    r"progress: ([\d,]+)/([\d,]+) sentences \([^)]*\) \| ([\d,.]+) sentences/s"
)


def last_decoding_rate(log_text: str) -> Optional[Tuple[int, int, float]]:
    """The last :meth:`DecodingProgress.line` of a log that has a rate: (sentences done, their
    total, sentences/s over the decoding so far: the model's loading left out); None without one."""
    found = DECODING_LINE.findall(log_text)
    if not found:
        return None
    done, total, rate = (x.replace(",", "") for x in found[-1])
    return int(done), int(total), float(rate)


def fraction_from_env() -> Optional[float]:
    """:data:`DECODE_FRACTION_ENV` in (0, 1), or None (unset, empty, 1 or more; not a fraction: a warning)."""
    value = os.environ.get(DECODE_FRACTION_ENV, "").strip()
    if not value:
        return None
    try:
        fraction = float(value)
    except ValueError:
        fraction = float("nan")
    if not 0 < fraction <= 1:
        logger.warning(
            "%s=%r is not a fraction in (0, 1]: decoding every sentence", DECODE_FRACTION_ENV, value
        )
        return None
    return fraction if fraction < 1 else None


def evenly_spaced(n: int, fraction: float) -> list:
    """About ``fraction`` of ``range(n)``, evenly spaced (at least one), in order."""
    keep = [i for i in range(n) if math.floor((i + 1) * fraction) > math.floor(i * fraction)]
    return keep or [0][:n]


def decoding_plan(work: Sequence[float], rate: float, seconds_left: float) -> List[int]:
    """Which of the batches still to decode (``work``: each one's sentences, in fairseq's order,
    by length) to decode in ``seconds_left`` at ``rate`` (sentences per second, measured on the
    batches decoded so far): all of them when they fit, else an evenly spaced subset of them
    holding about ``seconds_left * rate`` sentences (none when no time is left)."""
    total = float(sum(work))
    everything = list(range(len(work)))
    if not work or rate <= 0 or total / rate <= seconds_left:
        return everything
    if seconds_left <= 0:
        return []
    fraction = seconds_left * rate / total
    return [i for i in everything if math.floor((i + 1) * fraction) > math.floor(i * fraction)]
