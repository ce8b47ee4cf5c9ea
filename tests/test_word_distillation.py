"""Issue 46 item 2: word-level distillation, ``--criterion word_distillation``
(fairseq_deep/criterions/word_distillation.py).

In process, on the synthetic data: alpha = 0 is ``label_smoothed_cross_entropy`` bit for bit (loss
and gradients); a student that is its teacher has KL 0 at every temperature (and, with top-K, the
teacher's mass outside its top K); top-K at the vocabulary's size is the full KL; the teacher is
nobody's parameter (no gradient, no optimizer slot, no DDP, not in the trainer's state, never in
train mode); an update of two micro-batches (``--update-freq 2``) is the update of their union; the
teacher follows the student to bfloat16 and float16; a student and a teacher of other families and
shapes.  Through fairseq-train: alpha = 0 is the plain run bit for bit (dropout on); a run killed
and resumed ends as the uninterrupted run (its checkpoint with a plain run's keys, the teacher's
file untouched); two CPU processes under DDP make the updates of one process with
``--update-freq 2``; ``--bf16`` and ``--fp16`` on CPU; a missing or bad ``--teacher-path`` (or
option) is one line before anything is created.
"""

import copy
import hashlib
import math
import sys

import pytest
import torch
from fairseq import options, tasks
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.trainer import Trainer
from helpers import PLUGIN_DIR, run_cli, tiny_flags
from test_cli_errors import assert_user_error
from test_distributed import inner_stats, two_processes
from test_distributed import run as run_distributed
from test_distributed import train_args as distributed_args
from test_resume import (
    MAX_UPDATE,
    SAVE_EVERY,
    assert_same,
    inner_losses,
    load,
    run_and_kill_after_first_save,
    run_to_end,
    train_argv,
)

from fairseq_deep.criterions.word_distillation import FrozenTeacher

TEACHER_ARCH = "transformer_dlcl"


@pytest.fixture(scope="module")
def plain_run(synthetic_bin, tmp_path_factory):
    """A plain run (label_smoothed_cross_entropy) of test_resume's settings: its checkpoint is the
    teacher of every test here, and the keys a distilled run's checkpoint must have."""
    save_dir = tmp_path_factory.mktemp("word_distillation") / "plain"
    log = run_to_end(train_argv(synthetic_bin, save_dir, TEACHER_ARCH, PLAIN))
    PLAIN_LOG[save_dir] = log
    return save_dir / "checkpoint_last.pt"


PLAIN = ["--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1"]
PLAIN_LOG = {}


def digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def setup(data, teacher, arch=TEACHER_ARCH, extra=(), criterion="word_distillation"):
    """fairseq-train's parsing of a tiny model's flags: (cfg, task with its train split, model,
    criterion), dropout off."""
    distill = ["--teacher-path", str(teacher)] if criterion == "word_distillation" else []
    argv = [
        str(data),
        "--task",
        "translation",
        "--arch",
        arch,
        *tiny_flags(arch),
        "--encoder-layers",
        "2",
        "--decoder-layers",
        "2",
        "--cpu",
        "--optimizer",
        "sgd",
        "--lr",
        "0.5",
        "--max-tokens",
        "300",
        "--criterion",
        criterion,
        "--label-smoothing",
        "0.1",
        *distill,
        *extra,
    ]
    args = options.parse_args_and_arch(options.get_training_parser(), argv)
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    task.load_dataset("train")
    torch.manual_seed(3)
    model = task.build_model(cfg.model)
    return cfg, task, model, task.build_criterion(cfg.criterion)


def batch(task, ids):
    dataset = task.dataset("train")
    return dataset.collater([dataset[i] for i in ids])


SAMPLE = list(range(8))


def loss_and_grads(criterion, model, sample):
    model.zero_grad()
    loss, size, log = criterion(model, sample)
    loss.backward()
    # fairseq 0.12.2's own transformer keeps copies of its encoder layers' weights for its fused
    # inference path (BetterTransformer), which no loss reaches: parameters without a gradient left out
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    assert grads
    return loss.detach(), size, log, grads


def test_alpha_zero_is_label_smoothed_cross_entropy(synthetic_bin, plain_run):
    flags = ["--distill-alpha", "0", "--distill-temperature", "2"]
    _, task, model, distill = setup(synthetic_bin, plain_run, extra=flags)
    _, _, _, plain = setup(synthetic_bin, None, criterion="label_smoothed_cross_entropy")
    sample = batch(task, SAMPLE)
    loss, size, log, grads = loss_and_grads(distill, model, sample)
    loss_ls, size_ls, log_ls, grads_ls = loss_and_grads(plain, model, sample)
    assert torch.equal(loss, loss_ls) and size == size_ls
    assert torch.equal(log["nll_loss"], log_ls["nll_loss"]) and torch.equal(log["ce_loss"], loss)
    assert float(log["kd_loss"]) > 0  # computed and logged, weighted 0
    for name, g in grads_ls.items():
        assert torch.equal(grads[name], g), name


