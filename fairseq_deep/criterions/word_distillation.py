"""Word-level knowledge distillation (Hinton et al. 2015; Kim and Rush 2016, Sec. 3.1): the
student learns the reference and, token by token, the output distribution of a frozen teacher.

``--criterion word_distillation --teacher-path TEACHER.pt`` is fairseq's
``label_smoothed_cross_entropy`` (its options, its ``loss``/``nll_loss``/``ppl``) plus the KL
divergence to the teacher at temperature T.  For every target position i that is not padding,
with z^s_i and z^t_i the student's and the teacher's logits over the vocabulary V::

    p_i = softmax(z^t_i / T)           q_i = softmax(z^s_i / T)
    KL_i = sum_{v in S_i} p~_i(v) (log p~_i(v) - log q_i(v))
    loss = (1 - alpha) * sum_i CE_i  +  alpha * T^2 * sum_i KL_i

- CE_i is label-smoothed cross-entropy at temperature 1, exactly as
  ``label_smoothed_cross_entropy`` computes it (``--label-smoothing``).
- S_i is the whole vocabulary (``--distill-top-k 0``, p~ = p: the exact KL), or the K words the
  teacher finds most likely (``--distill-top-k K``), with p~_i = p_i / sum_{u in S_i} p_i(u): the
  teacher's top-K probabilities renormalised to sum to 1, and log q_i the student's log-probabilities
  over the whole vocabulary, gathered at S_i (not renormalised: mass the student puts outside S_i
  is penalised, and KL_i >= 0 with equality only where q_i = p~_i on S_i).  K >= |V| is the full
  KL (up to the order of the sums).  A student equal to its teacher has KL_i = 0 at K = 0 and
  KL_i = -log sum_{u in S_i} p_i(u) (the teacher's mass outside its top K) at K < |V|.
- T^2 keeps the KL term's gradient at the scale of the cross-entropy's as T changes (Hinton et
  al. 2015, Sec. 2: the soft targets' gradients scale as 1/T^2).
- Sums, not means: like every fairseq criterion, the loss is summed over the target tokens of the
  batch and the trainer divides the update's summed gradient by the update's sample size (target
  tokens, or sentences with ``--sentence-avg``): so ``--update-freq`` and data-parallel workers
  see the same objective as one large batch.  alpha = 0 is ``label_smoothed_cross_entropy``
  exactly (loss and gradients; the KL is still computed and logged).

Logged, as ``label_smoothed_cross_entropy`` logs ``loss`` (divided by the sample size, in bits):
``loss`` (the combined objective), ``ce_loss`` (the label-smoothed cross-entropy), ``kd_loss``
(the KL at temperature T, without alpha and T^2), so that loss = (1 - alpha) ce_loss + alpha T^2
kd_loss; ``nll_loss`` and ``ppl`` as fairseq logs them (the student's own perplexity of the
reference).  A validation's ``loss`` is the combined objective too: ``--best-checkpoint-metric
nll_loss`` picks checkpoint_best.pt by the student's perplexity instead.

The teacher (:mod:`fairseq_deep.teacher`: any checkpoint the package loads, its dictionaries
those of the data) is loaded once, when fairseq builds the criterion, and frozen: no gradient,
eval mode (no dropout: it draws no random numbers, so the student's random streams, and resuming,
are those of a plain run), run under ``torch.no_grad``.  It is kept out of ``nn.Module``'s
registration (a plain holder, not a submodule), because fairseq 0.12's Trainer treats a criterion
with parameters as part of the model: it gives its parameters to the optimizer, wraps it in
DistributedDataParallel, casts it with ``.half()``, saves its ``state_dict()`` into every
checkpoint (``criterion``) and switches it to ``train()``.  So the student's checkpoint holds what
a plain run's does, and a resumed run reloads the teacher from ``--teacher-path``.  On first use
the teacher is moved to the student's device and precision (``--fp16``: ``.half()``, ``--bf16``:
bfloat16, as the Trainer casts the student; under ``--amp`` it stays in float32 and autocast runs
it in half precision); the KL is computed in float32.
"""

import collections
import math
from dataclasses import dataclass, field
from typing import Optional

