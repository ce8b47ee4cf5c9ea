"""Measurements anyone can rerun on a CPU or a GPU (benchmarks/README.md).

Each script is a module of this package: from the repository root, ``python -m benchmarks.NAME
--help``.  What the scripts share (the options, the device, alternated timing, the markdown table,
JSON output) is :mod:`benchmarks.harness`.  The package is not installed with fairseq_deep
(setup.py ships ``fairseq_deep`` alone): it is run, and the tests import it, from a checkout, with
the repository root first on ``sys.path`` (``python -m`` from the root; ``pytest.ini`` for the
tests): fairscale installs a top-level package also named ``benchmarks``.
"""
