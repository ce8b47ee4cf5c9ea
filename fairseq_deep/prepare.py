"""Raw parallel text to a binarized fairseq data folder, with a joint sentencepiece model.

    fairseq-deep-prepare --source-lang de --target-lang en \\
        --trainpref raw/train --validpref raw/valid --testpref raw/test --destdir prepared \\
        [--vocab-size 8000] [--model-type bpe|unigram] [--workers 2]

Reads ``PREFIX.LANG`` (or ``PREFIX.LANG.gz``) for every split and language, one sentence per line,
raw text (not tokenized); writes

* ``DESTDIR/spm.model`` (and ``.vocab``): one sentencepiece model trained on the training text of
  both languages (a joint vocabulary, so that ``--share-all-embeddings`` works);
* ``DESTDIR/spm/SPLIT.LANG``: every split encoded into pieces;
* ``DESTDIR/data-bin/``: ``fairseq-preprocess --joined-dictionary`` of those, ready for
  ``fairseq-train``;

and prints the commands that train, translate (``--post-process sentencepiece`` for
fairseq-generate, ``--bpe sentencepiece --sentencepiece-model DESTDIR/spm.model`` for
fairseq-interactive and the hub) and score with sacreBLEU.  ``examples/own_data/run.sh`` runs all of
it.  (The sentencepiece Python package installs no ``spm_train`` command: this is that step.)
"""

import argparse
import gzip
import logging
import os
import subprocess
import sys
from typing import Dict, List, Sequence

logger = logging.getLogger("fairseq_deep.prepare")

SPLITS = ("train", "valid", "test")


def open_text(path: str):
    """A text file, gzip or plain, read as UTF-8."""
    return gzip.open(path, "rt", encoding="utf-8") if path.endswith(".gz") else open(path, encoding="utf-8")


def find_file(prefix: str, lang: str) -> str:
    for path in (f"{prefix}.{lang}", f"{prefix}.{lang}.gz"):
        if os.path.exists(path):
            return path
    raise SystemExit(f"fairseq-deep-prepare: no file {prefix}.{lang} (or {prefix}.{lang}.gz)")


def read_lines(path: str) -> List[str]:
    with open_text(path) as f:
        return [line.rstrip("\n") for line in f]


def train_sentencepiece(inputs: Sequence[str], model_prefix: str, vocab_size: int, model_type: str = "bpe",
                        character_coverage: float = 1.0, threads: int = 1):
    """A joint sentencepiece model on ``inputs`` (plain-text files).  fairseq adds its own <s>,
    <pad>, </s> and <unk>, so sentencepiece keeps only <unk> (id 0) of its own specials."""
    import sentencepiece as spm

    os.makedirs(os.path.dirname(os.path.abspath(model_prefix)), exist_ok=True)
    spm.SentencePieceTrainer.train(
        input=",".join(inputs), model_prefix=model_prefix, vocab_size=vocab_size, model_type=model_type,
        character_coverage=character_coverage, num_threads=threads, shuffle_input_sentence=False,
        input_sentence_size=0, minloglevel=2, bos_id=-1, eos_id=-1, unk_id=0, pad_id=-1,
    )
    return spm.SentencePieceProcessor(model_file=model_prefix + ".model")


def encode_lines(sp, lines: Sequence[str], out_path: str):
    with open(out_path, "w", encoding="utf-8") as f:
        f.writelines(" ".join(pieces) + "\n" for pieces in sp.encode(list(lines), out_type=str))


