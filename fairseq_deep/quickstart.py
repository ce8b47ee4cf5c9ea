"""Quickstart: train and evaluate a small pre-norm DLCL Transformer end to end, on a CPU, in minutes.

    python -m fairseq_deep.quickstart --workdir quickstart_run

1. writes the deterministic synthetic translation corpus of :mod:`fairseq_deep.data.synthetic`;
2. trains a joint sentencepiece model on it and encodes every split;
3. binarizes with ``fairseq-preprocess --joined-dictionary``;
4. trains a small ``transformer_dlcl`` (6 encoder and 2 decoder layers of width 64, pre-norm DLCL,
   2,000 updates of 1,024 tokens) with
   ``fairseq-train --user-dir <fairseq_deep>``;
5. translates the test split with ``fairseq-generate --post-process sentencepiece``, checks that
   every test sentence got exactly one hypothesis, and scores the detokenized hypotheses (in input
   order) against the raw references with sacreBLEU;
6. (unless ``--no-untrained``) does the same for the untrained model, as the floor to compare with.

Every step runs the real console scripts in a subprocess, as a user would.  The same seed gives
the same corpus, the same sentencepiece model, the same training run and the same BLEU.
"""

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import time

from fairseq_deep.errors import ArgumentParser

logger = logging.getLogger("fairseq_deep.quickstart")

PLUGIN_DIR = os.path.dirname(os.path.abspath(__file__))
SPLITS = ("train", "valid", "test")
LANGS = ("src", "tgt")


def model_args(args):
    """The small model: 6-layer pre-norm DLCL encoder, shallow decoder, shared embeddings."""
    return [
        "--arch",
        "transformer_dlcl",
        "--encoder-layers",
        str(args.encoder_layers),
        "--decoder-layers",
        str(args.decoder_layers),
        "--encoder-embed-dim",
        str(args.dim),
        "--decoder-embed-dim",
        str(args.dim),
        "--encoder-ffn-embed-dim",
        str(4 * args.dim),
        "--decoder-ffn-embed-dim",
        str(4 * args.dim),
        "--encoder-attention-heads",
        "4",
        "--decoder-attention-heads",
        "4",
        "--share-all-embeddings",
        "--dropout",
        str(args.dropout),
        "--attention-dropout",
        "0.0",
        "--activation-dropout",
        "0.0",
    ]


def optimization_args(args):
    return [
        "--optimizer",
        "adam",
        "--adam-betas",
        "(0.9, 0.997)",
        "--clip-norm",
        "0.0",
        "--lr",
        str(args.lr),
        "--lr-scheduler",
        "inverse_sqrt",
        "--warmup-init-lr",
        "1e-07",
        "--warmup-updates",
        str(args.warmup),
        "--criterion",
        "label_smoothed_cross_entropy",
        "--label-smoothing",
        "0.1",
        "--max-tokens",
        str(args.max_tokens),
        "--max-update",
        str(args.max_update),
    ]


class TrainingWatch:
    """Reads fairseq-train's output as it comes (``--log-format json``, read by
    :func:`fairseq_deep.runs.parse_record`) and logs a progress line after the first of its
    ``train_inner`` records (every ``--log-interval`` updates) and then at most every ``interval``
    seconds: ``training: update 400/2,000 (20%) | loss 4.31 | elapsed 0:01:10 | ETA 0:04:40``."""

    def __init__(self, max_update: int, interval: float = 30.0, clock=time.monotonic):
        self.max_update, self.interval, self.clock = max_update, interval, clock
        self.start = clock()
        self.last = None

    def __call__(self, line: str):
        from fairseq_deep.runs import parse_record

        record = parse_record(line)
        now = self.clock()
        if record is None or record["kind"] != "train_inner" or "num_updates" not in record:
            return
        if self.last is not None and now - self.last < self.interval:
            return
        self.last = now
        from fairseq_deep.progress import hms

        updates, elapsed = int(record["num_updates"]), now - self.start
        eta = elapsed * (self.max_update - updates) / updates if updates else None
        logger.info(
            "training: update %s/%s (%.0f%%) | loss %s | elapsed %s | ETA %s",
            f"{updates:,}",
            f"{self.max_update:,}",
            100.0 * updates / self.max_update,
            record.get("loss", "-"),
            hms(elapsed),
            hms(eta),
        )


