"""The patches each console script installs in its own process (``fairseq_deep.cli`` calls these;
importing the package installs none of them, so plain ``fairseq-train --user-dir`` runs fairseq's
scripts unchanged).  Each wraps one named fairseq function, marked so that it is installed once.

============================  ===============================================  ==========================
script                        fairseq's function wrapped                       by
============================  ===============================================  ==========================
all three                     ``fairseq.options.parse_args_and_arch``          :mod:`.arguments`
fairseq-deep-train            ``fairseq.options.get_training_parser``          :mod:`.arguments`
fairseq-deep-train            ``fairseq_cli.train.train`` (one epoch), and in  :mod:`.training_progress`
                              it the trainer's ``train_step`` (the instance)
fairseq-deep-generate         the names ``progress_bar`` and ``tasks`` in      :mod:`.decoding_progress`
                              ``fairseq_cli.generate`` (proxies)
fairseq-deep-interactive      ``fairseq_cli.interactive.make_batches``,        :mod:`.interactive`
                              ``fairseq_cli.interactive.main``
============================  ===============================================  ==========================

Pinned by: tests/test_cli_errors.py, tests/test_progress.py, tests/test_interactive.py.
"""

import sys
from typing import List

from .arguments import parse_args_and_arch_with_help, training_parser_with_model_from
from .decoding_progress import install_decoding_progress
from .interactive import make_batches_kept_going, with_empty_input_said, with_sentencepiece_check
from .training_progress import install_training_progress


def install_parsing(required=None, checks=()):
    """``--arch ARCH --help``, argparse's errors in one line, ``required`` (``{dest: message}``:
    the options the script being run cannot do without) said once parsed, and ``checks`` (each
    called with the parsed arguments: what can be checked before fairseq prints anything)."""
    from fairseq import options

    if not getattr(options.parse_args_and_arch, "_fairseq_deep", False):
        options.parse_args_and_arch = parse_args_and_arch_with_help(options.parse_args_and_arch)
    options.parse_args_and_arch.required = required or {}
    options.parse_args_and_arch.checks = tuple(checks)


def install_train():
    """A progress line with the ETA every 30 s; ``--model-from`` in ``--help``."""
    from fairseq import options
    from fairseq_cli import train as fairseq_train

    install_training_progress(fairseq_train)
    if not getattr(options.get_training_parser, "_fairseq_deep", False):
        options.get_training_parser = training_parser_with_model_from(options.get_training_parser)


def install_generate():
    """A progress line with the ETA every 30 s; no batch started after ``FAIRSEQ_DEEP_DEADLINE``;
    ``FAIRSEQ_DEEP_DECODE_FRACTION``'s subset."""
    from fairseq_cli import generate as fairseq_generate

    install_decoding_progress(fairseq_generate)


def install_interactive():
    """Every input line one hypothesis; sentencepiece data without ``--bpe``; an empty input
    said."""
    from fairseq_cli import interactive as fairseq_interactive

    if not getattr(fairseq_interactive.make_batches, "_fairseq_deep", False):
        fairseq_interactive.make_batches = make_batches_kept_going(fairseq_interactive.make_batches)

    def reparse(extra: List[str]):
        from fairseq import options
        from fairseq.dataclass.utils import convert_namespace_to_omegaconf

        parser = options.get_interactive_generation_parser()
        return convert_namespace_to_omegaconf(
            options.parse_args_and_arch(parser, sys.argv[1:] + extra)
        )

    if not getattr(
        fairseq_interactive.main, "_fairseq_deep", False
    ):  # sentencepiece data without --bpe; an input without a line said
        fairseq_interactive.main = with_sentencepiece_check(
            with_empty_input_said(
                fairseq_interactive.main, fairseq_interactive.make_batches.lines_seen
            ),
            reparse,
        )
