"""Export and plots of learned layer weights (Wang et al. 2019, Sec. 6.4 / Fig. 5)."""

import json
import os
import sys

import pytest
import torch
from helpers import PLUGIN_DIR, build_model, parse_model_args, python_module, run_cli

from fairseq_deep.diagnostics import layer_weights as lw

REPO_ROOT = os.path.dirname(PLUGIN_DIR)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def assert_png(path):
    with open(path, "rb") as f:
        assert f.read(8) == PNG_MAGIC, f"{path} is not a PNG"
    Image = pytest.importorskip("PIL.Image")
    with Image.open(path) as im:
        im.verify()
    with Image.open(path) as im:
        assert im.size[0] > 100 and im.size[1] > 100


def set_known_weights(model, seed=0):
    """Distinct values everywhere, the (unused) upper triangle included."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for stack in (model.encoder, model.decoder):
            stack.history.weight.copy_(torch.randn(stack.history.weight.shape, generator=g))


def test_mask_rule_on_a_hand_made_matrix():
    # rows as in Fig. 5; the upper triangle holds large values that must neither show nor count
    # towards a row's maximum
    m = torch.tensor(
        [
            [0.05, 9.0, 9.0, 9.0],  # 0.05 < 0.1: hidden
            [0.10, -0.5, 9.0, 9.0],  # 0.10 is not < 0.1: shown; negative values by magnitude
            [4.0, 0.15, -0.25, 9.0],  # 5% of 4.0 = 0.2: 0.15 hidden, -0.25 shown
            [-3.0, 0.149, 0.151, 0.09],  # 5% of 3.0 = 0.15: 0.149 hidden, 0.151 shown, 0.09 hidden
        ]
    )
    valid = torch.ones(4, 4, dtype=torch.bool).tril()
    expected = torch.tensor(
        [
            [1, 1, 1, 1],
            [0, 0, 1, 1],
            [0, 1, 0, 1],
            [0, 1, 0, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(lw.small_weight_mask(m, 0.1, 0.05, valid), expected)
    # thresholds are options: nothing below 0 is hidden except the upper triangle
    assert torch.equal(lw.small_weight_mask(m, 0.0, 0.0, valid), ~valid)
    # without `valid`, every entry exists (transparent attention) and counts towards the row max
    assert lw.small_weight_mask(m, 0.1, 0.05)[0].tolist() == [True, False, False, False]


@pytest.mark.parametrize("softmax", [False, True])
def test_extracted_matrix_is_the_modules_effective_weights(softmax):
    flags = ["--encoder-layers", "3", "--decoder-layers", "2"] + (
        ["--dlcl-softmax-weights"] if softmax else []
    )
    model, _ = build_model("transformer_dlcl", flags)
    set_known_weights(model)
    args = parse_model_args("transformer_dlcl", flags)
    records = {r["key"]: r for r in lw.extract_layer_weights(model.state_dict(), args)}
    assert set(records) == {"encoder.history.weight", "decoder.history.weight"}
    for key, stack in (
        ("encoder.history.weight", model.encoder),
        ("decoder.history.weight", model.decoder),
    ):
        r = records[key]
        assert r["kind"] == "dlcl"
        torch.testing.assert_close(r["matrix"], stack.history.weights().detach(), rtol=0, atol=0)
        n = stack.history.weight.shape[0]
        assert r["row_labels"] == [f"layer {i}" for i in range(1, n)] + ["readout"]
        assert r["col_labels"][0].startswith("y0") and r["col_labels"][-1] == f"y{n - 1}"
        if softmax:
            torch.testing.assert_close(r["matrix"].sum(1), torch.ones(n))


def test_transparent_attention_kind():
    w = torch.randn(5, 3, generator=torch.Generator().manual_seed(0))  # (N+1) x M, N=4, M=3
    [r] = lw.extract_layer_weights(
        {"decoder.transparent_attention.weight": w, "x.weight": torch.ones(2, 2)}
    )
    assert r["kind"] == "transparent_attention" and r["stored_shape"] == [5, 3]
    torch.testing.assert_close(r["matrix"], torch.softmax(w, dim=0).t())
    assert r["row_labels"] == ["dec. attn 1", "dec. attn 2", "dec. attn 3"]
    assert len(r["col_labels"]) == 5


def test_fake_checkpoint_in_process(tmp_path):
    """A checkpoint in fairseq's format whose cfg asks for softmax weights."""
    flags = ["--encoder-layers", "4", "--decoder-layers", "2", "--dlcl-softmax-weights"]
    model, _ = build_model("transformer_dlcl", flags)
    set_known_weights(model, seed=3)
    path = tmp_path / "checkpoint.pt"
    torch.save(
        {
            "model": model.state_dict(),
            "cfg": {"model": parse_model_args("transformer_dlcl", flags)},
        },
        path,
    )
    out = tmp_path / "out"
    assert lw.main([str(path), "--out-dir", str(out), "--no-plot"]) == 0
    data = json.loads((out / "encoder.history.weight.json").read_text())
    expected = model.encoder.history.weights().detach()
    torch.testing.assert_close(torch.tensor(data["matrix"]), expected)
    assert (
        data["plot_mask"]
        == lw.small_weight_mask(
            expected, 0.1, 0.05, torch.ones(5, 5, dtype=torch.bool).tril()
        ).tolist()
    )
    assert (out / "decoder.history.weight.csv").exists()
    assert not (out / "encoder.history.weight.png").exists()


