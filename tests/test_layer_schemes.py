"""Issue 41: the per-layer schemes after 2022 (B2T, Sub-LN/Magneto, Peri-LN, Mix-LN, DyT,
LayerScale, and Admin's closed-form omega) as settings of every Transformer family's layers.

Identities first: each scheme at its neutral setting, or with what it adds taken out again, is the
plain pre- or post-norm Transformer on the same parameters (bit for bit where the computation is
the same); each scheme's equation on a layer's own modules; the constants of each paper; the
refused combinations; incremental == full decoding, alone and combined.  Their reference code
(torchscale, admin-torch) is compared in tests/test_reference_code.py; fp16/bf16, batch size,
checkpoints and fully sharded wrapping in the family matrix (benchmarks/precision_matrix.py).
"""

import math

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_incremental_equals_full, build_model, random_batch
from torch import nn

from fairseq_deep.errors import UserError
from fairseq_deep.modules.schemes.norm_schemes import (
    DynamicTanh,
    SubLayerNormInput,
    SublayerOutput,
    layerscale_epsilon,
    subln_gamma,
)
from fairseq_deep.modules.schemes.residual_schemes import (
    AdminResidual,
    B2TResidual,
    admin_closed_form,
    unprofiled_admin_layers,
)

DEPTH = ["--encoder-layers", "3", "--decoder-layers", "2"]


def logits(model, batch):
    with torch.no_grad():
        return model(*batch)[0]


def plain_on(model, arch, extra=DEPTH, leave=()):
    """A model of ``arch`` holding ``model``'s parameters (but those whose name contains a word
    of ``leave``), loaded strictly."""
    plain, _ = build_model(arch, extra, seed=7)
    state = {k: v for k, v in model.state_dict().items() if not any(w in k for w in leave)}
    plain.load_state_dict(state)
    return plain


