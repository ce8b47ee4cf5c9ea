"""fairseq-deep-study: system parsing, the built-in groups, their commands, and one
end-to-end run of two tiny systems (real fairseq-train / fairseq-generate subprocesses) that a
second invocation does not retrain (its results read back: tests/test_study_results.py)."""

import json
import os

import pytest

from fairseq_deep import runs, study
from fairseq_deep.models import families
from fairseq_deep.study import UserError


def test_parse_system_splits_with_shlex():
    s = study.parse_system("dlcl=transformer_dlcl --encoder-layers 12 --adam-betas '(0.9, 0.98)'")
    assert (s.name, s.arch, s.group) == ("dlcl", "transformer_dlcl", study.CUSTOM)
    assert s.flags == ["--encoder-layers", "12", "--adam-betas", "(0.9, 0.98)"]
    assert s.depth == 12 and s.key == "custom/dlcl"
    assert study.parse_system("deep=transformer_dlcl_30l").depth == 30
    assert study.parse_system("x=transformer_dlcl --encoder-layers=8").depth == 8
    assert study.parse_system("x=rnmt_plus").depth is None
    for bad in ("transformer_dlcl", "=transformer", "a b=transformer", "x=transformer --arch y"):
        with pytest.raises(UserError):
            study.parse_system(bad)


def test_groups_use_registered_archs_and_name_their_baseline():
    from fairseq.models import ARCH_MODEL_REGISTRY

    for name in study.GROUPS:
        baseline, systems = study.expand_group(name)
        names = [s.name for s in systems]
        assert baseline in names and len(set(names)) == len(names), name
        assert all(s.arch in ARCH_MODEL_REGISTRY and s.group == name for s in systems), name
    _, wang = study.expand_group("wang")
    assert {s.arch for s in wang if s.depth == 6} == {
        "transformer_postnorm",
        "transformer_prenorm",
        "transformer_dlcl",
        "transformer_dlcl_postnorm",
    }
    assert {s.depth for s in wang} == {6, 12, 16, 20, 25, 30} and len(wang) == 24
    assert any(s.arch == "transformer_ta_nores_16l" for s in study.expand_group("bapna")[1])
    assert any(
        "label_smoothed_cross_entropy_with_diversity" in s.flags
        for s in study.expand_group("dou")[1]
    )


def test_group_subsets_and_depths_keep_the_baseline():
    baseline, systems = study.expand_group("wang", depths=[20])
    assert baseline == "postnorm_6"
    assert [s.name for s in systems] == [
        "postnorm_6",
        "postnorm_20",
        "prenorm_20",
        "dlcl_20",
        "dlcl_postnorm_20",
    ]
    baseline, systems = study.expand_group("dou:hierarchical,mla2")
    assert [s.name for s in systems] == ["baseline", "hierarchical", "mla2"]
    assert len(study.expand_group("zhou", depths=[6, 20])[1]) == 4  # its own depths, 2 and 5
    odd = {s.name: (s.arch, s.flags) for s in study.expand_group("bapna", depths=[8])[1]}
    assert odd["ta_8"] == ("transformer_ta", ["--encoder-layers", "8"])  # no _8l preset
    assert [s.name for s in study.expand_group("zhou:ff_5x3")[1]] == ["noff_2x2", "ff_5x3"]
    with pytest.raises(UserError, match="no system nope"):
        study.expand_group("dou:nope")
    with pytest.raises(UserError, match="unknown group"):
        study.expand_group("vaswani")


def test_width_flags_per_family():
    assert (
        study.width_flags("transformer_dlcl_20l", 256)[
            study.width_flags("transformer_dlcl_20l", 256).index("--encoder-ffn-embed-dim") + 1
        ]
        == "1024"
    )
    assert "--encoder-attention-heads" in study.width_flags("transformer_dlcl", 512)
    assert study.width_flags("rnmt_plus_512", 64) == [
        "--encoder-embed-dim",
        "64",
        "--decoder-embed-dim",
        "64",
        "--encoder-hidden-size",
        "64",
        "--decoder-hidden-size",
        "64",
    ]
    assert study.width_flags("deep_att_ff_5x3", 64)[:2] == ["--encoder-embed-dim", "32"]
    assert study.width_flags("transformer_dlcl", None) == []


