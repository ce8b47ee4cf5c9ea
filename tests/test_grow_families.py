"""fairseq-deep-grow (issue 27), every family it grows: a tiny saved checkpoint, grown, continues
training with fairseq's train (``--restore-file GROWN --reset-optimizer --reset-lr-scheduler
--reset-dataloader``, the ``--arch`` and depths the script prints), resumes from checkpoint_last,
and decodes with fairseq's generate, the grown checkpoint itself and the trained one, without model
flags.

fairseq's ``fairseq_cli.train.main`` and ``fairseq_cli.generate.main`` run in this process with
configurations parsed as their console scripts parse them (one subprocess per family would cost
the suite minutes); the console scripts themselves are tested on transformer_dlcl and rnmt_plus in
tests/test_grow.py (test_grown_checkpoint_trains_resumes_and_decodes)."""

import copy
import os

import pytest
import torch
from fairseq import checkpoint_utils, options
from fairseq.data import Dictionary
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from helpers import PLUGIN_DIR, build_model, dtype_marker, parse_model_args
from omegaconf import OmegaConf

from fairseq_deep.grow import grow
from fairseq_deep.model_options import model_command
from fairseq_deep.models import families

LR = 1e-3


def layers(n, m=None):
    return ["--encoder-layers", str(n), "--decoder-layers", str(n if m is None else m)]


HYBRID = [
    "--encoder-hidden-size",
    "8",
    "--decoder-hidden-size",
    "16",
]  # the RNMT+ parts (default: 1024)


# (arch, the shallow model's flags, grown encoder and decoder depth, method): every family, and the
# methods spread over them (identity where the family allows it); a family that grows and that none
# of these is of gets a row of its first tiny configuration (models/families.py), one layer grown
# to two by --method stack
def rows():
    """The grow matrix's rows (models/families.py: ``families.cover``)."""
    return families.cover(
        [
            # (N+1) x M transparent weights, both sides grown
            ("transformer_ta", layers(1), 2, 2, "stack"),
            ("transformer_ta_prenorm", layers(1), 3, 2, "identity"),
            ("transformer_dense", layers(1), 3, 2, "stack"),
            ("transformer_linear_agg", layers(2, 1), 3, 2, "identity"),
            ("transformer_iterative_agg", layers(2, 1), 3, 2, "interleave"),
            ("transformer_hier_agg", layers(2, 1), 4, 2, "stack"),
            ("transformer_mla2", layers(2, 1), 3, 2, "stack"),
            ("transformer_mla3", layers(2, 1), 4, 2, "interleave"),
            ("transformer_deepnorm", layers(1), 2, 2, "stack"),  # the new depth's alpha/beta
            ("transformer_admin", layers(1), 2, 2, "interleave"),
            ("transformer_rezero", layers(1), 3, 2, "identity"),
            ("transformer_dsinit", layers(1), 2, 2, "stack"),
            ("transformer_dlcl_postnorm", layers(1), 3, 2, "interleave"),
            ("transformer_prenorm", layers(1), 2, 2, "identity"),
            # issue 41: Mix-LN's --mix-ln-ratio rewritten for the grown depth (its post-norm layers kept)
            ("transformer_mixln", ["--mix-ln-ratio", "0.5", *layers(2)], 4, 3, "identity"),
            (
                "deep_att",
                layers(2, 1),
                3,
                2,
                "interleave",
            ),  # the interleaved directions of the columns
            ("deep_ed_ff", layers(2, 1), 4, 2, "stack"),
            # RNMT+'s transparent readout
            ("rnmt_plus", ["--rnmt-transparent", *layers(3, 2)], 4, 3, "stack"),
            # Transformer encoder, RNMT+ decoder
            ("hybrid_transformer_rnmt", [*HYBRID, *layers(1)], 2, 2, "stack"),
            (
                "hybrid_rnmt_transformer",
                [*HYBRID, "--rnmt-encoder-layers", "2", "--decoder-layers", "1"],
                3,
                2,
                "interleave",
            ),
        ],
        arch=lambda row: row[0],
        default=lambda family, tiny: (
            tiny.arch,
            [*family.tiny_sizes, *tiny.model, *layers(1)],
            2,
            2,
            "stack",
        ),
        applies=lambda family: family.grows,
    )