import torch
from fairseq import metrics, utils
from fairseq.criterions import register_criterion
from fairseq.criterions.label_smoothed_cross_entropy import (
    LabelSmoothedCrossEntropyCriterion,
    LabelSmoothedCrossEntropyCriterionConfig,
    label_smoothed_nll_loss,
)

from .. import checkpoints
from ..errors import UserError
from ..teacher import freeze
from ..teacher import load as load_teacher


@dataclass
class WordDistillationConfig(LabelSmoothedCrossEntropyCriterionConfig):
    teacher_path: Optional[str] = field(
        default=None,
        metadata={
            "help": "the teacher's checkpoint (any model fairseq_deep loads, trained on the "
            "dictionaries of this data); required"
        },
    )
    distill_alpha: float = field(
        default=0.5,
        metadata={
            "help": "weight of the KL to the teacher: (1 - alpha) CE + alpha T^2 KL "
            "(0: label_smoothed_cross_entropy; 1: the teacher alone)"
        },
    )
    distill_temperature: float = field(
        default=1.0,
        metadata={"help": "temperature T of both distributions in the KL (Hinton et al. 2015)"},
    )
    distill_top_k: int = field(
        default=0,
        metadata={
            "help": "the KL over the teacher's K most likely words, renormalised (bounds the "
            "memory kept for backward to K per token); 0: the whole vocabulary"
        },
    )


def check_options(teacher_path, alpha: float, temperature: float, top_k: int):
    """One line for an option of the criterion that cannot work."""
    if not teacher_path:
        raise UserError(
            "--criterion word_distillation needs --teacher-path TEACHER.pt: the checkpoint of the "
            "model to distil (trained on this data's dictionaries)"
        )
    if not 0.0 <= alpha <= 1.0:
        raise UserError(f"--distill-alpha {alpha}: the weight of the KL is between 0 and 1")
    if not temperature > 0:
        raise UserError(f"--distill-temperature {temperature}: the temperature is above 0")
    if top_k < 0:
        raise UserError(f"--distill-top-k {top_k}: K is 0 (the whole vocabulary) or more")


def check_args(args):
    """fairseq-deep-train's check of its parsed arguments (cli.CHECKS): under ``--criterion
    word_distillation``, the options and the teacher's file (:func:`fairseq_deep.checkpoints.peek`),
    before fairseq prints its configuration or creates ``--save-dir``.  The criterion checks again
    when fairseq builds it (plain ``fairseq-train --user-dir``)."""
    if args.criterion != "word_distillation":
        return
    config = WordDistillationConfig.from_namespace(args)
    check_options(
        config.teacher_path,
        config.distill_alpha,
        config.distill_temperature,
        config.distill_top_k,
    )
    checkpoints.peek(config.teacher_path, "--teacher-path")


class FrozenTeacher:
    """The teacher, out of ``nn.Module``'s sight (a plain object: the criterion does not register
    it, so fairseq's Trainer neither optimises, wraps, casts nor saves it), frozen and in eval
    mode; :meth:`place` moves it to the student's device and precision on first use."""

    def __init__(self, model: torch.nn.Module):
        self.model = freeze(model)
        self.placed = None  # (device, dtype) it was moved to

    def place(self, device: torch.device, dtype: torch.dtype):
        if self.placed == (device, dtype):
            return
        if dtype == torch.float16:
            self.model.half()  # as fairseq's Trainer casts a model under --fp16
        elif dtype == torch.bfloat16:
            self.model.to(dtype=torch.bfloat16)
        self.model.to(device=device)
        self.model.eval()
        self.placed = (device, dtype)

    @torch.no_grad()
    def net_output(self, sample):
        return self.model(**sample["net_input"])


def student_precision(model) -> torch.dtype:
    """The dtype most of the student's floating-point parameters have (a family may keep a few in
    float32 under half precision: Deep-Att's Float32UnderHalf)."""
    kinds = collections.Counter(p.dtype for p in model.parameters() if p.is_floating_point())
    return kinds.most_common(1)[0][0] if kinds else torch.float32


