"""Issue 7.2: an interrupted training resumes exactly.

A run of ``fairseq-train`` is killed (SIGKILL, as a pre-empted job is) after it has saved
``checkpoint_last.pt`` at update k; the same command run again resumes from that file.  The losses
it logs for updates k+1..N equal those of an uninterrupted run with the same seed, and the final
checkpoints are bitwise equal: every parameter and buffer of the model (learned layer weights
included), the optimizer state, the LR scheduler, the data iterator position and the loss meters.

Every model family is a row of FAMILIES: a family declared without a row here gets one from its
first tiny configuration (``tiny`` of its declaration, fairseq_deep/models/families.py).  Flags that
create state of their own (a criterion with statistics, adaptive clipping, diagnostics) belong in a
row, so that the state is saved and restored under test.  Dropout stays on: the random streams must
resume too.
"""

import json
import os
import re
import signal
import sys

import forked
import pytest
import torch
from helpers import PLUGIN_DIR, dtype_marker, run_cli, tiny_flags

import fairseq_deep  # noqa: F401  (allow-list for loading the checkpoints below)
from fairseq_deep import runs
from fairseq_deep.models import families


def rows():
    """The resume matrix's rows (models/families.py: ``families.cover``)."""
    return families.cover(
        [
            pytest.param("transformer_dlcl", [], id="transformer_dlcl"),
            pytest.param("transformer_ta", [], id="transformer_ta"),
            # issue 46: group permutation (its order drawn per batch) and Skipping Sub-Layer (its
            # decisions per sentence) resume with the random streams
            pytest.param(
                "transformer_dlcl",
                [
                    *("--encoder-layers", "4", "--decoder-layers", "2"),
                    *("--gpkd-encoder-groups", "2", "--gpkd-decoder-groups", "1"),
                    *("--skip-sublayer-rate", "0.3", "--skip-sublayer-stacks", "both"),
                ],
                id="transformer_dlcl_gpkd_skip",
            ),
            # the diversity criterion, on an aggregation model
            pytest.param(
                "transformer_hier_agg",
                [
                    "--criterion",
                    "label_smoothed_cross_entropy_with_diversity",
                    "--diversity-lambda",
                    "0.1",
                ],
                id="transformer_hier_agg",
            ),
            # adaptive clipping (its statistics travel in the optimizer state; a zero-width band so that
            # updates are skipped before and after the kill), the sentence-level loss, the Eq. 1 schedule
            pytest.param(
                "rnmt_plus",
                [
                    "--task",
                    "translation_deep",
                    "--adaptive-clip",
                    "--adaptive-clip-warmup",
                    "1",
                    "--adaptive-clip-threshold",
                    "0.01",
                    "--criterion",
                    "sentence_cross_entropy",
                    "--label-smoothing",
                    "0.1",
                    "--lr-scheduler",
                    "rnmt_plus",
                    "--rnmt-decay-start",
                    "5",
                    "--rnmt-decay-end",
                    "7",
                ],
                id="rnmt_plus",
            ),
            # three parameter groups with their own learning rates
            pytest.param(
                "deep_att_ff",
                ["--optimizer", "deep_att", "--lr-recurrent", "0.02", "--update-rule", "adam"],
                id="deep_att_ff",
            ),
            # issue 17: a deep DeepNorm encoder (its constants follow the depth); a deep Admin encoder,
            # whose omegas are profiled on the first batch of the reference run and must come back from
            # the checkpoint, not again (12 layers: the 100- and 60-layer presets' code, at a tenth of
            # the cost; CI's time, issue 39)
            pytest.param(
                "transformer_deepnorm", ["--encoder-layers", "12"], id="transformer_deepnorm_12l"
            ),
            pytest.param(
                "transformer_admin", ["--encoder-layers", "12"], id="transformer_admin_12l"
            ),
            # issue 41: DWA weights; mHC's connections (static, dynamic and mhc have the same parameter
            # kinds); ResiDual's dual norm; RK2 blocks in both stacks, two evaluations per layer
            # (dropout draws twice), their gates
            pytest.param("transformer_denseformer", [], id="transformer_denseformer"),
            pytest.param("transformer_mhc", [], id="transformer_mhc"),
            pytest.param("transformer_resi_dual", [], id="transformer_resi_dual"),
            pytest.param("transformer_ode_rk2", ["--ode-stacks", "both"], id="transformer_ode_rk2"),
            # issue 41: the parameters of the per-layer schemes in one run (Sub-LN's and Peri-LN's
            # norms, as DyTs: alpha, gamma, beta; LayerScale's lambda); B2T and Mix-LN have none of
            # their own
            pytest.param(
                "transformer_subln",
                ["--peri-ln", "--dyt", "--layerscale"],
                id="transformer_subln+periln+dyt+layerscale",
            ),
        ],
        arch=lambda row: row.values[0],
        # a family none of these is of: its first tiny configuration (models/families.py)
        default=lambda family, tiny: pytest.param(
            tiny.arch, [*family.tiny_sizes, *tiny.model, *runs.flags(tiny.training)], id=tiny.name
        ),
    )


FAMILIES = rows()

MAX_UPDATE = 7
SAVE_EVERY = 3  # the run is killed after its first save, at update 3


