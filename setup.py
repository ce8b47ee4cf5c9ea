"""fairseq_deep: a fairseq plugin for training very deep translation models.

Install CPU torch first (``pip install torch==2.13.0``), then ``pip install -e .`` (or
``pip install .``).  fairseq by Python version (import name ``fairseq`` in each): 3.8-3.10 the
official ``fairseq==0.12.2``; 3.11 and 3.12 the ``ve-fairseq`` wheels (the official release does
not import on 3.11); 3.13 and newer the ``fairseq-fixed`` sdist (ve-fairseq's wheels end at cp312;
it builds in about 4 minutes the first time).  Python 3.7 and older: pip stops at once, naming
``>=3.8``.
"""

import os
import re

from setuptools import find_namespace_packages, setup

HERE = os.path.dirname(os.path.abspath(__file__))


def read_version():
    with open(os.path.join(HERE, "fairseq_deep", "__init__.py"), encoding="utf-8") as f:
        return re.search(r'^__version__ = "([^"]+)"', f.read(), re.M).group(1)


def read_readme():
    path = os.path.join(HERE, "README.md")
    if not os.path.exists(path):
        return __doc__
    with open(path, encoding="utf-8") as f:
        return f.read()


_TRITON = 'triton; platform_system=="Linux" and platform_machine=="x86_64"'

setup(
    name="fairseq_deep",
    version=read_version(),
    description=(
        "A fairseq plugin for training very deep translation models: DLCL, transparent attention, "
        "RNMT+, Deep-Att, layer aggregation"
    ),
    long_description=read_readme(),
    long_description_content_type="text/markdown",
    python_requires=">=3.8",
    # Namespace discovery: every folder under fairseq_deep/ ships, with or without __init__.py.
    packages=find_namespace_packages(
        include=["fairseq_deep", "fairseq_deep.*"], exclude=["*.__pycache__"]
    ),
    package_data={"fairseq_deep": ["**/*.yaml", "**/*.json", "**/*.txt"]},
    install_requires=[
        # fairseq by Python version (README, "Installation"): the official release where it
        # imports, ve-fairseq's wheels (cp311, cp312) after it, fairseq-fixed's sdist after those
        'fairseq==0.12.2; python_version < "3.11"',
        've-fairseq==0.12.3; python_version >= "3.11" and python_version < "3.13"',
        'fairseq-fixed==0.12.3.1; python_version >= "3.13"',
        # Not pinned: install the CPU (or the CUDA) build you want first, e.g. torch==2.13.0.
        "torch>=1.13",
        "sacrebleu>=2",
        "sentencepiece",
    ],
    extras_require={
        # triton: the fused LN-LSTM and Deep-Att kernels are tested on CPU through Triton's interpreter
        # (tests/test_ln_lstm_triton.py, tests/test_ff_lstm_triton.py; a ~285 MB wheel, ~10 s of tests
        # each); unpinned, so that a CUDA build of torch keeps the triton it requires
        "test": [
            "pytest",
            "pytest-xdist",  # -n auto: the suite on every core (README, "Tests")
            "hypothesis",
            "matplotlib",
            "tensorboardX",
            "tensorboard",
            _TRITON,
            "fairscale>=0.4.13",
        ],
        # the linter and formatter (pyproject.toml); pinned: another version may format differently
        "lint": ["ruff==0.17.6"],
        "plot": ["matplotlib"],
        # --rnmt-lstm-impl triton, --deep-att-cell-impl triton (a CUDA GPU; CUDA builds of torch already bring it)
        "triton": [_TRITON],
        # writing events (fairseq's --tensorboard-logdir) and reading them (fairseq-deep-plot-training)
        "tensorboard": ["tensorboardX", "tensorboard"],
        # fairseq's --ddp-backend fully_sharded (FSDP; docs/fully_sharded.md); tested with 0.4.13
        "scale": ["fairscale>=0.4.13"],
        # fairseq-deep-export --format ctranslate2 (CTranslate2's own fairseq converter and engine)
        "export": ["ctranslate2"],
        # the authors' own code that the tests check against (tests/test_reference_*.py skip
        # without it; CI installs it): admin-torch (Admin's closed-form omega), hyper-connections
        # (hyper-connections and mHC; needs einops, torch-einops-utils and torch>=2.5, Python >= 3.9,
        # no other torch where one is installed).  torchscale==0.3.0 (DeepNorm, Sub-LN) belongs here
        # too, but every release pins fairscale==0.4.0 and timm (-> torchvision -> a CUDA torch):
        # install it without them, `pip install --no-deps torchscale==0.3.0` (README, CI)
        "reference": [
            "admin-torch==0.1.0",
            'hyper-connections==0.4.11; python_version >= "3.9"',
        ],
    },
    entry_points={
        "console_scripts": [
            "fairseq-deep-train = fairseq_deep.cli:train",
            "fairseq-deep-generate = fairseq_deep.cli:generate",
            "fairseq-deep-interactive = fairseq_deep.cli:interactive",
            "fairseq-deep-average-checkpoints = fairseq_deep.average_checkpoints:cli_main",
            "fairseq-deep-prepare = fairseq_deep.prepare:cli_main",
            "fairseq-deep-layer-weights = fairseq_deep.diagnostics.layer_weights:cli_main",
            "fairseq-deep-plot-training = fairseq_deep.diagnostics.plot_training:cli_main",
            "fairseq-deep-list-archs = fairseq_deep.list_archs:cli_main",
            "fairseq-deep-study = fairseq_deep.study:cli_main",
            "fairseq-deep-grow = fairseq_deep.grow:cli_main",
            "fairseq-deep-extract = fairseq_deep.extract:cli_main",
            "fairseq-deep-export = fairseq_deep.export:cli_main",
            "fairseq-deep-score = fairseq_deep.score:cli_main",
            "fairseq-deep-distill = fairseq_deep.distill:cli_main",
        ],
    },
    classifiers=[
        "Programming Language :: Python :: 3",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
