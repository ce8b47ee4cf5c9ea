"""Adaptive gradient clipping of RNMT+ (Chen et al. 2018, Sec. 4.1): "we keep track of a moving
average and a moving standard deviation of the log of the gradient norm values, and we abort a step
if the norm of the gradient exceeds four standard deviations of the moving average".

``GradNormTracker`` is the statistic, in one of two variants (``--adaptive-clip-variant``):

* ``paper`` (the default; the paper's sentence read literally): exponentially weighted sums with
  decay ``d`` of 1, x and x^2, where x = log g and g = max(norm, min_norm); mean and standard
  deviation follow from them; an update is an outlier when, after ``--adaptive-clip-warmup``
  observed updates, x > mean + threshold * std.  Outliers do not enter the statistics.
* ``lingvo``: exactly lingvo's ``GradNormTracker`` (``lingvo/core/layers.py``), which the authors'
  framework runs: x = log(g + 1); the std has a floor of 1e-3 (variance floor 1e-6); a step is
  aborted only once the statistics' total weight 1 - d^n exceeds 0.75 (n > 277 updates at
  d = 0.995; ``--adaptive-clip-warmup`` is not used); and every step, outlier or not, enters the
  statistics with x capped at mean + threshold * std.

Both keep the same state (decayed weight, sums of x and x^2), so checkpoints hold the same fields.

``AdaptiveClipTaskMixin`` applies it to any fairseq task (``--adaptive-clip``):

* the norm is the one fairseq's trainer computes in ``optimizer.clip_grad_norm`` (recorded by a thin
  wrapper installed on the trainer's optimizer): of the gradient all-reduced over workers and summed
  over ``--update-freq`` micro-batches, unscaled under fp16/AMP, *before* ``--clip-norm`` clips it.
  All workers see the same norm and the same statistics, so they take the same decision;
* a skipped update is no optimizer step at all: ``optimizer.step()`` is not called, so Adam's
  moments and step count stay as they were and the parameters do not move (lingvo zeroes the
  gradient and still steps, which decays Adam's moments and advances its bias correction).
  fairseq's update counter (and so the LR schedule) still advances.  Under ``--amp`` the grad
  scaler's bookkeeping is closed with ``scaler.update()``; a non-finite norm is left to fairseq's own
  fp16/AMP overflow handling and is not counted;
* ``skipped_updates`` (sum over the log interval) and ``skipped_total`` are logged;
* the statistics are saved in the checkpoint inside the optimizer state (an entry
  ``adaptive_clip`` of the first parameter group, which torch restores with the optimizer) and are
  restored on resume.  (fairseq also saves the task state, but its trainer never restores it on
  resume, so the task state alone would lose the statistics.)
"""

import math
from dataclasses import dataclass, field
from typing import Dict, Optional

import torch
from fairseq.dataclass import ChoiceEnum
from fairseq.logging import metrics

STATE_KEY = "adaptive_clip"


@dataclass
class AdaptiveClipConfig:
    """Options mixed into a task's config (a dataclass; FairseqDataclass in the task)."""

    adaptive_clip: bool = field(
        default=False,
        metadata={
            "help": "skip an update whose gradient norm is an outlier: log-norm above the moving "
            "mean + --adaptive-clip-threshold moving std devs (RNMT+, Chen et al. 2018, Sec. 4.1)"
        },
    )
    adaptive_clip_threshold: float = field(
        default=4.0, metadata={"help": "standard deviations above the moving mean of the log norm"}
    )
    adaptive_clip_decay: float = field(
        default=0.995,
        metadata={"help": "decay of the moving statistics (lingvo GradNormTracker: 0.995)"},
    )
    adaptive_clip_warmup: int = field(
        default=100, metadata={"help": "updates observed before any can be skipped"}
    )
    adaptive_clip_min_norm: float = field(
        default=1e-2,
        metadata={"help": "norms below this enter the statistics as this (lingvo: 1e-2)"},
    )
    adaptive_clip_variant: ChoiceEnum(["paper", "lingvo"]) = field(
        default="paper",
        metadata={
            "help": "paper: log g, outliers left out of the statistics, skipping after "
            "--adaptive-clip-warmup updates; lingvo: lingvo's GradNormTracker exactly "
            "(log(g + 1), std floor 1e-3, outliers enter capped, skipping once 1 - d^n > 0.75)"
        },
    )


VARIANTS = ("paper", "lingvo")