def randomise_norms(model, seed=0):
    """Layer norms away from their initial 1 and 0, as after training."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3 + (name.endswith("weight")))


# -- B2T -------------------------------------------------------------------------------------


def test_b2t_layers_compute_the_papers_equation():
    """Encoder: h = LN1(x + Attn(x)), y = LN2(h + FFN(h) + x); decoder: x is added before the
    last norm, past both inner ones (dropout 0, so the layer's own modules give the equation)."""
    model, _ = build_model("transformer_b2t", DEPTH)
    randomise_norms(model)
    x, memory = torch.randn(5, 2, 16), torch.randn(7, 2, 16)

    def ffn(layer, h):
        return layer.fc2(F.relu(layer.fc1(h)))

    with torch.no_grad():
        enc = model.encoder.layers[1]
        h = enc.self_attn_layer_norm(x + enc.self_attn(x, x, x)[0])
        expected = enc.final_layer_norm(h + ffn(enc, h) + x)
        torch.testing.assert_close(enc(x, encoder_padding_mask=None), expected)
        dec = model.decoder.layers[1]
        h1 = dec.self_attn_layer_norm(x + dec.self_attn(x, x, x)[0])
        h2 = dec.encoder_attn_layer_norm(
            h1 + dec.encoder_attn(h1, memory, memory, static_kv=True)[0]
        )
        expected = dec.final_layer_norm(h2 + ffn(dec, h2) + x)
        torch.testing.assert_close(dec(x, memory, None)[0], expected)
    assert isinstance(enc, B2TResidual) and isinstance(dec, B2TResidual)


def test_b2t_without_its_connection_is_the_post_norm_transformer():
    model, task = build_model("transformer_b2t", DEPTH)
    batch = random_batch(task.source_dictionary)
    plain = plain_on(model, "transformer_postnorm")
    assert not torch.allclose(logits(model, batch), logits(plain, batch), atol=1e-3)
    for layer in [*model.encoder.layers, *model.decoder.layers]:
        layer.__class__ = type(layer).scheme_base  # the connection off, nothing else
    torch.testing.assert_close(logits(model, batch), logits(plain, batch), rtol=0, atol=0)


def test_b2t_scales_every_initial_weight_by_one_over_sqrt_n():
    """The authors' rescaling_init: every weight matrix of a stack of N times N^(-1/2)."""
    model, _ = build_model("transformer_b2t", DEPTH, seed=4)
    plain, _ = build_model("transformer_postnorm", DEPTH, seed=4)
    for side, n in (("encoder", 3), ("decoder", 2)):
        ours, theirs = getattr(model, side).layers[0], getattr(plain, side).layers[0]
        for name in ("fc1", "fc2", "self_attn.q_proj", "self_attn.out_proj"):
            w, w0 = ours.get_submodule(name).weight, theirs.get_submodule(name).weight
            torch.testing.assert_close(w, w0 * n**-0.5, rtol=1e-6, atol=0)
        assert torch.equal(ours.fc1.bias, theirs.fc1.bias)  # biases keep fairseq's


# -- Sub-LN (Magneto) --------------------------------------------------------------------------


def test_subln_adds_one_norm_per_sublayer_and_nothing_else():
    model, task = build_model("transformer_subln", DEPTH)
    randomise_norms(model)
    enc, dec = model.encoder.layers[0], model.decoder.layers[0]
    assert isinstance(enc.self_attn.out_proj, SubLayerNormInput)
    assert isinstance(enc.fc2, SubLayerNormInput) and isinstance(dec.fc2, SubLayerNormInput)
    assert not isinstance(dec.encoder_attn.out_proj, SubLayerNormInput)  # as torchscale
    batch = random_batch(task.source_dictionary)
    plain = plain_on(model, "transformer_prenorm", leave=("sub_layer_norm",))
    assert not torch.allclose(logits(model, batch), logits(plain, batch), atol=1e-3)
    for m in model.modules():
        if isinstance(m, SubLayerNormInput):
            m.sub_layer_norm = nn.Identity()
    # the attention takes fairseq's explicit path instead of its fused one: float rounding only
    torch.testing.assert_close(logits(model, batch), logits(plain, batch), rtol=0, atol=1e-5)


def test_subln_initialisation_is_torchscales():
    """fc1, fc2 and every attention's value and output projections (weights and biases) times
    gamma; queries and keys as fairseq draws them (the same seed, the norms draw nothing)."""
    n, m = 3, 2
    assert subln_gamma("encoder", n, m) == pytest.approx(
        math.sqrt(math.log(3 * m) * math.log(2 * n) / 3)
    )
    assert subln_gamma("decoder", n, m) == pytest.approx(math.sqrt(math.log(3 * m)))
    model, _ = build_model("transformer_subln", DEPTH, seed=5)
    plain, _ = build_model("transformer_prenorm", DEPTH, seed=5)
    for side in ("encoder", "decoder"):
        gamma = subln_gamma(side, n, m)
        ours, theirs = getattr(model, side).layers[1], getattr(plain, side).layers[1]
        scaled = ["fc1", "fc2", "self_attn.v_proj", "self_attn.out_proj"]
        if side == "decoder":
            scaled += ["encoder_attn.v_proj", "encoder_attn.out_proj"]
        for name in scaled:
            for p in ("weight", "bias"):
                got = getattr(ours.get_submodule(name), p)
                torch.testing.assert_close(got, getattr(theirs.get_submodule(name), p) * gamma)
        for name in ("self_attn.q_proj", "self_attn.k_proj"):
            assert torch.equal(ours.get_submodule(name).weight, theirs.get_submodule(name).weight)


# -- Peri-LN -----------------------------------------------------------------------------------


def test_periln_norms_every_sublayers_output_and_nothing_else():
    model, task = build_model("transformer_periln", DEPTH)
    randomise_norms(model)
    dec = model.decoder.layers[0]
    outputs = [dec.self_attn, dec.encoder_attn, dec.fc2]
    assert all(isinstance(m, SublayerOutput) and m.output_layer_norm is not None for m in outputs)
    batch = random_batch(task.source_dictionary)
    plain = plain_on(model, "transformer_prenorm", leave=("output_layer_norm",))
    assert not torch.allclose(logits(model, batch), logits(plain, batch), atol=1e-3)
    for m in model.modules():
        if isinstance(m, SublayerOutput):
            m.output_layer_norm = None
    torch.testing.assert_close(logits(model, batch), logits(plain, batch), rtol=0, atol=0)


# -- Mix-LN ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "ratio,plain_arch", [("0", "transformer_prenorm"), ("1", "transformer_postnorm")]
)
def test_mixln_at_ratio_0_and_1_is_the_pre_and_post_norm_transformer(ratio, plain_arch):
    model, task = build_model("transformer_mixln", [*DEPTH, "--mix-ln-ratio", ratio])
    randomise_norms(model)
    assert (model.encoder.layer_norm is None) == (ratio == "1")  # a post-norm top: no final norm
    batch = random_batch(task.source_dictionary)
    plain = plain_on(model, plain_arch)
    torch.testing.assert_close(logits(model, batch), logits(plain, batch), rtol=0, atol=0)


