"""fairseq-deep-prepare: raw parallel text (plain or gzip) -> joint sentencepiece -> binarized data."""

import gzip
import os
import shutil

import pytest
import sentencepiece as spm
from helpers import run_cli

from fairseq_deep.data.synthetic import write_corpus
from fairseq_deep.errors import UserError
from fairseq_deep.prepare import (
    check_aligned,
    check_inputs,
    get_parser,
    is_prepared,
    read_lines,
    stamp_of,
    write_stamp,
)


def test_prepare_encodes_reversibly_and_binarizes_every_split(tmp_path):
    prefixes = write_corpus(str(tmp_path / "raw"), train=300, valid=20, test=21, seed=3)
    for lang in ("src", "tgt"):  # one split gzipped, as Multi30k ships
        with open(f"{prefixes['train']}.{lang}", "rb") as f, gzip.open(
            f"{prefixes['train']}.{lang}.gz", "wb"
        ) as g:
            shutil.copyfileobj(f, g)
        os.remove(f"{prefixes['train']}.{lang}")
    out = tmp_path / "prepared"
    proc = run_cli(
        "fairseq-deep-prepare",
        "--source-lang",
        "src",
        "--target-lang",
        "tgt",
        "--trainpref",
        prefixes["train"],
        "--validpref",
        prefixes["valid"],
        "--testpref",
        prefixes["test"],
        "--destdir",
        str(out),
        "--vocab-size",
        "120",
    )
    assert (
        "--post-process sentencepiece" in proc.stdout and "--bpe sentencepiece" in proc.stdout
    )  # Next:
    sp = spm.SentencePieceProcessor(model_file=str(out / "spm.model"))
    for split in ("train", "valid", "test"):
        for lang in ("src", "tgt"):
            raw = read_lines(prefixes[split] + f".{lang}" + (".gz" if split == "train" else ""))
            pieces = read_lines(str(out / "spm" / f"{split}.{lang}"))
            assert [sp.decode(p.split(" ")) for p in pieces] == raw
            assert (out / "data-bin" / f"{split}.src-tgt.{lang}.idx").exists()
    src_dict = (out / "data-bin" / "dict.src.txt").read_text()
    assert src_dict == (out / "data-bin" / "dict.tgt.txt").read_text()  # joined dictionary
    # run again on the same files with the same options: nothing is done (its stamp), nothing printed
    model_time = os.stat(out / "spm.model").st_mtime_ns
    again = run_cli(
        "fairseq-deep-prepare",
        "--quiet",
        "--source-lang",
        "src",
        "--target-lang",
        "tgt",
        "--trainpref",
        prefixes["train"],
        "--validpref",
        prefixes["valid"],
        "--testpref",
        prefixes["test"],
        "--destdir",
        str(out),
        "--vocab-size",
        "120",
    )
    assert "nothing to do" in again.stdout and "Next:" not in again.stdout
    assert os.stat(out / "spm.model").st_mtime_ns == model_time


def test_prepare_stamp_changes_with_the_files_and_the_options(tmp_path):
    prefixes = write_corpus(str(tmp_path / "raw"), train=20, valid=5, test=5, seed=3)
    files = check_inputs(prefixes, "src", "tgt")
    options = {"vocab_size": 100, "model_type": "bpe"}
    stamp = stamp_of(files, options)
    assert stamp == stamp_of(files, dict(options))
    assert stamp != stamp_of(files, {**options, "vocab_size": 101})
    with open(files["valid.tgt"], "a", encoding="utf-8") as f:
        f.write("one more line\n")
    assert stamp != stamp_of(files, options)
    # a stamp without its outputs (an interrupted run, a deleted data-bin) is not "prepared"
    (tmp_path / "out").mkdir()
    write_stamp(str(tmp_path / "out"), stamp)
    assert not is_prepared(str(tmp_path / "out"), stamp, prefixes, "src", "tgt")


def test_prepare_refuses_unaligned_splits_before_sentencepiece(tmp_path):
    prefixes = write_corpus(str(tmp_path / "raw"), train=20, valid=5, test=5, seed=3)
    with open(prefixes["valid"] + ".tgt", "a", encoding="utf-8") as f:
        f.write("one more line\n")
    with pytest.raises(UserError, match="has 5 lines and .* 6: the two sides"):
        check_aligned(check_inputs(prefixes, "src", "tgt"), prefixes, "src", "tgt")


def test_prepare_help_is_plain_text_and_explains_every_option():
    parser = get_parser()
    text = parser.format_help()
    assert "``" not in text and ":func:" not in text
    for action in parser._actions:
        assert action.help, action.option_strings


def test_prepare_names_a_missing_file(tmp_path):
    proc = run_cli(
        "fairseq-deep-prepare",
        "-s",
        "de",
        "-t",
        "en",
        "--trainpref",
        str(tmp_path / "nope"),
        "--validpref",
        str(tmp_path / "nope"),
        "--destdir",
        str(tmp_path / "out"),
        check=False,
    )
    assert proc.returncode != 0 and "nope.de" in proc.stderr and "Traceback" not in proc.stderr
