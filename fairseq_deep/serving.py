"""Serving an export with CTranslate2: fairseq-generate's hypotheses, its length limit, and the
way of serving (backend, compute type, threads) that is fastest on the machine at hand
(docs/export.md).

* :func:`matching_settings`, :func:`fairseq_hypothesis`: ``translate_batch``'s settings that decode
  as fairseq-generate does, and its hypotheses read as fairseq's;
* :func:`translate`: a CTranslate2 translator decoding as ``fairseq-generate --beam --lenpen
  --max-len-a --max-len-b`` does (:func:`matching_settings`).  fairseq's limit
  is per batch, ``min(int(a * src_len + b), max_positions - 1)`` tokens with ``src_len`` the
  batch's longest source with its ``</s>`` (``SequenceGenerator._generate``); CTranslate2's
  ``max_decoding_length`` is a number per call and it has no relative limit, so the sentences are
  sorted by length and each batch is one call with its own ``max_decoding_length``.
* :func:`time_serving`: which way of serving translates fastest here with the user's decoding
  settings (beam, length limit, batches): CTranslate2's CPU backend (``CT2_USE_MKL``, read once
  when ctranslate2 is loaded, so each is timed in a process of its own that runs this file by
  path: the module imports nothing of the package), compute type and threads (intra_threads x
  inter_threads), each translator warmed up first.  It depends on the CPU and on the
  machine's load (MKL's int8 was 1.9-7.8x slower than oneDNN's on an AMD EPYC; MKL made a
  width-128 model 2-5x slower on an Intel Xeon: docs/export.md).  ``fairseq-deep-export`` runs it on the test split of
  ``--data``, records it and writes the fastest beside the model (:data:`CHOICE`), which
  :func:`translator` loads; ``benchmarks/ctranslate2_settings.py`` reports every setting against
  fairseq-generate.
"""

import os
import platform
import time
from typing import Dict, List, Optional, Sequence, Tuple

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
#: CTranslate2's CPU backends, as the environment chooses them: ``CT2_USE_MKL`` is read once,
#: when ctranslate2 is loaded (its default: Intel's MKL on an Intel CPU, oneDNN on any other)
BACKENDS = ("CT2_USE_MKL=0", "CT2_USE_MKL=1")
#: the serving choice ``fairseq-deep-export`` writes beside the model (:func:`read_choice`)
CHOICE = "serving.json"
#: how ``max_batch_size`` counts: sentences (fairseq-generate's --batch-size) or source tokens
BATCH_TYPES = ("examples", "tokens")


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
    batch_type: str = "examples",
) -> List[int]:
    """Each sentence's length limit under :func:`translate`: the sentences sorted by length, cut
    into batches (:func:`batches`), each with the :func:`length_limit` of its longest source."""
    limits = [0] * len(pieces)
    for batch in batches(pieces, max_batch_size, batch_type):
        longest = max(len(pieces[i]) for i in batch) + 1  # fairseq's src_len counts the </s>
        for i in batch:
            limits[i] = length_limit(longest, max_len_a, max_len_b, max_positions)
    return limits


def batches(
    pieces: Sequence[Sequence[str]], max_batch_size: int, batch_type: str = "examples"
) -> List[List[int]]:
    """The sentences' indices sorted by length and cut into batches: of ``max_batch_size``
    sentences (``batch_type`` "examples", fairseq-generate's ``--batch-size``) or of at most
    ``max_batch_size`` tokens counted as the batch's longest source with its </s> times its
    sentences (``"tokens"``, fairseq-generate's ``--max-tokens``; a longer sentence alone)."""
    if batch_type not in BATCH_TYPES:
        raise ValueError(f"batch_type {batch_type!r}: choose one of {', '.join(BATCH_TYPES)}")
    order = sorted(range(len(pieces)), key=lambda i: len(pieces[i]))
    if batch_type == "examples":
        return [order[s : s + max_batch_size] for s in range(0, len(order), max_batch_size)]
    cut: List[List[int]] = []
    for i in order:
        width = len(pieces[i]) + 1
        if cut and width * (len(cut[-1]) + 1) <= max_batch_size:
            cut[-1].append(i)
        else:
            cut.append([i])
    return cut


