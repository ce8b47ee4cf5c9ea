"""Two learning rates and strong L2 of Deep-Att training (Zhou et al. 2016, Sec. 4.3, Eq. 12).

``--optimizer deep_att`` puts every trainable parameter in one of three torch parameter groups,
by the parameter's ``param_group`` attribute (set by the model; the attribute fairseq's
``composite`` optimizer also reads):

=============  ===================================  ============  ============
group          parameters                           learning rate L2 strength
=============  ===================================  ============  ============
feedforward    W_f, W_p, attention, softmax, biases --lr (l_f)     --l2-strength (r)
embedding      source and target embeddings         --lr (l_f)     0
recurrent      W_r and the theta vectors (Eq. 4)    --deep-att-lr-recurrent --l2-strength (r)
=============  ===================================  ============  ============

Each update is Eq. 12 with the group's learning rate l:  v <- v - l * (d + r * v), where d is the
gradient g (``--deep-att-update-rule sgd``, exactly Eq. 12) or Adam's step m_hat / (sqrt(v_hat) + eps)
(``--deep-att-update-rule adam``, the default: Sec. 3.2 says the models were trained with Adam; the decay
term stays outside Adam's normalisation, i.e. torch's AdamW with weight_decay = r).  With the
paper's numbers every non-embedding weight is multiplied by (1 - l * r) per update: 1 - 8e-5 for
l_f = 4e-5 and 1 - 1e-3 for l_r = 5e-4, on top of the gradient step.

fairseq's LR scheduler drives the feedforward group through ``set_lr(lr)``; the recurrent group
follows at lr * (lr_recurrent / lr[0]), so the ratio l_r / l_f is kept under warmup or decay.
"""

import logging
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, List

import torch
from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.optim import FairseqOptimizer, register_optimizer
from omegaconf import II

from ..models.flags import add_new_flag_names

logger = logging.getLogger(__name__)

GROUPS = ("feedforward", "embedding", "recurrent")


@dataclass
class DeepAttOptimizerConfig(FairseqDataclass):
    lr_recurrent: float = field(
        default=5e-4,
        metadata={
            "help": "learning rate l_r of the recurrent parameters (W_r, theta) while --lr "
            "(l_f, everything else) is at its initial value; the ratio is kept (Sec. 4.3)"
        },
    )
    l2_strength: float = field(
        default=2.0,
        metadata={"help": "r of Eq. 12: v <- v - l (d + r v), on all but the embeddings"},
    )
    update_rule: ChoiceEnum(["adam", "sgd"]) = field(
        default="adam",
        metadata={"help": "d of Eq. 12: Adam's step (Sec. 3.2) or the gradient (plain Eq. 12)"},
    )
    adam_betas: Any = field(
        default=(0.9, 0.999), metadata={"help": "betas for --deep-att-update-rule adam"}
    )
    adam_eps: float = field(
        default=1e-8, metadata={"help": "epsilon for --deep-att-update-rule adam"}
    )
    momentum: float = field(
        default=0.0, metadata={"help": "momentum for --deep-att-update-rule sgd"}
    )
    lr: List[float] = II("optimization.lr")


def group_of(param) -> str:
    group = getattr(param, "param_group", None)
    return group if group in ("embedding", "recurrent") else "feedforward"


@register_optimizer("deep_att", dataclass=DeepAttOptimizerConfig)
class DeepAttOptimizer(FairseqOptimizer):
    # Under --fp16 the float32 master weights must stay one tensor per parameter (fairseq's
    # --fp16-no-flatten-grads), which patches/precision.py sets for an optimizer that says so.
    needs_param_groups = True

    @classmethod
    def add_args(cls, parser):
        """The dataclass's options, and technique-prefixed names for the two whose names say
        nothing of Deep-Att (the old ones still work, marked deprecated in --help)."""
        super().add_args(parser)
        add_new_flag_names(
            parser,
            {
                "--lr-recurrent": "--deep-att-lr-recurrent",
                "--update-rule": "--deep-att-update-rule",
            },
        )

    def __init__(self, cfg: DeepAttOptimizerConfig, params):
        super().__init__(cfg)
        base_lr = float(cfg.lr[0] if isinstance(cfg.lr, Collection) else cfg.lr)
        if base_lr <= 0:
            raise ValueError(f"--optimizer deep_att needs --lr > 0 (l_f), got {base_lr}")
        scale = {"feedforward": 1.0, "embedding": 1.0, "recurrent": cfg.lr_recurrent / base_lr}
        decay = {"feedforward": cfg.l2_strength, "embedding": 0.0, "recurrent": cfg.l2_strength}
        members = {g: [] for g in GROUPS}
        for p in params:
            members[group_of(p)].append(p)
        groups = [
            {
                "params": members[g],
                "name": g,
                "lr_scale": scale[g],
                "lr": base_lr * scale[g],
                "weight_decay": decay[g],
            }
            for g in GROUPS
            if members[g]
        ]
        groups.sort(key=lambda g: g["lr_scale"] != 1.0)  # get_lr() reads group 0: keep it at --lr
        logger.info(
            "deep_att optimizer groups: "
            + ", ".join(
                f"{g['name']} ({sum(p.numel() for p in g['params'])} params, lr {g['lr']:g}, "
                f"l2 {g['weight_decay']:g})"
                for g in groups
            )
        )
        if cfg.update_rule == "sgd":
            self._optimizer = torch.optim.SGD(groups, lr=base_lr, momentum=cfg.momentum)
        else:
            betas = (
                eval(cfg.adam_betas) if isinstance(cfg.adam_betas, str) else tuple(cfg.adam_betas)
            )
            self._optimizer = torch.optim.AdamW(groups, lr=base_lr, betas=betas, eps=cfg.adam_eps)

    @property
    def optimizer_config(self):
        """What --optimizer-overrides may override on resume (the learning rate is restored from
        the scheduler through set_lr, keeping the ratio)."""
        return {}

    def set_lr(self, lr):
        for group in self.param_groups:
            group["lr"] = lr * group.get("lr_scale", 1.0)

    def load_state_dict(self, state_dict, optimizer_overrides=None):
        lr = self.get_lr()
        super().load_state_dict(state_dict, optimizer_overrides)
        self.set_lr(
            lr
            if not optimizer_overrides or "lr" not in optimizer_overrides
            else optimizer_overrides["lr"]
        )

    @property
    def supports_flat_params(self):
        return False
