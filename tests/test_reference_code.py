"""Issue 41: our schemes against their authors' own code, where it installs from PyPI (the
``reference`` extra; skipped where a package is missing, run by CI's reference stage).

* torchscale 0.3.0 (Microsoft's DeepNet and Magneto code): a torchscale encoder or decoder layer
  and ours, on the same (copied) weights, give the same outputs and the same gradients of every
  parameter and of the input, for DeepNorm (post-norm, residual x alpha) and for Sub-LN (Magneto);
  DeepNorm's alpha and Sub-LN's gamma are torchscale's, and DeepNorm's beta is compared with the
  paper's (the encoder's differs, see below).
* admin-torch 0.1.0 (Liu et al.'s Admin package): it has no profiling stage ("admin-torch removed
  the profilling stage", its README) but a closed-form omega (``calculate_init``); our
  ``--admin-init O(logn)``/``O(1)``/``O(n)`` gives its omega, and our Admin layer computes what
  the post-norm layer with its ``OmegaResidual`` modules computes.

torchscale imports timm for ``drop_path`` only (never called with a rate above 0 here); timm 0.6.13
would pull torchvision and a CUDA torch, so torchscale is installed without its dependencies
(``pip install --no-deps torchscale==0.3.0``, docs/deep_schemes.md) and a stand-in ``timm`` is
put in place for the import when the real one is missing.
"""

import importlib.util
import math
import sys
import types

import pytest
import torch
from helpers import build_model

from fairseq_deep.modules.schemes.norm_schemes import subln_gamma
from fairseq_deep.modules.schemes.residual_schemes import admin_closed_form, deepnorm_constants

pytestmark = pytest.mark.reference

N, M = 3, 2  # encoder and decoder layers
SIZES = dict(embed_dim=16, ffn_embed_dim=32, attention_heads=2)


def _timm_stand_in():
    """``timm.models.layers.drop_path`` for torchscale's import, when timm is not installed."""
    if importlib.util.find_spec("timm") is not None:
        return

    def drop_path(x, drop_prob=0.0, training=False):
        if drop_prob > 0 and training:
            raise NotImplementedError("the stand-in timm has no drop path")
        return x

    timm, models, layers = (
        types.ModuleType(n) for n in ("timm", "timm.models", "timm.models.layers")
    )
    layers.drop_path, timm.models, models.layers = drop_path, models, layers
    sys.modules.update({"timm": timm, "timm.models": models, "timm.models.layers": layers})


@pytest.fixture(scope="module")
def torchscale():
    pytest.importorskip("fairscale")
    if importlib.util.find_spec("torchscale") is None:
        pytest.skip("torchscale is not installed (pip install --no-deps torchscale==0.3.0)")
    _timm_stand_in()
    from torchscale.architecture import config, decoder, encoder

    return types.SimpleNamespace(config=config, encoder=encoder, decoder=decoder)


def ts_config(ts, **scheme):
    kwargs = {}
    for side, layers in (("encoder", N), ("decoder", M)):
        kwargs.update({f"{side}_{k}": v for k, v in SIZES.items()}, **{f"{side}_layers": layers})
    return ts.config.EncoderDecoderConfig(activation_fn="relu", dropout=0.0, **kwargs, **scheme)


#: torchscale's parameter names -> ours (fairseq's layer with the scheme applied)
NAMES = {
    "ffn.fc1.": "fc1.",
    "ffn.fc2.": "fc2.",
    "ffn.ffn_layernorm.": "fc2.sub_layer_norm.",
    "self_attn.inner_attn_ln.": "self_attn.out_proj.sub_layer_norm.",
}


def ours_name(name: str) -> str:
    for theirs, mine in NAMES.items():
        if name.startswith(theirs):
            return mine + name[len(theirs) :]
    return name


def copy_weights(theirs, mine, seed=0):
    """Random weights (norms too) into torchscale's layer, copied into ours."""
    g = torch.Generator().manual_seed(seed)
    ours = dict(mine.named_parameters())
    assert {ours_name(n) for n, _ in theirs.named_parameters()} == set(ours)
    with torch.no_grad():
        for name, p in theirs.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3 + name.endswith("norm.weight"))
            ours[ours_name(name)].copy_(p)


def compare(theirs_out, mine_out, theirs, mine, inputs):
    """Same outputs, same gradients of (outputs * r).sum() for every parameter and input."""
    torch.testing.assert_close(mine_out, theirs_out, rtol=1e-5, atol=1e-5)
    r = torch.randn_like(theirs_out)
    (theirs_out * r).sum().backward()
    (mine_out * r).sum().backward()
    grads = dict(mine.named_parameters())
    for name, p in theirs.named_parameters():
        torch.testing.assert_close(
            grads[ours_name(name)].grad, p.grad, rtol=1e-4, atol=1e-5, msg=name
        )
    for theirs_in, mine_in in inputs:
        torch.testing.assert_close(  # ours time-first
            mine_in.grad.transpose(0, 1), theirs_in.grad, rtol=1e-4, atol=1e-5
        )


def our_layers(arch, extra=()):
    model, _ = build_model(arch, ["--encoder-layers", str(N), "--decoder-layers", str(M), *extra])
    return model.encoder.layers[1], model.decoder.layers[1]


