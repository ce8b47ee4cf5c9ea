"""Hybrids of RNMT+ and the Transformer (Chen et al. 2018, Sec. 6, App. A.4-A.6), ``--arch`` of the
model ``rnmt_hybrid``:

* ``hybrid_transformer_rnmt``: Transformer Big encoder + RNMT+ decoder (Table 5, the best pair);
* ``hybrid_rnmt_transformer``: RNMT+ encoder (its projection to the decoder width) + Transformer Big
  decoder (Table 5);
* ``hybrid_cascaded``: RNMT+ encoder (with projection), its output layer-normalized and fed to N
  Transformer layers without positional embeddings (best: 4 on top of 6), RNMT+ decoder (Fig. 2a,
  App. A.5, Table 6); ``--hybrid-pretrained RNMT_CKPT --hybrid-freeze-pretrained`` loads the RNMT+
  part from an ``rnmt_plus`` checkpoint and freezes it, as in the paper;
* ``hybrid_multicolumn``: encoder columns (``--hybrid-columns rnmt,transformer``, any number), each
  column's output layer-normalized, concatenated and projected to the decoder width by a
  layer-normalized affine transformation, RNMT+ decoder (Fig. 2b, App. A.6, Table 6); each column
  can be loaded from a checkpoint (``--hybrid-pretrained A,B``, the encoder of an ``rnmt_plus`` or of
  a ``hybrid_transformer_rnmt``/``transformer`` model) and frozen.

In every hybrid ``--encoder-layers`` counts Transformer encoder layers and ``--rnmt-encoder-layers``
RNMT+ encoder layers.  ``--dropout`` is both components' unless ``--hybrid-transformer-dropout`` /
``--hybrid-rnmt-dropout`` give each its own, and ``--hybrid-rnmt-attention-dropout`` the RNMT+
decoder's attention (App. A.4-A.6 use each model's own rates: En-Fr 0.1 for the Transformer Big,
0.2 for RNMT+).  The Transformer parts are fairseq's own layers; as in Chen et al. (Sec. 2.3)
they are pre-norm with a final layer norm by default.
"""

import logging
import os
from dataclasses import dataclass, field
from typing import List, Optional

import torch
from torch import Tensor, nn

from fairseq import checkpoint_utils
from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.dataclass.utils import gen_parser_from_dataclass
from fairseq.models import FairseqEncoder, FairseqEncoderDecoderModel, register_model, register_model_architecture
from fairseq.models.transformer import (
    TransformerConfig,
    TransformerDecoderBase,
    TransformerModel,
)
from fairseq.models.transformer import base_architecture as fairseq_transformer_base
from fairseq.modules.transformer_layer import TransformerEncoderLayerBase
from fairseq.utils import safe_getattr

from ..presets import PRENORM, fill_defaults, register_preset, set_default, transformer_big
from .config import RNMTConfig
from .decoder import RNMTPlusDecoder
from ...compat import without_better_transformer
from ..transformer_stack import FairseqTransformerEncoder
from ...modules.reorder import reorder_encoder_out
from .encoder import RNMTPlusEncoder
from .model import build_embedding

logger = logging.getLogger(__name__)

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
        metadata={"help": "multicolumn: comma-separated encoder columns, each 'rnmt' or 'transformer'"},
    )
    hybrid_pretrained: str = field(
        default="",
        metadata={"help": "checkpoints to load encoder parts from: cascaded, the RNMT+ part (an rnmt_plus "
                  "checkpoint); multicolumn, one per column, comma-separated ('' = none)"},
    )
    hybrid_freeze_pretrained: bool = field(
        default=False, metadata={"help": "freeze the encoder parts loaded with --hybrid-pretrained"}
    )
    hybrid_transformer_dropout: float = field(
        default=-1.0, metadata={"help": "--dropout of the Transformer parts (input and residual dropout; "
                                "Chen et al. App. A.4-A.6 give each component its own model's rates, "
                                "e.g. En-Fr 0.1); -1: --dropout"}
    )
    hybrid_rnmt_dropout: float = field(
        default=-1.0, metadata={"help": "--dropout of the RNMT+ parts (embeddings and layer outputs; "
                                "En-Fr 0.2, En-De 0.3 in Chen et al. App. A.3); -1: --dropout"}
    )
    hybrid_rnmt_attention_dropout: float = field(
        default=-1.0, metadata={"help": "--attention-dropout of the RNMT+ decoder's attention (App. A.3: "
                                "as its other dropouts); -1: --attention-dropout"}
    )


