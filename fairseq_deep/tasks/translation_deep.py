"""fairseq's translation task with gradient-flow diagnostics, for any encoder-decoder model.

``--task translation_deep`` is ``--task translation`` plus

* ``--log-grad-norm-ratio``: logs r_t = ||dL/dh_1|| / ||dL/dh_N|| (Bapna et al. 2018, Sec. 2.3) as
  ``gnorm_ratio`` in fairseq's metrics, so that it appears in the train log lines and under
  ``--tensorboard-logdir``; per update (all micro-batches and workers together), averaged over
  the log interval like every other train metric;
* ``--log-ta-weights {last,all}``: logs the transparent attention weights s_{i,j} (Eq. 1) as
  ``ta_s{i}_{j}`` (``last``: j = M only, as in Fig. 4);
* ``--freeze-grown-from N[,M]``: the bottom N encoder (M decoder) layers do not train (Wu et al.
  2019's frozen bottom, for a model grown by ``fairseq-deep-grow``).

Both are off by default, and then ``train_step`` is the translation task's own: no hook, no cost.
"""

import logging
from dataclasses import dataclass, field

from fairseq.dataclass import ChoiceEnum
from fairseq.logging import metrics
from fairseq.tasks import register_task
from fairseq.tasks.translation import TranslationConfig, TranslationTask

from ..optim.adaptive_clip import AdaptiveClipConfig, AdaptiveClipTaskMixin  # --adaptive-clip
from .freeze import freeze_bottom_layers  # --freeze-grown-from
from .grad_norm import (
    FIRST_KEY,
    TA_COUNT_KEY,
    GradNormRatioProbe,
    encoder_end_layers,
    grad_norm_ratio,
    is_ta_weight_key,
    transparent_weights_logging,
)

logger = logging.getLogger(__name__)


@dataclass
class TranslationDeepConfig(TranslationConfig, AdaptiveClipConfig):
    log_grad_norm_ratio: bool = field(
        default=False,
        metadata={
            "help": "log r_t = ||dL/dh_1|| / ||dL/dh_N|| of the encoder (Bapna et al. 2018, "
            "Sec. 2.3) as 'gnorm_ratio' at every update"
        },
    )
    log_ta_weights: ChoiceEnum(["none", "last", "all"]) = field(
        default="none",
        metadata={
            "help": "log the transparent attention weights s_{i,j} as 'ta_s{i}_{j}': of the "
            "last decoder layer (Fig. 4 of Bapna et al.) or of all"
        },
    )
    freeze_grown_from: str = field(
        default="",
        metadata={
            "help": "N or N,M: freeze the bottom N encoder layers (and M decoder layers) of a model grown "
            "from a shallow one by fairseq-deep-grow, as Wu et al. (2019) train the new layers on top "
            "of a fixed bottom; embeddings and everything outside the layers still train"
        },
    )


@register_task("translation_deep", dataclass=TranslationDeepConfig)
class TranslationDeepTask(AdaptiveClipTaskMixin, TranslationTask):
    cfg: TranslationDeepConfig

    def build_model(self, cfg, from_checkpoint=False):
        model = super().build_model(cfg, from_checkpoint)
        if self.cfg.freeze_grown_from:
            frozen = freeze_bottom_layers(model, self.cfg.freeze_grown_from)
            logger.info(
                f"--freeze-grown-from {self.cfg.freeze_grown_from}: {frozen} parameter tensors frozen"
            )
        if self.cfg.log_grad_norm_ratio:
            encoder_end_layers(model)  # a model without encoder layers stops here, with the fix
        if self.cfg.log_ta_weights not in (None, "none") and not transparent_weights_logging(model):
            logger.warning(
                "--log-ta-weights: the model has no transparent attention weights; "
                "nothing will be logged (use --arch transformer_ta*)"
            )
        return model

    def train_step(self, sample, model, criterion, optimizer, update_num, ignore_grad=False):
        log_ratio = self.cfg.log_grad_norm_ratio
        log_ta = self.cfg.log_ta_weights not in (None, "none")
        if not (log_ratio or log_ta):
            return super().train_step(sample, model, criterion, optimizer, update_num, ignore_grad)
        if log_ratio:
            with GradNormRatioProbe(model) as probe:
                loss, sample_size, logging_output = super().train_step(
                    sample, model, criterion, optimizer, update_num, ignore_grad
                )
            logging_output.update(probe.logging_output())
        else:
            loss, sample_size, logging_output = super().train_step(
                sample, model, criterion, optimizer, update_num, ignore_grad
            )
        if log_ta:
            logging_output.update(transparent_weights_logging(model, str(self.cfg.log_ta_weights)))
        return loss, sample_size, logging_output

    def reduce_metrics(self, logging_outputs, criterion):
        super().reduce_metrics(logging_outputs, criterion)
        if not logging_outputs:
            return
        if any(FIRST_KEY in log for log in logging_outputs):
            ratio = grad_norm_ratio(logging_outputs)
            if ratio == ratio:  # not nan (a dummy batch has no gradient)
                metrics.log_scalar("gnorm_ratio", ratio, weight=1, priority=700)
        n = sum(float(log.get(TA_COUNT_KEY, 0.0)) for log in logging_outputs)
        if n > 0:
            for key in sorted(k for k in logging_outputs[0] if is_ta_weight_key(k)):
                value = sum(float(log.get(key, 0.0)) for log in logging_outputs) / n
                metrics.log_scalar(key, value, weight=1, priority=800)
