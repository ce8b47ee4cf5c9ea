"""GPKD and Skipping Sub-Layer (Li et al. 2021; issue 46 item 3): off is the plain model, the
permuted order is the order the loop runs, a skipped sub-layer passes its input on (a DLCL history
keeps its row), inference scales by 1 - p and is deterministic, incremental = full, batch 1 =
batch 64, bf16 runs; the extracted student computes what the teacher computes with the chosen
layers only (pre-norm and DLCL), decodes in fairseq-generate and reduces to fairseq's Transformer
where the family does; bad input ends in one line and writes nothing."""

import copy
import os
import sys

import pytest
import torch
from helpers import TINY, build_model, random_batch, run_cli
from test_grow import save_tiny
from torch import nn

from fairseq_deep.errors import UserError
from fairseq_deep.extract import chosen_layers, extract
from fairseq_deep.models.reduction import why_not_transformer
from fairseq_deep.modules.histories.layer_history import DynamicLinearCombination
from fairseq_deep.modules.schemes.gpkd import layer_order, skip_rates


def layers(n, m):
    return ["--encoder-layers", str(n), "--decoder-layers", str(m)]


NO_DROPOUT = ["--dropout", "0", "--attention-dropout", "0", "--activation-dropout", "0"]


def logits(model, batch):
    return model(*batch)[0]


def same_parameters(reference, other):
    other.load_state_dict(reference.state_dict())
    return other


# -- the options off, and in eval mode ------------------------------------------------------------


@pytest.mark.parametrize("arch", ["transformer_prenorm", "transformer_dlcl"])
def test_off_and_eval_mode_are_the_plain_model(arch):
    plain, task = build_model(arch, layers(4, 2))
    batch = random_batch(task.source_dictionary)
    groups = ["--gpkd-encoder-groups", "2", "--gpkd-decoder-groups", "1"]
    for extra, train in (
        (["--gpkd-encoder-groups", "0", "--skip-sublayer-rate", "0"], True),  # off
        (["--gpkd-encoder-groups", "4", "--gpkd-decoder-groups", "2"], True),  # groups of one
        (groups, False),  # eval mode: the natural order
    ):
        other = same_parameters(plain, build_model(arch, layers(4, 2) + extra)[0])
        outs = []
        for model in (plain, other):
            model.train(train)
            torch.manual_seed(3)  # the same dropout masks
            outs.append(logits(model, batch))
        torch.testing.assert_close(outs[1], outs[0], rtol=0, atol=0, msg=str(extra))


def test_layer_order_permutes_within_groups():
    torch.manual_seed(0)
    orders = {tuple(layer_order(6, 2, True)) for _ in range(40)}
    assert len(orders) > 1  # drawn anew per batch
    for order in orders:
        assert sorted(order[:3]) == [0, 1, 2] and sorted(order[3:]) == [3, 4, 5]
    assert layer_order(6, 2, False) is None and layer_order(6, 0, True) is None


@pytest.mark.parametrize("arch", ["transformer_prenorm", "transformer_dlcl"])
def test_training_runs_the_drawn_order(arch):
    """In training the loop runs the layers in :func:`layer_order`'s order: the model equals the
    plain one with its layer list in that order (for DLCL: the history's rows stay with the
    positions, so the entries are recorded in execution order).  Each stack groups by its own
    size (the authors' decoder slices with the encoder's): 3 groups of 2 over 1 group of 4."""
    flags = layers(6, 4) + NO_DROPOUT
    groups = ["--gpkd-encoder-groups", "3", "--gpkd-decoder-groups", "1"]
    model, task = build_model(arch, flags + groups)
    plain = same_parameters(model, build_model(arch, flags)[0])
    batch = random_batch(task.source_dictionary)
    model.train()
    plain.train()
    torch.manual_seed(5)
    out = logits(model, batch)
    torch.manual_seed(5)
    enc, dec = layer_order(6, 3, True), layer_order(4, 1, True)
    assert enc != list(range(6)) and dec != list(range(4))  # seed 5 permutes both
    plain.encoder.layers = nn.ModuleList([plain.encoder.layers[i] for i in enc])
    plain.decoder.layers = nn.ModuleList([plain.decoder.layers[i] for i in dec])
    torch.testing.assert_close(out, logits(plain, batch), rtol=1e-6, atol=1e-6)


# -- Skipping Sub-Layer -----------------------------------------------------------------------------


