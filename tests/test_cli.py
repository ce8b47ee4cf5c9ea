"""End to end through the real command-line tools, the way a user runs them.

One tiny transformer_dlcl is trained once with ``fairseq-train --user-dir`` (from a directory that
is not the repository), then translated with ``fairseq-generate``, ``fairseq-interactive``, our
``fairseq-deep-*`` console scripts and the hub interface, which must all agree; checkpoint averaging
must give a checkpoint that generates; a non-editable ``pip install`` must work as well.
"""

import os
import re
import shutil
import subprocess
import sys
import warnings

import pytest
import torch
from helpers import PLUGIN_DIR, run_cli

REPO_ROOT = os.path.dirname(PLUGIN_DIR)
N_TEST = 101  # the test split of the synthetic_bin fixture

TINY_DLCL = [
    "--arch",
    "transformer_dlcl",
    "--encoder-layers",
    "3",
    "--decoder-layers",
    "2",
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
    "--attention-dropout",
    "0",
    "--activation-dropout",
    "0",
]

GEN = [
    "--gen-subset",
    "test",
    "--beam",
    "1",
    "--batch-size",
    "16",
    "--cpu",
    "--max-len-a",
    "1.5",
    "--max-len-b",
    "5",
]


def train_args(data, save_dir, extra=()):
    return [
        str(data),
        *TINY_DLCL,
        "--task",
        "translation",
        "--source-lang",
        "src",
        "--target-lang",
        "tgt",
        "--optimizer",
        "adam",
        "--lr",
        "0.005",
        "--lr-scheduler",
        "inverse_sqrt",
        "--warmup-updates",
        "5",
        "--criterion",
        "label_smoothed_cross_entropy",
        "--label-smoothing",
        "0.1",
        "--max-tokens",
        "3000",
        "--max-epoch",
        "2",
        "--seed",
        "1",
        "--cpu",
        "--num-workers",
        "0",
        "--save-dir",
        str(save_dir),
        "--no-progress-bar",
        "--log-format",
        "simple",
        *extra,
    ]


def hypotheses(stdout: str):
    """{id: hypothesis} from the H- lines of fairseq-generate / fairseq-interactive."""
    out = {}
    for line in stdout.splitlines():
        m = re.match(r"H-(\d+)\t[^\t]*\t?(.*)$", line)
        if m:
            assert int(m.group(1)) not in out, f"two hypotheses for sentence {m.group(1)}"
            out[int(m.group(1))] = m.group(2)
    return out


def sources(stdout: str):
    return {
        int(m.group(1)): m.group(2)
        for m in (re.match(r"S-(\d+)\t(.*)$", line) for line in stdout.splitlines())
        if m
    }


@pytest.fixture(scope="module")
def trained(synthetic_bin, tmp_path_factory):
    """A tiny transformer_dlcl, trained for two epochs by fairseq-train run in a scratch directory."""
    workdir = tmp_path_factory.mktemp("cli_train")
    save_dir = workdir / "checkpoints"
    run_cli(
        "fairseq-train",
        *train_args(synthetic_bin, save_dir, ["--user-dir", PLUGIN_DIR]),
        cwd=workdir,
    )
    return save_dir


@pytest.fixture(scope="module")
def generated(trained, synthetic_bin, tmp_path_factory):
    """fairseq-generate --user-dir on the 101-sentence test split, beam 1."""
    cwd = tmp_path_factory.mktemp("cli_generate")
    proc = run_cli(
        "fairseq-generate",
        str(synthetic_bin),
        "--user-dir",
        PLUGIN_DIR,
        "--path",
        str(trained / "checkpoint_last.pt"),
        *GEN,
        cwd=cwd,
    )
    return proc.stdout


def test_train_writes_epoch_checkpoints(trained):
    for name in ("checkpoint1.pt", "checkpoint2.pt", "checkpoint_best.pt", "checkpoint_last.pt"):
        assert (trained / name).is_file(), name


