"""Layer-diversity regularizer (Dou et al. 2018, Sec. 3.2, Eq. 9-10).

    L_diversity = 1/(L-1) sum_{l=1}^{L-1} D(H^l, H^{l+1}),
    D(H^l, H^{l+1}) = 1/N sum_n (1 - cos^2(h^l_n, h^{l+1}_n)),

over the outputs H^1..H^L of a stack's layers (the embedding excluded), N the non-padding positions
of the batch (pooled over its sentences).  With encoder and decoder both regularised
(``--diversity-stacks both``) L_diversity is the mean of the two stacks' values, so it stays in [0, 1].

**Sign.**  The paper adds "a regularization term to our objective function to maximize the
diversity across layers", L = L_likelihood + lambda * L_diversity (Eq. 9): L is a likelihood, to be
maximised, and 1 - cos^2 is larger the more different two layers are.  Read as a loss to minimise,
Eq. 9 would make the layers *more* alike.  This criterion therefore **minimises**

    label-smoothed cross-entropy  -  lambda * L_diversity       (= CE + lambda * mean cos^2 - lambda)

per target token (the diversity term is scaled by the sample size, as the cross-entropy is summed),
i.e. it maximises likelihood and diversity together.  A negative ``--diversity-lambda`` flips it.
The logged ``loss`` is that objective; ``nll_loss`` is unchanged; ``diversity`` is L_diversity.

**Layer states: one interface for every model of the package.**  :func:`forward_with_layer_states`
runs ``model(**net_input)`` (through any DDP wrapper, so gradients are synchronised as usual),
with ``return_all_hiddens=True`` set on the encoder's call by a forward pre-hook, and reads

* the encoder's per-layer outputs from its output dict (captured by a forward hook on
  ``model.encoder``): ``encoder_out["encoder_states"]``, a list of T x B x C tensors with the
  embedding output first, and its padding from ``encoder_out["encoder_padding_mask"]`` (B x T);
* the decoder's from ``extra["inner_states"]`` (same layout) and its padding from
  ``prev_output_tokens == pad``.

This is fairseq's own convention (``TransformerEncoderBase`` / ``TransformerDecoderBase``), which
every stack of fairseq_deep follows.  A model that keeps its layers elsewhere defines
``forward_with_layer_states(**net_input) -> (net_output, {"encoder": LayerStates, "decoder": ...})``.
"""

import inspect
from dataclasses import dataclass, field
from typing import Dict, List, NamedTuple, Optional, Tuple

import torch
import torch.nn.functional as F
from fairseq import utils
from fairseq.criterions import register_criterion
from fairseq.criterions.label_smoothed_cross_entropy import (
    LabelSmoothedCrossEntropyCriterion,
    LabelSmoothedCrossEntropyCriterionConfig,
)
from fairseq.dataclass import ChoiceEnum
from fairseq.logging import metrics
from torch import Tensor


class LayerStates(NamedTuple):
    states: List[Tensor]  # outputs of layers 1..L (embedding excluded), each T x B x C
    padding_mask: Optional[Tensor]  # B x T, True at padding


def layer_diversity(layers: LayerStates) -> Tensor:
    """Eq. 10: mean over adjacent layer pairs of the mean over non-padding positions of
    1 - cos^2(h^l_n, h^{l+1}_n).  0 for a stack of fewer than two layers."""
    states = layers.states
    if len(states) < 2:
        return states[0].new_zeros(()) if states else torch.zeros(())
    T, B = states[0].shape[:2]
    if layers.padding_mask is not None:
        keep = (~layers.padding_mask.bool()).t().to(torch.float32)  # T x B
    else:
        keep = states[0].new_ones(T, B, dtype=torch.float32)
    count = keep.sum().clamp(min=1)
    terms = []
    for lower, upper in zip(states[:-1], states[1:]):
        cos = F.cosine_similarity(lower.float(), upper.float(), dim=-1, eps=1e-8)  # T x B
        terms.append(((1 - cos.pow(2)) * keep).sum() / count)
    return torch.stack(terms).mean()


def _unwrap(model):
    while hasattr(model, "module") and not hasattr(model, "encoder"):
        model = model.module
    return model


