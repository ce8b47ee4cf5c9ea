"""Issue 15 (items 10-11): presets for Wang et al. (2019) Table 1's post-norm Transformer-Big and
Table 6's "+ big encoder", and Bapna et al.'s (2018) Transformer-Big rows (Chen et al.'s Big) and
pre-norm transparent attention at depth."""

import pytest
import torch
from fairseq import options, tasks
from fairseq.data import Dictionary
from helpers import parse_model_args


def _non_embedding_millions(arch, extra=()):
    args = options.parse_args_and_arch(
        options.get_training_parser(),
        ["x", "--task", "translation", "--arch", arch, "--cpu", *extra],
    )
    d = Dictionary()
    with torch.device("meta"):
        model = tasks.translation.TranslationTask(args, d, d).build_model(args)
    total = sum(
        p.numel()
        for n, p in model.named_parameters()
        if "embed_tokens" not in n and "output_projection" not in n
    )
    return args, total / 1e6


def test_wang_postnorm_big():
    """Table 1 post-norm 'Transformer (Big)' (211M with a ~34k shared vocabulary)."""
    args, millions = _non_embedding_millions("transformer_postnorm_big")
    assert (
        args.encoder_embed_dim,
        args.encoder_ffn_embed_dim,
        args.encoder_attention_heads,
        args.dropout,
    ) == (1024, 4096, 16, 0.3)
    assert not args.encoder_normalize_before and not args.decoder_normalize_before
    assert args.dlcl_stacks == "none"
    assert round(millions, 2) == 176.36  # + 1024 x V shared embedding: 210M at V = 33k


def test_wang_table6_big_encoder():
    args, millions = _non_embedding_millions("transformer_prenorm_big_encoder")
    assert (args.encoder_embed_dim, args.encoder_ffn_embed_dim, args.encoder_attention_heads) == (
        1024,
        4096,
        16,
    )
    assert (args.decoder_embed_dim, args.decoder_ffn_embed_dim, args.decoder_attention_heads) == (
        512,
        2048,
        8,
    )
    assert (
        args.encoder_normalize_before
        and args.decoder_normalize_before
        and args.dlcl_stacks == "none"
    )
    base = _non_embedding_millions("transformer_prenorm")[1]
    assert millions > base


@pytest.mark.parametrize(
    "arch,ta", [("transformer_ta_big", True), ("transformer_ta_baseline_big", False)]
)
def test_chen_big_for_transparent_attention(arch, ta):
    """Chen et al. App. A.2 Transformer Big: 1024/8192/16 heads, residual and input dropout 0.3
    only, pre-norm; Chen Table 3: 375.4M, i.e. 277.07M + three 32k x 1024 embeddings."""
    args, millions = _non_embedding_millions(arch)
    assert (
        args.encoder_embed_dim,
        args.encoder_ffn_embed_dim,
        args.encoder_attention_heads,
        args.decoder_embed_dim,
        args.decoder_ffn_embed_dim,
        args.decoder_attention_heads,
    ) == (1024, 8192, 16, 1024, 8192, 16)
    assert (args.dropout, args.attention_dropout, args.activation_dropout) == (0.3, 0.0, 0.0)
    assert args.encoder_normalize_before and args.decoder_normalize_before
    assert bool(args.ta_disable) is not ta
    assert abs(millions - (375.4 - 3 * 32000 * 1024 / 1e6)) < 0.1 + (0.1 if ta else 0)


@pytest.mark.parametrize("depth", [12, 16, 20])
def test_prenorm_ta_depth_presets(depth):
    args = parse_model_args(f"transformer_ta_prenorm_{depth}l")
    assert (args.encoder_layers, args.decoder_layers) == (depth, 6)
    assert args.encoder_normalize_before and args.decoder_normalize_before and not args.ta_disable
    with pytest.raises(ValueError, match="encoder layers"):
        parse_model_args(f"transformer_ta_prenorm_{depth}l", ["--encoder-layers", "3"])