def test_mixln_makes_the_bottom_floor_r_l_layers_post_norm():
    model, _ = build_model(
        "transformer_mixln", ["--encoder-layers", "8", "--decoder-layers", "3"]
    )  # the preset's 0.25: 2 of 8, 0 of 3
    assert [layer.normalize_before for layer in model.encoder.layers] == [False] * 2 + [True] * 6
    assert all(layer.normalize_before for layer in model.decoder.layers)
    model, _ = build_model("transformer_mixln", [*DEPTH, "--mix-ln-ratio", "0.34,0.5"])
    assert [layer.normalize_before for layer in model.encoder.layers] == [False, True, True]
    assert [layer.normalize_before for layer in model.decoder.layers] == [False, True]
    assert model.encoder.layer_norm is not None and model.decoder.layer_norm is not None


# -- DyT ---------------------------------------------------------------------------------------


def test_dyt_replaces_every_layer_norm_and_nothing_else():
    model, task = build_model(
        "transformer_dyt", [*DEPTH, "--dyt-alpha-init", "0.3", "--dyt-alpha-init-attention", "0.8"]
    )
    plain, _ = build_model("transformer_prenorm", DEPTH)
    norms = [n for n, m in plain.named_modules() if isinstance(m, nn.LayerNorm)]
    dyts = {n: m for n, m in model.named_modules() if isinstance(m, DynamicTanh)}
    assert sorted(dyts) == sorted(norms)  # the same places, the final norms included
    assert not any(isinstance(m, nn.LayerNorm) for m in model.modules())
    for name, dyt in dyts.items():
        attention = name.endswith(("self_attn_layer_norm", "encoder_attn_layer_norm"))
        assert dyt.alpha.item() == pytest.approx(0.8 if attention else 0.3)
    x = torch.randn(4, 16)
    dyt = next(iter(dyts.values()))
    with torch.no_grad():
        dyt.weight.normal_(), dyt.bias.normal_()
        expected = dyt.weight * torch.tanh(dyt.alpha * x) + dyt.bias  # Eq. 1 of the paper
        torch.testing.assert_close(dyt(x), expected, rtol=0, atol=0)
    # each DyT back to a layer norm with its gamma and beta: the pre-norm Transformer
    randomise_norms(model)
    batch = random_batch(task.source_dictionary)
    for name, dyt in dyts.items():
        norm = nn.LayerNorm(dyt.normalized_shape)
        norm.load_state_dict({"weight": dyt.weight, "bias": dyt.bias})
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, norm)
    plain = plain_on(model, "transformer_prenorm")
    torch.testing.assert_close(logits(model, batch), logits(plain, batch), rtol=0, atol=0)


def test_dyt_replaces_a_histories_norms_too():
    model, _ = build_model("transformer_dlcl", [*DEPTH, "--dyt"])
    assert not any(isinstance(m, nn.LayerNorm) for m in model.modules())
    assert any(isinstance(m, DynamicTanh) for m in model.encoder.history.modules())


# -- LayerScale --------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["transformer_layerscale", "transformer_postnorm"])
def test_layerscale_with_lambda_one_is_the_plain_layer(arch):
    model, task = build_model(arch, [*DEPTH, "--layerscale", "--layerscale-init", "1"])
    batch = random_batch(task.source_dictionary)
    plain_arch = "transformer_prenorm" if arch == "transformer_layerscale" else arch
    plain = plain_on(model, plain_arch, leave=("layer_scale",))
    torch.testing.assert_close(logits(model, batch), logits(plain, batch), rtol=0, atol=0)
    scaled, _ = build_model(arch, [*DEPTH, "--layerscale"])
    scaled.load_state_dict(model.state_dict())
    with torch.no_grad():
        scaled.encoder.layers[0].fc2.layer_scale.fill_(0.5)
    assert not torch.allclose(logits(scaled, batch), logits(plain, batch), atol=1e-4)


def test_layerscale_epsilon_by_depth():
    """CaiT (Sec. 2): 0.1 up to depth 18, 1e-5 up to 24, 1e-6 deeper; per stack."""
    assert [layerscale_epsilon(n) for n in (6, 18, 19, 24, 25, 36)] == [
        0.1,
        0.1,
        1e-5,
        1e-5,
        1e-6,
        1e-6,
    ]
    model, _ = build_model(
        "transformer_layerscale", ["--encoder-layers", "20", "--decoder-layers", "2"]
    )
    assert torch.all(model.encoder.layers[0].self_attn.layer_scale == 1e-5)
    assert torch.all(model.decoder.layers[1].encoder_attn.layer_scale == 0.1)


# -- Admin's closed form (admin-torch) ---------------------------------------------------------


