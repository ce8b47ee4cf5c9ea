"""RNMT+ training techniques: the LR schedule of Eq. 1, adaptive gradient clipping (through fairseq's
own trainer), sentence-level cross-entropy with label smoothing and L2; rnmt_plus trained, resumed
and decoded through the real CLI."""

import math

import pytest
import torch
from fairseq import options, tasks
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from helpers import PLUGIN_DIR, random_batch, run_cli, tiny_dictionary

from fairseq_deep.optim.adaptive_clip import STATE_KEY, GradNormTracker
from fairseq_deep.optim.rnmt_lr_scheduler import rnmt_plus_lr


@pytest.fixture(autouse=True)
def one_thread(monkeypatch):
    """2 shared cores: one intra-op thread per process is several times faster than oversubscription."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    yield
    torch.set_num_threads(threads)


SMALL = [
    "--encoder-embed-dim",
    "16",
    "--decoder-embed-dim",
    "16",
    "--encoder-hidden-size",
    "8",
    "--decoder-hidden-size",
    "16",
    "--encoder-layers",
    "3",
    "--decoder-layers",
    "3",
]


# ---------------------------------------------------------------------------------------------
# Eq. 1
# ---------------------------------------------------------------------------------------------


def test_lr_schedule_matches_eq1_at_chosen_steps():
    n, p, s, e = 32, 500, 600000, 1200000  # App. A.3, En-De, 32 GPUs
    lr = lambda t: rnmt_plus_lr(t, 1e-4, n, p, s, e)  # noqa: E731
    assert lr(0) == pytest.approx(1e-4)
    assert lr(p) == pytest.approx(1e-4 * (1 + (n - 1) / n))  # linear warm-up ...
    assert lr(n * p) == pytest.approx(1e-4 * n)  # ... reaches n * 1e-4 after n p updates
    assert lr(s // n) == pytest.approx(1e-4 * n)  # flat until n t = s
    mid = (s + e) // 2 // n
    assert lr(mid) == pytest.approx(1e-4 * n * (2 * n) ** ((s - n * mid) / (e - s)))
    assert lr(e // n) == pytest.approx(5e-5)  # the decay ends at 5e-5 ...
    assert lr(e // n + 12345) == pytest.approx(5e-5)  # ... and stays there
    # one replica: no warm-up, 1e-4 until s, then the decay to 5e-5 at e
    assert (
        rnmt_plus_lr(0, n=1, s=100, e=200)
        == rnmt_plus_lr(99, n=1, s=100, e=200)
        == pytest.approx(1e-4)
    )
    assert rnmt_plus_lr(150, n=1, s=100, e=200) == pytest.approx(1e-4 * 2**-0.5)
    values = [lr(t) for t in range(0, e // n + 10, 997)]
    peak = values.index(max(values))
    assert all(a <= b + 1e-15 for a, b in zip(values[:peak], values[1 : peak + 1]))
    assert all(a >= b - 1e-15 for a, b in zip(values[peak:], values[peak + 1 :]))


def test_lr_scheduler_is_registered_and_drives_the_optimizer():
    from fairseq.optim.lr_scheduler import LR_SCHEDULER_REGISTRY

    from fairseq_deep.optim.rnmt_lr_scheduler import RNMTPlusLRScheduleConfig

    build_lr_scheduler = LR_SCHEDULER_REGISTRY["rnmt_plus"]

    from fairseq.optim import FairseqOptimizer

    class Opt(FairseqOptimizer):
        lr = None

        def __init__(self):
            pass

        def set_lr(self, lr):
            self.lr = lr

        def get_lr(self):
            return self.lr

    cfg = RNMTPlusLRScheduleConfig(
        rnmt_replicas=4, warmup_updates=10, rnmt_decay_start=400, rnmt_decay_end=800
    )
    opt = Opt()
    sched = build_lr_scheduler(cfg, opt)
    assert opt.lr == pytest.approx(1e-4)
    assert sched.step_update(40) == pytest.approx(4e-4) == opt.lr
    assert sched.step_update(150) == pytest.approx(rnmt_plus_lr(150, 1e-4, 4, 10, 400, 800))
    assert opt.lr < 4e-4
    with pytest.raises(ValueError, match="--rnmt-decay-end"):
        build_lr_scheduler(RNMTPlusLRScheduleConfig(rnmt_decay_start=5, rnmt_decay_end=5), opt)


# ---------------------------------------------------------------------------------------------
# Adaptive clipping
# ---------------------------------------------------------------------------------------------


def test_tracker_skips_a_spike_and_not_normal_steps():
    g = torch.Generator().manual_seed(0)
    tracker = GradNormTracker(threshold=4.0, decay=0.99, warmup=20)
    norms = torch.exp(torch.randn(300, generator=g) * 0.1 + 1.0).tolist()  # log-normal, std 0.1
    skipped = [tracker.step(n) for n in norms]
    assert not any(skipped)
    state = tracker.state_dict()
    assert tracker.step(math.exp(1.0 + 0.1 * 10))  # 10 sigma: skipped ...
    assert (
        tracker.skipped == 1 and tracker.state_dict()["observed"] == state["observed"]
    )  # ... and not counted
    assert not tracker.step(math.exp(1.0 + 0.1 * 2))  # 2 sigma: a normal step
    fresh = GradNormTracker(warmup=20)
    assert not any(
        fresh.step(1e6 if i == 5 else 1.0) for i in range(20)
    )  # nothing skipped in warm-up


def _trainer(data, extra=()):
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
            *SMALL,
            "--source-lang",
            "src",
            "--target-lang",
            "tgt",
            "--cpu",
            "--optimizer",
            "adam",
            "--lr",
            "1e-3",
            "--criterion",
            "sentence_cross_entropy",
            "--label-smoothing",
            "0.1",
            "--max-tokens",
            "400",
            # a short warm-up estimates the std from 5 norms only: a threshold of 8 std keeps the
            # normal early steps (whose norms drift) in; the injected spike is ~50 std away
            "--adaptive-clip",
            "--adaptive-clip-warmup",
            "5",
            "--adaptive-clip-threshold",
            "8",
            "--dropout",
            "0",
            "--seed",
            "1",
            *extra,
        ],
    )
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    task.load_dataset("train")
    model = task.build_model(cfg.model)
    criterion = task.build_criterion(cfg.criterion)
    trainer = Trainer(cfg, task, model, criterion)
    itr = task.get_batch_iterator(task.dataset("train"), max_tokens=400, seed=1).next_epoch_itr(
        shuffle=False
    )
    return trainer, criterion, itr


@pytest.mark.parametrize("extra", [[], ["--clip-norm", "0.05", "--update-freq", "2"]])
def test_adaptive_clip_skips_an_injected_spike_through_the_trainer(synthetic_bin, extra):
    torch.manual_seed(1)
    trainer, criterion, itr = _trainer(synthetic_bin, extra)
    update_freq = 2 if "--update-freq" in extra else 1
    spike_at = 6
    forward = criterion.forward
    step = {"n": 0}

    def spiky_forward(model, sample, reduce=True):
        loss, size, log = forward(model, sample, reduce)
        return (loss * 1e4 if step["n"] == spike_at else loss), size, log

    criterion.forward = spiky_forward
    adam = None
    for step["n"] in range(spike_at + 2):
        before = [p.detach().clone() for p in trainer.model.parameters()]
        steps_before = None
        if adam is not None:
            steps_before = adam.state[next(iter(adam.state))]["step"]
        trainer.train_step([next(itr) for _ in range(update_freq)])
        adam = trainer.optimizer.optimizer
        moved = any(not torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))
        state = adam.param_groups[0][STATE_KEY]
        if step["n"] == spike_at:
            assert not moved, "the spiked update moved the parameters"
            assert adam.state[next(iter(adam.state))]["step"] == steps_before, (
                "Adam's step count advanced"
            )
            assert state["skipped"] == 1
        else:
            assert moved, f"normal update {step['n']} was skipped"
    assert state["skipped"] == 1 and state["observed"] == spike_at + 1
    assert trainer.task.state_dict()[STATE_KEY]["skipped"] == 1


# ---------------------------------------------------------------------------------------------
# Sentence-level cross-entropy
# ---------------------------------------------------------------------------------------------


def _criterion_and_model(extra=()):
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(
        parser,
        [
            "dummy",
            "--task",
            "translation",
            "--arch",
            "rnmt_plus",
            *SMALL,
            "--cpu",
            "--dropout",
            "0",
            "--criterion",
            "sentence_cross_entropy",
            "--label-smoothing",
            "0.1",
            *extra,
        ],
    )
    cfg = convert_namespace_to_omegaconf(args)
    d = tiny_dictionary()
    task = tasks.translation.TranslationTask(cfg.task, d, d)
    torch.manual_seed(0)
    model = task.build_model(cfg.model)
    return task.build_criterion(cfg.criterion), model, d


def _sample(d):
    src, lengths, prev = random_batch(d, bsz=3, src_len=7, tgt_len=5)
    target = torch.cat([prev[:, 1:], torch.full((3, 1), d.eos())], 1)
    target[0, -2:] = d.pad()
    return {
        "net_input": {"src_tokens": src, "src_lengths": lengths, "prev_output_tokens": prev},
        "target": target,
        "ntokens": int(target.ne(d.pad()).sum()),
        "nsentences": 3,
    }


def test_sentence_cross_entropy_is_label_smoothed_ce_per_sentence():
    from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion

    criterion, model, d = _criterion_and_model()
    sample = _sample(d)
    loss, size, log = criterion(model, sample)
    ref = LabelSmoothedCrossEntropyCriterion(
        criterion.task, sentence_avg=False, label_smoothing=0.1
    )
    ref_loss, ref_size, _ = ref(model, sample)
    assert size == 3 and ref_size == sample["ntokens"]  # normalised per sentence, not per token
    torch.testing.assert_close(loss, ref_loss)


def test_l2_regularization_adds_exactly_lambda_w_to_the_normalised_gradient():
    lam = 1e-2
    plain, model, d = _criterion_and_model()
    with_l2, _, _ = _criterion_and_model(["--l2-regularization", str(lam)])
    sample = _sample(d)
    model.train()
    grads = []
    for crit in (plain, with_l2):
        model.zero_grad()
        loss, size, log = crit(model, sample)
        (loss / size).backward()  # what fairseq's trainer does (multiply_grads(1 / sample_size))
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    assert "l2" in log and log["loss"] == pytest.approx(
        float(loss - lam * size * log["l2"] / size), rel=1e-4
    )
    for name, p in model.named_parameters():
        expected = lam * p.detach() if p.dim() >= 2 else torch.zeros_like(p)
        torch.testing.assert_close(grads[1][name] - grads[0][name], expected, atol=1e-6, rtol=1e-4)


# ---------------------------------------------------------------------------------------------
# The real CLI
# ---------------------------------------------------------------------------------------------


def test_rnmt_plus_trains_resumes_and_generates_through_the_cli(synthetic_bin, tmp_path):
    save = tmp_path / "ckpt"
    train = [
        "fairseq-train",
        str(synthetic_bin),
        "--user-dir",
        PLUGIN_DIR,
        "--task",
        "translation_deep",
        "--arch",
        "rnmt_plus",
        *SMALL,
        "--source-lang",
        "src",
        "--target-lang",
        "tgt",
        "--cpu",
        "--optimizer",
        "adam",
        "--adam-betas",
        "(0.9, 0.999)",
        "--adam-eps",
        "1e-6",
        "--lr-scheduler",
        "rnmt_plus",
        "--rnmt-base-lr",
        "3e-3",
        "--rnmt-replicas",
        "2",
        "--warmup-updates",
        "2",
        "--rnmt-decay-start",
        "8",
        "--rnmt-decay-end",
        "16",
        "--criterion",
        "sentence_cross_entropy",
        "--label-smoothing",
        "0.1",
        "--l2-regularization",
        "1e-5",
        "--adaptive-clip",
        "--adaptive-clip-warmup",
        "2",
        "--clip-norm",
        "1.0",
        "--update-freq",
        "2",
        "--max-tokens",
        "600",
        "--dropout",
        "0.1",
        "--save-dir",
        str(save),
        "--no-epoch-checkpoints",
        "--log-format",
        "simple",
        "--log-interval",
        "1",
        "--seed",
        "1",
        "--num-workers",
        "0",
    ]
    out = run_cli(*train, "--max-update", "4").stdout
    assert "skipped_updates" in out
    state = torch.load(save / "checkpoint_last.pt", map_location="cpu")
    clip = state["last_optimizer_state"]["param_groups"][0][STATE_KEY]
    assert clip["observed"] + clip["skipped"] == 4
    run_cli(*train, "--max-update", "6")  # resume: the statistics continue from the checkpoint
    state = torch.load(save / "checkpoint_last.pt", map_location="cpu")
    clip = state["last_optimizer_state"]["param_groups"][0][STATE_KEY]
    assert clip["observed"] + clip["skipped"] == 6

    gen = run_cli(
        "fairseq-generate",
        str(synthetic_bin),
        "--user-dir",
        PLUGIN_DIR,
        "--path",
        str(save / "checkpoint_last.pt"),
        "--source-lang",
        "src",
        "--target-lang",
        "tgt",
        "--gen-subset",
        "test",
        "--beam",
        "3",
        "--batch-size",
        "16",
        "--max-len-b",
        "20",
        "--cpu",
    ).stdout
    hyps = [line for line in gen.splitlines() if line.startswith("H-")]
    assert len(hyps) == 101
