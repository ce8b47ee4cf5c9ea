"""``fairseq-deep-score``: sacreBLEU's BLEU and chrF of a test set's translations, with their
signatures (docs/export.md).

    fairseq-deep-score HYPOTHESES --ref REFERENCE [--out FILE] [--tokenize 13a] [--json]

(also ``python -m fairseq_deep.score``).  ``HYPOTHESES`` is either

* fairseq-generate's output (``fairseq-deep-generate ... > gen.out``): its ``S-``/``T-``/``H-``/
  ``D-`` lines come in the order its batches finished, sorted by length; the hypotheses are put
  back in input order by their sentence id, the ``D-`` lines (``H-`` where there are none), the
  first of each under ``--nbest`` (:func:`fairseq_deep.runs.parse_generate`); or
* a plain file of hypotheses, one per line in input order (CTranslate2's, ``examples/export/
  translate.py``'s, any system's).

Hypotheses that are sentencepiece pieces (``▁`` marks the words: fairseq-generate without
``--post-process sentencepiece``, CTranslate2 without ``--spm``) are decoded as fairseq's
``--post-process sentencepiece`` does.  ``REFERENCE`` is the raw references, one per line (plain
or ``.gz``).  It prints what it read and sacreBLEU's BLEU and chrF lines, each with its signature
(``BLEU|nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0 = 34.12 ...``, as
``sacrebleu -f text`` does); ``--json`` one JSON object instead; ``--out`` writes the hypotheses in
input order, detokenized.  A hypothesis missing, one too many, a missing file or references that
are pieces end in one line and exit status 2.
"""

import argparse
import json
import os
import re
import sys
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from .errors import ArgumentParser, MissingFileError, UserError, report_user_errors
from .prepare import open_text
from .runs import parse_generate

PROG = "fairseq-deep-score"
#: sentencepiece's word mark
WORD_MARK = "\u2581"
_GENERATE_LINE = re.compile(r"^[HD]-\d+\t")
#: fairseq's translation task's log line of the test set it loaded (``DATA test de-en 1000 examples``)
_LOADED = re.compile(r"\| fairseq\.tasks\.translation \| .* \S+-\S+ (\d+) examples$")


class ScoreError(UserError):
    """Hypotheses and references that do not pair up; the message says how."""


def decode_pieces(text: str) -> str:
    """fairseq's ``--post-process sentencepiece`` (``fairseq.data.data_utils.post_process``)."""
    return text.replace(" ", "").replace(WORD_MARK, " ").strip()


def _read(path: str, what: str) -> List[str]:
    if not os.path.isfile(path):
        raise MissingFileError(f"{what} {path}: no such file")
    with open_text(path) as f:
        return [line.rstrip("\r\n") for line in f]


def _ids(ids: Sequence[int]) -> str:
    shown = ", ".join(map(str, ids[:5]))
    return shown + (f", ... ({len(ids)} in all)" if len(ids) > 5 else "")


def test_set_size(lines: Sequence[str]) -> Optional[int]:
    """The number of sentences of the test set fairseq-generate loaded, from its translation task's
    ``... test de-en 1000 examples`` log line (the last one); None where the output has none."""
    sizes = [int(m.group(1)) for m in map(_LOADED.search, lines) if m]
    return sizes[-1] if sizes else None


def in_input_order(
    by_id: Dict[int, str], n: int, path: str, ref: str, loaded: Optional[int] = None
) -> List[str]:
    """fairseq-generate's hypotheses ``{sentence id: text}`` as a list in input order, one for each
    of the ``n`` references; a :class:`ScoreError` naming the missing or stray ids otherwise.
    ``loaded``: the size of the test set fairseq-generate loaded (:func:`test_set_size`), where its
    output says it: a test set fully translated and smaller than ``--ref`` is the wrong ``--ref``,
    not a dropped batch."""
    missing = sorted(set(range(n)) - set(by_id))
    if missing and loaded is not None and loaded < n and set(by_id) == set(range(loaded)):
        raise ScoreError(
            f"--ref {ref} has {n:,} lines and {path} {len(by_id):,} hypotheses, one for every "
            f"sentence of the test set fairseq-generate loaded ({loaded:,}): the reference file "
            "does not match this test set"
        )
    strays = sorted(set(by_id) - set(range(n)))
    if strays:
        raise ScoreError(
            f"{path}: fairseq-generate's output has sentence ids beyond the {n:,} lines of --ref "
            f"{ref} ({_ids(strays)}): the output of another test set?"
        )
    if missing:
        tail = missing == list(range(n - len(missing), n))
        why = (
            "plain fairseq-generate drops a last partial batch (fairseq issue #5036); "
            "fairseq-deep-generate decodes every sentence"
            + ("" if loaded == n else f"; or --ref {ref} is not the reference of this test set")
            if tail
            else "fairseq-generate skips a sentence longer than --max-source-positions, and "
            "fairseq-deep-generate stops at FAIRSEQ_DEEP_DEADLINE"
        )
        raise ScoreError(
            f"{path}: fairseq-generate translated {len(by_id):,} of the {n:,} sentences of --ref "
            f"{ref} (missing ids {_ids(missing)}): {why}"
        )
    return [by_id[i] for i in range(n)]


