"""Every benchmark script takes ``--device cuda|cpu`` from one helper, ``benchmarks/harness.py``:
its default follows ``torch.cuda.is_available()``, a device that cannot run here stops with one
line before any work, and each script's parser accepts ``--device cpu``.  No training: the
scripts are imported and only their argument parsing runs."""

import argparse
import glob
import importlib
import json
import os
import random

import pytest
import torch

import benchmarks
from benchmarks import harness

BENCHMARKS = os.path.dirname(os.path.abspath(benchmarks.__file__))
ROOT = os.path.dirname(BENCHMARKS)

# every script in benchmarks/ (each has get_parser() or parse_args(argv), and main(argv)), and the
# arguments it requires (harness.py is what they share)
SCRIPTS = sorted(
    os.path.basename(f)[:-3]
    for f in glob.glob(os.path.join(BENCHMARKS, "[!_]*.py"))
    if not f.endswith("harness.py")
)
REQUIRED = {
    "precision_matrix": ["--data", "unused"],
    "fsdp_check": ["--data", "unused"],
    "batch_size_decoding": ["--data", "unused", "--out", "unused"],
    "dlcl_init_loss": ["--data", "unused"],
}


def parse(module, argv):
    return (
        module.get_parser().parse_args(argv)
        if hasattr(module, "get_parser")
        else module.parse_args(argv)
    )


def without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_the_scripts_are_found():
    assert {"dlcl_speed", "ta_depth", "rnmt_speed", "precision_matrix"} <= set(SCRIPTS)


@pytest.mark.parametrize("cuda", [False, True], ids=["no-cuda", "cuda"])
def test_default_device_follows_cuda(monkeypatch, cuda):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    expected = "cuda" if cuda else "cpu"
    assert harness.default_device() == expected
    assert harness.add_device_argument(argparse.ArgumentParser()).parse_args([]).device == expected


def test_cuda_without_a_gpu_stops_with_one_line(monkeypatch):
    without_cuda(monkeypatch)
    with pytest.raises(SystemExit) as stop:
        harness.device_from_args(argparse.Namespace(device="cuda"))
    message = str(stop.value.code)
    assert "--device cuda" in message and "--device cpu" in message and "\n" not in message


def test_amp_needs_cuda():
    with pytest.raises(SystemExit, match="--precision amp needs --device cuda"):
        harness.device_from_args(argparse.Namespace(device="cpu", precision="amp"))
    for precision in ("fp32", "fp16", "bf16"):
        assert harness.device_from_args(
            argparse.Namespace(device="cpu", precision=precision)
        ) == torch.device("cpu")


def test_fairseq_flags():
    # CPU: exactly the --cpu the scripts passed before
    assert (
        harness.train_flags("cpu")
        == harness.generate_flags("cpu")
        == harness.parse_flags("cpu")
        == ["--cpu"]
    )
    assert harness.train_flags("cuda", "fp16") == ["--distributed-world-size", "1", "--fp16"]
    assert harness.generate_flags("cuda", "amp") == ["--fp16"]  # fairseq-generate has no --amp
    assert harness.train_flags("cpu", "bf16") == ["--cpu", "--bf16"]
    assert harness.parse_flags("cuda") == []


def test_clock_and_peak_memory_on_cpu():
    t0 = harness.clock("cpu")
    with harness.PeakMemory("cpu") as mem:
        torch.ones(10).sum()
    assert harness.clock("cpu") >= t0 and mem.mib is None


@pytest.mark.parametrize("name", SCRIPTS)
def test_script_takes_device(monkeypatch, name):
    module = importlib.import_module("benchmarks." + name)
    required = REQUIRED.get(name, [])
    args = parse(module, ["--device", "cpu", *required])
    assert args.device == "cpu" and harness.device_from_args(args) == torch.device("cpu")
    assert parse(module, required).device == harness.default_device()
    # --device cuda where torch sees no GPU: a one-line error, before any work
    without_cuda(monkeypatch)
    with pytest.raises(SystemExit) as stop:
        module.main(["--device", "cuda", *required])
    message = str(stop.value.code)
    assert "--device cuda" in message and "--device cpu" in message and "\n" not in message


def test_the_package_is_the_checkouts():
    """``benchmarks`` is this repository's folder (pytest.ini puts the root first: fairscale installs
    a top-level package of the same name)."""
    assert ROOT == os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_no_file_edits_sys_path():
    """The scripts import each other as a package, the tests import them as ``benchmarks.NAME``
    (pytest.ini's pythonpath): no module of the repository edits ``sys.path``."""
    edit = "sys.path." + "insert", "sys.path." + "append"  # not this file's own text
    offenders = []
    for folder in ("benchmarks", "tests", "fairseq_deep", "examples"):
        for path in glob.glob(os.path.join(ROOT, folder, "**", "*.py"), recursive=True):
            with open(path, encoding="utf-8") as f:
                if any(e in f.read() for e in edit):
                    offenders.append(os.path.relpath(path, ROOT))
    assert not offenders


def test_markdown_table():
    table = harness.markdown_table(
        ["system", "BLEU", "tokens/s"], [["a", 1.5, 10], ["b", "2.0", 20]], "lr"
    )
    assert table.splitlines() == [
        "| system | BLEU | tokens/s |",
        "| --- | ---: | --- |",
        "| a | 1.5 | 10 |",
        "| b | 2.0 | 20 |",
    ]


def test_alternated_runs_every_measure_once_a_round():
    calls = []
    results = harness.alternated(
        {name: (lambda r, name=name: calls.append((r, name)) or r) for name in "ABC"}, 2
    )
    assert calls == [(0, "A"), (0, "B"), (0, "C"), (1, "A"), (1, "B"), (1, "C")]
    assert results == {"A": [0, 1], "B": [0, 1], "C": [0, 1]}
    calls.clear()
    harness.alternated(
        {name: (lambda r, name=name: calls.append((r, name))) for name in "ABC"},
        3,
        shuffle=random.Random(0),
    )
    assert [r for r, _ in calls] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert all(sorted(n for r, n in calls if r == i) == ["A", "B", "C"] for i in range(3))


def test_interleaved_seconds_and_json(tmp_path):
    seconds = harness.interleaved_seconds(
        {"a": lambda: None, "b": lambda: sum(range(100))},
        rounds=2,
        repeats=3,
        device="cpu",
        warmup=1,
    )
    assert set(seconds) == {"a", "b"} and all(s >= 0 for s in seconds.values())
    path = harness.write_json(str(tmp_path / "out.json"), {"seconds": seconds})
    with open(path) as f:
        assert json.load(f) == {"seconds": seconds}


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_script_builds_its_parser_with_the_harness(name):
    """One argument-parser builder (``harness.parser``) and the shared options, not a parser a script."""
    with open(os.path.join(BENCHMARKS, name + ".py"), encoding="utf-8") as f:
        source = f.read()
    assert "harness.parser(" in source and "ArgumentParser(" not in source