@pytest.mark.parametrize("temperature", [0.5, 1.0, 4.0])
def test_student_equal_to_its_teacher_has_kl_zero(synthetic_bin, plain_run, temperature):
    flags = ["--distill-temperature", str(temperature)]
    _, task, model, criterion = setup(synthetic_bin, plain_run, extra=flags)
    model.load_state_dict(load(plain_run)["model"])
    sample = batch(task, SAMPLE)
    _, _, log = criterion(model, sample)
    assert abs(float(log["kd_loss"])) < 1e-5 * sample["ntokens"]
    # top-K: the KL is then the teacher's own mass outside its top K, -log sum_{S} p
    criterion.top_k = 3
    _, _, log = criterion(model, sample)
    with torch.no_grad():
        net_output = model(**sample["net_input"])
        lprobs = criterion.log_probs_at_temperature(model, net_output, sample)
    inside = lprobs.exp().topk(3, dim=-1).values.sum(-1)
    mask = sample["target"].view(-1).ne(task.target_dictionary.pad())
    expected = -inside.log()[mask].sum()
    assert float(expected) > 1.0  # the top 3 miss some of the teacher's mass
    torch.testing.assert_close(log["kd_loss"], expected, rtol=1e-4, atol=1e-4)


def test_top_k_of_the_vocabulary_is_the_full_kl(synthetic_bin, plain_run):
    flags = ["--distill-temperature", "2", "--distill-alpha", "1"]
    _, task, model, criterion = setup(synthetic_bin, plain_run, extra=flags)
    sample = batch(task, SAMPLE)
    full = loss_and_grads(criterion, model, sample)
    criterion.top_k = len(task.target_dictionary)
    top = loss_and_grads(criterion, model, sample)
    assert float(full[0]) > 0
    torch.testing.assert_close(top[0], full[0], rtol=1e-5, atol=1e-5)
    for name, g in full[3].items():
        torch.testing.assert_close(top[3][name], g, rtol=1e-4, atol=1e-6, msg=name)
    criterion.top_k = 4  # a smaller K is another objective
    assert not torch.allclose(loss_and_grads(criterion, model, sample)[0], full[0])


def test_teacher_is_frozen_and_nobodys_parameter(synthetic_bin, plain_run):
    cfg, task, model, criterion = setup(synthetic_bin, plain_run)
    teacher = criterion.teacher.model
    before = copy.deepcopy(teacher.state_dict())
    assert list(criterion.parameters()) == [] and criterion.state_dict() == {}
    assert all(not p.requires_grad for p in teacher.parameters())
    student = [p.detach().clone() for p in model.parameters()]
    trainer = Trainer(cfg, task, model, criterion)
    assert trainer.criterion is criterion  # not wrapped: it has no parameters
    for ids in ([0, 1, 2, 3], [4, 5, 6, 7]):
        trainer.train_step([batch(task, ids)])
    assert not teacher.training  # the trainer's criterion.train() did not reach it
    assert all(p.grad is None for p in teacher.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(student, trainer.model.parameters()))
    optimized = {id(p) for group in trainer.optimizer.param_groups for p in group["params"]}
    assert optimized == {id(p) for p in model.parameters()}
    for name, value in teacher.state_dict().items():
        assert torch.equal(value, before[name]), name
    trainer.consolidate_optimizer()  # what save_checkpoint does first
    state = trainer.state_dict()
    assert state["criterion"] is None and state["model"].keys() == model.state_dict().keys()


def test_update_freq_two_is_the_update_of_the_double_batch(synthetic_bin, plain_run):
    """Two micro-batches in one update (what ``--update-freq 2`` and two DDP workers give the
    trainer) move the student as their union in one batch does: the loss is a sum over tokens and
    the trainer divides by the update's sample size."""
    flags = ["--distill-temperature", "2", "--distill-top-k", "5"]
    params = []
    for micro in ([[0, 1, 2, 3], [4, 5, 6, 7]], [SAMPLE]):
        cfg, task, model, criterion = setup(synthetic_bin, plain_run, extra=flags)
        trainer = Trainer(cfg, task, model, criterion)
        log = trainer.train_step([batch(task, ids) for ids in micro])
        assert log is not None
        params.append([p.detach().clone() for p in trainer.model.parameters()])
    assert any(not torch.equal(a, b) for a, b in zip(params[0], model.parameters()))
    for a, b in zip(*params):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_teacher_follows_the_student_to_half_precision(synthetic_bin, plain_run, dtype):
    _, task, model, criterion = setup(synthetic_bin, plain_run, extra=["--distill-top-k", "5"])
    model.to(dtype=dtype)
    loss, _, log, grads = loss_and_grads(criterion, model, batch(task, SAMPLE))
    assert {p.dtype for p in criterion.teacher.model.parameters()} == {dtype}
    assert math.isfinite(float(loss)) and float(log["kd_loss"]) > 0
    assert all(torch.isfinite(g).all() for g in grads.values())


