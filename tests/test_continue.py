"""Continuing training without surprises (issue 32): restoring a checkpoint compares every
architecture option of our models with the checkpoint's and refuses a difference in one line
naming each option and both values (a head count keeps every tensor's shape), options that may
change when training goes on pass; the options of a checkpoint written out as a command line
parse back to exactly those options (``fairseq-deep-grow``'s next command, ``--model-from``); a
grown checkpoint does not spend the next run's time budget unless asked to."""

import os
import re
import shlex
import sys

import pytest
import torch
from fairseq import options
from fairseq.models import MODEL_REGISTRY
from helpers import PLUGIN_DIR, TINY, parse_model_args, run_cli
from test_grow import SAME, layers, save_tiny

from fairseq_deep import model_options
from fairseq_deep.checkpoints import saved_model_options
from fairseq_deep.errors import CheckpointError
from fairseq_deep.grow import grow
from fairseq_deep.models import families


def rows():
    """Every model family (models/families.py)."""
    return [family.name for family in families.registered()]


FAMILIES = rows()
DESIGN = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "design.md"
)


# -- which options are the architecture --------------------------------------------------------------


def test_every_option_is_declared_once_and_the_doc_names_the_ones_that_may_change():
    fields = model_options.our_fields()
    for name, declared in fields.items():  # an option composed into several families: one answer
        assert len({f.metadata.get("architecture", True) for f in declared}) == 1, name
    may_change = {name for name in fields if not model_options.is_architecture(name, fields)}
    assert {
        "dlcl_init",
        "ta_dropout",
        "rezero_init",
        "ds_init",
        "rnmt_lstm_impl",
        "deep_att_cell_impl",
    } <= may_change
    assert (
        not {
            "dlcl_stacks",
            "dlcl_softmax_weights",
            "ta_disable",
            "deepnorm",
            "deepnorm_alpha",
            "admin",
            "rezero",
            "agg_encoder",
            "mla_layers",
            "rnmt_cell_clip",
            "ff_mode",
            "hybrid_encoder",
        }
        & may_change
    )
    with open(DESIGN, encoding="utf-8") as f:
        doc = f.read()
    section = doc[doc.index("## Architecture options") :]
    section = section[: section.index("\n## ", 3)]
    for name in sorted(may_change | model_options.FAIRSEQ_MAY_CHANGE):
        assert f"--{name.replace('_', '-')}" in section, (
            f"docs/design.md does not name --{name.replace('_', '-')}"
        )


@pytest.mark.parametrize("family", FAMILIES)
def test_the_architecture_of_each_family(family):
    """fairseq's own Transformer options count (heads, pre-/post-norm, activation, FFN width), the
    training-time ones do not."""
    arch = {
        o
        for o in model_options.options_of(MODEL_REGISTRY[family])
        if model_options.is_architecture(o)
    }
    assert {"encoder_layers", "decoder_layers", "encoder_embed_dim"} <= arch
    assert not {"dropout", "checkpoint_activations", "encoder_layerdrop"} & arch
    if family.startswith("transformer"):
        assert {
            "encoder_attention_heads",
            "encoder_normalize_before",
            "activation_fn",
            "encoder_ffn_embed_dim",
            "share_all_embeddings",
            "deepnorm",
            "admin",
            "rezero",
        } <= arch
        assert (
            not {
                "attention_dropout",
                "activation_dropout",
                "ds_init",
                "rezero_init",
                "deepnorm_beta",
            }
            & arch
        )


