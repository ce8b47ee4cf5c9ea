"""ODE Transformer (Li, Du, Zhou, Jing, Wang, Zhu, Xiao, Zhang, Zhu, ACL 2022, "ODE Transformer: An
Ordinary Differential Equation-Inspired Model for Sequence Generation", Sec. 3).

A residual layer y_{t+1} = y_t + F(y_t) is one Euler step of dy/dt = F(y).  An ODE Transformer
layer (an "RK block") takes a Runge-Kutta step instead, evaluating the same layer function F
(same parameters) several times (Eq. 6-7)::

    F_1 = F(y_t),  F_i = F(y_t + sum_{j<i} a_ij F_j),  y_{t+1} = y_t + sum_i gamma_i F_i

with F(y) = layer(y) - y, the whole pre-norm layer (self-attention, encoder attention, FFN, each
with its norm and inner residual) less its outer identity (Sec. 3.1: a Transformer layer is
itself a higher-order solution; the block's F is the layer).

* ``rk2`` (a_21 = 1, Heun's method): gamma = (1/2, 1/2) (``fixed``), learned from there
  (``learned``), or the paper's "RK2-block with learnable gamma_i" (``gated``, Eq. 16, the
  authors' presets): y_{t+1} = y_t + g F_1 + (1 - g) F_2, g = sigmoid([F_1, F_2] W + b), one
  gate value per position;
* ``rk4`` (the classical tableau, a = 1/2, 1/2, 1): gamma = (1/6, 1/3, 1/3, 1/6), ``fixed`` (the
  paper's RK4-block) or ``learned``.

With ``learned`` gamma = (1, 0) an RK2 block is the plain layer (an Euler step: y + F_1 =
layer(y)), which tests/test_stream_schemes.py checks.  Choices where the paper or the code leave
room: the gate is one per block (the authors' code shares one gate over the encoder's blocks);
``learned`` starts at the tableau's gamma (the code's variant starts at 1, 1); the decoder may
have RK blocks too (``--ode-stacks``; the paper's MT models and the code: encoder only).

Granularity: per layer, as the paper; the mixin's ``forward`` runs fairseq's own layer ``forward``
once per evaluation.  Incremental decoding: evaluation i > 1 of a decoder layer attends over its
own keys and values of the earlier positions (those of y_t + sum a_ij F_j, not y_t), so each
evaluation keeps its own attention cache: the first in fairseq's incremental state, evaluation i
in a dict of its own inside it (``ode_stage_caches``), which follows the beam through
:func:`~fairseq_deep.modules.common.reorder.reorder_batch` (its entries are fairseq's attention buffers,
batch first).  The authors' code (libeineu/ODE-Transformer, a fork of fairseq 0.6.2) installs from
no package registry; its ``ode_transformer.py`` as published does not parse (a missing colon) and
adds the layer's own residual to F, so this follows the paper's equations.
"""

import uuid
from dataclasses import dataclass, field
from typing import Dict, List

import torch
from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from torch import Tensor, nn

from ...errors import UserError
from ..common.reorder import reorder_batch
from .residual_streams import mix_into

#: method -> (a_ij rows of the stages 2.., gamma of the classical method)
TABLEAUS = {
    "rk2": ([[1.0]], [0.5, 0.5]),
    "rk4": ([[0.5], [0.0, 0.5], [0.0, 0.0, 1.0]], [1 / 6, 1 / 3, 1 / 3, 1 / 6]),
}
ODE_STACKS = ("encoder", "decoder", "both")


@dataclass
class ODEConfig(FairseqDataclass):
    """The ``--ode-*`` options (Li et al. 2022)."""

    ode_method: ChoiceEnum(["none", *TABLEAUS]) = field(
        default="none",
        metadata={
            "help": "ODE Transformer (Li et al. 2022): each pre-norm layer is a Runge-Kutta block "
            "that evaluates the layer 2 (rk2) or 4 (rk4) times"
        },
    )
    ode_coefficients: ChoiceEnum(["gated", "learned", "fixed"]) = field(
        default="gated",
        metadata={
            "help": "gamma_i: gated (rk2: g F1 + (1-g) F2, g a sigmoid gate of [F1, F2]; the "
            "paper's learnable gamma), learned (from the tableau's) or fixed (the tableau's)"
        },
    )
    ode_stacks: ChoiceEnum(list(ODE_STACKS)) = field(
        default="encoder",
        metadata={"help": "stacks of RK blocks (the paper's MT models: the encoder)"},
    )