def component_dropout(args, component: str, kind: str = "dropout") -> float:
    """The `kind` ("dropout" or "attention_dropout") of a hybrid's `component` ("transformer" or
    "rnmt"): --hybrid-<component>-<kind>, or --<kind> when that is negative (the default, and
    checkpoints made before the option)."""
    value = safe_getattr(args, f"hybrid_{component}_{kind}", -1.0)
    return float(value) if value is not None and value >= 0 else float(safe_getattr(args, kind, 0.0))


def _transformer_cfg(args) -> TransformerConfig:
    """The Transformer parts' config, their dropout --hybrid-transformer-dropout."""
    cfg = TransformerConfig.from_namespace(args)
    cfg.dropout = component_dropout(args, "transformer")
    return cfg


class _Overridden:
    """`base` (a namespace or a DictConfig, left unchanged) seen with some attributes replaced."""

    def __init__(self, base, **values):
        self.__dict__.update(values, _base=base)

    def __getattr__(self, name):
        return getattr(self.__dict__["_base"], name)


def _rnmt_args(args):
    """`args` as the RNMT+ parts see them: --dropout is --hybrid-rnmt-dropout, --attention-dropout
    --hybrid-rnmt-attention-dropout."""
    return _Overridden(args, dropout=component_dropout(args, "rnmt"),
                       attention_dropout=component_dropout(args, "rnmt", "attention_dropout"))


class TransformerLayers(nn.Module):
    """fairseq Transformer encoder layers over a given T x B x C input (no embedding, no positions),
    with the final layer norm of a pre-norm stack (cascaded encoder, App. A.5)."""

    def __init__(self, cfg: TransformerConfig, num_layers: int):
        super().__init__()
        self.layers = nn.ModuleList(without_better_transformer(TransformerEncoderLayerBase(cfg))
                                    for _ in range(num_layers))
        dim = cfg.encoder.embed_dim
        self.layer_norm = nn.LayerNorm(dim) if cfg.encoder.normalize_before else None

    def forward(self, x: Tensor, padding_mask: Optional[Tensor], states: Optional[List[Tensor]] = None):
        mask = padding_mask if padding_mask is not None and padding_mask.any() else None
        for layer in self.layers:
            x = layer(x, encoder_padding_mask=mask)
            if states is not None:
                states.append(x)
        return self.layer_norm(x) if self.layer_norm is not None else x


class CascadedEncoder(FairseqEncoder):
    """RNMT+ encoder -> LayerNorm -> Transformer layers (Chen et al. 2018, Fig. 2a, App. A.5)."""

    def __init__(self, args, dictionary, embed_tokens):
        super().__init__(dictionary)
        cfg = _transformer_cfg(args)
        dim = cfg.encoder.embed_dim
        self.rnmt = RNMTPlusEncoder(_rnmt_args(args), dictionary, embed_tokens, output_dim=dim,
                                    num_layers=args.rnmt_encoder_layers)
        self.rnmt_layer_norm = nn.LayerNorm(dim)
        self.transformer = TransformerLayers(cfg, cfg.encoder.layers)
        self.output_dim = dim

    def forward(self, src_tokens, src_lengths=None, return_all_hiddens: bool = False):
        out = self.rnmt(src_tokens, src_lengths, return_all_hiddens=return_all_hiddens)
        states = out["encoder_states"] if return_all_hiddens else None
        x = self.rnmt_layer_norm(out["encoder_out"][0])
        x = self.transformer(x, out["encoder_padding_mask"][0], states)
        out["encoder_out"] = [x]
        return out

    def pretrained_parts(self) -> List[nn.Module]:
        return [self.rnmt]

    def reorder_encoder_out(self, encoder_out, new_order):
        return reorder_encoder_out(encoder_out, new_order)

    def max_positions(self):
        return self.rnmt.max_positions()


