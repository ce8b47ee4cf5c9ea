"""Shared helpers for the tests: tiny models built through fairseq's own argument parsing."""

import importlib.util
import os
import re
import subprocess
import sys

import forked
import pytest
import torch
from fairseq import options, tasks

import fairseq_deep  # noqa: F401  (registers the architectures)
from benchmarks.harness import (  # noqa: F401  (the tiny models' one home)
    TINY,
    TINY_DEEP_ATT,
    TINY_RNMT,
    random_batch,
    tiny_dictionary,
    tiny_flags,
)
from benchmarks.harness import tiny_model as build_model  # noqa: F401

PLUGIN_DIR = os.path.dirname(os.path.abspath(fairseq_deep.__file__))


def dtype_marker(key: str) -> bool:
    """fairseq 0.12.2's sinusoidal positions keep a buffer ``_float_tensor`` (``torch.FloatTensor(1)``,
    uninitialised memory) that only marks a dtype: its value differs from run to run, and later
    fairseq has none.  State-dict comparisons leave it out."""
    return key.endswith("embed_positions._float_tensor")


def parse_model_args(arch: str, extra=()):
    """fairseq-train's own parser and --arch presets applied to a tiny model's flags (the tiny
    sizes of the arch's family)."""
    parser = options.get_training_parser()
    argv = [
        "dummy-data",
        "--task",
        "translation",
        "--arch",
        arch,
        "--cpu",
        *tiny_flags(arch),
        *extra,
    ]
    return options.parse_args_and_arch(parser, argv)


def assert_incremental_equals_full(model, dictionary, atol=1e-5):
    """Step-by-step decoding (fairseq's incremental state) gives the full forward pass's logits."""
    src, lengths, prev = random_batch(dictionary, pad_last=False)
    with torch.no_grad():
        full = model(src, lengths, prev)[0]
        encoder_out = model.encoder(src, src_lengths=lengths)
        state = {}
        steps = [
            model.decoder(prev[:, : t + 1], encoder_out=encoder_out, incremental_state=state)[0]
            for t in range(prev.size(1))
        ]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=atol, atol=atol)


def assert_same_scores_and_grads(reference, other, batch, atol=1e-5, rtol=1e-4):
    """``other`` gives ``reference``'s scores on ``batch`` (src, lengths, prev) and the same gradient
    of every parameter (of log-softmax summed), e.g. a fused kernel against the loop it replaces."""
    outs, grads = [], []
    for m in (reference, other):
        out = m(*batch)[0]
        out.log_softmax(-1).sum().backward()
        outs.append(out)
        grads.append({n: p.grad for n, p in m.named_parameters()})
    torch.testing.assert_close(outs[1], outs[0], atol=atol, rtol=rtol)
    for name, g in grads[0].items():
        torch.testing.assert_close(grads[1][name], g, atol=atol, rtol=rtol, msg=name)


def build_family(entry, seed=0):
    """The tiny model of one entry of benchmarks/precision_matrix.py's FAMILIES (dropout off) and
    its dictionary."""
    _, arch, tiny, model_flags, _ = entry
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(
        parser,
        [
            "dummy",
            "--task",
            "translation",
            "--arch",
            arch,
            "--cpu",
            *tiny,
            *model_flags,
            "--dropout",
            "0",
        ],
    )
    d = tiny_dictionary()
    task = tasks.translation.TranslationTask(args, d, d)
    torch.manual_seed(seed)
    return task.build_model(args), d


def run_cli(*argv, cwd=None, check=True, env=None, input=None, timeout=None, fresh=False):
    """Run a command-line program (fairseq-train, fairseq-generate, python -m ..., ...) the way a
    user would, its output captured (a ``subprocess.CompletedProcess``, text).  fairseq's programs
    and the package's console scripts run in a fork of a process that has imported torch and
    fairseq already (tests/forked.py: the same program, its own process, 5-10 s of imports
    saved); ``fresh=True`` starts a new interpreter, for what only a new process shows (the output
    of the imports, start-up, the console script as installed)."""
    # one intra-op thread per process: tiny models gain nothing from more, and parallel test
    # workers or a loaded machine make torch's thread pool thrash
    env = dict(os.environ if env is None else env, PYTHONUNBUFFERED="1")
    env.setdefault("OMP_NUM_THREADS", "1")
    if fresh:
        proc = subprocess.run(
            [*argv], cwd=cwd, env=env, input=input, timeout=timeout, capture_output=True, text=True
        )
    else:
        proc = forked.run(argv, cwd=cwd, env=env, input=input, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(map(str, argv))} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
        )
    return proc


def python_module(module: str):
    return [sys.executable, "-m", module]


# ---- Triton kernels on CPU: the interpreter (tests/test_ln_lstm_triton.py, tests/test_ff_lstm_triton.py)
# Triton switches its interpreter on only when TRITON_INTERPRET=1 is set before it is imported, so
# a test file's interpreter checks (@interpreted) run in a pytest subprocess with the variable set,
# started by the file's own test_interpreter_checks_in_a_subprocess; the main process never sets it,
# and its gpu tests compile for CUDA.

HAVE_TRITON = importlib.util.find_spec("triton") is not None
INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"

needs_triton = pytest.mark.skipif(not HAVE_TRITON, reason="triton is not installed")
interpreted = pytest.mark.skipif(
    not (HAVE_TRITON and INTERPRETING),
    reason="triton is not installed"
    if not HAVE_TRITON
    else "runs in the TRITON_INTERPRET=1 subprocess of test_interpreter_checks_in_a_subprocess",
)
not_interpreted = pytest.mark.skipif(
    INTERPRETING, reason="for the process without TRITON_INTERPRET"
)


def run_interpreted_tests(test_file: str):
    """Every @interpreted test of ``test_file``, in a pytest subprocess with TRITON_INTERPRET=1:
    it must pass, and none may be skipped there."""
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-rs",
            "-p",
            "no:cacheprovider",
            "-m",
            "not gpu",
            os.path.abspath(test_file),
        ],
        cwd=os.path.dirname(here),
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    report = run.stdout[-6000:] + run.stderr[-3000:]
    assert run.returncode == 0, report
    assert re.search(r"\d+ passed", run.stdout), report
    assert "runs in the TRITON_INTERPRET=1 subprocess" not in run.stdout, (
        report
    )  # none skipped there