def prepare(prefixes: Dict[str, str], src: str, tgt: str, destdir: str, vocab_size: int,
            model_type: str = "bpe", workers: int = 1, character_coverage: float = 1.0) -> str:
    """Train sentencepiece on the training text, encode every split, binarize; returns data-bin."""
    spm_dir = os.path.join(destdir, "spm")
    os.makedirs(spm_dir, exist_ok=True)
    train_inputs = []
    for lang in (src, tgt):  # sentencepiece reads plain files: decompress the training text once
        path = find_file(prefixes["train"], lang)
        if path.endswith(".gz"):
            plain = os.path.join(spm_dir, f"raw.train.{lang}")
            with open(plain, "w", encoding="utf-8") as f:
                f.writelines(line + "\n" for line in read_lines(path))
            path = plain
        train_inputs.append(path)
    model_prefix = os.path.join(destdir, "spm")
    sp = train_sentencepiece(train_inputs, model_prefix, vocab_size, model_type, character_coverage,
                             threads=workers)
    logger.info("sentencepiece: joint %s vocabulary of %d pieces, %s.model", model_type, vocab_size,
                model_prefix)
    for split, prefix in prefixes.items():
        for lang in (src, tgt):
            lines = read_lines(find_file(prefix, lang))
            encode_lines(sp, lines, os.path.join(spm_dir, f"{split}.{lang}"))
            logger.info("encoded %s.%s: %d lines", split, lang, len(lines))
    data_bin = os.path.join(destdir, "data-bin")
    cmd = [sys.executable, "-m", "fairseq_cli.preprocess", "--source-lang", src, "--target-lang", tgt,
           "--destdir", data_bin, "--joined-dictionary", "--workers", str(workers)]
    for split in prefixes:
        cmd += [f"--{split}pref", os.path.join(spm_dir, split)]
    logger.info("$ %s", " ".join(cmd))
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return data_bin


def next_steps(destdir: str, src: str, tgt: str, test_ref: str) -> str:
    data_bin = os.path.join(destdir, "data-bin")
    spm_model = os.path.join(destdir, "spm.model")
    ref = f"<(zcat {test_ref})" if test_ref.endswith(".gz") else test_ref
    return f"""Next:
  fairseq-deep-train {data_bin} --arch transformer_dlcl --share-all-embeddings \\
      --optimizer adam --adam-betas '(0.9, 0.98)' --lr 1e-3 --lr-scheduler inverse_sqrt --warmup-updates 4000 \\
      --criterion label_smoothed_cross_entropy --label-smoothing 0.1 --max-tokens 4096 --save-dir checkpoints
  fairseq-deep-generate {data_bin} --path checkpoints/checkpoint_best.pt --beam 5 \\
      --post-process sentencepiece > gen.out
  grep ^D- gen.out | sed 's/^D-//' | sort -n | cut -f3 | sacrebleu {ref}
  fairseq-deep-interactive {data_bin} --path checkpoints/checkpoint_best.pt --source-lang {src} \\
      --target-lang {tgt} --bpe sentencepiece --sentencepiece-model {spm_model}
"""


def cli_main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--source-lang", "-s", required=True)
    p.add_argument("--target-lang", "-t", required=True)
    p.add_argument("--trainpref", required=True, help="PREFIX of PREFIX.SRC and PREFIX.TGT (or .gz)")
    p.add_argument("--validpref", required=True)
    p.add_argument("--testpref", help="optional test split")
    p.add_argument("--destdir", required=True)
    p.add_argument("--vocab-size", type=int, default=8000, help="joint vocabulary (default: %(default)s)")
    p.add_argument("--model-type", choices=["bpe", "unigram"], default="bpe")
    p.add_argument("--character-coverage", type=float, default=1.0)
    p.add_argument("--workers", type=int, default=1)
    args = p.parse_args(argv)
    logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", level=logging.INFO,
                        stream=sys.stdout, force=True)
    prefixes = {"train": args.trainpref, "valid": args.validpref}
    if args.testpref:
        prefixes["test"] = args.testpref
    for prefix in prefixes.values():  # every file first, before minutes of work
        for lang in (args.source_lang, args.target_lang):
            find_file(prefix, lang)
    prepare(prefixes, args.source_lang, args.target_lang, args.destdir, args.vocab_size, args.model_type,
            args.workers, args.character_coverage)
    test_ref = find_file(args.testpref, args.target_lang) if args.testpref else "REFERENCE"
    print(next_steps(args.destdir, args.source_lang, args.target_lang, test_ref))


if __name__ == "__main__":
    cli_main()
