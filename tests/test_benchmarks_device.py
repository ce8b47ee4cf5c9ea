"""Every benchmark script takes ``--device cuda|cpu`` from one helper, ``benchmarks/_device.py``:
its default follows ``torch.cuda.is_available()``, a device that cannot run here stops with one
line before any work, and each script's parser accepts ``--device cpu``.  No training: the
scripts are imported and only their argument parsing runs."""

import argparse
import glob
import importlib
import os
import sys

import pytest
import torch

BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
sys.path.insert(0, BENCHMARKS)
import _device  # noqa: E402

# every script in benchmarks/ (each has get_parser() or parse_args(argv), and main(argv)), and the
# arguments it requires
# (gpu_session.py runs the others on a GPU machine: it has no --device of its own)
SCRIPTS = sorted(os.path.basename(f)[:-3] for f in glob.glob(os.path.join(BENCHMARKS, "[!_]*.py"))
                 if not f.endswith("gpu_session.py"))
REQUIRED = {"precision_matrix": ["--data", "unused"], "fsdp_check": ["--data", "unused"], "batch_size_decoding": ["--data", "unused", "--out", "unused"],
            "dlcl_init_loss": ["--data", "unused"]}


def parse(module, argv):
    return module.get_parser().parse_args(argv) if hasattr(module, "get_parser") else module.parse_args(argv)


def without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_the_scripts_are_found():
    assert {"dlcl_speed", "ta_depth", "rnmt_speed", "precision_matrix"} <= set(SCRIPTS)


@pytest.mark.parametrize("cuda", [False, True], ids=["no-cuda", "cuda"])
def test_default_device_follows_cuda(monkeypatch, cuda):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    expected = "cuda" if cuda else "cpu"
    assert _device.default_device() == expected
    assert _device.add_device_argument(argparse.ArgumentParser()).parse_args([]).device == expected


def test_cuda_without_a_gpu_stops_with_one_line(monkeypatch):
    without_cuda(monkeypatch)
    with pytest.raises(SystemExit) as stop:
        _device.device_from_args(argparse.Namespace(device="cuda"))
    message = str(stop.value.code)
    assert "--device cuda" in message and "--device cpu" in message and "\n" not in message


def test_amp_needs_cuda():
    with pytest.raises(SystemExit, match="--precision amp needs --device cuda"):
        _device.device_from_args(argparse.Namespace(device="cpu", precision="amp"))
    for precision in ("fp32", "fp16", "bf16"):
        assert _device.device_from_args(argparse.Namespace(device="cpu", precision=precision)) == torch.device("cpu")


def test_fairseq_flags():
    # CPU: exactly the --cpu the scripts passed before
    assert _device.train_flags("cpu") == _device.generate_flags("cpu") == _device.parse_flags("cpu") == ["--cpu"]
    assert _device.train_flags("cuda", "fp16") == ["--distributed-world-size", "1", "--fp16"]
    assert _device.generate_flags("cuda", "amp") == ["--fp16"]  # fairseq-generate has no --amp
    assert _device.train_flags("cpu", "bf16") == ["--cpu", "--bf16"]
    assert _device.parse_flags("cuda") == []


def test_clock_and_peak_memory_on_cpu():
    t0 = _device.clock("cpu")
    with _device.PeakMemory("cpu") as mem:
        torch.ones(10).sum()
    assert _device.clock("cpu") >= t0 and mem.mib is None


@pytest.mark.parametrize("name", SCRIPTS)
def test_script_takes_device(monkeypatch, name):
    module = importlib.import_module(name)
    required = REQUIRED.get(name, [])
    args = parse(module, ["--device", "cpu", *required])
    assert args.device == "cpu" and _device.device_from_args(args) == torch.device("cpu")
    assert parse(module, required).device == _device.default_device()
    # --device cuda where torch sees no GPU: a one-line error, before any work
    without_cuda(monkeypatch)
    with pytest.raises(SystemExit) as stop:
        module.main(["--device", "cuda", *required])
    message = str(stop.value.code)
    assert "--device cuda" in message and "--device cpu" in message and "\n" not in message
