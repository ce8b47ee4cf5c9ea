"""fairseq's training and decoding options are written in one place, ``fairseq_deep/runs/``
(docs/design.md, "runs/"): the package's other modules, the benchmarks and CI compose a run from
the named settings of ``runs/recipes.py`` (``recipes.budget``, ``saving``, ``decoding``,
``adam``, ``lr``, ...), and a model file declares options as data (a family's ``Recipe`` and
``Tiny.training``: option names -> values), never as command-line words.

What counts: a string literal of Python code (read with :mod:`ast`) that is one of
:data:`FLAGS`, alone (``"--max-tokens"``) or with its value (``"--max-tokens=4096"``).  What does
not: prose (a docstring, a comment, an error message: a string with more than the option in it),
the option a tool declares for itself under the same name (the first arguments of
``add_argument``: quickstart's ``--max-tokens``, the study's ``--beam``), and the few places of
:data:`EXEMPT`, each with its reason: the command lines of the package's own tools that CI writes
(a benchmark's or the study's options, which keep fairseq's names on purpose) and an option named
to a person (which option a checkpoint was found by, an error's subject), not given to fairseq."""

import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: fairseq-train's and fairseq-generate's options that the named settings of runs/recipes.py write
FLAGS = frozenset(
    [
        # optimiser, schedule, learning rate, clipping (adam, inverse_sqrt, noam, paper, lr, fixed,
        # clip_norm, restart)
        "--optimizer",
        "--lr",
        "--lr-scheduler",
        "--warmup-updates",
        "--warmup-init-lr",
        "--adam-betas",
        "--adam-eps",
        "--clip-norm",
        "--weight-decay",
        # criterion (label_smoothed)
        "--criterion",
        "--label-smoothing",
        # budget
        "--max-tokens",
        "--batch-size",
        "--update-freq",
        "--max-update",
        "--max-epoch",
        "--stop-time-hours",
        # saving and validation
        "--save-dir",
        "--no-save",
        "--no-epoch-checkpoints",
        "--no-last-checkpoints",
        "--save-interval-updates",
        "--keep-interval-updates",
        "--keep-last-epochs",
        "--keep-best-checkpoints",
        "--disable-validation",
        "--validate-interval-updates",
        # decoding
        "--beam",
        "--nbest",
        "--lenpen",
        "--min-len",
        "--max-len-a",
        "--max-len-b",
        "--remove-bpe",
        # seed
        "--seed",
    ]
)

#: where the literals are looked for (runs/ writes them)
SCANNED = ("fairseq_deep", "benchmarks", ".ci")
#: (file, the call, function or variable whose strings are exempt): why
EXEMPT = {
    (".ci/gpu/gpu_steps.py", "_bench"): "python -m benchmarks.NAME: the benchmark's own options",
    (".ci/gpu/gpu_study.py", "study_argv"): "python -m fairseq_deep.study: the study's options",
    (".ci/gpu/gpu_study.py", "TINY_ARGS"): "what gpu_session.py adds to a study's command",
    ("fairseq_deep/model_options.py", "restored_checkpoint"): "the option a checkpoint is found by",
    ("fairseq_deep/model_options.py", "check_restore"): "the same, read back",
    ("fairseq_deep/optim/rnmt_lr_scheduler.py", "__init__"): "options named in its error message",
}


def _name(node) -> str:
    """The name of a call's function (``p.add_argument``: ``add_argument``), a function's or an
    assignment's target; '' for anything else."""
    if isinstance(node, ast.Call):
        func = node.func
        return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return node.name
    if isinstance(node, (ast.Assign, ast.AnnAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return next((t.id for t in targets if isinstance(t, ast.Name)), "")
    return ""


def is_flag(value) -> bool:
    return isinstance(value, str) and (
        value in FLAGS or value.split("=", 1)[0] in FLAGS and "=" in value
    )


def flag_literals(source: str, path: str):
    """(line, literal) of each fairseq option in ``source`` (the module at ``path``, relative to
    the repository) outside the exceptions of the module docstring."""
    found = []
    own = {name for file, name in EXEMPT if file == path}

    def visit(node, exempt: bool):
        if isinstance(node, ast.Call) and _name(node) == "add_argument":
            # a tool's own option: its names, not its keywords (help=, default=)
            for keyword in node.keywords:
                visit(keyword, exempt)
            return
        exempt = exempt or (_name(node) in own)
        if isinstance(node, ast.Constant) and is_flag(node.value) and not exempt:
            found.append((node.lineno, node.value))
        for child in ast.iter_child_nodes(node):
            visit(child, exempt)

    visit(ast.parse(source, path), False)
    return found


def python_files():
    for top in SCANNED:
        for folder, dirs, files in os.walk(os.path.join(ROOT, top)):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            rel = os.path.relpath(folder, ROOT).replace(os.sep, "/")
            if rel == "fairseq_deep/runs" or rel.startswith("fairseq_deep/runs/"):
                continue
            for name in sorted(files):
                if name.endswith(".py"):
                    yield f"{rel}/{name}"


def test_no_fairseq_option_is_written_outside_runs():
    """Every run setting outside runs/ by name: a literal option fails, naming file:line."""
    files = list(python_files())
    assert "fairseq_deep/quickstart.py" in files and "benchmarks/depth.py" in files
    assert not any(f.startswith("fairseq_deep/runs/") for f in files)
    found = []
    for path in files:
        with open(os.path.join(ROOT, path), encoding="utf-8") as f:
            found += [f"{path}:{line}: {text!r}" for line, text in flag_literals(f.read(), path)]
    assert not found, (
        "fairseq options written outside fairseq_deep/runs/ (compose the named settings of "
        "runs/recipes.py; a model file declares settings as data):\n" + "\n".join(found)
    )


@pytest.mark.parametrize(
    "source, found",
    [
        ('run = Run.of("train", D, ["--max-tokens", "4096"])', [(1, "--max-tokens")]),
        ('x = {"a": "--optimizer=adam"}', [(1, "--optimizer=adam")]),
        ('if name == "--warmup-updates":\n    pass', [(1, "--warmup-updates")]),
        ('p.add_argument("--max-tokens", type=int, help="as --beam")', []),  # own option, prose
        ('p.add_argument("--n", default="--beam")', [(1, "--beam")]),
        ('"""Docstring: --lr 1 --beam 5."""\nraise UserError("--lr must be > 0")', []),
        ('words = ["--lrx", "--max-tokensx", "lr", "--lr-scheduler-x"]', []),
    ],
)
def test_the_scan_finds_a_planted_literal_and_skips_prose(source, found):
    assert flag_literals(source, "fairseq_deep/planted.py") == found


def test_own_tools_in_ci_are_exempt_only_where_named():
    source = 'def study_argv():\n    return ["--beam", "5"]\nX = ["--beam"]'
    assert flag_literals(source, ".ci/gpu/gpu_study.py") == [(3, "--beam")]
    assert flag_literals(source, ".ci/gpu/other.py") == [(2, "--beam"), (3, "--beam")]
