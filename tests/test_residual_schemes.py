"""Issue 17: DeepNorm, Admin, ReZero and DS-Init as settings of the Transformer layer builder.

Identities first: each scheme at its neutral setting is the post-norm Transformer on the same
parameters; then what each scheme promises at initialisation (DeepNorm's constants and gains,
Admin's profile, ReZero's identity layers, DS-Init's per-layer scale), the refused combinations,
and incremental == full decoding.
"""

import math

import pytest
import torch
from helpers import assert_incremental_equals_full, build_model, random_batch

from fairseq_deep.errors import UserError
from fairseq_deep.modules.schemes.residual_schemes import (
    AdminResidual,
    DeepNormResidual,
    ReZeroResidual,
    deepnorm_constants,
    unprofiled_admin_layers,
)

WIDE = [
    "--encoder-embed-dim",
    "64",
    "--decoder-embed-dim",
    "64",
    "--encoder-ffn-embed-dim",
    "256",
    "--decoder-ffn-embed-dim",
    "256",
]


def logits(model, batch):
    src, lengths, prev = batch
    with torch.no_grad():
        return model(src, lengths, prev)[0]


def same_parameters_as(model, arch, extra=()):
    """A model of ``arch`` with ``model``'s parameters (the state dicts must match by name)."""
    other, _ = build_model(arch, extra)
    other.load_state_dict(model.state_dict())
    return other


def test_deepnorm_with_alpha_beta_one_is_the_post_norm_transformer():
    depth = ["--encoder-layers", "3", "--decoder-layers", "2"]
    model, task = build_model(
        "transformer_deepnorm", [*depth, "--deepnorm-alpha", "1", "--deepnorm-beta", "1"]
    )
    batch = random_batch(task.source_dictionary)
    plain = same_parameters_as(model, "transformer_postnorm", depth)
    torch.testing.assert_close(logits(model, batch), logits(plain, batch), rtol=0, atol=0)
    scaled, _ = build_model("transformer_deepnorm", depth)
    scaled.load_state_dict(model.state_dict())  # same parameters, alpha from the depths
    assert not torch.allclose(logits(scaled, batch), logits(plain, batch))


def test_deepnorm_constants_and_initial_gains():
    # the paper's encoder-decoder formulas (Sec. 3), e.g. 18L-18L
    enc, dec = deepnorm_constants("encoder", 18, 18), deepnorm_constants("decoder", 18, 18)
    assert enc == pytest.approx((0.81 * (18**5) ** (1 / 16), 0.87 * (18**5) ** (-1 / 16)))
    assert dec == pytest.approx(((3 * 18) ** 0.25, (12 * 18) ** -0.25))
    model, _ = build_model("transformer_deepnorm_18l", WIDE, seed=3)
    for side, layers, (alpha, beta) in (
        ("encoder", model.encoder.layers, enc),
        ("decoder", model.decoder.layers, dec),
    ):
        for layer in layers:
            assert isinstance(layer, DeepNormResidual) and layer.deepnorm_alpha == pytest.approx(
                alpha
            )

        # Xavier-normal: std = gain * sqrt(2 / (fan_in + fan_out)), pooled over the stack's layers
        def pooled_std(get, layers=layers):
            weights = torch.cat([get(layer).weight.flatten() for layer in layers])
            out, inp = get(layers[0]).weight.shape
            return weights.std().item() / math.sqrt(2 / (inp + out))

        assert pooled_std(lambda m: m.fc1) == pytest.approx(beta, rel=0.03), side
        assert pooled_std(lambda m: m.self_attn.v_proj) == pytest.approx(beta, rel=0.03), side
        assert pooled_std(lambda m: m.self_attn.out_proj) == pytest.approx(beta, rel=0.03), side
        assert pooled_std(lambda m: m.self_attn.q_proj) == pytest.approx(1.0, rel=0.03), side
    cross = torch.cat(
        [layer.encoder_attn.v_proj.weight.flatten() for layer in model.decoder.layers]
    )
    assert cross.std().item() / math.sqrt(2 / 128) == pytest.approx(dec[1], rel=0.03)


