"""Mixed precision through fairseq's own trainer and the real CLI, on CPU (issue 12).

fairseq's ``--fp16`` (FP16Optimizer, dynamic loss scale) and ``--bf16`` run on CPU with the shims of
``fairseq_deep.patches.precision``, so CI drives the same code paths a GPU run takes: every family trains a few
updates and decodes every test sentence in both precisions (one configuration a family, as
``families.matrix`` samples it); ``--optimizer deep_att`` keeps its three
parameter groups under ``--fp16``; ``--memory-efficient-fp16`` trains where fairseq's wrapper allows
and stops with a message naming the alternative where it does not; adaptive gradient clipping
sees only unscaled norms of updates that did not overflow.
"""

import math

import pytest
import torch
from fairseq import options, tasks
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from helpers import PLUGIN_DIR, python_module, run_cli

from benchmarks import precision_matrix
from fairseq_deep.models import families
from fairseq_deep.optim.adaptive_clip import STATE_KEY

# fp16 and bf16 through the CLI for the configurations of each family that name the precision in
# their samples, or its first: fairseq's FP16Optimizer / bf16 path, the plugin's shims and
# fairseq-generate once per family.  Every configuration (31) is cast to float16 and bfloat16 in
# process by test_precision.py; the whole matrix through the CLI is
# `python -m benchmarks.precision_matrix --scale tiny --device cpu --precisions fp16 bf16`
# (about 8 s of CPU per run: 31 rows took 300 s of CI's 25 minutes, a stack)
FP16_FAMILIES = [tiny.name for _, tiny in families.matrix("fp16")]
BF16_FAMILIES = [tiny.name for _, tiny in families.matrix("bf16")]


@pytest.mark.parametrize(
    "precision,families",
    [("fp16", FP16_FAMILIES), ("bf16", BF16_FAMILIES)],
    ids=["fp16", "bf16"],
)
def test_every_family_trains_and_decodes_every_sentence(
    synthetic_bin, tmp_path, precision, families
):
    args = precision_matrix.parse_args(
        [
            "--data",
            str(synthetic_bin),
            "--work-dir",
            str(tmp_path),
            "--scale",
            "tiny",
            "--device",
            "cpu",
            "--precisions",
            precision,
            "--updates",
            "3",
            "--max-tokens",
            "1000",
            "--jobs",
            "2",
            "--batch-size",
            "64",
            "--beam",
            "2",
            "--max-len",  # the longest target of the synthetic test set and some (not fairseq's 200)
            "16",
            "--one-process",
            "--families",
            *families,
        ]
    )
    rows = precision_matrix.run_matrix(args)
    bad = [
        r for r in rows if not r["trained"] or r.get("decoded") != r["test_size"] or "error" in r
    ]
    assert not bad, precision_matrix.table(bad)
    assert [r["family"] for r in rows] == families
    if precision == "fp16":
        assert all("loss_scale" in r for r in rows)  # fairseq's FP16Optimizer ran


def _train(data, save, *extra):
    return run_cli(
        *python_module("fairseq_cli.train"),
        str(data),
        "--user-dir",
        PLUGIN_DIR,
        "--max-tokens",
        "500",
        "--max-update",
        "3",
        "--lr",
        "1e-3",
        "--save-dir",
        str(save),
        "--no-epoch-checkpoints",
        "--cpu",
        "--seed",
        "1",
        "--log-format",
        "simple",
        "--log-interval",
        "1",
        "--disable-validation",
        *extra,
        check=False,
    )


