"""A study's fairseq command lines: each system's optimiser and schedule (:func:`recipe`), its
fairseq-train command, the stages of a grown system, and fairseq-generate's command; built with
:mod:`fairseq_deep.runs`."""

import os
from typing import List, Sequence, Tuple

from ..models import families
from ..runs import (
    GENERATE,
    TRAIN,
    command,
    grow_command,
    has_option,
    restore_flags,
    width_flags,
)
from .systems import System


def interval(args) -> int:
    """Updates between validations (and saved checkpoints)."""
    if args.valid_interval:
        return args.valid_interval
    return max(1, args.max_update // 10) if args.max_update else 500


def _paper_recipe(arch: str):
    """The paper's recipe that the family of ``arch`` declares (``recipe`` of its declaration,
    :mod:`fairseq_deep.models.families`), or None."""
    family = families.of_arch(arch)  # an unknown --arch: a UserError
    return None if family is None else family.recipe


def recipe(args, arch: str) -> Tuple[str, List[str], List[str]]:
    """(name, optimiser flags, LR-schedule flags) of a system: ``--recipe shared`` gives every
    system the study's Adam (0.9, 0.98) with inverse_sqrt warm-up over ``--warmup`` to ``--lr``;
    ``--recipe paper`` (the default, issue 25) gives a family the recipe of its paper where its
    declaration names one (``rnmt_plus``: Chen et al. Sec. 4.1, Adam (0.9, 0.999, eps 1e-6) and
    Eq. 1 with n = 32 replicas, peak 3.2 x ``--lr``: ``models/rnmt_plus/model.py``,
    ``paper_recipe``), the shared recipe otherwise.

    Deep-Att keeps the shared recipe (issue 25): Zhou et al.'s ``--optimizer deep_att`` (Adam with
    fixed l_f = 4e-5, l_r = 5e-4, L2 r = 2; Sec. 4.3) was tuned for 10 days of training and hardly
    moves a model in a study's budget (docs/deep_att.md, "Learning curves (issue 25)"); a system
    gets it by naming it (``--system "x=deep_att_ff_2x2 --optimizer deep_att --deep-att-lr-recurrent
    5e-4 --lr 4e-5 --lr-scheduler fixed"``).

    The Transformers (Vaswani et al.'s recipe, which Wang, Bapna and Dou et al. use) and the
    hybrids (Chen et al. train them with the Transformer schedule, Eq. 2) keep the shared recipe."""
    shared = (
        "shared",
        [
            "--optimizer",
            "adam",
            "--adam-betas",
            "(0.9, 0.98)",
            "--adam-eps",
            "1e-8",
            "--lr",
            str(args.lr),
        ],
        [
            "--lr-scheduler",
            "inverse_sqrt",
            "--warmup-updates",
            str(args.warmup),
            "--warmup-init-lr",
            "1e-07",
        ],
    )
    if getattr(args, "recipe", "shared") != "paper":
        return shared
    paper = _paper_recipe(arch)
    if paper is None:
        return shared
    optimizer, schedule = paper.flags(args.lr, args.warmup)
    return paper.name, optimizer, schedule


def recipe_text(args, arch: str, flags: Sequence[str] = ()) -> str:
    """The results table's words for the optimiser and schedule a system trained with."""
    if has_option(flags, "--optimizer") or has_option(flags, "--lr-scheduler"):
        return "own flags"
    if recipe(args, arch)[0] != "shared":
        return _paper_recipe(arch).text(args.lr)
    return f"Adam (0.9, 0.98), inverse_sqrt, lr {args.lr}, warm-up {args.warmup}"


def train_command(args, system: System, seed: int, save_dir: str) -> List[str]:
    """``python -m fairseq_cli.train``: the study's settings, then ``--train-args``, then the
    system's own flags (which so win: fairseq keeps the last value of a repeated option)."""
    own = system.flags + args.train_args_list
    cmd = command(TRAIN, args.data, "--arch", system.arch, *width_flags(system.arch, args.width))
    if args.dropout is not None:
        cmd += ["--dropout", str(args.dropout)]
    _, optimizer, schedule = recipe(args, system.arch)
    if not has_option(own, "--optimizer"):
        cmd += optimizer
    else:
        cmd += ["--lr", str(args.lr)]
    if not has_option(own, "--lr-scheduler"):
        cmd += schedule
    if not has_option(own, "--criterion"):
        cmd += [
            "--criterion",
            "label_smoothed_cross_entropy",
            "--label-smoothing",
            str(args.label_smoothing),
        ]
    every = interval(args)
    cmd += [
        "--max-tokens",
        str(args.max_tokens),
        "--seed",
        str(seed),
        "--save-dir",
        save_dir,
        "--no-epoch-checkpoints",
        "--save-interval-updates",
        str(every),
        "--keep-interval-updates",
        "1",
        "--validate-interval-updates",
        str(every),
        "--log-format",
        "json",
        "--log-interval",
        str(args.log_interval),
        "--skip-invalid-size-inputs-valid-test",
    ]
    if args.max_update:
        cmd += ["--max-update", str(args.max_update)]
    if args.minutes:
        cmd += ["--stop-time-hours", f"{args.minutes / 60:.6g}"]
    if args.cpu:
        cmd += ["--cpu", "--num-workers", "0"]
    return cmd + args.train_args_list + system.flags


def _restore_grown(save_dir: str, grown: str) -> List[str]:
    """Restore a grown checkpoint with the optimizer, schedule and data reset (Li et al.'s
    learning-rate restart); nothing when ``save_dir`` has a checkpoint_last.pt (fairseq resumes it)."""
    if os.path.exists(os.path.join(save_dir, "checkpoint_last.pt")):
        return []
    return restore_flags(grown)


def stage_commands(
    args, system: System, seed: int, run_dir: str
) -> Tuple[List[Tuple[str, List[str], str]], List[str]]:
    """A grown system (``system.stages``): ([(name, command, the file that says it is done)], the
    last stage's train command).  Each earlier stage trains in ``run_dir/stage_D`` (from the
    previous stage's grown checkpoint), its last checkpoint is grown (fairseq-deep-grow --method
    stack), and the last stage (the system's own train command, in ``run_dir``) restores it.  Stage
    i of n stops at (i+1)/n of --minutes (fairseq's --stop-time-hours counts the training time that
    the checkpoints carry across growing: fairseq-deep-grow --keep-training-time) and trains
    --max-update / n updates (each counts from 0)."""
    n = len(system.stages) + 1
    depths = system.stages + [system.depth]

    def budget(i):
        flags = []
        if args.max_update:
            flags += ["--max-update", str(max(1, args.max_update // n))]
        if args.minutes:
            flags += ["--stop-time-hours", f"{args.minutes * (i + 1) / n / 60:.6g}"]
        return flags

    steps = []
    for i, depth in enumerate(system.stages):
        stage_dir = os.path.join(run_dir, f"stage_{depth}")
        cmd = (
            train_command(args, system, seed, stage_dir)
            + ["--encoder-layers", str(depth)]
            + budget(i)
        )
        if i > 0:
            cmd += _restore_grown(stage_dir, os.path.join(run_dir, f"grown_{depth}.pt"))
        steps.append((f"stage_{depth}", cmd, os.path.join(run_dir, f"stage_{depth}.done")))
        grown = os.path.join(run_dir, f"grown_{depths[i + 1]}.pt")
        steps.append(
            (
                f"grow_{depths[i + 1]}",
                grow_command(os.path.join(stage_dir, "checkpoint_last.pt"), grown, depths[i + 1]),
                grown,
            )
        )
    final = train_command(args, system, seed, run_dir) + budget(n - 1)
    return steps, final + _restore_grown(run_dir, os.path.join(run_dir, f"grown_{system.depth}.pt"))


def generate_command(args, checkpoint: str) -> List[str]:
    """``python -m fairseq_cli.generate`` of the test set with ``checkpoint``."""
    cmd = command(
        GENERATE,
        args.data,
        "--path",
        checkpoint,
        "--gen-subset",
        "test",
        "--beam",
        str(args.beam),
        "--batch-size",
        str(args.gen_batch_size),
        "--skip-invalid-size-inputs-valid-test",
    )
    if args.spm:
        cmd += ["--post-process", "sentencepiece"]
    elif args.remove_bpe:
        cmd += ["--post-process", args.remove_bpe]
    if args.cpu:
        cmd += ["--cpu", "--num-workers", "0"]
    return cmd + args.gen_args_list
