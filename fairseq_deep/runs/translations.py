"""What fairseq-generate prints, read, and scored: its ``S-``/``T-``/``H-``/``D-`` lines by sentence
id (:func:`parse_generate`, :class:`Generated`), its ``BLEU4`` line, its ``Translated N sentences
...`` line (:func:`parse_translated`); sacreBLEU's BLEU and chrF (:func:`score`) and paired
bootstrap (:func:`paired_bootstrap`); the size of a binarized test set."""

import os
import re
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence, Tuple, Union

from ..errors import UserError

_LINE = re.compile(r"^([SHDT])-(\d+)\t(.*)$")
_BLEU4 = re.compile(r"BLEU4? = ([0-9.]+)")
_TRANSLATED = re.compile(
    r"Translated ([\d,]+) sentences \(([\d,]+) tokens\) in ([\d.]+)s "
    r"\(([\d.]+) sentences/s, ([\d.]+) tokens/s\)"
)


@dataclass
class Translated:
    """fairseq-generate's closing line ``Translated 1,000 sentences (25,000 tokens) in 12.5s
    (80.00 sentences/s, 2000.00 tokens/s)``: the time is its decoding's (model loading left out)."""

    sentences: int
    tokens: int
    seconds: float
    sentences_per_s: float
    tokens_per_s: float


def parse_translated(text: str) -> Optional[Translated]:
    """The ``Translated ...`` line of fairseq-generate's output (its text or one line) as
    :class:`Translated`; None without one."""
    m = _TRANSLATED.search(text)
    if not m:
        return None
    return Translated(
        int(m.group(1).replace(",", "")),
        int(m.group(2).replace(",", "")),
        float(m.group(3)),
        float(m.group(4)),
        float(m.group(5)),
    )


@dataclass
class Generated:
    """fairseq-generate's output by sentence id (its line in the test set): ``sources`` (S-),
    ``targets`` (T-), ``tokens`` (H-: the hypotheses as the model wrote them), ``detok`` (D-: as
    post-processed), ``scores`` (H-: each hypothesis's score, the model's log-probability per
    token); the first (best) hypothesis of each under --nbest; ``bleu4``: fairseq's own
    score (its ``Generate ... BLEU4 = x`` line), None without one; ``translated``: its
    ``Translated ...`` line (:class:`Translated`), None without one; ``lines``: every line."""

    sources: Dict[int, str] = field(default_factory=dict)
    targets: Dict[int, str] = field(default_factory=dict)
    tokens: Dict[int, str] = field(default_factory=dict)
    detok: Dict[int, str] = field(default_factory=dict)
    scores: Dict[int, float] = field(default_factory=dict)
    bleu4: Optional[str] = None
    translated: Optional[Translated] = None
    lines: List[str] = field(default_factory=list)

    @property
    def hypotheses(self) -> Dict[int, str]:
        """The detokenized hypotheses (``D-``), ``H-`` where there are none."""
        return self.detok or self.tokens

    def in_order(self, n_test: int) -> Tuple[List[str], List[str]]:
        """(hypotheses, references) of sentences ``0..n_test-1``, references ``[]`` unless every
        sentence has a ``T-`` line.  ValueError unless every sentence has one hypothesis."""
        hyps = self.hypotheses
        missing = sorted(set(range(n_test)) - set(hyps))
        extra = sorted(set(hyps) - set(range(n_test)))
        if missing or extra:
            raise ValueError(
                f"fairseq-generate gave {len(hyps)} hypotheses for a test set of {n_test} "
                f"sentences (missing ids {missing[:10]}{'...' if len(missing) > 10 else ''}"
                f"{', unexpected ids ' + str(extra[:10]) if extra else ''}); a sentence longer "
                "than --max-source-positions is skipped: raise it with --gen-args"
            )
        refs = [self.targets.get(i) for i in range(n_test)]
        return [hyps[i] for i in range(n_test)], ([] if None in refs else refs)


