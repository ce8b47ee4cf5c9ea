"""What the console scripts' command lines add to fairseq's parsing: ``--arch ARCH --help`` with the
preset's values, argparse's errors in one line, the options a script cannot run without said once
parsed, and ``--model-from`` in fairseq-deep-train's help.  Installed by the console scripts only
(:func:`.scripts.install_parsing`, :func:`.scripts.install_train`), never by importing the package.

Replaces:

- ``fairseq.options.parse_args_and_arch`` (:func:`parse_args_and_arch_with_help`): fairseq adds the
  options of ``--arch`` (and of the criterion, optimizer, ...) only after a first parse, which
  ``--help`` ends before they are added; here ``--help`` lists them, each with the value its preset
  sets, and an epilog of what the preset sets (:func:`annotate_preset_help`).  argparse's errors
  (a usage of several hundred options before the line) become one line with the nearest names for
  a bad choice (:func:`one_line_error`); the options a script cannot run without (``--optimizer``,
  ``--path``: fairseq finds out after building the model, or with a ``TypeError``) and the options
  whose text fairseq evaluates late (``--adam-betas``) are checked once parsed;
- ``fairseq.options.get_training_parser`` (:func:`training_parser_with_model_from`): its ``--help``
  shows ``--model-from CK.pt``, which fairseq-deep-train reads off the command line before fairseq
  parses it (:func:`fairseq_deep.model_from.take_model_from`).

Versions: every fairseq 0.12 (0.12.2 and ve-fairseq 0.12.3): ``parse_args_and_arch(parser,
input_args)`` parses twice with ``parser.parse_known_args``.

Pinned by: tests/test_cli_errors.py (``test_help_of_a_preset_shows_its_values``, the one-line
errors of every script), tests/test_cli_options.py, tests/test_continue.py (``test_model_from_is_in_the_help``).
"""

import argparse
import difflib
import re
import sys
from typing import List, Optional

from ..errors import UserError


def option_value(argv: List[str], *names: str) -> Optional[str]:
    """The value of the last ``--name VALUE`` / ``--name=VALUE`` in ``argv`` (None when absent)."""
    value = None
    for i, a in enumerate(argv):
        for name in names:
            if a == name and i + 1 < len(argv):
                value = argv[i + 1]
            elif a.startswith(name + "=") and name.startswith("--"):
                value = a.split("=", 1)[1]
    return value


def preset_values(arch: str) -> dict:
    """``{dest: value}`` that ``--arch arch``'s preset sets when the command line sets nothing
    (its whole chain: the family's defaults and fairseq's); ``{}`` for an unknown arch."""
    from fairseq.models import ARCH_CONFIG_REGISTRY

    preset = ARCH_CONFIG_REGISTRY.get(arch)
    if preset is None:
        return {}
    args = argparse.Namespace()
    try:
        preset(args)
    except Exception:  # noqa: BLE001 - a preset that needs a value from the command line: no listing
        return {}
    return {k: v for k, v in vars(args).items() if not k.startswith("_")}


def _shown(value, action=None) -> str:
    if isinstance(value, bool) and action is not None and action.nargs == 0:  # a flag
        return "on" if value else "off"
    return str(value)


def annotate_preset_help(parser, arch: str):
    """Show in ``--help`` the values ``--arch arch`` sets: after each option's help
    ``[--arch ARCH: VALUE]``, and an epilog naming what it sets differently from its family's
    base preset (``transformer_dlcl_30l``: ``--encoder-layers 30``)."""
    from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_NAME_REGISTRY

    values = preset_values(arch)
    if not values:
        return
    by_dest = {a.dest: a for a in parser._actions if a.option_strings}
    for dest, value in values.items():
        action = by_dest.get(dest)
        if action is None or action.help == argparse.SUPPRESS:
            continue
        marker = f"[--arch {arch}: {_shown(value, action)}]".replace("%", "%%")
        if marker not in (action.help or ""):
            action.help = f"{action.help} {marker}" if action.help else marker
    family = ARCH_MODEL_NAME_REGISTRY.get(arch)
    base = preset_values(family) if family and family != arch else {}

    def flag(dest):
        action = by_dest.get(dest)
        return action.option_strings[-1] if action is not None else "--" + dest.replace("_", "-")

    changed = [
        (dest, v)
        for dest, v in values.items()
        if family == arch or dest not in base or base[dest] != v
    ]
    doc = " ".join((getattr(ARCH_CONFIG_REGISTRY[arch], "__doc__", None) or "").split())
    if family and family != arch:
        what = (
            (
                f"where it differs from --arch {family}: "
                + ", ".join(f"{flag(d)} {_shown(v, by_dest.get(d))}" for d, v in changed)
            )
            if changed
            else f"the same values as --arch {family}"
        )
    else:
        what = "the family's defaults"
    parser.epilog = (
        f"--arch {arch}"
        + (f" ({doc.rstrip('.')})" if doc else "")
        + f" sets{',' if family and family != arch else ''} {what}. Every option it sets "
        f"shows its value after its help as [--arch {arch}: VALUE]; a value given on the command line wins, "
        "except one the preset's name states (a depth): a different value stops with an error."
    ).replace("%", "%%")


