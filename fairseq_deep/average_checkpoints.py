"""``fairseq-deep-average-checkpoints``: the parameters of several checkpoints averaged.

fairseq's ``scripts/average_checkpoints.py`` (not part of the fairseq wheel), with the package's
checkpoint loader (:mod:`fairseq_deep.checkpoints`: ``torch.load``'s weights-only default, a
truncated, refused or foreign file said in one line), flags and counters kept rather than
averaged, and the newest N epoch or update checkpoints of a folder found for you
(:func:`last_n_checkpoints`, also the own-data recipe's).  Also ``python -m
fairseq_deep.average_checkpoints``.
"""

import collections
import logging
import os
import re
import sys
from typing import List, Optional

import torch
from fairseq import checkpoint_utils

from .checkpoints import load_as_saved
from .errors import ArgumentParser, UserError, report_user_errors
from .patches.checkpoint_history import num_updates, record_averaged
from .quiet import quiet_warnings, script_logging

logger = logging.getLogger("fairseq_deep.average_checkpoints")


def last_n_checkpoints(
    path: str, n: int, update_based: bool = False, upper_bound: Optional[int] = None
):
    """The ``n`` newest ``checkpoint<epoch>.pt`` (or ``checkpoint_<epoch>_<update>.pt``) in ``path``."""
    pattern = re.compile(r"checkpoint_\d+_(\d+)\.pt$" if update_based else r"checkpoint(\d+)\.pt$")
    found = []
    for name in os.listdir(path):
        m = pattern.fullmatch(name)
        if m is not None:
            number = int(m.group(1))
            if upper_bound is None or number <= upper_bound:
                found.append((number, name))
    if len(found) < n:
        kind = "update" if update_based else "epoch"
        raise UserError(
            f"found {len(found)} {kind} checkpoints in {path}, "
            f"need {n} (train with --save-interval 1 and without --no-epoch-checkpoints / "
            f"--keep-last-epochs < {n})"
        )
    return [os.path.join(path, name) for _, name in sorted(found, reverse=True)[:n]]


def average_checkpoints(inputs: List[str]):
    """The state of the first (newest) checkpoint with its model parameters replaced by the mean
    of the parameters of all ``inputs`` (accumulated in float64).  Tensors that are not floating
    point (flags, counters) are the newest checkpoint's, not averaged.  Its history records the
    inputs (``extra_state["averaged"]``, :mod:`fairseq_deep.patches.checkpoint_history`)."""
    params_dict = collections.OrderedDict()
    new_state = None
    updates = []
    for fpath in inputs:
        state = load_as_saved(fpath)  # weights_only stays at torch's default
        updates.append(num_updates(state))
        if new_state is None:
            new_state = state
        model = state["model"]
        if params_dict and set(model) != set(params_dict):
            raise UserError(
                f"{fpath} has other parameters than {inputs[0]}; "
                "only checkpoints of one model can be averaged"
            )
        for k, p in model.items():
            if (
                not p.is_floating_point()
            ):  # flags and counters (e.g. history.softmax_rows): the newest's
                params_dict.setdefault(k, p.clone())
            elif k in params_dict:
                params_dict[k] += p.to(torch.float64)
            else:
                params_dict[k] = p.to(torch.float64)
    averaged = collections.OrderedDict()
    reference = new_state["model"]
    for k, v in params_dict.items():
        averaged[k] = (v / len(inputs)).to(reference[k].dtype) if v.is_floating_point() else v
    new_state["model"] = averaged
    return record_averaged(new_state, inputs, updates)  # extra_state["averaged"]: the inputs


def cli_main(argv=None):
    parser = ArgumentParser(
        prog="fairseq-deep-average-checkpoints",
        description="Average the parameters of several fairseq checkpoints (e.g. the last N epochs).",
    )
    parser.add_argument(
        "--inputs",
        required=True,
        nargs="+",
        help="checkpoint files, or one directory with --num-epoch-checkpoints / "
        "--num-update-checkpoints",
    )
    parser.add_argument(
        "--output", required=True, metavar="FILE", help="where to write the average"
    )
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--num-epoch-checkpoints",
        type=int,
        help="average the last N checkpoint<epoch>.pt of the directory --inputs",
    )
    group.add_argument(
        "--num-update-checkpoints",
        type=int,
        help="average the last N checkpoint_<epoch>_<update>.pt of the directory --inputs",
    )
    parser.add_argument(
        "--checkpoint-upper-bound",
        type=int,
        help="ignore checkpoints of a later epoch (or update) than this",
    )
    args = parser.parse_args(argv)
    quiet_warnings()
    script_logging(sys.stderr)
    report_user_errors(lambda: _average(parser, args), parser.prog)


def _average(parser, args):
    n = args.num_epoch_checkpoints or args.num_update_checkpoints
    if n is not None:
        if len(args.inputs) != 1 or not os.path.isdir(args.inputs[0]):
            parser.error(
                "--num-epoch-checkpoints/--num-update-checkpoints need one directory as --inputs"
            )
        inputs = last_n_checkpoints(
            args.inputs[0],
            n,
            update_based=args.num_update_checkpoints is not None,
            upper_bound=args.checkpoint_upper_bound,
        )
    else:
        inputs = args.inputs
        missing = [f for f in inputs if not os.path.isfile(f)]
        if missing:
            parser.error(f"not a checkpoint file: {', '.join(missing)}")
    logger.info("averaging %d checkpoints: %s", len(inputs), ", ".join(inputs))
    state = average_checkpoints(inputs)
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    checkpoint_utils.torch_persistent_save(state, args.output)
    logger.info("wrote %s", args.output)


if __name__ == "__main__":
    cli_main()