class MultiColumnEncoder(FairseqEncoder):
    """Independent encoder columns, each output layer-normalized, concatenated and projected to the
    decoder width with a layer-normalized affine transformation (Chen et al. 2018, Fig. 2b, App. A.6)."""

    def __init__(self, args, dictionary, kinds: List[str], output_dim: int):
        super().__init__(dictionary)
        columns = []
        for kind in kinds:
            if kind == "rnmt":
                emb = build_embedding(dictionary, args.encoder_embed_dim)
                columns.append(RNMTPlusEncoder(_rnmt_args(args), dictionary, emb, output_dim=output_dim,
                                               num_layers=args.rnmt_encoder_layers))
            elif kind == "transformer":
                cfg = _transformer_cfg(args)
                emb = build_embedding(dictionary, cfg.encoder.embed_dim)
                columns.append(FairseqTransformerEncoder(cfg, dictionary, emb))
            else:
                raise ValueError(f"--hybrid-columns: unknown column {kind!r}; use a comma-separated list of {COLUMN_KINDS}")
        self.columns = nn.ModuleList(columns)
        dims = [c.output_dim if isinstance(c, RNMTPlusEncoder) else args.encoder_embed_dim for c in columns]
        self.column_norms = nn.ModuleList(nn.LayerNorm(d) for d in dims)
        self.merge = nn.Linear(sum(dims), output_dim)
        self.merge_norm = nn.LayerNorm(output_dim)
        self.output_dim = output_dim

    def forward(self, src_tokens, src_lengths=None, return_all_hiddens: bool = False):
        outs = [c(src_tokens, src_lengths, return_all_hiddens=return_all_hiddens) for c in self.columns]
        merged = torch.cat([norm(o["encoder_out"][0]) for norm, o in zip(self.column_norms, outs)], dim=-1)
        x = self.merge_norm(self.merge(merged))
        out = dict(outs[0])
        out["encoder_out"] = [x]
        # every column's layers, column by column (a T x B x C list, widths may differ)
        out["encoder_states"] = [s for o in outs for s in o["encoder_states"]]
        return out

    def pretrained_parts(self) -> List[nn.Module]:
        return list(self.columns)

    def reorder_encoder_out(self, encoder_out, new_order):
        return reorder_encoder_out(encoder_out, new_order)

    def max_positions(self):
        return min(c.max_positions() for c in self.columns)


def load_encoder_weights(module: nn.Module, path: str):
    """Load ``module`` from the encoder of the checkpoint ``path`` (keys ``encoder.*``)."""
    state = checkpoint_utils.load_checkpoint_to_cpu(path)["model"]
    sub = {k[len("encoder."):]: v for k, v in state.items() if k.startswith("encoder.")}
    missing, unexpected = module.load_state_dict(sub, strict=False)
    if missing:
        raise ValueError(
            f"--hybrid-pretrained {path}: its encoder does not fit this part ({type(module).__name__}): "
            f"missing {missing[:5]}{'...' if len(missing) > 5 else ''}. Check --rnmt-encoder-layers, "
            f"--encoder-hidden-size and the dimensions against the pre-trained model"
        )
    if unexpected:
        logger.info("--hybrid-pretrained %s: ignored %d encoder entries (e.g. %s)", path, len(unexpected), unexpected[0])


@register_model("rnmt_hybrid")
class RNMTHybridModel(FairseqEncoderDecoderModel):
    @classmethod
    def add_args(cls, parser):
        TransformerModel.add_args(parser)
        gen_parser_from_dataclass(parser, RNMTConfig(), delete_default=True, with_prefix="")
        gen_parser_from_dataclass(parser, HybridConfig(), delete_default=True, with_prefix="")

    @classmethod
    def build_model(cls, args, task):
        hybrid_base_architecture(args)
        src_dict, tgt_dict = task.source_dictionary, task.target_dictionary
        kind = str(args.hybrid_encoder)
        decoder_width = args.decoder_hidden_size if str(args.hybrid_decoder) == "rnmt" else args.decoder_embed_dim
        if kind == "transformer":
            encoder = FairseqTransformerEncoder(_transformer_cfg(args), src_dict,
                                                build_embedding(src_dict, args.encoder_embed_dim))
            encoder.output_dim = args.encoder_embed_dim
        elif kind == "rnmt":
            encoder = RNMTPlusEncoder(_rnmt_args(args), src_dict, build_embedding(src_dict, args.encoder_embed_dim),
                                      output_dim=decoder_width, num_layers=args.rnmt_encoder_layers)
        elif kind == "cascaded":
            encoder = CascadedEncoder(args, src_dict, build_embedding(src_dict, args.encoder_embed_dim))
        else:
            kinds = [k.strip() for k in args.hybrid_columns.split(",") if k.strip()]
            encoder = MultiColumnEncoder(args, src_dict, kinds, output_dim=decoder_width)
        cls.load_pretrained(args, encoder)

        dec_emb = build_embedding(tgt_dict, args.decoder_embed_dim)
        if str(args.hybrid_decoder) == "rnmt":
            decoder = RNMTPlusDecoder(_rnmt_args(args), tgt_dict, dec_emb, encoder_output_dim=encoder.output_dim)
        else:
            cfg = _transformer_cfg(args)
            if encoder.output_dim != cfg.decoder.embed_dim:
                raise ValueError(f"the encoder output ({encoder.output_dim}) must have --decoder-embed-dim ({cfg.decoder.embed_dim})")
            decoder = TransformerDecoderBase(cfg, tgt_dict, dec_emb)
        return cls(encoder, decoder)

    @staticmethod
    def load_pretrained(args, encoder):
        paths = [p.strip() for p in (args.hybrid_pretrained or "").split(",")]
        if not any(paths):
            return
        parts = encoder.pretrained_parts() if hasattr(encoder, "pretrained_parts") else [encoder]
        if len(paths) != len(parts):
            raise ValueError(f"--hybrid-pretrained has {len(paths)} entries for {len(parts)} pre-trainable encoder "
                             f"parts ({', '.join(type(p).__name__ for p in parts)}); use '' for a part to train from scratch")
        for path, part in zip(paths, parts):
            if not path:
                continue
            if args.hybrid_freeze_pretrained:  # also when only rebuilt for a checkpoint of this model
                for p in part.parameters():
                    p.requires_grad_(False)
            if not os.path.exists(path):  # as fairseq's --load-pretrained-encoder-from
                logger.warning("--hybrid-pretrained: %s does not exist, %s not loaded (expected when "
                               "the model itself is loaded from a checkpoint)", path, type(part).__name__)
                continue
            load_encoder_weights(part, path)
            logger.info("loaded %s from %s%s", type(part).__name__, path,
                        " (frozen)" if args.hybrid_freeze_pretrained else "")

    def max_positions(self):
        return (self.encoder.max_positions(), self.decoder.max_positions())


