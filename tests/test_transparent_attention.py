"""Transparent attention (Bapna et al. 2018): the readout, transformer_ta and its presets."""

import argparse

import pytest
import torch
from fairseq.models import ARCH_CONFIG_REGISTRY
from fairseq.sequence_generator import SequenceGenerator
from helpers import build_model, parse_model_args, random_batch
from torch import nn

from fairseq_deep.models.transformer_ta import MEMORY_KEY, NoResidualEncoderLayer
from fairseq_deep.modules.histories.transparent_attention import TransparentReadout

SMALL = ["--encoder-layers", "3", "--decoder-layers", "2"]
PRENORM = ["--encoder-normalize-before", "--decoder-normalize-before"]


def _random_weights(model, seed=3):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        w = model.encoder.transparent_attention.weight
        w.copy_(torch.randn(w.shape, generator=g))


# --- the module ----------------------------------------------------------------------------------


def test_readout_is_eq_1_2():
    torch.manual_seed(0)
    readout = TransparentReadout(4, 3, dropout=0.5).eval()
    with torch.no_grad():
        readout.weight.normal_()
    entries = [torch.randn(5, 2, 8) for _ in range(4)]
    s = torch.softmax(readout.weight, dim=0)  # Eq. 1: softmax over the N+1 entries, per module j
    out = readout(entries)
    assert len(out) == 3
    for j in range(3):
        expected = sum(s[i, j] * entries[i] for i in range(4))  # Eq. 2
        torch.testing.assert_close(out[j], expected)
    torch.testing.assert_close(readout.weights(), s)


def test_readout_dropout_acts_on_weights_in_training_only():
    torch.manual_seed(0)
    readout = TransparentReadout(6, 1, dropout=0.5)
    entries = [torch.full((1, 1, 1), float(i)) for i in range(6)]
    readout.eval()
    assert all(torch.equal(readout(entries)[0], readout(entries)[0]) for _ in range(3))
    readout.train()
    values = {readout(entries)[0].item() for _ in range(20)}
    assert (
        len(values) > 1
    )  # W is dropped out (W = 0 at init: dropout acts through the 1/(N+1) offset)
    nodrop = TransparentReadout(6, 1, dropout=0.0).train()
    assert nodrop(entries)[0].item() == pytest.approx(2.5)  # uniform start: mean of the entries


def test_readout_with_projection_serves_rnmt():
    """M = 1 and a projection after the combination (RNMT+, Sec. 2.4)."""
    torch.manual_seed(0)
    proj = nn.Linear(8, 4)
    readout = TransparentReadout(3, 1, out_proj=proj).eval()
    entries = [torch.randn(5, 2, 8) for _ in range(3)]
    (z,) = readout(entries)
    torch.testing.assert_close(z, proj(sum(e / 3 for e in entries)))
    assert readout.state_dict()["weight"].shape == (3, 1)


def test_readout_errors_name_the_option():
    with pytest.raises(ValueError, match="--ta-init"):
        TransparentReadout(3, 2, init="bottom")
    with pytest.raises(ValueError, match="--ta-dropout"):
        TransparentReadout(3, 2, dropout=1.0)
    with pytest.raises(ValueError, match="4 entries"):
        TransparentReadout(4, 2)([torch.zeros(1)] * 3)


# --- the model -----------------------------------------------------------------------------------


@pytest.mark.parametrize("norm", [[], PRENORM], ids=["postnorm", "prenorm"])
def test_all_mass_on_top_layer_is_the_plain_transformer(norm):
    """W with all softmax mass on h^N and dropout off: transformer_ta == fairseq's transformer."""
    ta, task = build_model("transformer_ta", [*SMALL, "--ta-dropout", "0", *norm])
    plain, _ = build_model("transformer", [*SMALL, *norm], seed=2)
    with torch.no_grad():
        w = ta.encoder.transparent_attention.weight
        w.fill_(float("-inf"))
        w[-1] = 0.0
    state = {k: v for k, v in ta.state_dict().items() if "transparent_attention" not in k}
    plain.load_state_dict(state, strict=True)  # the same parameters, under the same names
    src, lengths, prev = random_batch(task.source_dictionary)
    torch.testing.assert_close(
        ta(src, lengths, prev)[0], plain(src, lengths, prev)[0], rtol=0, atol=1e-6
    )
    # and the weights matter: a uniform readout gives another model
    with torch.no_grad():
        ta.encoder.transparent_attention.weight.zero_()
    assert not torch.allclose(ta(src, lengths, prev)[0], plain(src, lengths, prev)[0], atol=1e-4)


