"""What fairseq-train prints, read: its ``--log-format json`` records (console lines ``... |
train_inner | {...}`` or ``--log-file`` lines ``{...}``) as :class:`dict` records with a ``kind``
(``train_inner``, ``valid``, ``train``) and numbers (:func:`parse_record`, :func:`parse_log`),
:func:`series` of them, the last update reached; the facts fairseq prints as text (the parameter
count, the update a checkpoint was loaded at, the overflowed fp16 steps), and the line that names a
failed run's error (:func:`last_error`).  (Text logs one does not control, e.g. ``--log-format
simple``, are read by :mod:`fairseq_deep.diagnostics.plot_training`.)"""

import datetime
import json
import os
import re
from typing import Dict, Iterable, List, Optional, Sequence, Tuple, Union

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


#: fairseq's console lines begin with their time, "2026-01-01 12:00:00 | ..."
_STAMP = "%Y-%m-%d %H:%M:%S"
#: the trainer's line as the first epoch starts
_STARTS = "Start iterating over samples"


def timed_records(lines: Iterable[str]) -> List[Tuple[float, Record]]:
    """The json records of a fairseq-train console log, each with the seconds since training
    started (its time stamp less that of fairseq's "Start iterating over samples" line; the first
    record's own stamp where the log has none)."""
    out, start = [], None
    for line in lines:
        try:
            stamp = datetime.datetime.strptime(line[:19], _STAMP)
        except ValueError:
            continue
        if _STARTS in line and start is None:
            start = stamp
        record = parse_record(line)
        if record is not None:
            start = start or stamp
            out.append(((stamp - start).total_seconds(), record))
    return out


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


def epochs_done(records: Sequence[Record]) -> int:
    """The epochs a log trained: its last end-of-epoch ``train`` record's epoch (0 without one).
    fairseq logs that record for an epoch that its budget (``--max-update``, ``--stop-time-hours``)
    cut short too, so the last epoch counted may be partial; one stopped by ``--patience`` ends at
    an epoch's end (with validation every epoch)."""
    return max(
        [0]
        + [
            int(r["epoch"])
            for r in records
            if r["kind"] == "train" and isinstance(r.get("epoch"), int)
        ]
    )


# --------------------------------------------------------------------------------------------
# what fairseq prints as text
# --------------------------------------------------------------------------------------------

#: fairseq_cli.train's lines when training stops (``should_stop_early``, ``validate_and_save``),
#: and what each says stopped it
_STOPS = (
    ("early stop since valid performance hasn't improved", "plateau"),
    ("Stopping training due to cumulative_training_time", "time"),
    ("Stopping training due to num_updates", "max_update"),
)

#: fairseq_cli.train's "num. shared model params: 1,234 (num. trained: 1,234)"
_PARAMS = re.compile(r"num\. shared model params: ([\d,]+)")
#: the trainer's "Loaded checkpoint X (epoch 2 @ 40 updates)"
_LOADED = re.compile(r"[Ll]oaded checkpoint .*\(epoch \d+ @ (\d+) updates\)")
#: the fp16 optimizers' "gradient overflow detected, ignoring gradient, setting loss scale to: ..."
_OVERFLOW = "gradient overflow detected"


def parse_params(text: str) -> Optional[int]:
    """The parameter count fairseq-train logs (``num. shared model params: N``); None without one."""
    found = _PARAMS.findall(text)
    return int(found[-1].replace(",", "")) if found else None


def parse_loaded_update(text: str) -> Optional[int]:
    """The update of the checkpoint fairseq-train loaded (``Loaded checkpoint ... (epoch E @ N
    updates)``: a resumed run); None where it loaded none."""
    found = _LOADED.findall(text)
    return int(found[-1]) if found else None


def stop_reason(text: str) -> Optional[str]:
    """What stopped a fairseq-train run, from its log (the last stop of a resumed one): "plateau"
    (``--patience`` validations without a better loss), "time" (``--stop-time-hours``),
    "max_update" (``--max-update``); None where the log names none (killed, failed, or ended by
    ``--max-epoch``)."""
    found = [(text.rfind(line), reason) for line, reason in _STOPS if line in text]
    return max(found)[1] if found else None


def count_overflows(text: str) -> int:
    """fp16 steps skipped for an overflowed gradient (fairseq's "gradient overflow detected")."""
    return text.count(_OVERFLOW)


#: the last line of a traceback: "ValueError: ...", "torch.cuda.OutOfMemoryError: ...", or
#: "Exception ..."
_RAISED = re.compile(r"^(?:\w+\.)*\w*(?:Error|Exception)\b")
_MENTIONS = re.compile(r"(Error|Exception)\b")


def last_error(text: str, limit: int = 300) -> str:
    """The line of a failed fairseq run's output that names its error: the last exception raised
    (a traceback's last line), else the last line that names an error, else its last line; at most
    ``limit`` characters."""
    lines = text.splitlines()
    named = [ln for ln in lines if _RAISED.match(ln)] or [
        ln for ln in lines if _MENTIONS.search(ln)
    ]
    return (named[-1] if named else (text.strip().splitlines() or [""])[-1])[:limit]
