"""One kind of error for one kind of mistake.

A mistake of the person running a command (a wrong option value, a preset conflict, a refused
combination, a missing or truncated file, a missing dictionary) ends in every console script of
ours with one line on stderr, ``<prog>: error: <what, where, the fix>``, and exit status 2, as
argparse does for an unknown option; a bug keeps its traceback.  ``FAIRSEQ_DEEP_TRACEBACK=1``
shows the traceback of a user error too (for debugging).

What counts as a user error (:func:`is_user_error`):

- :class:`UserError` and its subclasses (:class:`CheckpointError`, :class:`MissingFileError`,
  :class:`MissingPackageError`: an optional package, such as matplotlib for the plots, not installed);
- a plain ``ValueError`` (or fairseq's ``assert``) whose message names a command-line option
  (``--encoder-layers``): by the project's convention (docs/design.md, "Conventions") such
  messages are written for the user, and they come from presets, option checks and refused
  combinations all over the package (and from fairseq's checks of its own options);
- a ``FileNotFoundError`` of a file the command was given.
"""

import argparse
import os
import re
import sys
from typing import Callable

TRACEBACK_ENV = "FAIRSEQ_DEEP_TRACEBACK"

_NAMES_AN_OPTION = re.compile(r"(?:^|[\s(`'\"/])--[a-z][a-z0-9]*(?:-[a-z0-9]+)*")


class UserError(Exception):
    """A mistake of the person running the command; the message names the file or option and the fix."""


class MissingFileError(UserError, FileNotFoundError):
    """A file the command needs (a dictionary, a plugin directory) does not exist."""


class CheckpointError(UserError, RuntimeError):
    """A checkpoint that cannot be used; the message names the file, the cause and the fix."""


class MissingPackageError(UserError, ImportError):
    """An optional package a command needs is not installed; the message names what to install."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser whose errors (a missing required option, a wrong type, a bad choice) are
    one line, ``<prog>: error: <message> (--help lists the options)``, exit status 2, as every
    other mistake in the scripts of fairseq_deep (argparse prints its usage block first)."""

    def error(self, message):
        print(f"{self.prog}: error: {message} (--help lists the options)", file=sys.stderr)
        sys.exit(2)


def import_optional(module: str, needed_for: str, install: str, alternative: str = ""):
    """``importlib.import_module(module)``, or a :class:`MissingPackageError`:
    ``<needed_for> needs <module>: pip install <install>[, or <alternative>]``."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        hint = f"pip install {install}" + (f", or {alternative}" if alternative else "")
        raise MissingPackageError(
            f"{needed_for} needs {module}, which is not installed: {hint}"
        ) from e


def is_user_error(exc: BaseException) -> bool:
    if isinstance(exc, UserError):
        return True
    if type(exc) in (ValueError, AssertionError):  # fairseq_cli checks its options with assert
        return bool(_NAMES_AN_OPTION.search(str(exc)))
    if type(exc) is FileNotFoundError:
        return True
    if type(exc) is OSError and str(exc).startswith(
        "Model file not found"
    ):  # fairseq's --path check
        return True
    return False


def message(exc: BaseException) -> str:
    text = str(exc).strip()
    if type(exc) is FileNotFoundError and getattr(exc, "filename", None):
        text = f"no such file or directory: {exc.filename}"
    elif type(exc) is FileNotFoundError and text and os.sep in text and " " not in text:
        text = f"no such file or directory: {text}"  # fairseq raises FileNotFoundError(path)
    return text


def report_user_errors(main: Callable, prog: str = None):
    """Run ``main()``; a user error ends with ``<prog>: error: <message>`` on stderr and exit status 2."""
    try:
        return main()
    except Exception as e:  # noqa: BLE001 - only user errors are caught, the rest re-raised
        if not is_user_error(e) or os.environ.get(TRACEBACK_ENV, "") not in ("", "0"):
            raise
        prog = prog or os.path.basename(sys.argv[0])
        print(f"{prog}: error: {message(e)}", file=sys.stderr)
        sys.exit(2)


#: why a recurrent family refuses fairseq's Transformer options of the same name
RECURRENT_REFUSED = {
    "checkpoint_activations": (
        "its LSTM layers are not wrapped for activation checkpointing (the Transformer families "
        "are). Drop it; to fit memory, lower --max-tokens and raise --update-freq"
    ),
    "encoder_layerdrop": "it does not skip recurrent layers. Drop it (or use a Transformer family)",
}


def refuse_options(args, model: str, refused=None):
    """A :class:`UserError` for the first option of ``refused`` (``{dest: why}``) that ``args`` sets."""
    for dest, why in (RECURRENT_REFUSED if refused is None else refused).items():
        if getattr(args, dest, None):
            flag = "--" + dest.replace("_", "-")
            arch = getattr(args, "arch", None) or model
            raise UserError(f"{flag} is not supported by --arch {arch} ({model}): {why}")
