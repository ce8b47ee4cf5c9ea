"""How fairseq is run, in one place: its command lines built from settings, its logs read as
records, its translations put back in order and scored with sacreBLEU.

* commands: :func:`flags` (settings as options), :func:`command` (``python -m fairseq_cli.train``
  / ``.generate`` with this package as ``--user-dir``), :func:`width_flags` (model sizes by family),
  :func:`restore_flags` (a checkpoint restored with a fresh optimizer, schedule and data),
  :func:`grow_command`;
* logs: :func:`parse_log` / :func:`parse_log_lines` read fairseq-train's ``--log-format json``
  records (console lines ``... | train_inner | {...}`` or ``--log-file`` lines ``{...}``) into
  :class:`dict` records with a ``kind`` (``train_inner``, ``valid``, ``train``) and numbers;
  :func:`series` turns them into ``{metric: [(update, value)]}``; :func:`last_update`.  (Text logs
  one does not control, e.g. ``--log-format simple``, are read by
  :mod:`fairseq_deep.diagnostics.plot_training`.)
* translations: :func:`parse_generate` reads fairseq-generate's output (``S-``/``T-``/``H-``/``D-``
  lines, by sentence id; its ``BLEU4`` line; its ``Translated N sentences ...`` line, also alone
  with :func:`parse_translated`); :func:`score` and :func:`paired_bootstrap` are sacreBLEU's BLEU
  and chrF.
"""

import json
import logging
import os
import re
import sys
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from .errors import UserError
from .models import families

logger = logging.getLogger("fairseq_deep.runs")

#: this package's folder: fairseq's --user-dir
PLUGIN_DIR = os.path.dirname(os.path.abspath(__file__))
TRAIN = "fairseq_cli.train"
GENERATE = "fairseq_cli.generate"
#: what a run restored from another model's checkpoint needs: its optimizer state and schedule start
#: afresh (a grown model's have other shapes), and so does the data's epoch
RESET = ["--reset-optimizer", "--reset-lr-scheduler", "--reset-dataloader"]


# --------------------------------------------------------------------------------------------
# command lines
# --------------------------------------------------------------------------------------------


def option(name: str) -> str:
    """``max_tokens`` as ``--max-tokens``."""
    return "--" + name.replace("_", "-")


def flags(settings: Mapping[str, object]) -> List[str]:
    """Settings (fairseq's option names, ``_`` or ``-``) as command-line options, in their order:
    ``True`` a bare flag, ``False`` and ``None`` nothing, a list or tuple its values after one
    option (``--ddp-backend``-style ``nargs``), anything else ``str(value)`` (floats as
    ``f"{value:g}"``)."""
    argv: List[str] = []
    for name, value in settings.items():
        if value is None or value is False:
            continue
        if value is True:
            argv.append(option(name))
        elif isinstance(value, (list, tuple)):
            argv += [option(name), *map(str, value)]
        else:
            argv += [option(name), f"{value:g}" if isinstance(value, float) else str(value)]
    return argv


def command(module: str, data: str, *args: str, user_dir: bool = True) -> List[str]:
    """``python -m MODULE DATA [--user-dir this package] ARGS...``: a fairseq program (:data:`TRAIN`,
    :data:`GENERATE`) run with this Python, the plugin loaded."""
    return [
        sys.executable,
        "-m",
        module,
        data,
        *(["--user-dir", PLUGIN_DIR] if user_dir else []),
        *args,
    ]


def has_option(argv: Sequence[str], name: str) -> bool:
    """Whether ``argv`` gives ``name`` (``--lr 1`` or ``--lr=1``)."""
    return any(f == name or f.startswith(name + "=") for f in argv)


def restore_flags(checkpoint: str) -> List[str]:
    """Training that starts from ``checkpoint`` (another model's, e.g. a grown one) with a fresh
    optimizer, schedule and data (:data:`RESET`)."""
    return ["--restore-file", checkpoint, *RESET]


