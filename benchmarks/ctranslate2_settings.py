"""Where CTranslate2's time goes on a CPU (issue 46 item 6): fairseq-generate against CTranslate2
under each setting, side by side in one run, as ratios.

    python -m benchmarks.ctranslate2_settings [--checkpoint CK.pt --data DATA_BIN]
        [--updates 200 --minutes 10] [--threads 2] [--rounds 2]
        [--work-dir bench_runs/ctranslate2_settings]

Without ``--checkpoint``: a ``transformer_prenorm`` 6 + 6, width 128 (FFN 512, 4 heads) trained
for ``--updates`` updates (at most ``--minutes``) on the synthetic corpus
(``fairseq_deep.data.synthetic``, 20,000 pairs; test: ``--sentences``), sized for 2 CPU cores
(about 3 minutes on two quiet cores; a count of updates, not a time, so that a busy machine
trains the same model: 200 updates end their hypotheses, 64 gave 1.3 tokens a sentence).
The model is exported by ``fairseq-deep-export`` (float32 weights, no timing) and its test split
translated

* by ``fairseq-generate`` (the checkpoint with ``--user-dir``; its own ``Translated ... in X s``,
  model loading left out), once per decoding setting below, ``OMP_NUM_THREADS=THREADS``;
* by CTranslate2 through ``fairseq_deep.serving.time_serving`` (what ``fairseq-deep-export``
  times): each backend (``CT2_USE_MKL=0`` / ``1``) in a process of its own, every translator
  loaded once and warmed up on its first batch (left out; its time is reported apart), the
  settings alternated within a process and the processes and fairseq-generate round by round.

The decoding settings (rows): the recipe's (beam 5, ``--max-len-a 1.2 --max-len-b 10``, batches
of 32 sentences) in float32 and int8 on THREADS intra-op threads, on 1 thread, and THREADS
batches side by side (``inter_threads``); batches of 128 sentences; batches of 1,024 tokens;
beam 1; and the export's timing before issue 46 (a fixed limit of 200 tokens).  Each cell is
the best round's sentences/s and its ratio to fairseq-generate's best under the same decoding
settings; the hypotheses equal to fairseq-generate's are counted (all but those cut at the
length limit should be).  A markdown table goes to stdout, every number to
``WORK_DIR/results.json``.
"""

if __name__ == "__main__" and not __package__:  # run as a file, the package's imports would fail
    raise SystemExit(
        "benchmarks/ctranslate2_settings.py is a module of the benchmarks package: run it from "
        "the repository root as python -m benchmarks.ctranslate2_settings"
    )

import datetime
import json
import os
import re
import subprocess

from fairseq_deep import runs
from fairseq_deep.runs import Part, flags, recipes

from . import harness
from .harness import add_device_argument, device_from_args

log = harness.logger("ctranslate2_settings")

#: the decoding settings compared: (name, beam, max_len_a, max_len_b, batch, batch_type,
#: compute types, thread layouts as (intra, inter) with T the --threads)
SETTINGS = (
    ("recipe", 5, 1.2, 10, 32, "examples", ("float32", "int8"), ("T1", "11", "1T")),
    ("batch 128", 5, 1.2, 10, 128, "examples", ("float32", "int8"), ("T1", "1T")),
    ("1,024 tokens", 5, 1.2, 10, 1024, "tokens", ("float32",), ("T1", "1T")),
    ("beam 1", 1, 1.2, 10, 32, "examples", ("float32", "int8"), ("T1", "1T")),
    ("limit 200", 5, 0.0, 200, 32, "examples", ("float32",), ("T1", "1T")),
)


