"""What ``fairseq-deep-grow`` says when it has grown a model: the grown model, what became of the
shallow run's training time, and the two commands that continue training it, one taking the
model options from the grown checkpoint (``--model-from``), one with every model option written
out (:func:`fairseq_deep.model_options.model_command`)."""

from typing import Dict

from .model_options import model_command, shell
from .progress import hms

#: what the continuing command needs besides the model: the grown model's optimizer state and
#: schedule start afresh (the shallow model's have other shapes), and so does the data's epoch
RESET = ["--reset-optimizer", "--reset-lr-scheduler", "--reset-dataloader"]


def training_time_line(summary: Dict) -> str:
    spent = hms(summary["training_time"])
    if summary["training_time_kept"]:
        return (f"training time: kept (--keep-training-time): the next run's --stop-time-hours counts the shallow "
                f"run's {spent}")
    return (f"training time: the shallow run's {spent} is not carried over: the next run's --stop-time-hours is "
            "its own (--keep-training-time keeps it, for comparisons in equal time)")


def report(summary: Dict, out: str) -> str:
    """The lines printed after growing ``summary`` (:func:`fairseq_deep.grow.grow`'s) into ``out``."""
    enc, dec = summary["encoder_layers"], summary["decoder_layers"]
    lines = [f"{out}: {summary['arch']} {enc[0]}+{dec[0]} -> {summary['grown_arch']} {enc[1]}+{dec[1]} layers "
             f"({summary['method']}): {summary['copied']} tensors copied, {summary['set']} set"]
    lines += [f"  note: {note}" for note in summary["notes"]]
    lines.append(training_time_line(summary))
    data = shell([summary.get("data") or "DATA"])
    restore = shell(["--restore-file", out, *RESET])
    training = "<training options: --optimizer, --lr, --max-tokens, ...>"
    lines.append("continue training (the model's options taken from the grown checkpoint):")
    lines.append(f"  fairseq-deep-train {data} {shell(['--model-from', out])} {restore} {training}")
    lines.append("the same with every model option written out:")
    lines.append(f"  fairseq-deep-train {data} {shell(model_command(summary['model_options']))} {restore} {training}")
    return "\n".join(lines)
