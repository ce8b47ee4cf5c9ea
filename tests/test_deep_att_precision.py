"""Deep-Att / Deep-ED in reduced precision (issue 12), on CPU, where PyTorch runs float16 and
bfloat16 too.

The fast-forward path f^k = W_f^k [Half(f^{k-1}), Dr(h^{k-1})] (Zhou et al. 2016, Eq. 6) is linear
and grows geometrically with depth: at the paper's settings (512 cells, N(0, 0.07^2)) Deep-ED's
decoder reaches max |f| = 2.3e5 at initialisation, beyond float16's 65504.  So the F-F layers, the
interface and the attention run in float32 under --fp16 / --bf16 / --amp
(:mod:`fairseq_deep.modules.recurrent.fast_forward_lstm`).  A tiny model reproduces the overflow with a larger
init: at 8 cells and std 1.5 each layer multiplies the variance of f by 1.5^2 * 16 = 36.

* the overflowing tiny model gives finite log-probabilities near float32's in ``.half()`` and
  under float16 autocast (the code before the fix gave NaN);
* Deep-Att and Deep-ED (and F-F "whole" / no F-F) in ``.half()`` / ``.bfloat16()`` (what fairseq's
  ``--fp16`` / ``--bf16`` do to the model) and under CPU autocast run forward and backward with
  finite outputs and gradients of the parameter dtype, the interface in float32;
* incremental decoding equals the full pass in float16 and bfloat16.

Tolerances.  The reference is the float32 model with the same 16-bit-rounded weights, so only the
16-bit arithmetic differs: the top h rounded to 16 bits and the output projection (the F-F path
is float32).  |log p - reference| <= 0.01 in float16 (unit roundoff 2^-11; measured: 1e-4, and
3.3e-3 for the overflowing model) and in bfloat16 (2^-8; measured 5e-4).  Incremental vs full
differ only where float32 steps round differently to 16 bits: 2e-3 in float16 (measured 1e-4) and
1e-2 in bfloat16 (measured 1e-3).
"""

import copy

import pytest
import torch
import torch.nn.functional as F
from helpers import random_batch
from test_deep_att import build

from fairseq_deep.modules.recurrent.fast_forward_lstm import FFLSTMLayer

REDUCED = [torch.float16, torch.bfloat16]
IDS = ["fp16", "bf16"]
ARCHS = [
    ("deep_att_ff", []),
    ("deep_ed_ff", []),
    ("deep_att", ["--ff-mode", "whole"]),
    ("deep_att", ["--ff-mode", "none", "--ff-proj-ratio", "1"]),
]
ARCH_IDS = ["deep_att_ff", "deep_ed_ff", "whole", "noff"]
LOGPROB_ATOL = {torch.float16: 0.01, torch.bfloat16: 0.01}
INCREMENTAL_ATOL = {torch.float16: 2e-3, torch.bfloat16: 1e-2}
FP16_MAX = torch.finfo(torch.float16).max
OVERFLOW = ["--encoder-layers", "4", "--decoder-layers", "4", "--ff-init-std", "1.5"]


def log_probs(model, src, lengths, prev):
    return model.get_normalized_probs(model(src, lengths, prev), log_probs=True)


def rounded_reference(model, dtype, src, lengths, prev):
    """Log-probs of the float32 model whose weights are rounded to ``dtype``."""
    ref = copy.deepcopy(model).to(dtype).float().eval()
    with torch.no_grad():
        return log_probs(ref, src, lengths, prev)


def max_abs_f(model, src, lengths, prev) -> float:
    seen = []
    hooks = [
        m.register_forward_hook(lambda m, i, out: seen.append(out[0].abs().max().item()))
        for m in model.modules()
        if isinstance(m, FFLSTMLayer)
    ]
    with torch.no_grad():
        model(src, lengths, prev)
    for hook in hooks:
        hook.remove()
    return max(seen)


# ------------------------------------------------- (a) an F-F path beyond float16's range


@pytest.mark.parametrize("mode", ["half", "autocast"])
@pytest.mark.parametrize("arch", ["deep_att_ff", "deep_ed_ff"])
def test_fast_forward_path_beyond_float16_range_stays_finite(arch, mode):
    model, d, _ = build(arch, OVERFLOW, depth=False)
    src, lengths, prev = random_batch(d, bsz=3, src_len=7, tgt_len=6)
    assert max_abs_f(model, src, lengths, prev) > 10 * FP16_MAX  # the case really overflows float16
    ref = rounded_reference(model, torch.float16, src, lengths, prev)
    with torch.no_grad():
        if mode == "half":
            lp = log_probs(model.half(), src, lengths, prev)
        else:
            model = model.to(torch.float16).float()  # the same rounded weights as the reference
            with torch.autocast("cpu", dtype=torch.float16):
                lp = log_probs(model, src, lengths, prev)
    assert torch.isfinite(lp).all()
    torch.testing.assert_close(lp.float(), ref, atol=LOGPROB_ATOL[torch.float16], rtol=0)


