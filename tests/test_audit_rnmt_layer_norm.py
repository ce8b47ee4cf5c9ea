"""Issue 15 (Chen et al. 2018, Table 4, "- Layer Norm"): the RNMT+ cell without its per-gate
layer norm (``LayerNormLSTM(layer_norm=False)``, ``--rnmt-no-layer-norm``).  With
output_tanh=True and no cell clipping it is torch.nn.LSTM's cell exactly (gates reordered)."""

import pytest
import test_rnmt_plus as rnmt_tests
import torch
from helpers import random_batch
from test_hybrids import build as build_hybrid

from fairseq_deep.modules.recurrent.ln_lstm import LayerNormLSTM


def _as_torch_lstm(layer: LayerNormLSTM) -> torch.nn.LSTM:
    """torch.nn.LSTM with `layer`'s weights: our gates (i, f, o, j), torch's (i, f, g, o)."""
    D, H = layer.num_directions, layer.hidden_size
    lstm = torch.nn.LSTM(layer.input_size, H, bidirectional=D == 2).to(layer.weight_ih.dtype)
    order = torch.cat([torch.arange(k * H, (k + 1) * H) for k in (0, 1, 3, 2)])
    with torch.no_grad():
        for d in range(D):
            suffix = "_l0" + ("_reverse" if d == 1 else "")
            getattr(lstm, "weight_ih" + suffix).copy_(
                layer.weight_ih[d * 4 * H : (d + 1) * 4 * H][order]
            )
            getattr(lstm, "weight_hh" + suffix).copy_(layer.weight_hh[d].t()[order])
            getattr(lstm, "bias_ih" + suffix).copy_(layer.bias[d][order])
            getattr(lstm, "bias_hh" + suffix).zero_()
    return lstm


@pytest.mark.parametrize("bidirectional", [False, True])
def test_no_layer_norm_is_torch_lstm(bidirectional):
    torch.manual_seed(0)
    layer = LayerNormLSTM(
        5, 4, bidirectional=bidirectional, output_tanh=True, layer_norm=False
    ).double()
    with torch.no_grad():
        layer.bias.uniform_(-0.5, 0.5)
    assert layer.ln_weight is None
    assert sorted(n for n, _ in layer.named_parameters()) == ["bias", "weight_hh", "weight_ih"]
    x = torch.randn(6, 3, 5, dtype=torch.float64)
    out, (h, c) = layer(x)
    ref, (h_ref, c_ref) = _as_torch_lstm(layer)(x)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(h, h_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(c, c_ref, rtol=1e-12, atol=1e-12)


def test_no_layer_norm_gradients_and_step():
    torch.manual_seed(0)
    layer = LayerNormLSTM(3, 2, bidirectional=True, cell_clip=0.8, layer_norm=False).double()
    x = torch.randn(4, 2, 3, dtype=torch.float64, requires_grad=True)
    mask = torch.zeros(4, 2, dtype=torch.bool)
    mask[:1, 1] = True  # left-padded second sentence
    assert torch.autograd.gradcheck(lambda x, *p: layer(x, mask)[0], (x, *layer.parameters()))
    out, _ = layer(x, mask)
    out.sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in layer.parameters())
    # one step from precomputed input gates is the loop's first step
    uni = LayerNormLSTM(3, 2, layer_norm=False).double()
    state = uni.zero_state(2, x)
    h, c = uni.step(uni.input_gates(x.detach()[:1])[0], state)
    torch.testing.assert_close(h[0], uni(x.detach()[:1])[0][0])


def test_layer_norm_changes_the_cell():
    torch.manual_seed(0)
    a = LayerNormLSTM(3, 4)
    b = LayerNormLSTM(3, 4, layer_norm=False)
    b.load_state_dict({k: v for k, v in a.state_dict().items() if k != "ln_weight"})
    x = torch.randn(5, 2, 3)
    assert not torch.allclose(a(x)[0], b(x)[0])


def test_rnmt_no_layer_norm_model():
    model, d = rnmt_tests.build("rnmt_plus", ["--rnmt-no-layer-norm", "--encoder-layers", "2"])
    assert not any("ln_weight" in n for n, _ in model.named_parameters())
    default, _ = rnmt_tests.build("rnmt_plus", ["--encoder-layers", "2"])
    names = {n for n, _ in default.named_parameters()}
    assert {n for n, _ in model.named_parameters()} == {n for n in names if "ln_weight" not in n}
    # training step: gradients reach every parameter
    model.train()
    src, lengths, prev = random_batch(d)
    model(src, lengths, prev)[0].sum().backward()
    assert all(p.grad is not None for p in model.parameters())


def test_rnmt_no_layer_norm_incremental_equals_full():
    rnmt_tests.test_incremental_equals_full_with_beam_reordering(
        "rnmt_plus", ["--encoder-layers", "2", "--rnmt-no-layer-norm"]
    )


def test_hybrids_take_the_switch():
    model, _ = build_hybrid("hybrid_transformer_rnmt", ["--rnmt-no-layer-norm"])
    assert not any("ln_weight" in n for n, _ in model.named_parameters())
    assert any(
        "ln_weight" in n for n, _ in build_hybrid("hybrid_transformer_rnmt")[0].named_parameters()
    )
