"""``fairseq-deep-train --model-from CK.pt``: the checkpoint's model on the command line.

``--arch`` and every model option of the checkpoint CK.pt (a grown model, a run to continue) take
the place of ``--model-from CK.pt`` before fairseq parses the command line, ahead of the other
arguments, so that an option given on the command line wins (and restoring a checkpoint refuses
one that changes the architecture: :mod:`fairseq_deep.patches.checkpoint_errors`).  The options
are written by :func:`fairseq_deep.model_options.model_command`, which parses back to exactly the
checkpoint's options; ``--help`` shows the option (:mod:`fairseq_deep.patches.arguments`).
"""

import logging
from typing import List

from .checkpoints import load_as_saved, model_args
from .model_options import model_command, shell
from .patches.arguments import option_value

logger = logging.getLogger("fairseq_deep.model_from")


def take_model_from(argv: List[str]) -> List[str]:
    """``argv`` (the program name first) with ``--model-from CK.pt`` replaced by ``--arch`` and
    every model option of CK.pt, before the other arguments; ``argv`` itself without it."""
    path = option_value(argv[1:], "--model-from")
    if path is None:
        return list(argv)
    rest, skip = [argv[0]], False
    for a in argv[1:]:
        if skip or a == "--model-from" or a.startswith("--model-from="):
            skip = a == "--model-from"
            continue
        rest.append(a)
    taken = model_command(model_args(load_as_saved(path, "--model-from"), path, "--model-from"))
    logger.info("--model-from %s: %s", path, shell(taken))
    return [rest[0], *taken, *rest[1:]]