def test_admin_closed_form_omega_and_no_profile():
    """admin-torch's calculate_init for n residual sublayers: O(log n): (n+1)/log(n+1) - 1, O(1): n,
    O(n): 1 (square-rooted); the encoder counts 2N sublayers, the decoder 3M."""
    assert admin_closed_form("O(logn)", 6) == pytest.approx(math.sqrt(7 / math.log(7) - 1))
    assert admin_closed_form("O(1)", 6) == pytest.approx(math.sqrt(6))
    model, task = build_model("transformer_admin", [*DEPTH, "--admin-init", "O(logn)"])
    assert unprofiled_admin_layers(model) == 0
    enc, dec = model.encoder.layers[0], model.decoder.layers[0]
    assert torch.allclose(enc.admin_omega, torch.tensor(admin_closed_form("O(logn)", 6)))
    assert torch.allclose(dec.admin_omega, torch.tensor(admin_closed_form("O(logn)", 6)))
    before = enc.admin_omega.clone()
    model.train()
    model(*random_batch(task.source_dictionary))  # a training forward profiles nothing
    assert torch.equal(enc.admin_omega, before)
    # O(n): omega = 1, the post-norm Transformer
    model, task = build_model("transformer_admin", [*DEPTH, "--admin-init", "O(n)"])
    batch = random_batch(task.source_dictionary)
    plain = plain_on(model, "transformer_postnorm", leave=("admin_",))
    model.train(), plain.train()  # dropout is 0: training mode computes the same function
    torch.testing.assert_close(logits(model, batch), logits(plain, batch), rtol=0, atol=0)
    assert isinstance(model.encoder.layers[0], AdminResidual)


# -- what does not compose -------------------------------------------------------------------


@pytest.mark.parametrize(
    "arch,flags,words",
    [
        ("transformer_b2t", ["--deepnorm"], "--deepnorm and --b2t each replace the residual"),
        ("transformer_b2t", ["--ds-init"], "--b2t and --ds-init both set"),
        ("transformer_prenorm", ["--b2t"], "is a post-norm scheme"),
        ("transformer_postnorm", ["--subln"], "--subln needs a pre-norm stack"),
        ("transformer_postnorm", ["--peri-ln"], "--peri-ln needs a pre-norm stack"),
        ("transformer_postnorm", ["--mix-ln-ratio", "0.25"], "--mix-ln-ratio needs a pre-norm"),
        ("transformer_mixln", ["--subln"], "choose one"),
        ("transformer_mixln", ["--mix-ln-ratio", "1.5"], "one number in [0, 1]"),
        ("transformer_subln", ["--ds-init"], "--subln and --ds-init both set"),
        ("transformer_rezero", ["--dyt"], "no layer norm to replace"),
        ("transformer_rezero", ["--layerscale"], "already scales"),
        ("hybrid_transformer_rnmt", ["--dyt"], "a hybrid's Transformer parts take --ds-init only"),
        ("transformer_ta_nores", ["--b2t"], "has its own residual connection"),
    ],
)
def test_combinations_that_make_no_sense_stop_with_a_message(arch, flags, words):
    extra = (
        ["--encoder-hidden-size", "8", "--decoder-hidden-size", "16"] if "hybrid" in arch else []
    )
    with pytest.raises(UserError, match=words.replace("[", r"\[").replace("]", r"\]")):
        build_model(arch, [*extra, *flags])


# -- incremental decoding ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "arch,flags",
    [
        ("transformer_b2t", []),
        ("transformer_subln", []),
        ("transformer_periln", []),
        ("transformer_mixln", ["--mix-ln-ratio", "0.5"]),
        ("transformer_dyt", []),
        ("transformer_layerscale", []),
        ("transformer_b2t", ["--dyt", "--layerscale"]),
        ("transformer_subln", ["--peri-ln", "--layerscale", "--dyt"]),
        ("transformer_mixln", ["--mix-ln-ratio", "0.5", "--dyt", "--layerscale"]),
        ("transformer_deepnorm", ["--layerscale"]),
        ("transformer_dlcl", ["--dyt", "--peri-ln"]),
        ("transformer_ta_prenorm", ["--subln"]),
        (
            "transformer_mla2",
            ["--encoder-normalize-before", "--decoder-normalize-before", "--peri-ln"],
        ),
        ("transformer_admin", ["--admin-init", "O(1)"]),
    ],
    ids=lambda v: v if isinstance(v, str) else "-".join(f.lstrip("-") for f in v),
)
def test_incremental_decoding_equals_full(arch, flags):
    model, task = build_model(arch, ["--encoder-layers", "3", "--decoder-layers", "3", *flags])
    randomise_norms(model)
    assert_incremental_equals_full(model, task.source_dictionary)
