"""Errors of the data folder and of a refused option, said with the fix (error messages, not
version shims).

Replaces, each by a wrapper that calls fairseq's function and rewrites only its failure:

- ``fairseq.data.data_utils.infer_language_pair``: a folder without binarized data, where fairseq
  says "Could not infer language pair, please provide it explicitly" -> what the folder must hold
  and the options to pass (:class:`~fairseq_deep.errors.MissingFileError`);
- ``fairseq.data.Dictionary.load``: a missing ``dict.<lang>.txt`` (fairseq: a bare
  ``FileNotFoundError``) -> the dictionaries that are there and where they come from;
- ``MemoryEfficientFP16Optimizer.build_optimizer``: ``--memory-efficient-fp16`` with an optimizer
  that keeps no float32 state (fairseq: "Unsupported optimizer") -> the alternatives (``--fp16``,
  ``--amp``).

Versions: every fairseq 0.12 (0.12.2 and ve-fairseq 0.12.3).

Pinned by: tests/test_cli_errors.py (a folder without data and a missing dictionary in one line),
tests/test_precision_cli.py (``test_memory_efficient_fp16_trains_or_names_the_alternative``).
"""

import os
import re

from fairseq.data import Dictionary, data_utils

from ..errors import MissingFileError
from .install import fairseq_original, install


def infer_language_pair_checked(path):
    """fairseq's ``infer_language_pair``; a folder without binarized data stops with what it needs
    (fairseq: "Could not infer language pair, please provide it explicitly")."""
    src, tgt = fairseq_original(infer_language_pair_checked)(path)
    if src is None or tgt is None:
        dicts = (
            sorted(f for f in os.listdir(path) if re.fullmatch(r"dict\..+\.txt", f))
            if os.path.isdir(path)
            else []
        )
        raise MissingFileError(
            f"{path}: cannot tell the language pair: no binarized data (<split>.<src>-<tgt>.<lang>.idx) "
            f"in it{'' if os.path.isdir(path) else ' (no such directory)'}"
            + (f"; dictionaries found: {', '.join(dicts)}" if dicts else "")
            + ". Pass --source-lang and --target-lang (hub: source_lang=, target_lang=) and a data "
            "directory holding dict.<src>.txt and dict.<tgt>.txt (the --destdir of fairseq-preprocess)"
        )
    return src, tgt


def load_dictionary_checked(cls, f):
    """fairseq's ``Dictionary.load``; a missing dictionary file names itself and where it comes from."""
    try:
        return fairseq_original(load_dictionary_checked)(cls, f)
    except FileNotFoundError as e:
        if not isinstance(f, str) or isinstance(e, MissingFileError):
            raise
        folder = os.path.dirname(f) or "."
        found = (
            sorted(x for x in os.listdir(folder) if re.fullmatch(r"dict\..+\.txt", x))
            if os.path.isdir(folder)
            else []
        )
        raise MissingFileError(
            f"{f}: no such dictionary"
            + (
                f" (found in {folder}: {', '.join(found)}; check --source-lang/--target-lang)"
                if found
                else f" ({folder} has no dict.<lang>.txt{'' if os.path.isdir(folder) else ': no such directory'})"
            )
            + ". Pass the data directory written by fairseq-preprocess (--destdir), which holds "
            "dict.<src>.txt and dict.<tgt>.txt of the model's training data"
        ) from e


def memory_efficient_fp16_build_optimizer(cls, cfg, params, **kwargs):
    """``MemoryEfficientFP16Optimizer.build_optimizer`` with an error that names the alternative."""
    try:
        return fairseq_original(memory_efficient_fp16_build_optimizer)(cls, cfg, params, **kwargs)
    except ValueError as e:
        if "Unsupported optimizer" not in str(e):
            raise
        name = getattr(cfg.optimizer, "_name", "?")
        raise ValueError(
            f"--memory-efficient-fp16 needs an optimizer that keeps float32 state for float16 "
            f"parameters; --optimizer {name} does not. Use --fp16 (float32 master weights) or "
            f"--amp instead."
        ) from None


def apply():
    from fairseq.optim.fp16_optimizer import MemoryEfficientFP16Optimizer

    install(data_utils, "infer_language_pair", infer_language_pair_checked)
    install(Dictionary, "load", load_dictionary_checked, as_classmethod=True)
    install(
        MemoryEfficientFP16Optimizer,
        "build_optimizer",
        memory_efficient_fp16_build_optimizer,
        as_classmethod=True,
    )