FAMILIES = rows()


@pytest.fixture(scope="module")
def dictionary(synthetic_bin):
    return Dictionary.load(str(synthetic_bin / "dict.src.txt"))


def save_shallow(arch, extra, dictionary, path):
    """A tiny model of ``arch`` on the corpus' dictionary, saved as fairseq-train saves it."""
    model, _ = build_model(arch, extra, dictionary=dictionary)
    with (
        torch.no_grad()
    ):  # as trained: ReZero's alphas are not the initial 0, Admin's omegas profiled
        for name, p in model.named_parameters():
            if name.endswith("rezero_alpha"):
                p.fill_(0.5)
        for name, b in model.named_buffers():
            if name.endswith("admin_profiled"):
                b.fill_(True)
    args = parse_model_args(arch, extra)
    cfg = OmegaConf.to_container(
        convert_namespace_to_omegaconf(args), resolve=True, enum_to_str=True
    )
    state = {
        "cfg": cfg,
        "args": None,
        "model": model.state_dict(),
        "criterion": {},
        "optimizer_history": [
            {
                "criterion_name": "CrossEntropyCriterion",
                "optimizer_name": "Adam",
                "lr_scheduler_state": {},
                "num_updates": 7,
            }
        ],
        "task_state": {},
        "extra_state": {"train_iterator": {"epoch": 3}},
        "last_optimizer_state": {"state": {}},
    }
    checkpoint_utils.torch_persistent_save(state, str(path))


def train_config(argv):
    """fairseq-train's configuration of a command line (parsed once: hydra's composition is the
    slow part of an in-process run)."""
    return convert_namespace_to_omegaconf(
        options.parse_args_and_arch(options.get_training_parser(), argv)
    )


def fairseq_train(cfg, **changes):
    """fairseq-train's main with ``cfg`` (its ``group.option`` entries changed as given)."""
    from fairseq_cli import train

    cfg = copy.deepcopy(cfg)
    for key, value in changes.items():
        group, option = key.split("__")
        cfg[group][option] = value
    if hasattr(
        checkpoint_utils.save_checkpoint, "best"
    ):  # fairseq keeps the best loss on the function
        del checkpoint_utils.save_checkpoint.best
    train.main(cfg)


@pytest.fixture(scope="module")
def generate_config(synthetic_bin):
    """fairseq-generate's configuration: no model flags (they come from the checkpoint)."""
    argv = [
        str(synthetic_bin),
        "--path",
        "PATH",
        "--gen-subset",
        "test",
        "--beam",
        "2",
        "--batch-size",
        "128",
        "--max-len-a",
        "0",
        "--max-len-b",
        "6",
        "--cpu",
        "--num-workers",
        "0",
        "--results-path",
        "OUT",
    ]
    return convert_namespace_to_omegaconf(
        options.parse_args_and_arch(options.get_generation_parser(), argv)
    )


def fairseq_generate(generate_config, path, out_dir):
    """fairseq-generate's main on checkpoint ``path``: the hypotheses of the test set."""
    from fairseq_cli import generate

    cfg = copy.deepcopy(generate_config)
    cfg.common_eval.path, cfg.common_eval.results_path = str(path), str(out_dir)
    generate.main(cfg)
    with open(os.path.join(out_dir, "generate-test.txt"), encoding="utf-8") as f:
        lines = f.read().splitlines()
    return [line for line in lines if line.startswith("H-")]


def floats(state):
    """The floating-point tensors of a state dict, but fairseq 0.12.2's dtype marker (uninitialised
    memory, set anew by every upgrade_state_dict: helpers.dtype_marker)."""
    return {k: v for k, v in state.items() if v.is_floating_point() and not dtype_marker(k)}


