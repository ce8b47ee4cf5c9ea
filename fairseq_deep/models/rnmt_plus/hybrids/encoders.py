"""Encoders of the hybrids that are neither RNMT+'s nor fairseq's own (Chen et al. 2018, Sec. 6):
the cascaded encoder (Fig. 2a, App. A.5) and the multi-column encoder (Fig. 2b, App. A.6), and the
loading of their pre-trained parts (``--hybrid-pretrained``)."""

import logging
from typing import List, Optional

import torch
from fairseq.models import FairseqEncoder
from fairseq.models.transformer import TransformerConfig
from fairseq.modules.transformer_layer import TransformerEncoderLayerBase
from torch import Tensor, nn

from ....checkpoints import load
from ....modules.common.better_transformer import without_better_transformer
from ....modules.common.reorder import reorder_encoder_out
from ....modules.schemes.residual_schemes import apply_schemes
from ...transformer_stack import FairseqTransformerEncoder, wrap_layer
from ..encoder import RNMTPlusEncoder
from ..model import build_embedding
from .config import COLUMN_KINDS, rnmt_options, transformer_cfg

logger = logging.getLogger(__name__)


class TransformerLayers(nn.Module):
    """fairseq Transformer encoder layers over a given T x B x C input (no embedding, no positions),
    with the final layer norm of a pre-norm stack (cascaded encoder, App. A.5), under the
    initialisation scheme of ``cfg`` (``--ds-init``)."""

    def __init__(self, cfg: TransformerConfig, num_layers: int):
        super().__init__()
        self.layers = nn.ModuleList(
            wrap_layer(
                apply_schemes(
                    without_better_transformer(TransformerEncoderLayerBase(cfg)),
                    cfg,
                    "encoder",
                    i,
                    num_layers,
                ),
                cfg,
            )
            for i in range(num_layers)
        )
        dim = cfg.encoder.embed_dim
        self.layer_norm = nn.LayerNorm(dim) if cfg.encoder.normalize_before else None

    def forward(
        self, x: Tensor, padding_mask: Optional[Tensor], states: Optional[List[Tensor]] = None
    ):
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
        cfg, rnmt = transformer_cfg(args), rnmt_options(args)
        dim = cfg.encoder.embed_dim
        self.rnmt = RNMTPlusEncoder(
            rnmt, dictionary, embed_tokens, output_dim=dim, num_layers=rnmt.rnmt_encoder_layers
        )
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
        cfg, rnmt = transformer_cfg(args), rnmt_options(args)
        columns = []
        for kind in kinds:
            if kind == "rnmt":
                emb = build_embedding(dictionary, cfg.encoder.embed_dim)
                columns.append(
                    RNMTPlusEncoder(
                        rnmt,
                        dictionary,
                        emb,
                        output_dim=output_dim,
                        num_layers=rnmt.rnmt_encoder_layers,
                    )
                )
            elif kind == "transformer":
                emb = build_embedding(dictionary, cfg.encoder.embed_dim)
                columns.append(FairseqTransformerEncoder(cfg, dictionary, emb))
            else:
                raise ValueError(
                    f"--hybrid-columns: unknown column {kind!r}; use a comma-separated list of {COLUMN_KINDS}"
                )
        self.columns = nn.ModuleList(columns)
        dims = [
            c.output_dim if isinstance(c, RNMTPlusEncoder) else cfg.encoder.embed_dim
            for c in columns
        ]
        self.column_norms = nn.ModuleList(nn.LayerNorm(d) for d in dims)
        self.merge = nn.Linear(sum(dims), output_dim)
        self.merge_norm = nn.LayerNorm(output_dim)
        self.output_dim = output_dim

    def forward(self, src_tokens, src_lengths=None, return_all_hiddens: bool = False):
        outs = [
            c(src_tokens, src_lengths, return_all_hiddens=return_all_hiddens) for c in self.columns
        ]
        merged = torch.cat(
            [norm(o["encoder_out"][0]) for norm, o in zip(self.column_norms, outs)], dim=-1
        )
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
    state = load(path, "--hybrid-pretrained")["model"]
    sub = {k[len("encoder.") :]: v for k, v in state.items() if k.startswith("encoder.")}
    missing, unexpected = module.load_state_dict(sub, strict=False)
    if missing:
        raise ValueError(
            f"--hybrid-pretrained {path}: its encoder does not fit this part ({type(module).__name__}): "
            f"missing {missing[:5]}{'...' if len(missing) > 5 else ''}. Check --rnmt-encoder-layers, "
            f"--encoder-hidden-size and the dimensions against the pre-trained model"
        )
    if unexpected:
        logger.info(
            "--hybrid-pretrained %s: ignored %d encoder entries (e.g. %s)",
            path,
            len(unexpected),
            unexpected[0],
        )