def one_line_error(message: str):
    """argparse's ``parser.error`` for our scripts: a :class:`UserError` (one line, exit status 2)
    instead of fairseq's usage of several hundred options before the line; an invalid choice gets
    the nearest names."""
    choice = re.match(r"argument (\S+): invalid choice: '([^']*)' \(choose from (.*)\)$", message)
    if choice:
        names = re.findall(r"'([^']*)'", choice.group(3)) or [
            c.strip() for c in choice.group(3).split(",")
        ]
        close = difflib.get_close_matches(choice.group(2), names, n=3, cutoff=0.6)
        message = (
            f"argument {choice.group(1)}: invalid choice: '{choice.group(2)}'"
            + (f"; did you mean {', '.join(close)}?" if close else "")
            + f" (choose from {', '.join(names)})"
        )
    message = message.replace("invalid <lambda> value", "invalid value")
    if message.endswith("the following arguments are required: data"):
        message += " (the folder of binarized data: fairseq-preprocess's --destdir)"
    raise UserError(message)


def check_required(args, required):
    """A :class:`UserError` for the first option of ``required`` (``{dest: message}``) that the
    parsed ``args`` leave unset."""
    for dest, why in required.items():
        if hasattr(args, dest) and getattr(args, dest) is None:
            raise UserError(why)


#: options whose text fairseq evaluates only when it uses them (a NameError or SyntaxError with a
#: traceback, after the model is built): {option: (what it must be, an example)}
EVALUATED = {"adam_betas": ("two numbers", "'(0.9, 0.98)'")}


def check_evaluated(args):
    """The options of :data:`EVALUATED` that ``args`` sets, checked when they are parsed."""
    import ast

    for dest, (what, example) in EVALUATED.items():
        value = getattr(args, dest, None)
        if not isinstance(value, str):
            continue
        try:
            parsed = ast.literal_eval(value)
            ok = (
                isinstance(parsed, (tuple, list))
                and len(parsed) == 2
                and all(isinstance(v, (int, float)) for v in parsed)
            )
        except (ValueError, SyntaxError):
            ok = False
        if not ok:
            raise UserError(
                f"--{dest.replace('_', '-')} {value}: not {what}; give e.g. --{dest.replace('_', '-')} {example}"
            )


def parse_args_and_arch_with_help(parse_args_and_arch):
    """fairseq's ``parse_args_and_arch``, whose ``--help`` also lists the options of the ``--arch``
    (and criterion, optimizer, ...) given: fairseq adds them only after a first parse, which
    ``--help`` ends before they are added."""

    def parse(parser, input_args=None, *args, **kwargs):
        argv = sys.argv[1:] if input_args is None else list(input_args)
        if input_args is None:  # the script's own command line: argparse's errors in one line
            parser.error = one_line_error
        if not any(a in ("-h", "--help") for a in argv):
            parsed = parse_args_and_arch(parser, input_args, *args, **kwargs)
            if input_args is None:
                check_required(parsed, parse.required)
            check_evaluated(parsed)
            if input_args is None:
                for check in parse.checks:  # before fairseq prints or creates anything
                    check(parsed)
            return parsed
        if option_value(argv, "--arch", "-a") is None and any(
            a.dest == "arch" for a in parser._actions
        ):
            return parse_args_and_arch(parser, input_args, *args, **kwargs)  # fairseq's own --help
        original = parser.parse_known_args
        first = [True]

        def parse_known_args(args=None, namespace=None):
            if not first[
                0
            ]:  # the options of --arch and the rest are added: show the preset's values
                annotate_preset_help(parser, option_value(argv, "--arch", "-a"))
                return original(args, namespace)
            first[0] = False  # the first parse: without --help, and without required arguments
            args = [
                a for a in (sys.argv[1:] if args is None else args) if a not in ("-h", "--help")
            ]
            required = [a for a in parser._actions if a.required]
            for action in required:
                action.required = False
            try:
                return original(args, namespace)
            finally:
                for action in required:
                    action.required = True

        parser.parse_known_args = parse_known_args
        try:
            return parse_args_and_arch(parser, input_args, *args, **kwargs)
        finally:
            parser.parse_known_args = original

    parse._fairseq_deep = True
    parse.required = {}  # {dest: message}: what the script being run cannot do without (REQUIRED)
    parse.checks = ()  # what the script being run checks of its parsed arguments (cli.CHECKS)
    return parse


def training_parser_with_model_from(get_training_parser):
    """fairseq's ``get_training_parser``, whose ``--help`` also shows ``--model-from`` (which
    :func:`~fairseq_deep.model_from.take_model_from` reads off the command line before fairseq parses it)."""

    def get(*args, **kwargs):
        parser = get_training_parser(*args, **kwargs)
        parser.add_argument(
            "--model-from",
            metavar="CK.pt",
            help="fairseq-deep-train: --arch and every model option of the checkpoint CK.pt (a grown "
            "model, a run to continue); an option given on the command line wins",
        )
        return parser

    get._fairseq_deep = True
    return get