def test_schedule():
    """p_m = rate * m / S over the S sub-layers of a stack, in the order they run; 0 in layer 1."""
    assert skip_rates(0.4, 0, 4, 2) == (0.0, 0.0)
    assert skip_rates(0.4, 1, 4, 2) == pytest.approx((0.4 * 3 / 8, 0.4 * 4 / 8))
    assert skip_rates(0.4, 3, 4, 3) == pytest.approx((0.4 * 10 / 12, 0.4 * 11 / 12, 0.4))


SKIP = ["--skip-sublayer-rate", "0.4", "--skip-sublayer-stacks", "both"]


@pytest.mark.parametrize("arch", ["transformer_prenorm", "transformer_dlcl"])
def test_inference_scales_each_sublayer_output(arch):
    """Eval mode: x + (1 - p) F(LN(x)), i.e. the plain model with each sub-layer's output
    projection (out_proj, fc2) times 1 - p; deterministic."""
    model, task = build_model(arch, layers(3, 3) + SKIP)
    plain = same_parameters(model, build_model(arch, layers(3, 3))[0])
    with torch.no_grad():
        for side in ("encoder", "decoder"):
            for i, layer in enumerate(getattr(plain, side).layers):
                rates = getattr(model, side).layers[i].skip_rates
                names = ["self_attn.out_proj"] + (
                    ["encoder_attn.out_proj"] if side == "decoder" else []
                )
                for name, rate in zip([*names, "fc2"], rates):
                    linear = layer.get_submodule(name)
                    linear.weight.mul_(1 - rate)
                    linear.bias.mul_(1 - rate)
    batch = random_batch(task.source_dictionary)
    with torch.no_grad():
        first, second = logits(model, batch), logits(model, batch)
        torch.testing.assert_close(first, second, rtol=0, atol=0)
        torch.testing.assert_close(first, logits(plain, batch), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", ["transformer_prenorm", "transformer_dlcl"])
def test_a_skipped_sublayer_passes_its_input_on(arch):
    """Training with every sub-layer above the first layer skipped (p = 1) is the model whose
    upper layers are the identity: for DLCL each still pushes an entry (its input), so the history
    keeps its rows."""
    flags = layers(3, 2) + NO_DROPOUT
    model, task = build_model(arch, flags + SKIP)
    for side in ("encoder", "decoder"):
        for layer in getattr(model, side).layers[1:]:
            layer.skip_rates = (1.0,) * len(layer.skip_rates)

    class Identity(nn.Module):
        def forward(self, x, encoder_padding_mask=None):
            return x

    reference = same_parameters(model, build_model(arch, flags)[0])
    reference.encoder.layers = nn.ModuleList([reference.encoder.layers[0], Identity(), Identity()])
    batch = random_batch(task.source_dictionary)
    model.train()
    reference.train()
    enc = model.encoder(batch[0], src_lengths=batch[1])["encoder_out"][0]
    ref = reference.encoder(batch[0], src_lengths=batch[1])["encoder_out"][0]
    torch.testing.assert_close(enc, ref, rtol=1e-6, atol=1e-6)


def test_one_decision_per_sentence():
    model, task = build_model(
        "transformer_prenorm", layers(4, 1) + NO_DROPOUT + ["--skip-sublayer-rate", "0.5"]
    )
    d = task.source_dictionary
    src, lengths, prev = random_batch(d, bsz=1)
    src, lengths, prev = src.repeat(16, 1), lengths.repeat(16), prev.repeat(16, 1)
    model.train()
    torch.manual_seed(0)
    out = model.encoder(src, src_lengths=lengths)["encoder_out"][0]  # T x B x C
    distinct = {tuple(out[:, b].flatten().tolist()) for b in range(16)}
    assert len(distinct) > 1  # identical sentences, different draws


@pytest.mark.parametrize("arch", ["transformer_prenorm", "transformer_dlcl"])
def test_incremental_batch_invariance_and_bf16(arch):
    from helpers import assert_incremental_equals_full

    model, task = build_model(
        arch, layers(4, 4) + SKIP + ["--gpkd-encoder-groups", "2", "--gpkd-decoder-groups", "2"]
    )
    d = task.source_dictionary
    assert_incremental_equals_full(model, d)
    src, lengths, prev = random_batch(d, bsz=64, seed=1)
    with torch.no_grad():
        batched = logits(model, (src, lengths, prev))
        alone = logits(model, (src[:1, -int(lengths[0]) :], lengths[:1], prev[:1]))
    torch.testing.assert_close(alone, batched[:1], rtol=1e-5, atol=1e-5)
    model = model.to(torch.bfloat16)
    batch = random_batch(d)
    for train in (True, False):
        model.train(train)
        out = logits(model, batch)
        assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    out.float().sum().backward()


# -- refused by name ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "arch,extra,fragment",
    [
        ("transformer_ta", ["--gpkd-encoder-groups", "1"], "not for --arch transformer_ta"),
        (
            "transformer_linear_agg",
            ["--skip-sublayer-rate", "0.1"],
            "not for --arch transformer_linear_agg",
        ),
        ("transformer_postnorm", ["--skip-sublayer-rate", "0.1"], "the encoder is post-norm"),
        (
            "transformer_prenorm",
            ["--gpkd-encoder-groups", "4"],
            "does not divide the encoder's 6 layers",
        ),
        ("transformer_prenorm", ["--skip-sublayer-rate", "1"], "must be in [0, 1)"),
        (
            "transformer_prenorm",
            ["--gpkd-encoder-groups", "2", "--encoder-layerdrop", "0.1"],
            "set --encoder-layerdrop 0",
        ),
        (
            "transformer_dlcl",
            ["--skip-sublayer-rate", "0.2", "--denseformer"],
            "takes no stream-level",
        ),
    ],
)
def test_refused_in_one_line(arch, extra, fragment):
    with pytest.raises(UserError) as caught:
        build_model(arch, extra)
    assert fragment in str(caught.value) and "\n" not in str(caught.value)


