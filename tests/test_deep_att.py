"""Deep-Att / Deep-ED with fast-forward connections (Zhou et al. 2016): identities of Sec. 3.1
and 4.3, and the command line (fairseq-train / fairseq-generate) for every preset family."""

import os
import re

import pytest
import torch
from fairseq import options, tasks
from fairseq.optim import build_optimizer
from helpers import PLUGIN_DIR, random_batch, run_cli, tiny_dictionary

from fairseq_deep.models.deep_att.encoder import column_directions
from fairseq_deep.modules.recurrent.fast_forward_lstm import (
    FFLSTMCell,
    FFLSTMStack,
    ff_input,
    reverse_index,
)

H = 8
TINY = [
    "--encoder-embed-dim",
    "8",
    "--decoder-embed-dim",
    "8",
    "--encoder-hidden-size",
    str(H),
    "--decoder-hidden-size",
    str(H),
    "--dropout",
    "0",
]
DEPTH = ["--encoder-layers", "3", "--decoder-layers", "2"]


def build(arch, extra=(), depth=True, seed=1, perturb=True):
    """A tiny model through fairseq's own parser and presets; recurrent parameters (zero at init,
    Sec. 4.3) are perturbed so that the recurrence matters."""
    parser = options.get_training_parser()
    argv = [
        "dummy-data",
        "--task",
        "translation",
        "--arch",
        arch,
        "--cpu",
        *TINY,
        *(DEPTH if depth else ()),
        *extra,
    ]
    args = options.parse_args_and_arch(parser, argv)
    d = tiny_dictionary()
    task = tasks.translation.TranslationTask(args, d, d)
    torch.manual_seed(seed)
    model = task.build_model(args)
    if perturb:
        with torch.no_grad():
            for p in model.parameters():
                if getattr(p, "param_group", None) == "recurrent":
                    p.normal_(0, 0.5)
    return model.eval(), d, args


# ------------------------------------------------------------------------------- the cell, Eq. 4


def eq4_transcription(f, w_r, th_rho, th_phi, th_pi, hidden):
    """Eq. 4 written out, one step and one sentence at a time, with the four blocks of W_r."""
    sig, tanh = torch.sigmoid, torch.tanh
    B = f.size(1)
    out = torch.zeros(f.size(0), B, hidden)
    for b in range(B):
        h, s = torch.zeros(hidden), torch.zeros(hidden)
        for t in range(f.size(0)):
            blocks = [
                f[t, b, i * hidden : (i + 1) * hidden] + w_r[i * hidden : (i + 1) * hidden] @ h
                for i in range(4)
            ]
            z, z_rho, z_phi, z_pi = blocks
            s = tanh(z) * sig(z_rho + s * th_rho) + sig(z_phi + s * th_phi) * s
            h = tanh(s) * sig(z_pi + s * th_pi)
            out[t, b] = h
    return out


def test_cell_is_eq4():
    torch.manual_seed(0)
    cell = FFLSTMCell(H)
    with torch.no_grad():
        cell.weight_r.normal_(0, 0.5)
        cell.theta.normal_(0, 0.5)
    f = torch.randn(6, 3, 4 * H)
    out, (h, s) = cell(f)
    ref = eq4_transcription(f, cell.weight_r, *cell.theta, H)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(h, ref[-1])
    # no input matrix in the cell: only W_r (4H x H) and three vectors, all recurrent, all zero at init
    fresh = FFLSTMCell(H)
    assert {n: tuple(p.shape) for n, p in fresh.named_parameters()} == {
        "weight_r": (4 * H, H),
        "theta": (3, H),
    }
    assert all(p.param_group == "recurrent" and not p.any() for p in fresh.parameters())


# ------------------------------------------------------------------------- Half / Dr, Eq. 6


@pytest.mark.parametrize("mode,width", [("half", 3 * H), ("whole", 5 * H), ("none", H)])
def test_ff_input_wiring(mode, width):
    f, h = torch.randn(4, 2, 4 * H), torch.randn(4, 2, H)
    x = ff_input(f, h, mode)
    assert x.shape == (4, 2, width)
    if mode == "half":  # the FIRST half of f ([z, z_rho]), then h
        torch.testing.assert_close(x, torch.cat([f[..., : 2 * H], h], -1))
    stack = FFLSTMStack(5, H, [False, False, False], ff_mode=mode)
    assert [l.proj.in_features for l in stack.layers] == [5, width, width]


