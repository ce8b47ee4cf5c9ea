"""Deep-Att and Deep-ED (Zhou, Cao, Wang, Li, Xu, TACL 2016): deep LSTM encoder-decoders with
fast-forward connections and an interleaved bi-directional encoder.  One model, ``deep_att``;
``--ff-interface att|ed`` chooses Deep-Att or Deep-ED (Eq. 7, 8)."""

import torch
from fairseq.dataclass.utils import gen_parser_from_dataclass
from fairseq.models import ARCH_CONFIG_REGISTRY, FairseqEncoderDecoderModel, register_model
from torch import nn

from ...errors import UserError, refuse_options
from ...modules.recurrent.fast_forward_lstm import RECURRENT, mark
from ..families import Family, PaperScale, Tiny, declare, embedding_sizes, hidden_sizes
from ..reduction import never
from .config import DeepAttConfig
from .decoder import DeepAttDecoder
from .encoder import DeepAttEncoder

EMBEDDING = "embedding"


@register_model("deep_att")
class DeepAttModel(FairseqEncoderDecoderModel):
    """Encoder (P-E), interface (P-I) and decoder (P-D) of Zhou et al. (2016), Fig. 2."""

    @classmethod
    def add_args(cls, parser):
        gen_parser_from_dataclass(parser, DeepAttConfig(), delete_default=True, with_prefix="")
        # fairseq's Transformer options that a user tries here: known, so that they are refused with a reason
        parser.add_argument(
            "--checkpoint-activations",
            action="store_true",
            help="not supported by Deep-Att (refused): lower --max-tokens, raise --update-freq",
        )
        parser.add_argument(
            "--encoder-layerdrop",
            type=float,
            metavar="D",
            help="not supported by Deep-Att (refused)",
        )

    @classmethod
    def build_model(cls, args, task):
        ARCH_CONFIG_REGISTRY["deep_att"](args)  # the defaults of options added since a checkpoint
        refuse_options(args, "deep_att")  # --checkpoint-activations, --encoder-layerdrop
        if getattr(args, "ddp_backend", None) == "fully_sharded" and getattr(args, "fp16", False):
            raise UserError(
                f"--ddp-backend fully_sharded with --fp16 is not supported by --arch {args.arch}: FSDP "
                "computes on a float16 copy of every parameter, and Deep-Att's F-F gradients overflow "
                "float16 (its parameters stay float32 under --fp16, docs/precision.md). Use "
                "--ddp-backend c10d with --fp16 or --amp, or fully sharded with --bf16 or in float32"
            )
        opts = DeepAttConfig.from_namespace(args)
        enc_embed = build_embedding(task.source_dictionary, opts.encoder_embed_dim)
        dec_embed = build_embedding(task.target_dictionary, opts.decoder_embed_dim)
        encoder = DeepAttEncoder(opts, task.source_dictionary, enc_embed)
        decoder = DeepAttDecoder(opts, task.target_dictionary, dec_embed, encoder.output_dim)
        model = cls(encoder, decoder)
        if opts.ff_init_std > 0:
            paper_init_(model, opts.ff_init_std)
        return model


def build_embedding(dictionary, dim: int) -> nn.Embedding:
    emb = nn.Embedding(len(dictionary), dim, padding_idx=dictionary.pad())
    mark(emb.weight, EMBEDDING)
    return emb


@torch.no_grad()
def paper_init_(model: nn.Module, std: float):
    """Sec. 4.3: recurrent parameters (W_r, theta) zero, everything else N(0, std^2)."""
    for module in model.modules():
        for p in module.parameters(recurse=False):
            if getattr(p, "param_group", None) == RECURRENT:
                p.zero_()
            else:
                p.normal_(0.0, std)
        if isinstance(module, nn.Embedding) and module.padding_idx is not None:
            module.weight[module.padding_idx].zero_()


#: the tiny sizes of Deep-Att
TINY_DEEP_ATT = (
    "--encoder-embed-dim",
    "16",
    "--decoder-embed-dim",
    "16",
    "--encoder-hidden-size",
    "16",
    "--decoder-hidden-size",
    "16",
    "--encoder-layers",
    "2",
    "--decoder-layers",
    "2",
)

declare(
    Family(
        name="deep_att",
        model=DeepAttModel,
        # embeddings W/2 and cells W (the paper's 256/512)
        sizes=lambda width: embedding_sizes(max(1, width // 2)) + hidden_sizes(width),
        reduction=never(
            "Deep-Att is a recurrent model with fast-forward connections (Zhou et al. 2016)"
        ),
        stands_for={"lstm": "deep_att"},  # an LSTM family
        # fairseq-deep-grow: --encoder-layers (every column) and --decoder-layers
        grows=True,
        study=("zhou",),
        tiny_sizes=TINY_DEEP_ATT,
        tiny=(
            Tiny(
                "deep_att_ff+deep_att_optim",
                "deep_att_ff",
                PaperScale("deep_att_ff_5x3", (65.0, 0, 13 * 512)),
                training={"optimizer": "deep_att", "deep_att_lr_recurrent": "5e-4"},
                samples=("bf16",),
            ),
            Tiny("deep_ed_ff", "deep_ed_ff", PaperScale("deep_ed_ff", (115.8, 0, 25 * 512))),
        ),
    )
)
