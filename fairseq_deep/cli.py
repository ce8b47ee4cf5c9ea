"""Console scripts: fairseq's own entry points with the fairseq_deep plugin loaded.

``fairseq-deep-train``, ``fairseq-deep-generate`` and ``fairseq-deep-interactive`` take exactly the
arguments of ``fairseq-train``, ``fairseq-generate`` and ``fairseq-interactive``; they add
``--user-dir <this package>`` when none is given, so that fairseq registers our architectures
(also when it re-parses the arguments stored in a checkpoint) and loads checkpoints safely on
torch >= 2.6.  Plain ``fairseq-generate`` on one of our checkpoints without ``--user-dir`` fails
with a misleading error; these scripts are the fix (the other one is to pass ``--user-dir``).

``fairseq-deep-average-checkpoints`` averages the parameters of several checkpoints (fairseq's
``scripts/average_checkpoints.py``, which is not part of the fairseq wheel), loading them with
``torch.load``'s default ``weights_only=True``.
"""

import argparse
import collections
import logging
import os
import re
import sys
from typing import List, Optional

PLUGIN_DIR = os.path.dirname(os.path.abspath(__file__))

logger = logging.getLogger("fairseq_deep.cli")


def with_user_dir(argv: List[str]) -> List[str]:
    """``argv`` (with the program name first) with ``--user-dir PLUGIN_DIR`` added when absent."""
    if any(a == "--user-dir" or a.startswith("--user-dir=") for a in argv[1:]):
        return list(argv)
    return [argv[0], "--user-dir", PLUGIN_DIR, *argv[1:]]


def _fairseq_logging(stream=sys.stdout):
    """The root logger as fairseq's own scripts set it up.  fairseq_cli configures logging before it
    imports fairseq; here fairseq was imported first (with our package), and that import leaves a
    bare stderr handler at DEBUG level behind, which would turn fairseq's basicConfig into a no-op."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.setLevel(os.environ.get("LOGLEVEL", "INFO").upper())
    if stream is not None:
        logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s",
                            datefmt="%Y-%m-%d %H:%M:%S", level=root.level, stream=stream)


def _run(main, log_stream=sys.stdout):
    _fairseq_logging(log_stream)
    # This module lives in fairseq_deep, so the package (models registered, checkpoint types
    # allow-listed) is already imported; fairseq's import of the --user-dir finds it loaded.
    sys.argv = with_user_dir(sys.argv)
    main()


def train():
    from fairseq_cli.train import cli_main

    _run(cli_main)


def generate():
    from fairseq_cli.generate import cli_main

    _run(cli_main, log_stream=None)  # fairseq-generate configures logging itself (to its output)


def interactive():
    from fairseq_cli.interactive import cli_main

    _run(cli_main)


# ---------------------------------------------------------------------------------------------
# Checkpoint averaging
# ---------------------------------------------------------------------------------------------


def last_n_checkpoints(path: str, n: int, update_based: bool = False, upper_bound: Optional[int] = None):
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
        raise SystemExit(
            f"fairseq-deep-average-checkpoints: found {len(found)} {kind} checkpoints in {path}, "
            f"need {n} (train with --save-interval 1 and without --no-epoch-checkpoints / "
            f"--keep-last-epochs < {n})"
        )
    return [os.path.join(path, name) for _, name in sorted(found, reverse=True)[:n]]


def average_checkpoints(inputs: List[str]):
    """The state of the first (newest) checkpoint with its model parameters replaced by the mean
    of the parameters of all ``inputs`` (accumulated in float64).  Tensors that are not floating
    point (flags, counters) are the newest checkpoint's, not averaged."""
    import torch

    import fairseq_deep  # noqa: F401  (allow-lists the types fairseq checkpoints hold)

    params_dict = collections.OrderedDict()
    new_state = None
    for fpath in inputs:
        state = torch.load(fpath, map_location="cpu")  # weights_only stays at torch's default
        if new_state is None:
            new_state = state
        model = state["model"]
        if params_dict and set(model) != set(params_dict):
            raise SystemExit(
                f"fairseq-deep-average-checkpoints: {fpath} has other parameters than {inputs[0]}; "
                "only checkpoints of one model can be averaged"
            )
        for k, p in model.items():
            if not p.is_floating_point():  # flags and counters (e.g. history.softmax_rows): the newest's
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
    return new_state


def average_checkpoints_main(argv=None):
    parser = argparse.ArgumentParser(
        prog="fairseq-deep-average-checkpoints",
        description="Average the parameters of several fairseq checkpoints (e.g. the last N epochs).",
    )
    parser.add_argument("--inputs", required=True, nargs="+",
                        help="checkpoint files, or one directory with --num-epoch-checkpoints / "
                             "--num-update-checkpoints")
    parser.add_argument("--output", required=True, metavar="FILE", help="where to write the average")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--num-epoch-checkpoints", type=int,
                       help="average the last N checkpoint<epoch>.pt of the directory --inputs")
    group.add_argument("--num-update-checkpoints", type=int,
                       help="average the last N checkpoint_<epoch>_<update>.pt of the directory --inputs")
    parser.add_argument("--checkpoint-upper-bound", type=int,
                        help="ignore checkpoints of a later epoch (or update) than this")
    args = parser.parse_args(argv)
    _fairseq_logging(sys.stderr)

    n = args.num_epoch_checkpoints or args.num_update_checkpoints
    if n is not None:
        if len(args.inputs) != 1 or not os.path.isdir(args.inputs[0]):
            parser.error("--num-epoch-checkpoints/--num-update-checkpoints need one directory as --inputs")
        inputs = last_n_checkpoints(args.inputs[0], n, update_based=args.num_update_checkpoints is not None,
                                    upper_bound=args.checkpoint_upper_bound)
    else:
        inputs = args.inputs
        missing = [f for f in inputs if not os.path.isfile(f)]
        if missing:
            parser.error(f"not a checkpoint file: {', '.join(missing)}")
    logger.info("averaging %d checkpoints: %s", len(inputs), ", ".join(inputs))
    state = average_checkpoints(inputs)

    from fairseq import checkpoint_utils

    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    checkpoint_utils.torch_persistent_save(state, args.output)
    logger.info("wrote %s", args.output)


if __name__ == "__main__":  # python -m fairseq_deep.cli FILES... averages checkpoints
    average_checkpoints_main()