def train_run(data: str, save: str, updates: int, minutes: float) -> runs.Run:
    """The tiny model: a pre-norm 6 + 6 Transformer at width 128, trained ``updates`` updates (at
    most ``minutes``) without validation."""
    return runs.Run.of(
        "train",
        data,
        Part("model", ["--arch", "transformer_prenorm"]),
        recipes.layers(6, 6),
        recipes.transformer_size(128, 512, 4),
        ["--share-all-embeddings"],
        recipes.dropout("0"),
        recipes.adam("0.003"),
        recipes.inverse_sqrt(100),
        recipes.label_smoothed(0.1),
        recipes.budget(max_tokens=2048, max_update=updates, stop_time_hours=f"{minutes / 60:g}"),
        recipes.seed(1),
        recipes.saving(save_dir=save, no_epoch_checkpoints=True, disable_validation=True),
        recipes.cpu(),
    )


def get_parser():
    p = harness.parser(__doc__, full=True)
    add_device_argument(p, note="CTranslate2's backends are CPU ones: cuda is refused")
    p.add_argument("--checkpoint", help="a checkpoint that exports (default: train one)")
    p.add_argument("--data", help="its data-bin (with a test split); with --checkpoint")
    p.add_argument("--updates", type=int, default=200, help="training updates of the tiny model")
    p.add_argument("--minutes", type=float, default=10.0, help="its training time at most")
    p.add_argument("--sentences", type=int, default=500, help="the synthetic test split's size")
    harness.add_threads(p, default=2, help="cores for both engines (default 2)")
    harness.add_rounds(p, default=2, help="rounds, engines alternated (default 2)")
    harness.add_work_dir(p, default="bench_runs/ctranslate2_settings")
    return p


def prepare(a, work: str):
    """The checkpoint and data: given, or the tiny model trained here (kept and reused)."""
    if a.checkpoint:
        if not a.data:
            raise SystemExit("--checkpoint needs --data (its data-bin, with a test split)")
        return a.checkpoint, a.data
    from fairseq_deep.data.synthetic import write_corpus

    data = os.path.join(work, "bin")
    if not os.path.isdir(data):
        prefixes = write_corpus(os.path.join(work, "raw"), 20000, 200, a.sentences, seed=1)
        runs.execute(
            runs.preprocess(
                "src",
                "tgt",
                data,
                trainpref=prefixes["train"],
                validpref=prefixes["valid"],
                testpref=prefixes["test"],
            ),
            os.path.join(work, "preprocess.log"),
        ).check()
    checkpoint = os.path.join(work, "ck", "checkpoint_last.pt")
    if not os.path.exists(checkpoint):
        log(f"training the tiny model for {a.updates} updates (at most {a.minutes} minutes)")
        run = train_run(data, os.path.dirname(checkpoint), a.updates, a.minutes)
        runs.execute(
            run, os.path.join(work, "train.log"), env=harness.thread_env(a.threads)
        ).check()
    return checkpoint, data


def generate(checkpoint, data, beam, max_len_a, max_len_b, batch, batch_type, threads):
    """fairseq-generate's sentences/s (its own line, loading left out) and hypotheses by id."""
    size = {"batch_size": batch} if batch_type == "examples" else {"max_tokens": batch}
    decoding = runs.Run.of(
        "generate",
        data,
        recipes.decoding(path=checkpoint, gen_subset="test", beam=beam),
        recipes.decoding(max_len_a=max_len_a, max_len_b=max_len_b, **size),
        Part("batching", flags({"required_batch_size_multiple": 1})),  # batches as given
        recipes.cpu(),
    )
    proc = subprocess.run(
        decoding.argv(),
        check=True,
        capture_output=True,
        text=True,
        env=harness.thread_env(threads),
    )
    speed = re.search(
        r"Translated [\d,]+ sentences .* \(([\d.]+) sentences/s", proc.stdout + proc.stderr
    )
    found = {}
    for line in proc.stdout.splitlines():
        if line.startswith("H-"):
            key, _, text = line.split("\t")
            found[int(key[2:])] = text.split()
    return float(speed.group(1)), found


