"""fairseq-deep-export end to end on a trained tiny model: the stock checkpoint decodes in plain
fairseq-generate (no --user-dir, torch's weights-only loader) as the original model does, and the
CTranslate2 model translates as fairseq-generate does (beam 1 and 4, a length limit relative to the
source) (tests/test_export.py: the fold, the refusals, bad input, the record)."""

import argparse
import json
import math
import os
import shutil
import sys

import pytest
from helpers import run_cli
from test_export import layers

from fairseq_deep import export as ex

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(REPO, "examples", "export")

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
    assert "CTranslate2 on this CPU" in stdout and "serve with CT2_USE_MKL=" in stdout
    assert f'compute_type="{timed["fastest"]}"' in stdout
    # every backend in a process of its own, each with every type it offers, on every layout
    assert set(timed["backends"]) == set(serving.BACKENDS)
    assert sum(b["default"] for b in timed["backends"].values()) == 1
    settings_timed = {
        (r["backend"], r["compute_type"], r["intra_threads"], r["inter_threads"])
        for r in timed["settings"]
    }
    assert settings_timed == {
        (b, t, *layout)
        for b, found in timed["backends"].items()
        for t in found["compute_types"]
        for layout in serving.thread_layouts(timed["threads"])
    }
    assert set(serving.candidates("cpu")) <= set(timed["sentences_per_s"])
    # fairseq-generate's decoding defaults, on the whole test split (101 < 128 sentences)
    assert (timed["beam"], timed["max_len_a"], timed["max_len_b"], timed["batch"]) == (
        5,
        0,
        200,
        32,
    )
    assert timed["sentences"] == 101 and timed["same_as_float32"]["float32"] == 101
    best = max(timed["settings"], key=lambda r: r["sentences_per_s"])
    choice = json.loads((out / serving.CHOICE).read_text())
    assert choice["compute_type"] == best["compute_type"] == timed["fastest"]
    assert choice["env"] == dict([best["backend"].split("=")]) and choice["max_batch_size"] == 32
    assert all(len(r["seconds"]) == 2 and len(r["warm_up"]) == 2 for r in timed["settings"])
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


@pytest.mark.parametrize("beam", [1, 4])
def test_every_backend_and_thread_layout_translates_alike(trained, synthetic_bin, beam):
    """CT2_USE_MKL=0 (oneDNN) and =1 (Intel's MKL), each in its own process, on (2, 1) and (1, 2)
    intra x inter threads: float32 gives fairseq-generate's hypotheses, all 101, in each."""
    pytest.importorskip("ctranslate2")
    from fairseq_deep import serving

    out, _ = ctranslate2_export(trained, synthetic_bin)
    pieces = source_pieces(synthetic_bin)
    record = serving.time_serving(
        str(out),
        pieces,
        threads=2,
        beam=beam,
        batch=16,
        rounds=1,
        compute_types=["float32"],
        keep_hypotheses=True,
    )
    rows = record["settings"]
    assert {r["backend"] for r in rows} == set(serving.BACKENDS) and len(rows) == 4
    original = [trained["hypotheses"][beam][k][1] for k in range(101)]
    for row in rows:
        assert [" ".join(h) for h in row["hypotheses"]] == original, serving.setting_name(row)
        assert row["same_as_reference"] == 101
    libraries = record["backends"]
    assert (
        libraries["CT2_USE_MKL=1"]["mkl"] == "true" and libraries["CT2_USE_MKL=0"]["mkl"] == "false"
    )