def test_stack_feeds_half_f_and_dropped_h_to_the_next_layer():
    torch.manual_seed(0)
    stack = FFLSTMStack(5, H, [False, True], ff_mode="half", dropout=0.5).train()
    seen = []
    stack.layers[1].proj.register_forward_pre_hook(lambda m, inp: seen.append(inp[0]))
    x = torch.randn(4, 2, 5)
    stack(x, torch.tensor([4, 4]))
    f1, h1, _ = stack.layers[0](x)
    got = seen[0]
    torch.testing.assert_close(got[..., : 2 * H], f1[..., : 2 * H])  # Half(f): not dropped
    dropped = got[..., 2 * H :]  # Dr(h): zero or h / (1 - p)
    kept = dropped != 0
    assert 0 < kept.float().mean() < 1
    torch.testing.assert_close(dropped[kept], 2 * h1[kept])


# --------------------------------------------------------------------- directions, Eq. 3, 5


def test_direction_alternates_with_layer_and_column():
    assert column_directions(4, 0, True) == [False, True, False, True]  # column a1: forward first
    assert column_directions(4, 1, True) == [True, False, True, False]  # column a2: backward first
    assert column_directions(4, 1, False) == [False] * 4  # Uni (Table 4)
    model, _, _ = build("deep_att_ff")
    assert [l.reverse for l in model.encoder.columns[1].layers] == [True, False, True]
    assert [l.reverse for l in model.decoder.stack.layers] == [False, False]  # decoder: forward


def test_reverse_index_keeps_padding_in_place():
    idx = reverse_index(torch.tensor([3, 1, 4]), 4)
    assert idx.t().tolist() == [[2, 1, 0, 3], [0, 1, 2, 3], [3, 2, 1, 0]]


def test_backward_layer_reads_the_future():
    torch.manual_seed(0)
    fwd, bwd = FFLSTMStack(5, H, [False]), FFLSTMStack(5, H, [True])
    for s in (fwd, bwd):
        s.layers[0].cell.weight_r.data.normal_(0, 0.5)
    x = torch.randn(5, 1, 5)
    y = x.clone()
    y[-1] += 1  # change the last word only
    first = lambda s, v: s(v, torch.tensor([5]))[1][0]  # noqa: E731
    torch.testing.assert_close(first(fwd, x), first(fwd, y))
    assert not torch.allclose(first(bwd, x), first(bwd, y))


