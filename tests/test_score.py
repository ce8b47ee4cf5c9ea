"""fairseq-deep-score (issue 40): fairseq-generate's hypotheses put back in input order by sentence
id equal the input order, pieces decoded as fairseq's --post-process sentencepiece does, the
numbers are sacreBLEU's for the same lists (whichever form the hypotheses come in), and every
mistake is one line with exit status 2."""

import gzip
import json
import random

import pytest
import sacrebleu
from test_cli_errors import assert_in_process_user_error, in_process

from fairseq_deep import runs, score

REFS = [
    "A man in an orange hat starring at something.",
    "A Boston Terrier is running on lush green grass in front of a white fence.",
    "A girl in karate uniform breaking a stick with a front kick.",
    "Five people wearing winter jackets and helmets stand in the snow, with snowmobiles in the background.",
    "People are fixing the roof of a house.",
    "A man in light colored clothing photographs a group of men wearing dark suits and hats.",
    "A group of people standing in front of an igloo.",
]
HYPS = [
    "A man with an orange hat looking at something.",
    "A Boston terrier runs on green grass in front of a white fence.",
    "A girl in a karate uniform breaks a stick with a kick.",
    "Five people in winter jackets and helmets stand in the snow with snowmobiles behind them.",
    "People fix the roof of a house.",
    "A man in light clothes photographs men in dark suits and hats.",
    "",  # an empty hypothesis is a hypothesis
]


def pieces(text: str) -> str:
    """A sentencepiece-like segmentation of ``text``: every word marked, long words split."""
    out = []
    for word in text.split():
        word = "\u2581" + word
        out += [word[:4], word[4:]] if len(word) > 5 else [word]
    return " ".join(p for p in out if p)


def generate_output(hyps, detok=True, order_seed=0, drop=(), loaded=None):
    """fairseq-generate's output for ``hyps``: S/T/H/D lines per sentence, sentences in a
    shuffled order (as its length-sorted batches finish), the H- lines pieces, D- lines the
    detokenized text (``detok``) or the pieces as they are (no --post-process)."""
    ids = [i for i in range(len(hyps)) if i not in drop]
    random.Random(order_seed).shuffle(ids)
    lines = ["2026-11-26 12:00:00 | INFO | fairseq_cli.generate | loading model(s)"]
    if loaded is not None:  # fairseq's translation task says the size of the test set it loaded
        lines.insert(
            0,
            "2026-11-26 12:00:00 | INFO | fairseq.tasks.translation | data-bin test src-tgt "
            f"{loaded} examples",
        )
    for i in ids:
        lines += [
            f"S-{i}\t{pieces('source sentence number ' + str(i))}",
            f"T-{i}\t{REFS[i]}",
            f"H-{i}\t-0.{i + 1}\t{pieces(hyps[i])}",
            f"D-{i}\t-0.{i + 1}\t{hyps[i] if detok else pieces(hyps[i])}",
            f"P-{i}\t-0.1 -0.2",
        ]
    lines += [
        f"2026-11-26 12:00:05 | INFO | fairseq_cli.generate | Translated {len(ids)} sentences "
        "(80 tokens) in 0.5s (14.00 sentences/s, 160.00 tokens/s)",
        "Generate test with beam=5: BLEU4 = 12.34, 50.0/20.0/10.0/5.0 (BP=1.000)",
    ]
    return "\n".join(lines) + "\n"


@pytest.fixture
def files(tmp_path):
    ref = tmp_path / "test.en"
    ref.write_text("\n".join(REFS) + "\n", encoding="utf-8")
    return tmp_path, ref


def run_score(argv, capsys, monkeypatch):
    return in_process(score.cli_main, [str(a) for a in argv], capsys, monkeypatch)


@pytest.mark.parametrize("detok", [True, False], ids=["post-processed", "pieces"])
def test_generate_output_in_input_order_scores_as_sacrebleu(files, detok, capsys, monkeypatch):
    tmp_path, ref = files
    gen = tmp_path / "gen.out"
    gen.write_text(generate_output(HYPS, detok=detok), encoding="utf-8")
    read = score.read_hypotheses(str(gen), len(REFS))
    assert read.lines == HYPS  # by sentence id: the input order; pieces decoded
    assert read.source == "fairseq-generate" and read.pieces_decoded == (not detok)

    status, out, err = run_score(
        [gen, "--ref", ref, "--out", tmp_path / "hyp.txt"], capsys, monkeypatch
    )
    assert status == 0, err
    bleu = sacrebleu.corpus_bleu(HYPS, [REFS])
    chrf = sacrebleu.corpus_chrf(HYPS, [REFS])
    lines = out.splitlines()
    assert lines[1].startswith("BLEU|nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:")
    assert lines[1].endswith(str(bleu).split(" = ", 1)[1])  # sacreBLEU's own figures
    assert lines[2].startswith("chrF2|") and lines[2].endswith(f"= {chrf.score:.2f}")
    assert (tmp_path / "hyp.txt").read_text(encoding="utf-8").splitlines() == HYPS
    assert "put back in input order" in lines[0] and ("pieces decoded" in lines[0]) == (not detok)