def test_weight_key_shape_and_exporter_contract():
    ta, _ = build_model("transformer_ta", ["--encoder-layers", "4", "--decoder-layers", "3"])
    state = ta.state_dict()
    assert state["encoder.transparent_attention.weight"].shape == (5, 3)  # (N+1) x M
    from fairseq_deep.diagnostics.layer_weights import extract_layer_weights

    records = extract_layer_weights(state)
    assert any("transparent_attention" in str(r.get("key", r.get("name", ""))) for r in records)


def test_decoder_layer_j_reads_memory_j():
    ta, task = build_model("transformer_ta", SMALL)
    _random_weights(ta)
    src, lengths, prev = random_batch(task.source_dictionary)
    enc = ta.encoder(src, src_lengths=lengths)  # return_all_hiddens=False, as in beam search
    assert enc["encoder_states"] == [] and len(enc[MEMORY_KEY]) == 2
    seen = []
    for layer in ta.decoder.layers:
        layer.encoder_attn.register_forward_hook(
            lambda m, args, kw, out: seen.append(kw["key"]), with_kwargs=True
        )
    ta.decoder(prev, encoder_out=enc)
    assert all(torch.equal(k, m) for k, m in zip(seen, enc[MEMORY_KEY]))
    assert not torch.equal(enc[MEMORY_KEY][0], enc[MEMORY_KEY][1])


@pytest.mark.parametrize("norm", [[], PRENORM], ids=["postnorm", "prenorm"])
def test_incremental_equals_full_with_beam_reorder(norm):
    """Step-by-step decoding with beam-search reorders (within each sentence's beams, then a
    shrinking batch as sentences finish) equals the full forward pass on the final hypotheses."""
    ta, task = build_model("transformer_ta", [*SMALL, *norm])
    _random_weights(ta)
    src, lengths, prev = random_batch(task.source_dictionary, bsz=2, tgt_len=6)
    beams = torch.tensor([0, 0, 1, 1])  # 2 sentences x beam 2
    src, lengths = src[beams], lengths[beams]
    prev = random_batch(task.source_dictionary, bsz=4, tgt_len=6, seed=5)[2]
    reorders = {2: torch.tensor([1, 1, 3, 2]), 4: torch.tensor([2, 3])}
    with torch.no_grad():
        enc = ta.encoder(src, src_lengths=lengths)
        state, steps, rows = {}, [], torch.arange(4)
        for t in range(prev.size(1)):
            if t in reorders:
                order = reorders[t]
                enc = ta.encoder.reorder_encoder_out(enc, order)
                ta.decoder.reorder_incremental_state_scripting(state, order)
                prev, steps, rows = prev[order], [s[order] for s in steps], rows[order]
            steps.append(ta.decoder(prev[:, : t + 1], encoder_out=enc, incremental_state=state)[0])
        full = ta.decoder(prev, encoder_out=ta.encoder(src[rows], src_lengths=lengths[rows]))[0]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=1e-5)


def test_readout_computed_once_per_sentence_in_beam_search():
    ta, task = build_model("transformer_ta", SMALL)
    _random_weights(ta)
    calls = []
    ta.encoder.transparent_attention.register_forward_hook(lambda *a: calls.append(1))
    decoder_calls = []
    ta.decoder.layers[0].register_forward_hook(lambda *a: decoder_calls.append(1))
    src, lengths, _ = random_batch(task.source_dictionary, bsz=4)
    gen = SequenceGenerator([ta], task.target_dictionary, beam_size=3, max_len_b=8)
    with torch.no_grad():
        hyps = gen.forward({"net_input": {"src_tokens": src, "src_lengths": lengths}})
    assert len(hyps) == 4
    assert len(decoder_calls) > 2  # several decoding steps...
    assert len(calls) == 1  # ...one readout for the whole batch: once per sentence