class StageCaches(nn.Module):
    """The attention caches of evaluations 2.. of one decoder RK block, each a dict inside fairseq's
    incremental state under its own key; ``reorder_incremental_state`` (fairseq calls it on every
    module of the decoder) moves them with the beam."""

    def __init__(self, stages: int):
        super().__init__()
        base = uuid.uuid4().hex
        self.keys = [f"ode_stage.{base}.{i}" for i in range(1, stages)]

    def reorder_incremental_state(self, incremental_state, new_order):
        for key in self.keys:
            cache = incremental_state.get(key)
            if cache is not None:  # {attention's key: its buffer of prev_key, ...}, batch first
                incremental_state[key] = {k: reorder_batch(v, new_order) for k, v in cache.items()}
        return incremental_state


class ODEBlock:
    """Mixin of fairseq's pre-norm layer: its forward is one Runge-Kutta step (module docstring)."""

    why_not_standard = (
        "ODE Transformer blocks evaluate each layer several times per step (Li et al. 2022), "
        "which no standard Transformer computes"
    )

    def forward(self, x, *args, **kwargs):
        stages, gammas = TABLEAUS[self.ode_method]
        first = None
        increments: List[Tensor] = []
        for i in range(len(gammas)):
            y = x
            if i > 0:
                for a, f in zip(stages[i - 1], increments):
                    if a:
                        y = y + a * f
            stage_args, stage_kwargs = self._stage_arguments(i, args, kwargs)
            out = super().forward(y, *stage_args, **stage_kwargs)
            value = out[0] if isinstance(out, tuple) else out
            increments.append(value - y)
            first = out if i == 0 else first
        combined = x + self.combine_increments(increments)
        return (combined, *first[1:]) if isinstance(first, tuple) else combined

    def combine_increments(self, increments: List[Tensor]) -> Tensor:
        if self.ode_coefficients == "gated":
            f1, f2 = increments
            g = torch.sigmoid(self.ode_gate(torch.cat([f1, f2], dim=-1)))
            return g * f1 + (1 - g) * f2
        gammas = self.ode_gamma.to(increments[0].dtype)
        out = increments[0] * gammas[0]
        for f, gamma in zip(increments[1:], gammas[1:]):
            out = out + f * gamma
        return out

    def _stage_arguments(self, i: int, args, kwargs):
        """The forward's arguments for evaluation i: a decoder layer's incremental state replaced by
        the evaluation's own cache (positional after x: encoder_out, its padding mask, the state)."""
        caches = getattr(self, "ode_stage_caches", None)
        if i == 0 or caches is None:
            return args, kwargs
        state = kwargs["incremental_state"] if "incremental_state" in kwargs else None
        if state is None and len(args) > 2:
            state = args[2]
        if state is None:
            return args, kwargs
        own: Dict = state.setdefault(caches.keys[i - 1], {})
        if "incremental_state" in kwargs:
            return args, {**kwargs, "incremental_state": own}
        return (*args[:2], own, *args[3:]), kwargs


def apply_ode(layer: nn.Module, opts: ODEConfig, side: str) -> None:
    """Make a built fairseq pre-norm layer an RK block."""
    stages = len(TABLEAUS[opts.ode_method][1])
    if opts.ode_coefficients == "gated" and stages != 2:
        raise UserError(
            f"--ode-coefficients gated combines two evaluations (rk2); --ode-method "
            f"{opts.ode_method} takes learned or fixed"
        )
    mix_into(layer, ODEBlock, f"--ode-method {opts.ode_method}")
    layer.ode_method, layer.ode_coefficients = opts.ode_method, opts.ode_coefficients
    gammas = torch.tensor(TABLEAUS[opts.ode_method][1])
    if opts.ode_coefficients == "gated":
        layer.ode_gate = nn.Linear(2 * layer.embed_dim, 1)
        nn.init.xavier_uniform_(layer.ode_gate.weight)
        nn.init.zeros_(layer.ode_gate.bias)
    elif opts.ode_coefficients == "learned":
        layer.ode_gamma = nn.Parameter(gammas)
    else:
        layer.register_buffer("ode_gamma", gammas, persistent=False)
    if side == "decoder":
        layer.ode_stage_caches = StageCaches(stages)
