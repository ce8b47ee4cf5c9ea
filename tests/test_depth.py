"""Issue 17, depth: fairseq's --checkpoint-activations under every layer history and scheme, and a
1,000-layer DeepNorm encoder that builds, trains and decodes on CPU.

With checkpointing, each layer's forward runs under ``torch.no_grad`` and again in backward
(fairseq's ``checkpoint_wrapper``): outputs and parameter gradients must equal those of the same
parameters without it (train mode, dropout 0), and Admin's first-batch profile, taken inside a
checkpointed forward, must give the same omegas.  The fairseq-train / fairseq-generate run of a
1,000-layer model is ``python -m benchmarks.depth --cli`` (about a minute and a half on 2 cores: too slow
for CI).
"""

import copy
import math
import time

import pytest
import torch
from fairseq.sequence_generator import SequenceGenerator
from helpers import assert_incremental_equals_full, build_model, dtype_marker, random_batch

from fairseq_deep.models import families
from fairseq_deep.modules.schemes.residual_schemes import (
    DeepNormResidual,
    unprofiled_admin_layers,
)

CHECKPOINT = ["--checkpoint-activations"]


# (--arch, flags): every history and every residual / initialisation scheme, and a row of every
# Transformer family that none of these is of (its first tiny configuration: models/families.py)
def rows():
    """The checkpointed-activation matrix's rows (models/families.py: ``families.cover``)."""
    return families.cover(
        [
            ("transformer_dlcl", []),  # DLCL, pre-norm
            ("transformer_dlcl_postnorm", []),  # DLCL, post-norm (the history's layer norms)
            # transparent attention: a readout per decoder layer
            ("transformer_ta", ["--ta-dropout", "0"]),
            ("transformer_hier_agg", []),  # hierarchical aggregation
            ("transformer_dense", []),  # dense connections
            (
                "transformer_mla2",
                [],
            ),  # multi-layer attention: lower layers' states passed in a list
            ("transformer_deepnorm", []),
            ("transformer_admin", []),
            ("transformer_dsinit", []),
            (
                "transformer_rezero",
                ["--rezero-init", "0.3"],
            ),  # 0 would make every layer the identity
            # dropout on: the checkpoint's recomputation in backward draws the forward's masks again
            (
                "transformer_deepnorm",
                ["--dropout", "0.3", "--attention-dropout", "0.1", "--activation-dropout", "0.1"],
            ),
        ],
        arch=lambda row: row[0],
        default=lambda family, tiny: (tiny.arch, list(tiny.model)),
        applies=lambda family: family.kind == "transformer",
    )


FAMILIES = rows()