def test_a_plain_file_gives_the_same_numbers(files, capsys, monkeypatch):
    """The same hypotheses as fairseq-generate's output, as a plain file of detokenized text, as
    a plain file of pieces (CTranslate2's without --spm) and gzipped references: one score, the
    one runs.score computes."""
    tmp_path, ref = files
    (tmp_path / "gen.out").write_text(generate_output(HYPS, order_seed=3), encoding="utf-8")
    (tmp_path / "plain.txt").write_text("\n".join(HYPS) + "\n", encoding="utf-8")
    (tmp_path / "pieces.txt").write_text("\n".join(map(pieces, HYPS)) + "\n", encoding="utf-8")
    with gzip.open(tmp_path / "test.en.gz", "wt", encoding="utf-8") as f:
        f.write("\n".join(REFS) + "\n")
    found = []
    for hyp, reference in [
        ("gen.out", ref),
        ("plain.txt", ref),
        ("pieces.txt", ref),
        ("plain.txt", tmp_path / "test.en.gz"),
    ]:
        status, out, err = run_score(
            [tmp_path / hyp, "--ref", reference, "--json"], capsys, monkeypatch
        )
        assert status == 0, err
        found.append(json.loads(out))
    expected = runs.score(HYPS, REFS)
    for record in found:
        assert (record["bleu"], record["chrf"]) == (expected["bleu"], expected["chrf"])
        assert record["sentences"] == len(REFS)
    assert [r["source"] for r in found] == ["fairseq-generate", "plain", "plain", "plain"]
    assert [r["pieces_decoded"] for r in found] == [False, False, True, False]


def test_the_first_hypothesis_of_nbest(files):
    tmp_path, _ = files
    text = generate_output(HYPS)
    extra = "".join(f"H-{i}\t-9.0\tother\nD-{i}\t-9.0\tother\n" for i in range(len(HYPS)))
    (tmp_path / "nbest.out").write_text(text + extra, encoding="utf-8")
    assert score.read_hypotheses(str(tmp_path / "nbest.out"), len(REFS)).lines == HYPS


def test_mistakes_end_in_one_line(files, capsys, monkeypatch):
    tmp_path, ref = files
    (tmp_path / "partial.out").write_text(generate_output(HYPS, drop={5, 6}), encoding="utf-8")
    (tmp_path / "all.out").write_text(generate_output(HYPS), encoding="utf-8")
    (tmp_path / "loaded.out").write_text(generate_output(HYPS, loaded=7), encoding="utf-8")
    (tmp_path / "dropped.out").write_text(
        generate_output(HYPS, drop={5, 6}, loaded=7), encoding="utf-8"
    )
    (tmp_path / "nine.en").write_text("\n".join(REFS + REFS[:2]) + "\n", encoding="utf-8")
    (tmp_path / "hole.out").write_text(generate_output(HYPS, drop={2}), encoding="utf-8")
    (tmp_path / "short.txt").write_text("\n".join(HYPS[:-1]) + "\n", encoding="utf-8")
    (tmp_path / "pieces.en").write_text("\n".join(map(pieces, REFS)) + "\n", encoding="utf-8")
    (tmp_path / "six.en").write_text("\n".join(REFS[:6]) + "\n", encoding="utf-8")
    cases = [
        ([tmp_path / "nowhere.out", "--ref", ref], ["HYPOTHESES", "nowhere.out: no such file"]),
        ([tmp_path / "short.txt", "--ref", tmp_path / "none.en"], ["--ref", "no such file"]),
        (
            [tmp_path / "partial.out", "--ref", ref],
            ["translated 5 of the 7 sentences", "missing ids 5, 6", "#5036"],
        ),
        (  # the wrong reference file (issue 46, item 7): the counts, not a dropped batch
            [tmp_path / "loaded.out", "--ref", tmp_path / "nine.en"],
            ["nine.en has 9 lines", "7 hypotheses", "(7)", "reference file does not match"],
        ),
        (
            [tmp_path / "dropped.out", "--ref", ref],
            ["translated 5 of the 7 sentences", "missing ids 5, 6", "#5036"],
        ),
        ([tmp_path / "hole.out", "--ref", ref], ["missing ids 2", "--max-source-positions"]),
        ([tmp_path / "short.txt", "--ref", ref], ["has 6 lines and --ref", "7", "counts differ"]),
        ([tmp_path / "short.txt", "--ref", tmp_path / "pieces.en"], ["sentencepiece pieces"]),
        (
            [tmp_path / "all.out", "--ref", tmp_path / "six.en"],
            ["sentence ids beyond the 6 lines", "another test set"],
        ),
        ([tmp_path / "short.txt"], ["--ref"]),
    ]
    for argv, fragments in cases:
        assert_in_process_user_error(
            run_score(argv, capsys, monkeypatch), "fairseq-deep-score", *fragments
        )