def translate(
    translator,
    pieces: Sequence[Sequence[str]],
    beam: int = 5,
    lenpen: float = 1.0,
    max_len_a: float = 0.0,
    max_len_b: int = 200,
    max_batch_size: int = 32,
    max_positions: int = 1024,
    batch_type: str = "examples",
) -> List[List[str]]:
    """fairseq-generate's hypotheses (tokens, in input order) of ``pieces`` (each source as the
    pieces stand in the data, without </s>) from a CTranslate2 ``translator`` of an export
    (:func:`translator` loads one with the settings ``fairseq-deep-export`` found fastest).

    With ``max_len_a`` 0 the limit is the same for every sentence: one ``translate_batch`` call
    (CTranslate2 sorts and batches, ``max_batch_size`` of ``batch_type``).  Otherwise the
    sentences are sorted by length and cut into batches (:func:`batches`), each translated with
    the limit of its longest source, as fairseq gives each batch (:func:`batch_limits`); the
    batches are submitted at once (``asynchronous``), so that a translator with
    ``inter_threads`` > 1 runs them side by side.  Where a hypothesis reaches the limit the
    engines differ: fairseq forces </s> after ``limit`` tokens and ranks the hypothesis with that
    </s>'s probability, CTranslate2 stops after ``limit + 1`` tokens (cut back to ``limit`` by
    :func:`fairseq_hypothesis`) and ranks it with the best token's; and the
    batches are not always fairseq's (its ties in source length are ordered by target length)."""
    n = len(pieces)
    if max_len_a == 0:
        settings = matching_settings(beam, lenpen, length_limit(0, 0, max_len_b, max_positions))
        results = translator.translate_batch(
            [list(p) for p in pieces],
            max_batch_size=max_batch_size,
            batch_type=batch_type,
            **settings,
        )
        return [fairseq_hypothesis(r.hypotheses[0], settings) for r in results]
    submitted = []
    for batch in batches(pieces, max_batch_size, batch_type):
        longest = max(len(pieces[i]) for i in batch) + 1  # fairseq's src_len counts the </s>
        settings = matching_settings(
            beam, lenpen, length_limit(longest, max_len_a, max_len_b, max_positions)
        )
        results = translator.translate_batch(
            [list(pieces[i]) for i in batch],
            max_batch_size=len(batch),
            asynchronous=True,
            **settings,
        )
        submitted.append((batch, settings, results))
    hypotheses: List[Optional[List[str]]] = [None] * n
    for batch, settings, results in submitted:
        for i, r in zip(batch, results):
            hypotheses[i] = fairseq_hypothesis(r.result().hypotheses[0], settings)
    return hypotheses


# ---------------------------------------------------------------------------------------------
# the fastest compute type here
# ---------------------------------------------------------------------------------------------


def candidates(device: str = "cpu") -> List[str]:
    """The compute types CTranslate2 supports on ``device`` here, in :data:`COMPUTE_TYPES` order."""
    import ctranslate2

    supported = ctranslate2.get_supported_compute_types(device)
    return [t for t in COMPUTE_TYPES if t in supported]


def cpuinfo(field: str) -> Optional[str]:
    """The first value of ``field`` in ``/proc/cpuinfo`` (``model name``, ``vendor_id``), or None
    where there is none (no such file, another system)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith(field):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what ``platform`` says."""
    return cpuinfo("model name") or platform.processor() or platform.machine()