CHANGES = [  # (arch, the checkpoint's flags, this run's, the options named, or [] where it may change)
    (
        "transformer_dlcl",
        [],
        ["--encoder-attention-heads", "4"],
        ["--encoder-attention-heads (checkpoint 2, this run 4)"],
    ),
    (
        "transformer_dlcl",
        [],
        ["--decoder-attention-heads", "4", "--activation-fn", "gelu"],
        [
            "--activation-fn (checkpoint relu, this run gelu)",
            "--decoder-attention-heads (checkpoint 2, this run 4)",
        ],
    ),
    (
        "transformer_dlcl",
        [],
        ["--dlcl-stacks", "encoder"],
        ["--dlcl-stacks (checkpoint both, this run encoder)"],
    ),
    (
        "transformer_dlcl",
        [],
        ["--dlcl-softmax-weights"],
        ["--dlcl-softmax-weights (checkpoint off, this run on)"],
    ),
    (
        "transformer_postnorm",
        [],
        ["--encoder-normalize-before"],
        ["--encoder-normalize-before (checkpoint off, this run on)"],
    ),
    ("transformer_postnorm", [], ["--deepnorm"], ["--deepnorm (checkpoint off, this run on)"]),
    ("transformer_ta", [], ["--ta-disable"], ["--ta-disable (checkpoint off, this run on)"]),
    (
        "transformer_hier_agg",
        [],
        ["--agg-function", "ff_relu"],
        ["--agg-function (checkpoint ff_sigmoid, this run ff_relu)"],
    ),
    (
        "rnmt_plus",
        [],
        ["--rnmt-cell-clip", "5"],
        ["--rnmt-cell-clip (checkpoint 10.0, this run 5.0)"],
    ),
    ("deep_att", [], ["--ff-mode", "whole"], ["--ff-mode (checkpoint half, this run whole)"]),
    (
        "transformer_dlcl",
        [],
        ["--dropout", "0.3", "--attention-dropout", "0.1", "--dlcl-init", "one"],
        [],
    ),
    ("transformer_postnorm", [], ["--ds-init", "--rezero-init", "0.5"], []),
    ("rnmt_plus", [], ["--dropout", "0.2", "--ta-dropout", "0", "--rnmt-lstm-impl", "loop"], []),
    (
        "transformer_dlcl",
        ["--encoder-layers", "30"],
        ["--arch", "transformer_dlcl_30l"],
        [],
    ),  # the same model
    (
        "transformer_dlcl",
        [],
        ["--arch", "transformer_ta"],
        [
            "--arch (checkpoint transformer_dlcl (model transformer_dlcl), "
            "this run transformer_ta (model transformer_ta))"
        ],
    ),
]


@pytest.mark.parametrize("arch,saved,current,named", CHANGES)
def test_a_changed_architecture_option_is_named_with_both_values(arch, saved, current, named):
    a = parse_model_args(arch, saved)
    b = (
        parse_model_args(arch, [*saved, *current])
        if "--arch" not in current
        else parse_model_args(current[current.index("--arch") + 1], [*saved, *current[2:]])
    )
    found = model_options.describe(model_options.differences(a, b))
    assert found == ", ".join(named)
    if named:
        with pytest.raises(CheckpointError) as e:
            model_options.check_same_architecture("ck.pt", a, b)
        assert str(e.value).startswith(
            f"ck.pt holds a model whose architecture differs from this run's: {found}. "
        )
        assert "--model-from ck.pt" in str(e.value) and "\n" not in str(e.value)
    else:
        model_options.check_same_architecture("ck.pt", a, b)


# -- the options of a checkpoint as a command line ------------------------------------------------


def model_options_of(argv):
    parsed = options.parse_args_and_arch(
        options.get_training_parser(), ["data", "--task", "translation", *argv]
    )
    return model_options.resolved(parsed)


def assert_same_options(expected, got):
    """Every model option of ``expected`` has exactly its value (and type) in ``got``."""
    expected = model_options.resolved(expected)
    assert model_options.family(expected) == model_options.family(got)
    for option, action in model_options.options_of(model_options.model_class(expected)).items():
        if option in model_options.READS_A_FILE or not hasattr(expected, option):
            continue
        want, have = getattr(expected, option), getattr(got, option, None)
        if action.nargs == 0:
            want, have = bool(want), bool(have)
        numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (want, have))
        assert have == want and (type(have) is type(want) or numbers), (
            option,
            want,
            have,
        )  # not "16" for 16


@pytest.mark.parametrize("arch,extra", SAME, ids=[a for a, _ in SAME])
def test_a_checkpoint_and_its_grown_model_as_a_command_line(arch, extra, tmp_path):
    """model_command(checkpoint) parsed by fairseq-train's parser gives exactly the checkpoint's
    model options (every family; also after fairseq-deep-grow, whose --arch may change)."""
    save_tiny(arch, extra, tmp_path / "in.pt")
    saved = saved_model_options(torch.load(tmp_path / "in.pt", weights_only=True))
    assert_same_options(saved, model_options_of(model_options.model_command(saved)))
    hybrid_rnmt = arch == "hybrid_rnmt_transformer"
    summary = grow(
        str(tmp_path / "in.pt"),
        str(tmp_path / "grown.pt"),
        None if hybrid_rnmt else int(saved.encoder_layers) + 1,
        3 if hybrid_rnmt else None,
    )
    grown = saved_model_options(torch.load(tmp_path / "grown.pt", weights_only=True))
    assert model_options.differences(grown, summary["model_options"], every=True) == []
    assert_same_options(grown, model_options_of(model_options.model_command(grown)))