def main(argv=None):
    a = get_parser().parse_args(argv)
    if device_from_args(a).type != "cpu":
        raise SystemExit("--device cuda: CTranslate2's backends timed here are CPU ones")
    from fairseq.data import Dictionary

    from fairseq_deep import export, serving

    work = os.path.abspath(a.work_dir)
    os.makedirs(work, exist_ok=True)
    checkpoint, data = prepare(a, work)
    ct2 = os.path.join(work, "ct2")
    if not os.path.isdir(ct2):
        export.export(checkpoint, data, ct2)
    summary = json.load(open(os.path.join(ct2, export.SUMMARY)))
    src, tgt = summary["source_lang"], summary["target_lang"]
    pieces = export.test_pieces(data, src, tgt, Dictionary.load(f"{data}/dict.{src}.txt"), 10**9)
    T = a.threads
    results = {"fairseq": {}, "ct2": {}}
    for r in range(a.rounds):
        for name, beam, la, lb, batch, btype, types, layouts in SETTINGS:
            log(f"round {r + 1}: {name}")
            speed, found = generate(checkpoint, data, beam, la, lb, batch, btype, T)
            kept = results["fairseq"].setdefault(name, {"sentences_per_s": [], "hyp": found})
            kept["sentences_per_s"].append(speed)
            record = serving.time_serving(
                ct2,
                pieces,
                threads=T,
                beam=beam,
                max_len_a=la,
                max_len_b=lb,
                batch=batch,
                batch_type=btype,
                rounds=1,
                compute_types=types,
                layouts=[(T if x[0] == "T" else 1, T if x[1] == "T" else 1) for x in layouts],
                keep_hypotheses=True,
            )
            previous = results["ct2"].setdefault(name, record)
            if previous is not record:
                for old, new in zip(previous["settings"], record["settings"]):
                    old["seconds"] += new["seconds"]
                    old["warm_up"] += new["warm_up"]
    rows = []
    table = {}
    for name, *_ in SETTINGS:
        fair = results["fairseq"][name]
        best_fairseq = max(fair["sentences_per_s"])
        fair_hyp = [fair["hyp"].get(k) for k in range(len(pieces))]
        record = results["ct2"][name]
        for row in record["settings"]:
            speed = len(pieces) / min(row["seconds"])
            same = sum(h == f for h, f in zip(row.pop("hypotheses"), fair_hyp))
            warm = max(n / s for n, s in row["warm_up"])  # the first batch's sentences/s
            key = f"{row['backend']} {row['compute_type']} {row['intra_threads']}x{row['inter_threads']}"
            table.setdefault(name, {})[key] = speed / best_fairseq
            rows.append(
                [
                    name,
                    f"{best_fairseq:.1f}",
                    row["backend"],
                    row["compute_type"],
                    f"{row['intra_threads']} x {row['inter_threads']}",
                    f"{speed:.1f}",
                    f"{speed / best_fairseq:.2f}x",
                    f"{warm:.1f}",
                    f"{same}/{len(pieces)}",
                ]
            )
    header = [
        "decoding",
        "fairseq-generate sent/s",
        "backend",
        "compute type",
        "intra x inter threads",
        "CTranslate2 sent/s",
        "vs fairseq-generate",
        "first call sent/s",
        "hypotheses as fairseq's",
    ]
    print(harness.markdown_table(header, rows))
    lengths = {k: v["target_tokens"] / len(pieces) for k, v in results["ct2"].items()}
    print("\ntarget tokens a sentence: " + ", ".join(f"{k} {v:.1f}" for k, v in lengths.items()))
    any_record = results["ct2"]["recipe"]
    out = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="minutes"),
        "cpu": serving.cpu_name(),
        "threads": T,
        "rounds": a.rounds,
        "sentences": len(pieces),
        "checkpoint": checkpoint,
        "backends": any_record["backends"],
        "default_backend": any_record["default_backend"],
        "fairseq_generate_sentences_per_s": {
            k: v["sentences_per_s"] for k, v in results["fairseq"].items()
        },
        "ctranslate2": {k: v["settings"] for k, v in results["ct2"].items()},
        "ratios": table,
        "target_tokens": {k: v["target_tokens"] for k, v in results["ct2"].items()},
        "load_average": os.getloadavg(),
    }
    print(f"\n{harness.write_json(os.path.join(work, 'results.json'), out)}")


if __name__ == "__main__":
    main()
