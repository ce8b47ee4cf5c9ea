"""Options of the RNMT+/Transformer hybrids (``--hybrid-*``) and how each part reads them: the
Transformer parts a :class:`TransformerConfig`, the RNMT+ parts an :class:`~..config.RNMTPlusConfig`,
each with its component's dropout (Chen et al. 2018, App. A.4-A.6)."""

from dataclasses import dataclass, field

from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.models.transformer import TransformerConfig
from fairseq.utils import safe_getattr

from ....errors import UserError
from ....modules.schemes.norm_schemes import NORM_SCHEMES, scheme_on
from ....modules.schemes.residual_schemes import (
    RESIDUAL_SCHEMES,
    ResidualSchemesConfig,
    check_schemes,
)
from ..config import RNMTConfig, RNMTPlusConfig

COLUMN_KINDS = ("rnmt", "transformer")


@dataclass
class HybridConfig(FairseqDataclass):
    hybrid_encoder: ChoiceEnum(["transformer", "rnmt", "cascaded", "multicolumn"]) = field(
        default="transformer", metadata={"help": "encoder of the hybrid (Chen et al. 2018, Sec. 6)"}
    )
    hybrid_decoder: ChoiceEnum(["rnmt", "transformer"]) = field(
        default="rnmt", metadata={"help": "decoder of the hybrid"}
    )
    hybrid_columns: str = field(
        default="rnmt,transformer",
        metadata={
            "help": "multicolumn: comma-separated encoder columns, each 'rnmt' or 'transformer'"
        },
    )
    hybrid_pretrained: str = field(
        default="",
        metadata={
            "architecture": False,
            "help": "checkpoints to load encoder parts from: cascaded, the RNMT+ part (an rnmt_plus "
            "checkpoint); multicolumn, one per column, comma-separated ('' = none)",
        },
    )
    hybrid_freeze_pretrained: bool = field(
        default=False,
        metadata={
            "architecture": False,
            "help": "freeze the encoder parts loaded with --hybrid-pretrained",
        },
    )
    hybrid_transformer_dropout: float = field(
        default=-1.0,
        metadata={
            "architecture": False,
            "help": "--dropout of the Transformer parts (input and residual dropout; "
            "Chen et al. App. A.4-A.6 give each component its own model's rates, "
            "e.g. En-Fr 0.1); -1: --dropout",
        },
    )
    hybrid_rnmt_dropout: float = field(
        default=-1.0,
        metadata={
            "architecture": False,
            "help": "--dropout of the RNMT+ parts (embeddings and layer outputs; "
            "En-Fr 0.2, En-De 0.3 in Chen et al. App. A.3); -1: --dropout",
        },
    )
    hybrid_rnmt_attention_dropout: float = field(
        default=-1.0,
        metadata={
            "architecture": False,
            "help": "--attention-dropout of the RNMT+ decoder's attention (App. A.3: "
            "as its other dropouts); -1: --attention-dropout",
        },
    )


@dataclass
class RNMTHybridConfig(HybridConfig, RNMTConfig):
    """Options of ``rnmt_hybrid`` beside fairseq's Transformer options: the hybrid's and RNMT+'s own."""


def component_dropout(args, component: str, kind: str = "dropout") -> float:
    """The `kind` ("dropout" or "attention_dropout") of a hybrid's `component` ("transformer" or
    "rnmt"): --hybrid-<component>-<kind>, or --<kind> when that is negative (the default, and
    checkpoints made before the option)."""
    value = getattr(RNMTHybridConfig.from_namespace(args), f"hybrid_{component}_{kind}")
    return (
        float(value) if value is not None and value >= 0 else float(safe_getattr(args, kind, 0.0))
    )


def transformer_cfg(args) -> TransformerConfig:
    """The Transformer parts' config, their dropout --hybrid-transformer-dropout."""
    cfg = TransformerConfig.from_namespace(args)
    cfg.dropout = component_dropout(args, "transformer")
    return cfg


def rnmt_options(args) -> RNMTPlusConfig:
    """The options of the RNMT+ parts: RNMT+'s (the dataclass defaults where the hybrid has none,
    so no DLCL: ``--dlcl-stacks none``), --dropout being --hybrid-rnmt-dropout and
    --attention-dropout --hybrid-rnmt-attention-dropout."""
    opts = RNMTPlusConfig.from_namespace(args)
    opts.dropout = component_dropout(args, "rnmt")
    opts.attention_dropout = component_dropout(args, "rnmt", "attention_dropout")
    return opts


def check_hybrid_schemes(args):
    """The residual schemes do not apply to a hybrid: its Transformer parts are pre-norm (Chen et
    al. 2018, Sec. 2.3), its RNMT+ parts LSTMs; nor do the layer norm schemes and LayerScale
    (modules/schemes/norm_schemes.py), which the hybrids' Transformer parts do not apply to their stacks.
    ``--ds-init`` does: it re-initialises every Transformer layer of the hybrid, l counted within
    each Transformer part."""
    opts = ResidualSchemesConfig.from_namespace(args)
    for name in RESIDUAL_SCHEMES:
        if getattr(opts, name):
            raise UserError(
                f"--{name} replaces the residual connection of post-norm Transformer layers, but a hybrid's "
                f"Transformer parts are pre-norm (Chen et al. 2018, Sec. 2.3) and its RNMT+ parts are LSTMs: "
                f"drop --{name} (--ds-init applies to a hybrid), or use a Transformer --arch (transformer_{name})"
            )
    for name in NORM_SCHEMES:
        if scheme_on(opts, name):
            flag = "--" + name.replace("_", "-")
            raise UserError(
                f"{flag} changes the layer norms of the Transformer families' stacks (transformer_*); "
                f"a hybrid's Transformer parts take --ds-init only: drop {flag}"
            )
    check_schemes(transformer_cfg(args))