def test_without_matplotlib_one_line_error(tmp_path, capsys, monkeypatch):
    """No matplotlib: one line naming the package and --no-plot, exit status 2; --no-plot still
    works (issue 26, item 4)."""
    model, _ = build_model("transformer_dlcl", ["--encoder-layers", "2", "--decoder-layers", "1"])
    path = tmp_path / "checkpoint.pt"
    torch.save({"model": model.state_dict(), "cfg": {"model": None}}, path)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    monkeypatch.setattr(
        sys, "argv", ["fairseq-deep-layer-weights", str(path), "--out-dir", str(tmp_path / "out")]
    )
    with pytest.raises(SystemExit) as exit_:
        lw.cli_main()
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        "fairseq-deep-layer-weights: error: plotting layer weights needs matplotlib"
    ), err
    assert "pip install matplotlib" in err[0] and "--no-plot" in err[0]
    assert not (tmp_path / "out").exists()  # nothing written before the error
    assert lw.main([str(path), "--out-dir", str(tmp_path / "out"), "--no-plot"]) == 0


def test_checkpoint_without_layer_weights(tmp_path, capsys):
    model, _ = build_model(
        "transformer_prenorm", ["--encoder-layers", "2", "--decoder-layers", "1"]
    )
    path = tmp_path / "plain.pt"
    torch.save({"model": model.state_dict(), "cfg": {"model": None}}, path)
    assert lw.main([str(path), "--out-dir", str(tmp_path / "out"), "--no-plot"]) == 1
    assert "no layer-weight matrix" in capsys.readouterr().err


def test_command_on_a_checkpoint_trained_by_fairseq_train(synthetic_bin, tmp_path):
    pytest.importorskip("matplotlib")
    save_dir = tmp_path / "ckpt"
    run_cli(
        "fairseq-train",
        str(synthetic_bin),
        "--user-dir",
        PLUGIN_DIR,
        "--arch",
        "transformer_dlcl",
        "--task",
        "translation",
        "--encoder-layers",
        "3",
        "--decoder-layers",
        "2",
        "--encoder-embed-dim",
        "16",
        "--decoder-embed-dim",
        "16",
        "--encoder-ffn-embed-dim",
        "32",
        "--decoder-ffn-embed-dim",
        "32",
        "--encoder-attention-heads",
        "2",
        "--decoder-attention-heads",
        "2",
        "--optimizer",
        "adam",
        "--lr",
        "0.01",
        "--max-tokens",
        "1000",
        "--max-update",
        "3",
        "--save-dir",
        str(save_dir),
        "--no-epoch-checkpoints",
        "--disable-validation",
        "--cpu",
        "--seed",
        "1",
    )
    ckpt = save_dir / "checkpoint_last.pt"
    out = tmp_path / "out"
    proc = run_cli(
        *python_module("fairseq_deep.diagnostics.layer_weights"),
        str(ckpt),
        "--out-dir",
        str(out),
        cwd=REPO_ROOT,
    )
    assert "encoder.history.weight (dlcl, 4x4)" in proc.stdout

    state = torch.load(ckpt, map_location="cpu")["model"]  # weights_only=True
    for key, n in (("encoder.history.weight", 4), ("decoder.history.weight", 3)):
        trained = state[key] * torch.ones(n, n).tril()
        init = torch.ones(n, n).tril() / torch.arange(1, n + 1).unsqueeze(1)  # --dlcl-init avg
        assert not torch.allclose(trained, init), "3 updates should have moved the weights"
        data = json.loads((out / f"{key}.json").read_text())
        assert data["key"] == key and data["kind"] == "dlcl"
        torch.testing.assert_close(torch.tensor(data["matrix"]), trained)
        assert (
            data["plot_mask"]
            == lw.small_weight_mask(
                trained, 0.1, 0.05, torch.ones(n, n, dtype=torch.bool).tril()
            ).tolist()
        )
        assert_png(out / f"{key}.png")
        rows = (out / f"{key}.csv").read_text().splitlines()
        assert len(rows) == n + 1 and rows[-1].startswith("readout,")