# --------------------------------------- (b) forward and backward in .half() / .bfloat16() / autocast


def _check_grads(model, dtype):
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    missing = [n for n, p in params if p.grad is None]
    assert not missing, missing
    for n, p in params:
        # under float16 every parameter but the output projection stays float32 (issue 24,
        # tests/test_deep_att_fp16.py); bfloat16 and float32 cast everything
        kept = dtype == torch.float16 and not n.startswith("decoder.output_projection.")
        assert p.dtype == (torch.float32 if kept else dtype) and p.grad.dtype == p.dtype, n
        assert torch.isfinite(p.grad).all(), n


@pytest.mark.parametrize("dtype", REDUCED, ids=IDS)
@pytest.mark.parametrize("arch,extra", ARCHS, ids=ARCH_IDS)
def test_trains_in_reduced_precision(arch, extra, dtype):
    model, d, _ = build(arch, extra)
    src, lengths, prev = random_batch(d)
    ref = rounded_reference(model, dtype, src, lengths, prev)
    model = model.to(dtype).train()
    assert model.encoder(src, lengths)["encoder_out"][0].dtype == torch.float32  # the interface
    logits, _ = model(src, lengths, prev)
    assert logits.dtype == dtype
    lp = model.get_normalized_probs((logits, None), log_probs=True)
    assert torch.isfinite(lp).all()
    torch.testing.assert_close(lp.float(), ref, atol=LOGPROB_ATOL[dtype], rtol=0)
    F.nll_loss(lp.view(-1, lp.size(-1)).float(), prev.view(-1), reduction="sum").backward()
    _check_grads(model, dtype)


@pytest.mark.parametrize("dtype", REDUCED, ids=IDS)
@pytest.mark.parametrize("arch,extra", ARCHS[:2], ids=ARCH_IDS[:2])
def test_trains_under_autocast(arch, extra, dtype):
    """--amp: float32 weights, autocast on.  The F-F path runs in float32 (the interface comes out
    float32), the output projection in the autocast dtype; gradients are float32."""
    model, d, _ = build(arch, extra)
    src, lengths, prev = random_batch(d)
    model = model.to(dtype).float().train()  # weights the 16-bit format holds exactly
    with torch.no_grad():
        ref = log_probs(copy.deepcopy(model).eval(), src, lengths, prev)
    with torch.autocast("cpu", dtype=dtype):
        assert model.encoder(src, lengths)["encoder_out"][0].dtype == torch.float32
        logits, _ = model(src, lengths, prev)
    assert logits.dtype == dtype
    lp = F.log_softmax(logits.float(), dim=-1)
    assert torch.isfinite(lp).all()
    torch.testing.assert_close(lp, ref, atol=LOGPROB_ATOL[dtype], rtol=0)
    F.nll_loss(lp.view(-1, lp.size(-1)), prev.view(-1), reduction="sum").backward()
    _check_grads(model, torch.float32)


# ------------------------------------------------------------- (c) incremental == full


@pytest.mark.parametrize("dtype", REDUCED, ids=IDS)
@pytest.mark.parametrize("arch,extra", ARCHS, ids=ARCH_IDS)
def test_incremental_decoding_equals_full_pass(arch, extra, dtype):
    model, d, _ = build(arch, extra)
    model = model.to(dtype)
    src, lengths, prev = random_batch(d, bsz=3, src_len=7, tgt_len=6)
    with torch.no_grad():
        full, extra_full = model(src, lengths, prev)
        enc = model.encoder(src, lengths)
        state, steps, attn = {}, [], []
        for t in range(prev.size(1)):
            out, ex = model.decoder(prev[:, : t + 1], enc, incremental_state=state)
            steps.append(out)
            attn.append(ex["attn"][0])
    assert full.dtype == dtype and torch.isfinite(full).all()
    atol = INCREMENTAL_ATOL[dtype]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=atol, rtol=0)
    if arch != "deep_ed_ff":
        torch.testing.assert_close(torch.cat(attn, 1), extra_full["attn"][0], atol=atol, rtol=0)