def test_admin_with_omega_one_is_the_post_norm_transformer():
    depth = ["--encoder-layers", "3", "--decoder-layers", "2"]
    model, task = build_model("transformer_admin", depth)
    batch = random_batch(task.source_dictionary)
    plain, _ = build_model("transformer_postnorm", depth)
    state = {k: v for k, v in model.state_dict().items() if "admin_" not in k}
    plain.load_state_dict(state)
    assert unprofiled_admin_layers(model) == 5  # eval mode never profiles: omega is still 1
    torch.testing.assert_close(logits(model, batch), logits(plain, batch), rtol=0, atol=0)


def test_admin_profile_follows_the_authors_recurrence_and_is_kept():
    """omega_0 = 1; omega_{i+1}^2 = Var[x_i * omega_i] + Var[f_i(x_i)] (sublayer by sublayer)."""
    model, task = build_model(
        "transformer_admin", ["--encoder-layers", "2", "--decoder-layers", "2"]
    )
    batch = random_batch(task.source_dictionary)
    layer0 = model.encoder.layers[0]
    seen = {}
    layer0.register_forward_pre_hook(
        lambda m, args, kwargs: seen.update(x=args[0]), with_kwargs=True
    )
    layer0.self_attn.register_forward_hook(lambda m, args, out: seen.update(attn=out[0]))
    model.train()  # dropout is 0 in the tiny flags, so f is the attention output itself
    src, lengths, prev = batch
    model(src, lengths, prev)[0].sum().backward()
    assert unprofiled_admin_layers(model) == 0
    omega = layer0.admin_omega.detach()
    assert torch.all(omega[0] == 1)
    expected = math.sqrt(seen["x"].var().item() + seen["attn"].var().item())
    assert omega[1, 0].item() == pytest.approx(expected, rel=1e-5)
    assert model.decoder.layers[0].admin_omega.shape == (3, 16)  # self, encoder and FFN sublayers
    omegas = torch.cat([layer.admin_omega.detach()[:, 0] for layer in model.encoder.layers])
    assert torch.all(omegas[1:] >= omegas[:-1])  # the accumulated variance only grows
    # the profile travels in the state dict: a reloaded model is not profiled again
    state = {k: v.clone() for k, v in model.state_dict().items()}
    reloaded, _ = build_model(
        "transformer_admin", ["--encoder-layers", "2", "--decoder-layers", "2"], seed=9
    )
    reloaded.load_state_dict(state)
    reloaded.train()
    reloaded(src, lengths, prev)
    for name, value in reloaded.state_dict().items():
        if "admin_" in name:
            assert torch.equal(value, state[name]), name


def test_admin_checkpoint_of_the_earlier_form_loads_the_same_omega():
    """Checkpoints written before the profile became a buffer hold omega whole in ``admin_omega``
    (then a parameter) and no ``admin_omega_learned``: they load with a learned part of 0, and the
    model computes what the checkpoint's did."""
    flags = ["--encoder-layers", "2", "--decoder-layers", "2"]
    model, task = build_model("transformer_admin", flags)
    with torch.no_grad():
        for layer in [*model.encoder.layers, *model.decoder.layers]:
            layer.admin_omega_learned.uniform_(-0.5, 0.5)
            layer.admin_profiled.fill_(True)
    old_form = {
        k: v.clone() for k, v in model.state_dict().items() if not k.endswith("admin_omega_learned")
    }
    for k in list(old_form):
        if k.endswith("admin_omega"):
            old_form[k] = old_form[k] + model.state_dict()[k + "_learned"]
    reloaded, _ = build_model("transformer_admin", flags, seed=9)
    reloaded.load_state_dict(old_form)
    model.eval(), reloaded.eval()
    src, lengths, prev = random_batch(task.source_dictionary)
    assert torch.allclose(reloaded(src, lengths, prev)[0], model(src, lengths, prev)[0], atol=1e-6)
    assert all(not torch.any(layer.admin_omega_learned) for layer in reloaded.encoder.layers)


def test_admin_layer_is_reentrant():
    """Design: nothing is stored on a module during forward.  A second pass through the same Admin
    layer while one is in flight (here nested, from inside the first one's self-attention) leaves
    the first pass's sublayer count alone: the outer output equals a pass run alone."""
    model, task = build_model(
        "transformer_admin", ["--encoder-layers", "1", "--decoder-layers", "1"]
    )
    layer = model.encoder.layers[0]
    with torch.no_grad():
        layer.admin_omega.uniform_(0.5, 2.0)  # every sublayer its own omega
    x = torch.randn(5, 2, layer.embed_dim)
    with torch.no_grad():
        alone = layer(x, encoder_padding_mask=None)
        nested = {}

        def second_pass(module, args, out):
            if "out" not in nested:
                nested["out"] = None  # once
                nested["out"] = layer(x, encoder_padding_mask=None)

        handle = layer.self_attn.register_forward_hook(second_pass)
        outer = layer(x, encoder_padding_mask=None)
        handle.remove()
    torch.testing.assert_close(outer, alone, rtol=0, atol=0)
    torch.testing.assert_close(nested["out"], alone, rtol=0, atol=0)


