"""Issue 15 (audit of Chen et al. 2018, App. A.4-A.6): each component of a hybrid has its own
dropout (--hybrid-transformer-dropout, --hybrid-rnmt-dropout; default --dropout)."""

import pytest
import torch
from fairseq import options, tasks
from fairseq.modules import FairseqDropout
from helpers import random_batch, tiny_dictionary

from fairseq_deep.models.rnmt_plus.decoder import RNMTPlusDecoder
from fairseq_deep.models.rnmt_plus.encoder import RNMTPlusEncoder

TINY = [
    "--encoder-embed-dim",
    "16",
    "--decoder-embed-dim",
    "16",
    "--encoder-ffn-embed-dim",
    "32",
    "--decoder-ffn-embed-dim",
    "32",
    "--encoder-attention-heads",
    "2",
    "--decoder-attention-heads",
    "2",
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
    "--attention-dropout",
    "0",
    "--activation-dropout",
    "0",
]
HYBRIDS = [
    "hybrid_transformer_rnmt",
    "hybrid_rnmt_transformer",
    "hybrid_cascaded",
    "hybrid_multicolumn",
]


def build(arch, extra=()):
    args = options.parse_args_and_arch(
        options.get_training_parser(),
        ["dummy", "--task", "translation", "--arch", arch, "--cpu", *TINY, *extra],
    )
    d = tiny_dictionary()
    torch.manual_seed(0)
    return tasks.translation.TranslationTask(args, d, d).build_model(args), d, args


def _rates(model):
    """(Transformer parts' dropout rates, RNMT+ parts' dropout rates)."""
    rnmt = [m for m in model.modules() if isinstance(m, (RNMTPlusEncoder, RNMTPlusDecoder))]
    inside_rnmt = {id(x) for r in rnmt for x in r.modules()}
    trans = {
        m.dropout_module.p
        for m in model.modules()
        if id(m) not in inside_rnmt
        and "Transformer" in type(m).__name__
        and isinstance(getattr(m, "dropout_module", None), FairseqDropout)
    }
    return trans, {r.dropout for r in rnmt}


@pytest.mark.parametrize("arch", HYBRIDS)
def test_component_dropouts(arch):
    model, _, _ = build(arch, ["--dropout", "0.3"])
    assert _rates(model) == ({0.3}, {0.3})  # default: --dropout for both
    model, _, args = build(
        arch,
        ["--dropout", "0.3", "--hybrid-transformer-dropout", "0.1", "--hybrid-rnmt-dropout", "0.2"],
    )
    assert _rates(model) == ({0.1}, {0.2})
    assert args.dropout == 0.3  # the namespace (saved in checkpoints) is left as it was


@pytest.mark.parametrize("arch", HYBRIDS)
def test_zero_component_dropouts_make_training_deterministic(arch):
    """--dropout 0.5 with both component rates 0: a training-mode pass equals the eval pass."""
    model, d, _ = build(
        arch,
        ["--dropout", "0.5", "--hybrid-transformer-dropout", "0", "--hybrid-rnmt-dropout", "0"],
    )
    src, lengths, prev = random_batch(d)
    with torch.no_grad():
        train = model.train()(src, lengths, prev)[0]
        evaluation = model.eval()(src, lengths, prev)[0]
    torch.testing.assert_close(train, evaluation, rtol=0, atol=0)
    noisy, d, _ = build(arch, ["--dropout", "0.5"])
    with torch.no_grad():
        assert not torch.equal(
            noisy.train()(src, lengths, prev)[0], noisy.eval()(src, lengths, prev)[0]
        )


@pytest.mark.parametrize("arch", ["hybrid_transformer_rnmt", "hybrid_multicolumn"])
def test_rnmt_attention_dropout(arch):
    model, _, _ = build(arch, ["--attention-dropout", "0.1"])
    assert model.decoder.attention.dropout == 0.1  # default: --attention-dropout
    model, _, _ = build(
        arch, ["--attention-dropout", "0.1", "--hybrid-rnmt-attention-dropout", "0.2"]
    )
    assert model.decoder.attention.dropout == 0.2
    assert {
        m.self_attn.dropout_module.p for m in model.encoder.modules() if hasattr(m, "self_attn")
    } == {0.1}