def test_train_command_leaves_groups_a_system_names_to_it():
    args = study.get_parser().parse_args(
        [
            "--data",
            "D",
            "--out",
            "O",
            "--max-update",
            "10",
            "--cpu",
            "--train-args",
            "--clip-norm 1",
        ]
    )
    args.train_args_list, args.gen_args_list = ["--clip-norm", "1"], []
    plain = study.train_command(args, study.parse_system("a=transformer_dlcl"), 3, "S")
    assert (
        plain[plain.index("--optimizer") + 1] == "adam" and plain[plain.index("--seed") + 1] == "3"
    )
    assert plain[plain.index("--criterion") + 1] == "label_smoothed_cross_entropy"
    assert (
        plain[-2:] == ["--clip-norm", "1"] and "--cpu" in plain and "--stop-time-hours" not in plain
    )
    own = study.train_command(
        args,
        study.parse_system("b=deep_att_ff --optimizer deep_att --criterion sentence_cross_entropy"),
        1,
        "S",
    )
    assert "--adam-betas" not in own and "--label-smoothing" not in own
    assert own[-4:] == ["--optimizer", "deep_att", "--criterion", "sentence_cross_entropy"]


def test_study_end_to_end_and_resume(synthetic_bin, tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    out = tmp_path / "study"
    argv = [
        "--data",
        str(synthetic_bin),
        "--out",
        str(out),
        "--cpu",
        "--width",
        "16",
        "--max-update",
        "4",
        "--valid-interval",
        "2",
        "--log-interval",
        "1",
        "--warmup",
        "2",
        "--jobs",
        "2",
        "--seeds",
        "1",
        "--beam",
        "2",
        "--gen-args",
        "--max-len-a 0 --max-len-b 12",
        "--bootstrap-samples",
        "100",
        "--progress-every",
        "5",
        "--system",
        "pre=transformer_prenorm --encoder-layers 2 --decoder-layers 1",
        "--system",
        "ta=transformer_ta --encoder-layers 3 --decoder-layers 1 --task translation_deep "
        "--log-grad-norm-ratio",
    ]
    assert study.main(argv) == 0
    results = json.loads((out / "results.json").read_text())
    group = results["groups"]["custom"]
    assert group["baseline"] == "pre" and set(group["systems"]) == {"pre", "ta"}
    n_test = results["settings"]["test_size"]
    assert n_test == 101
    for name, row in group["systems"].items():
        seed = row["seeds"]["1"]
        assert seed["sentences"] == n_test and seed["updates"] == 4, name
        assert 0 <= seed["bleu"] <= 100 and row["bleu_mean"] == seed["bleu"]
        # the learning curve: a validation every 2 updates, each at a time, and the update rate
        assert [u for u, _, _ in seed["curve"]] == [2, 4] and all(
            t > 0 for _, t, _ in seed["curve"]
        ), name
        assert seed["updates_per_second"] > 0 and row["recipe"].startswith("Adam (0.9, 0.98)"), name
        # every validation's record says when it ran, however fast the machine (patches/validation_time)
        log = runs.parse_log(str(out / "runs" / "custom" / name / "seed1" / "train.log"))
        valid = [r for r in log if r["kind"] == "valid"]
        assert len(valid) == 2 and all(r["wall"] > 0 for r in valid), name
        hyp = (out / "runs" / "custom" / name / "seed1" / "hyp.txt").read_text().splitlines()
        assert len(hyp) == n_test
    assert set(group["systems"]["ta"]["paired_bs"]["1"]) == {"bleu_p", "chrf_p"}
    assert group["systems"]["ta"]["depth"] == 3
    md = (out / "results.md").read_text()
    assert "| pre | `transformer_prenorm` |" in md and "| ta | `transformer_ta` |" in md
    plots = sorted(os.listdir(out / "plots"))
    assert {
        "bleu_depth_custom.png",
        "valid_loss_custom.png",
        "valid_loss_seconds_custom.png",
        "grad_norm_ratio_custom.png",
    } <= set(plots)

    logs = {
        n: (out / "runs" / "custom" / n / "seed1" / "train.log").stat().st_mtime_ns
        for n in ("pre", "ta")
    }
    assert study.main(argv) == 0  # resumes: nothing is trained or decoded again
    assert {
        n: (out / "runs" / "custom" / n / "seed1" / "train.log").stat().st_mtime_ns
        for n in ("pre", "ta")
    } == logs
    assert json.loads((out / "results.json").read_text())["groups"] == results["groups"]


def test_custom_systems_named_by_depth_share_a_technique():
    assert study.parse_system("dlcl_20=transformer_dlcl_20l").technique == "dlcl"
    assert study.parse_system("dlcl-12=transformer_dlcl --encoder-layers 12").technique == "dlcl"
    assert study.parse_system("mla2=transformer_mla2").technique == "mla2"


def test_train_args_depth_counts_for_systems_without_their_own():
    args = study.get_parser().parse_args(
        [
            "--data",
            "D",
            "--out",
            "O",
            "--max-update",
            "1",
            "--system",
            "a=transformer_dlcl",
            "--system",
            "b=transformer_dlcl_20l",
        ]
    )
    args.train_args_list = ["--encoder-layers", "3"]
    systems = study.select_groups(args)[study.CUSTOM][1]
    assert [s.depth for s in systems] == [3, 20]


def test_depth_group_has_every_scheme_at_n_plus_n_layers():
    """The depth group: post-norm (the baseline), pre-norm, DLCL, DeepNorm, Admin, DS-Init, ReZero,
    each with N encoder and N decoder layers (a named preset only where it has N + N)."""
    from helpers import parse_model_args

    baseline, systems = study.expand_group("depth", depths=[6, 18, 60])
    assert baseline == "postnorm_6"
    prefixes = ["postnorm", "prenorm", "dlcl", "deepnorm", "admin", "dsinit", "rezero"]
    assert [s.name for s in systems] == [f"{p}_{n}" for p in prefixes for n in (6, 18, 60)]
    by_name = {s.name: s for s in systems}
    assert (by_name["deepnorm_18"].arch, by_name["deepnorm_18"].flags) == (
        "transformer_deepnorm_18l",
        [],
    )
    assert (by_name["postnorm_6"].arch, by_name["postnorm_6"].flags) == ("transformer_postnorm", [])
    # transformer_admin_60l is Liu et al.'s 60 + 12: not N + N, so the depth-free preset with flags
    assert (by_name["admin_60"].arch, by_name["admin_60"].flags) == (
        "transformer_admin",
        ["--encoder-layers", "60", "--decoder-layers", "60"],
    )
    assert {s.technique for s in systems} == {
        "post-norm",
        "pre-norm",
        "DLCL",
        "DeepNorm",
        "Admin",
        "DS-Init",
        "ReZero",
    }
    scheme = {"deepnorm": "deepnorm", "admin": "admin", "dsinit": "ds_init", "rezero": "rezero"}
    for s in systems:
        args = parse_model_args(
            s.arch, s.flags
        )  # fairseq's parser and the preset, as fairseq-train
        prefix, n = s.name.rsplit("_", 1)
        assert (args.encoder_layers, args.decoder_layers, s.depth, s.group) == (
            int(n),
            int(n),
            int(n),
            "depth",
        ), s.name
        assert args.encoder_normalize_before == (prefix in ("prenorm", "dlcl")), s.name
        assert args.dlcl_stacks == ("both" if prefix == "dlcl" else "none"), s.name
        for name, option in scheme.items():
            assert bool(getattr(args, option, False)) == (prefix == name), (s.name, option)
    default = [s.name for s in study.expand_group("depth")[1]]
    assert default == [f"{p}_{n}" for p in prefixes for n in (6, 18)]
    assert [s.name for s in study.expand_group("depth:deepnorm_18,admin_18")[1]] == [
        "postnorm_6",
        "deepnorm_18",
        "admin_18",
    ]


MODERN = [
    "prenorm",
    "dlcl",
    "deepnorm",
    "b2t",
    "subln",
    "periln",
    "mixln",
    "dyt",
    "layerscale",
    "denseformer",
    "hc",
    "mhc",
    "resi_dual",
    "ode_rk2",
    "ode_rk4",
]


def test_modern_group_puts_every_scheme_at_each_shape(capsys):
    """Issue 41: the modern group, its lines declared beside the presets (sweeps["modern"]): the
    schemes after 2022 against pre-norm, DLCL and DeepNorm at 18 + 18 and 48 + 6 (or --depths):
    each system has the shape its name says and its scheme on (fairseq's parser and the preset, as
    fairseq-train), a depth-named preset only where its shape is the system's; pre-norm at the
    first shape is the baseline.  --dry-run prints one fairseq-train command per system."""
    from helpers import parse_model_args

    baseline, systems = study.expand_group("modern")
    assert baseline == "prenorm_18+18"
    assert [s.name for s in systems] == [f"{p}_{n}" for p in MODERN for n in ("18+18", "48+6")]
    by_name = {s.name: s for s in systems}
    assert (by_name["b2t_18+18"].arch, by_name["b2t_18+18"].flags) == ("transformer_b2t_18l", [])
    assert (by_name["hc_48+6"].arch, by_name["hc_48+6"].flags) == ("transformer_hc_48l", [])
    assert (by_name["b2t_48+6"].arch, by_name["b2t_48+6"].flags) == (
        "transformer_b2t",
        ["--encoder-layers", "48"],
    )
    scheme = {  # prefix: (option, value when on)
        "deepnorm": ("deepnorm", True),
        "b2t": ("b2t", True),
        "subln": ("subln", True),
        "periln": ("peri_ln", True),
        "mixln": ("mix_ln_ratio", "0.25"),
        "dyt": ("dyt", True),
        "layerscale": ("layerscale", True),
        "denseformer": ("denseformer", True),
        "hc": ("hyper_connections", "dynamic"),
        "mhc": ("hyper_connections", "mhc"),
        "resi_dual": ("resi_dual", True),
        "ode_rk2": ("ode_method", "rk2"),
        "ode_rk4": ("ode_method", "rk4"),
    }
    post = ("deepnorm", "b2t", "resi_dual")
    for s in systems:
        args = parse_model_args(s.arch, s.flags)
        prefix, shape = s.name.rsplit("_", 1)
        encoder, decoder = map(int, shape.split("+"))
        assert (args.encoder_layers, args.decoder_layers, s.depth) == (encoder, decoder, encoder)
        assert (s.group, s.technique) == ("modern", dict(zip(MODERN, TECHNIQUES))[prefix])
        assert args.encoder_normalize_before == (prefix not in post), s.name
        assert args.dlcl_stacks == ("both" if prefix == "dlcl" else "none"), s.name
        for name, (option, on) in scheme.items():
            assert (getattr(args, option, None) == on) == (prefix == name), (s.name, option)
    baseline, systems = study.expand_group("modern:hc_12+6,b2t_12+6", depths=[(12, 6)])
    assert (baseline, [s.name for s in systems]) == (
        "prenorm_12+6",
        ["prenorm_12+6", "b2t_12+6", "hc_12+6"],
    )
    assert [s.name for s in study.expand_group("modern", depths=[24])[1]][:2] == [
        "prenorm_24",
        "dlcl_24",
    ]  # N: N + N layers, as the depth group
    assert (
        study.main(
            ["--data", "D", "--out", "O", "--minutes", "4", "--width", "128", "--cpu", "--dry-run"]
            + ["--group", "modern:ode_rk2_12+6,deepnorm_12+6", "--depths", "12+6"]
        )
        == 0
    )
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == [
        "modern/prenorm_12+6",
        "modern/deepnorm_12+6",
        "modern/ode_rk2_12+6",
    ]
    archs = [line.split()[line.split().index("--arch") + 1] for line in lines]
    assert archs == ["transformer_prenorm_12l", "transformer_deepnorm", "transformer_ode_rk2"]
    assert all("--stop-time-hours 0.0666667" in line and "--cpu" in line for line in lines)
    assert lines[1].endswith("--encoder-layers 12")


TECHNIQUES = [
    "pre-norm",
    "DLCL",
    "DeepNorm",
    "B2T",
    "Sub-LN",
    "Peri-LN",
    "Mix-LN",
    "DyT",
    "LayerScale",
    "DenseFormer",
    "HC",
    "mHC",
    "ResiDual",
    "ODE RK2",
    "ODE RK4",
]


def test_depths_take_shapes_and_a_sweep_uses_presets_of_its_shape_only():
    """--depths 6,18+18,48+6: N or E+D; a shape makes PREFIX_E+D in any sweep; an encoder sweep
    (wang) at a depth whose preset has another shape (transformer_b2t_18l is 18 + 18) sets the
    depth with a flag instead; the grown group takes encoder depths only."""
    from fairseq_deep.study.systems import depth_system

    assert study.parse_depths("6,18+18, 48 + 6") == [6, (18, 18), (48, 6)]
    for bad in ("6,,18", "18x18", "0", "18+0", "a"):
        with pytest.raises(UserError, match="--depths"):
            study.parse_depths(bad)
    _, wang = study.expand_group("wang:prenorm_20+6,dlcl_12+12", depths=[(20, 6), (12, 12)])
    assert [(s.name, s.arch, s.flags) for s in wang] == [
        ("postnorm_6", "transformer_postnorm", []),  # the group's baseline, always kept
        ("prenorm_20+6", "transformer_prenorm_20l", []),
        ("dlcl_12+12", "transformer_dlcl", ["--encoder-layers", "12", "--decoder-layers", "12"]),
    ]
    b2t = depth_system("b2t_18", "transformer_b2t", 18, "x", "B2T")
    assert (b2t.arch, b2t.flags) == ("transformer_b2t", ["--encoder-layers", "18"])
    with pytest.raises(UserError, match="--group li grows the encoder"):
        study.expand_group("li", depths=[6, (12, 6)])


def _parse(*extra):
    args = study.get_parser().parse_args(
        [
            "--data",
            "D",
            "--out",
            "O",
            "--max-update",
            "10",
            "--lr",
            "2e-3",
            "--warmup",
            "320",
            *extra,
        ]
    )
    args.train_args_list, args.gen_args_list = [], []
    return args


def _value(cmd, option):
    """The value fairseq reads for an option: the last one given."""
    return cmd[len(cmd) - 1 - cmd[::-1].index(option) + 1]


def test_paper_recipe_per_family_by_default():
    """Issue 25: RNMT+ trains with Chen et al.'s Adam and Eq. 1, peaking at 3.2 x --lr (the paper's
    RNMT+ peak, 32 x 1e-4, over its Transformer-Base peak, 9.9e-4: before the fix it peaked at --lr);
    Deep-Att and every other system (and every system under --recipe shared) with the study's
    Adam + inverse_sqrt (Zhou et al.'s fixed 4e-5 hardly trains in a study's budget); a system's own
    --optimizer / --lr-scheduler still wins."""
    from fairseq_deep.optim.rnmt_lr_scheduler import rnmt_plus_lr

    args = _parse()
    rnmt = study.train_command(args, study.parse_system("r=rnmt_plus"), 1, "S")
    assert _value(rnmt, "--adam-betas") == "(0.9, 0.999)" and _value(rnmt, "--adam-eps") == "1e-6"
    assert _value(rnmt, "--lr-scheduler") == "rnmt_plus" and "--warmup-init-lr" not in rnmt
    n, base, p = (
        int(_value(rnmt, "--rnmt-replicas")),
        float(_value(rnmt, "--rnmt-base-lr")),
        int(_value(rnmt, "--warmup-updates")),
    )
    peak = 3.2 * 2e-3
    assert float(_value(rnmt, "--lr")) == pytest.approx(peak)
    # Eq. 1 as mapped: linear from peak/n up to 3.2 x --lr over --warmup updates, then constant
    assert rnmt_plus_lr(0, base, n, p) == pytest.approx(peak / 32)
    assert rnmt_plus_lr(320, base, n, p) == pytest.approx(peak)
    assert rnmt_plus_lr(5000, base, n, p) == pytest.approx(peak)
    assert rnmt_plus_lr(160, base, n, p) < peak
    # at the study's default --lr 1e-3, Eq. 1's base is the paper's own 1e-4
    default = study.train_command(_parse("--lr", "1e-3"), study.parse_system("r=rnmt_plus"), 1, "S")
    assert float(_value(default, "--rnmt-base-lr")) == pytest.approx(1e-4)
    shared = [
        "--optimizer",
        "adam",
        "--adam-betas",
        "(0.9, 0.98)",
        "--adam-eps",
        "1e-8",
        "--lr",
        "0.002",
        "--lr-scheduler",
        "inverse_sqrt",
        "--warmup-updates",
        "320",
        "--warmup-init-lr",
        "1e-07",
    ]
    for arch in ("transformer_prenorm", "transformer_mla2", "hybrid_cascaded", "deep_att_ff_5x3"):
        cmd = study.train_command(args, study.parse_system("t=" + arch), 1, "S")
        assert cmd[cmd.index("--optimizer") : cmd.index("--optimizer") + len(shared)] == shared, (
            arch
        )
        assert "deep_att" not in cmd[cmd.index("--optimizer") + 1], arch
    for arch in ("rnmt_plus", "deep_att_ff_5x3"):  # --recipe shared: the study's recipe for all
        cmd = study.train_command(
            _parse("--recipe", "shared"), study.parse_system("x=" + arch), 1, "S"
        )
        assert cmd[cmd.index("--optimizer") : cmd.index("--optimizer") + len(shared)] == shared, (
            arch
        )
    own = study.train_command(args, study.parse_system("o=rnmt_plus --optimizer adafactor"), 1, "S")
    assert (
        own.count("--optimizer") == 1
        and "--adam-betas" not in own
        and _value(own, "--lr") == "0.002"
    )
    # Zhou et al.'s optimiser, named by the system: its flags, no recipe's
    zhou = study.train_command(
        args,
        study.parse_system("z=deep_att_ff_2x2 --optimizer deep_att --lr 4e-5 --lr-scheduler fixed"),
        1,
        "S",
    )
    assert _value(zhou, "--optimizer") == "deep_att" and _value(zhou, "--lr") == "4e-5"
    assert "inverse_sqrt" not in zhou
    assert (
        study.recipe_text(args, families.spec("rnmt_plus"))
        == "Adam (0.9, 0.999, 1e-6), Eq. 1 (n = 32) to lr 0.0064"
    )
    assert study.recipe_text(args, families.spec("deep_att_ff_5x3")).startswith(
        "Adam (0.9, 0.98), inverse_sqrt"
    )
    assert study.recipe_text(args, families.spec("transformer_prenorm")).startswith(
        "Adam (0.9, 0.98), inverse_sqrt"
    )
    assert (
        study.recipe_text(args, families.spec("rnmt_plus"), ["--lr-scheduler", "fixed"])
        == "own flags"
    )


def test_a_training_runs_progress_line_has_progress_pys_eta(tmp_path):
    import argparse
    import re
    import time

    runner = study.Study.__new__(study.Study)  # no data: only the progress line
    runner.args = argparse.Namespace(max_update=100, minutes=0)
    run = study.RunState(
        study.parse_system("pre=transformer_prenorm"),
        1,
        str(tmp_path),
        status="training",
        started=time.time() - 10,
        start_update=0,
    )
    (tmp_path / "train.log").write_text(
        'x | INFO | train_inner | {"loss": "5.0", "num_updates": "10"}\n'
    )
    line = runner.progress_line(run)
    assert line.startswith("custom/pre seed 1: training, update 10/100, ETA 0:01:")
    assert re.search(r"ETA 0:01:\d\d \(--max-update 100\)$", line), line
    runner.args = argparse.Namespace(max_update=0, minutes=2)
    assert runner.progress_line(run).endswith("(--stop-time-hours 0.0333333)")


def test_epoch_validation_patience_and_precision_per_system():
    """Issue 38: ``--valid-interval epoch`` leaves fairseq's per-epoch validation and saving (no
    update interval), ``--patience`` is fairseq's, ``--precision`` gives every system its training
    flag and fairseq-generate the decoding one, and a system naming its own precision keeps it."""
    args = _parse("--valid-interval", "epoch", "--patience", "3", "--precision", "fp16")
    plain = study.train_command(args, study.parse_system("a=transformer_dlcl"), 1, "S")
    assert "--validate-interval-updates" not in plain and "--save-interval-updates" not in plain
    assert _value(plain, "--patience") == "3" and "--no-epoch-checkpoints" in plain
    assert "--fp16" in plain and "--amp" not in plain
    own = study.parse_system("b=rnmt_plus --amp")
    amp = study.train_command(args, own, 1, "S")
    assert "--amp" in amp and "--fp16" not in amp
    assert study.commands.precision(args, own) == "amp"
    decode = study.generate_command(args, "C", study.commands.precision(args, own))
    assert "--fp16" in decode  # fairseq-generate has no --amp: AMP-trained models decode in fp16
    every = study.train_command(_parse("--valid-interval", "7"), own, 1, "S")
    assert _value(every, "--validate-interval-updates") == "7" and "--patience" not in every
    assert "--fp16" not in every and "--bf16" not in study.generate_command(_parse(), "C")
    with pytest.raises(SystemExit):
        _parse("--valid-interval", "often")
