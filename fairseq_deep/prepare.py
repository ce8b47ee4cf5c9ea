"""Raw parallel text to a binarized fairseq data folder, with a joint sentencepiece model.

    fairseq-deep-prepare --source-lang de --target-lang en \\
        --trainpref raw/train --validpref raw/valid --testpref raw/test --destdir prepared \\
        [--vocab-size 8000] [--model-type bpe|unigram] [--workers 2] [--quiet] [--force]

Reads PREFIX.LANG (or PREFIX.LANG.gz) for every split and language, one raw (untokenized) sentence
per line, the two sides of a split line by line aligned; writes

  DESTDIR/spm.model (and .vocab)  one sentencepiece model trained on the training text of both
                                  languages (a joint vocabulary, so that --share-all-embeddings works)
  DESTDIR/spm/SPLIT.LANG          every split encoded into pieces
  DESTDIR/data-bin/               fairseq-preprocess --joined-dictionary of those, for fairseq-train
  DESTDIR/prepare.stamp           what it was made from: a hash of every input file and the options

and prints the commands that train, translate (--post-process sentencepiece for fairseq-generate,
--bpe sentencepiece --sentencepiece-model DESTDIR/spm.model for fairseq-interactive and the hub)
and score with sacreBLEU (not with --quiet).  Run again on the same files with the same options, it
finds its stamp and does nothing (--force prepares again).  examples/own_data/run.sh runs all of
it.  (The sentencepiece Python package installs no spm_train command: this is that step.)
"""

import argparse
import gzip
import hashlib
import json
import logging
import os
import re
import sys
from typing import Dict, List, Sequence

from . import runs
from .errors import ArgumentParser, UserError, report_user_errors
from .runs import Part, recipes

logger = logging.getLogger("fairseq_deep.prepare")

SPLITS = ("train", "valid", "test")
STAMP = "prepare.stamp"
_LANG = re.compile(r"^[A-Za-z0-9_]+$")


def open_text(path: str):
    """A text file, gzip or plain, read as UTF-8."""
    return (
        gzip.open(path, "rt", encoding="utf-8")
        if path.endswith(".gz")
        else open(path, encoding="utf-8")
    )


def find_file(prefix: str, lang: str) -> str:
    for path in (f"{prefix}.{lang}", f"{prefix}.{lang}.gz"):
        if os.path.exists(path):
            return path
    raise UserError(f"no file {prefix}.{lang} (or {prefix}.{lang}.gz)")


def check_languages(src: str, tgt: str):
    """Language suffixes fairseq can name its files with (``train.SRC-TGT.SRC``)."""
    for what, lang in (("source", src), ("target", tgt)):
        if not _LANG.match(lang or ""):
            raise UserError(
                f"{what} language {lang!r}: use a file suffix of letters, digits and _ "
                "(e.g. de, en, cs)"
            )
    if src == tgt:
        raise UserError(f"source and target language are both {src!r}: name two different suffixes")


def check_inputs(prefixes: Dict[str, str], src: str, tgt: str) -> Dict[str, str]:
    """Every ``PREFIX.LANG[.gz]`` exists (a :class:`UserError` naming the first that does not);
    returns ``{"split.lang": path}``."""
    check_languages(src, tgt)
    return {
        f"{split}.{lang}": find_file(prefix, lang)
        for split, prefix in prefixes.items()
        for lang in (src, tgt)
    }


def read_lines(path: str) -> List[str]:
    with open_text(path) as f:
        return [line.rstrip("\n") for line in f]