def test_the_command_line_holds_every_option_literally():
    args = parse_model_args(
        "transformer_dlcl",
        ["--encoder-layers", "3", "--dlcl-softmax-weights", "--dlcl-init", "one"],
    )
    argv = model_options.model_command(args)
    assert argv[:2] == ["--arch", "transformer_dlcl"]
    text = " ".join(argv)
    for fragment in (
        "--encoder-layers 3",
        "--encoder-attention-heads 2",
        "--decoder-attention-heads 2",
        "--encoder-ffn-embed-dim 32",
        "--encoder-normalize-before",
        "--dlcl-softmax-weights",
        "--dlcl-stacks both",
        "--activation-fn relu",
        "--dropout 0",
    ):
        assert fragment in text, fragment
    assert "--share-all-embeddings" not in text  # a flag that is off


# -- through the real scripts --------------------------------------------------------------------------


def last_line(proc):
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return proc.stderr.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def grown(synthetic_bin, tmp_path_factory):
    """A tiny transformer_dlcl (2 heads) trained 3 updates under --stop-time-hours, grown to 4
    encoder layers (the fairseq-deep-grow process), and the same grown with --keep-training-time."""
    root = tmp_path_factory.mktemp("continue")
    run_cli(
        "fairseq-deep-train",
        str(synthetic_bin),
        "--arch",
        "transformer_dlcl",
        *TINY,
        *layers(2),
        "--share-all-embeddings",
        "--optimizer",
        "adam",
        "--lr",
        "0.002",
        "--max-tokens",
        "2000",
        "--max-update",
        "3",
        "--stop-time-hours",
        "1",
        "--lr-scheduler",
        "inverse_sqrt",
        "--warmup-updates",
        "8",
        "--seed",
        "1",
        "--cpu",
        "--num-workers",
        "0",
        "--no-progress-bar",
        "--no-epoch-checkpoints",
        "--save-dir",
        str(root / "shallow"),
    )
    shallow = root / "shallow" / "checkpoint_last.pt"
    grow_cmd = [
        sys.executable,
        "-m",
        "fairseq_deep.grow",
        "--checkpoint",
        str(shallow),
        "--encoder-layers",
        "4",
    ]
    proc = run_cli(*grow_cmd, "--out", str(root / "grown.pt"))
    kept = run_cli(*grow_cmd, "--out", str(root / "kept.pt"), "--keep-training-time")
    return root, shallow, proc, kept


TRAIN = [
    "--optimizer",
    "adam",
    "--lr",
    "0.002",
    "--max-tokens",
    "2000",
    "--seed",
    "1",
    "--cpu",
    "--num-workers",
    "0",
    "--no-progress-bar",
    "--no-epoch-checkpoints",
    "--disable-validation",
]
RESET = ["--reset-optimizer", "--reset-lr-scheduler", "--reset-dataloader"]


SHORT = "continue training (the model's options taken from the grown checkpoint):"
FULL = "the same with every model option written out:"
#: the budget a reader of grow's printed commands sets (the shallow run's, here)
BUDGET = {"MAX_UPDATE": "3", "STOP_TIME_HOURS": "1"}


def printed_line(stdout, after):
    lines = stdout.splitlines()
    return lines[lines.index(after) + 1]


def printed_command(stdout, after, variables=None):
    """The words of the command printed after the line ``after``; with ``variables`` (``{NAME:
    value}``), each ``"$NAME"`` as the shell gives it."""
    words = shlex.split(printed_line(stdout, after))
    return [variables.get(w[1:], w) if variables and w.startswith("$") else w for w in words]