def default_threads() -> int:
    """The cores this process may use, at most 4 (CTranslate2's own default)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    return max(1, min(4, cores))


def cpu_vendor() -> str:
    """The CPU's vendor (``/proc/cpuinfo``'s vendor_id: GenuineIntel, AuthenticAMD, ...) or ''."""
    return cpuinfo("vendor_id") or ""


def default_backend() -> str:
    """The backend CTranslate2 picks here when not told: ``CT2_USE_MKL`` as this process's
    environment sets it, else MKL on an Intel CPU and oneDNN (``CT2_USE_MKL=0``) on any other
    (CTranslate2's rule), as :data:`BACKENDS` names it."""
    value = os.environ.get("CT2_USE_MKL")
    if value is None:
        value = "1" if cpu_vendor() == "GenuineIntel" else "0"
    return f"CT2_USE_MKL={'0' if value.strip().lower() in ('0', 'false', 'off') else '1'}"


def thread_layouts(threads: int) -> List[Tuple[int, int]]:
    """The ways to spend ``threads`` cores that are timed: (intra_threads, inter_threads) of
    (threads, 1), one translation at a time on every core, and (1, threads), as many batches at
    once (:func:`translate` submits its batches together)."""
    return [(threads, 1)] + ([(1, threads)] if threads > 1 else [])


def _time_here(spec: Dict[str, object]) -> Dict[str, object]:
    """The timing of one process (one backend, :func:`time_serving`): every compute type and
    thread layout of ``spec`` loaded once, each warmed up on its first batch (left out), then
    each timed on all the pieces, the settings alternated; the seconds and hypotheses of each."""
    import ctranslate2

    device = str(spec["device"])
    offered = candidates(device)
    types = [t for t in (spec["compute_types"] or offered) if t in offered]
    options = {k: spec[k] for k in ("beam", "lenpen", "max_len_a", "max_len_b", "batch_type")}
    pieces = spec["pieces"]
    rows = []
    for t in types:
        for intra, inter in spec["layouts"]:
            translator = ctranslate2.Translator(
                str(spec["model"]),
                device=device,
                compute_type=t,
                intra_threads=intra,
                inter_threads=inter,
            )
            warm = pieces[: int(spec["batch"])] if spec["batch_type"] == "examples" else pieces[:8]
            start = time.perf_counter()
            translate(translator, warm, max_batch_size=int(spec["batch"]), **options)
            rows.append(
                {
                    "compute_type": t,
                    "intra_threads": intra,
                    "inter_threads": inter,
                    "warm_up": [len(warm), time.perf_counter() - start],
                    "seconds": [],
                    "translator": translator,
                }
            )
    for _ in range(int(spec["rounds"])):
        for row in rows:
            start = time.perf_counter()
            row["hypotheses"] = translate(
                row["translator"], pieces, max_batch_size=int(spec["batch"]), **options
            )
            row["seconds"].append(time.perf_counter() - start)
    for row in rows:
        del row["translator"]
    return {"version": ctranslate2.__version__, "compute_types": types, "settings": rows}


def _worker():
    """The entry of a backend's process: the spec as JSON on stdin, the result on stdout."""
    import json
    import sys

    spec = json.load(sys.stdin)
    json.dump(_time_here(spec), sys.stdout)


#: lines of CTranslate2's log (CT2_VERBOSE=1) that say which libraries run the products
_BACKEND_LINES = {
    "Use Intel MKL": "mkl",
    "SGEMM backend": "sgemm",
    "GEMM_S8 backend": "gemm_s8",
    "GEMM_S16 backend": "gemm_s16",
    "Selected ISA": "isa",
}


def _backend_process(backend: Optional[str], spec: Dict[str, object]) -> Dict[str, object]:
    """:func:`_time_here` in a new process whose environment sets ``backend`` ("CT2_USE_MKL=0";
    None: this process's environment), CTranslate2's log of its backend read from stderr."""
    import json
    import subprocess
    import sys

    env = dict(os.environ, CT2_VERBOSE="1")
    if backend is not None:
        name, value = backend.split("=", 1)
        env[name] = value
    code = "import runpy, sys; runpy.run_path(sys.argv[1])['_worker']()"
    proc = subprocess.run(
        [sys.executable, "-c", code, os.path.abspath(__file__)],
        input=json.dumps(spec),
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"timing CTranslate2 with {backend or 'its default backend'} failed: "
            + (proc.stderr.strip().splitlines() or ["no output"])[-1]
        )
    result = json.loads(proc.stdout)
    libraries = {}
    for line in proc.stderr.splitlines():
        for marker, key in _BACKEND_LINES.items():
            if marker in line and key not in libraries:
                libraries[key] = line.split(marker, 1)[1].strip(" :")
    result["libraries"] = libraries
    return result


def time_serving(
    model: str,
    pieces: Sequence[Sequence[str]],
    device: str = "cpu",
    threads: Optional[int] = None,
    beam: int = 5,
    lenpen: float = 1.0,
    max_len_a: float = 0.0,
    max_len_b: int = 200,
    batch: int = 32,
    batch_type: str = "examples",
    rounds: int = 2,
    compute_types: Optional[Sequence[str]] = None,
    backends: Optional[Sequence[str]] = None,
    layouts: Optional[Sequence[Tuple[int, int]]] = None,
    keep_hypotheses: bool = False,
) -> Dict[str, object]:
    """Which way of serving the export ``model`` translates ``pieces`` fastest here, with the
    decoding settings the user translates with (:func:`translate`'s beam, length penalty,
    length limit relative to the source, batches): every CPU backend (:data:`BACKENDS`, one
    process each, as ``CT2_USE_MKL`` is read when ctranslate2 is loaded; on a GPU, this process's
    environment) x compute type (those the backend offers, or ``compute_types``) x thread
    layout (:func:`thread_layouts` of ``threads``, or ``layouts``).  Each translator is loaded
    once and warmed up on its first batch (both left out of the time); the settings alternate
    within a process and the processes round by round; each setting's best round counts.

    Returns a record: the conditions, ``settings`` (each with its ``sentences_per_s``, its
    rounds' ``seconds`` and ``same_as_reference``: hypotheses equal to those of the
    ``reference`` setting, the default backend in float32 on every core), the ``backends``
    (which libraries each runs, which is the default), ``target_tokens`` (the reference's
    hypotheses' tokens: what the length limit let through), ``choice`` (the fastest setting, as
    :func:`translator` loads it, and its speed against the ``default_setting``: what
    ``ctranslate2.Translator(OUT)`` with ``intra_threads`` = the cores gives), and by compute
    type ``sentences_per_s``, ``same_as_float32`` and the ``fastest`` type."""
    threads = threads or default_threads()
    layouts = [tuple(x) for x in (layouts or thread_layouts(threads))]
    if device == "cpu":
        backends = list(backends or BACKENDS)
        default = default_backend()
    else:
        backends, default = [None], None
    spec = {
        "model": os.path.abspath(model),
        "pieces": [list(p) for p in pieces],
        "device": device,
        "beam": beam,
        "lenpen": lenpen,
        "max_len_a": max_len_a,
        "max_len_b": max_len_b,
        "batch": batch,
        "batch_type": batch_type,
        "rounds": 1,
        "compute_types": list(compute_types) if compute_types else None,
        "layouts": layouts,
    }
    found: Dict[Tuple, Dict[str, object]] = {}
    libraries: Dict[Optional[str], Dict[str, object]] = {}
    for _ in range(rounds):
        for backend in backends:  # alternated round by round: the same disturbances for each
            if "failed" in libraries.get(backend, {}):
                continue
            try:
                result = _backend_process(backend, spec)
            except RuntimeError as e:  # e.g. CT2_USE_MKL=1 where the build has no MKL
                if backend == default or backend is None:
                    raise
                libraries[backend] = {"failed": str(e), "default": False}
                continue
            libraries[backend] = {
                **result["libraries"],
                "compute_types": result["compute_types"],
                "default": backend == default,
            }
            for row in result["settings"]:
                key = (backend, row["compute_type"], row["intra_threads"], row["inter_threads"])
                kept = found.setdefault(
                    key,
                    {
                        "backend": backend,
                        "compute_type": row["compute_type"],
                        "intra_threads": row["intra_threads"],
                        "inter_threads": row["inter_threads"],
                        "seconds": [],
                        "warm_up": [],
                        "hypotheses": row["hypotheses"],
                    },
                )
                kept["seconds"] += row["seconds"]
                kept["warm_up"].append(row["warm_up"])
    rows = list(found.values())
    for row in rows:
        row["sentences_per_s"] = len(pieces) / min(row["seconds"])
    by_key = {
        (r["backend"], r["compute_type"], r["intra_threads"], r["inter_threads"]): r for r in rows
    }
    first_type = (
        "float32" if any(r["compute_type"] == "float32" for r in rows) else rows[0]["compute_type"]
    )
    reference = by_key.get((default, first_type, *layouts[0])) or rows[0]
    for row in rows:
        row["same_as_reference"] = sum(
            a == b for a, b in zip(row["hypotheses"], reference["hypotheses"])
        )
    best = max(rows, key=lambda r: r["sentences_per_s"])
    types = list(dict.fromkeys(r["compute_type"] for r in rows))
    per_type = {t: max(r["sentences_per_s"] for r in rows if r["compute_type"] == t) for t in types}
    floats = [r for r in rows if r["compute_type"] == "float32"]
    same_as_float32 = (
        {
            t: min(
                sum(a == b for a, b in zip(r["hypotheses"], floats[0]["hypotheses"]))
                for r in rows
                if r["compute_type"] == t
            )
            for t in types
        }
        if floats
        else None
    )
    default_row = by_key.get((default, first_type, *layouts[0]))
    choice = {
        "env": dict([best["backend"].split("=", 1)]) if best["backend"] else {},
        "compute_type": best["compute_type"],
        "intra_threads": best["intra_threads"],
        "inter_threads": best["inter_threads"],
        "max_batch_size": batch,
        "batch_type": batch_type,
        "sentences_per_s": best["sentences_per_s"],
        "vs_default_setting": best["sentences_per_s"] / default_row["sentences_per_s"]
        if default_row
        else None,
    }
    target_tokens = sum(len(h) for h in reference["hypotheses"])
    if not keep_hypotheses:
        for row in rows:
            del row["hypotheses"]
    return {
        "device": device,
        "cpu": cpu_name(),
        "threads": threads,
        "sentences": len(pieces),
        "beam": beam,
        "lenpen": lenpen,
        "max_len_a": max_len_a,
        "max_len_b": max_len_b,
        "batch": batch,
        "batch_type": batch_type,
        "rounds": rounds,
        "warm_up": "each translator's first batch, left out",
        "target_tokens": target_tokens,
        "backends": {str(b): libraries[b] for b in backends},
        "default_backend": default,
        "settings": rows,
        "reference": setting_name(reference),
        "default_setting": setting_name(default_row) if default_row else None,
        "choice": choice,
        "sentences_per_s": per_type,
        "same_as_float32": same_as_float32,
        "fastest": best["compute_type"],
    }


def setting_name(row: Dict[str, object]) -> str:
    """A row of :func:`time_serving`'s ``settings`` in words: backend, compute type, threads."""
    backend = f"{row['backend']} " if row["backend"] else ""
    return (
        f"{backend}{row['compute_type']}, intra_threads {row['intra_threads']}, "
        f"inter_threads {row['inter_threads']}"
    )


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
    max_len_a: float = 0.0,
    lenpen: float = 1.0,
) -> Dict[str, object]:
    """:func:`time_serving` with this process's backend and ``threads`` intra-op threads only:
    each compute type's speed (``sentences_per_s``, ``same_as_float32``, ``fastest``)."""
    threads = threads or default_threads()
    return time_serving(
        model,
        pieces,
        device=device,
        threads=threads,
        beam=beam,
        lenpen=lenpen,
        max_len_a=max_len_a,
        max_len_b=max_len_b,
        batch=batch,
        rounds=rounds,
        compute_types=types,
        backends=[default_backend()] if device == "cpu" else None,
        layouts=[(threads, 1)],
    )


