"""RNMT+ (Chen et al. 2018, "The Best of Both Worlds", Sec. 4.1, Fig. 1, App. A.3): a bidirectional
layer-normalized LSTM encoder and a unidirectional LSTM decoder with multi-head additive attention.
"""

from fairseq.dataclass.utils import gen_parser_from_dataclass
from fairseq.models import ARCH_CONFIG_REGISTRY, FairseqEncoderDecoderModel, register_model
from torch import nn

from ...errors import refuse_options
from ...modules.histories.layer_history import DLCL_WEIGHTS
from ...modules.histories.transparent_attention import TRANSPARENT_WEIGHTS
from ..families import Family, PaperScale, Recipe, Tiny, declare, embedding_sizes, hidden_sizes
from ..reduction import never
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


#: n of Chen et al.'s Eq. 1: RNMT+ was trained on 32 GPUs (Sec. 4), n = 32 replicas
RNMT_REPLICAS = 32
#: Chen et al.'s RNMT+ peak learning rate over their Transformer-Base peak (issue 25): Eq. 1 peaks at
#: n * 1e-4 = 3.2e-3, Eq. 2 (r_0 = 2, p = 8000, d = 512, App. A.1) at 2 / sqrt(512 * 8000) = 9.9e-4.
#: The study's --lr is the Transformers' peak, so RNMT+ peaks at 3.2 x --lr (Eq. 1's base 1e-4 at the
#: default --lr 1e-3); before issue 25 it peaked at --lr, a third of what its paper gives it.
RNMT_LR_RATIO = 3.2


def paper_recipe(lr: float, warmup: int):
    """Chen et al. Sec. 4.1 at the study's ``lr`` and ``warmup``: Adam (0.9, 0.999, eps 1e-6) and
    Eq. 1 (``--lr-scheduler rnmt_plus``) with n = RNMT_REPLICAS: from peak / n up to the peak,
    RNMT_LR_RATIO x ``lr``, linearly over ``warmup`` updates (n p, p = warmup / n), then constant
    until the decay.  (optimiser settings, schedule settings)."""
    peak = RNMT_LR_RATIO * lr
    optimizer = {
        "optimizer": "adam",
        "adam_betas": "(0.9, 0.999)",
        "adam_eps": "1e-6",
        "lr": f"{peak:.6g}",
    }
    schedule = {
        "lr_scheduler": "rnmt_plus",
        "rnmt_replicas": RNMT_REPLICAS,
        "rnmt_base_lr": f"{peak / RNMT_REPLICAS:.6g}",
        "warmup_updates": max(1, round(warmup / RNMT_REPLICAS)),
    }
    return optimizer, schedule


#: the tiny sizes of RNMT+
TINY_RNMT = (
    "--encoder-embed-dim",
    "16",
    "--decoder-embed-dim",
    "16",
    "--encoder-hidden-size",
    "16",
    "--decoder-hidden-size",
    "32",
    "--encoder-layers",
    "2",
    "--decoder-layers",
    "2",
)

declare(
    Family(
        name="rnmt_plus",
        model=RNMTPlusModel,
        # embeddings and LSTM cells W (per direction in the encoder)
        sizes=lambda width: embedding_sizes(width) + hidden_sizes(width),
        reduction=never("RNMT+ is a recurrent model (LSTM layers, Chen et al. 2018)"),
        stands_for={"lstm": "rnmt_plus"},  # an LSTM family
        # fairseq-deep-grow: --encoder-layers and --decoder-layers (the stacks: encoder.py, decoder.py)
        grows=True,
        layer_weights=(DLCL_WEIGHTS, TRANSPARENT_WEIGHTS),  # --dlcl-stacks, --rnmt-transparent
        # Chen et al. Sec. 4.1 (paper_recipe, with RNMT_REPLICAS and RNMT_LR_RATIO)
        recipe=Recipe(
            "rnmt_plus",
            paper_recipe,
            lambda lr: (
                f"Adam (0.9, 0.999, 1e-6), Eq. 1 (n = {RNMT_REPLICAS}) to lr "
                f"{RNMT_LR_RATIO * lr:.6g}"
            ),
        ),
        study=("chen",),
        tiny_sizes=TINY_RNMT,
        tiny=(
            Tiny(
                "rnmt_plus+clip+sent_ce",
                "rnmt_plus",
                PaperScale("rnmt_plus_512", (78.6, 0, 20 * 512)),
                training={
                    "task": "translation_deep",
                    "adaptive_clip": True,
                    "adaptive_clip_warmup": 20,
                    "criterion": "sentence_cross_entropy",
                },
                samples=("bf16",),
            ),
            Tiny(
                "rnmt_plus_ta",
                "rnmt_plus",
                PaperScale("rnmt_plus_512_ta", (78.6, 0, 20 * 512)),
                model=("--rnmt-transparent",),
            ),
            Tiny(
                "rnmt_plus_dlcl",
                "rnmt_plus",
                PaperScale("rnmt_plus_512", (78.6, 0, 20 * 512)),
                model=("--dlcl-stacks", "both"),
            ),
        ),
    )
)
