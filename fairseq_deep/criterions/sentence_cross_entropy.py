"""Sentence-level cross-entropy, the RNMT+ loss (Chen et al. 2018, Sec. 4.2: "For RNMT+, we use
sentence-level cross-entropy loss"), with uniform label smoothing (Sec. 4.1, uncertainty 0.1) and
optional L2 regularisation (Sec. 4.1, En-De: lambda = 1e-5).

``--criterion sentence_cross_entropy`` is fairseq's ``label_smoothed_cross_entropy`` normalised per
sentence: the loss of a sentence is the sum of its token losses, and the gradient is the mean over
the sentences of the update (all micro-batches and workers), as with ``--sentence-avg``, which
this criterion switches on.

``--l2-regularization LAMBDA`` adds the L2 penalty (LAMBDA / 2) * ||w||^2 of every weight matrix and
embedding (biases, layer-norm gains and 1-d parameters are excluded) to the objective, i.e.
``grad += LAMBDA * w`` before the optimizer (coupled L2, what the paper's "L2 regularization" is).
fairseq's ``--weight-decay`` with ``--optimizer adam`` is *decoupled* (AdamW: w -= lr * wd * w,
not seen by Adam's moments), a different regulariser.  The penalty is scaled by the micro-batch's
sample size, so that after fairseq divides the summed gradient by the update's sample size its
gradient is exactly LAMBDA * w, whatever ``--update-freq`` and the number of workers.  The logged
``loss`` is the cross-entropy alone; the penalty is logged as ``l2``.
"""

from dataclasses import dataclass, field

import torch
from fairseq import metrics
from fairseq.criterions import register_criterion
from fairseq.criterions.label_smoothed_cross_entropy import (
    LabelSmoothedCrossEntropyCriterion,
    LabelSmoothedCrossEntropyCriterionConfig,
)


@dataclass
class SentenceCrossEntropyConfig(LabelSmoothedCrossEntropyCriterionConfig):
    l2_regularization: float = field(
        default=0.0,
        metadata={
            "help": "coupled L2 penalty lambda/2 ||w||^2 on weight matrices (RNMT+ En-De: 1e-5)"
        },
    )


def l2_penalty(model) -> torch.Tensor:
    """0.5 * sum of squares of the model's trainable parameters with 2 or more dimensions."""
    terms = [p.float().pow(2).sum() for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    return 0.5 * torch.stack(terms).sum() if terms else torch.zeros(())


@register_criterion("sentence_cross_entropy", dataclass=SentenceCrossEntropyConfig)
class SentenceCrossEntropyCriterion(LabelSmoothedCrossEntropyCriterion):
    def __init__(
        self,
        task,
        sentence_avg,
        label_smoothing,
        ignore_prefix_size=0,
        report_accuracy=False,
        l2_regularization=0.0,
    ):
        super().__init__(
            task,
            True,
            label_smoothing,
            ignore_prefix_size=ignore_prefix_size,
            report_accuracy=report_accuracy,
        )
        self.l2_regularization = l2_regularization

    def forward(self, model, sample, reduce=True):
        loss, sample_size, logging_output = super().forward(model, sample, reduce=reduce)
        if self.l2_regularization > 0 and model.training:
            penalty = l2_penalty(model)
            loss = loss + self.l2_regularization * sample_size * penalty.to(loss.dtype)
            logging_output["l2"] = float(penalty) * sample_size
        return loss, sample_size, logging_output

    @classmethod
    def reduce_metrics(cls, logging_outputs) -> None:
        super().reduce_metrics(logging_outputs)
        if any("l2" in log for log in logging_outputs):
            sample_size = sum(log.get("sample_size", 0) for log in logging_outputs)
            l2 = sum(log.get("l2", 0.0) for log in logging_outputs)
            metrics.log_scalar("l2", l2 / max(sample_size, 1), sample_size, round=3)