def test_generate_translates_every_test_sentence(generated):
    hyps = hypotheses(generated)
    assert sorted(hyps) == list(range(N_TEST))  # the odd last batch is not dropped
    assert any(h.strip() for h in hyps.values())


def test_console_script_needs_no_user_dir(trained, synthetic_bin, generated, tmp_path):
    """The console script as installed, in a new interpreter (the suite's end-to-end check of the
    fairseq-deep-* scripts; stage 3 of CI runs it on the newest Python)."""
    proc = run_cli(
        "fairseq-deep-generate",
        str(synthetic_bin),
        "--path",
        str(trained / "checkpoint_last.pt"),
        *GEN,
        cwd=tmp_path,
        fresh=True,
    )
    assert hypotheses(proc.stdout) == hypotheses(generated)
    # fairseq's whole configuration is logged at DEBUG only (issue 46, item 7), as in -train
    log = proc.stdout + proc.stderr
    assert "| fairseq_cli.generate | loading model(s) from " in log
    assert "{'_name': None, 'common': {" not in log


def test_plain_generate_without_user_dir_fails(trained, synthetic_bin, tmp_path):
    """The documented failure: fairseq alone knows neither our model nor our checkpoint types."""
    proc = run_cli(
        "fairseq-generate",
        str(synthetic_bin),
        "--path",
        str(trained / "checkpoint_last.pt"),
        *GEN,
        cwd=tmp_path,
        check=False,
    )
    assert proc.returncode != 0


