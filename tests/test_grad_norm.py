"""The grad-norm ratio r_t (Bapna et al. 2018, Sec. 2.3), its logging and its plots."""

import math
import os

import pytest
import torch
from fairseq.criterions.cross_entropy import CrossEntropyCriterion
from fairseq.logging import metrics
from helpers import PLUGIN_DIR, TINY, build_model, parse_model_args, random_batch, run_cli
from torch import nn

from fairseq_deep.diagnostics.plot_training import main as plot_main
from fairseq_deep.diagnostics.plot_training import parse_log_lines
from fairseq_deep.optim.noam import noam_lr
from fairseq_deep.tasks.grad_norm import (
    GradNormRatioProbe,
    encoder_end_layers,
    grad_norm_ratio,
)
from fairseq_deep.tasks.translation_deep import TranslationDeepTask

MODELS = [
    ("transformer", []),  # fairseq's own
    ("transformer_dlcl", []),
    ("transformer_dlcl_postnorm", []),
    ("transformer_ta", ["--ta-dropout", "0"]),  # W dropout would make the two passes differ
    ("transformer_ta_nores", []),
]


def _sample(dictionary, seed=0):
    src, lengths, prev = random_batch(dictionary, bsz=3, seed=seed)
    target = torch.cat([prev[:, 1:], prev[:, :1]], dim=1)
    return {
        "id": torch.arange(3),
        "nsentences": 3,
        "ntokens": target.numel(),
        "target": target,
        "net_input": {"src_tokens": src, "src_lengths": lengths, "prev_output_tokens": prev},
    }


def _loss(model, sample):
    out = model(**sample["net_input"])
    lprobs = model.get_normalized_probs(out, log_probs=True)
    return -lprobs.gather(-1, sample["target"].unsqueeze(-1)).sum()


@pytest.mark.parametrize("arch,extra", MODELS, ids=[m[0] for m in MODELS])
def test_probe_measures_the_gradient_at_first_and_last_encoder_layer(arch, extra):
    model, task = build_model(arch, ["--encoder-layers", "3", "--decoder-layers", "2", *extra])
    model.train()  # dropout is 0 in TINY: both passes below compute the same function
    sample = _sample(task.source_dictionary)
    first, last = encoder_end_layers(model)
    outputs = {}
    handles = [
        first.register_forward_hook(lambda m, i, o: outputs.__setitem__("first", o)),
        last.register_forward_hook(lambda m, i, o: outputs.__setitem__("last", o)),
    ]
    g1, gn = torch.autograd.grad(_loss(model, sample), [outputs["first"], outputs["last"]])
    for h in handles:
        h.remove()
    expected = (g1.norm() / gn.norm()).item()

    with GradNormRatioProbe(model) as probe:
        _loss(model, sample).backward()
    assert not first._forward_hooks and not last._forward_hooks  # removed on exit
    ratio = grad_norm_ratio([probe.logging_output()])
    assert math.isfinite(ratio) and ratio > 0
    assert ratio == pytest.approx(expected, rel=1e-5)


def test_ratio_of_an_update_pools_its_micro_batches():
    """||dL/dh|| over an update: the squared norms of its micro-batches (and workers) add up."""
    logs = [
        {"_gnorm_ratio_first_sq": 9.0, "_gnorm_ratio_last_sq": 1.0},
        {"_gnorm_ratio_first_sq": 16.0, "_gnorm_ratio_last_sq": 24.0},
    ]
    assert grad_norm_ratio(logs) == pytest.approx(1.0)
    assert math.isnan(
        grad_norm_ratio([{"_gnorm_ratio_first_sq": 0.0, "_gnorm_ratio_last_sq": 0.0}])
    )