def test_the_timing_decodes_with_the_length_limit_given(trained, synthetic_bin, tmp_path):
    """The export's timing translates as the user will (issue 46: it decoded up to 200 tokens
    whatever the recipe's limit): --timing-max-len-b 1 lets one token through for each sentence,
    a limit relative to the source each batch's own (serving.batch_limits)."""
    pytest.importorskip("ctranslate2")
    from fairseq_deep import serving

    timing = {"sentences": 20, "threads": 1, "max_len_b": 1}
    summary = ex.export(
        str(trained["checkpoint"]), str(synthetic_bin), str(tmp_path / "o"), timing=timing
    )
    timed = summary["compute_types"]
    assert timed["max_len_b"] == 1 and timed["target_tokens"] == timed["sentences"] == 20
    assert json.loads((tmp_path / "o" / serving.CHOICE).read_text())["timed"]["max_len_b"] == 1
    pieces = source_pieces(synthetic_bin)
    record = serving.time_serving(
        str(tmp_path / "o"),
        pieces,
        threads=1,
        beam=2,
        max_len_a=0.5,
        max_len_b=0,
        batch=8,
        rounds=1,
        compute_types=["float32"],
        backends=[serving.default_backend()],
        keep_hypotheses=True,
    )
    limits = serving.batch_limits(pieces, 0.5, 0, 8)
    (row,) = record["settings"]
    lengths = [len(h) for h in row["hypotheses"]]
    assert all(n <= limit for n, limit in zip(lengths, limits))
    assert any(n == limit < max(limits) for n, limit in zip(lengths, limits))  # cut per batch
    assert record["target_tokens"] == sum(lengths) and (record["max_len_a"], record["batch"]) == (
        0.5,
        8,
    )


CHOICE_BACKEND = """import json, os, sys
sys.argv[1:] = [sys.argv[1], "--fastest", "--beam", "4"]
import translate
assert "ctranslate2" not in sys.modules, "ctranslate2 imported before the choice was read"
translate.main()
"""


@pytest.mark.parametrize("mkl", ["0", "1"])
def test_translate_py_fastest_sets_the_backend_before_ctranslate2_loads(
    trained, synthetic_bin, tmp_path, mkl
):
    """translate.py --fastest reads OUT/serving.json and sets its CT2_USE_MKL before it imports
    ctranslate2 (which reads it once): CTranslate2's own log says which backend ran; the
    translations are fairseq-generate's (beam 4)."""
    pytest.importorskip("ctranslate2")
    from fairseq_deep import serving

    out, _ = ctranslate2_export(trained, synthetic_bin)
    served = tmp_path / "served"
    shutil.copytree(out, served)
    choice = {"env": {"CT2_USE_MKL": mkl}, "compute_type": "float32", "intra_threads": 1}
    (served / serving.CHOICE).write_text(json.dumps({**choice, "inter_threads": 2}))
    pieces = source_pieces(synthetic_bin)[:20]
    env = {k: v for k, v in os.environ.items() if k != "CT2_USE_MKL"}
    proc = run_cli(
        sys.executable,
        "-c",
        CHOICE_BACKEND,
        str(served),
        input="".join(" ".join(p) + "\n" for p in pieces),
        env={**env, "CT2_VERBOSE": "1", "PYTHONPATH": os.pathsep.join([EXAMPLE, REPO])},
        cwd=EXAMPLE,
        fresh=True,  # a new interpreter: nothing imported before translate.py
    )
    assert f"Use Intel MKL: {'true' if mkl == '1' else 'false'}" in proc.stderr, proc.stderr
    assert proc.stdout.splitlines() == [trained["hypotheses"][4][k][1] for k in range(20)]


def test_a_loaded_ctranslate2_cannot_change_its_backend(monkeypatch):
    """apply_environment refuses a choice whose CT2_USE_MKL differs from the one ctranslate2 was
    loaded with (a RuntimeError); the same value passes."""
    pytest.importorskip("ctranslate2")
    from fairseq_deep import serving

    monkeypatch.setenv("CT2_USE_MKL", "0")
    serving.apply_environment({"env": {"CT2_USE_MKL": "0"}})
    with pytest.raises(RuntimeError, match="CT2_USE_MKL=1"):
        serving.apply_environment({"env": {"CT2_USE_MKL": "1"}})


def test_batches_by_tokens():
    """batch_type tokens: sorted by length, each batch's (longest + 1) x sentences within the
    budget, a longer sentence alone; every sentence once."""
    from fairseq_deep import serving

    pieces = [["a"] * n for n in (5, 1, 9, 3, 3, 30, 2)]
    cut = serving.batches(pieces, 12, "tokens")
    assert sorted(i for b in cut for i in b) == list(range(7))
    assert all(len(b) == 1 or (max(len(pieces[i]) for i in b) + 1) * len(b) <= 12 for b in cut)
    assert [i for b in cut for i in b] == sorted(range(7), key=lambda i: len(pieces[i]))
    assert cut[-1] == [5]
    with pytest.raises(ValueError):
        serving.batches(pieces, 12, "sentences")


