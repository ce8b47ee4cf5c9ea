"""fairseq-deep-prepare: raw parallel text (plain or gzip) -> joint sentencepiece -> binarized data."""

import gzip
import os
import shutil

import sentencepiece as spm

from helpers import run_cli

from fairseq_deep.data.synthetic import write_corpus
from fairseq_deep.prepare import read_lines


def test_prepare_encodes_reversibly_and_binarizes_every_split(tmp_path):
    prefixes = write_corpus(str(tmp_path / "raw"), train=300, valid=20, test=21, seed=3)
    for lang in ("src", "tgt"):  # one split gzipped, as Multi30k ships
        with open(f"{prefixes['train']}.{lang}", "rb") as f, gzip.open(f"{prefixes['train']}.{lang}.gz", "wb") as g:
            shutil.copyfileobj(f, g)
        os.remove(f"{prefixes['train']}.{lang}")
    out = tmp_path / "prepared"
    proc = run_cli("fairseq-deep-prepare", "--source-lang", "src", "--target-lang", "tgt",
                   "--trainpref", prefixes["train"], "--validpref", prefixes["valid"],
                   "--testpref", prefixes["test"], "--destdir", str(out), "--vocab-size", "120")
    assert "--post-process sentencepiece" in proc.stdout and "--bpe sentencepiece" in proc.stdout
    sp = spm.SentencePieceProcessor(model_file=str(out / "spm.model"))
    for split in ("train", "valid", "test"):
        for lang in ("src", "tgt"):
            raw = read_lines(prefixes[split] + f".{lang}" + (".gz" if split == "train" else ""))
            pieces = read_lines(str(out / "spm" / f"{split}.{lang}"))
            assert [sp.decode(p.split(" ")) for p in pieces] == raw
            assert (out / "data-bin" / f"{split}.src-tgt.{lang}.idx").exists()
    src_dict = (out / "data-bin" / "dict.src.txt").read_text()
    assert src_dict == (out / "data-bin" / "dict.tgt.txt").read_text()  # joined dictionary


def test_prepare_names_a_missing_file(tmp_path):
    proc = run_cli("fairseq-deep-prepare", "-s", "de", "-t", "en", "--trainpref", str(tmp_path / "nope"),
                   "--validpref", str(tmp_path / "nope"), "--destdir", str(tmp_path / "out"), check=False)
    assert proc.returncode != 0 and "nope.de" in proc.stderr and "Traceback" not in proc.stderr