@dataclass
class Hypotheses:
    """The hypotheses of a file in input order, and what was done to get them."""

    lines: List[str]
    source: str  # "fairseq-generate" or "plain"
    pieces_decoded: bool

    def describe(self, path: str) -> str:
        what = (
            "hypotheses of fairseq-generate, put back in input order by sentence id"
            if self.source == "fairseq-generate"
            else "hypotheses, one per line in input order"
        )
        return f"{path}: {len(self.lines):,} {what}" + (
            "; sentencepiece pieces decoded" if self.pieces_decoded else ""
        )


def read_hypotheses(path: str, n_refs: int, ref: str = "--ref") -> Hypotheses:
    """The hypotheses of ``path`` (fairseq-generate's output or a plain file, module docstring) in
    input order, one for each of the ``n_refs`` references, pieces decoded."""
    lines = _read(path, "HYPOTHESES")
    if any(_GENERATE_LINE.match(line) for line in lines):
        hyps = in_input_order(
            parse_generate(lines).hypotheses, n_refs, path, ref, test_set_size(lines)
        )
        source = "fairseq-generate"
    else:
        if len(lines) != n_refs:
            raise ScoreError(
                f"{path} has {len(lines):,} lines and --ref {ref} {n_refs:,}: the counts differ "
                "(a plain hypotheses file has one line per reference, in input order; "
                "fairseq-generate's output is recognised by its H-/D- lines)"
            )
        hyps, source = lines, "plain"
    pieces = any(WORD_MARK in h for h in hyps)
    return Hypotheses([decode_pieces(h) for h in hyps] if pieces else hyps, source, pieces)


def read_references(path: str) -> List[str]:
    refs = _read(path, "--ref")
    if any(WORD_MARK in r for r in refs):
        raise ScoreError(
            f"--ref {path} holds sentencepiece pieces ({WORD_MARK}): give the raw references "
            "(the text before fairseq-deep-prepare), which sacreBLEU tokenizes itself"
        )
    return refs


def corpus_scores(hyps: Sequence[str], refs: Sequence[str], tokenize: Optional[str] = None):
    """sacreBLEU's corpus BLEU and chrF of ``hyps`` against ``refs`` (one reference each):
    ``{"bleu": ..., "chrf": ..., "bleu_line": ..., "chrf_line": ..., "bleu_signature": ...,
    "chrf_signature": ...}``; the lines are ``sacrebleu -f text``'s (name|signature = score)."""
    from sacrebleu.metrics import BLEU, CHRF

    if len(hyps) != len(refs):
        raise ScoreError(f"{len(hyps)} hypotheses for {len(refs)} references")
    out: Dict[str, object] = {}
    for key, metric in (("bleu", BLEU(tokenize=tokenize)), ("chrf", CHRF())):
        result = metric.corpus_score(list(hyps), [list(refs)])
        signature = metric.get_signature()
        out[key] = result.score
        out[f"{key}_signature"] = str(signature)
        out[f"{key}_line"] = result.format(signature=signature.format())
    return out


def score_files(
    hypotheses: str, reference: str, tokenize: Optional[str] = None
) -> Tuple[Hypotheses, Dict[str, object]]:
    """(the hypotheses of ``hypotheses`` in input order, :func:`corpus_scores` against
    ``reference``)."""
    refs = read_references(reference)
    hyps = read_hypotheses(hypotheses, len(refs), reference)
    return hyps, corpus_scores(hyps.lines, refs, tokenize)


def get_parser() -> argparse.ArgumentParser:
    from sacrebleu.metrics import BLEU

    p = ArgumentParser(
        prog=PROG,
        description="sacreBLEU's BLEU and chrF (with their signatures) of fairseq-generate's "
        "output, put back in input order, or of a plain file of hypotheses in input order; "
        "sentencepiece pieces are decoded (docs/export.md).",
    )
    p.add_argument(
        "hypotheses",
        metavar="HYPOTHESES",
        help="fairseq-generate's output (S-/H-/D- lines), or one hypothesis per line in input order",
    )
    p.add_argument(
        "--ref", required=True, metavar="REFERENCE", help="the raw references (plain or .gz)"
    )
    p.add_argument(
        "--out", metavar="FILE", help="write the hypotheses here, in input order, detokenized"
    )
    p.add_argument(
        "--tokenize",
        choices=sorted(BLEU.TOKENIZERS),
        help="sacreBLEU's BLEU tokenizer (default: its own, 13a; zh, ja-mecab, ... for those)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead")
    return p


def cli_main(argv=None):
    args = get_parser().parse_args(argv)

    def run():
        hyps, scores = score_files(args.hypotheses, args.ref, args.tokenize)
        if args.out:
            with open(args.out, "w", encoding="utf-8") as f:
                f.writelines(h + "\n" for h in hyps.lines)
        if args.json:
            print(
                json.dumps(
                    {
                        "hypotheses": os.path.abspath(args.hypotheses),
                        "reference": os.path.abspath(args.ref),
                        "sentences": len(hyps.lines),
                        "source": hyps.source,
                        "pieces_decoded": hyps.pieces_decoded,
                        **scores,
                    }
                )
            )
            return
        print(hyps.describe(args.hypotheses))
        print(scores["bleu_line"])
        print(scores["chrf_line"])

    report_user_errors(run, PROG)


if __name__ == "__main__":
    cli_main(sys.argv[1:])
