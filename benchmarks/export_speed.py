"""fairseq-generate against CTranslate2, in every compute type CTranslate2 offers on the device, on
a deep model exported by fairseq-deep-export (issues 34, 40): sentences/s side by side, and BLEU
of each.

    python -m benchmarks.export_speed --multi30k /work/shared/data/multi30k [--device cpu]
        [--arch transformer_deepnorm --encoder-layers 18 --decoder-layers 6 --embed-dim 512]
        [--minutes 5] [--beam 5 --batch 32 --max-len 60 --threads 2 --repeats 3 --test-sentences 1000]
        [--compute-types int8,float32]

Steps (each kept in ``--work-dir`` and reused when run again with the same options):

1. Multi30K de-en (the raw gzip folder, never copied into the repository) through
   ``fairseq-deep-prepare`` (a joint sentencepiece model of 8k pieces, then fairseq-preprocess);
2. a model trained by ``fairseq-train --user-dir fairseq_deep`` for ``--minutes`` of wall-clock
   time (fairseq's ``--stop-time-hours``; brief on a CPU: the point is the engines' speed);
3. ``fairseq-deep-export`` of its last checkpoint to CTranslate2 (float32 weights), loaded once
   per compute type: ``--compute-types``, by default every type CTranslate2 supports on the device
   here (``ctranslate2.get_supported_compute_types``: ``int8``, ``int8_float32``, ``int16``,
   ``float32`` on a CPU, as its build and the CPU allow; ``float16``, ``int8_float16``,
   ``bfloat16``, ... on a GPU).  Which is fastest depends on the CPU (docs/export.md);
4. the Multi30K test set (test2016, 1,000 sentences) translated by fairseq-generate (the original
   checkpoint with ``--user-dir``, as one serves it without the export) and by CTranslate2 in
   process in each compute type, alternating the engines ``--repeats`` times.  Same beam, batch (sentences
   of the same length range batched together by both), threads (``OMP_NUM_THREADS`` /
   ``intra_threads``) and length limit (fairseq: ``--max-len-a 0 --max-len-b MAX_LEN``; CTranslate2:
   ``max_decoding_length = MAX_LEN + 1`` with ``return_end_token``, fairseq's length penalty,
   docs/export.md).  fairseq's time is its own ``Translated ... in X s`` line (model loading left
   out); CTranslate2's the ``translate_batch`` call (model loading left out).

Reported: sentences/s and its ratio to fairseq-generate, the best round's (the least disturbed,
on a shared machine) and the median's, sacreBLEU of the detokenized hypotheses against the raw
references, and how many hypotheses equal fairseq-generate's; the CPU's model name.
``--device cuda`` runs both engines on the GPU.
A markdown table goes to stdout, every number to ``WORK_DIR/results.json``.
"""

if __name__ == "__main__" and not __package__:  # run as a file, the package's imports would fail
    raise SystemExit(
        "benchmarks/export_speed.py is a module of the benchmarks package: run it from the "
        "repository root as python -m benchmarks.export_speed"
    )

import datetime
import gzip
import json
import os
import platform
import shutil
import statistics
import time

from fairseq_deep import runs
from fairseq_deep.runs import Part, recipes

from . import harness
from .harness import add_device_argument, device_from_args

TEST = "test_2016_flickr"

log = harness.logger("export_speed")


def run(run: runs.Run, log_path: str, threads: int) -> runs.Result:
    return runs.execute(run, log_path, env=harness.thread_env(threads)).check()


def stamped(path: str, stamp: dict) -> bool:
    return os.path.exists(path) and json.load(open(path)) == stamp


def prepare(a, work: str) -> str:
    for split in ("train", "val", TEST):
        for lang in ("de", "en"):
            if not os.path.exists(os.path.join(a.multi30k, f"{split}.{lang}.gz")):
                raise SystemExit(
                    f"--multi30k {a.multi30k}: no {split}.{lang}.gz (the raw Multi30K "
                    "folder, e.g. /work/shared/data/multi30k)"
                )
    dest = os.path.join(work, "prep")
    m = a.multi30k
    run(
        runs.Run.of(
            "prepare",
            None,
            ["-s", "de", "-t", "en", "--trainpref", f"{m}/train", "--validpref", f"{m}/val"],
            ["--testpref", f"{m}/{TEST}", "--destdir", dest, "--vocab-size", "8000"],
            ["--workers", str(a.threads), "--quiet"],
        ),
        os.path.join(work, "prepare.log"),
        a.threads,
    )
    return dest


