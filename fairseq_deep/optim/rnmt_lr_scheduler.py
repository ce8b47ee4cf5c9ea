"""The RNMT+ learning-rate schedule of Chen et al. (2018), Sec. 4.1, Eq. 1 (``--lr-scheduler rnmt_plus``):

    lr(t) = base * min(1 + t (n - 1) / (n p),  n,  n (2n)^((s - n t) / (e - s)))

and ``base * 1/2`` (5e-5 for base 1e-4) once n t >= e, where the last term has decayed to exactly
that value.  t is fairseq's update count, n the number of concurrent replicas (``--rnmt-replicas``),
p the warm-up (``--warmup-updates``), s and e the start and end of the exponential decay
(``--rnmt-decay-start``, ``--rnmt-decay-end``).  Read literally, Eq. 1:

* warms up linearly from ``base`` to ``n * base`` over n p updates (with n = 1 there is no warm-up:
  the schedule is flat at ``base`` until the decay);
* decays from update s / n to update e / n (s and e count "replica steps", n t).

App. A.3: En-De p = 500, s = 600k, e = 1.2M; En-Fr p = 500, s = 1.2M, e = 3.6M; n = 32 (GPUs).
``--lr`` is not read: the scale is ``--rnmt-base-lr`` (1e-4 in Eq. 1).  The schedule is a pure
function of the update count, so a resumed run gets the same learning rates.
"""

from dataclasses import dataclass, field

from fairseq.dataclass import FairseqDataclass
from fairseq.optim.lr_scheduler import FairseqLRScheduler, register_lr_scheduler


@dataclass
class RNMTPlusLRScheduleConfig(FairseqDataclass):
    rnmt_base_lr: float = field(default=1e-4, metadata={"help": "the factor 10^-4 of Eq. 1"})
    rnmt_replicas: int = field(
        default=1, metadata={"help": "n of Eq. 1: concurrent model replicas"}
    )
    warmup_updates: int = field(
        default=500, metadata={"help": "p of Eq. 1: warm-up (App. A.3: 500)"}
    )
    rnmt_decay_start: int = field(
        default=600000, metadata={"help": "s of Eq. 1 (En-De 600k, En-Fr 1.2M)"}
    )
    rnmt_decay_end: int = field(
        default=1200000, metadata={"help": "e of Eq. 1 (En-De 1.2M, En-Fr 3.6M)"}
    )


def rnmt_plus_lr(
    t: int, base: float = 1e-4, n: int = 1, p: int = 500, s: int = 600000, e: int = 1200000
) -> float:
    """Eq. 1 of Chen et al. (2018) at update t, constant base/2 after the decay."""
    if n * t >= e:
        return base * 0.5
    warmup = 1.0 + t * (n - 1) / (n * p)
    decay = n * (2.0 * n) ** ((s - n * t) / (e - s))
    return base * min(warmup, float(n), decay)


@register_lr_scheduler("rnmt_plus", dataclass=RNMTPlusLRScheduleConfig)
class RNMTPlusLRSchedule(FairseqLRScheduler):
    def __init__(self, cfg: RNMTPlusLRScheduleConfig, optimizer):
        super().__init__(cfg, optimizer)
        for name, value in (
            ("--rnmt-replicas", cfg.rnmt_replicas),
            ("--warmup-updates", cfg.warmup_updates),
        ):
            if value < 1:
                raise ValueError(f"{name} must be at least 1, got {value}")
        if cfg.rnmt_decay_end <= cfg.rnmt_decay_start:
            raise ValueError(
                f"--rnmt-decay-end ({cfg.rnmt_decay_end}) must be after --rnmt-decay-start "
                f"({cfg.rnmt_decay_start})"
            )
        self.lr = self.get_lr(0)
        self.optimizer.set_lr(self.lr)

    def get_lr(self, num_updates: int) -> float:
        c = self.cfg
        return rnmt_plus_lr(
            num_updates,
            c.rnmt_base_lr,
            c.rnmt_replicas,
            c.warmup_updates,
            c.rnmt_decay_start,
            c.rnmt_decay_end,
        )

    def step(self, epoch, val_loss=None):
        super().step(epoch, val_loss)
        return self.optimizer.get_lr()

    def step_update(self, num_updates):
        self.lr = self.get_lr(num_updates)
        self.optimizer.set_lr(self.lr)
        return self.lr