def test_model_without_encoder_layers_is_told_the_fix():
    class NoLayers(nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = nn.Linear(2, 2)

    with pytest.raises(ValueError, match="grad_norm_layers"):
        encoder_end_layers(NoLayers())


class _Optimizer:
    def backward(self, loss):
        loss.backward()


def _task(model_task, **options):
    args = parse_model_args("transformer_ta", ["--encoder-layers", "3", "--decoder-layers", "2"])
    args.log_grad_norm_ratio = options.get("ratio", False)
    args.log_ta_weights = options.get("ta", "none")
    return TranslationDeepTask(args, model_task.source_dictionary, model_task.target_dictionary)


@pytest.mark.parametrize(
    "ratio,ta", [(True, "last"), (True, "none"), (False, "all"), (False, "none")]
)
def test_task_logs_ratio_and_weights_into_metrics(ratio, ta):
    model, model_task = build_model(
        "transformer_ta", ["--encoder-layers", "3", "--decoder-layers", "2"]
    )
    task = _task(model_task, ratio=ratio, ta=ta)
    criterion = CrossEntropyCriterion(task, sentence_avg=False)
    logs = []
    for seed in range(2):  # two micro-batches of one update
        _, _, log = task.train_step(
            _sample(task.source_dictionary, seed), model, criterion, _Optimizer(), update_num=0
        )
        logs.append(log)
    first, last = encoder_end_layers(model)
    assert not first._forward_hooks and not last._forward_hooks  # nothing left behind
    with metrics.aggregate(new_root=True) as agg:
        task.reduce_metrics(logs, criterion)
        values = agg.get_smoothed_values()
    if ratio:
        assert math.isfinite(values["gnorm_ratio"]) and values["gnorm_ratio"] > 0
    else:
        assert "gnorm_ratio" not in values and "_gnorm_ratio_first_sq" not in logs[0]
    ta_keys = sorted(k for k in values if k.startswith("ta_s"))
    if ta == "none":
        assert ta_keys == []
    else:
        n_cols = 2 if ta == "all" else 1
        assert len(ta_keys) == 4 * n_cols  # (N+1) entries per logged column
        s = model.encoder.transparent_attention.weights()
        assert values["ta_s3_2"] == pytest.approx(s[3, 1].item(), abs=1e-6)
        assert sum(values[f"ta_s{i}_2"] for i in range(4)) == pytest.approx(1.0, abs=1e-5)


# --- a real short run: fairseq-train, resume, generate, plots ------------------------------------

TRAIN = [
    "--user-dir",
    PLUGIN_DIR,
    "--task",
    "translation_deep",
    "--arch",
    "transformer_ta",
    "--encoder-layers",
    "4",
    "--decoder-layers",
    "2",
    *TINY,
    "--share-all-embeddings",
    "--optimizer",
    "adam",
    "--lr-scheduler",
    "noam",
    "--noam-r0",
    "1.0",
    "--noam-d-model",
    "16",
    "--warmup-updates",
    "6",
    "--criterion",
    "label_smoothed_cross_entropy",
    "--label-smoothing",
    "0.1",
    "--max-tokens",
    "1500",
    "--log-interval",
    "1",
    "--log-format",
    "simple",
    "--log-grad-norm-ratio",
    "--log-ta-weights",
    "last",
    "--no-epoch-checkpoints",
    "--cpu",
    "--num-workers",
    "0",
    "--seed",
    "3",
]


@pytest.fixture(scope="module")
def short_run(synthetic_bin, tmp_path_factory):
    out = tmp_path_factory.mktemp("ta_run")
    save, tb = out / "ckpt", out / "tb"
    first = run_cli(
        "fairseq-train",
        str(synthetic_bin),
        *TRAIN,
        "--save-dir",
        str(save),
        "--max-update",
        "6",
        "--tensorboard-logdir",
        str(tb),
    )
    w_first = torch.load(save / "checkpoint_last.pt")["model"][
        "encoder.transparent_attention.weight"
    ]
    resumed = run_cli(
        "fairseq-train", str(synthetic_bin), *TRAIN, "--save-dir", str(save), "--max-update", "9"
    )
    return {
        "dir": out,
        "save": save,
        "tb": tb,
        "first": first.stdout + first.stderr,
        "resumed": resumed.stdout + resumed.stderr,
        "w_first": w_first,
    }


def test_ratio_is_logged_positive_and_finite(short_run):
    series = parse_log_lines(short_run["first"].splitlines())
    steps = [x for x, _ in series["gnorm_ratio"]]
    assert steps == [1, 2, 3, 4, 5, 6]
    assert all(math.isfinite(v) and v > 0 for _, v in series["gnorm_ratio"])
    s = [series[f"ta_s{i}_2"][-1][1] for i in range(5)]
    assert sum(s) == pytest.approx(1.0, abs=1e-3)  # s_(i,M) of Eq. 1, in the train log
    # lr logged at update n is the one for the next update: Eq. 2 at t = n
    assert series["lr"][-1][1] == pytest.approx(noam_lr(6, 1.0, 16, 6), rel=1e-3)


def test_resume_keeps_weights_and_schedule(short_run):
    """Everything with state survives save/resume: the TA weights (they moved during the first
    run and the resumed run starts from them) and the noam learning rate."""
    assert not torch.allclose(short_run["w_first"], torch.zeros_like(short_run["w_first"]))
    assert "loaded checkpoint" in short_run["resumed"].lower()
    series = parse_log_lines(short_run["resumed"].splitlines())
    assert [x for x, _ in series["gnorm_ratio"]] == [7, 8, 9]
    for step, lr in series["lr"]:
        assert lr == pytest.approx(noam_lr(int(step), 1.0, 16, 6), rel=1e-3)
    w_last = torch.load(short_run["save"] / "checkpoint_last.pt")["model"][
        "encoder.transparent_attention.weight"
    ]
    assert w_last.shape == (5, 2) and not torch.equal(w_last, short_run["w_first"])


def test_beam_search_on_the_trained_model(short_run, synthetic_bin):
    gen = run_cli(
        "fairseq-generate",
        str(synthetic_bin),
        "--user-dir",
        PLUGIN_DIR,
        "--task",
        "translation_deep",
        "--path",
        str(short_run["save"] / "checkpoint_last.pt"),
        "--beam",
        "3",
        "--max-tokens",
        "2000",
        "--cpu",
        "--gen-subset",
        "valid",
    )
    hyps = [line for line in gen.stdout.splitlines() if line.startswith("H-")]
    assert len(hyps) == 101


def test_plots_from_log_and_from_tensorboard(short_run, tmp_path):
    log = tmp_path / "train.log"
    log.write_text(short_run["first"] + short_run["resumed"])
    assert plot_main([str(log), "--out-dir", str(tmp_path / "from_log"), "--labels", "ta-4l"]) == 0
    for name in ("grad_norm_ratio.png", "ta_weights.png", "loss.png", "training_series.json"):
        assert os.path.getsize(tmp_path / "from_log" / name) > 1000 or name.endswith(".json")
    pytest.importorskip("tensorboardX")
    pytest.importorskip("tensorboard")
    assert plot_main([str(short_run["tb"]), "--out-dir", str(tmp_path / "from_tb")]) == 0
    assert os.path.getsize(tmp_path / "from_tb" / "grad_norm_ratio.png") > 1000


def test_log_parser_reads_console_and_log_file_lines():
    lines = [
        "2026-01-01 00:00:01 | INFO | train_inner | epoch 001:      2 / 22 loss=9.4, num_updates=2, gnorm_ratio=2.5, ta_s0_6=0.2",  # noqa: E501
        "epoch 001:      4 / 22 loss=8.9, nll_loss=8.8, num_updates=4, lr=0.1, gnorm_ratio=1.5",  # --log-file
        "epoch 001 | loss 8.9 | num_updates 22 | gnorm_ratio 1.4",  # end of epoch: not a train_inner record
        "epoch 001 | valid on 'valid' subset | loss 8.5 | num_updates 22",
        '{"epoch": 1, "update": 0.5, "loss": "8.1", "num_updates": "6", "gnorm_ratio": "1.25"}',
        '{"epoch": 1, "train_loss": "8.0", "train_num_updates": "22"}',
        '2026-01-01 | INFO | valid | {"epoch": 1, "valid_loss": "8.4", "valid_num_updates": "22"}',
    ]
    series = parse_log_lines(lines)
    assert series["gnorm_ratio"] == [(2.0, 2.5), (4.0, 1.5), (6.0, 1.25)]
    assert series["loss"] == [(2.0, 9.4), (4.0, 8.9), (6.0, 8.1)]
    assert series["ta_s0_6"] == [(2.0, 0.2)]
