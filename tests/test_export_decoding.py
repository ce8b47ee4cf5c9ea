"""fairseq-deep-export end to end on a trained tiny model: the stock checkpoint decodes in plain
fairseq-generate (no --user-dir, torch's weights-only loader) as the original model does, and the
CTranslate2 model translates as fairseq-generate does (beam 1 and 4, a length limit relative to the
source) (tests/test_export.py: the fold, the refusals, bad input, the record)."""

import json
import math
import os
import sys

import pytest
from helpers import run_cli
from test_export import layers

from fairseq_deep import export as ex

TRAIN = [
    "--arch",
    "transformer_admin",
    *layers(2, 1),
    "--encoder-embed-dim",
    "32",
    "--decoder-embed-dim",
    "32",
    "--encoder-ffn-embed-dim",
    "64",
    "--decoder-ffn-embed-dim",
    "64",
    "--encoder-attention-heads",
    "2",
    "--decoder-attention-heads",
    "2",
    "--share-all-embeddings",
    "--dropout",
    "0",
    "--optimizer",
    "adam",
    "--lr",
    "0.01",
    "--lr-scheduler",
    "inverse_sqrt",
    "--warmup-updates",
    "20",
    "--max-tokens",
    "1024",
    "--max-update",
    "300",
    "--criterion",
    "cross_entropy",
    "--seed",
    "1",
    "--cpu",
    "--num-workers",
    "0",
    "--no-progress-bar",
    "--log-interval",
    "100",
    "--no-epoch-checkpoints",
    "--disable-validation",
]


def hypotheses(stdout: str):
    """{sentence id: (score in base 2, hypothesis)} of fairseq-generate's H- lines."""
    found = {}
    for line in stdout.splitlines():
        if line.startswith("H-"):
            key, score, text = line.split("\t")
            found[int(key[2:])] = (float(score), text)
    return found


@pytest.fixture(scope="module")
def trained(synthetic_bin, tmp_path_factory):
    """An Admin model (per-dimension omegas: the widest fold) trained for 300 updates (~12 s), its
    fairseq-generate hypotheses at beam 1 and 4, and its export to fairseq's transformer."""
    root = tmp_path_factory.mktemp("export_trained")
    run_cli("fairseq-deep-train", str(synthetic_bin), *TRAIN, "--save-dir", str(root / "ck"))
    checkpoint = root / "ck" / "checkpoint_last.pt"
    generate = ["--gen-subset", "test", "--batch-size", "64", "--cpu"]
    found = {
        beam: hypotheses(
            run_cli(
                "fairseq-deep-generate",
                str(synthetic_bin),
                "--path",
                str(checkpoint),
                "--beam",
                str(beam),
                *generate,
            ).stdout
        )
        for beam in (1, 4)
    }
    ex.export(str(checkpoint), str(synthetic_bin), str(root / "stock"), "fairseq")
    return {
        "checkpoint": checkpoint,
        "hypotheses": found,
        "stock": root / "stock",
        "root": root,
        "generate": generate,
    }


PLAIN_GENERATE = """import sys
from fairseq_cli.generate import cli_main
sys.argv = ["fairseq-generate", *sys.argv[1:]]
cli_main()
assert not [m for m in sys.modules if m.startswith("fairseq_deep")], "fairseq_deep was imported"
"""