@pytest.mark.parametrize(
    "arch,extra",
    [
        ("deep_att_ff", []),
        ("deep_ed_ff", []),
        ("deep_att", ["--ff-mode", "whole"]),
        ("deep_att", ["--ff-mode", "none", "--ff-encoder-columns", "1"]),
    ],
)
def test_padding_never_mixes_into_real_positions(arch, extra):
    """A left-padded batch of different lengths gives, at every real position, what each sentence
    gives alone: per-sentence reversal respects lengths in both columns."""
    model, d, _ = build(arch, extra)
    g = torch.Generator().manual_seed(3)
    lengths = [7, 4, 2, 6]
    T = max(lengths)
    src = torch.full((len(lengths), T), d.pad())
    for b, n in enumerate(lengths):
        src[b, T - n :] = torch.randint(d.nspecial, len(d), (n,), generator=g)
    batch = model.encoder(src, torch.tensor(lengths))["encoder_out"][0]
    for b, n in enumerate(lengths):
        alone = model.encoder(src[b : b + 1, T - n :], torch.tensor([n]))["encoder_out"][0]
        got = batch[:, b : b + 1] if arch == "deep_ed_ff" else batch[T - n :, b : b + 1]
        torch.testing.assert_close(got, alone, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------ interface, Eq. 7, 8


def test_interface_sizes_follow_the_paper():
    """Sec. 4.2: c_t has 5120 (Deep-ED) and 1280 (Deep-Att) dimensions at 512 cells."""
    for arch, size in (("deep_att_ff", 1280), ("deep_ed_ff", 5120)):
        args = options.parse_args_and_arch(
            options.get_training_parser(), ["x", "--task", "translation", "--arch", arch]
        )
        from fairseq_deep.models.deep_att.encoder import DeepAttEncoder

        enc = DeepAttEncoder(args, tiny_dictionary(), torch.nn.Embedding(24, 256, padding_idx=1))
        assert enc.output_dim == size
        assert (
            args.encoder_layers,
            args.decoder_layers,
            args.encoder_embed_dim,
            args.encoder_hidden_size,
            args.dropout,
        ) == (9, 7, 256, 512, 0.1)


def test_deep_ed_vector_is_last_and_max():
    model, d, _ = build("deep_ed_ff", ["--encoder-layers", "1"], depth=False)
    src, lengths, _ = random_batch(d, bsz=1, pad_last=False)
    e = model.encoder(src, lengths)["encoder_out"][0][0, 0]
    x = model.encoder.embed_tokens(src).transpose(0, 1)
    f1, h1, _ = model.encoder.columns[0].layers[0](x)
    f2, h2, _ = model.encoder.columns[1].layers[0](x)  # runs backward
    ref = torch.cat(
        [h1[-1, 0], h2[:, 0].max(0).values, f1[:, 0].max(0).values, f2[:, 0].max(0).values]
    )
    torch.testing.assert_close(e, ref)


# ------------------------------------------------------------------------- incremental == full


@pytest.mark.parametrize(
    "arch,extra",
    [
        ("deep_att_ff", []),
        ("deep_ed_ff", []),
        ("deep_att", ["--ff-mode", "whole"]),
        ("deep_att", ["--ff-mode", "none", "--ff-proj-ratio", "1"]),
    ],
)
def test_incremental_decoding_equals_full_pass(arch, extra):
    model, d, _ = build(arch, extra)
    src, lengths, prev = random_batch(d, bsz=3, src_len=7, tgt_len=6)
    full, extra_full = model(src, lengths, prev)
    enc = model.encoder(src, lengths)
    state, steps, attn = {}, [], []
    for t in range(prev.size(1)):
        out, ex = model.decoder(prev[:, : t + 1], enc, incremental_state=state)
        steps.append(out)
        attn.append(ex["attn"][0])
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-5, atol=1e-6)
    if arch != "deep_ed_ff":
        torch.testing.assert_close(torch.cat(attn, 1), extra_full["attn"][0], rtol=1e-5, atol=1e-6)
        assert extra_full["attn"][0][-1, :, :2].abs().max() == 0  # padding gets no attention


def test_beam_search_scores_equal_teacher_forced_scores():
    """Beam search (reorder of encoder_out and incremental state at every step) scores each
    hypothesis exactly as the full forward pass does."""
    from fairseq.sequence_generator import SequenceGenerator

    model, d, _ = build("deep_att_ff", seed=2)
    src, lengths, _ = random_batch(d, bsz=3, src_len=6)
    gen = SequenceGenerator([model], d, beam_size=3, max_len_b=5)
    hyps = gen.forward({"net_input": {"src_tokens": src, "src_lengths": lengths}})
    for b in range(3):
        for hyp in hyps[b]:
            tokens = hyp["tokens"]
            prev = torch.cat([tokens.new_tensor([d.eos()]), tokens[:-1]])[None]
            lprobs = model.get_normalized_probs(
                model(src[b : b + 1], lengths[b : b + 1], prev), True
            )
            ref = lprobs[0].gather(-1, tokens[:, None])[:, 0]
            torch.testing.assert_close(hyp["positional_scores"], ref, rtol=1e-4, atol=1e-5)


def test_reorder_encoder_out_reorders_every_tensor():
    model, d, _ = build("deep_att_ff")
    src, lengths, _ = random_batch(d, bsz=3)
    enc = model.encoder(src, lengths)
    order = torch.tensor([2, 0, 2])
    re = model.encoder.reorder_encoder_out(enc, order)
    ref = model.encoder(src[order], lengths[order])
    for key in ref:
        assert len(re[key]) == len(ref[key])
        for a, b in zip(re[key], ref[key]):
            torch.testing.assert_close(a, b)


# ------------------------------------------------------------------- training technique, Sec. 4.3