def test_grow_prints_the_complete_next_command_and_the_training_time(grown, synthetic_bin):
    root, shallow, proc, kept = grown
    out = proc.stdout
    assert re.search(r"training time: the shallow run's \d+:\d\d:\d\d is not carried over", out), (
        out
    )
    assert "training time: kept (--keep-training-time)" in kept.stdout, kept.stdout
    spent = torch.load(shallow, weights_only=True)["extra_state"]["previous_training_time"]
    assert spent > 0
    assert (
        torch.load(root / "grown.pt", weights_only=True)["extra_state"]["previous_training_time"]
        == 0
    )
    assert (
        torch.load(root / "kept.pt", weights_only=True)["extra_state"]["previous_training_time"]
        == spent
    )
    short = printed_command(out, SHORT)
    assert short[:5] == [
        "fairseq-deep-train",
        str(synthetic_bin),
        "--model-from",
        str(root / "grown.pt"),
        "--restore-file",
    ]
    full = printed_command(out, FULL)
    text = " ".join(full)
    assert (
        "--arch transformer_dlcl" in text
        and "--encoder-layers 4 " in text
        and "--decoder-layers 2 " in text
    )
    assert (
        "--encoder-attention-heads 2 " in text
        and "--share-all-embeddings" in text
        and "<" not in out
    )
    for command in (short, full):  # the shallow run's training options, and a --save-dir of its own
        for fragment in (
            "--optimizer adam",
            "--lr 0.002",
            "--max-tokens 2000",
            "--lr-scheduler inverse_sqrt",
            "--cpu",
            "--no-epoch-checkpoints",
            f"--save-dir {root / 'grown_checkpoints'}",
            # issue 40: the learning-rate restart of examples/grow (a quarter of the warm-up), and
            # the budget the reader's choice, as shell variables
            "--reset-optimizer --reset-lr-scheduler",
            "--warmup-updates 2",
            "--max-update $MAX_UPDATE",
            "--stop-time-hours $STOP_TIME_HOURS",
        ):
            assert fragment in " ".join(command), fragment
        assert "--warmup-updates 8" not in " ".join(command)
        assert "--max-update 3" not in " ".join(command)
    assert '--max-update "$MAX_UPDATE" --stop-time-hours "$STOP_TIME_HOURS"' in printed_line(
        out, SHORT
    )
    assert (
        "next: a learning-rate restart as examples/grow/run.sh's (a fresh optimizer and schedule, "
        "--warmup-updates 2: a quarter of the shallow run's 8), the shallow run's other training "
        "options; the budget is yours: set MAX_UPDATE=... STOP_TIME_HOURS=... first (the shallow run's "
        "was --max-update 3 --stop-time-hours 1, for a shallower model;" in out
    ), out


def test_the_shallow_runs_training_options_parse_back_to_its_values(grown):
    from fairseq_deep.grow_report import training_options

    _, shallow, _, _ = grown
    cfg = torch.load(shallow, weights_only=True)["cfg"]
    argv = training_options(cfg)
    parsed = options.parse_args_and_arch(
        options.get_training_parser(), ["DATA", "--arch", "transformer_dlcl", *argv]
    )
    for flag in (
        "--lr",
        "--max-tokens",
        "--max-update",
        "--stop-time-hours",
        "--seed",
        "--no-epoch-checkpoints",
        "--optimizer",
        "--cpu",
        "--num-workers",
    ):
        dest = flag[2:].replace("-", "_")
        saved = (
            next(
                cfg[g][dest]
                for g in ("optimization", "dataset", "checkpoint", "common", "optimizer")
                if dest in (cfg[g] or {})
            )
            if dest != "optimizer"
            else cfg["optimizer"]["_name"]
        )
        assert getattr(parsed, dest) == saved, (flag, getattr(parsed, dest), saved)
    assert not {"--save-dir", "--restore-file", "--arch", "--encoder-layers", "--user-dir"} & set(
        argv
    )