def assert_moved_a_little(start, end):
    """``end`` is ``start`` after a few Adam updates of lr LR: some parameter moved, none by more
    than a few LR (a fresh initialisation would be far off)."""
    assert start.keys() == end.keys()
    drift = {k: float((end[k] - start[k]).abs().max()) for k in start}
    assert max(drift.values()) > 0
    assert all(d < 10 * LR for d in drift.values()), max(drift.items(), key=lambda kv: kv[1])


@pytest.mark.parametrize("arch,extra,n,m,method", FAMILIES, ids=[a for a, *_ in FAMILIES])
def test_grown_family_trains_resumes_and_decodes(
    arch, extra, n, m, method, synthetic_bin, dictionary, generate_config, tmp_path
):
    save_shallow(arch, extra, dictionary, tmp_path / "shallow.pt")
    grown = tmp_path / "grown.pt"
    summary = grow(str(tmp_path / "shallow.pt"), str(grown), n, m, method)
    assert summary["encoder_layers"][1] == n and summary["decoder_layers"][1] == m

    # fairseq-generate on the grown checkpoint itself: the grown options are in it
    assert len(fairseq_generate(generate_config, grown, tmp_path / "gen_grown")) == 101

    # continue training with the model options the script prints (every one of the grown checkpoint's)
    save_dir = tmp_path / "deep"
    argv = [
        str(synthetic_bin),
        "--user-dir",
        PLUGIN_DIR,
        "--task",
        "translation",
        *model_command(summary["model_options"]),
        "--optimizer",
        "adam",
        "--lr",
        str(LR),
        "--max-tokens",
        "400",
        "--seed",
        "1",
        "--cpu",
        "--num-workers",
        "0",
        "--no-progress-bar",
        "--log-interval",
        "1",
        "--disable-validation",
        "--no-epoch-checkpoints",
        "--save-dir",
        str(save_dir),
        "--max-update",
        "2",
        "--restore-file",
        str(grown),
        "--reset-optimizer",
        "--reset-lr-scheduler",
        "--reset-dataloader",
    ]
    cfg = train_config(argv)
    fairseq_train(cfg)
    before = floats(torch.load(grown, weights_only=True)["model"])
    after = torch.load(save_dir / "checkpoint_last.pt", weights_only=True)
    assert after["optimizer_history"][-1]["num_updates"] == 2  # the schedule restarted from 0
    grown_from = torch.load(grown, weights_only=True)["extra_state"]["grown"]
    assert after["extra_state"]["grown"] == grown_from  # the history survives fairseq-train's save
    assert [c["from"] for c in after["extra_state"]["continued"]] == [str(grown)]
    trained = floats(after["model"])
    assert_moved_a_little(before, trained)  # it started from the grown parameters, and trained them

    # the same command without the restore and reset options, one more update: resumes checkpoint_last.pt
    fairseq_train(
        cfg,
        checkpoint__restore_file="checkpoint_last.pt",
        checkpoint__reset_optimizer=False,
        checkpoint__reset_lr_scheduler=False,
        checkpoint__reset_dataloader=False,
        optimization__max_update=3,
    )
    resumed = torch.load(save_dir / "checkpoint_last.pt", weights_only=True)
    assert resumed["optimizer_history"][-1]["num_updates"] == 3
    assert [resumed["extra_state"][k] for k in ("grown", "continued")] == [
        after["extra_state"][k] for k in ("grown", "continued")
    ]  # resuming its own checkpoint_last.pt adds nothing
    assert_moved_a_little(
        trained, floats(resumed["model"])
    )  # one update from the saved model, not a fresh one

    hypotheses = fairseq_generate(
        generate_config, save_dir / "checkpoint_last.pt", tmp_path / "gen_deep"
    )
    assert len(hypotheses) == 101
