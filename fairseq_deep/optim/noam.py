"""The Transformer learning-rate schedule of Chen et al. (2018), App. A.2, Eq. 2 ("noam"):

    lr(t) = r0 / sqrt(d_model) * min((t + 1) / (p * sqrt(p)), 1 / sqrt(t + 1))

for update t = 0, 1, ... (fairseq's ``num_updates`` before the update), p = ``--warmup-updates``.
Bapna et al. (2018, Sec. 2.2) train their Transformers with r0 = 3.0 and p = 40,000.

Why not ``inverse_sqrt``: fairseq's schedule starts its linear warm-up at ``--warmup-init-lr``
(0 by default, so the first update has lr 0), warms up over ``num_updates / p`` instead of
``(t + 1) / p`` and decays as ``1 / sqrt(num_updates)`` instead of ``1 / sqrt(t + 1)``: every
step is one update off, and the peak has to be worked out by hand as ``r0 / sqrt(d_model * p)``.
This schedule has no state of its own: after a resume, ``step_update(num_updates)`` gives back the
same learning rate.
"""

import math
from dataclasses import dataclass, field

from fairseq.dataclass import FairseqDataclass
from fairseq.optim.lr_scheduler import FairseqLRScheduler, register_lr_scheduler


@dataclass
class NoamLRScheduleConfig(FairseqDataclass):
    warmup_updates: int = field(
        default=4000,
        metadata={"help": "p of Eq. 2: updates of linear warm-up (Bapna et al.: 40000)"},
    )
    noam_r0: float = field(
        default=1.0,
        metadata={"help": "r0 of Eq. 2, the scale of the learning rate (Bapna et al.: 3.0)"},
    )
    noam_d_model: int = field(
        default=0,
        metadata={
            "help": "d_model of Eq. 2, the model dimension (512 for Transformer Base); required"
        },
    )


def noam_lr(t: int, r0: float, d_model: int, warmup: int) -> float:
    """Eq. 2 of Chen et al. (2018) at update t (0-based)."""
    step = t + 1
    return r0 / math.sqrt(d_model) * min(step / (warmup * math.sqrt(warmup)), 1.0 / math.sqrt(step))


@register_lr_scheduler("noam", dataclass=NoamLRScheduleConfig)
class NoamSchedule(FairseqLRScheduler):
    """Linear warm-up to ``r0 / sqrt(d_model * p)`` at update p - 1, then inverse square root decay."""

    def __init__(self, cfg: NoamLRScheduleConfig, optimizer):
        super().__init__(cfg, optimizer)
        if cfg.noam_d_model <= 0:
            raise ValueError(
                "--lr-scheduler noam needs --noam-d-model, the model dimension d_model of Eq. 2 "
                "(e.g. --noam-d-model 512 for Transformer Base, the value of --encoder-embed-dim)"
            )
        if cfg.warmup_updates <= 0:
            raise ValueError(
                f"--lr-scheduler noam needs --warmup-updates > 0, got {cfg.warmup_updates}"
            )
        if cfg.noam_r0 <= 0:
            raise ValueError(f"--noam-r0 must be positive, got {cfg.noam_r0}")
        self.step_update(0)

    def lr_at(self, num_updates: int) -> float:
        return noam_lr(
            num_updates, self.cfg.noam_r0, self.cfg.noam_d_model, self.cfg.warmup_updates
        )

    def step(self, epoch, val_loss=None):
        """The schedule does not change at epoch boundaries."""
        super().step(epoch, val_loss)
        return self.optimizer.get_lr()

    def step_update(self, num_updates):
        lr = self.lr_at(num_updates)
        self.optimizer.set_lr(lr)
        return lr