def parse_generate(lines: Union[str, Iterable[str]]) -> Generated:
    """fairseq-generate's output (its text, or its lines) as :class:`Generated`."""
    out = Generated()
    by_kind = {"S": out.sources, "T": out.targets, "H": out.tokens, "D": out.detok}
    for line in lines.split("\n") if isinstance(lines, str) else lines:
        line = line.rstrip("\r\n")
        out.lines.append(line)
        m = _LINE.match(line)
        if not m:
            if "Generate" in line and "BLEU" in line:
                bleu = _BLEU4.search(line)
                out.bleu4 = bleu.group(1) if bleu else None
            elif "Translated" in line:
                out.translated = parse_translated(line) or out.translated
            continue
        kind, idx, rest = m.group(1), int(m.group(2)), m.group(3)
        if kind in "HD" and idx in by_kind[kind]:
            continue  # --nbest > 1: the first (best) hypothesis only
        if kind in "HD":  # "score<TAB>text"
            score, _, rest = rest.partition("\t")
            try:
                if kind == "H":
                    out.scores[idx] = float(score)
            except ValueError:  # not a score: the line as fairseq would not write it
                pass
        by_kind[kind][idx] = rest
    return out


def read_generate(path: str) -> Generated:
    """:func:`parse_generate` of the file at ``path``."""
    with open(path, encoding="utf-8", errors="replace") as f:
        return parse_generate(f)


def hypotheses_by_id(generate_out: str) -> Dict[int, str]:
    """The ``D-`` lines of fairseq-generate's output file: ``{sentence id: text}``."""
    return read_generate(generate_out).detok


def score(hyps: Sequence[str], refs: Sequence[str]) -> Dict[str, Union[float, str]]:
    """sacreBLEU's corpus BLEU and chrF and their signatures (the settings and sacreBLEU's
    version, to be quoted with the score): ``{"bleu": ..., "chrf": ..., "bleu_signature":
    "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0", "chrf_signature": ...}``."""
    from sacrebleu.metrics import BLEU, CHRF

    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} hypotheses for {len(refs)} references")
    bleu, chrf = BLEU(), CHRF()
    return {
        "bleu": bleu.corpus_score(list(hyps), [list(refs)]).score,
        "chrf": chrf.corpus_score(list(hyps), [list(refs)]).score,
        "bleu_signature": str(bleu.get_signature()),
        "chrf_signature": str(chrf.get_signature()),
    }


def paired_bootstrap(
    baseline: Sequence[str],
    systems: Dict[str, Sequence[str]],
    refs: Sequence[str],
    n_samples: int = 1000,
) -> Dict[str, Dict[str, float]]:
    """sacreBLEU's paired bootstrap resampling (``sacrebleu --paired-bs``) of each system against
    the baseline: {name: {"bleu_p": p, "chrf_p": p}}."""
    if not systems:
        return {}
    from sacrebleu.metrics import BLEU, CHRF
    from sacrebleu.significance import PairedTest

    named = [("__baseline__", list(baseline))] + [(k, list(v)) for k, v in systems.items()]
    _, scores = PairedTest(
        named, {"BLEU": BLEU(), "chrF": CHRF()}, [list(refs)], test_type="bs", n_samples=n_samples
    )()
    metric_keys = [k for k in scores if k != "System"]
    out = {}
    for i, name in enumerate(scores["System"]):
        if i == 0:
            continue
        out[name] = {}
        for key in metric_keys:
            tag = "bleu_p" if key.upper().startswith("BLEU") else "chrf_p"
            out[name][tag] = scores[key][i].p_value
    return out


def count_test_sentences(data: str) -> int:
    """Sentences in the binarized test set (fairseq-preprocess ``--testpref``)."""
    import glob

    idx = sorted(glob.glob(os.path.join(data, "test.*-*.*.idx")))
    if not idx:
        raise UserError(
            f"--data {data}: no binarized test set (test.SRC-TGT.SRC.idx); "
            "run fairseq-preprocess (or fairseq-deep-prepare) with --testpref"
        )
    from fairseq.data import indexed_dataset

    return len(indexed_dataset.MMapIndexedDataset(idx[0][: -len(".idx")]))