def run(cmd, log_path, env, watch=None):
    """Run a console script, its output to log_path (and each line to ``watch``); fail loudly with
    the log's tail."""
    logger.info("$ %s", " ".join(cmd))
    with open(log_path, "w", encoding="utf-8") as log:
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True
        )
        for line in proc.stdout:
            log.write(line)
            if watch is not None:
                watch(line)
        proc.wait()
    if proc.returncode != 0:
        with open(log_path, encoding="utf-8") as log:
            tail = log.read()[-4000:]
        raise SystemExit(
            f"quickstart: `{cmd[0]}` failed with exit code {proc.returncode} "
            f"(full log: {log_path}):\n{tail}"
        )


def prepare(args, env):
    from fairseq_deep.data.synthetic import write_corpus

    raw = os.path.join(args.workdir, "raw")
    spm_dir = os.path.join(args.workdir, "spm")
    data_bin = os.path.join(args.workdir, "data-bin")
    prefixes = write_corpus(raw, train=args.train, valid=args.valid, test=args.test, seed=args.seed)
    logger.info(
        "synthetic corpus: %d / %d / %d pairs in %s", args.train, args.valid, args.test, raw
    )

    from fairseq_deep.prepare import encode_lines, read_lines, train_sentencepiece

    model_prefix = os.path.join(spm_dir, "spm")
    sp = train_sentencepiece(
        [f"{prefixes['train']}.{lang}" for lang in LANGS], model_prefix, args.vocab_size
    )
    for split in SPLITS:
        for lang in LANGS:
            encode_lines(
                sp,
                read_lines(f"{prefixes[split]}.{lang}"),
                os.path.join(spm_dir, f"{split}.{lang}"),
            )
    logger.info(
        "sentencepiece: joint BPE vocabulary of %d pieces, %s.model", args.vocab_size, model_prefix
    )

    if os.path.exists(data_bin):
        shutil.rmtree(data_bin)
    run(
        [
            "fairseq-preprocess",
            "--source-lang",
            "src",
            "--target-lang",
            "tgt",
            "--trainpref",
            os.path.join(spm_dir, "train"),
            "--validpref",
            os.path.join(spm_dir, "valid"),
            "--testpref",
            os.path.join(spm_dir, "test"),
            "--destdir",
            data_bin,
            "--joined-dictionary",
            "--workers",
            "1",
        ],
        os.path.join(args.workdir, "preprocess.log"),
        env,
    )
    return prefixes, data_bin


def train(args, data_bin, save_dir, env, untrained=False):
    if os.path.exists(save_dir):
        shutil.rmtree(save_dir)
    common = [
        "fairseq-train",
        data_bin,
        "--user-dir",
        PLUGIN_DIR,
        "--task",
        "translation",
        "--source-lang",
        "src",
        "--target-lang",
        "tgt",
        *model_args(args),
        "--seed",
        str(args.seed),
        "--cpu",
        "--num-workers",
        "0",
        "--save-dir",
        save_dir,
        "--no-epoch-checkpoints",
        "--no-progress-bar",
        "--log-interval",
        "50",
        "--log-format",
        "json",
    ]
    if untrained:
        # One update at a learning rate of 1e-12: the parameters of the (seeded) initialisation.
        cmd = [
            *common,
            "--optimizer",
            "adam",
            "--lr",
            "1e-12",
            "--lr-scheduler",
            "fixed",
            "--criterion",
            "label_smoothed_cross_entropy",
            "--label-smoothing",
            "0.1",
            "--max-tokens",
            str(args.max_tokens),
            "--max-update",
            "1",
            "--disable-validation",
        ]
    else:
        cmd = [*common, *optimization_args(args)]
    run(
        cmd,
        os.path.join(save_dir + ".log"),
        env,
        watch=None if untrained else TrainingWatch(args.max_update),
    )
    return os.path.join(save_dir, "checkpoint_last.pt")


def generate(args, data_bin, checkpoint, out_path, env):
    run(
        [
            "fairseq-generate",
            data_bin,
            "--user-dir",
            PLUGIN_DIR,
            "--path",
            checkpoint,
            "--gen-subset",
            "test",
            "--source-lang",
            "src",
            "--target-lang",
            "tgt",
            "--beam",
            str(args.beam),
            "--batch-size",
            "128",
            "--max-len-a",
            "1.5",
            "--max-len-b",
            "10",
            "--post-process",
            "sentencepiece",
            "--cpu",
            "--seed",
            str(args.seed),
        ],
        out_path,
        env,
    )
    from fairseq_deep.runs import hypotheses_by_id

    return hypotheses_by_id(out_path)


