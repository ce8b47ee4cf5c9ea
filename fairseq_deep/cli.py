"""Console scripts: fairseq's own entry points with the fairseq_deep plugin loaded.

``fairseq-deep-train``, ``fairseq-deep-generate`` and ``fairseq-deep-interactive`` take exactly the
arguments of ``fairseq-train``, ``fairseq-generate`` and ``fairseq-interactive``; they add
``--user-dir <this package>`` when none is given, so that fairseq registers our architectures
(also when it re-parses the arguments stored in a checkpoint) and loads checkpoints safely on
torch >= 2.6.  Plain ``fairseq-generate`` on one of our checkpoints without ``--user-dir`` fails
with a misleading error; these scripts are the fix (the other one is to pass ``--user-dir``).
``fairseq-deep-train`` also takes ``--model-from CK.pt``: ``--arch`` and every model option of the
checkpoint CK.pt (a grown model, a run to continue), an option given on the command line winning.

``fairseq-deep-average-checkpoints`` averages the parameters of several checkpoints (fairseq's
``scripts/average_checkpoints.py``, which is not part of the fairseq wheel), loading them with
``torch.load``'s default ``weights_only=True``.  ``fairseq-deep-list-archs`` lists the
architectures of the package by family.

Every script of ours ends a person's mistake (:mod:`fairseq_deep.errors`) with one line
``<prog>: error: ...`` and exit status 2 instead of a traceback (``FAIRSEQ_DEEP_TRACEBACK=1`` shows
it), answers ``--help`` with the options of the ``--arch`` given, suggests the nearest names for a
mistyped ``--arch``, and filters fairseq's and torch's warnings that say nothing to the user.
"""

import collections
import difflib
import logging
import os
import re
import signal
import sys
from typing import List, Optional

from .errors import ArgumentParser, MissingFileError, UserError, report_user_errors
from .patches.arguments import option_value
from .patches.checkpoint_errors import torch_load_checked
from .patches.scripts import install_generate, install_interactive, install_parsing, install_train
from .quiet import QUIET_WARNINGS, quiet_warnings  # noqa: F401  (the scripts' filters; imported from here)

PLUGIN_DIR = os.path.dirname(os.path.abspath(__file__))

logger = logging.getLogger("fairseq_deep.cli")


def with_user_dir(argv: List[str]) -> List[str]:
    """``argv`` (with the program name first) with ``--user-dir PLUGIN_DIR`` added when absent."""
    if any(a == "--user-dir" or a.startswith("--user-dir=") for a in argv[1:]):
        return list(argv)
    return [argv[0], "--user-dir", PLUGIN_DIR, *argv[1:]]


