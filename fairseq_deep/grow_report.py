"""What ``fairseq-deep-grow`` says when it has grown a model: the grown model, what became of the
shallow run's training time, and the two commands that continue training it, one taking the
model options from the grown checkpoint (``--model-from``), one with every model option written
out (:func:`fairseq_deep.model_options.model_command`).  Both restart the learning rate as
examples/grow/run.sh does (a fresh optimizer and schedule, a warm-up of a quarter of the shallow
run's: :func:`fairseq_deep.runs.recipes.restart`), take the shallow run's other training options
(:func:`training_options`), and leave the budget (``--max-update``, ``--stop-time-hours``,
``--max-epoch``) to the reader as shell variables, named in a line of their own (:func:`continued`):
the shallow run's budget was for a shallower model."""

import os
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from .model_options import _same, model_command, options_of
from .progress import hms
from .runs import Part, Run, Variable, option, recipes, restore_flags

#: the groups of a fairseq configuration, in the order an option's value is looked up
GROUPS = (
    "common",
    "common_eval",
    "distributed_training",
    "dataset",
    "optimization",
    "checkpoint",
    "bmuf",
    "ema",
    "task",
    "criterion",
    "optimizer",
    "lr_scheduler",
)
#: options of the shallow run that the next one must not repeat: where it writes and what it
#: restores (the command says), the data (its first argument), the processes of a distributed run
NOT_REPEATED = {
    "data",
    "save_dir",
    "restore_file",
    "reset_optimizer",
    "reset_lr_scheduler",
    "reset_dataloader",
    "reset_meters",
    "finetune_from_model",
    "user_dir",
    "arch",
    "distributed_world_size",
    "distributed_rank",
    "distributed_init_method",
    "distributed_port",
    "device_id",
    "local_rank",
    "distributed_no_spawn",
    "distributed_num_procs",
    "task",
    "criterion",
    "optimizer",
    "lr_scheduler",
}