def test_initialisation():
    model, _, _ = build("deep_att_ff", perturb=False)
    rec = [p for p in model.parameters() if getattr(p, "param_group", None) == "recurrent"]
    other = torch.cat(
        [p.flatten() for p in model.parameters() if getattr(p, "param_group", None) != "recurrent"]
    )
    assert rec and all(not p.any() for p in rec)
    assert abs(other.std().item() - 0.07) < 0.01 and abs(other.mean().item()) < 0.01
    assert not model.encoder.embed_tokens.weight[1].any()  # padding row


def _optimizer(model, rule="sgd"):
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(
        parser,
        [
            "x",
            "--task",
            "translation",
            "--arch",
            "deep_att_ff",
            "--optimizer",
            "deep_att",
            "--lr",
            "4e-5",
            "--lr-recurrent",
            "5e-4",
            "--l2-strength",
            "2",
            "--update-rule",
            rule,
        ],
    )
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    cfg = convert_namespace_to_omegaconf(args)
    return build_optimizer(cfg.optimizer, list(model.parameters()))


def test_parameter_groups_get_their_learning_rates_and_eq12():
    model, _, _ = build("deep_att_ff")
    opt = _optimizer(model)
    groups = {g["name"]: g for g in opt.param_groups}
    assert set(groups) == {"feedforward", "embedding", "recurrent"}
    assert (groups["feedforward"]["lr"], groups["embedding"]["lr"]) == (4e-5, 4e-5)
    assert groups["recurrent"]["lr"] == pytest.approx(5e-4)
    assert (
        groups["feedforward"]["weight_decay"],
        groups["embedding"]["weight_decay"],
        groups["recurrent"]["weight_decay"],
    ) == (2.0, 0.0, 2.0)
    rec = {id(p) for p in groups["recurrent"]["params"]}
    assert rec == {id(p) for n, p in model.named_parameters() if "weight_r" in n or "theta" in n}
    emb = {id(p) for p in groups["embedding"]["params"]}
    assert emb == {id(model.encoder.embed_tokens.weight), id(model.decoder.embed_tokens.weight)}
    # the scheduler's set_lr keeps the ratio l_r / l_f
    opt.set_lr(2e-5)
    assert opt.get_lr() == 2e-5
    assert groups["recurrent"]["lr"] == pytest.approx(2.5e-4)
    # one step is Eq. 12: v <- v - l (g + r v), embeddings without r
    params = {
        "ff": model.decoder.output_projection.weight,
        "emb": model.encoder.embed_tokens.weight,
        "rec": model.decoder.stack.layers[0].cell.weight_r,
    }
    before = {k: p.detach().clone() for k, p in params.items()}
    for p in model.parameters():
        p.grad = torch.full_like(p, 0.5)
    opt.step()
    for key, lr, r in (("ff", 2e-5, 2.0), ("emb", 2e-5, 0.0), ("rec", 2.5e-4, 2.0)):
        torch.testing.assert_close(params[key].detach(), before[key] - lr * (0.5 + r * before[key]))


def test_adam_rule_decays_outside_adam():
    model, _, _ = build("deep_att_ff")
    opt = _optimizer(model, "adam")
    w = model.decoder.output_projection.weight
    before = w.detach().clone()
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()  # zero gradient: Adam's step is 0, only the decay of Eq. 12 acts
    torch.testing.assert_close(w.detach(), before * (1 - 4e-5 * 2.0))


# ----------------------------------------------------------------------------- presets, options


def test_presets_fix_what_their_name_says():
    def parse(*argv):
        return options.parse_args_and_arch(
            options.get_training_parser(), ["x", "--task", "translation", *argv]
        )

    a = parse("--arch", "deep_att_ff_5x3")
    assert (a.encoder_layers, a.decoder_layers, a.ff_mode, a.ff_encoder_columns) == (
        5,
        3,
        "half",
        2,
    )
    a = parse("--arch", "deep_att_ff_9x7_1col_w1024")
    assert (a.ff_encoder_columns, a.encoder_hidden_size, a.encoder_embed_dim) == (1, 1024, 256)
    a = parse("--arch", "deep_att_noff_2x2")
    assert (a.ff_mode, a.ff_proj_ratio) == ("none", 1)
    a = parse("--arch", "deep_att_ff", "--encoder-layers", "4")  # unnamed depth: the flag wins
    assert a.encoder_layers == 4
    assert parse("--arch", "deep_ed_ff_uni").ff_encoder_directions == "forward"
    with pytest.raises(ValueError, match="--encoder-layers"):
        parse("--arch", "deep_att_ff_2x2", "--encoder-layers", "3")
    with pytest.raises(ValueError, match="--ff-mode"):
        parse("--arch", "deep_att_noff_1x1", "--ff-mode", "half")