def test_rezero_layers_are_the_identity_at_initialisation():
    model, task = build_model("transformer_rezero", ["--dropout", "0.3"])
    model.train()  # dropout on: alpha = 0 still gives back the input exactly
    x = torch.randn(5, 2, 16)
    for layer in model.encoder.layers:
        assert isinstance(layer, ReZeroResidual)
        assert torch.equal(layer(x, encoder_padding_mask=None), x)
    memory = torch.randn(7, 2, 16)
    for layer in model.decoder.layers:
        assert torch.equal(layer(x, memory, None)[0], x)
    assert not any("layer_norm" in name for name, _ in model.encoder.layers.named_parameters())
    with torch.no_grad():
        model.encoder.layers[0].rezero_alpha.fill_(0.5)
    assert not torch.equal(model.encoder.layers[0](x, encoder_padding_mask=None), x)


def test_ds_init_scales_every_weight_of_layer_l_by_alpha_over_sqrt_l():
    alpha = 0.8
    model, _ = build_model("transformer_dsinit_12l", [*WIDE, "--ds-init-alpha", str(alpha)], seed=4)
    for layers in (model.encoder.layers, model.decoder.layers):
        for index, layer in enumerate(layers):
            for name, weight in (
                ("fc1", layer.fc1.weight),
                ("fc2", layer.fc2.weight),
                ("k_proj", layer.self_attn.k_proj.weight),
            ):
                out, inp = weight.shape
                xavier_std = math.sqrt(2 / (inp + out))
                measured = weight.std().item() / xavier_std
                assert measured == pytest.approx(alpha / math.sqrt(index + 1), rel=0.05), (
                    index,
                    name,
                )


@pytest.mark.parametrize(
    "arch,flags,words",
    [
        ("transformer_deepnorm", ["--admin"], "--deepnorm and --admin each replace the residual"),
        ("transformer_rezero", ["--admin"], "--admin and --rezero each replace the residual"),
        ("transformer_deepnorm", ["--ds-init"], "--deepnorm and --ds-init both set"),
        ("transformer_dlcl", ["--deepnorm"], "pre-norm"),
        ("transformer_prenorm", ["--rezero"], "no layer norm"),
        ("transformer_ta_nores", ["--admin"], "has its own residual connection"),
        (
            "transformer_deepnorm",
            ["--deepnorm-alpha", "1,2,3"],
            "--deepnorm-alpha takes one number",
        ),
    ],
)
def test_combinations_that_make_no_sense_stop_with_a_message(arch, flags, words):
    with pytest.raises(UserError, match=words):
        build_model(arch, flags)


@pytest.mark.parametrize(
    "arch,flags",
    [
        ("transformer_deepnorm", []),
        ("transformer_admin", []),
        ("transformer_rezero", ["--rezero-init", "0.3"]),
        ("transformer_dsinit", []),
        ("transformer_dlcl_postnorm", ["--deepnorm"]),  # DeepNorm composes with post-norm DLCL
        ("transformer_ta_baseline", ["--admin"]),
        ("transformer_mla2", ["--rezero", "--rezero-init", "0.3"]),
        ("transformer_dlcl", ["--ds-init"]),
    ],
    ids=lambda v: v if isinstance(v, str) else "-".join(f.lstrip("-") for f in v),
)
def test_incremental_decoding_equals_full(arch, flags):
    model, task = build_model(arch, ["--encoder-layers", "3", "--decoder-layers", "3", *flags])
    if any(isinstance(m, AdminResidual) for m in model.modules()):
        model.train()
        model(*random_batch(task.source_dictionary, seed=5))  # profile, so that omega is not 1
        model.eval()
        assert unprofiled_admin_layers(model) == 0
    assert_incremental_equals_full(model, task.source_dictionary)