def describe_choice(record: Dict[str, object]) -> str:
    """The one line that says how to serve: the fastest setting, how to get it, and its speed
    against CTranslate2's default setting here."""
    choice = record["choice"]
    env = " ".join(f"{k}={v}" for k, v in choice["env"].items())
    versus = choice.get("vs_default_setting")
    return (
        f"serve with {env + ' ' if env else ''}ctranslate2.Translator(OUT, "
        f'compute_type="{choice["compute_type"]}", intra_threads={choice["intra_threads"]}, '
        f"inter_threads={choice['inter_threads']}), batches of {choice['max_batch_size']} "
        f"{choice['batch_type']}: {choice['sentences_per_s']:.1f} sentences/s"
        + (f", {versus:.2f}x CTranslate2's default here" if versus else "")
        + f" (OUT/{CHOICE}: examples/export/translate.py --fastest, serving.translator)"
    )


def describe_timing(record: Dict[str, object]) -> str:
    """The lines of :func:`time_serving`'s record: the conditions and every setting's speed,
    then the one to use (:func:`describe_choice`)."""
    n = record["sentences"]
    where = (
        f"this CPU ({record['cpu']}, {record['threads']} threads)"
        if record["device"] == "cpu"
        else f"{record['device']}"
    )
    limit = (
        f"--max-len-a {record['max_len_a']:g} --max-len-b {record['max_len_b']}"
        if "max_len_a" in record
        else f"--max-len-b {record.get('max_len_b', 200)}"
    )
    parts = [
        f"{setting_name(r)} {r['sentences_per_s']:.1f}"
        + (
            f" ({r['same_as_reference']}/{n} as the reference's)"
            if r["same_as_reference"] != n
            else ""
        )
        for r in record["settings"]
    ]
    return (
        f"CTranslate2 on {where}, {n} test sentences, beam {record['beam']}, {limit} "
        f"({record['target_tokens']} target tokens), batches of {record['batch']} "
        f"{record['batch_type']}, sentences/s best of {record['rounds']} after a warm-up: "
        + "; ".join(parts)
        + "\n  "
        + describe_choice(record)
    )