def file_hash(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def stamp_of(files: Dict[str, str], options: Dict) -> Dict:
    """What a preparation is made from: the sha256 of every input file (as stored, gzip or not)
    and the options that change the output."""
    return {
        "files": {name: file_hash(path) for name, path in sorted(files.items())},
        "options": dict(sorted(options.items())),
    }


def outputs_exist(destdir: str, prefixes: Dict[str, str], src: str, tgt: str) -> bool:
    data_bin = os.path.join(destdir, "data-bin")
    needed = [
        os.path.join(destdir, "spm.model"),
        os.path.join(data_bin, f"dict.{src}.txt"),
        os.path.join(data_bin, f"dict.{tgt}.txt"),
    ]
    needed += [
        os.path.join(data_bin, f"{split}.{src}-{tgt}.{lang}.{ext}")
        for split in prefixes
        for lang in (src, tgt)
        for ext in ("bin", "idx")
    ]
    return all(os.path.exists(p) for p in needed)


def is_prepared(destdir: str, stamp: Dict, prefixes: Dict[str, str], src: str, tgt: str) -> bool:
    """``destdir`` holds a complete preparation of the same inputs with the same options."""
    try:
        with open(os.path.join(destdir, STAMP), encoding="utf-8") as f:
            old = json.load(f)
    except (OSError, ValueError):
        return False
    return old == stamp and outputs_exist(destdir, prefixes, src, tgt)


def write_stamp(destdir: str, stamp: Dict):
    tmp = os.path.join(destdir, STAMP + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(stamp, f, indent=1)
    os.replace(tmp, os.path.join(destdir, STAMP))


def count_lines(path: str) -> int:
    with open_text(path) as f:
        return sum(1 for _ in f)


def check_aligned(
    files: Dict[str, str], prefixes: Dict[str, str], src: str, tgt: str
) -> Dict[str, int]:
    """The two sides of every split have the same number of lines (and the training split some);
    returns the number of sentence pairs of each split."""
    sizes = {}
    for split in prefixes:
        n_src, n_tgt = count_lines(files[f"{split}.{src}"]), count_lines(files[f"{split}.{tgt}"])
        if n_src != n_tgt:
            raise UserError(
                f"{files[f'{split}.{src}']} has {n_src} lines and {files[f'{split}.{tgt}']} "
                f"{n_tgt}: the two sides of a split must be aligned line by line"
            )
        if n_src == 0:
            raise UserError(f"{files[f'{split}.{src}']} is empty")
        sizes[split] = n_src
    return sizes


def train_sentencepiece(
    inputs: Sequence[str],
    model_prefix: str,
    vocab_size: int,
    model_type: str = "bpe",
    character_coverage: float = 1.0,
    threads: int = 1,
):
    """A joint sentencepiece model on ``inputs`` (plain-text files).  fairseq adds its own <s>,
    <pad>, </s> and <unk>, so sentencepiece keeps only <unk> (id 0) of its own specials."""
    import sentencepiece as spm

    os.makedirs(os.path.dirname(os.path.abspath(model_prefix)), exist_ok=True)
    try:
        spm.SentencePieceTrainer.train(
            input=",".join(inputs),
            model_prefix=model_prefix,
            vocab_size=vocab_size,
            model_type=model_type,
            character_coverage=character_coverage,
            num_threads=threads,
            shuffle_input_sentence=False,
            input_sentence_size=0,
            minloglevel=2,
            bos_id=-1,
            eos_id=-1,
            unk_id=0,
            pad_id=-1,
        )
    except (
        RuntimeError
    ) as e:  # e.g. "Vocabulary size too high (8000). Please set it to a value <= 1234."
        if "ocabulary size" in str(e):
            raise UserError(
                f"--vocab-size {vocab_size}: sentencepiece says: {str(e).strip().splitlines()[-1]} "
                "(in run.sh: VOCAB=N)"
            ) from e
        raise
    return spm.SentencePieceProcessor(model_file=model_prefix + ".model")


def encode_lines(sp, lines: Sequence[str], out_path: str):
    with open(out_path, "w", encoding="utf-8") as f:
        f.writelines(" ".join(pieces) + "\n" for pieces in sp.encode(list(lines), out_type=str))


def prepare(
    prefixes: Dict[str, str],
    src: str,
    tgt: str,
    destdir: str,
    vocab_size: int,
    model_type: str = "bpe",
    workers: int = 1,
    character_coverage: float = 1.0,
) -> str:
    """Train sentencepiece on the training text, encode every split, binarize; returns data-bin."""
    files = check_inputs(prefixes, src, tgt)
    sizes = check_aligned(files, prefixes, src, tgt)
    spm_dir = os.path.join(destdir, "spm")
    os.makedirs(spm_dir, exist_ok=True)
    train_inputs = []
    for lang in (src, tgt):  # sentencepiece reads plain files: decompress the training text once
        path = files[f"train.{lang}"]
        if path.endswith(".gz"):
            plain = os.path.join(spm_dir, f"raw.train.{lang}")
            with open(plain, "w", encoding="utf-8") as f:
                f.writelines(line + "\n" for line in read_lines(path))
            path = plain
        train_inputs.append(path)
    model_prefix = os.path.join(destdir, "spm")
    sp = train_sentencepiece(
        train_inputs, model_prefix, vocab_size, model_type, character_coverage, threads=workers
    )
    logger.info(
        "sentencepiece: joint %s vocabulary of %d pieces, %s.model",
        model_type,
        vocab_size,
        model_prefix,
    )
    for split in prefixes:
        for lang in (src, tgt):
            lines = read_lines(files[f"{split}.{lang}"])
            encode_lines(sp, lines, os.path.join(spm_dir, f"{split}.{lang}"))
        logger.info("encoded %s: %d sentence pairs", split, sizes[split])
    data_bin = os.path.join(destdir, "data-bin")
    binarize = runs.preprocess(
        src,
        tgt,
        data_bin,
        *(os.path.join(spm_dir, split) if split in prefixes else None for split in SPLITS),
        workers=workers,
    )
    logger.info("$ %s", binarize.shell())
    env = dict(os.environ, PYTHONWARNINGS=os.environ.get("PYTHONWARNINGS", "ignore"))
    result = runs.execute(binarize, env=env)
    if not result.ok:  # its log only when it fails
        sys.stderr.write(result.output)
        raise RuntimeError(
            f"fairseq-preprocess failed (exit status {result.returncode}): {binarize.shell()}"
        )
    logger.info("binarized every split into %s", data_bin)
    return data_bin


def next_runs(destdir: str, src: str, tgt: str) -> Dict[str, runs.Run]:
    """The runs :func:`next_steps` prints: train a DLCL Transformer with the usual recipe (Adam
    (0.9, 0.98), inverse_sqrt warm-up over 4,000 updates to 1e-3, label smoothing 0.1), translate
    the test set detokenized, translate raw text interactively."""
    data_bin = os.path.join(destdir, "data-bin")
    best = recipes.decoding(path="checkpoints/checkpoint_best.pt")
    return {
        "train": runs.Run.of(
            "train",
            data_bin,
            Part("model", ["--arch", "transformer_dlcl", "--share-all-embeddings"]),
            recipes.adam("1e-3"),
            recipes.inverse_sqrt(4000),
            recipes.label_smoothed(0.1),
            recipes.budget(max_tokens=4096),
            recipes.saving(save_dir="checkpoints"),
        ),
        "generate": runs.Run.of(
            "generate",
            data_bin,
            best,
            recipes.decoding(beam=5),
            recipes.post_process("sentencepiece"),
        ),
        "interactive": runs.Run.of(
            "interactive",
            data_bin,
            best,
            recipes.languages(src, tgt),
            recipes.sentencepiece(os.path.join(destdir, "spm.model")),
        ),
    }


def next_steps(destdir: str, src: str, tgt: str, test_ref: str) -> str:
    ref = f"<(zcat {test_ref})" if test_ref.endswith(".gz") else test_ref
    shown = {
        name: run.shell(width=110, indent="      ")
        for name, run in next_runs(destdir, src, tgt).items()
    }
    return f"""Next:
  {shown["train"]}
  {shown["generate"]} > gen.out
  grep ^D- gen.out | sed 's/^D-//' | sort -n | cut -f3 | sacrebleu {ref}
  {shown["interactive"]}
(or all of it, with a time budget: SRC={src} TGT={tgt} RAW=... bash examples/own_data/run.sh)
"""


def get_parser() -> argparse.ArgumentParser:
    description, epilog = __doc__.split("\n\n", 1)
    p = ArgumentParser(
        prog="fairseq-deep-prepare",
        description=description,
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--source-lang",
        "-s",
        required=True,
        metavar="SRC",
        help="source language: the file suffix, as in PREFIX.SRC (e.g. de)",
    )
    p.add_argument(
        "--target-lang",
        "-t",
        required=True,
        metavar="TGT",
        help="target language: the file suffix, as in PREFIX.TGT (e.g. en)",
    )
    p.add_argument(
        "--trainpref",
        required=True,
        metavar="PREFIX",
        help="training text: PREFIX.SRC and PREFIX.TGT (or .gz); sentencepiece learns from it",
    )
    p.add_argument(
        "--validpref",
        required=True,
        metavar="PREFIX",
        help="validation text (fairseq-train's valid split): PREFIX.SRC and PREFIX.TGT (or .gz)",
    )
    p.add_argument(
        "--testpref",
        metavar="PREFIX",
        help="test text, optional: PREFIX.SRC and PREFIX.TGT (or .gz)",
    )
    p.add_argument(
        "--destdir",
        required=True,
        metavar="DIR",
        help="output folder: spm.model, spm/, data-bin/ and prepare.stamp",
    )
    p.add_argument(
        "--vocab-size",
        type=int,
        default=8000,
        metavar="N",
        help="pieces in the joint sentencepiece vocabulary (default: %(default)s); a small "
        "corpus needs fewer (sentencepiece names the largest it can make)",
    )
    p.add_argument(
        "--model-type",
        choices=["bpe", "unigram"],
        default="bpe",
        help="sentencepiece's segmentation algorithm (default: %(default)s)",
    )
    p.add_argument(
        "--character-coverage",
        type=float,
        default=1.0,
        metavar="F",
        help="share of the characters sentencepiece keeps as pieces (default: %(default)s; "
        "0.9995 is usual for Chinese or Japanese)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        metavar="N",
        help="threads for sentencepiece and processes for fairseq-preprocess (default: %(default)s)",
    )
    p.add_argument(
        "--quiet",
        action="store_true",
        help="log only; do not print the next commands (run.sh passes it)",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="prepare again even when DESTDIR/prepare.stamp says the same files and options "
        "were prepared already",
    )
    return p


def cli_main(argv=None):
    p = get_parser()
    args = p.parse_args(argv)
    logging.basicConfig(
        format="%(asctime)s | %(levelname)s | %(name)s | %(message)s",
        level=logging.INFO,
        stream=sys.stdout,
        force=True,
    )
    report_user_errors(lambda: _main(args), p.prog)


def _main(args):
    src, tgt = args.source_lang, args.target_lang
    prefixes = {"train": args.trainpref, "valid": args.validpref}
    if args.testpref:
        prefixes["test"] = args.testpref
    files = check_inputs(prefixes, src, tgt)  # every file first, before minutes of work
    options = {
        "source_lang": src,
        "target_lang": tgt,
        "splits": sorted(prefixes),
        "vocab_size": args.vocab_size,
        "model_type": args.model_type,
        "character_coverage": args.character_coverage,
    }
    stamp = stamp_of(files, options)
    if not args.force and is_prepared(args.destdir, stamp, prefixes, src, tgt):
        logger.info(
            "%s is prepared from the same files with the same options (%s): nothing to do "
            "(--force prepares again)",
            args.destdir,
            STAMP,
        )
    else:
        try:
            os.remove(os.path.join(args.destdir, STAMP))  # an interrupted run leaves no stamp
        except FileNotFoundError:
            pass
        prepare(
            prefixes,
            src,
            tgt,
            args.destdir,
            args.vocab_size,
            args.model_type,
            args.workers,
            args.character_coverage,
        )
        write_stamp(args.destdir, stamp)
    if not args.quiet:
        test_ref = files[f"test.{tgt}"] if args.testpref else "REFERENCE"
        print(next_steps(args.destdir, src, tgt, test_ref))


if __name__ == "__main__":
    cli_main()
