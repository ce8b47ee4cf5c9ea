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

Every step runs fairseq's real programs in a subprocess (``python -m fairseq_cli.train ...``: what
the console scripts run; :func:`fairseq_deep.runs.execute`), and logs each as the console command
a user would type.  The same seed gives the same corpus, the same sentencepiece model, the same
training run and the same BLEU.
"""

import argparse
import json
import logging
import os
import shutil
import sys
import time

import sacrebleu

from fairseq_deep import runs
from fairseq_deep.data.synthetic import write_corpus
from fairseq_deep.errors import ArgumentParser
from fairseq_deep.prepare import encode_lines, read_lines, train_sentencepiece
from fairseq_deep.progress import hms
from fairseq_deep.runs import Part, recipes

logger = logging.getLogger("fairseq_deep.quickstart")

SPLITS = ("train", "valid", "test")
LANGS = ("src", "tgt")


def model_args(args) -> Part:
    """The small model: 6-layer pre-norm DLCL encoder, shallow decoder, shared embeddings."""
    return Part(
        "model",
        [
            "--arch",
            "transformer_dlcl",
            *recipes.layers(args.encoder_layers, args.decoder_layers),
            *recipes.transformer_size(args.dim, 4 * args.dim, 4),
            "--share-all-embeddings",
            *recipes.dropout(args.dropout, "0.0", "0.0"),
        ],
    )


def optimization_args(args):
    """Adam (beta2 0.997, no clipping) with inverse_sqrt warm-up, label smoothing 0.1, the budget."""
    return [
        recipes.adam(args.lr, betas=(0.9, 0.997)),
        recipes.clip_norm("0.0"),
        recipes.inverse_sqrt(args.warmup, recipes.WARMUP_INIT_LR),
        recipes.label_smoothed(0.1),
        recipes.budget(max_tokens=args.max_tokens, max_update=args.max_update),
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
        record = runs.parse_record(line)
        now = self.clock()
        if record is None or record["kind"] != "train_inner" or "num_updates" not in record:
            return
        if self.last is not None and now - self.last < self.interval:
            return
        self.last = now
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


def run(run: runs.Run, log_path, env, watch=None) -> runs.Result:
    """Run a fairseq program, logged as its console command, its output to log_path (and each line
    to ``watch``); fail loudly with the log's tail."""
    console = run.console(ours=False)
    logger.info("$ %s", runs.shell(console))
    result = runs.execute(run, log_path, env=env, watch=watch)
    if not result.ok:
        raise SystemExit(
            f"quickstart: `{console[0]}` failed with exit code {result.returncode} "
            f"(full log: {log_path}):\n{result.tail(4000)}"
        )
    return result


def prepare(args, env):
    raw = os.path.join(args.workdir, "raw")
    spm_dir = os.path.join(args.workdir, "spm")
    data_bin = os.path.join(args.workdir, "data-bin")
    prefixes = write_corpus(raw, train=args.train, valid=args.valid, test=args.test, seed=args.seed)
    logger.info(
        "synthetic corpus: %d / %d / %d pairs in %s", args.train, args.valid, args.test, raw
    )

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
        runs.preprocess(
            "src",
            "tgt",
            data_bin,
            *(os.path.join(spm_dir, split) for split in SPLITS),
        ),
        os.path.join(args.workdir, "preprocess.log"),
        env,
    )
    return prefixes, data_bin


def train_run(args, data_bin, save_dir, untrained=False) -> runs.Run:
    """fairseq-train of the small model (``untrained``: one update at a learning rate of 1e-12,
    which keeps the parameters of the seeded initialisation)."""
    common = runs.Run.of(
        "train",
        data_bin,
        ["--task", "translation", "--source-lang", "src", "--target-lang", "tgt"],
        model_args(args),
        recipes.seed(args.seed),
        recipes.cpu(),
        recipes.saving(save_dir=save_dir, no_epoch_checkpoints=True),
        ["--no-progress-bar"],
        recipes.json_log(50),
    )
    if untrained:  # Adam at fairseq's betas: one update of 1e-12 changes nothing
        return common.plus(
            recipes.adam("1e-12", betas=None),
            recipes.fixed(),
            recipes.label_smoothed(0.1),
            recipes.budget(max_tokens=args.max_tokens, max_update=1),
            recipes.saving(disable_validation=True),
        )
    return common.plus(*optimization_args(args))


def train(args, data_bin, save_dir, env, untrained=False):
    if os.path.exists(save_dir):
        shutil.rmtree(save_dir)
    run(
        train_run(args, data_bin, save_dir, untrained),
        os.path.join(save_dir + ".log"),
        env,
        watch=None if untrained else TrainingWatch(args.max_update),
    )
    return os.path.join(save_dir, "checkpoint_last.pt")


def generate_run(args, data_bin, checkpoint) -> runs.Run:
    """fairseq-generate of the test split, detokenized (``--post-process sentencepiece``)."""
    return runs.Run.of(
        "generate",
        data_bin,
        recipes.decoding(path=checkpoint, gen_subset="test"),
        recipes.languages("src", "tgt"),
        recipes.decoding(beam=args.beam, batch_size=128, max_len_a="1.5", max_len_b=10),
        recipes.post_process("sentencepiece"),
        ["--cpu"],
        recipes.seed(args.seed),
    )


def generate(args, data_bin, checkpoint, out_path, env):
    return run(generate_run(args, data_bin, checkpoint), out_path, env).generated.detok


def score(hyps, ref_path, n_expected, what):
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
