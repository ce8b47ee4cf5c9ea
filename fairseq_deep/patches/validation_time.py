"""Every validation says when it happened: the training's wall clock in its log record.

Replaces: ``fairseq.trainer.Trainer.valid_step``, so that each ``valid`` record carries ``wall``,
the seconds of fairseq's own training clock (the ``wall`` meter that ``Trainer.__init__`` starts
and a checkpoint carries on; the clock ``--stop-time-hours`` budgets) when the validation ended,
to 0.01 s.  fairseq logs ``wall`` only on the ``train_inner`` and ``train`` records, and in whole
seconds (``fairseq_cli.train.get_training_stats``): a run that validates within its first second,
the norm for a short run on a GPU or a tiny one on a fast CPU, gives its validations no time at all
(``fairseq-deep-study``'s learning curve read them as untimed).  :func:`valid_step_timed` calls
fairseq's ``valid_step`` and then logs the clock to the validation's own aggregator (the one
``fairseq_cli.train.validate`` opens with ``new_root=True``; fairseq's named ``valid`` aggregator,
which a checkpoint saves, is closed by then), whose record is printed once the validation ends.

Versions: every fairseq 0.12 (the official 0.12.2 and later ``main``); a log without the field
(an older run's) is read as before.

Pinned by: tests/test_study.py (``test_study_end_to_end_and_resume``: every ``valid`` record of
its runs has a ``wall``), tests/test_study_results.py
(``test_learning_curve_times_from_the_validations``).
"""

from fairseq.logging import metrics
from fairseq.logging.meters import Meter, safe_round
from fairseq.trainer import Trainer

from .install import fairseq_original, install


class LastValue(Meter):
    """A meter whose value is the last one logged (the clock when the last batch was validated)."""

    def __init__(self, round=None):
        self.round = round
        self.reset()

    def reset(self):
        self.value = None

    def update(self, value):
        self.value = value

    def state_dict(self):
        return {"value": self.value, "round": self.round}

    def load_state_dict(self, state_dict):
        self.value, self.round = state_dict["value"], state_dict.get("round")

    @property
    def smoothed_value(self):
        return self.value if self.round is None else safe_round(self.value, self.round)


def valid_step_timed(self, sample, raise_oom=False):
    """fairseq's ``valid_step``, then the training clock logged as the validation's ``wall``."""
    output = fairseq_original(valid_step_timed)(self, sample, raise_oom=raise_oom)
    clock = metrics.get_meter("default", "wall")
    if clock is not None:
        # priority 790: where fairseq puts wall in the training records
        metrics.log_custom(lambda: LastValue(round=2), "wall", clock.elapsed_time, priority=790)
    return output


def apply():
    install(Trainer, "valid_step", valid_step_timed)
