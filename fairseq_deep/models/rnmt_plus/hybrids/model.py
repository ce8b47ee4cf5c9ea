"""The ``rnmt_hybrid`` model: an encoder and a decoder of RNMT+ and the Transformer (Chen et al.
2018, Sec. 6), chosen by ``--hybrid-encoder`` / ``--hybrid-decoder``."""

import logging
import os

from fairseq.dataclass.utils import gen_parser_from_dataclass
from fairseq.models import ARCH_CONFIG_REGISTRY, FairseqEncoderDecoderModel, register_model
from fairseq.models.transformer import TransformerModel

from ....modules.common.growth import GrowError
from ....modules.histories.transparent_attention import TRANSPARENT_WEIGHTS
from ....modules.schemes.residual_schemes import ResidualSchemesConfig, scheme_names
from ...families import (
    TINY_TRANSFORMER,
    Family,
    PaperScale,
    Tiny,
    declare,
    hidden_sizes,
    transformer_sizes,
)
from ...reduction import never
from ...transformer_stack import FairseqTransformerDecoder, FairseqTransformerEncoder
from ..decoder import RNMTPlusDecoder
from ..encoder import RNMTPlusEncoder
from ..model import build_embedding
from .config import RNMTHybridConfig, check_hybrid_schemes, rnmt_options, transformer_cfg
from .encoders import CascadedEncoder, MultiColumnEncoder, load_encoder_weights

logger = logging.getLogger(__name__)


@register_model("rnmt_hybrid")
class RNMTHybridModel(FairseqEncoderDecoderModel):
    @classmethod
    def add_args(cls, parser):
        TransformerModel.add_args(parser)
        gen_parser_from_dataclass(parser, RNMTHybridConfig(), delete_default=True, with_prefix="")
        gen_parser_from_dataclass(
            parser, ResidualSchemesConfig(), delete_default=True, with_prefix=""
        )

    @classmethod
    def build_model(cls, args, task):
        ARCH_CONFIG_REGISTRY["rnmt_hybrid"](
            args
        )  # the defaults of options added since a checkpoint
        check_hybrid_schemes(args)
        if scheme_names(args):
            logger.info(
                f"initialisation scheme of the Transformer parts: {scheme_names(args)} "
                "(modules/schemes/residual_schemes.py)"
            )
        opts, cfg = RNMTHybridConfig.from_namespace(args), transformer_cfg(args)
        src_dict, tgt_dict = task.source_dictionary, task.target_dictionary
        kind, rnmt_decoder = str(opts.hybrid_encoder), str(opts.hybrid_decoder) == "rnmt"
        decoder_width = opts.decoder_hidden_size if rnmt_decoder else cfg.decoder.embed_dim
        if kind == "transformer":
            encoder = FairseqTransformerEncoder(
                cfg, src_dict, build_embedding(src_dict, cfg.encoder.embed_dim)
            )
            encoder.output_dim = cfg.encoder.embed_dim
        elif kind == "rnmt":
            encoder = RNMTPlusEncoder(
                rnmt_options(args),
                src_dict,
                build_embedding(src_dict, cfg.encoder.embed_dim),
                output_dim=decoder_width,
                num_layers=opts.rnmt_encoder_layers,
            )
        elif kind == "cascaded":
            encoder = CascadedEncoder(
                args, src_dict, build_embedding(src_dict, cfg.encoder.embed_dim)
            )
        else:  # each column has its own embedding
            kinds = [k.strip() for k in opts.hybrid_columns.split(",") if k.strip()]
            encoder = MultiColumnEncoder(args, src_dict, kinds, output_dim=decoder_width)
        cls.load_pretrained(opts, encoder)

        dec_emb = build_embedding(tgt_dict, cfg.decoder.embed_dim)
        if rnmt_decoder:
            decoder = RNMTPlusDecoder(
                rnmt_options(args), tgt_dict, dec_emb, encoder_output_dim=encoder.output_dim
            )
        else:
            if encoder.output_dim != cfg.decoder.embed_dim:
                raise ValueError(
                    f"the encoder output ({encoder.output_dim}) must have --decoder-embed-dim ({cfg.decoder.embed_dim})"
                )
            decoder = FairseqTransformerDecoder(cfg, tgt_dict, dec_emb)
        return cls(encoder, decoder)

    @staticmethod
    def load_pretrained(args, encoder):
        paths = [p.strip() for p in (args.hybrid_pretrained or "").split(",")]
        if not any(paths):
            return
        parts = encoder.pretrained_parts() if hasattr(encoder, "pretrained_parts") else [encoder]
        if len(paths) != len(parts):
            raise ValueError(
                f"--hybrid-pretrained has {len(paths)} entries for {len(parts)} pre-trainable encoder "
                f"parts ({', '.join(type(p).__name__ for p in parts)}); use '' for a part to train from scratch"
            )
        for path, part in zip(paths, parts):
            if not path:
                continue
            if (
                args.hybrid_freeze_pretrained
            ):  # also when only rebuilt for a checkpoint of this model
                for p in part.parameters():
                    p.requires_grad_(False)
            if not os.path.exists(path):  # as fairseq's --load-pretrained-encoder-from
                logger.warning(
                    "--hybrid-pretrained: %s does not exist, %s not loaded (expected when "
                    "the model itself is loaded from a checkpoint)",
                    path,
                    type(part).__name__,
                )
                continue
            load_encoder_weights(part, path)
            logger.info(
                "loaded %s from %s%s",
                type(part).__name__,
                path,
                " (frozen)" if args.hybrid_freeze_pretrained else "",
            )

    def max_positions(self):
        return (self.encoder.max_positions(), self.decoder.max_positions())