def test_subset(a, work: str, prep: str) -> str:
    """The first ``--test-sentences`` of the test set, binarized with the data's dictionaries."""
    dest = os.path.join(work, f"test{a.test_sentences}")
    if not os.path.exists(os.path.join(dest, "test.de-en.de.idx")):
        raw = os.path.join(work, f"test{a.test_sentences}_pieces")
        os.makedirs(raw, exist_ok=True)
        for lang in ("de", "en"):
            with open(os.path.join(prep, "spm", f"test.{lang}"), encoding="utf-8") as f:
                lines = f.read().splitlines()[: a.test_sentences]
            with open(os.path.join(raw, f"test.{lang}"), "w", encoding="utf-8") as f:
                f.writelines(line + "\n" for line in lines)
        data = os.path.join(prep, "data-bin")
        run(
            runs.preprocess(
                "de",
                "en",
                dest,
                testpref=os.path.join(raw, "test"),
                srcdict=f"{data}/dict.de.txt",
                tgtdict=f"{data}/dict.en.txt",
            ),
            os.path.join(work, "preprocess_test.log"),
            1,
        )
    return dest


def model_flags(a):
    return [
        "--arch",
        a.arch,
        *recipes.layers(a.encoder_layers, a.decoder_layers),
        *recipes.transformer_size(a.embed_dim, 4 * a.embed_dim, a.heads),
        "--share-all-embeddings",
        *recipes.dropout("0.1"),
    ]


def train(a, work: str, data: str) -> str:
    save = os.path.join(work, "train")
    flags = [
        *model_flags(a),
        *recipes.adam(a.lr),
        *recipes.inverse_sqrt(a.warmup, recipes.WARMUP_INIT_LR),
        *recipes.label_smoothed(0.1),
        *recipes.budget(
            max_tokens=a.max_tokens, stop_time_hours=str(a.minutes / 60), max_update=1000000
        ),
        *recipes.seed(1),
        *recipes.saving(no_epoch_checkpoints=True, disable_validation=True),
        *["--log-interval", "10"],
    ]
    stamp_path = os.path.join(save, "trained.json")
    stamp = {"data": os.path.abspath(data), "flags": flags, "device": a.device}
    checkpoint = os.path.join(save, "checkpoint_last.pt")
    if stamped(stamp_path, stamp) and os.path.exists(checkpoint):
        log(f"reusing {checkpoint}")
        return checkpoint
    shutil.rmtree(save, ignore_errors=True)
    os.makedirs(save)
    log(
        f"training {a.arch} {a.encoder_layers}+{a.decoder_layers}, width {a.embed_dim}, "
        f"for {a.minutes} minutes"
    )
    trained = run(
        runs.Run.of(
            "train",
            data,
            recipes.saving(save_dir=save),
            recipes.device(a.device),
            Part("recipe", flags),
            ["--log-format", "json"],
        ),
        os.path.join(work, "train.log"),
        a.threads,
    )
    updates = [r["num_updates"] for r in trained.records if "num_updates" in r]
    harness.write_json(stamp_path, stamp, indent=None)
    harness.write_json(
        os.path.join(save, "updates.json"),
        {"updates": int(updates[-1]) if updates else None},
        indent=None,
    )
    return checkpoint


def export(a, work: str, data: str, checkpoint: str) -> str:
    """The float32 export (each compute type converts its weights when it loads them)."""
    out = os.path.join(work, "ct2")
    shutil.rmtree(out, ignore_errors=True)
    run(
        runs.Run.of(
            "export",
            None,
            ["--checkpoint", checkpoint, "--data", data, "--out", out],
            ["--no-timing"],
        ),
        os.path.join(work, "export.log"),
        a.threads,
    )
    return out


def detokenize(pieces) -> str:
    """fairseq's ``--post-process sentencepiece``."""
    return "".join(pieces).replace("\u2581", " ").strip()


def fairseq_generate(a, work: str, data: str, checkpoint: str, n: int, *more: Part):
    """fairseq-generate of the first ``n`` test sentences (``more``: further options, e.g. the
    precision): its ``Translated`` line's seconds and the detokenized hypotheses in input order."""
    decoded = run(
        runs.Run.of(
            "generate",
            data,
            recipes.decoding(path=checkpoint, gen_subset="test"),
            recipes.decoding(beam=a.beam, batch_size=a.batch),
            recipes.decoding(max_len_a=0, max_len_b=a.max_len),
            recipes.post_process("sentencepiece"),
            recipes.device(a.device, program="generate"),
            *more,
        ),
        os.path.join(work, "generate.log"),
        a.threads,
    )
    generated = decoded.generated
    found, hyps = generated.translated, generated.detok
    assert found and len(hyps) == n == found.sentences, (len(hyps), n, found)
    return found.seconds, [hyps[k] for k in range(n)]


def ctranslate2_translate(a, model: str, compute_type: str, pieces):
    import ctranslate2

    from fairseq_deep.serving import translate

    translator = ctranslate2.Translator(
        model,
        device=a.device,
        compute_type=compute_type,
        intra_threads=a.threads,
        inter_threads=1,
    )
    start = time.perf_counter()
    tokens = translate(translator, pieces, beam=a.beam, max_len_b=a.max_len, max_batch_size=a.batch)
    seconds = time.perf_counter() - start
    del translator
    return seconds, [detokenize(t) for t in tokens]