@pytest.mark.parametrize("script", ["fairseq-interactive", "fairseq-deep-interactive"])
def test_interactive_agrees_with_generate(script, trained, synthetic_bin, generated, tmp_path):
    src, hyp = sources(generated), hypotheses(generated)
    ids = [0, 1, 2]
    extra = [] if script == "fairseq-deep-interactive" else ["--user-dir", PLUGIN_DIR]
    proc = run_cli(
        script,
        str(synthetic_bin),
        *extra,
        "--path",
        str(trained / "checkpoint_last.pt"),
        "--source-lang",
        "src",
        "--target-lang",
        "tgt",
        "--beam",
        "1",
        "--cpu",
        "--max-len-a",
        "1.5",
        "--max-len-b",
        "5",
        input="".join(src[i] + "\n" for i in ids),
        cwd=tmp_path,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = hypotheses(proc.stdout)
    assert [got[k] for k in range(len(ids))] == [hyp[i] for i in ids]


def test_hub_interface_reloads_and_agrees_with_generate(trained, synthetic_bin, generated):
    from fairseq_deep.models.transformer_dlcl import TransformerDLCLModel

    hub = TransformerDLCLModel.from_pretrained(
        str(trained),
        checkpoint_file="checkpoint_last.pt",
        data_name_or_path=str(synthetic_bin),
        source_lang="src",
        target_lang="tgt",
    )
    hub.eval()
    src, hyp = sources(generated), hypotheses(generated)
    ids = [0, 5, 50, 100]
    kw = dict(beam=1, max_len_a=1.5, max_len_b=5)
    with warnings.catch_warnings(record=True) as caught:
        assert hub.translate([src[i] for i in ids], **kw) == [hyp[i] for i in ids]
    # issue 32: not torch's "'pin_memory' argument is set as true but no accelerator is found" on a CPU
    assert not [w for w in caught if "pin_memory" in str(w.message)], [
        str(w.message) for w in caught
    ]
    # .generate() on binarized input gives the same tokens
    tokens = [hub.encode(src[i]) for i in ids]
    out = hub.generate(tokens, **kw)
    assert [hub.decode(o[0]["tokens"]) for o in out] == [hyp[i] for i in ids]


def test_average_keeps_flags_and_averages_floats(tmp_path):
    """A bool flag (DLCL's softmax_rows) stays a bool of the newest checkpoint; floats are means."""
    from fairseq_deep.average_checkpoints import average_checkpoints

    paths = []
    for i, w in enumerate([1.0, 3.0]):
        paths.append(tmp_path / f"c{i}.pt")
        torch.save(
            {"model": {"w": torch.tensor([w]).half(), "history.softmax_rows": torch.tensor(True)}},
            paths[-1],
        )
    out = average_checkpoints([str(p) for p in paths])["model"]
    assert out["history.softmax_rows"].dtype == torch.bool and bool(out["history.softmax_rows"])
    assert out["w"].dtype == torch.float16 and out["w"].item() == 2.0


def test_average_checkpoints(trained, synthetic_bin, tmp_path):
    avg = tmp_path / "averaged.pt"
    run_cli(
        "fairseq-deep-average-checkpoints",
        "--inputs",
        str(trained),
        "--num-epoch-checkpoints",
        "2",
        "--output",
        str(avg),
        cwd=tmp_path,
    )
    states = [torch.load(trained / f"checkpoint{e}.pt", map_location="cpu") for e in (1, 2)]
    averaged = torch.load(avg, map_location="cpu")  # weights_only: no pickled code in it
    assert set(averaged["model"]) == set(states[0]["model"])
    for k, v in averaged["model"].items():
        expected = (states[0]["model"][k].double() + states[1]["model"][k].double()) / 2
        torch.testing.assert_close(v.double(), expected, rtol=1e-6, atol=1e-6)
    # everything but the parameters comes from the newest checkpoint
    assert averaged["extra_state"]["train_iterator"] == states[1]["extra_state"]["train_iterator"]
    # explicit files give the same average
    avg2 = tmp_path / "averaged2.pt"
    run_cli(
        "fairseq-deep-average-checkpoints",
        "--inputs",
        str(trained / "checkpoint2.pt"),
        str(trained / "checkpoint1.pt"),
        "--output",
        str(avg2),
        cwd=tmp_path,
    )
    for k, v in torch.load(avg2, map_location="cpu")["model"].items():
        assert torch.equal(v, averaged["model"][k])
    proc = run_cli(
        "fairseq-deep-generate", str(synthetic_bin), "--path", str(avg), *GEN, cwd=tmp_path
    )
    assert sorted(hypotheses(proc.stdout)) == list(range(N_TEST))


def test_average_checkpoints_too_few(trained, tmp_path):
    proc = run_cli(
        "fairseq-deep-average-checkpoints",
        "--inputs",
        str(trained),
        "--num-epoch-checkpoints",
        "5",
        "--output",
        str(tmp_path / "x.pt"),
        check=False,
    )
    assert proc.returncode != 0
    assert "found 2 epoch checkpoints" in proc.stderr
    assert not (tmp_path / "x.pt").exists()


def test_non_editable_install(synthetic_bin, tmp_path):
    """`pip install .` ships every module: fairseq-train --user-dir <site-packages>/fairseq_deep works.
    (Built from a copy of the sources, so that the build leaves nothing in the repository.)"""
    src = tmp_path / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")
    shutil.copytree(PLUGIN_DIR, src / "fairseq_deep", ignore=ignore)
    for name in ("setup.py", "README.md"):
        shutil.copy(os.path.join(REPO_ROOT, name), src / name)
    site = tmp_path / "site"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-q",
            "--target",
            str(site),
            str(src),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    plugin = site / "fairseq_deep"
    assert (plugin / "models" / "transformer_dlcl.py").is_file()
    where = subprocess.run(
        [sys.executable, "-c", "import fairseq_deep; print(fairseq_deep.__file__)"],
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=str(site)),  # site first, no checkout
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert where == str(plugin / "__init__.py")  # the installed copy, not the sources
    save_dir = tmp_path / "checkpoints"
    run_cli(
        "fairseq-train",
        *train_args(synthetic_bin, save_dir, ["--user-dir", str(plugin), "--max-update", "2"]),
        cwd=tmp_path,
    )
    proc = run_cli(
        "fairseq-generate",
        str(synthetic_bin),
        "--user-dir",
        str(plugin),
        "--path",
        str(save_dir / "checkpoint_last.pt"),
        *GEN,
        cwd=tmp_path,
    )
    assert sorted(hypotheses(proc.stdout)) == list(range(N_TEST))