def forward_with_layer_states(
    model, net_input, padding_idx: int
) -> Tuple[tuple, Dict[str, LayerStates]]:
    """The model's output and the per-layer outputs of its stacks (see the module doc)."""
    inner = _unwrap(model)
    if hasattr(inner, "forward_with_layer_states"):
        return inner.forward_with_layer_states(**net_input)
    captured: Dict[str, dict] = {}
    wants_states = "return_all_hiddens" in inspect.signature(inner.encoder.forward).parameters

    def all_hiddens(module, args, kwargs):
        if wants_states and len(args) < 3:  # (src_tokens, src_lengths, return_all_hiddens, ...)
            kwargs = {**kwargs, "return_all_hiddens": True}
        return args, kwargs

    handles = [
        inner.encoder.register_forward_pre_hook(all_hiddens, with_kwargs=True),
        inner.encoder.register_forward_hook(lambda m, args, out: captured.setdefault("out", out)),
    ]
    try:
        net_output = model(**net_input)
    finally:
        for handle in handles:
            handle.remove()
    encoder_out = captured.get("out")
    name = type(inner).__name__
    if not isinstance(encoder_out, dict) or len(encoder_out.get("encoder_states") or []) < 2:
        raise ValueError(
            f"--criterion label_smoothed_cross_entropy_with_diversity: {name}'s encoder exposes no layer "
            "states (encoder_out['encoder_states'] is empty with return_all_hiddens=True); fill it as "
            "fairseq's TransformerEncoder does, or define forward_with_layer_states (see "
            "fairseq_deep/criterions/layer_diversity.py)"
        )
    extra = net_output[1] if isinstance(net_output, tuple) and len(net_output) > 1 else None
    inner_states = extra.get("inner_states") if isinstance(extra, dict) else None
    if not inner_states or len(inner_states) < 2:
        raise ValueError(
            f"--criterion label_smoothed_cross_entropy_with_diversity: {name}'s decoder returns no "
            "extra['inner_states']; return them as fairseq's TransformerDecoder does, or define "
            "forward_with_layer_states"
        )
    enc_mask = encoder_out.get("encoder_padding_mask") or [None]
    return net_output, {
        "encoder": LayerStates(list(encoder_out["encoder_states"][1:]), enc_mask[0]),
        "decoder": LayerStates(
            list(inner_states[1:]), net_input["prev_output_tokens"].eq(padding_idx)
        ),
    }


@dataclass
class LayerDiversityCriterionConfig(LabelSmoothedCrossEntropyCriterionConfig):
    diversity_lambda: float = field(
        default=1.0,
        metadata={
            "help": "lambda of Eq. 9 (1.0 in Dou et al. 2018); the criterion minimises "
            "cross-entropy - lambda * L_diversity"
        },
    )
    diversity_stacks: ChoiceEnum(["both", "encoder", "decoder"]) = field(
        default="both", metadata={"help": "stacks whose adjacent layers are pushed apart (Eq. 10)"}
    )


@register_criterion(
    "label_smoothed_cross_entropy_with_diversity", dataclass=LayerDiversityCriterionConfig
)
class LayerDiversityCriterion(LabelSmoothedCrossEntropyCriterion):
    """Label-smoothed cross-entropy minus lambda * layer diversity (Dou et al. 2018, Eq. 9-10)."""

    def __init__(
        self,
        task,
        sentence_avg,
        label_smoothing,
        ignore_prefix_size=0,
        report_accuracy=False,
        diversity_lambda=1.0,
        diversity_stacks="both",
    ):
        super().__init__(task, sentence_avg, label_smoothing, ignore_prefix_size, report_accuracy)
        self.diversity_lambda = diversity_lambda
        self.diversity_stacks = (
            ["encoder", "decoder"] if diversity_stacks == "both" else [diversity_stacks]
        )

    def diversity(self, layer_states: Dict[str, LayerStates]) -> Tensor:
        return torch.stack([layer_diversity(layer_states[s]) for s in self.diversity_stacks]).mean()

    def forward(self, model, sample, reduce=True):
        net_output, layer_states = forward_with_layer_states(
            model, sample["net_input"], self.padding_idx
        )
        loss, nll_loss = self.compute_loss(model, net_output, sample, reduce=reduce)
        sample_size = sample["target"].size(0) if self.sentence_avg else sample["ntokens"]
        diversity = self.diversity(layer_states)
        loss = loss - self.diversity_lambda * diversity.to(loss.dtype) * sample_size
        logging_output = {
            "loss": loss.data,
            "nll_loss": nll_loss.data,
            "diversity": diversity.data * sample_size,
            "ntokens": sample["ntokens"],
            "nsentences": sample["target"].size(0),
            "sample_size": sample_size,
        }
        if self.report_accuracy:
            n_correct, total = self.compute_accuracy(model, net_output, sample)
            logging_output["n_correct"] = utils.item(n_correct.data)
            logging_output["total"] = utils.item(total.data)
        return loss, sample_size, logging_output

    @classmethod
    def reduce_metrics(cls, logging_outputs) -> None:
        super().reduce_metrics(logging_outputs)
        sample_size = sum(log.get("sample_size", 0) for log in logging_outputs)
        diversity = sum(log.get("diversity", 0) for log in logging_outputs)
        if sample_size > 0:
            metrics.log_scalar(
                "diversity", utils.item(diversity) / sample_size, sample_size, round=4
            )
