"""Every fairseq-deep-* script: a missing required option, a wrong type, a bad choice end in one
line ``<prog>: error: ...`` and exit status 2 (issue 32, item 4), never a traceback nor argparse's
usage of several hundred options.  Table-driven over fairseq-train's and fairseq-generate's
required options and a sample of typed ones; the cases run in one Python process (one import of
fairseq), each through the script's own entry point, as its console script calls it."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

T = [
    "DATA",
    "--arch",
    "transformer_dlcl",
    "--optimizer",
    "adam",
    "--max-tokens",
    "100",
    "--cpu",
]  # a train command
G = ["DATA", "--path", "x.pt", "--cpu"]  # a generate command

# (entry point "module:function", program name, argv, fragments of the one line)
CASES = [
    # fairseq-train: required
    (
        "cli:train",
        "fairseq-deep-train",
        T[1:],
        ["the following arguments are required: data", "fairseq-preprocess"],
    ),
    (
        "cli:train",
        "fairseq-deep-train",
        ["DATA", "--optimizer", "adam"],
        ["--arch ARCH is required"],
    ),
    (
        "cli:train",
        "fairseq-deep-train",
        ["DATA", "--arch", "transformer_dlcl", "--max-tokens", "100"],
        ["--optimizer is required", "--optimizer adam"],
    ),
    (
        "cli:train",
        "fairseq-deep-train",
        ["DATA", "--arch", "transformer_dlcl", "--optimizer", "adam", "--cpu"],
        ["--max-tokens or --batch-size"],
    ),
    (
        "cli:train",
        "fairseq-deep-train",
        [*T, "--model-from", "none.pt"],
        ["--model-from none.pt: no such checkpoint file"],
    ),
    # fairseq-train: typed
    (
        "cli:train",
        "fairseq-deep-train",
        ["DATA", "--arch", "transformer_dlcl", "--optimizer", "adam", "--max-tokens", "abc"],
        ["argument --max-tokens: invalid int value: 'abc'"],
    ),
    (
        "cli:train",
        "fairseq-deep-train",
        [*T, "--lr", "fast"],
        ["argument --lr: invalid value: 'fast'"],
    ),
    (
        "cli:train",
        "fairseq-deep-train",
        [*T, "--max-update", "1.5"],
        ["argument --max-update: invalid int value: '1.5'"],
    ),
    (
        "cli:train",
        "fairseq-deep-train",
        [*T, "--dropout", "high"],
        ["argument --dropout: invalid float value: 'high'"],
    ),
    (
        "cli:train",
        "fairseq-deep-train",
        [*T, "--encoder-layers", "two"],
        ["argument --encoder-layers: invalid int value"],
    ),
    (
        "cli:train",
        "fairseq-deep-train",
        [*T, "--stop-time-hours", "1h"],
        ["argument --stop-time-hours: invalid float value"],
    ),
    (
        "cli:train",
        "fairseq-deep-train",
        [*T, "--adam-betas", "0.9,0.98x"],
        ["--adam-betas 0.9,0.98x: not two numbers", "--adam-betas '(0.9, 0.98)'"],
    ),
    # fairseq-train: choices
    (
        "cli:train",
        "fairseq-deep-train",
        [*T, "--optimizer", "adamx"],
        ["argument --optimizer: invalid choice: 'adamx'", "did you mean adamax, adam"],
    ),
    (
        "cli:train",
        "fairseq-deep-train",
        [*T, "--criterion", "label_smoothed_cross_entropi"],
        ["did you mean label_smoothed_cross_entropy"],
    ),
    (
        "cli:train",
        "fairseq-deep-train",
        [*T, "--lr-scheduler", "inverse_sqr"],
        ["did you mean inverse_sqrt"],
    ),
    (
        "cli:train",
        "fairseq-deep-train",
        [*T, "--dlcl-stacks", "all"],
        [
            "argument --dlcl-stacks: invalid choice: 'all'",
            "(choose from both, encoder, decoder, none)",
        ],
    ),
    ("cli:train", "fairseq-deep-train", [*T, "--activation-fn", "rel"], ["did you mean relu"]),
    ("cli:train", "fairseq-deep-train", [*T, "--task", "translaton"], ["did you mean translation"]),
    # issue 40: what can be checked before fairseq prints or creates anything (the table's cases
    # each end in their one line, nothing before it, nothing created: test_nothing_is_created)
    (
        "cli:train",
        "fairseq-deep-train",
        [*T, "--restore-file", "restore.pt", "--encoder-attention-heads", "4", "--save-dir", "sv"],
        [
            "restore.pt holds a model whose architecture differs from this run's: "
            "--encoder-attention-heads (checkpoint 2, this run 4). Training on would"
        ],
    ),
    (
        "cli:train",
        "fairseq-deep-train",
        [*T, "--save-dir", "resumed", "--encoder-attention-heads", "4"],
        ["resumed/checkpoint_last.pt holds a model whose architecture differs from this run's"],
    ),
    (
        "cli:train",
        "fairseq-deep-train",
        [*T, "--finetune-from-model", "none.pt", "--save-dir", "sv"],
        ["--finetune-from-model none.pt: no such checkpoint file"],
    ),
    (
        "cli:generate",
        "fairseq-deep-generate",
        ["DATA", "--path", "cut.pt", "--cpu"],
        ["cut.pt (104 bytes) is not a complete checkpoint", "truncated"],
    ),
    (
        "cli:generate",
        "fairseq-deep-generate",
        ["DATA", "--path", "restore.pt:none.pt", "--cpu"],
        ["--path none.pt: no such checkpoint file"],
    ),
    (
        "cli:interactive",
        "fairseq-deep-interactive",
        ["DATA", "--path", "cut.pt", "--cpu"],
        ["cut.pt (104 bytes) is not a complete checkpoint"],
    ),
    # fairseq-generate and -interactive
    (
        "cli:generate",
        "fairseq-deep-generate",
        G[1:],
        ["the following arguments are required: data"],
    ),
    ("cli:generate", "fairseq-deep-generate", ["DATA", "--cpu"], ["--path CHECKPOINT is required"]),
    (
        "cli:generate",
        "fairseq-deep-generate",
        [*G, "--beam", "wide"],
        ["argument --beam: invalid int value: 'wide'"],
    ),
    (
        "cli:generate",
        "fairseq-deep-generate",
        [*G, "--batch-size", "x"],
        ["argument --batch-size/--max-sentences: invalid int"],
    ),
    (
        "cli:generate",
        "fairseq-deep-generate",
        [*G, "--lenpen", "x"],
        ["argument --lenpen: invalid float value"],
    ),
    (
        "cli:generate",
        "fairseq-deep-generate",
        [*G, "--scoring", "bleux"],
        ["argument --scoring: invalid choice", "did you mean bleu"],
    ),
    (
        "cli:interactive",
        "fairseq-deep-interactive",
        ["DATA", "--cpu"],
        ["--path CHECKPOINT is required"],
    ),
    (
        "cli:interactive",
        "fairseq-deep-interactive",
        [*G, "--nbest", "x"],
        ["argument --nbest: invalid int value"],
    ),
    # the scripts with parsers of their own
    (
        "grow:cli_main",
        "fairseq-deep-grow",
        ["--out", "o.pt"],
        ["the following arguments are required: --checkpoint"],
    ),
    (
        "grow:cli_main",
        "fairseq-deep-grow",
        ["--checkpoint", "a.pt", "--out", "o.pt", "--encoder-layers", "x"],
        ["argument --encoder-layers: invalid int value"],
    ),
    (
        "grow:cli_main",
        "fairseq-deep-grow",
        ["--checkpoint", "a.pt", "--out", "o.pt", "--method", "double"],
        ["argument --method: invalid choice"],
    ),
    (
        "average_checkpoints:cli_main",
        "fairseq-deep-average-checkpoints",
        ["--output", "a.pt"],
        ["the following arguments are required: --inputs"],
    ),
    (
        "average_checkpoints:cli_main",
        "fairseq-deep-average-checkpoints",
        ["--inputs", "d", "--output", "a.pt", "--num-epoch-checkpoints", "x"],
        ["invalid int value"],
    ),
    (
        "prepare:cli_main",
        "fairseq-deep-prepare",
        ["--source-lang", "de"],
        ["the following arguments are required"],
    ),
    (
        "study:cli_main",
        "fairseq-deep-study",
        ["--out", "o"],
        ["the following arguments are required: --data"],
    ),
    (
        "diagnostics.layer_weights:cli_main",
        "fairseq-deep-layer-weights",
        ["ck.pt"],
        ["required: --out-dir"],
    ),
    (
        "diagnostics.plot_training:cli_main",
        "fairseq-deep-plot-training",
        ["--out-dir", "o"],
        ["required: runs"],
    ),
    ("list_archs:cli_main", "fairseq-deep-list-archs", ["a", "b"], ["unrecognized arguments: b"]),
]

DRIVER = textwrap.dedent("""
    import contextlib, importlib, io, json, logging, sys
    results = []
    for target, prog, argv in json.loads(sys.argv[1]):
        module, function = target.split(":")
        main = getattr(importlib.import_module("fairseq_deep." + module), function)
        sys.argv = [prog, *argv]
        err, out = io.StringIO(), io.StringIO()
        code = 0
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            try:
                main()  # it reads sys.argv, as its console script
            except SystemExit as e:
                code = e.code
            except BaseException as e:  # a traceback: reported as such
                code, err = "traceback", io.StringIO(f"Traceback: {type(e).__name__}: {e}")
        for handler in list(logging.getLogger().handlers):
            logging.getLogger().removeHandler(handler)
        results.append([code, out.getvalue() + err.getvalue()])
    print(json.dumps(results))