# ---------------------------------------------------------------------------------------------
# Named hybrids: defaults only; a preset's encoder/decoder kind is fixed.
# ---------------------------------------------------------------------------------------------


@register_model_architecture("rnmt_hybrid", "rnmt_hybrid")
def hybrid_base_architecture(args):
    fill_defaults(args, HybridConfig())
    set_default(args, "encoder_layers", 6)
    set_default(args, "decoder_layers", 8 if str(args.hybrid_decoder) == "rnmt" else 6)
    set_default(args, "attention_dropout", safe_getattr(args, "dropout", 0.3))
    fill_defaults(args, RNMTConfig())
    set_default(args, "decoder_hidden_size", safe_getattr(args, "decoder_embed_dim", 1024))
    set_default(args, "encoder_hidden_size", safe_getattr(args, "encoder_embed_dim", 1024))
    for name, value in PRENORM.items():
        set_default(args, name, value)
    set_default(args, "max_source_positions", 1024)
    set_default(args, "max_target_positions", 1024)
    fairseq_transformer_base(args)


def hybrid_big_architecture(args):
    """The Transformer parts of the named hybrids are Transformer Big as in Chen et al. App. A.2
    (model 1024, hidden 8192, 16 heads), pre-norm."""
    transformer_big(args, ffn_dim=8192)
    for name, value in PRENORM.items():
        set_default(args, name, value)
    hybrid_base_architecture(args)


def _hybrid(name: str, doc: str, encoder: str, decoder: str, defaults=None):
    """A named hybrid owns its encoder and decoder kinds."""
    return register_preset("rnmt_hybrid", name, doc, hybrid_big_architecture, defaults=defaults,
                           fixed={"hybrid_encoder": encoder, "hybrid_decoder": decoder})


hybrid_transformer_rnmt = _hybrid("hybrid_transformer_rnmt", "Table 5: Transformer Big encoder + RNMT+ decoder.",
                                  "transformer", "rnmt")
hybrid_rnmt_transformer = _hybrid("hybrid_rnmt_transformer", "Table 5: RNMT+ encoder + Transformer Big decoder.",
                                  "rnmt", "transformer")
hybrid_cascaded = _hybrid(
    "hybrid_cascaded", "Table 6: 6-layer RNMT+ encoder (pre-trained, frozen) + 4 Transformer layers, RNMT+ decoder.",
    "cascaded", "rnmt", defaults={"encoder_layers": 4, "no_token_positional_embeddings": True})
hybrid_multicolumn = _hybrid("hybrid_multicolumn",
                             "Table 6: RNMT+ column + Transformer Big column, concatenated, RNMT+ decoder.",
                             "multicolumn", "rnmt")