# -- students of any shape (issue 46 item 4): Kasai et al. 2021's deep encoder, shallow decoder --

STUDENTS = {
    "prenorm 6+6": ["--arch", "transformer_prenorm", *layers(6, 6)],
    "prenorm 12+1": ["--arch", "transformer_prenorm", *layers(12, 1)],
    "dlcl none 8+2": ["--arch", "transformer_dlcl", "--dlcl-stacks", "none", *layers(8, 2)],
    "deepnorm 10+1": ["--arch", "transformer_deepnorm", *layers(10, 1)],
}


def student_flags(shape):
    """TRAIN with the student's architecture and depths, 200 updates."""
    flags = list(TRAIN)
    del flags[flags.index("--arch") : flags.index("--arch") + 6]  # --arch, its layers
    flags[flags.index("--max-update") + 1] = "200"
    return [*STUDENTS[shape], *flags]


@pytest.mark.parametrize("shape", list(STUDENTS))
def test_a_student_of_any_shape_exports_and_translates_as_fairseq_generate(
    shape, synthetic_bin, tmp_path
):
    """--encoder-layers != --decoder-layers, down to a one-layer decoder, in the families that
    export: fairseq-deep-export to CTranslate2 gives fairseq-generate's hypotheses, all 101, at
    beam 1 and 4 (and the stock model's log-probabilities the original's, checked by the export)."""
    ctranslate2 = pytest.importorskip("ctranslate2")
    assert TRAIN[TRAIN.index("--arch") + 2 : TRAIN.index("--arch") + 6] == layers(2, 1)
    run_cli(
        "fairseq-deep-train", str(synthetic_bin), *student_flags(shape), "--save-dir", str(tmp_path)
    )
    checkpoint = tmp_path / "checkpoint_last.pt"
    summary = ex.export(str(checkpoint), str(synthetic_bin), str(tmp_path / "ct2"))
    assert summary["max_logprob_difference"] <= ex.TOLERANCE
    config = json.loads((tmp_path / "ct2" / "config.json").read_text())
    assert config["add_source_eos"] is True
    pieces = source_pieces(synthetic_bin)
    translator = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu", intra_threads=1)
    for beam in (1, 4):
        generated = hypotheses(
            run_cli(
                "fairseq-deep-generate",
                str(synthetic_bin),
                *["--path", str(checkpoint), "--beam", str(beam), "--gen-subset", "test"],
                *["--batch-size", "64", "--cpu"],
            ).stdout
        )
        settings = ex.matching_settings(beam=beam)
        results = translator.translate_batch(pieces, max_batch_size=64, **settings)
        ours = [" ".join(ex.fairseq_hypothesis(r.hypotheses[0], settings)) for r in results]
        assert len(generated) == 101
        assert ours == [generated[k][1] for k in range(101)], (shape, beam)


def test_the_distillation_benchmarks_fastest_row_is_the_fastest_setting_with_its_hypotheses(
    trained, synthetic_bin
):
    """benchmarks/distill.py's ``ctranslate2 fastest`` row: every setting fairseq-deep-export times,
    run on the whole test set with the benchmark's decoding; the fastest kept with its hypotheses
    (scored as its own row), the record written without any."""
    pytest.importorskip("ctranslate2")
    from benchmarks import distill as bench

    out, _ = ctranslate2_export(trained, synthetic_bin)
    pieces = source_pieces(synthetic_bin)
    a = argparse.Namespace(device="cpu", threads=2, beam=4, max_len=200, batch=16)
    best, record = bench.fastest_serving(a, str(out), pieces)
    speeds = [r["sentences_per_s"] for r in record["settings"]]
    assert len(speeds) > 1 and best["sentences_per_s"] == max(speeds)
    assert all("hypotheses" not in r for r in record["settings"])
    assert len(best["hypotheses"]) == len(pieces) == 101
    if best["compute_type"] == "float32":  # int8 may change a hypothesis; float32 does not
        assert [" ".join(h) for h in best["hypotheses"]] == [
            trained["hypotheses"][4][k][1] for k in range(101)
        ]