@pytest.mark.parametrize(
    "student,student_flags,teacher",
    [
        # a deep encoder and a one-layer decoder (Kasai et al. 2021) of fairseq's own Transformer,
        # taught by an RNMT+ model
        ("transformer", ["--encoder-layers", "3", "--decoder-layers", "1"], "rnmt_plus"),
        # an RNMT+ student, taught by the DLCL Transformer
        ("rnmt_plus", [], TEACHER_ARCH),
    ],
    ids=["transformer_3+1-by-rnmt_plus", "rnmt_plus-by-transformer_dlcl"],
)
def test_any_student_any_teacher(synthetic_bin, plain_run, student, student_flags, teacher):
    _, task, model, criterion = setup(synthetic_bin, plain_run, student, student_flags)
    if teacher != TEACHER_ARCH:
        _, _, teacher_model, _ = setup(synthetic_bin, plain_run, teacher)
        criterion.teacher = FrozenTeacher(teacher_model)
    loss, _, log, grads = loss_and_grads(criterion, model, batch(task, SAMPLE))
    assert math.isfinite(float(loss)) and float(log["kd_loss"]) > 0
    assert all(torch.isfinite(g).all() for g in grads.values())
    assert all(p.grad is None for p in criterion.teacher.model.parameters())


def distilled(teacher, *extra):
    return [
        "--criterion",
        "word_distillation",
        "--teacher-path",
        str(teacher),
        "--label-smoothing",
        "0.1",
        "--distill-temperature",
        "2",
        "--distill-top-k",
        "5",
        *extra,
    ]


def test_alpha_zero_through_fairseq_train(synthetic_bin, plain_run, tmp_path):
    """The plain run again, with dropout on, under word_distillation at alpha = 0: the same losses
    and the same model, bit for bit (the teacher draws nothing from the student's random state)."""
    flags = distilled(plain_run, "--distill-alpha", "0")
    log = run_to_end(train_argv(synthetic_bin, tmp_path / "alpha0", TEACHER_ARCH, flags))
    plain_log = PLAIN_LOG[plain_run.parent]
    assert inner_losses(log) == inner_losses(plain_log)
    assert sorted(inner_losses(log)) == list(range(1, MAX_UPDATE + 1))
    assert all(float(v) > 0 for v in inner_losses(log, "kd_loss").values())
    assert_same(load(plain_run)["model"], load(tmp_path / "alpha0" / "checkpoint_last.pt")["model"])


def test_killed_run_resumes_exactly(synthetic_bin, plain_run, tmp_path):
    """test_resume.py's check, with the teacher reloaded from --teacher-path; the checkpoints keep
    a plain run's keys and the teacher's file is not written."""
    teacher_digest = digest(plain_run)
    flags = distilled(plain_run)
    reference = run_to_end(train_argv(synthetic_bin, tmp_path / "ref", TEACHER_ARCH, flags))
    resumed_dir = tmp_path / "resumed"
    argv = train_argv(synthetic_bin, resumed_dir, TEACHER_ARCH, flags)
    killed_log, _ = run_and_kill_after_first_save(argv)
    k = load(resumed_dir / "checkpoint_last.pt")["optimizer_history"][-1]["num_updates"]
    assert SAVE_EVERY <= k < MAX_UPDATE
    resumed = run_to_end(argv)
    assert f"@ {k} updates" in resumed

    ref_kd, res_kd = inner_losses(reference, "kd_loss"), inner_losses(resumed, "kd_loss")
    assert sorted(res_kd) == list(range(k + 1, MAX_UPDATE + 1))
    assert {u: ref_kd[u] for u in res_kd} == res_kd
    ref_losses, res_losses = inner_losses(reference), inner_losses(resumed)
    assert {u: ref_losses[u] for u in res_losses} == res_losses
    ref = load(tmp_path / "ref" / "checkpoint_last.pt")
    res = load(resumed_dir / "checkpoint_last.pt")
    assert_same(ref["model"], res["model"], "model")
    assert_same(ref["last_optimizer_state"], res["last_optimizer_state"], "optimizer")

    plain = load(plain_run)
    assert ref.keys() == plain.keys() and ref["model"].keys() == plain["model"].keys()
    assert ref["criterion"] is None and plain["criterion"] is None
    assert not any("teacher" in key for key in ref["model"])
    assert digest(plain_run) == teacher_digest