def _depth_options(args):
    """fairseq-deep-grow: the depth of the encoder is --encoder-layers (a Transformer encoder) or
    --rnmt-encoder-layers (an RNMT+ one); the encoders of two stacks are refused."""
    kind = str(RNMTHybridConfig.from_namespace(args).hybrid_encoder)
    if kind == "rnmt":
        return "rnmt_encoder_layers", "decoder_layers"
    if kind != "transformer":
        raise GrowError(
            f"--hybrid-encoder {kind}: fairseq-deep-grow does not grow a {kind} encoder (it has "
            "two encoder stacks); grow the decoder only (--encoder-layers unchanged) or train it "
            "from scratch"
        )
    return "encoder_layers", "decoder_layers"


#: the tiny sizes of the hybrids: the Transformer's, and LSTM cells of 8 (encoder) and 16 (decoder)
TINY_HYBRID = (
    *TINY_TRANSFORMER[:12],
    "--encoder-hidden-size",
    "8",
    "--decoder-hidden-size",
    "16",
    "--encoder-layers",
    "2",
    "--decoder-layers",
    "2",
    "--rnmt-encoder-layers",
    "2",
)


def _tiny(name: str, params: float, transformer: int, recurrent: int, samples=()) -> Tiny:
    """A named hybrid's tiny configuration (its paper-scale memory: parameters in millions,
    Transformer and recurrent width x layers)."""
    return Tiny(name, name, PaperScale(name, (params, transformer, recurrent)), samples=samples)


declare(
    Family(
        name="rnmt_hybrid",
        model=RNMTHybridModel,
        transformer_layers=True,
        sizes=lambda width: transformer_sizes(width) + hidden_sizes(width),
        reduction=never(
            "the hybrids combine RNMT+ LSTM stacks with Transformer stacks (Chen et al. 2018)"
        ),
        depth_options=_depth_options,
        layer_weights=(TRANSPARENT_WEIGHTS,),  # an RNMT+ encoder's --rnmt-transparent
        study=("chen",),
        tiny_sizes=TINY_HYBRID,
        tiny=(
            _tiny("hybrid_transformer_rnmt", 262.6, 6 * 1024, 8 * 1024),
            _tiny("hybrid_rnmt_transformer", 320.5, 6 * 1024, 12 * 1024),
            _tiny("hybrid_cascaded", 365.4, 4 * 1024, 20 * 1024, samples=("bf16",)),
            _tiny("hybrid_multicolumn", 417.7, 6 * 1024, 20 * 1024),
        ),
    )
)