def test_plain_fairseq_generate_decodes_the_stock_checkpoint_as_the_original(
    trained, synthetic_bin
):
    """No --user-dir, no fairseq_deep in the process, torch's default weights-only loader."""
    env = {k: v for k, v in os.environ.items() if k != "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"}
    stock_checkpoint = str(trained["stock"] / ex.STOCK_CHECKPOINT)
    proc = run_cli(
        sys.executable,
        "-c",
        PLAIN_GENERATE,
        str(synthetic_bin),
        "--path",
        stock_checkpoint,
        "--beam",
        "4",
        *trained["generate"],
        env={**env, "OMP_NUM_THREADS": "1"},
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    stock, original = hypotheses(proc.stdout), trained["hypotheses"][4]
    assert len(stock) >= 96 and set(stock) <= set(
        original
    )  # plain fairseq may drop a last partial batch
    for key, (score, text) in stock.items():
        assert text == original[key][1], key
        assert abs(score - original[key][0]) < 1e-4, (key, score, original[key][0])


def source_pieces(synthetic_bin):
    """The test split's sources as they stand in the data, without the </s> that fairseq's
    binarizer appended (what CTranslate2 is given)."""
    from fairseq.data import Dictionary

    source = Dictionary.load(str(synthetic_bin / "dict.src.txt"))
    return ex.test_pieces(str(synthetic_bin), "src", "tgt", source, 1000)


def ctranslate2_export(trained, synthetic_bin):
    """The trained model exported to CTranslate2 by the script, as a user runs it (the compute
    types timed on the test split): (folder, the script's process)."""
    out = trained["root"] / "ct2"
    if not out.exists():
        proc = run_cli(
            sys.executable,
            "-m",
            "fairseq_deep.export",
            "--checkpoint",
            str(trained["checkpoint"]),
            "--data",
            str(synthetic_bin),
            "--out",
            str(out),
        )
        assert "CTranslate2 model of transformer_admin" in proc.stdout
        trained["export_stdout"] = proc.stdout
    return out, trained["export_stdout"]


@pytest.mark.parametrize("beam", [1, 4])
def test_ctranslate2_translates_as_fairseq_generate(trained, synthetic_bin, beam):
    ctranslate2 = pytest.importorskip("ctranslate2")
    from fairseq_deep import serving

    out, stdout = ctranslate2_export(trained, synthetic_bin)
    timed = json.loads((out / ex.SUMMARY).read_text())["compute_types"]
    assert "compute types on this CPU" in stdout and f'compute_type="{timed["fastest"]}"' in stdout
    assert list(timed["sentences_per_s"]) == serving.candidates("cpu")  # every type offered here
    assert timed["sentences"] == 32 and timed["same_as_float32"]["float32"] == 32
    pieces = source_pieces(synthetic_bin)
    settings = ex.matching_settings(beam=beam)
    translator = ctranslate2.Translator(str(out), device="cpu", intra_threads=1)
    results = translator.translate_batch(pieces, max_batch_size=64, **settings)
    original = trained["hypotheses"][beam]
    assert len(results) == len(original) == 101
    for key, result in enumerate(results):
        assert (
            " ".join(ex.fairseq_hypothesis(result.hypotheses[0], settings)) == original[key][1]
        ), key
        assert math.isfinite(result.scores[0])


def test_a_length_limit_relative_to_the_source_as_fairseq_generate(trained, synthetic_bin):
    """fairseq-generate --max-len-a 1 --max-len-b 0 in batches of 16 sentences (sorted by source
    length: each batch's limit is its longest source + 1), and CTranslate2 through
    serving.translate in batches of 16: every hypothesis below its batch's limit is fairseq's (89
    of 101), and short batches cut hypotheses where fairseq cut them.  At the limit the engines
    may differ (fairseq ranks a hypothesis cut there with a forced </s>; ties in source length
    put a sentence in another batch): serving.translate's docstring."""
    ctranslate2 = pytest.importorskip("ctranslate2")
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq_cli import generate

    from fairseq_deep import serving

    out, _ = ctranslate2_export(trained, synthetic_bin)
    results = trained["root"] / "gen_len"
    argv = [
        str(synthetic_bin),
        *["--path", str(trained["checkpoint"]), "--gen-subset", "test", "--beam", "3"],
        *["--batch-size", "16", "--required-batch-size-multiple", "1"],
        *["--max-len-a", "1", "--max-len-b", "0", "--cpu"],
        *["--num-workers", "0", "--results-path", str(results)],
    ]
    generate.main(
        convert_namespace_to_omegaconf(
            options.parse_args_and_arch(options.get_generation_parser(), argv)
        )
    )
    found = hypotheses((results / "generate-test.txt").read_text())
    fairseqs = [found[k][1].split() for k in range(101)]
    pieces = source_pieces(synthetic_bin)
    translator = ctranslate2.Translator(str(out), device="cpu", intra_threads=1)
    ours = serving.translate(
        translator, pieces, beam=3, max_len_a=1.0, max_len_b=0, max_batch_size=16
    )
    limits = serving.batch_limits(pieces, 1.0, 0, 16)
    assert len(set(limits)) > 3  # a limit per batch
    below = [k for k in range(101) if max(len(ours[k]), len(fairseqs[k])) < limits[k]]
    cut = [k for k in range(101) if k not in below]
    assert cut and len(below) > 80, (len(cut), len(below))
    assert [ours[k] for k in below] == [fairseqs[k] for k in below]
    assert all(len(ours[k]) <= limits[k] for k in range(101))
    # the limit is the batch's, as fairseq's: hypotheses of the short batches cut where fairseq
    # cut them (a limit for the whole test set would have let them run on)
    assert any(ours[k] == fairseqs[k] and len(ours[k]) == limits[k] < max(limits) for k in cut), [
        (len(ours[k]), len(fairseqs[k]), limits[k]) for k in cut
    ]