# ---------------------------------------------------------------------------- the command line

TRAIN = [
    "--task",
    "translation",
    "--source-lang",
    "src",
    "--target-lang",
    "tgt",
    "--cpu",
    "--user-dir",
    PLUGIN_DIR,
    "--optimizer",
    "deep_att",
    "--lr",
    "0.01",
    "--lr-recurrent",
    "0.02",
    "--l2-strength",
    "0.01",
    "--batch-size",
    "32",
    "--max-update",
    "4",
    "--save-interval-updates",
    "2",
    "--no-epoch-checkpoints",
    "--log-format",
    "simple",
    "--log-interval",
    "1",
    "--seed",
    "1",
    "--num-workers",
    "0",
    "--disable-validation",
    *TINY,
]
GEN = [
    "--task",
    "translation",
    "--source-lang",
    "src",
    "--target-lang",
    "tgt",
    "--cpu",
    "--user-dir",
    PLUGIN_DIR,
    "--gen-subset",
    "test",
    "--beam",
    "3",
    "--batch-size",
    "16",
    "--max-len-b",
    "10",
    "--num-workers",
    "0",
]


def _hyps(stdout):
    return sorted(
        re.findall(r"^H-(\d+)\t(\S+)\t(.*)$", stdout, flags=re.M), key=lambda h: int(h[0])
    )


@pytest.mark.parametrize(
    "arch,extra",
    [
        ("deep_att_ff_2x2", []),  # Deep-Att with F-F (Tables 2, 5)
        ("deep_att_noff_1x1", []),  # without F-F: Bahdanau's model (Table 2)
        ("deep_ed_ff_uni", ["--encoder-layers", "2", "--decoder-layers", "2"]),  # Deep-ED, Uni
    ],
)
def test_cli_train_generate(synthetic_bin, tmp_path, arch, extra):
    save = tmp_path / "ckpt"
    proc = run_cli(
        "fairseq-train", str(synthetic_bin), "--arch", arch, *extra, *TRAIN, "--save-dir", str(save)
    )
    losses = [float(x) for x in re.findall(r"\| loss ([\d.]+)", proc.stdout + proc.stderr)]
    assert losses and all(x == x for x in losses)
    assert "deep_att optimizer groups" in proc.stdout + proc.stderr
    out = run_cli(
        "fairseq-generate", str(synthetic_bin), "--path", str(save / "checkpoint_last.pt"), *GEN
    )
    assert len(_hyps(out.stdout)) == 101
    if arch == "deep_att_ff_2x2":  # an ensemble of two checkpoints (Sec. 4.4.2)
        a, b = save / "checkpoint_1_2.pt", save / "checkpoint_last.pt"
        assert os.path.exists(a)
        both = run_cli("fairseq-generate", str(synthetic_bin), "--path", f"{a}:{b}", *GEN)
        assert len(_hyps(both.stdout)) == 101
        assert "Generate test with beam=3" in both.stdout + both.stderr


def test_ensemble_of_a_model_with_itself_is_the_model():
    """What fairseq-generate --path a.pt:b.pt runs (EnsembleModel, with our incremental state and
    encoder_out reordering): the same model twice gives the single model's hypotheses."""
    from fairseq.sequence_generator import SequenceGenerator

    model, d, _ = build("deep_att_ff", seed=3)
    src, lengths, _ = random_batch(d, bsz=4, src_len=6)
    sample = {"net_input": {"src_tokens": src, "src_lengths": lengths}}
    one = SequenceGenerator([model], d, beam_size=3, max_len_b=6).forward(sample)
    two = SequenceGenerator([model, model], d, beam_size=3, max_len_b=6).forward(sample)
    for h1, h2 in zip(one, two):
        assert [h["tokens"].tolist() for h in h1] == [h["tokens"].tolist() for h in h2]
        torch.testing.assert_close(
            torch.stack([h["score"] for h in h1]), torch.stack([h["score"] for h in h2])
        )
