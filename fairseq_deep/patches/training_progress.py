"""The progress lines of ``fairseq-deep-train``: fairseq's training loop, counted.

Replaces (installed by the console script only, :func:`.scripts.install_train`; plain
``fairseq-train --user-dir`` is unchanged): ``fairseq_cli.train.train`` (one epoch) by a wrapper
that wraps the trainer's ``train_step`` of that run on the instance, so that every update feeds a
:class:`~fairseq_deep.progress.TrainingProgress` (the line with the ETA after the first update and
every 30 s, and the warning of a budget too small to learn: :mod:`fairseq_deep.progress`).
fairseq itself logs every ``--log-interval`` updates (100 by default: minutes apart on a CPU) and
its tqdm bar shows only on a terminal.  The lines are logged by :mod:`fairseq_deep.progress` (the
``fairseq_deep.progress`` logger).

Versions: every fairseq 0.12 (0.12.2 and ve-fairseq 0.12.3): ``fairseq_cli.train.train(cfg,
trainer, task, epoch_itr)``, the ``train_inner`` meter ``wpb``.

Pinned by: tests/test_progress.py (``install_training_progress`` with a fake clock),
tests/test_cli_errors.py (``test_train_logs_progress_from_the_first_update``).
"""

import math
import os
import time
from typing import Callable, Optional

from ..progress import RECIPE_BUDGET_ENV, BudgetCheck, TrainingProgress, interval_seconds


def _epoch_state(epoch_itr, update_freq: int):
    """``(epoch, fraction of its batches done, updates per epoch)`` of fairseq's epoch iterator."""
    try:
        batches = len(epoch_itr)
        fraction = epoch_itr.iterations_in_epoch / batches if batches else None
        return (
            epoch_itr.epoch,
            fraction,
            math.ceil(batches / max(1, update_freq)) if batches else None,
        )
    except Exception:  # noqa: BLE001 - another iterator: no epoch in the line
        return getattr(epoch_itr, "epoch", None), None, None


def _update_freq(cfg, epoch: int) -> int:
    freqs = list(cfg.optimization.update_freq)
    return int(freqs[epoch - 1] if epoch <= len(freqs) else freqs[-1])


def _update_words(samples, trainer) -> float:
    """The target tokens of the last update, all workers together: the "wpb" that fairseq's task
    logged into the "train_inner" aggregation (trainer.train_step removes it from what it returns);
    else this worker's samples times the number of workers."""
    from fairseq.logging import metrics

    meter = metrics.get_meter("train_inner", "wpb")
    if meter is not None and getattr(meter, "val", None) is not None:
        return float(meter.val)
    try:
        local = sum(float(s.get("ntokens", 0)) for s in samples if s)
        return local * getattr(trainer, "data_parallel_world_size", 1)
    except Exception:  # noqa: BLE001 - a sample of another shape: no words/s in the line
        return 0.0


def _wrap_train_step(trainer, progress: TrainingProgress, cfg):
    """``trainer.train_step`` (on the instance) followed by ``progress.step``."""
    train_step = trainer.train_step

    def train_step_with_progress(samples, *args, **kwargs):
        log_output = train_step(samples, *args, **kwargs)
        if log_output is not None:  # not an OOM or overflow
            epoch_itr = progress.epoch_itr
            epoch = getattr(epoch_itr, "epoch", 1)
            progress.set_epoch(*_epoch_state(epoch_itr, _update_freq(cfg, epoch)))
            words = _update_words(samples, trainer)
            progress.step(trainer.get_num_updates(), words, trainer.cumulative_training_time())
        return log_output

    trainer.train_step = train_step_with_progress


def install_training_progress(
    train_module, interval: Optional[float] = None, clock: Callable[[], float] = time.monotonic
):
    """Wrap ``train_module.train`` (``fairseq_cli.train``'s one epoch) so that each run's trainer
    logs :class:`TrainingProgress` lines.  Idempotent."""
    train_epoch = train_module.train
    if getattr(train_epoch, "_fairseq_deep", False):
        return
    interval = interval_seconds() if interval is None else interval
    if interval <= 0:
        return
    state = {}

    def train(cfg, trainer, task, epoch_itr, *args, **kwargs):
        progress = state.get(id(trainer))
        if progress is None:
            opt = cfg.optimization
            budget = BudgetCheck(
                opt.stop_time_hours,
                getattr(getattr(cfg, "lr_scheduler", None), "warmup_updates", 0),
                opt.max_update,
                os.environ.get(RECIPE_BUDGET_ENV),
            )
            progress = state[id(trainer)] = TrainingProgress(
                opt.max_update,
                opt.max_epoch,
                opt.stop_time_hours,
                interval=interval,
                clock=clock,
                budget=budget,
            )
            _wrap_train_step(trainer, progress, cfg)
        progress.epoch_itr = epoch_itr
        return train_epoch(cfg, trainer, task, epoch_itr, *args, **kwargs)

    train.__doc__ = train_epoch.__doc__
    train._fairseq_deep = True
    train_module.train = train