def _word(value) -> str:
    """A value as it was typed: ``--stop-time-hours 1``, not the configuration's ``1.0``."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def training_options(cfg: Optional[Dict]) -> Optional[List[str]]:
    """The shallow run's training options (those of fairseq-train's parser whose value in the
    checkpoint's configuration ``cfg`` differs from the parser's default) as arguments: its task,
    criterion, optimizer and schedule and their options, batches, budget, logging, ...; not its
    model options (:func:`fairseq_deep.model_options.model_command`), nor :data:`NOT_REPEATED`.
    None where the checkpoint has no configuration of groups (fairseq before 0.10)."""
    from fairseq import options
    from fairseq.models import ARCH_MODEL_REGISTRY

    if not isinstance(cfg, dict) or not isinstance(cfg.get("task"), dict):
        return None
    base = []
    for group in ("task", "criterion", "optimizer", "lr_scheduler"):  # each one option's name
        name = (cfg.get(group) or {}).get("_name")
        if name:
            base += [option(group), str(name)]
    arch = getattr(cfg.get("model"), "arch", None)
    parser = options.get_training_parser()
    defaults = options.parse_args_and_arch(
        parser, ["DATA", *base, *(["--arch", arch] if arch else [])]
    )
    values: Dict[str, object] = {}
    for group in GROUPS:
        for key, value in (cfg.get(group) or {}).items():
            values.setdefault(key, value)
    skip = NOT_REPEATED | set(
        options_of(ARCH_MODEL_REGISTRY[arch]) if arch in ARCH_MODEL_REGISTRY else ()
    )
    argv, seen = list(base), set()
    for action in parser._actions:
        dest = action.dest
        if not action.option_strings or dest in skip or dest in seen or dest not in values:
            continue
        seen.add(dest)
        value = values[dest]
        if (
            value is None
            or isinstance(value, dict)
            or (isinstance(value, str) and value.startswith("${"))
        ):
            continue
        default = getattr(defaults, dest, None)
        if action.nargs == 0:
            if bool(value) != bool(default) and bool(value) == bool(action.const):
                argv.append(max(action.option_strings, key=len))
            continue
        if _same(value, default) or (
            isinstance(value, list) and len(value) == 1 and _same(value[0], default)
        ):
            continue
        text = ",".join(map(_word, value)) if isinstance(value, (list, tuple)) else _word(value)
        name = max(action.option_strings, key=len)
        argv += [f"{name}={text}"] if text.startswith("-") else [name, text]
    return argv


#: fairseq-train's options that bound a run (``runs.recipes.LIMITS``), and the shell variables the
#: next command reads them from (``--max-update``: ``MAX_UPDATE``)
BUDGET = {option(name): name.upper() for name in recipes.LIMITS}
#: the shallow run's warm-up, which the next run's restart replaces
WARMUP = option("warmup_updates")


@dataclass
class Continued:
    """The shallow run's training options as the next run takes them (:func:`continued`):
    ``training`` (all but the warm-up and the budget), ``warmup`` (its ``--warmup-updates``, if
    any), ``budget`` (``{option: its value}``, each left to a :data:`BUDGET` variable)."""

    training: List[str]
    warmup: Optional[str]
    budget: Dict[str, str]
    known: bool = True  # False: the checkpoint held no configuration to read them from

    def parts(self) -> Tuple[Part, ...]:
        restart = (recipes.restart(self.warmup),) if self.warmup is not None else ()
        limits = {flag[2:].replace("-", "_"): Variable(BUDGET[flag]) for flag in self.budget}
        return (Part("training", self.training), *restart, recipes.budget(**limits))

    def note(self) -> str:
        """The line that says what the next command takes and leaves to the reader."""
        if self.warmup is not None:
            restart = recipes.restart(self.warmup)[1]
            how = (
                f"a learning-rate restart as examples/grow/run.sh's (a fresh optimizer and schedule, "
                f"--warmup-updates {restart}: a quarter of the shallow run's {self.warmup})"
            )
        else:
            how = "a fresh optimizer and schedule (--reset-optimizer --reset-lr-scheduler)"
        if not self.known:
            return (
                f"next: {how}; the checkpoint holds no training options: give yours, a budget "
                "(--max-update, --stop-time-hours) and a warm-up of a quarter of the shallow run's "
                "(--warmup-updates), as examples/grow/run.sh does"
            )
        if self.budget:
            names = " ".join(f"{BUDGET[o]}=..." for o in self.budget)
            was = " ".join(f"{o} {v}" for o, v in self.budget.items())
            budget = (
                f"the budget is yours: set {names} first (the shallow run's was {was}, for a "
                "shallower model; examples/grow/run.sh gives each stage STAGE_UPDATES)"
            )
        else:
            budget = "the shallow run had no budget (--max-update, --stop-time-hours): add one"
        return f"next: {how}, the shallow run's other training options; {budget}"


def continued(shallow: Optional[List[str]]) -> Continued:
    """The shallow run's training options ``shallow`` (:func:`training_options`) split for the
    next run: its ``--warmup-updates`` (replaced by the restart's), its budget (:data:`BUDGET`,
    left to shell variables) and the rest (taken as they are)."""
    training, warmup, budget = [], None, {}
    words = list(shallow or [])
    i = 0
    while i < len(words):
        name, sep, value = words[i].partition("=")
        if not sep and i + 1 < len(words) and not words[i + 1].startswith("--"):
            value, step = words[i + 1], 2
        else:
            step = 1
        if name in BUDGET and (sep or step == 2):
            budget[name] = value
        elif name == WARMUP and (sep or step == 2):
            warmup = value
        else:
            training += words[i : i + step]
        i += step
    return Continued(training, warmup, budget, known=shallow is not None)


def training_time_line(summary: Dict) -> str:
    spent = hms(summary["training_time"])
    if summary["training_time_kept"]:
        return (
            f"training time: kept (--keep-training-time): the next run's --stop-time-hours counts the shallow "
            f"run's {spent}"
        )
    return (
        f"training time: the shallow run's {spent} is not carried over: the next run's --stop-time-hours is "
        "its own (--keep-training-time keeps it, for comparisons in equal time)"
    )


def report(summary: Dict, out: str) -> str:
    """The lines printed after growing ``summary`` (:func:`fairseq_deep.grow.grow`'s) into ``out``."""
    enc, dec = summary["encoder_layers"], summary["decoder_layers"]
    lines = [
        f"{out}: {summary['arch']} {enc[0]}+{dec[0]} -> {summary['grown_arch']} {enc[1]}+{dec[1]} layers "
        f"({summary['method']}): {summary['copied']} tensors copied, {summary['set']} set"
    ]
    lines += [f"  note: {note}" for note in summary["notes"]]
    lines.append(training_time_line(summary))
    shallow = training_options(summary.get("cfg"))  # so that it runs as printed
    from_checkpoint, written_out = next_runs(summary, out, shallow)
    # no configuration to read them from: the reader fills them in
    missing = (
        "" if shallow is not None else " <training options: --optimizer, --lr, --max-tokens, ...>"
    )
    lines.append(continued(shallow).note())
    lines.append("continue training (the model's options taken from the grown checkpoint):")
    lines.append(f"  {from_checkpoint.shell()}{missing}")
    lines.append("the same with every model option written out:")
    lines.append(f"  {written_out.shell()}{missing}")
    return "\n".join(lines)


def next_runs(summary: Dict, out: str, shallow: Optional[List[str]]) -> Tuple[Run, Run]:
    """The two runs that continue training the grown model ``out``: its model options taken from
    the checkpoint (``--model-from``), or written out; both restore it with a fresh optimizer,
    schedule and data, and train with the shallow run's options ``shallow`` as :func:`continued`
    takes them (a learning-rate restart, the budget left to shell variables)."""
    rest = (
        restore_flags(out),
        recipes.saving(save_dir=os.path.splitext(out)[0] + "_checkpoints"),
        *continued(shallow).parts(),
    )
    data = summary.get("data") or "DATA"
    return (
        Run.of("train", data, Part("model", ["--model-from", out]), *rest),
        Run.of("train", data, Part("model", model_command(summary["model_options"])), *rest),
    )
