"""A study's fairseq runs: each system's optimiser and schedule (:func:`recipe`, from
:mod:`fairseq_deep.runs.recipes`), its fairseq-train run (:func:`train_run`), the stages of a grown
system, and fairseq-generate's run; :class:`fairseq_deep.runs.Run` values (``*_command``: their
command lines)."""

import os
from typing import List, Sequence, Tuple, Union

from ..models.families import Spec
from ..runs import Part, Run, grow, has_option, recipes, restore_flags
from .systems import System

#: validation and a saved checkpoint at the end of every epoch (``--valid-interval epoch``)
EPOCH = "epoch"

#: fairseq-train's precision flags, most specific first, and the precision each names
#: (:data:`fairseq_deep.runs.recipes.PRECISIONS`)
PRECISION_FLAGS = (
    ("--memory-efficient-fp16", "memory_efficient_fp16"),
    ("--amp", "amp"),
    ("--bf16", "bf16"),
    ("--fp16", "fp16"),
)


def interval(args) -> Union[int, str]:
    """Updates between validations (and saved checkpoints), or :data:`EPOCH`."""
    if args.valid_interval:
        return args.valid_interval
    return max(1, args.max_update // 10) if args.max_update else 500


def precision(args, system: System) -> str:
    """The precision a system trains in: the one its own flags or ``--train-args`` name
    (``--amp``, ``--bf16``, ...), else ``--precision``'s."""
    own = system.flags + list(getattr(args, "train_args_list", []))
    for flag, name in PRECISION_FLAGS:
        if has_option(own, flag):
            return name
    return getattr(args, "precision", None) or "fp32"


def recipe(args, arch: Spec) -> Tuple[str, Part, Part]:
    """(name, optimiser flags, LR-schedule flags) of a system: ``--recipe shared`` gives every
    system the study's Adam (0.9, 0.98) with inverse_sqrt warm-up over ``--warmup`` to ``--lr``;
    ``--recipe paper`` (the default, issue 25) gives a family the recipe of its paper where its
    declaration names one (``arch.recipe``: ``rnmt_plus``: Chen et al. Sec. 4.1, Adam (0.9, 0.999, eps 1e-6) and
    Eq. 1 with n = 32 replicas, peak 3.2 x ``--lr``: ``models/rnmt_plus/model.py``,
    ``recipe``, its settings; written by ``runs.recipes.paper``), the shared recipe otherwise.

    Deep-Att keeps the shared recipe (issue 25): Zhou et al.'s ``--optimizer deep_att`` (Adam with
    fixed l_f = 4e-5, l_r = 5e-4, L2 r = 2; Sec. 4.3) was tuned for 10 days of training and hardly
    moves a model in a study's budget (docs/deep_att.md, "Learning curves (issue 25)"); a system
    gets it by naming it (``--system "x=deep_att_ff_2x2 --optimizer deep_att --deep-att-lr-recurrent
    5e-4 --lr 4e-5 --lr-scheduler fixed"``).

    The Transformers (Vaswani et al.'s recipe, which Wang, Bapna and Dou et al. use) and the
    hybrids (Chen et al. train them with the Transformer schedule, Eq. 2) keep the shared recipe."""
    shared = ("shared", *recipes.study(args.lr, args.warmup))
    if getattr(args, "recipe", "shared") != "paper":
        return shared
    paper = recipes.paper(arch, args.lr, args.warmup)
    if paper is None:
        return shared
    return (arch.recipe.name, *paper)


def recipe_text(args, arch: Spec, flags: Sequence[str] = ()) -> str:
    """The results table's words for the optimiser and schedule a system (of ``arch``, a resolved
    --arch) trained with."""
    if recipes.gives(flags, "optimizer") or recipes.gives(flags, "schedule"):
        return "own flags"
    if recipe(args, arch)[0] != "shared":
        return arch.recipe.text(args.lr)
    return f"Adam (0.9, 0.98), inverse_sqrt, lr {args.lr}, warm-up {args.warmup}"


def train_run(args, system: System, seed: int, save_dir: str) -> Run:
    """fairseq-train of a system: the study's settings, then ``--train-args``, then the system's
    own flags (which so win: fairseq keeps the last value of a repeated option)."""
    own = system.flags + args.train_args_list
    run = Run.of(
        "train",
        args.data,
        Part("model", ["--arch", system.arch]),
        recipes.width(system.spec, args.width),
        arch=system.spec,
    )
    if args.dropout is not None:
        run += recipes.dropout(args.dropout)
    _, optimizer, schedule = recipe(args, system.spec)
    # the system's own optimizer, schedule or criterion replaces the recipe's (its --lr: the study's)
    run += recipes.learning_rate(args.lr) if recipes.gives(own, "optimizer") else optimizer
    if not recipes.gives(own, "schedule"):
        run += schedule
    if not recipes.gives(own, "criterion"):
        run += recipes.label_smoothed(args.label_smoothing)
    every = interval(args)
    # at EPOCH fairseq's default: validate and save at the end of every epoch
    intervals = (
        {}
        if every == EPOCH
        else dict(
            save_interval_updates=every, keep_interval_updates=1, validate_interval_updates=every
        )
    )
    run = run.plus(
        recipes.budget(max_tokens=args.max_tokens),
        recipes.seed(seed),
        recipes.saving(
            save_dir=save_dir,
            no_epoch_checkpoints=True,
            **intervals,
            patience=getattr(args, "patience", 0) or None,
        ),
    )
    if not any(has_option(own, flag) for flag, _ in PRECISION_FLAGS):
        run += Part("precision", recipes.PRECISIONS[precision(args, system)][0])
    run += recipes.json_log(args.log_interval)
    run += ["--skip-invalid-size-inputs-valid-test"]
    run += budget(args.max_update, args.minutes)
    if args.cpu:
        run += recipes.cpu()
    return run.plus(Part("train_args", args.train_args_list), Part("system", system.flags))


def budget(max_update: int, minutes: float, share: float = 1.0) -> Part:
    """``--max-update`` and ``--stop-time-hours`` (``share`` of ``minutes``)."""
    return recipes.budget(
        max_update=max_update or None,
        stop_time_hours=f"{minutes * share / 60:.6g}" if minutes else None,
    )


def train_command(args, system: System, seed: int, save_dir: str) -> List[str]:
    """``python -m fairseq_cli.train`` of :func:`train_run`."""
    return train_run(args, system, seed, save_dir).argv()


def _restore_grown(save_dir: str, grown: str) -> Part:
    """Restore a grown checkpoint with the optimizer, schedule and data reset (Li et al.'s
    learning-rate restart); nothing when ``save_dir`` has a checkpoint_last.pt (fairseq resumes it)."""
    if os.path.exists(os.path.join(save_dir, "checkpoint_last.pt")):
        return Part("restore")
    return restore_flags(grown)


def stage_runs(
    args, system: System, seed: int, run_dir: str
) -> Tuple[List[Tuple[str, Run, str]], Run]:
    """A grown system (``system.stages``): ([(name, run, the file that says it is done)], the
    last stage's train run).  Each earlier stage trains in ``run_dir/stage_D`` (from the
    previous stage's grown checkpoint), its last checkpoint is grown (fairseq-deep-grow --method
    stack), and the last stage (the system's own train run, in ``run_dir``) restores it.  Stage
    i of n stops at (i+1)/n of --minutes (fairseq's --stop-time-hours counts the training time that
    the checkpoints carry across growing: fairseq-deep-grow --keep-training-time) and trains
    --max-update / n updates (each counts from 0)."""
    n = len(system.stages) + 1
    depths = system.stages + [system.depth]

    def stage_budget(i):
        return budget(args.max_update and max(1, args.max_update // n), args.minutes, (i + 1) / n)

    steps = []
    for i, depth in enumerate(system.stages):
        stage_dir = os.path.join(run_dir, f"stage_{depth}")
        run = train_run(args, system, seed, stage_dir).plus(
            Part("depth", ["--encoder-layers", depth]), stage_budget(i)
        )
        if i > 0:
            run += _restore_grown(stage_dir, os.path.join(run_dir, f"grown_{depth}.pt"))
        steps.append((f"stage_{depth}", run, os.path.join(run_dir, f"stage_{depth}.done")))
        grown = os.path.join(run_dir, f"grown_{depths[i + 1]}.pt")
        steps.append(
            (
                f"grow_{depths[i + 1]}",
                grow(os.path.join(stage_dir, "checkpoint_last.pt"), grown, depths[i + 1]),
                grown,
            )
        )
    final = train_run(args, system, seed, run_dir).plus(stage_budget(n - 1))
    return steps, final + _restore_grown(run_dir, os.path.join(run_dir, f"grown_{system.depth}.pt"))


def stage_commands(
    args, system: System, seed: int, run_dir: str
) -> Tuple[List[Tuple[str, List[str], str]], List[str]]:
    """:func:`stage_runs` as command lines."""
    steps, final = stage_runs(args, system, seed, run_dir)
    return [(name, run.argv(), done) for name, run, done in steps], final.argv()


def generate_run(args, checkpoint: str, system_precision: str = "fp32") -> Run:
    """fairseq-generate of the test set with ``checkpoint``, in the decoding precision of the
    system's training precision (``--fp16`` for fp16 and AMP, ``--bf16`` for bf16:
    :data:`fairseq_deep.runs.recipes.PRECISIONS`)."""
    run = Run.of(
        "generate",
        args.data,
        recipes.decoding(
            path=checkpoint, gen_subset="test", beam=args.beam, batch_size=args.gen_batch_size
        ),
        ["--skip-invalid-size-inputs-valid-test"],
    )
    if args.spm:
        run += recipes.post_process("sentencepiece")
    elif args.remove_bpe:
        run += recipes.post_process(args.remove_bpe)
    run += Part("precision", recipes.PRECISIONS[system_precision][1])
    if args.cpu:
        run += recipes.cpu()
    return run.plus(Part("gen_args", args.gen_args_list))


def generate_command(args, checkpoint: str, system_precision: str = "fp32") -> List[str]:
    """``python -m fairseq_cli.generate`` of :func:`generate_run`."""
    return generate_run(args, checkpoint, system_precision).argv()
