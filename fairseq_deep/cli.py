"""Console scripts: fairseq's own entry points with the fairseq_deep plugin loaded.

``fairseq-deep-train``, ``fairseq-deep-generate`` and ``fairseq-deep-interactive`` take exactly the
arguments of ``fairseq-train``, ``fairseq-generate`` and ``fairseq-interactive``; they add
``--user-dir <this package>`` when none is given, so that fairseq registers our architectures
(also when it re-parses the arguments stored in a checkpoint) and loads checkpoints safely on
torch >= 2.6.  Plain ``fairseq-generate`` on one of our checkpoints without ``--user-dir`` fails
with a misleading error; these scripts are the fix (the other one is to pass ``--user-dir``).
``fairseq-deep-train`` also takes ``--model-from CK.pt``: ``--arch`` and every model option of the
checkpoint CK.pt (a grown model, a run to continue), an option given on the command line winning
(:mod:`fairseq_deep.model_from`).

The package's other console scripts live beside what they do: ``fairseq-deep-list-archs``
(:mod:`fairseq_deep.list_archs`), ``fairseq-deep-average-checkpoints``
(:mod:`fairseq_deep.average_checkpoints`), ``fairseq-deep-grow``, ``-export``, ``-prepare``,
``-study`` and the diagnostics'.

Every script of ours ends a person's mistake (:mod:`fairseq_deep.errors`) with one line
``<prog>: error: ...`` and exit status 2 instead of a traceback (``FAIRSEQ_DEEP_TRACEBACK=1`` shows
it), answers ``--help`` with the options of the ``--arch`` given, suggests the nearest names for a
mistyped ``--arch``, filters fairseq's and torch's warnings that say nothing to the user, and logs
fairseq's whole configuration at DEBUG level (``LOGLEVEL=DEBUG`` shows it; :mod:`fairseq_deep.quiet`).
"""

import difflib
import os
import sys
from typing import List

from .checkpoints import check_paths
from .criterions.word_distillation import check_args as check_distillation
from .errors import UserError, report_user_errors
from .model_from import take_model_from
from .model_options import check_restore
from .patches.arguments import option_value
from .patches.scripts import install_generate, install_interactive, install_parsing, install_train
from .quiet import PLUGIN_DIR, config_at_debug, quiet_warnings, script_logging


def with_user_dir(argv: List[str]) -> List[str]:
    """``argv`` (with the program name first) with ``--user-dir PLUGIN_DIR`` added when absent."""
    if any(a == "--user-dir" or a.startswith("--user-dir=") for a in argv[1:]):
        return list(argv)
    return [argv[0], "--user-dir", PLUGIN_DIR, *argv[1:]]


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


#: what each script checks of its parsed arguments before fairseq prints its configuration or
#: creates anything: the checkpoint fairseq-train would restore (its architecture options against
#: this run's), the teacher of --criterion word_distillation, the checkpoints of --path
CHECKS = {
    "train": (check_restore, check_distillation),
    "generate": (check_paths,),
    "interactive": (check_paths,),
}


def _run(main, log_stream="stdout", needs_arch=False, prepare_argv=None, required=None, checks=()):
    quiet_warnings()
    script_logging(log_stream)
    config_at_debug()  # fairseq's whole configuration: LOGLEVEL=DEBUG shows it
    # --arch ARCH --help; argparse's errors in one line; REQUIRED and CHECKS once parsed
    install_parsing(required, checks)
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
        checks=CHECKS["train"],
    )


def generate():
    from fairseq_cli import generate as fairseq_generate

    # a progress line with the ETA every 30 s; no batch started after FAIRSEQ_DEEP_DEADLINE
    install_generate()
    _run(  # it configures logging itself
        fairseq_generate.cli_main,
        log_stream=None,
        required=REQUIRED["generate"],
        checks=CHECKS["generate"],
    )


def interactive():
    from fairseq_cli import interactive as fairseq_interactive

    install_interactive()  # every line one hypothesis; sentencepiece data without --bpe
    _run(
        fairseq_interactive.cli_main,
        required=REQUIRED["interactive"],
        checks=CHECKS["interactive"],
    )