def test_deep_att_optimizer_keeps_its_groups_under_fp16(synthetic_bin, tmp_path):
    proc = _train(
        synthetic_bin,
        tmp_path,
        "--arch",
        "deep_att_ff",
        *precision_matrix._DEEP_ATT_TINY,
        "--optimizer",
        "deep_att",
        "--lr-recurrent",
        "5e-4",
        "--fp16",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    state = torch.load(tmp_path / "checkpoint_last.pt")["last_optimizer_state"]
    lrs = {g["name"]: g["lr"] for g in state["param_groups"]}
    assert set(lrs) == {"feedforward", "embedding", "recurrent"}
    assert lrs["recurrent"] / lrs["feedforward"] == pytest.approx(
        0.5
    )  # 5e-4 / 1e-3, kept by the scheduler
    assert "loss_scale" in state


def test_memory_efficient_fp16_trains_or_names_the_alternative(synthetic_bin, tmp_path):
    ok = _train(
        synthetic_bin,
        tmp_path / "a",
        "--arch",
        "transformer_dlcl",
        *precision_matrix._TRANSFORMER_TINY,
        "--optimizer",
        "adam",
        "--memory-efficient-fp16",
    )
    assert ok.returncode == 0, ok.stderr[-3000:]
    refused = _train(
        synthetic_bin,
        tmp_path / "b",
        "--arch",
        "deep_att_ff",
        *precision_matrix._DEEP_ATT_TINY,
        "--optimizer",
        "deep_att",
        "--memory-efficient-fp16",
    )
    assert refused.returncode != 0
    assert "--memory-efficient-fp16" in refused.stderr and "Use --fp16" in refused.stderr


@pytest.mark.parametrize("precision", ["--fp16", "--bf16"])
def test_admin_profile_survives_the_master_copies(synthetic_bin, tmp_path, precision):
    """Admin's profile is written in the first training forward.  fairseq's ``--fp16``/``--bf16``
    keep float32 master copies of the parameters, taken before that forward and copied back after
    the first step: a profile written into a parameter came back as omega = 1 (admin_omega was a
    parameter then).  It is a buffer now: after 2 updates at a tiny learning rate the 16-bit run
    holds the float32 run's profile (to 16-bit rounding), not ones."""
    omegas = {}
    for name, extra in (("fp32", ()), ("half", (precision,))):
        proc = _train(
            synthetic_bin,
            tmp_path / name,
            "--arch",
            "transformer_admin",
            *precision_matrix._TRANSFORMER_TINY,
            "--optimizer",
            "adam",
            "--lr",
            "1e-7",
            "--max-update",
            "2",
            "--dropout",
            "0",
            *extra,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        state = torch.load(tmp_path / name / "checkpoint_last.pt", weights_only=True)["model"]
        learned = {k: state.get(k + "_learned", 0) for k in state if k.endswith("admin_omega")}
        omegas[name] = torch.cat(
            [(state[k] + learned[k]).float().flatten() for k in sorted(learned)]
        )
    assert not torch.allclose(omegas["fp32"], torch.ones_like(omegas["fp32"]))  # a real profile
    assert torch.allclose(omegas["half"], omegas["fp32"], rtol=2e-2)


# -- adaptive gradient clipping under fp16 ---------------------------------------------------------


def _fp16_trainer(data, init_scale):
    from fairseq.trainer import Trainer

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(
        parser,
        [
            str(data),
            "--user-dir",
            PLUGIN_DIR,
            "--task",
            "translation_deep",
            "--arch",
            "rnmt_plus",
            *precision_matrix._RNMT_TINY,
            "--source-lang",
            "src",
            "--target-lang",
            "tgt",
            "--cpu",
            "--optimizer",
            "adam",
            "--lr",
            "1e-3",
            "--max-tokens",
            "400",
            "--dropout",
            "0",
            "--seed",
            "1",
            "--adaptive-clip",
            "--adaptive-clip-warmup",
            "100",
            "--fp16",
            "--fp16-init-scale",
            str(init_scale),
            "--fp16-scale-window",
            "1000",
        ],
    )
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    task.load_dataset("train")
    torch.manual_seed(1)
    trainer = Trainer(cfg, task, task.build_model(cfg.model), task.build_criterion(cfg.criterion))
    itr = task.get_batch_iterator(task.dataset("train"), max_tokens=400, seed=1).next_epoch_itr(
        shuffle=False
    )
    return trainer, itr


def _observed_norms(trainer):
    """Record the norms the tracker takes into its statistics."""
    tracker = trainer.task._adaptive_clip_tracker()
    seen = []
    update = tracker.update

    def recording_update(norm):
        seen.append(norm)
        update(norm)

    tracker.update = recording_update
    return tracker, seen


def test_adaptive_clip_statistics_skip_overflows_and_use_unscaled_norms(synthetic_bin):
    # 2^22: the first steps overflow float16 and fairseq halves the scale until they do not
    trainer, itr = _fp16_trainer(synthetic_bin, 2**22)
    tracker, seen = _observed_norms(trainer)
    batches = [next(itr) for _ in range(20)]
    for batch in batches:
        trainer.train_step([batch])
    updates = trainer.get_num_updates()
    overflows = len(batches) - updates
    assert overflows > 0 and updates > 5  # both kinds of step happened
    assert tracker.observed == len(seen) == updates  # no overflowed step entered the statistics
    assert all(math.isfinite(n) for n in seen)
    state = trainer.optimizer.optimizer.param_groups[0][STATE_KEY]
    assert state["observed"] == updates

    # the same batches at a scale that never overflows give the same norms: they are unscaled
    low, itr_low = _fp16_trainer(synthetic_bin, 2**4)
    _, seen_low = _observed_norms(low)
    for batch in batches[overflows:]:
        low.train_step([batch])
    assert low.get_num_updates() == updates
    # the first update of each run sees the same parameters: norms agree to fp16 rounding
    assert seen_low[0] == pytest.approx(seen[0], rel=2e-2)


def test_matrix_decodes_a_shard_and_deletes_checkpoints(synthetic_bin, tmp_path):
    """Issue 24: --decode-shards N decodes fairseq's first shard of the test batches, and a run's
    checkpoints are gone once it is decoded (--keep-checkpoints keeps them)."""
    rows = {}
    for keep in (False, True):
        args = precision_matrix.parse_args(
            [
                "--data",
                str(synthetic_bin),
                "--work-dir",
                str(tmp_path / str(keep)),
                "--scale",
                "tiny",
                "--device",
                "cpu",
                "--precisions",
                "fp32",
                "--updates",
                "2",
                "--max-tokens",
                "1000",
                "--batch-size",
                "16",
                "--beam",
                "1",
                "--max-len",
                "16",
                "--families",
                "transformer_dlcl",
                "--decode-shards",
                "4",
                *(["--keep-checkpoints"] if keep else []),
            ]
        )
        (rows[keep],) = precision_matrix.run_matrix(args)
        kept = list((tmp_path / str(keep)).rglob("*.pt"))
        assert bool(kept) == keep
    row = rows[False]
    assert 0 < row["decoded"] == row["test_size"] < 101, row  # about a quarter of the 101 sentences
    assert "shard 0 of 4" in row["note"]


def test_memory_cap_holds_runs_to_their_estimate():
    """At most --memory-gb of estimated memory at once; a run bigger than the cap runs alone."""
    import threading
    import time

    cap = precision_matrix.MemoryCap(10.0)
    seen = []

    def run(gb):
        with cap.hold(gb):
            seen.append(cap.used)
            time.sleep(0.05)

    threads = [threading.Thread(target=run, args=(gb,)) for gb in (4, 4, 4, 12, 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert max(seen) <= 12 and cap.peak <= 12 and cap.used == 0 and cap.running == 0
    assert all(u <= 10 for u in seen if u != 12)
    assert precision_matrix.estimate_gb("hybrid_multicolumn", 4096) > precision_matrix.estimate_gb(
        "transformer_dense", 4096
    )