def _fairseq_logging(stream="stdout"):
    """The root logger as fairseq's own scripts set it up, writing to ``stream`` ("stdout": the
    ``sys.stdout`` of the call, not the one of the import; None: no handler).  fairseq_cli
    configures logging before it imports fairseq; here fairseq was imported first (with our
    package), and that import leaves a bare stderr handler at DEBUG level behind, which would turn
    fairseq's basicConfig into a no-op."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.setLevel(os.environ.get("LOGLEVEL", "INFO").upper())
    if stream == "stdout":
        stream = sys.stdout
    if stream is not None:
        logging.basicConfig(
            format="%(asctime)s | %(levelname)s | %(name)s | %(message)s",
            datefmt="%Y-%m-%d %H:%M:%S",
            level=root.level,
            stream=stream,
        )


def check_user_dir(argv: List[str]):
    user_dir = option_value(argv[1:], "--user-dir")
    if user_dir is not None and not os.path.isdir(user_dir):
        raise UserError(
            f"--user-dir {user_dir}: no such directory. The fairseq-deep-* commands load the plugin "
            f"themselves: drop --user-dir (plain fairseq-* commands need --user-dir {PLUGIN_DIR})"
        )


def check_arch(argv: List[str]):
    """A mistyped ``--arch`` stops with the nearest names (argparse would list all ~240)."""
    from fairseq.models import ARCH_MODEL_REGISTRY

    arch = option_value(argv[1:], "--arch", "-a")
    if arch is None or arch in ARCH_MODEL_REGISTRY:
        return
    user_dir = option_value(argv[1:], "--user-dir")
    if user_dir is not None and os.path.abspath(user_dir) != PLUGIN_DIR:
        return  # another plugin registers its architectures later
    close = difflib.get_close_matches(arch, list(ARCH_MODEL_REGISTRY), n=5, cutoff=0.6)
    raise UserError(
        f"--arch {arch}: no such architecture"
        + (f"; did you mean {', '.join(close)}?" if close else ".")
        + " fairseq-deep-list-archs lists the architectures of fairseq_deep"
    )


def take_model_from(argv: List[str]) -> List[str]:
    """``--model-from CK.pt`` (fairseq-deep-train): ``--arch`` and every model option of the
    checkpoint CK.pt in its place, before the other arguments, so that an option given on the
    command line wins (and restoring a checkpoint refuses one that changes the architecture:
    :mod:`fairseq_deep.patches.checkpoint_errors`)."""
    path = option_value(argv[1:], "--model-from")
    if path is None:
        return list(argv)
    rest, skip = [argv[0]], False
    for a in argv[1:]:
        if skip or a == "--model-from" or a.startswith("--model-from="):
            skip = a == "--model-from"
            continue
        rest.append(a)
    from .model_options import model_command, saved_model_options, shell

    if not os.path.isfile(path):
        raise MissingFileError(f"--model-from {path}: no such checkpoint file")

    options = saved_model_options(torch_load_checked(path))
    if options is None:
        raise UserError(
            f"--model-from {path}: the checkpoint holds no model options (no cfg.model, no args): "
            "give a checkpoint written by fairseq-train"
        )
    taken = model_command(options)
    logger.info("--model-from %s: %s", path, shell(taken))
    return [rest[0], *taken, *rest[1:]]


#: the options each script cannot run without, checked once the command line is parsed (fairseq
#: finds out late: the optimizer only after building the model, "optimizer is required!" with a
#: traceback; interactive's --path as a TypeError); argparse itself asks for the data folder, and
#: a missing --arch is said before parsing (fairseq's parser needs it to know the model's options)
NO_ARCH = (
    "--arch ARCH is required (e.g. --arch transformer_dlcl); fairseq-deep-list-archs lists the "
    "architectures of fairseq_deep"
)
_PATH = "--path CHECKPOINT is required: the model to translate with (e.g. --path checkpoints/checkpoint_best.pt)"
REQUIRED = {
    "train": {
        "optimizer": "--optimizer is required (e.g. --optimizer adam --lr 5e-4 --lr-scheduler inverse_sqrt "
        "--warmup-updates 4000); fairseq-deep-train --help lists the optimizers"
    },
    "generate": {"path": _PATH},
    "interactive": {"path": _PATH},
}


def _run(main, log_stream="stdout", needs_arch=False, prepare_argv=None, required=None):
    quiet_warnings()
    _fairseq_logging(log_stream)
    install_parsing(
        required
    )  # --arch ARCH --help; argparse's errors in one line; REQUIRED once parsed
    # This module lives in fairseq_deep, so the package (models registered, checkpoint types
    # allow-listed) is already imported; fairseq's import of the --user-dir finds it loaded.
    sys.argv = with_user_dir(sys.argv)

    def checked_main():
        if prepare_argv is not None:
            sys.argv = prepare_argv(sys.argv)
        check_user_dir(sys.argv)
        if needs_arch:  # fairseq-train's parser (the only one with --arch/-a)
            check_arch(sys.argv)
        if (
            needs_arch
            and option_value(sys.argv[1:], "--arch", "-a") is None
            and not ({"-h", "--help"} & set(sys.argv[1:]))
        ):
            raise UserError(NO_ARCH)
        return main()

    report_user_errors(checked_main)


def train():
    from fairseq_cli import train as fairseq_train

    install_train()  # a progress line with the ETA every 30 s; --model-from in --help
    _run(
        fairseq_train.cli_main,
        needs_arch=True,
        prepare_argv=take_model_from,
        required=REQUIRED["train"],
    )


def generate():
    from fairseq_cli import generate as fairseq_generate

    # a progress line with the ETA every 30 s; no batch started after FAIRSEQ_DEEP_DEADLINE
    install_generate()
    _run(
        fairseq_generate.cli_main, log_stream=None, required=REQUIRED["generate"]
    )  # it configures logging itself


def interactive():
    from fairseq_cli import interactive as fairseq_interactive

    install_interactive()  # every line one hypothesis; sentencepiece data without --bpe
    _run(fairseq_interactive.cli_main, required=REQUIRED["interactive"])


# ---------------------------------------------------------------------------------------------
# Architectures
# ---------------------------------------------------------------------------------------------


def _one_line(doc: Optional[str], width: int = 100) -> str:
    text = " ".join((doc or "").strip().split("\n\n")[0].split())
    return text if len(text) <= width else text[: width - 3].rstrip() + "..."


def our_architectures():
    """``{family (model name): [(arch, one-line description), ...]}`` of fairseq_deep, in
    registration order."""
    from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_NAME_REGISTRY, ARCH_MODEL_REGISTRY

    families = collections.OrderedDict()
    for arch, cls in ARCH_MODEL_REGISTRY.items():
        if cls.__module__.split(".")[0] != "fairseq_deep":
            continue
        doc = ARCH_CONFIG_REGISTRY[arch].__doc__ if arch in ARCH_CONFIG_REGISTRY else None
        family = ARCH_MODEL_NAME_REGISTRY[arch]
        if not doc and arch == family:
            doc = "the family's defaults"
        families.setdefault(family, []).append((arch, _one_line(doc)))
    return families


def family_description(model_cls) -> str:
    """The first sentence of the model class's docstring, or of its module's."""
    return _one_line(model_cls.__doc__ or sys.modules[model_cls.__module__].__doc__)


def list_archs_main(argv=None):
    parser = ArgumentParser(
        prog="fairseq-deep-list-archs",
        description="List the architectures (--arch) of fairseq_deep by family, one line each. "
        "`fairseq-deep-train --arch ARCH --help` lists an architecture's options.",
    )
    parser.add_argument(
        "family",
        nargs="?",
        help="only this family (a model name, e.g. transformer_dlcl) "
        "or the architectures whose name contains this word",
    )
    args = parser.parse_args(argv)
    if hasattr(signal, "SIGPIPE"):  # `fairseq-deep-list-archs | head` ends quietly
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)

    def run():
        from fairseq.models import MODEL_REGISTRY

        families = our_architectures()
        if args.family:
            chosen = {f: a for f, a in families.items() if f == args.family}
            if not chosen:
                chosen = {f: [x for x in a if args.family in x[0]] for f, a in families.items()}
                chosen = {f: a for f, a in chosen.items() if a}
            if not chosen:
                close = difflib.get_close_matches(args.family, list(families), n=3, cutoff=0.5)
                raise UserError(
                    f"no family or architecture matches {args.family!r}"
                    + (f"; did you mean {', '.join(close)}?" if close else ".")
                    + f" Families: {', '.join(families)}"
                )
            families = chosen
        width = max(len(a) for archs in families.values() for a, _ in archs)
        for family, archs in families.items():
            print(f"{family}: {family_description(MODEL_REGISTRY[family])}")
            for arch, doc in archs:
                print(f"  {arch:<{width}}  {doc}")
            print()

    report_user_errors(run, "fairseq-deep-list-archs")


# ---------------------------------------------------------------------------------------------
# Checkpoint averaging
# ---------------------------------------------------------------------------------------------


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
    import torch

    from .patches.checkpoint_history import num_updates, record_averaged

    params_dict = collections.OrderedDict()
    new_state = None
    updates = []
    for fpath in inputs:
        state = torch_load_checked(fpath)  # weights_only stays at torch's default
        if not isinstance(state, dict) or not isinstance(state.get("model"), dict):
            raise UserError(
                f"{fpath} is not a fairseq checkpoint (it has no 'model' entry); "
                "average checkpoints written by fairseq-train"
            )
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


def average_checkpoints_main(argv=None):
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
    _fairseq_logging(sys.stderr)
    report_user_errors(lambda: _average_checkpoints_main(parser, args), parser.prog)


def _average_checkpoints_main(parser, args):
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

    from fairseq import checkpoint_utils

    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    checkpoint_utils.torch_persistent_save(state, args.output)
    logger.info("wrote %s", args.output)


if __name__ == "__main__":  # python -m fairseq_deep.cli FILES... averages checkpoints
    average_checkpoints_main()
