"""Serving an export with CTranslate2: fairseq-generate's hypotheses, its length limit, and the
compute type that is fastest on the machine at hand (docs/export.md).

* :func:`matching_settings`, :func:`fairseq_hypothesis`: ``translate_batch``'s settings that decode
  as fairseq-generate does, and its hypotheses read as fairseq's;
* :func:`translate`: a CTranslate2 translator decoding as ``fairseq-generate --beam --lenpen
  --max-len-a --max-len-b`` does (:func:`matching_settings`).  fairseq's limit
  is per batch, ``min(int(a * src_len + b), max_positions - 1)`` tokens with ``src_len`` the
  batch's longest source with its ``</s>`` (``SequenceGenerator._generate``); CTranslate2's
  ``max_decoding_length`` is a number per call and it has no relative limit, so the sentences are
  sorted by length and each batch is one call with its own ``max_decoding_length``.
* :func:`time_compute_types`: which of the compute types CTranslate2 supports on this device
  (``ctranslate2.get_supported_compute_types``) translates fastest, timed on a few sentences:
  it depends on the CPU (int8 was 2.7x slower than float32 on an AMD EPYC, 1.9-12x faster on an
  Intel Xeon with AMX: docs/export.md).  ``fairseq-deep-export`` runs it on the test split of
  ``--data`` and records it; ``benchmarks/export_speed.py`` reports every type against
  fairseq-generate.
"""

import os
import platform
import time
from typing import Dict, List, Optional, Sequence

#: CTranslate2's compute types, in the order they are tried and reported
COMPUTE_TYPES = (
    "float32",
    "int8_float32",
    "int8",
    "int16",
    "float16",
    "int8_float16",
    "bfloat16",
    "int8_bfloat16",
)


def matching_settings(
    beam: int = 5, lenpen: float = 1.0, max_len_b: int = 200
) -> Dict[str, object]:
    """CTranslate2's ``translate_batch`` settings that decode as ``fairseq-generate --beam BEAM
    --lenpen LENPEN --max-len-a 0 --max-len-b MAX_LEN_B`` does (docs/export.md): the length
    penalty divides by the length with </s> (``return_end_token``), </s> is not allowed first
    (fairseq's ``--min-len 1``), a search ends with ``beam`` finished hypotheses (``patience`` 1);
    read the hypotheses with :func:`fairseq_hypothesis`."""
    return {
        "beam_size": beam,
        "length_penalty": lenpen,
        "return_end_token": True,
        "max_decoding_length": max_len_b + 1,
        "min_decoding_length": 1,
        "patience": 1,
        "return_scores": True,
    }


def fairseq_hypothesis(tokens, settings: Dict[str, object]):
    """fairseq-generate's hypothesis from CTranslate2's tokens under :func:`matching_settings`:
    without its </s>, or, where the search reached the length limit (fairseq then forces </s>
    after max_len_b tokens), its first max_len_b tokens."""
    tokens = list(tokens)
    if tokens and tokens[-1] == "</s>":
        return tokens[:-1]
    return tokens[: int(settings["max_decoding_length"]) - 1]


def length_limit(src_len: int, max_len_a: float, max_len_b: int, max_positions: int = 1024) -> int:
    """fairseq-generate's most target tokens (before </s>) for a batch whose longest source has
    ``src_len`` tokens with its </s>: ``min(int(a * src_len + b), max_positions - 1)``."""
    return min(int(max_len_a * src_len + max_len_b), max_positions - 1)


def batch_limits(
    pieces: Sequence[Sequence[str]],
    max_len_a: float,
    max_len_b: int,
    max_batch_size: int = 32,
    max_positions: int = 1024,
) -> List[int]:
    """Each sentence's length limit under :func:`translate`: the sentences sorted by length, cut
    into batches of ``max_batch_size``, each with the :func:`length_limit` of its longest source."""
    order = sorted(range(len(pieces)), key=lambda i: len(pieces[i]))
    limits = [0] * len(pieces)
    for start in range(0, len(order), max_batch_size):
        batch = order[start : start + max_batch_size]
        longest = max(len(pieces[i]) for i in batch) + 1  # fairseq's src_len counts the </s>
        for i in batch:
            limits[i] = length_limit(longest, max_len_a, max_len_b, max_positions)
    return limits