def score(hyps, ref_path, n_expected, what):
    import sacrebleu

    with open(ref_path, encoding="utf-8") as f:
        refs = [line.rstrip("\n") for line in f]
    if len(refs) != n_expected or sorted(hyps) != list(range(n_expected)):
        raise SystemExit(
            f"quickstart: {what}: fairseq-generate gave {len(hyps)} hypotheses for {n_expected} test "
            "sentences; every sentence must be translated exactly once"
        )
    ordered = [hyps[i] for i in range(n_expected)]
    return sacrebleu.corpus_bleu(ordered, [refs])


def main(argv=None):
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--workdir",
        default="quickstart_run",
        help="where everything is written (default: %(default)s)",
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--train", type=int, default=20000, help="training pairs")
    p.add_argument("--valid", type=int, default=500)
    p.add_argument("--test", type=int, default=500)
    p.add_argument("--vocab-size", type=int, default=1000, help="joint sentencepiece vocabulary")
    p.add_argument("--encoder-layers", type=int, default=6)
    p.add_argument("--decoder-layers", type=int, default=2)
    p.add_argument("--dim", type=int, default=64, help="embedding dimension (FFN: 4x)")
    p.add_argument(
        "--dropout",
        type=float,
        default=0.0,
        help="the synthetic task is noiseless and 20k pairs are not memorised in 9 epochs",
    )
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=150)
    p.add_argument("--max-tokens", type=int, default=1024)
    p.add_argument("--max-update", type=int, default=2000)
    p.add_argument("--beam", type=int, default=4)
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads per process (default 1: on a small, shared CPU more threads "
        "mostly spin-wait; this model is too small to gain from them)",
    )
    p.add_argument("--no-untrained", action="store_true", help="skip scoring the untrained model")
    p.add_argument(
        "--min-bleu",
        type=float,
        default=None,
        help="exit with an error when the trained model scores below this BLEU",
    )
    args = p.parse_args(argv)
    logging.basicConfig(
        format="%(asctime)s | %(levelname)s | %(name)s | %(message)s",
        datefmt="%Y-%m-%d %H:%M:%S",
        level=logging.INFO,
        stream=sys.stdout,
        force=True,
    )  # importing fairseq (with our package) left a bare handler behind

    os.makedirs(args.workdir, exist_ok=True)
    env = dict(
        os.environ,
        OMP_NUM_THREADS=str(args.threads),
        MKL_NUM_THREADS=str(args.threads),
        PYTHONUNBUFFERED="1",
    )
    t0 = time.time()
    prefixes, data_bin = prepare(args, env)
    t_prep = time.time() - t0
    ref_path = prefixes["test"] + ".tgt"

    results = {}
    if not args.no_untrained:
        logger.info("untrained model (the floor to compare with)")
        ckpt = train(
            args, data_bin, os.path.join(args.workdir, "checkpoints_untrained"), env, untrained=True
        )
        hyps = generate(
            args, data_bin, ckpt, os.path.join(args.workdir, "generate_untrained.out"), env
        )
        bleu = score(hyps, ref_path, args.test, "untrained model")
        results["untrained_bleu"] = round(bleu.score, 2)
        logger.info("untrained model: %s", bleu)

    logger.info("training transformer_dlcl for %d updates", args.max_update)
    t1 = time.time()
    ckpt = train(args, data_bin, os.path.join(args.workdir, "checkpoints"), env)
    t_train = time.time() - t1
    t2 = time.time()
    hyps = generate(args, data_bin, ckpt, os.path.join(args.workdir, "generate_test.out"), env)
    t_gen = time.time() - t2
    bleu = score(hyps, ref_path, args.test, "trained model")
    results.update(
        bleu=round(bleu.score, 2),
        signature=str(bleu),
        test_sentences=args.test,
        seconds_prepare=round(t_prep, 1),
        seconds_train=round(t_train, 1),
        seconds_generate=round(t_gen, 1),
        seconds_total=round(time.time() - t0, 1),
        checkpoint=ckpt,
    )
    with open(os.path.join(args.workdir, "results.json"), "w", encoding="utf-8") as f:
        json.dump(results, f, indent=2)
    logger.info("trained model: %s", bleu)
    logger.info(
        "total time %.0f s (prepare %.0f s, train %.0f s, generate %.0f s); results in %s",
        results["seconds_total"],
        t_prep,
        t_train,
        t_gen,
        os.path.join(args.workdir, "results.json"),
    )
    print(
        f"BLEU {bleu.score:.2f}"
        + (f" (untrained: {results['untrained_bleu']:.2f})" if "untrained_bleu" in results else "")
    )
    if args.min_bleu is not None and bleu.score < args.min_bleu:
        raise SystemExit(f"quickstart: BLEU {bleu.score:.2f} is below --min-bleu {args.min_bleu}")


if __name__ == "__main__":
    main()