def train_argv(data, save_dir, arch, flags):
    return [
        sys.executable,
        "-m",
        "fairseq_cli.train",
        str(data),
        "--user-dir",
        PLUGIN_DIR,
        "--task",
        "translation",
        "--arch",
        arch,
        *tiny_flags(arch),
        "--encoder-layers",
        "2",
        "--decoder-layers",
        "2",
        "--dropout",
        "0.1",  # after the tiny flags: the RNG must resume too
        *(["--attention-dropout", "0.1"] if "--attention-dropout" in tiny_flags(arch) else []),
        "--optimizer",
        "adam",
        "--lr",
        "0.002",
        "--lr-scheduler",
        "inverse_sqrt",
        "--warmup-updates",
        "4",
        "--clip-norm",
        "1.0",
        "--max-tokens",
        "300",
        "--max-update",
        str(MAX_UPDATE),
        "--save-interval-updates",
        str(SAVE_EVERY),
        "--disable-validation",
        "--no-epoch-checkpoints",
        "--save-dir",
        str(save_dir),
        "--seed",
        "7",
        "--cpu",
        "--num-workers",
        "0",
        "--log-interval",
        "1",
        "--log-format",
        "json",
        "--no-progress-bar",
        *flags,
    ]


def _env():
    return dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")


def inner_losses(log: str, key: str = "loss"):
    """{update: loss (or another statistic) as logged} from fairseq's train_inner json lines."""
    out = {}
    for m in re.finditer(r"\| train_inner \| (\{.*\})", log):
        stats = json.loads(m.group(1))
        out[int(stats["num_updates"])] = stats[key]
    return out


def run_to_end(argv):
    proc = run_cli(*argv, env=_env(), check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout + proc.stderr


def run_and_kill_after_first_save(argv):
    """Start training and SIGKILL it as soon as it reports its first saved checkpoint (in a fork of
    the tests' fork server, tests/forked.py, as run_cli's commands)."""
    proc = forked.popen(argv, env=_env())
    log = []
    try:
        for line in proc.stdout:
            log.append(line)
            if "Saved checkpoint" in line:
                proc.send_signal(signal.SIGKILL)
                break
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
    return "".join(log), proc.returncode


def assert_same(a, b, path="state"):
    """Bitwise equality of nested checkpoint contents (tensors with torch.equal)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype, path
        assert dtype_marker(path) or torch.equal(a, b), path
    elif isinstance(a, dict):
        assert set(a) == set(b), f"{path}: keys {set(a) ^ set(b)}"
        for k in a:
            assert_same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{i}]")
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def load(path):
    return torch.load(path, map_location="cpu", weights_only=True)


def _meters(metrics, name):
    """The AverageMeter states of one aggregator of a checkpoint (timers left out)."""
    return {
        key: state
        for _, key, kind, state in metrics[name]
        if kind == "AverageMeter" and key not in ("wps", "ups", "wall", "train_wall", "gb_free")
    }


@pytest.mark.parametrize("arch,flags", FAMILIES)
def test_killed_run_resumes_exactly(synthetic_bin, tmp_path, arch, flags):
    reference = run_to_end(train_argv(synthetic_bin, tmp_path / "reference", arch, flags))

    resumed_dir = tmp_path / "resumed"
    killed_log, rc = run_and_kill_after_first_save(
        train_argv(synthetic_bin, resumed_dir, arch, flags)
    )
    assert rc == -signal.SIGKILL, "the run ended before it could be killed"
    k = load(resumed_dir / "checkpoint_last.pt")["optimizer_history"][-1]["num_updates"]
    assert SAVE_EVERY <= k < MAX_UPDATE
    resumed = run_to_end(train_argv(synthetic_bin, resumed_dir, arch, flags))
    assert f"@ {k} updates" in resumed  # fairseq: "Loaded checkpoint ... (epoch 1 @ k updates)"

    ref_losses, res_losses = inner_losses(reference), inner_losses(resumed)
    assert sorted(ref_losses) == list(range(1, MAX_UPDATE + 1))
    assert sorted(res_losses) == list(range(k + 1, MAX_UPDATE + 1))
    assert {u: ref_losses[u] for u in res_losses} == res_losses
    # the killed run agreed with the reference up to where it was stopped
    killed = inner_losses(killed_log)
    assert killed and all(ref_losses[u] == killed[u] for u in killed)
    if "--adaptive-clip" in flags:  # updates were skipped before the kill and after the resume
        ref_skips, res_skips = (
            inner_losses(reference, "skipped_total"),
            inner_losses(resumed, "skipped_total"),
        )
        assert {u: ref_skips[u] for u in res_skips} == res_skips
        assert 0 < float(ref_skips[k]) < float(ref_skips[MAX_UPDATE]), ref_skips

    ref, res = (
        load(tmp_path / "reference" / "checkpoint_last.pt"),
        load(resumed_dir / "checkpoint_last.pt"),
    )
    assert_same(ref["model"], res["model"], "model")  # every parameter and buffer, bitwise
    assert any("history" in name for name in ref["model"]) or "dlcl" not in arch
    assert_same(ref["last_optimizer_state"], res["last_optimizer_state"], "optimizer")
    # the last entry: optimizer, criterion, LR scheduler state (a resume appends one entry)
    assert_same(ref["optimizer_history"][-1], res["optimizer_history"][-1], "optimizer_history")
    assert_same(ref["criterion"], res["criterion"], "criterion")
    assert_same(
        ref["extra_state"]["train_iterator"], res["extra_state"]["train_iterator"], "iterator"
    )
    # full-precision loss sums over the epoch: restored meters plus the resumed updates
    assert_same(
        _meters(ref["extra_state"]["metrics"], "train"),
        _meters(res["extra_state"]["metrics"], "train"),
        "train meters",
    )
    extra = set(ref["extra_state"]) - {
        "metrics",
        "previous_training_time",
        "train_iterator",
        "val_loss",
        "best",
    }
    for key in extra:  # state added by the package (diagnostics, clipping statistics, ...)
        assert_same(ref["extra_state"][key], res["extra_state"][key], f"extra_state.{key}")