def grow_command(
    checkpoint: str,
    out: str,
    encoder_layers: int,
    method: str = "stack",
    keep_training_time: bool = True,
) -> List[str]:
    """``python -m fairseq_deep.grow``: ``checkpoint`` grown to ``encoder_layers`` into ``out``."""
    return [
        sys.executable,
        "-m",
        "fairseq_deep.grow",
        "--checkpoint",
        checkpoint,
        "--out",
        out,
        "--encoder-layers",
        str(encoder_layers),
        "--method",
        method,
        *(["--keep-training-time"] if keep_training_time else []),
    ]


def model_kind(arch: str) -> str:
    """The model family of an --arch: transformer, rnmt_plus, rnmt_hybrid, deep_att (what its
    family declares: :mod:`fairseq_deep.models.families`), or other."""
    from fairseq.models import ARCH_MODEL_NAME_REGISTRY

    family = families.of_arch(arch)  # an unknown --arch: a UserError
    if family is not None:
        return family.kind
    # fairseq's own models: its Transformers are sized as ours
    return "transformer" if ARCH_MODEL_NAME_REGISTRY[arch].startswith("transformer") else "other"


def width_flags(arch: str, width: Optional[int]) -> List[str]:
    """Model sizes for ``--width W``, by the size rule of the --arch's family (``sizes`` of its
    declaration): Transformers embed W, FFN 4W, max(2, W // 64) heads (Base at 512, Big at 1024);
    RNMT+ embeddings and LSTM cells W (per direction in the encoder); the hybrids both; Deep-Att
    embeddings W/2 and cells W (the paper's 256/512)."""
    if not width:
        return []
    family = families.of_arch(arch)
    if family is not None:
        return family.sizes(width)
    if model_kind(arch) == "transformer":
        return families.transformer_sizes(width)
    logger.warning("--width: no sizes known for --arch %s; it keeps its own", arch)
    return []


# --------------------------------------------------------------------------------------------
# training logs (--log-format json)
# --------------------------------------------------------------------------------------------

Record = Dict[str, Union[str, float, int, None]]
Series = Dict[str, List[Tuple[float, float]]]

#: "2026-01-01 12:00:00 | INFO | train_inner | {...}" (fairseq's console format, the logger named
#: after the progress bar's tag)
_TAGGED = re.compile(r"\|\s*(train_inner|valid|train)\s*\|\s*(\{.*\})\s*$")


def _number(value):
    """fairseq's json values are strings: "20" as 20, "8.5" as 8.5; others as they are."""
    if not isinstance(value, str):
        return value
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


def parse_record(line: str) -> Optional[Record]:
    """One fairseq ``--log-format json`` record as ``{"kind": ..., metric: number, ...}``: a console
    line tagged ``train_inner``, ``valid`` or ``train``, or a bare ``{...}`` line of a ``--log-file``
    (its kind read off its keys: ``valid_*``, ``train_*``, else ``train_inner``).  The ``valid_`` /
    ``train_`` prefixes are dropped (``{"kind": "valid", "loss": 8.5, "num_updates": 20}``);
    None for any other line."""
    m = _TAGGED.search(line)
    body = m.group(2) if m else line.strip()
    if not body.startswith("{"):
        return None
    try:
        raw = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(raw, dict):
        return None
    kind = (
        m.group(1)
        if m
        else (
            "valid"
            if any(k.startswith("valid_") for k in raw)
            else "train"
            if any(k.startswith("train_") for k in raw)
            else "train_inner"
        )
    )
    prefix = f"{kind}_" if kind != "train_inner" else ""
    record: Record = {"kind": kind}
    for key, value in raw.items():
        record[key[len(prefix) :] if prefix and key.startswith(prefix) else key] = _number(value)
    return record


def parse_log_lines(lines: Iterable[str]) -> List[Record]:
    """Every json record of a fairseq-train log, in order (:func:`parse_record`)."""
    return [r for r in map(parse_record, lines) if r is not None]


