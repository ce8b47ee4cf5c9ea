"""The Transformer learning-rate schedule of Chen et al. (2018), Eq. 2, as --lr-scheduler noam."""

import math

import pytest
import torch
from fairseq.optim import FairseqOptimizer
from fairseq.optim.lr_scheduler import build_lr_scheduler
from fairseq.optim.lr_scheduler.inverse_square_root_schedule import (
    InverseSquareRootLRScheduleConfig,
    InverseSquareRootSchedule,
)

import fairseq_deep  # noqa: F401  (registers noam)
from fairseq_deep.optim.noam import NoamLRScheduleConfig, NoamSchedule, noam_lr


class _Optimizer(FairseqOptimizer):
    def __init__(self, lr):
        super().__init__(None)
        self._optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=lr)


def _optimizer(lr=1.0):
    return _Optimizer(lr)


def _scheduler(r0=3.0, d=512, p=40000):
    return NoamSchedule(
        NoamLRScheduleConfig(warmup_updates=p, noam_r0=r0, noam_d_model=d), _optimizer()
    )


def eq2(t, r0, d, p):
    """Eq. 2 of Chen et al. (2018), App. A.2, written out."""
    return r0 / math.sqrt(d) * min((t + 1) / (p * math.sqrt(p)), 1 / math.sqrt(t + 1))


@pytest.mark.parametrize("t", [0, 1, 999, 39998, 39999, 40000, 100000, 10**6])
def test_schedule_is_eq_2(t):
    sched = _scheduler()
    assert sched.step_update(t) == pytest.approx(eq2(t, 3.0, 512, 40000), rel=1e-12)
    assert sched.optimizer.get_lr() == pytest.approx(eq2(t, 3.0, 512, 40000), rel=1e-12)


def test_shape_of_bapna_settings():
    """r0 = 3.0, p = 40k, d_model = 512 (Bapna et al. Sec. 2.2): linear warm-up to the peak
    r0 / sqrt(d_model * p) at the p-th update, then 1/sqrt decay."""
    lrs = [noam_lr(t, 3.0, 512, 40000) for t in range(0, 120001, 1000)]
    peak = 3.0 / math.sqrt(512 * 40000)  # ~6.6e-4
    assert noam_lr(39999, 3.0, 512, 40000) == pytest.approx(peak, rel=1e-12)
    assert (
        max(lrs) <= peak and max(noam_lr(t, 3.0, 512, 40000) for t in range(39990, 40010)) == peak
    )
    assert lrs[0] > 0  # the first update already learns
    assert noam_lr(159999, 3.0, 512, 40000) == pytest.approx(peak / 2)  # 4x the steps: half the lr
    up, down = lrs[:40], lrs[41:]
    assert all(a < b for a, b in zip(up, up[1:])) and all(a > b for a, b in zip(down, down[1:]))


def test_inverse_sqrt_is_one_update_off():
    """Why a scheduler of our own: inverse_sqrt with the same peak differs at every update."""
    p, peak = 100, 3.0 / math.sqrt(512 * 100)
    inv = InverseSquareRootSchedule(
        InverseSquareRootLRScheduleConfig(warmup_updates=p, lr=[peak]), _optimizer()
    )
    noam = _scheduler(p=p)
    assert inv.step_update(0) == 0.0 and noam.step_update(0) > 0
    assert inv.step_update(50) == pytest.approx(noam.step_update(49))
    assert inv.step_update(50) != pytest.approx(noam.step_update(50))


def test_epoch_steps_and_resume_do_not_change_the_schedule():
    sched = _scheduler(p=10)
    lr = sched.step_update(25)
    assert sched.step(3, val_loss=1.0) == pytest.approx(lr)
    fresh = _scheduler(p=10)  # a resumed run: new scheduler, state loaded, step_update(num_updates)
    fresh.load_state_dict(sched.state_dict())
    assert fresh.step_update(25) == pytest.approx(lr)


def test_registered_and_built_from_the_command_line_config():
    from fairseq import options

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(
        parser,
        [
            "data",
            "--arch",
            "transformer",
            "--optimizer",
            "adam",
            "--lr-scheduler",
            "noam",
            "--noam-r0",
            "3.0",
            "--warmup-updates",
            "40000",
            "--noam-d-model",
            "512",
        ],
    )
    sched = build_lr_scheduler(args, _optimizer())
    assert isinstance(sched, NoamSchedule)
    assert sched.optimizer.get_lr() == pytest.approx(eq2(0, 3.0, 512, 40000))


def test_missing_d_model_names_the_option():
    with pytest.raises(ValueError, match="--noam-d-model"):
        NoamSchedule(NoamLRScheduleConfig(warmup_updates=10, noam_r0=1.0), _optimizer())
    with pytest.raises(ValueError, match="--warmup-updates"):
        NoamSchedule(NoamLRScheduleConfig(warmup_updates=0, noam_d_model=8), _optimizer())