@register_criterion("word_distillation", dataclass=WordDistillationConfig)
class WordDistillationCriterion(LabelSmoothedCrossEntropyCriterion):
    def __init__(
        self,
        task,
        sentence_avg,
        label_smoothing,
        ignore_prefix_size=0,
        report_accuracy=False,
        teacher_path=None,
        distill_alpha=0.5,
        distill_temperature=1.0,
        distill_top_k=0,
    ):
        super().__init__(
            task,
            sentence_avg,
            label_smoothing,
            ignore_prefix_size=ignore_prefix_size,
            report_accuracy=report_accuracy,
        )
        check_options(teacher_path, distill_alpha, distill_temperature, distill_top_k)
        self.alpha = distill_alpha
        self.temperature = distill_temperature
        self.top_k = distill_top_k
        # building the teacher draws initial values (then overwritten by the checkpoint's): on a
        # forked random state, so that the process's is a plain run's once the criterion is built
        # (fairseq's trainer also reseeds every update).  This data's dictionaries are checked
        # (fairseq_deep.teacher); a plain attribute, not a submodule (nn.Module.__setattr__
        # registers modules only)
        with torch.random.fork_rng(devices=[]):
            self.teacher = FrozenTeacher(load_teacher(teacher_path, task, option="--teacher-path"))

    def forward(self, model, sample, reduce=True):
        net_output = model(**sample["net_input"])
        lprobs, target = self.get_lprobs_and_target(model, net_output, sample)
        # label_smoothed_cross_entropy's compute_loss, on lprobs kept for the KL at T = 1
        ce, nll = label_smoothed_nll_loss(
            lprobs, target, self.eps, ignore_index=self.padding_idx, reduce=reduce
        )
        kd = self.distillation_loss(model, net_output, sample, lprobs, target, reduce)
        loss = (1.0 - self.alpha) * ce + (self.alpha * self.temperature**2) * kd.to(ce.dtype)
        sample_size = sample["target"].size(0) if self.sentence_avg else sample["ntokens"]
        logging_output = {
            "loss": loss.data,
            "ce_loss": ce.data,
            "kd_loss": kd.data,
            "nll_loss": nll.data,
            "ntokens": sample["ntokens"],
            "nsentences": sample["target"].size(0),
            "sample_size": sample_size,
        }
        if self.report_accuracy:
            n_correct, total = self.compute_accuracy(model, net_output, sample)
            logging_output["n_correct"] = utils.item(n_correct.data)
            logging_output["total"] = utils.item(total.data)
        return loss, sample_size, logging_output

    def log_probs_at_temperature(self, model, net_output, sample) -> torch.Tensor:
        """``model``'s log-probabilities of ``net_output`` at temperature T, (tokens, V), float32,
        without the first ``--ignore-prefix-size`` positions (as the cross-entropy's)."""
        logits = net_output[0] / self.temperature
        lprobs, _ = self.get_lprobs_and_target(model, (logits, *net_output[1:]), sample)
        return lprobs.float()

    def distillation_loss(self, model, net_output, sample, lprobs, target, reduce=True):
        """sum_i KL_i over the non-pad target tokens (a (tokens, 1) tensor with ``reduce=False``)."""
        self.teacher.place(sample["target"].device, student_precision(model))
        with torch.no_grad():
            teacher_out = self.teacher.net_output(sample)
            teacher = self.log_probs_at_temperature(self.teacher.model, teacher_out, sample)
            del teacher_out
        student = (
            lprobs.float()
            if self.temperature == 1.0
            else self.log_probs_at_temperature(model, net_output, sample)
        )
        if self.top_k > 0:
            with torch.no_grad():
                teacher, index = teacher.topk(min(self.top_k, teacher.size(-1)), dim=-1)
                teacher = teacher - teacher.logsumexp(dim=-1, keepdim=True)
            student = student.gather(-1, index)
        probs = teacher.exp()
        # p log p is 0 where p is 0 (a word the teacher's float32 softmax underflows on)
        kl = torch.where(probs > 0, probs * (teacher - student), torch.zeros_like(probs))
        kl = kl.sum(dim=-1, keepdim=True).masked_fill(target.eq(self.padding_idx).unsqueeze(-1), 0)
        return kl.sum() if reduce else kl

    @classmethod
    def reduce_metrics(cls, logging_outputs) -> None:
        super().reduce_metrics(logging_outputs)
        sample_size = sum(log.get("sample_size", 0) for log in logging_outputs)
        for key in ("ce_loss", "kd_loss"):
            total = sum(log.get(key, 0) for log in logging_outputs)
            metrics.log_scalar(key, total / max(sample_size, 1) / math.log(2), sample_size, round=3)