# -- the extracted student ------------------------------------------------------------------------


def restricted_encoder(encoder, chosen, src, lengths):
    """The teacher's encoder with only the ``chosen`` layers, written out: the residual stream, or
    DLCL's rows and columns of those layers (Wang et al. Eq. 8/9), then the final norm."""
    padding = src.eq(encoder.padding_idx)
    x, _ = encoder.forward_embedding(src)
    x = (x * (1 - padding.unsqueeze(-1).type_as(x))).transpose(0, 1)
    h, depth = encoder.history, len(encoder.layers)
    dlcl = isinstance(h, DynamicLinearCombination)
    rows, cols = [*chosen, depth], [0, *(j + 1 for j in chosen)]
    entries = [h.entry(0, x) if dlcl else x]

    def combine(g):
        if not dlcl:
            return entries[-1]
        w = h.weight[rows[g], cols[: g + 1]]  # softmax rows: over the entries the row keeps
        w = torch.softmax(w, dim=0) if h.softmax else w
        out = sum(w[k] * entries[k] for k in range(g + 1))
        return out if h.normalize_before else h.norms[rows[g]](out)

    for g, j in enumerate(chosen):
        y = encoder.layers[j](combine(g), encoder_padding_mask=padding)
        entries.append(h.entry(j + 1, y) if dlcl else y)
    out = combine(len(chosen))
    return encoder.layer_norm(out) if encoder.layer_norm is not None else out


def trained_like(model):
    """Parameters away from their initial values (DLCL's rows are not the average)."""
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("history.weight") or name.endswith("norm.bias"):
                p.add_(torch.randn(p.shape, generator=g) * 0.1)


EXTRACT = [
    ("transformer_dlcl", ["--gpkd-encoder-groups", "3", "--skip-sublayer-rate", "0.3"], "last"),
    ("transformer_dlcl_postnorm", ["--gpkd-encoder-groups", "2"], "0"),
    ("transformer_dlcl", ["--gpkd-encoder-groups", "2", "--dlcl-softmax-weights"], "1"),
    ("transformer_prenorm", ["--gpkd-encoder-groups", "2", *SKIP], "first"),
]


@pytest.mark.parametrize("arch,extra,which", EXTRACT, ids=[a for a, *_ in EXTRACT])
def test_student_is_the_teacher_with_the_chosen_layers(arch, extra, which, tmp_path):
    teacher, task = save_tiny(arch, layers(6, 2) + extra, tmp_path / "teacher.pt")
    trained_like(teacher)
    state = torch.load(tmp_path / "teacher.pt", weights_only=True)
    state["model"] = teacher.state_dict()
    torch.save(state, tmp_path / "teacher.pt")
    summary = extract(str(tmp_path / "teacher.pt"), str(tmp_path / "student.pt"), which)
    groups = int(extra[extra.index("--gpkd-encoder-groups") + 1])
    chosen = chosen_layers(6, groups, which, "encoder")
    assert summary["kept"] == {"encoder": chosen, "decoder": [0, 1]}
    from fairseq import checkpoint_utils

    (student,), _ = checkpoint_utils.load_model_ensemble([str(tmp_path / "student.pt")], task=task)
    student.eval()
    assert len(student.encoder.layers) == groups and student.args.skip_sublayer_rate == 0
    src, lengths, prev = random_batch(task.source_dictionary)
    with torch.no_grad():
        expected = restricted_encoder(teacher.encoder, chosen, src, lengths)
        out = student.encoder(src, src_lengths=lengths)
        torch.testing.assert_close(out["encoder_out"][0], expected, rtol=1e-5, atol=1e-5)
        teacher_out = copy.copy(out)
        teacher_out["encoder_out"] = [expected]
        torch.testing.assert_close(
            student.decoder(prev, encoder_out=out)[0],
            teacher.decoder(prev, encoder_out=teacher_out)[0],
            rtol=1e-5,
            atol=1e-5,
        )
    family = "transformer_dlcl"
    if arch == "transformer_prenorm":  # the student (no skipping left) is fairseq's Transformer
        assert why_not_transformer(family, student) is None
        assert "Skipping Sub-Layer" in why_not_transformer(family, teacher)
    else:
        assert why_not_transformer(family, student) is not None