def test_two_processes_equal_update_freq_two(synthetic_bin, plain_run, tmp_path):
    """test_distributed.py's check under word_distillation: the teacher runs in each worker, the
    criterion is not wrapped in DDP (it has no parameters)."""
    flags = distilled(plain_run)
    single = run_distributed(
        [
            sys.executable,
            "-m",
            "fairseq_cli.train",
            *distributed_args(synthetic_bin, tmp_path / "one", TEACHER_ARCH, flags),
            "--update-freq",
            "2",
        ]
    )
    pair = run_distributed(
        two_processes(distributed_args(synthetic_bin, tmp_path / "two", TEACHER_ARCH, flags))
    )
    assert "distributed init (rank 1)" in pair and "distributed_world_size': 2" in pair
    for key in ("loss", "kd_loss"):
        one, two = inner_stats(single, key), inner_stats(pair, key)
        assert sorted(one) == sorted(two) and len(one) == 4
        for u in one:
            assert abs(one[u] - two[u]) <= 1.5e-3, (key, u, one[u], two[u])


@pytest.mark.parametrize("precision", ["--bf16", "--fp16"])
def test_half_precision_on_cpu(synthetic_bin, plain_run, tmp_path, precision):
    """fairseq's --bf16 and --fp16 (FP16Optimizer, loss scaling) with the package's CPU shims:
    the teacher cast as the student is, the KL finite."""
    flags = [*distilled(plain_run), precision]
    log = run_to_end(train_argv(synthetic_bin, tmp_path / "half", TEACHER_ARCH, flags))
    kd = inner_losses(log, "kd_loss")
    assert sorted(kd) == list(range(1, MAX_UPDATE + 1))
    assert all(0 < float(v) < 100 for v in kd.values()), kd


@pytest.mark.parametrize(
    "flags,fragment",
    [
        ([], "--criterion word_distillation needs --teacher-path TEACHER.pt"),
        (["--teacher-path", "nowhere.pt"], "--teacher-path nowhere.pt: no such checkpoint file"),
        (["--teacher-path", "TEXT"], "is not a checkpoint"),
        (["--teacher-path", "PLAIN", "--distill-temperature", "0"], "--distill-temperature 0"),
    ],
    ids=["missing", "no-file", "not-a-checkpoint", "temperature"],
)
def test_bad_teacher_is_one_line(synthetic_bin, plain_run, tmp_path, flags, fragment):
    text = tmp_path / "teacher.txt"
    text.write_text("not a model\n")
    names = {"TEXT": str(text), "PLAIN": str(plain_run)}
    save_dir = tmp_path / "save"
    proc = run_cli(
        "fairseq-deep-train",
        str(synthetic_bin),
        "--arch",
        TEACHER_ARCH,
        "--optimizer",
        "adam",
        "--max-tokens",
        "300",
        "--cpu",
        "--save-dir",
        str(save_dir),
        "--criterion",
        "word_distillation",
        *[names.get(f, f) for f in flags],
        cwd=tmp_path,
        check=False,
        timeout=300,
    )
    assert_user_error(proc, "fairseq-deep-train", fragment, alone=True)
    assert not save_dir.exists()  # nothing created


def test_plain_fairseq_train_gets_the_same_line(synthetic_bin, tmp_path):
    """fairseq-train --user-dir builds the criterion, which checks its options itself."""
    proc = run_cli(
        sys.executable,
        "-m",
        "fairseq_cli.train",
        str(synthetic_bin),
        "--user-dir",
        PLUGIN_DIR,
        "--arch",
        TEACHER_ARCH,
        "--optimizer",
        "adam",
        "--max-tokens",
        "300",
        "--cpu",
        "--save-dir",
        str(tmp_path / "save"),
        "--criterion",
        "word_distillation",
        check=False,
        timeout=300,
    )
    assert proc.returncode != 0
    assert "--criterion word_distillation needs --teacher-path TEACHER.pt" in proc.stderr


def test_teacher_of_other_dictionaries_is_one_line(synthetic_bin, plain_run, tmp_path):
    """A teacher whose target dictionary is not the data-bin's (its embeddings one row short) is
    refused by the criterion's loader (fairseq_deep.teacher) in one line naming --teacher-path."""
    state = load(plain_run)
    for key in [k for k in state["model"] if k.startswith("decoder.") and "embed_tokens" in k]:
        state["model"][key] = state["model"][key][:-1].clone()
    other = tmp_path / "other_dictionaries.pt"
    torch.save(state, other)
    proc = run_cli(
        "fairseq-deep-train",
        str(synthetic_bin),
        "--arch",
        TEACHER_ARCH,
        "--optimizer",
        "adam",
        "--max-tokens",
        "300",
        "--cpu",
        "--save-dir",
        str(tmp_path / "save"),
        *distilled(other),
        check=False,
        timeout=300,
    )
    assert_user_error(proc, "fairseq-deep-train", f"--teacher-path {other}", "other dictionaries")