class GradNormTracker:
    def __init__(
        self,
        threshold: float = 4.0,
        decay: float = 0.995,
        warmup: int = 100,
        min_norm: float = 1e-2,
        variant: str = "paper",
    ):
        if not 0.0 < decay < 1.0:
            raise ValueError(f"--adaptive-clip-decay must be in (0, 1), got {decay}")
        if threshold <= 0:
            raise ValueError(f"--adaptive-clip-threshold must be positive, got {threshold}")
        if variant not in VARIANTS:
            raise ValueError(f"--adaptive-clip-variant must be one of {VARIANTS}, got {variant!r}")
        self.threshold, self.decay, self.warmup, self.min_norm = threshold, decay, warmup, min_norm
        self.variant = variant
        self.weight = 0.0  # sum of decay^k
        self.sum = 0.0  # of log norms, decayed
        self.sum_sq = 0.0
        self.observed = 0  # updates that entered the statistics
        self.skipped = 0

    def mean_std(self):
        if (
            self.variant == "lingvo"
        ):  # lingvo divides by max(total weight, 1e-6), floors the variance
            w = max(self.weight * (1.0 - self.decay), 1e-6) / (1.0 - self.decay)
            mean = self.sum / w
            return mean, math.sqrt(max(self.sum_sq / w - mean * mean, 1e-6))
        if self.weight <= 0:
            return 0.0, 0.0
        mean = self.sum / self.weight
        var = max(self.sum_sq / self.weight - mean * mean, 0.0)
        return mean, math.sqrt(var)

    def log_norm(self, norm: float) -> float:
        g = max(norm, self.min_norm)
        return math.log(g + 1.0) if self.variant == "lingvo" else math.log(g)

    def cap(self) -> float:
        mean, std = self.mean_std()
        return mean + self.threshold * std

    def is_outlier(self, norm: float) -> bool:
        if self.variant == "lingvo":  # lingvo: once the total weight 1 - d^n exceeds 0.75
            return self.weight * (1.0 - self.decay) > 0.75 and self.log_norm(norm) > self.cap()
        if self.observed < self.warmup:
            return False
        return self.log_norm(norm) > self.cap()

    def update(self, norm: float):
        x = self.log_norm(norm)
        if self.variant == "lingvo":
            x = min(x, self.cap())
        d = self.decay
        self.weight = d * self.weight + 1.0
        self.sum = d * self.sum + x
        self.sum_sq = d * self.sum_sq + x * x
        self.observed += 1

    def step(self, norm: float) -> bool:
        """Observe one update's gradient norm; True when the update must be skipped."""
        outlier = self.is_outlier(norm)
        if outlier:
            self.skipped += 1
        if not outlier or self.variant == "lingvo":  # lingvo: outliers enter, capped
            self.update(norm)
        return outlier

    def state_dict(self) -> Dict[str, float]:
        return {
            "weight": self.weight,
            "sum": self.sum,
            "sum_sq": self.sum_sq,
            "observed": float(self.observed),
            "skipped": float(self.skipped),
        }

    def load_state_dict(self, state: Dict[str, float]):
        self.weight, self.sum, self.sum_sq = (
            float(state["weight"]),
            float(state["sum"]),
            float(state["sum_sq"]),
        )
        self.observed, self.skipped = int(state["observed"]), int(state["skipped"])


def _torch_optimizer(optimizer):
    """The torch optimizer under fairseq's wrappers (FairseqOptimizer, FP16Optimizer, AMPOptimizer)."""
    return getattr(optimizer, "optimizer", optimizer)


class AdaptiveClipTaskMixin:
    """Mix into a FairseqTask whose cfg has the fields of :class:`AdaptiveClipConfig`."""

    _grad_tracker: Optional[GradNormTracker] = None
    _tracker_restored = False

    def _adaptive_clip_tracker(self) -> Optional[GradNormTracker]:
        if not getattr(self.cfg, "adaptive_clip", False):
            return None
        if self._grad_tracker is None:
            c = self.cfg
            self._grad_tracker = GradNormTracker(
                c.adaptive_clip_threshold,
                c.adaptive_clip_decay,
                c.adaptive_clip_warmup,
                c.adaptive_clip_min_norm,
                getattr(c, "adaptive_clip_variant", "paper"),
            )
        return self._grad_tracker

    @staticmethod
    def _record_grad_norm(optimizer):
        """Wrap ``optimizer.clip_grad_norm`` (once) so that its result, the pre-clipping norm, is kept."""
        if getattr(optimizer, "_adaptive_clip_wrapped", False):
            return
        clip = optimizer.clip_grad_norm

        def clip_grad_norm(max_norm, aggregate_norm_fn=None):
            norm = clip(max_norm, aggregate_norm_fn)
            optimizer._adaptive_clip_norm = norm
            return norm

        optimizer.clip_grad_norm = clip_grad_norm
        optimizer._adaptive_clip_norm = None
        optimizer._adaptive_clip_wrapped = True

    def train_step(self, sample, model, criterion, optimizer, update_num, ignore_grad=False):
        if self._adaptive_clip_tracker() is not None:
            self._record_grad_norm(optimizer)
        return super().train_step(sample, model, criterion, optimizer, update_num, ignore_grad)

    def optimizer_step(self, optimizer, model, update_num):
        tracker = self._adaptive_clip_tracker()
        norm = getattr(optimizer, "_adaptive_clip_norm", None)
        if tracker is None or norm is None:
            return super().optimizer_step(optimizer, model, update_num)
        optimizer._adaptive_clip_norm = None
        groups = _torch_optimizer(optimizer).param_groups
        if not self._tracker_restored:  # resume: the statistics travel in the optimizer state
            self._tracker_restored = True
            if STATE_KEY in groups[0]:
                tracker.load_state_dict(groups[0][STATE_KEY])
        norm = float(norm)
        if not math.isfinite(norm):  # fp16/AMP overflow: fairseq's own handling
            return super().optimizer_step(optimizer, model, update_num)
        skip = tracker.step(norm)
        groups[0][STATE_KEY] = tracker.state_dict()
        metrics.log_scalar_sum("skipped_updates", float(skip), priority=900, round=0)
        metrics.log_scalar("skipped_total", float(tracker.skipped), weight=0, priority=901, round=0)
        if skip:
            scaler = getattr(optimizer, "_grad_scaler", None)
            if isinstance(scaler, torch.amp.GradScaler):  # AMP: close this step's unscale_()
                scaler.update()
            return None
        return super().optimizer_step(optimizer, model, update_num)

    def state_dict(self):
        state = dict(super().state_dict())
        if self._grad_tracker is not None:
            state[STATE_KEY] = self._grad_tracker.state_dict()
        return state

    def load_state_dict(self, state_dict):
        state_dict = dict(state_dict)
        clip_state = state_dict.pop(STATE_KEY, None)
        super().load_state_dict(state_dict)
        tracker = self._adaptive_clip_tracker()
        if clip_state is not None and tracker is not None:
            tracker.load_state_dict(clip_state)
            self._tracker_restored = True