def test_decoder_groups_and_skipping_in_both_stacks(tmp_path):
    flags = layers(4, 4) + ["--gpkd-encoder-groups", "2", "--gpkd-decoder-groups", "2", *SKIP]
    teacher, task = save_tiny("transformer_prenorm", flags, tmp_path / "teacher.pt")
    extract(str(tmp_path / "teacher.pt"), str(tmp_path / "student.pt"), "last")
    from fairseq import checkpoint_utils

    (student,), _ = checkpoint_utils.load_model_ensemble([str(tmp_path / "student.pt")], task=task)
    reference = copy.deepcopy(teacher)  # the chosen layers keep the teacher's inference scales
    reference.encoder.layers = nn.ModuleList([reference.encoder.layers[j] for j in (1, 3)])
    reference.decoder.layers = nn.ModuleList([reference.decoder.layers[j] for j in (1, 3)])
    batch = random_batch(task.source_dictionary)
    with torch.no_grad():
        torch.testing.assert_close(
            logits(student.eval(), batch), logits(reference, batch), rtol=1e-5, atol=1e-5
        )


def run_extract(*argv):
    env = {k: v for k, v in os.environ.items() if k != "FAIRSEQ_DEEP_TRACEBACK"}
    return run_cli(
        sys.executable,
        "-m",
        "fairseq_deep.extract",
        *map(str, argv),
        env=env,
        check=False,
        timeout=300,
    )


def test_bad_input_writes_nothing(tmp_path):
    save_tiny("transformer_ta", layers(4, 2), tmp_path / "ta.pt")
    save_tiny("transformer_prenorm", layers(6, 2), tmp_path / "plain.pt")
    save_tiny("transformer_dlcl_postnorm", layers(6, 2), tmp_path / "post.pt")
    for argv, fragment in (
        (["ta.pt", "--encoder-groups", "2"], "not for transformer_ta"),
        (["plain.pt"], "trained without group permutation"),
        (["plain.pt", "--encoder-groups", "4"], "do not divide into 4 groups"),
        (["plain.pt", "--encoder-groups", "2", "--layer-of-group", "3"], "groups have 3 layers"),
        (
            ["post.pt", "--encoder-groups", "2", "--layer-of-group", "1"],
            "use --layer-of-group first",
        ),
    ):
        proc = run_extract(
            *(tmp_path / a if a.endswith(".pt") else a for a in argv), "--out", tmp_path / "s.pt"
        )
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert "Traceback" not in proc.stderr
        last = proc.stderr.strip().splitlines()[-1]
        assert last.startswith("fairseq-deep-extract: error: ") and fragment in last, last
        assert not (tmp_path / "s.pt").exists()


