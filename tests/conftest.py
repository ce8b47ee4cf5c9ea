import os
import sys

import pytest

# The console scripts (fairseq-preprocess, fairseq-train, ...) of the Python that runs the tests,
# also when its virtual environment is not activated (CI's second stage runs one by its path).
os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")

import forked  # noqa: E402
import torch  # noqa: E402
from helpers import python_module, run_cli  # noqa: E402

# Tiny models gain nothing from intra-op threads; one thread per process keeps the suite steady
# on a 2-core machine (the CLI tests' subprocesses get OMP_NUM_THREADS=1 from helpers.run_cli).
torch.set_num_threads(1)

from fairseq_deep.data.synthetic import write_corpus  # noqa: E402
from fairseq_deep.runs import executor  # noqa: E402


@pytest.fixture(scope="session")
def synthetic_bin(tmp_path_factory):
    """A word-level binarized synthetic corpus: 2,000 training pairs, valid and test of 101
    (an odd size, so that a dropped partial batch would show)."""
    root = tmp_path_factory.mktemp("synthetic")
    prefixes = write_corpus(str(root / "raw"), train=2000, valid=101, test=101, seed=1)
    run_cli(  # fairseq's module, not its console script: the GPU machine's fairseq has none (gpu_session.py)
        *python_module("fairseq_cli.preprocess"),
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
        str(root / "bin"),
        "--joined-dictionary",
        "--workers",
        "1",
    )
    return root / "bin"


def pytest_configure(config):
    # ``-n N`` (pytest-xdist) without ``--dist``: the workers steal queued tests from each other
    # (``--dist worksteal``) instead of keeping the share dealt at the start ("load"): the suite's
    # tests take from a second to two minutes, and a worker left alone with a queue is CI's tail
    dist_given = any(
        a == "--dist" or a.startswith("--dist=") for a in config.invocation_params.args
    )
    if getattr(config.option, "dist", "no") == "load" and not dist_given:
        config.option.dist = "worksteal"
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU; skipped without one (CI has none)")
    config.addinivalue_line(
        "markers",
        "reference: compares with the authors' code (torchscale, admin-torch: the reference "
        "extra); skipped where a package is missing",
    )
    config.addinivalue_line(
        "markers",
        "real_processes: fairseq_deep.runs.execute starts real processes, not forks (conftest.py)",
    )


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def forked_runs(request, monkeypatch):
    """fairseq's programs that the code under test starts through ``fairseq_deep.runs.execute``
    (the study, prepare, the benchmarks) run in forks of the tests' fork server (tests/forked.py),
    as run_cli's do; a test marked ``real_processes`` (what only a child process shows: its peak
    memory) gets real ones."""
    if request.node.get_closest_marker("real_processes") is None:
        monkeypatch.setattr(executor, "start_process", forked.popen_for_runs)