def test_continue_with_the_model_from_the_checkpoint_and_a_changed_head_count(
    grown, synthetic_bin, tmp_path
):
    """The held-out check of issue 32: continuing the grown model with a changed head count is
    refused in one line (the shapes are the same); with the model taken from the checkpoint it
    trains, and what it saves has the grown model's options."""
    root, _, proc, _ = grown
    full = printed_command(proc.stdout, FULL, BUDGET)
    heads = [
        "--encoder-attention-heads",
        "4",
        "--decoder-attention-heads",
        "4",
        "--save-dir",
        str(tmp_path / "heads"),
    ]
    for script in (["fairseq-deep-train"], ["fairseq-train", "--user-dir", PLUGIN_DIR]):
        refused = run_cli(*script, *full[1:], *heads, check=False)
        line = (
            last_line(refused)
            if script[0] == "fairseq-deep-train"
            else refused.stderr.strip().splitlines()[-1]
        )
        assert refused.returncode != 0
        assert (
            f"{root / 'grown.pt'} holds a model whose architecture differs from this run's: "
            "--encoder-attention-heads (checkpoint 2, this run 4), "
            "--decoder-attention-heads (checkpoint 2, this run 4)." in line
        )
        if (
            script[0] == "fairseq-deep-train"
        ):  # issue 40: the refusal is all it says, and it made nothing
            assert (refused.stdout + refused.stderr).strip() == line
            assert not (tmp_path / "heads").exists()
    assert not (tmp_path / "heads" / "checkpoint_last.pt").exists()

    # the command as printed: nothing retyped
    save = root / "grown_checkpoints"
    # the budget set as the printed note asks, the command run by the shell as printed
    assignments = " ".join(f"{name}={value}" for name, value in BUDGET.items())
    trained = run_cli("bash", "-c", f"{assignments}; {printed_line(proc.stdout, SHORT)}")
    assert "--model-from" in trained.stdout  # it says what it took
    state = torch.load(save / "checkpoint_last.pt", weights_only=True)
    assert (
        state["optimizer_history"][-1]["num_updates"] == 3
    )  # MAX_UPDATE=3 (the budget set), from 0
    grown_options = saved_model_options(torch.load(root / "grown.pt", weights_only=True))
    assert model_options.differences(grown_options, saved_model_options(state)) == []
    # the grown checkpoint brought no training time: this run's own is far below the shallow run's + its own
    assert state["extra_state"]["previous_training_time"] < 600

    # resuming that --save-dir with another activation (the same shapes) is refused; another dropout passes
    resume = [
        "fairseq-deep-train",
        str(synthetic_bin),
        "--model-from",
        str(root / "grown.pt"),
        *TRAIN,
        "--save-dir",
        str(save),
        "--max-update",
        "4",
    ]
    line = last_line(run_cli(*resume, "--activation-fn", "gelu", check=False))
    assert (
        "checkpoint_last.pt holds a model whose architecture differs from this run's: --activation-fn "
        "(checkpoint relu, this run gelu)" in line
    )
    run_cli(*resume, "--dropout", "0.2")
    assert (
        torch.load(save / "checkpoint_last.pt", weights_only=True)["optimizer_history"][-1][
            "num_updates"
        ]
        == 4
    )


def test_model_from_is_in_the_help():
    proc = run_cli("fairseq-deep-train", "--arch", "transformer_dlcl", "--help", check=False)
    assert (
        proc.returncode == 0
        and "--model-from CK.pt" in proc.stdout
        and "--dlcl-stacks" in proc.stdout
    )


def test_finetune_from_a_model_of_another_architecture_is_refused(grown, synthetic_bin, tmp_path):
    root, shallow, _, _ = grown
    proc = run_cli(
        "fairseq-deep-train",
        str(synthetic_bin),
        "--arch",
        "transformer_dlcl",
        *TINY,
        *layers(2),
        "--share-all-embeddings",
        "--encoder-normalize-before",
        "--dlcl-stacks",
        "decoder",
        *TRAIN,
        "--save-dir",
        str(tmp_path / "ft"),
        "--max-update",
        "1",
        "--finetune-from-model",
        str(shallow),
        check=False,
    )
    assert "--dlcl-stacks (checkpoint both, this run decoder)" in last_line(proc)


def test_mismatch_names_the_tensors_that_differ(grown, synthetic_bin, tmp_path):
    """Issue 32, item 3: where the options agree but the tensors do not (the checkpoint's FFN
    written by other code), the error names the first tensors with both shapes, not two
    identical summaries of the models."""
    root, shallow, _, _ = grown
    state = torch.load(shallow, weights_only=True)
    key = "encoder.layers.0.fc1.weight"
    state["model"][key] = torch.zeros(64, state["model"][key].shape[1])
    torch.save(state, tmp_path / "other.pt")
    proc = run_cli(
        "fairseq-deep-train",
        str(synthetic_bin),
        "--model-from",
        str(shallow),
        *TRAIN,
        "--save-dir",
        str(tmp_path / "mm"),
        "--max-update",
        "1",
        "--restore-file",
        str(tmp_path / "other.pt"),
        *RESET,
        check=False,
    )
    line = last_line(proc)
    assert (
        f"{tmp_path / 'other.pt'}: the checkpoint's parameters do not fit the model of this run (1 of another "
        f"shape ({key}: checkpoint 64x16, this model 32x16))" in line
    ), line
