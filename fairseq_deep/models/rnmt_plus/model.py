"""RNMT+ (Chen et al. 2018, "The Best of Both Worlds", Sec. 4.1, Fig. 1, App. A.3): a bidirectional
layer-normalized LSTM encoder and a unidirectional LSTM decoder with multi-head additive attention.
"""

from fairseq.dataclass.utils import gen_parser_from_dataclass
from fairseq.models import ARCH_CONFIG_REGISTRY, FairseqEncoderDecoderModel, register_model
from torch import nn

from ...errors import refuse_options
from ...modules.growth import declare_family
from ..reduction import declare_reduction, never
from .config import RNMTPlusConfig
from .decoder import RNMTPlusDecoder
from .encoder import RNMTPlusEncoder


def build_embedding(dictionary, dim: int) -> nn.Embedding:
    emb = nn.Embedding(len(dictionary), dim, padding_idx=dictionary.pad())
    nn.init.normal_(emb.weight, mean=0.0, std=dim**-0.5)
    nn.init.zeros_(emb.weight[dictionary.pad()])
    return emb


def shared_embeddings(args: RNMTPlusConfig, src_dict, tgt_dict):
    """(encoder embedding, decoder embedding) honouring --share-all-embeddings (which sets
    ``args.share_decoder_input_output_embed``)."""
    if args.share_all_embeddings:
        if src_dict != tgt_dict:
            raise ValueError(
                "--share-all-embeddings needs a joined dictionary (fairseq-preprocess --joined-dictionary)"
            )
        if args.encoder_embed_dim != args.decoder_embed_dim:
            raise ValueError(
                "--share-all-embeddings needs --encoder-embed-dim == --decoder-embed-dim"
            )
        emb = build_embedding(src_dict, args.encoder_embed_dim)
        args.share_decoder_input_output_embed = True
        return emb, emb
    return build_embedding(src_dict, args.encoder_embed_dim), build_embedding(
        tgt_dict, args.decoder_embed_dim
    )


@register_model("rnmt_plus")
class RNMTPlusModel(FairseqEncoderDecoderModel):
    @classmethod
    def add_args(cls, parser):
        gen_parser_from_dataclass(parser, RNMTPlusConfig(), delete_default=True, with_prefix="")

    @classmethod
    def build_model(cls, args, task):
        ARCH_CONFIG_REGISTRY["rnmt_plus"](args)  # the defaults of options added since a checkpoint
        refuse_options(args, "rnmt_plus")  # --checkpoint-activations, --encoder-layerdrop
        opts = RNMTPlusConfig.from_namespace(args)
        enc_emb, dec_emb = shared_embeddings(opts, task.source_dictionary, task.target_dictionary)
        encoder = RNMTPlusEncoder(
            opts, task.source_dictionary, enc_emb, output_dim=opts.decoder_hidden_size
        )
        decoder = RNMTPlusDecoder(
            opts, task.target_dictionary, dec_emb, encoder_output_dim=encoder.output_dim
        )
        return cls(encoder, decoder)

    def max_positions(self):
        return (self.encoder.max_positions(), self.decoder.max_positions())


def count_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())


__all__ = ["RNMTPlusModel", "build_embedding", "shared_embeddings", "count_parameters"]


declare_reduction("rnmt_plus", never("RNMT+ is a recurrent model (LSTM layers, Chen et al. 2018)"))
# fairseq-deep-grow: --encoder-layers and --decoder-layers (the stacks: encoder.py, decoder.py)
declare_family(RNMTPlusModel)
