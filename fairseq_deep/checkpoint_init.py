"""Initialise a model from a pre-trained checkpoint of a smaller architecture.

Dou et al. (2018, Sec. 4.1): "The parameters of the proposed models were initialized by the
pre-trained model", i.e. a trained Transformer.  With ``--init-from-pretrained`` a model of this
package accepts such a checkpoint in fairseq's own ``--finetune-from-model BASELINE.pt`` (which
fairseq applies at the first launch only, resetting optimizer, scheduler and meters): every
parameter whose name and shape match is loaded, the new ones (aggregation nodes, extra attentions,
layer weights) keep their fresh initialisation and are listed in the log, and so are checkpoint
tensors the model does not use.  A tensor of the same name and another shape stops with an error.
"""

import logging
import re
from dataclasses import dataclass, field
from typing import List, Tuple

from fairseq.dataclass import FairseqDataclass
from torch import nn

from .modules.common.better_transformer import without_better_transformer_keys

logger = logging.getLogger(__name__)


@dataclass
class PretrainedInitConfig(FairseqDataclass):
    """``--init-from-pretrained``, read by :class:`PretrainedInitMixin` models."""

    init_from_pretrained: bool = field(
        default=False,
        metadata={
            "architecture": False,
            "help": "with --finetune-from-model BASELINE.pt: load every parameter of the "
            "baseline whose name and shape match, log the new ones that start fresh",
        },
    )


@dataclass
class InitReport:
    loaded: List[str] = field(default_factory=list)
    fresh: List[str] = field(default_factory=list)  # model tensors the checkpoint lacks
    unused: List[str] = field(default_factory=list)  # checkpoint tensors the model lacks

    def summary(self) -> str:
        return (
            f"loaded {len(self.loaded)} tensors from the pre-trained checkpoint; "
            f"{len(self.fresh)} start fresh: {summarise(self.fresh) or 'none'}; "
            f"{len(self.unused)} checkpoint tensors unused: {summarise(self.unused) or 'none'}"
        )


def summarise(names: List[str]) -> str:
    """Names with layer indices folded: ``decoder.layers.*.lower_attention.agg.fc1.weight``."""
    folded = sorted({re.sub(r"\.\d+\.", ".*.", n) for n in names})
    return ", ".join(folded)


def load_matching(model: nn.Module, state_dict) -> InitReport:
    """Copy every tensor of `state_dict` whose name and shape match into `model` (a fairseq
    0.12.2 checkpoint's fused copies of its encoder layers' weights are not weights: left out)."""
    state_dict = without_better_transformer_keys(state_dict)
    own = model.state_dict()
    mismatched: List[Tuple[str, tuple, tuple]] = [
        (k, tuple(v.shape), tuple(own[k].shape))
        for k, v in state_dict.items()
        if k in own and own[k].shape != v.shape
    ]
    if mismatched:
        lines = "; ".join(f"{k}: checkpoint {a}, model {b}" for k, a, b in mismatched[:5])
        raise ValueError(
            f"--init-from-pretrained: {len(mismatched)} tensors of the checkpoint have other shapes "
            f"than the model's ({lines}): give the model the baseline's dimensions "
            "(--encoder-embed-dim, --*-ffn-embed-dim, --*-attention-heads, vocabularies)"
        )
    loadable = {k: v for k, v in state_dict.items() if k in own}
    nn.Module.load_state_dict(model, loadable, strict=False)
    return InitReport(
        loaded=sorted(loadable),
        fresh=sorted(k for k in own if k not in state_dict),
        unused=sorted(k for k in state_dict if k not in own),
    )


class PretrainedInitMixin:
    """For a fairseq model class: with ``args.init_from_pretrained`` its ``load_state_dict``
    loads the matching part of a checkpoint and logs what starts fresh (see the module doc).

    A complete checkpoint of the model itself (resuming, generation) loads exactly as usual and
    reports nothing fresh."""

    init_from_pretrained = False

    def load_state_dict(self, state_dict, strict=True, model_cfg=None, args=None):
        if not self.init_from_pretrained:
            return super().load_state_dict(
                state_dict, strict=strict, model_cfg=model_cfg, args=args
            )
        self.upgrade_state_dict(state_dict)  # fairseq's renames of old checkpoints
        report = load_matching(self, state_dict)
        if report.fresh or report.unused:
            logger.info("--init-from-pretrained: %s", report.summary())
        self.init_report = report
        return nn.modules.module._IncompatibleKeys(report.fresh, report.unused)