def test_trains_extracts_and_decodes(synthetic_bin, tmp_path):
    """fairseq-deep-train with group permutation and skipping, the student extracted by the script,
    decoded by fairseq-deep-generate: every test sentence translated."""
    run_cli(
        "fairseq-deep-train",
        str(synthetic_bin),
        "--arch",
        "transformer_dlcl",
        *TINY,
        *layers(4, 2),
        "--gpkd-encoder-groups",
        "2",
        "--skip-sublayer-rate",
        "0.2",
        "--optimizer",
        "adam",
        "--lr",
        "0.002",
        "--max-tokens",
        "2000",
        "--max-update",
        "3",
        "--seed",
        "1",
        "--cpu",
        "--num-workers",
        "0",
        "--no-progress-bar",
        "--no-epoch-checkpoints",
        "--save-dir",
        str(tmp_path / "teacher"),
    )
    proc = run_extract(
        tmp_path / "teacher" / "checkpoint_last.pt", "--out", tmp_path / "student.pt"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "2+2 layers (encoder layers 1, 3 of 4" in proc.stdout, proc.stdout
    out = run_cli(
        "fairseq-deep-generate",
        str(synthetic_bin),
        "--path",
        str(tmp_path / "student.pt"),
        "--gen-subset",
        "test",
        "--beam",
        "2",
        "--batch-size",
        "32",
        "--cpu",
    ).stdout
    assert sum(line.startswith("H-") for line in out.splitlines()) == 101


@pytest.mark.parametrize("arch", ["transformer_prenorm", "transformer_dlcl"])
def test_checkpointed_activations_draw_the_same_order_and_skips(arch):
    """--checkpoint-activations recomputes each layer in backward: the same sub-layers skipped
    (the draw is inside the layer, under the checkpoint's saved random state), the same order."""
    from test_depth import train_step

    flags = layers(3, 3) + SKIP + ["--gpkd-encoder-groups", "1", "--gpkd-decoder-groups", "1"]
    plain, task = build_model(arch, flags)
    checkpointed = same_parameters(
        plain, build_model(arch, flags + ["--checkpoint-activations"])[0]
    )
    batch = random_batch(task.source_dictionary)
    out, grads, _ = train_step(plain, batch)
    out_ck, grads_ck, _ = train_step(checkpointed, batch)
    torch.testing.assert_close(out_ck, out, rtol=0, atol=0)
    assert grads_ck.keys() == grads.keys()
    for name in grads:
        torch.testing.assert_close(grads_ck[name], grads[name], rtol=1e-5, atol=1e-6, msg=name)


def test_the_teacher_is_refused_and_its_pre_norm_student_exports(tmp_path):
    """fairseq-deep-export: a skipping teacher scales its sub-layers at inference (refused, with
    the reason); its extracted pre-norm student is fairseq's Transformer (log-probabilities
    compared by the export itself)."""
    from test_export import TOLERANCE, tiny_export_input

    from fairseq_deep import export as ex

    flags = layers(4, 2) + ["--gpkd-encoder-groups", "2", *SKIP]
    teacher, data = tiny_export_input(tmp_path, "transformer_prenorm", flags)
    with pytest.raises(UserError, match="Skipping Sub-Layer"):
        ex.export(str(teacher), str(data), str(tmp_path / "refused"), "fairseq")
    assert not (tmp_path / "refused").exists()
    extract(str(teacher), str(tmp_path / "student.pt"))
    summary = ex.export(str(tmp_path / "student.pt"), str(data), str(tmp_path / "out"), "fairseq")
    assert summary["max_logprob_difference"] < TOLERANCE


def test_grow_takes_the_new_depths_rates(tmp_path):
    """fairseq-deep-grow copies skipping layers (the grown stack has the new depth's rates) and
    refuses --method identity for a pre-norm one, whose rates at the new depth scale otherwise."""
    from fairseq_deep.grow import grow
    from fairseq_deep.modules.common.growth import GrowError

    flags = layers(2, 2) + ["--skip-sublayer-rate", "0.2", "--gpkd-encoder-groups", "1"]
    _, task = save_tiny("transformer_prenorm", flags, tmp_path / "in.pt")
    grow(str(tmp_path / "in.pt"), str(tmp_path / "grown.pt"), 4)
    from fairseq import checkpoint_utils

    (grown,), _ = checkpoint_utils.load_model_ensemble([str(tmp_path / "grown.pt")], task=task)
    assert grown.encoder.layers[3].skip_rates == pytest.approx((0.2 * 7 / 8, 0.2))
    with pytest.raises(GrowError, match="rates depend on the depth"):
        grow(str(tmp_path / "in.pt"), str(tmp_path / "identity.pt"), 4, method="identity")
    assert not (tmp_path / "identity.pt").exists()


def test_a_depth_named_teacher_gives_a_depth_free_student(tmp_path):
    save_tiny("transformer_prenorm_12l", ["--gpkd-encoder-groups", "3"], tmp_path / "t.pt")
    summary = extract(str(tmp_path / "t.pt"), str(tmp_path / "s.pt"), "last")
    assert summary["student_arch"] == "transformer_prenorm"
    assert summary["kept"]["encoder"] == [3, 7, 11]
    state = torch.load(tmp_path / "s.pt", weights_only=True)
    model = state["cfg"]["model"]
    assert (model.arch, model.encoder_layers, model.gpkd_encoder_groups) == (
        "transformer_prenorm",
        3,
        0,
    )