def test_ta_disable_is_the_plain_model_and_has_no_weights():
    ta, task = build_model("transformer_ta_baseline", SMALL)
    assert ta.encoder.transparent_attention is None
    assert not any("transparent" in k for k in ta.state_dict())
    plain, _ = build_model(
        "transformer", [*SMALL, "--attention-dropout", "0.1", "--activation-dropout", "0.1"], seed=2
    )
    plain.load_state_dict(ta.state_dict(), strict=True)
    src, lengths, prev = random_batch(task.source_dictionary)
    torch.testing.assert_close(
        ta(src, lengths, prev)[0], plain(src, lengths, prev)[0], rtol=0, atol=1e-6
    )


def test_no_residual_encoder():
    nores, task = build_model("transformer_ta_nores", SMALL)
    assert all(isinstance(layer, NoResidualEncoderLayer) for layer in nores.encoder.layers)
    assert nores.encoder.transparent_attention is None
    res, _ = build_model("transformer_ta_baseline", SMALL, seed=2)
    res.load_state_dict(nores.state_dict(), strict=True)  # same parameters, only the wiring differs
    layer, x = nores.encoder.layers[0], torch.randn(5, 2, 16)
    with torch.no_grad():  # zero sublayers: with residuals x passes, without it does not
        for lin in (layer.self_attn.out_proj, layer.fc2):
            lin.weight.zero_()
            lin.bias.zero_()
        res.encoder.layers[0].load_state_dict(layer.state_dict())
        out_res = res.encoder.layers[0](x, encoder_padding_mask=None)
        out_nores = layer(x, encoder_padding_mask=None)
    ln = res.encoder.layers[0]
    torch.testing.assert_close(out_res, ln.final_layer_norm(ln.self_attn_layer_norm(x)))
    torch.testing.assert_close(out_nores, ln.final_layer_norm.bias.expand_as(x))


# --- presets -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "arch,depth,disable,nores",
    [
        ("transformer_ta", 6, False, False),
        ("transformer_ta_16l", 16, False, False),
        ("transformer_ta_baseline_20l", 20, True, False),
        ("transformer_ta_nores_12l", 12, True, True),
    ],
)
def test_presets_are_table_1_rows(arch, depth, disable, nores):
    args = parse_model_args(arch)
    assert (args.encoder_layers, args.decoder_layers) == (depth, 6)
    assert (args.ta_disable, args.encoder_no_residual) == (disable, nores)
    assert args.encoder_normalize_before is False and args.ta_dropout == 0.1
    assert args.encoder_embed_dim == 16 and args.attention_dropout == 0  # the command line wins
    preset = ARCH_CONFIG_REGISTRY[arch]
    bare = argparse.Namespace()
    preset(
        bare
    )  # the preset alone: Transformer Base with all four dropouts at 0.1 (Chen et al. A.2)
    assert (bare.encoder_embed_dim, bare.encoder_ffn_embed_dim, bare.encoder_attention_heads) == (
        512,
        2048,
        8,
    )
    assert bare.dropout == bare.attention_dropout == bare.activation_dropout == 0.1


def test_preset_depth_conflict_names_the_fix():
    with pytest.raises(ValueError, match="--arch transformer_ta --encoder-layers 12"):
        parse_model_args("transformer_ta_16l", ["--encoder-layers", "12"])


def test_options_from_command_line_win():
    args = parse_model_args(
        "transformer_ta_prenorm",
        ["--ta-dropout", "0.3", "--ta-init", "top", "--encoder-layers", "7"],
    )
    assert (args.ta_dropout, args.ta_init, args.encoder_layers) == (0.3, "top", 7)
    assert args.encoder_normalize_before is True


def test_layerdrop_is_refused():
    with pytest.raises(ValueError, match="--encoder-layerdrop"):
        build_model("transformer_ta", [*SMALL, "--encoder-layerdrop", "0.1"])
    with pytest.raises(ValueError, match="--decoder-layerdrop"):
        build_model("transformer_ta", [*SMALL, "--decoder-layerdrop", "0.1"])