def train_step(model, batch):
    """One training forward and backward: (output, {name: gradient}, state dict after it)."""
    model.train()
    model.zero_grad(set_to_none=True)
    torch.manual_seed(0)  # the same dropout masks in both models (where dropout is on)
    out = model(*batch)[0]
    out.float().pow(2).mean().backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return out.detach(), grads, {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize(
    "arch,flags", FAMILIES, ids=[a + ("-dropout" if "--dropout" in f else "") for a, f in FAMILIES]
)
def test_checkpoint_activations_give_the_same_outputs_and_gradients(arch, flags):
    depth = ["--encoder-layers", "3", "--decoder-layers", "3", *flags]
    plain, task = build_model(arch, depth)
    checkpointed, _ = build_model(arch, [*depth, *CHECKPOINT], seed=2)
    checkpointed.load_state_dict(plain.state_dict())
    layers = [*checkpointed.encoder.layers, *checkpointed.decoder.layers]
    assert all(hasattr(layer, "precheckpoint_forward") for layer in layers)
    batch = random_batch(task.source_dictionary)
    out, grads, state = train_step(plain, batch)
    out_ck, grads_ck, state_ck = train_step(checkpointed, batch)
    torch.testing.assert_close(out_ck, out, rtol=0, atol=0)
    assert (
        grads_ck.keys()
        == grads.keys()
        == {n for n, p in plain.named_parameters() if p.requires_grad}
    )
    for name in grads:
        # float32 rounding of the recomputed sums (the dense connection adds every lower layer: its
        # gradients are summed in another order), relative to the tensor's own scale; 1e-7 at least
        # (a key bias has no gradient but rounding)
        scale = grads[name].abs().max().item()
        torch.testing.assert_close(
            grads_ck[name], grads[name], rtol=1e-5, atol=max(1e-7, 1e-6 * scale), msg=name
        )
    # Admin: the profile of the first batch (taken in the checkpointed forward, not again when
    # backward recomputes it) sets the same omegas
    for key in state:
        assert dtype_marker(key) or torch.equal(state_ck[key], state[key]), key
    if arch == "transformer_admin":
        assert unprofiled_admin_layers(checkpointed) == 0
        assert not torch.all(checkpointed.encoder.layers[1].admin_omega == 1)


@pytest.mark.parametrize("arch", ["transformer_mla2", "transformer_ta", "transformer_admin"])
def test_incremental_decoding_with_checkpointed_layers_equals_full(arch):
    """fairseq-generate builds the model with the flags it was trained with, wrapper included."""
    model, task = build_model(arch, ["--encoder-layers", "3", "--decoder-layers", "3", *CHECKPOINT])
    if arch == "transformer_admin":
        train_step(model, random_batch(task.source_dictionary, seed=5))  # profiled: omega is not 1
    model.eval()
    assert_incremental_equals_full(model, task.source_dictionary)


def test_a_deep_copy_of_a_checkpointed_model_runs_its_own_layers():
    """fairseq's EMA deep-copies the model: the copy's wrapped forward must use the copy's weights."""
    model, task = build_model(
        "transformer_mla2", ["--encoder-layers", "3", "--decoder-layers", "2", *CHECKPOINT]
    )
    copy_ = copy.deepcopy(model)
    with torch.no_grad():
        for p in copy_.parameters():
            p.mul_(0.5)
    batch = random_batch(task.source_dictionary)
    out, _, _ = train_step(model, batch)
    model.zero_grad()
    out_copy, grads, _ = train_step(copy_, batch)
    assert not torch.allclose(out, out_copy)
    assert all(p.grad is None for p in model.parameters()) and len(grads) == len(
        list(copy_.parameters())
    )


NARROW = [
    "--encoder-embed-dim",
    "8",
    "--decoder-embed-dim",
    "8",
    "--encoder-ffn-embed-dim",
    "16",
    "--decoder-ffn-embed-dim",
    "16",
    "--encoder-attention-heads",
    "2",
    "--decoder-attention-heads",
    "2",
]


def test_a_1000_layer_deepnorm_encoder_builds_trains_and_decodes():
    """DeepNet's depth (Wang et al. 2022) at width 8: one checkpointed forward and backward, an
    Adam step, and beam search, in process."""
    start = time.perf_counter()
    model, task = build_model(
        "transformer_deepnorm",
        [*NARROW, "--encoder-layers", "1000", "--decoder-layers", "2", *CHECKPOINT],
    )
    built = time.perf_counter() - start
    encoder = model.encoder.layers
    assert len(encoder) == 1000 and all(isinstance(layer, DeepNormResidual) for layer in encoder)
    assert all(hasattr(layer, "precheckpoint_forward") for layer in encoder)
    # Sec. 3: encoder alpha = 0.81 (N^4 M)^(1/16) for N = 1000, M = 2
    assert encoder[0].deepnorm_alpha == pytest.approx(0.81 * (1000**4 * 2) ** (1 / 16))

    model.train()
    batch = random_batch(task.source_dictionary, bsz=2, src_len=6, tgt_len=4)
    src, lengths, prev = batch
    target = torch.roll(prev, -1, dims=1)
    logits = model(src, lengths, prev)[0]
    loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), target.flatten())
    assert math.isfinite(loss.item())
    loss.backward()
    grads = {name: p.grad for name, p in model.named_parameters()}
    assert all(g is not None and torch.isfinite(g).all() for g in grads.values())
    for name in (
        "encoder.layers.0.fc1.weight",
        "encoder.layers.999.fc2.weight",
        "encoder.embed_tokens.weight",
    ):
        assert grads[name].abs().sum() > 0, name  # the gradient reaches the bottom of the stack
    before = encoder[0].fc1.weight.detach().clone()
    torch.optim.Adam(model.parameters(), lr=1e-3).step()
    assert not torch.equal(encoder[0].fc1.weight, before)

    model.eval()
    generator = SequenceGenerator(
        [model], task.target_dictionary, beam_size=2, max_len_a=0, max_len_b=5
    )
    with torch.no_grad():
        hypos = generator.forward({"net_input": {"src_tokens": src, "src_lengths": lengths}})
    assert len(hypos) == 2 and all(len(h) == 2 and h[0]["tokens"].numel() <= 6 for h in hypos)
    assert all(math.isfinite(h[0]["score"].item()) for h in hypos)
    assert built < 30  # about 3 s on 2 cores; a slow build (e.g. O(L^2) set-up) shows here