def read_choice(model: str, device: Optional[str] = None) -> Optional[Dict[str, object]]:
    """The serving choice ``fairseq-deep-export`` wrote beside ``model`` (``OUT/serving.json``,
    :func:`time_serving`'s ``choice``), or None where it timed nothing (or, given ``device``,
    timed on another device)."""
    import json

    path = os.path.join(model, CHOICE)
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        choice = json.load(f)
    timed_on = (choice.get("timed") or {}).get("device", "cpu")
    return choice if device is None or timed_on == device else None


def apply_environment(choice: Optional[Dict[str, object]]) -> None:
    """Set the choice's environment (``CT2_USE_MKL``) before ctranslate2 is loaded, which reads
    it once; a process that loaded ctranslate2 with another value cannot change its backend."""
    import sys

    for name, value in ((choice or {}).get("env") or {}).items():
        if "ctranslate2" in sys.modules and os.environ.get(name) != value:
            raise RuntimeError(
                f"ctranslate2 is loaded already, without {name}={value}: set it before "
                f"importing ctranslate2 (or run as {name}={value} python ...)"
            )
        os.environ[name] = str(value)


def translator(model: str, device: str = "cpu", fastest: bool = True, **overrides):
    """A ``ctranslate2.Translator`` of the export ``model``: with ``fastest``, loaded as
    ``fairseq-deep-export`` found fastest on this machine (:func:`read_choice`: its backend set
    before ctranslate2 is imported, :func:`apply_environment`; its compute type and threads),
    ``overrides`` (``compute_type``, ``intra_threads``, ``inter_threads``) winning.  Pass the
    choice's ``max_batch_size`` and ``batch_type`` to :func:`translate`."""
    choice = read_choice(model, device) if fastest else None
    apply_environment(choice)
    import ctranslate2

    options = {
        "compute_type": "default",
        "intra_threads": default_threads(),
        "inter_threads": 1,
    }
    if choice:
        options.update({k: choice[k] for k in options if k in choice})
    options.update({k: v for k, v in overrides.items() if v is not None})
    return ctranslate2.Translator(model, device=device, **options)
