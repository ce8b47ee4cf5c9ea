"""Deep-Att / Deep-ED under ``--fp16`` (issue 24): fairseq casts the model with ``.half()`` and scales
the loss (128 at the start).  The fast-forward path f^k = W_f^k [Half(f^{k-1}), Dr(h^{k-1})] is linear
and grows about sqrt(5)x per layer at the paper's settings (N(0, 0.07^2), width 512), forward and
backward, so the unscaled gradients of the bottom layers' W_f biases and of the embeddings pass
65504: in float16 they are inf at every loss scale >= 1 and fairseq's scale collapses.  The forward
itself is float32 inside the stacks (fast_forward_lstm); the fix keeps every parameter but the
output projection float32 under ``.half()`` (precision.Float32UnderHalf).

The paper's width (512) and depth with small embeddings, vocabulary and batch: at a smaller width
with a larger init std (the same per-layer gain) the cells saturate and the gradients vanish
instead, which is not what training at paper scale meets."""

import pytest
import torch
import torch.nn.functional as F
from helpers import build_model, random_batch, tiny_dictionary

WIDTH, STD = 512, 0.07  # Sec. 4.2, 4.3
SCALE = 128.0  # fairseq's --fp16-init-scale


def deep_model(arch):
    d = tiny_dictionary(40)
    flags = [
        "--encoder-hidden-size",
        str(WIDTH),
        "--decoder-hidden-size",
        str(WIDTH),
        "--encoder-embed-dim",
        "64",
        "--decoder-embed-dim",
        "64",
        "--ff-init-std",
        str(STD),
    ]
    model, _ = build_model(arch, flags, dictionary=d)
    return model, d


def loss_and_grads(model, batch):
    src, lengths, prev = batch
    model.zero_grad()
    logits = model(src, lengths, prev)[0]
    target = torch.roll(prev, -1, dims=1)
    loss = F.cross_entropy(
        logits.float().view(-1, logits.size(-1)), target.reshape(-1), reduction="sum"
    )
    (loss * SCALE).backward()
    return loss.item(), {
        n: p.grad.float() / SCALE for n, p in model.named_parameters() if p.grad is not None
    }


@pytest.mark.parametrize("arch", ["deep_ed_ff", "deep_att_ff"])
def test_half_model_keeps_finite_gradients_close_to_float32(arch):
    model, d = deep_model(arch)
    batch = random_batch(d, bsz=16, src_len=12, tgt_len=12)
    ref_loss, ref = loss_and_grads(model, batch)
    assert (
        max(g.abs().max().item() for g in ref.values()) * SCALE > 65504
    )  # the case that overflowed
    model.half()
    loss, grads = loss_and_grads(model, batch)
    bad = [n for n, g in grads.items() if not torch.isfinite(g).all()]
    assert not bad, f"float16 gradients overflow: {bad}"
    kept = {n for n, p in model.named_parameters() if p.dtype == torch.float32}
    assert kept == {
        n for n, _ in model.named_parameters() if not n.startswith("decoder.output_projection.")
    }
    assert loss == pytest.approx(ref_loss, rel=1e-2)
    for n, g in grads.items():
        scale = ref[n].abs().max().clamp_min(1e-6)
        assert ((g - ref[n]).abs().max() / scale).item() < 2e-2, n


def test_half_keeps_values_and_moves_back_and_forth():
    model, _ = deep_model("deep_att_ff_2x2")
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    model.half()
    for n, p in model.named_parameters():
        if n.startswith("decoder.output_projection."):
            assert p.dtype == torch.float16
        else:
            assert p.dtype == torch.float32 and torch.equal(p, before[n]), (
                n
            )  # kept exactly, not rounded
    model.float()
    assert all(p.dtype == torch.float32 for p in model.parameters())
    model.to(torch.bfloat16)  # --bf16 casts everything: bfloat16 has float32's range
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