def run_pair(ts, scheme, arch):
    """torchscale's encoder and decoder layers and ours on the same weights and inputs (T=5
    source, 4 target positions, batch 2, one source padded), compared."""
    cfg = ts_config(ts, **scheme)
    ts_enc = ts.encoder.EncoderLayer(cfg, depth=1, is_encoder_decoder=True)
    ts_dec = ts.decoder.DecoderLayer(cfg, depth=1, is_encoder_decoder=True)
    enc, dec = our_layers(arch)
    for theirs, mine in ((ts_enc, enc), (ts_dec, dec)):
        copy_weights(theirs, mine)
        theirs.train(), mine.train()  # dropout is 0: training mode computes the same function
    pad = torch.tensor([[False] * 5, [True, True, False, False, False]])
    x = torch.randn(2, 5, 16)  # torchscale: batch first
    x_ts, x_ours = x.clone().requires_grad_(), x.transpose(0, 1).clone().requires_grad_()
    compare(
        ts_enc(x_ts, pad)[0],
        enc(x_ours, encoder_padding_mask=pad).transpose(0, 1),
        ts_enc,
        enc,
        [(x_ts, x_ours)],
    )

    y, memory = torch.randn(2, 4, 16), torch.randn(2, 5, 16)
    future = torch.triu(torch.full((4, 4), float("-inf")), 1)
    y_ts, y_ours = y.clone().requires_grad_(), y.transpose(0, 1).clone().requires_grad_()
    m_ts, m_ours = memory.clone().requires_grad_(), memory.transpose(0, 1).clone().requires_grad_()
    theirs_out = ts_dec(y_ts, m_ts, pad, self_attn_mask=future)[0]
    mine_out = dec(y_ours, m_ours, pad, self_attn_mask=future)[0].transpose(0, 1)
    compare(theirs_out, mine_out, ts_dec, dec, [(y_ts, y_ours), (m_ts, m_ours)])
    return ts_enc, ts_dec, enc, dec


def init_ratio(ts, scheme, off):
    """What torchscale's stack multiplies fc1's initial weights by under ``scheme``: the same seed
    with the scheme ``off`` (its norms draw no random numbers)."""
    ratios = []
    for stack in (ts.encoder.Encoder, ts.decoder.Decoder):
        layers = []
        for s in (scheme, off):
            torch.manual_seed(0)
            layers.append(stack(ts_config(ts, **s), is_encoder_decoder=True).layers[0])
        ratios.append((layers[0].ffn.fc1.weight / layers[1].ffn.fc1.weight).mean().item())
    return ratios


def test_deepnorm_equals_torchscales(torchscale):
    ts_enc, ts_dec, enc, dec = run_pair(torchscale, {"deepnorm": True}, "transformer_deepnorm")
    for theirs, mine, side in ((ts_enc, enc, "encoder"), (ts_dec, dec, "decoder")):
        assert theirs.alpha == pytest.approx(mine.deepnorm_alpha, rel=1e-12)
        assert mine.deepnorm_alpha == pytest.approx(deepnorm_constants(side, N, M)[0])
    enc_beta, dec_beta = init_ratio(torchscale, {"deepnorm": True}, {"subln": False})
    assert dec_beta == pytest.approx(deepnorm_constants("decoder", N, M)[1], rel=1e-5)
    # torchscale's encoder divides by (N^4 M)^(1/16) / 1.15, i.e. multiplies by 1.15 (N^4 M)^(-1/16),
    # where the paper (and --deepnorm) has 0.87 (N^4 M)^(-1/16): 1.15 / 0.87 times the paper's
    assert enc_beta == pytest.approx(1.15 * (N**4 * M) ** (-1 / 16), rel=1e-5)
    assert enc_beta == pytest.approx(deepnorm_constants("encoder", N, M)[1] * 1.15 / 0.87, rel=1e-5)


def test_subln_equals_torchscales(torchscale):
    run_pair(torchscale, {"subln": True}, "transformer_subln")
    enc_gamma, dec_gamma = init_ratio(torchscale, {"subln": True}, {"subln": False})
    assert enc_gamma == pytest.approx(subln_gamma("encoder", N, M), rel=1e-5)
    assert dec_gamma == pytest.approx(subln_gamma("decoder", N, M), rel=1e-5)
    assert dec_gamma == pytest.approx(math.sqrt(math.log(3 * M)), rel=1e-5)


@pytest.mark.parametrize("scale", ["O(logn)", "O(1)", "O(n)"])
def test_admin_omega_equals_admin_torchs(scale):
    admin_torch = pytest.importorskip("admin_torch")
    for sublayers in (2 * N, 3 * M):  # the encoder's residual sublayers, the decoder's
        assert admin_closed_form(scale, sublayers) == pytest.approx(
            admin_torch.calculate_init(sublayers, scale), rel=1e-12
        )
    enc, dec = our_layers("transformer_admin", ["--admin-init", scale])
    assert torch.allclose(enc.admin_omega, torch.tensor(admin_torch.calculate_init(2 * N, scale)))
    assert torch.allclose(dec.admin_omega, torch.tensor(admin_torch.calculate_init(3 * M, scale)))
    # our layer is the post-norm layer with admin-torch's residual module (omega trainable)
    with torch.no_grad():
        enc.admin_omega_learned.normal_(0, 0.1)  # as after training: omega = profile + learned
    omega = enc.admin_omega + enc.admin_omega_learned
    residuals = []
    for i in range(2):
        module = admin_torch.as_module(2 * N, scale, as_parameter=True, embed_dim=16)
        with torch.no_grad():
            module.omega.copy_(omega[i])
        residuals.append(module)
    x = torch.randn(5, 2, 16)
    with torch.no_grad():
        h = enc.self_attn_layer_norm(residuals[0](x, enc.self_attn(x, x, x)[0]))
        expected = enc.final_layer_norm(residuals[1](h, enc.fc2(torch.relu(enc.fc1(h)))))
        torch.testing.assert_close(enc(x, encoder_padding_mask=None), expected)