def parse_log(path: str) -> List[Record]:
    """The json records of the fairseq-train log at ``path`` (``[]`` when there is none)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return parse_log_lines(f)
    except FileNotFoundError:
        return []


def series(records: Iterable[Record]) -> Series:
    """``{metric: [(update, value)]}`` of the ``train_inner`` records and, as ``valid_*``, of the
    ``valid`` ones (the end-of-epoch ``train`` records left out): the shape of
    :func:`fairseq_deep.diagnostics.plot_training.parse_log_lines`."""
    out: Series = {}
    for r in records:
        step = r.get("num_updates")
        if r["kind"] == "train" or not isinstance(step, (int, float)):
            continue
        prefix = "valid_" if r["kind"] == "valid" else ""
        for key, value in r.items():
            if key in ("kind", "num_updates", "epoch", "update") or not isinstance(
                value, (int, float)
            ):
                continue
            out.setdefault(prefix + key, []).append((float(step), float(value)))
    return out


def last_update(log_path: str) -> Optional[int]:
    """The last ``num_updates`` in a fairseq-train json log (read from its last 64 KiB), or None."""
    try:
        with open(log_path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 65536))
            tail = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    updates = [
        r["num_updates"]
        for r in parse_log_lines(tail.splitlines())  # a cut first line: no record
        if isinstance(r.get("num_updates"), (int, float))
    ]
    return int(updates[-1]) if updates else None


def updates_done(records: Sequence[Record]) -> int:
    """The updates a log reached: its last record's (a validation may come after the last
    ``train_inner`` record, at a --stop-time-hours stop)."""
    return max(
        [0]
        + [int(r["num_updates"]) for r in records if isinstance(r.get("num_updates"), (int, float))]
    )


# --------------------------------------------------------------------------------------------
# fairseq-generate's output and sacreBLEU
# --------------------------------------------------------------------------------------------

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
    post-processed); the first (best) hypothesis of each under --nbest; ``bleu4``: fairseq's own
    score (its ``Generate ... BLEU4 = x`` line), None without one; ``translated``: its
    ``Translated ...`` line (:class:`Translated`), None without one; ``lines``: every line."""

    sources: Dict[int, str] = field(default_factory=dict)
    targets: Dict[int, str] = field(default_factory=dict)
    tokens: Dict[int, str] = field(default_factory=dict)
    detok: Dict[int, str] = field(default_factory=dict)
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
        if kind in "HD":  # "score<TAB>text"
            rest = rest.split("\t", 1)[1] if "\t" in rest else ""
        if kind in "HD" and idx in by_kind[kind]:
            continue  # --nbest > 1: the first (best) hypothesis only
        by_kind[kind][idx] = rest
    return out


def read_generate(path: str) -> Generated:
    """:func:`parse_generate` of the file at ``path``."""
    with open(path, encoding="utf-8", errors="replace") as f:
        return parse_generate(f)


def hypotheses_by_id(generate_out: str) -> Dict[int, str]:
    """The ``D-`` lines of fairseq-generate's output file: ``{sentence id: text}``."""
    return read_generate(generate_out).detok


def score(hyps: Sequence[str], refs: Sequence[str]) -> Dict[str, float]:
    """sacreBLEU's corpus BLEU and chrF: ``{"bleu": ..., "chrf": ...}``."""
    import sacrebleu

    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} hypotheses for {len(refs)} references")
    return {
        "bleu": sacrebleu.corpus_bleu(list(hyps), [list(refs)]).score,
        "chrf": sacrebleu.corpus_chrf(list(hyps), [list(refs)]).score,
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


def last_error(text: str) -> str:
    """The line of a failed fairseq run's output that names its error (else its last line)."""
    lines = [ln for ln in text.splitlines() if re.search(r"(Error|Exception)\b", ln)]
    return (lines[-1] if lines else (text.strip().splitlines() or [""])[-1])[:300]