""")


#: the files the cases read, made by the fixture (all that the folder holds after the cases)
MADE = ["cut.pt", "restore.pt", "resumed", "resumed/checkpoint_last.pt"]


@pytest.fixture(scope="module")
def cwd(tmp_path_factory):
    """The cases' folder: a truncated checkpoint (a zip archive's start), and the smallest
    checkpoints of a transformer_dlcl with 2 encoder heads (to restore, and a --save-dir's last)."""
    import torch

    cwd = tmp_path_factory.mktemp("cli_options")
    (cwd / "cut.pt").write_bytes(b"PK\x03\x04" + bytes(100))
    options = {
        "_name": "transformer_dlcl",
        "arch": "transformer_dlcl",
        "encoder_attention_heads": 2,
    }
    torch.save({"model": {}, "cfg": {"model": options}}, cwd / "restore.pt")
    (cwd / "resumed").mkdir()
    torch.save({"model": {}, "cfg": {"model": options}}, cwd / "resumed" / "checkpoint_last.pt")
    return cwd


@pytest.fixture(scope="module")
def results(cwd):
    env = {k: v for k, v in os.environ.items() if k != "FAIRSEQ_DEEP_TRACEBACK"}
    proc = subprocess.run(
        [sys.executable, "-c", DRIVER, json.dumps([c[:3] for c in CASES])],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**env, "OMP_NUM_THREADS": "1"},
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "index", range(len(CASES)), ids=[f"{c[1]}:{' '.join(c[2])[-40:]}" for c in CASES]
)
def test_a_mistake_ends_in_one_line_and_exit_status_2(results, index):
    """The one line is the whole output (stdout and stderr): nothing of fairseq's before it."""
    _, prog, argv, fragments = CASES[index]
    code, err = results[index]
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, (code, err[-3000:])
    assert lines[0].startswith(f"{prog}: error: "), lines[0]
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


def test_nothing_is_created(results, cwd):
    """Issue 40: a refusal leaves nothing behind (fairseq-train makes its --save-dir before it
    builds the model and restores a checkpoint: the checks come before)."""
    assert len(results) == len(CASES)
    made = sorted(str(p.relative_to(cwd)) for p in cwd.rglob("*"))
    assert made == sorted(MADE), made