def get_parser():
    p = harness.parser(__doc__, full=True)
    p.add_argument(
        "--multi30k", default="/work/shared/data/multi30k", help="the raw Multi30K folder"
    )
    harness.add_work_dir(p, "bench_runs/export_speed")
    p.add_argument("--arch", default="transformer_deepnorm")
    p.add_argument("--encoder-layers", type=int, default=18)
    p.add_argument("--decoder-layers", type=int, default=6)
    p.add_argument("--embed-dim", type=int, default=512, help="width (FFN: 4x)")
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--minutes", type=float, default=5, help="training time")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--max-tokens", type=int, default=4096)
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--batch", type=int, default=32, help="sentences per batch, both engines")
    p.add_argument(
        "--max-len", type=int, default=60, help="at most this many target pieces, both engines"
    )
    p.add_argument(
        "--test-sentences", type=int, default=1000, help="the first N sentences of test2016"
    )
    harness.add_threads(p, 2)
    harness.add_rounds(p, 3, flag="--repeats")
    p.add_argument(
        "--compute-types",
        help="CTranslate2 compute types, comma-separated (default: every one CTranslate2 "
        "supports on the device here)",
    )
    return add_device_argument(p)


def main(argv=None):
    a = get_parser().parse_args(argv)
    device_from_args(a)  # --device cuda without a GPU: one line, before any work
    import sacrebleu

    from fairseq_deep.serving import candidates, cpu_name

    offered = candidates(a.device)
    compute_types = a.compute_types.split(",") if a.compute_types else offered
    unknown = [t for t in compute_types if t not in offered]
    if unknown:
        raise SystemExit(
            f"--compute-types {','.join(unknown)}: CTranslate2 offers {', '.join(offered)} "
            f"on {a.device} here"
        )
    work = a.work_dir
    os.makedirs(work, exist_ok=True)
    prep = prepare(a, work)
    data = os.path.join(prep, "data-bin")
    with open(os.path.join(prep, "spm", "test.de"), encoding="utf-8") as f:
        pieces = [line.split() for line in f.read().splitlines()][: a.test_sentences]
    with gzip.open(os.path.join(a.multi30k, f"{TEST}.en.gz"), "rt", encoding="utf-8") as f:
        references = [line.strip() for line in f][: a.test_sentences]
    test = data if a.test_sentences >= 1000 else test_subset(a, work, prep)
    checkpoint = train(a, work, data)
    model = export(a, work, data, checkpoint)

    engines = ["fairseq-generate", *(f"CTranslate2 {t}" for t in compute_types)]
    hypotheses = {}

    def translate(engine: str):
        def one_round(r: int) -> float:
            if engine == "fairseq-generate":
                t, hyps = fairseq_generate(a, work, test, checkpoint, len(pieces))
            else:
                t, hyps = ctranslate2_translate(a, model, engine.split()[-1], pieces)
            hypotheses.setdefault(engine, hyps)
            log(f"round {r + 1}/{a.repeats}: {engine} {len(pieces) / t:.1f} sentences/s")
            return t

        return one_round

    seconds = harness.alternated({engine: translate(engine) for engine in engines}, a.repeats)

    base = hypotheses["fairseq-generate"]
    rows = []
    for engine in engines:
        rows.append(
            {
                "engine": engine,
                "seconds": seconds[engine],
                "best": len(pieces) / min(seconds[engine]),
                "median": len(pieces) / statistics.median(seconds[engine]),
                "bleu": sacrebleu.corpus_bleu(hypotheses[engine], [references]).score,
                "same_as_fairseq": sum(h == b for h, b in zip(hypotheses[engine], base)),
            }
        )
    for row in rows:
        row["ratio_best"] = row["best"] / rows[0]["best"]
        row["ratio_median"] = row["median"] / rows[0]["median"]
    updates = json.load(open(os.path.join(work, "train", "updates.json")))["updates"]
    results = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "machine": platform.processor() or platform.machine(),
        "cpu": cpu_name(),
        "compute_types_offered": offered,
        "cpus": os.cpu_count(),
        "args": vars(a),
        "updates": updates,
        "rows": rows,
        "sentences": len(pieces),
    }
    harness.write_json(os.path.join(work, "results.json"), results)

    print(
        f"{a.arch} {a.encoder_layers}+{a.decoder_layers} layers, width {a.embed_dim}, "
        f"{updates} updates ({a.minutes} min); Multi30K de-en test2016, {len(pieces)} sentences, "
        f"beam {a.beam}, batch {a.batch}, at most {a.max_len} pieces, {a.threads} threads, "
        f"{a.device} ({cpu_name()}), {a.repeats} alternated rounds: the best (the median)"
    )
    print()
    print(
        harness.markdown_table(
            [
                "engine",
                "sentences/s",
                "vs fairseq-generate",
                "BLEU",
                "hypotheses as fairseq-generate's",
            ],
            [
                [
                    row["engine"],
                    f"{row['best']:.1f} ({row['median']:.1f})",
                    f"{row['ratio_best']:.2f}x ({row['ratio_median']:.2f}x)",
                    f"{row['bleu']:.2f}",
                    f"{row['same_as_fairseq']}/{len(pieces)}",
                ]
                for row in rows
            ],
            "lrrrr",
        )
    )


if __name__ == "__main__":
    main()