def translate(
    translator,
    pieces: Sequence[Sequence[str]],
    beam: int = 5,
    lenpen: float = 1.0,
    max_len_a: float = 0.0,
    max_len_b: int = 200,
    max_batch_size: int = 32,
    max_positions: int = 1024,
) -> List[List[str]]:
    """fairseq-generate's hypotheses (tokens, in input order) of ``pieces`` (each source as the
    pieces stand in the data, without </s>) from a CTranslate2 ``translator`` of an export.

    With ``max_len_a`` 0 the limit is the same for every sentence: one ``translate_batch`` call
    (CTranslate2 sorts and batches).  Otherwise the sentences are sorted by length and cut into
    batches of ``max_batch_size``, each translated with the limit of its longest source, as
    fairseq gives each batch (:func:`batch_limits`).  Where a hypothesis reaches the limit the
    engines differ: fairseq forces </s> after ``limit`` tokens and ranks the hypothesis with that
    </s>'s probability, CTranslate2 stops after ``limit + 1`` tokens (cut back to ``limit`` by
    :func:`fairseq_hypothesis`) and ranks it with the best token's; and the
    batches are not always fairseq's (its ties in source length are ordered by target length)."""
    n = len(pieces)
    if max_len_a == 0:
        settings = matching_settings(beam, lenpen, length_limit(0, 0, max_len_b, max_positions))
        results = translator.translate_batch(
            [list(p) for p in pieces], max_batch_size=max_batch_size, **settings
        )
        return [fairseq_hypothesis(r.hypotheses[0], settings) for r in results]
    limits = batch_limits(pieces, max_len_a, max_len_b, max_batch_size, max_positions)
    order = sorted(range(n), key=lambda i: len(pieces[i]))
    hypotheses: List[Optional[List[str]]] = [None] * n
    for start in range(0, n, max_batch_size):
        batch = order[start : start + max_batch_size]
        settings = matching_settings(beam, lenpen, limits[batch[0]])
        results = translator.translate_batch(
            [list(pieces[i]) for i in batch], max_batch_size=len(batch), **settings
        )
        for i, r in zip(batch, results):
            hypotheses[i] = fairseq_hypothesis(r.hypotheses[0], settings)
    return hypotheses


# ---------------------------------------------------------------------------------------------
# the fastest compute type here
# ---------------------------------------------------------------------------------------------


def candidates(device: str = "cpu") -> List[str]:
    """The compute types CTranslate2 supports on ``device`` here, in :data:`COMPUTE_TYPES` order."""
    import ctranslate2

    supported = ctranslate2.get_supported_compute_types(device)
    return [t for t in COMPUTE_TYPES if t in supported]


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what ``platform`` says."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def default_threads() -> int:
    """The cores this process may use, at most 4 (CTranslate2's own default)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    return max(1, min(4, cores))


def time_compute_types(
    model: str,
    pieces: Sequence[Sequence[str]],
    device: str = "cpu",
    threads: Optional[int] = None,
    beam: int = 5,
    max_len_b: int = 200,
    batch: int = 32,
    rounds: int = 2,
    types: Optional[Sequence[str]] = None,
) -> Dict[str, object]:
    """Each compute type's speed on ``pieces`` with the export ``model`` (the types ``device``
    supports here, or ``types``): one translator per type, loaded once (loading time left out),
    the types alternated round by round, each type's best round.  Returns a record:
    ``sentences_per_s`` and ``same_as_float32`` (hypotheses equal to float32's) by type,
    ``fastest`` and the conditions (device, CPU, threads, sentences, beam, batch, rounds)."""
    import ctranslate2

    threads = threads or default_threads()
    types = list(types or candidates(device))
    translators = {
        t: ctranslate2.Translator(
            model, device=device, compute_type=t, intra_threads=threads, inter_threads=1
        )
        for t in types
    }
    best = {t: float("inf") for t in types}
    hypotheses = {}
    for _ in range(rounds):
        for t in types:
            start = time.perf_counter()
            hypotheses[t] = translate(
                translators[t], pieces, beam=beam, max_len_b=max_len_b, max_batch_size=batch
            )
            best[t] = min(best[t], time.perf_counter() - start)
    del translators
    speed = {t: len(pieces) / best[t] for t in types}
    reference = hypotheses.get("float32")
    return {
        "device": device,
        "cpu": cpu_name(),
        "threads": threads,
        "sentences": len(pieces),
        "beam": beam,
        "batch": batch,
        "rounds": rounds,
        "sentences_per_s": speed,
        "same_as_float32": {t: sum(a == b for a, b in zip(hypotheses[t], reference)) for t in types}
        if reference is not None
        else None,
        "fastest": max(types, key=speed.get),
    }


def describe_timing(record: Dict[str, object]) -> str:
    """One line of :func:`time_compute_types`'s record: the speeds and the type to use."""
    speed = record["sentences_per_s"]
    same = record.get("same_as_float32") or {}
    n = record["sentences"]
    where = (
        f"this CPU ({record['cpu']}, {record['threads']} threads)"
        if record["device"] == "cpu"
        else f"{record['device']}"
    )
    parts = [
        f"{t} {v:.1f}" + (f" ({same[t]}/{n} as float32's)" if t in same and t != "float32" else "")
        for t, v in speed.items()
    ]
    fastest = record["fastest"]
    return (
        f"compute types on {where}, {n} test sentences, beam {record['beam']}, "
        f"sentences/s best of {record['rounds']}: {', '.join(parts)}; the fastest here is "
        f'{fastest}: ctranslate2.Translator(OUT, compute_type="{fastest}")'
    )
