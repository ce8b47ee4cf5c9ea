"""New names for flags whose old name says nothing of its technique, the old name kept working.

A renamed flag keeps its destination (the option's name in the namespace, in hydra configs and in
the args saved in checkpoints), so nothing but the command line changes: the new flag is added as a
second spelling of the same option, and the old one stays, marked deprecated in ``--help``.
"""

import argparse
from typing import Dict


def add_new_flag_names(parser: argparse.ArgumentParser, renamed: Dict[str, str]):
    """For each ``old: new`` of ``renamed`` (flags such as ``--encoder-no-residual``): ``new`` sets
    the same option as ``old``; ``old`` still works and its help says it is deprecated."""
    for old, new in renamed.items():
        action = next(a for a in parser._actions if old in a.option_strings)
        kwargs = {"dest": action.dest, "default": action.default, "help": action.help}
        if isinstance(action, argparse._StoreTrueAction):
            kwargs["action"] = "store_true"
        else:
            kwargs.update(type=action.type, choices=action.choices, metavar=action.metavar)
        parser.add_argument(new, **kwargs)
        action.help = f"deprecated name of {new}"
