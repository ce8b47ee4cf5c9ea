"""Plots a person reads: validation beside training loss, distinct series, masked vs absent cells."""

import pytest
import torch

from fairseq_deep.diagnostics.layer_weights import plot_heatmap
from fairseq_deep.diagnostics.plot_training import parse_log_lines, plot_runs, series_styles

JSON_LOG = [
    '2026-11-23 04:15:21 | INFO | train_inner | {"epoch": 1, "update": 0.1, "loss": "9.9", "num_updates": "2"}',
    '2026-11-23 04:15:22 | INFO | valid | {"epoch": 1, "valid_loss": "9.815", "valid_ppl": "900.7", "valid_num_updates": "2"}',  # noqa: E501
    '2026-11-23 04:15:23 | INFO | valid | {"epoch": 1, "valid_loss": "9.776", "valid_num_updates": "4"}',
]
SIMPLE_LOG = [
    "2026-11-23 04:13:37 | INFO | train_inner | epoch 001:     10 / 63 loss=8.455, nll_loss=8.173, num_updates=10",
    "2026-11-23 04:13:37 | INFO | valid | epoch 001 | valid on 'valid' subset | loss 8.308 | nll_loss 8.302 "
    "| ppl 315.6 | wps 77108.5 | num_updates 20",
]


def test_validation_records_are_read_from_json_and_simple_logs():
    json_series = parse_log_lines(JSON_LOG)
    assert json_series["valid_loss"] == [(2.0, 9.815), (4.0, 9.776)]
    assert json_series["loss"] == [(2.0, 9.9)]
    simple = parse_log_lines(SIMPLE_LOG)
    assert simple["valid_loss"] == [(20.0, 8.308)] and simple["valid_nll_loss"] == [(20.0, 8.302)]
    assert simple["loss"] == [(10.0, 8.455)] and "valid_epoch" not in simple


def test_every_series_gets_its_own_colour_and_line_style():
    styles = series_styles(31)  # a 30-layer encoder's s_(i,j) plus the embedding
    assert len({(s["color"], s["linestyle"]) for s in styles}) == 31
    assert styles[0]["color"] != styles[1]["color"]  # "emb." and "layer 1"


def test_plots_are_written(tmp_path):
    pytest.importorskip("matplotlib")
    written = plot_runs(
        {"a": parse_log_lines(JSON_LOG), "b": parse_log_lines(SIMPLE_LOG)}, str(tmp_path)
    )
    assert str(tmp_path / "loss.png") in written
    m = torch.tril(torch.rand(4, 4))
    empty = torch.ones(4, 4).triu(1).bool()
    hidden = empty | (m < 0.3)
    path = plot_heatmap(
        m, list("abcd"), list("abcd"), "t", str(tmp_path / "h.png"), mask=hidden, empty=empty
    )
    assert (tmp_path / "h.png").stat().st_size > 0 and path.endswith("h.png")


def test_tick_positions_label_every_kth_layer_and_the_last():
    from fairseq_deep.diagnostics.layer_weights import tick_positions

    assert tick_positions(7) == list(range(7))
    assert tick_positions(31) == list(
        range(0, 31, 2)
    )  # depth 30 + readout: every 2nd, y30 and readout
    assert tick_positions(101) == list(range(0, 101, 10))
    assert tick_positions(62)[-1] == 61 and len(tick_positions(62)) <= 17


def test_deep_heatmap_is_readable(tmp_path):
    """At depth 30 (issue 26, item 11): every 2nd layer labelled at a readable size, a diverging
    colour scale centred at 0 for signed weights with its colour bar, a figure that grows with the
    rows and columns (each on its own); a non-negative matrix gets a sequential scale from 0."""
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from fairseq_deep.diagnostics.layer_weights import heatmap_figure, layer_labels

    n = 31
    m = torch.randn(n, n, generator=torch.Generator().manual_seed(0)).tril()
    fig = heatmap_figure(
        m, [f"layer {r + 1}" for r in range(n - 1)] + ["readout"], layer_labels(n), "dlcl"
    )
    ax, bar = fig.axes
    assert [t.get_text() for t in ax.get_yticklabels()][-2:] == ["layer 29", "readout"]
    assert [t.get_text() for t in ax.get_xticklabels()][:2] == ["y0 (emb)", "y2"]
    assert min(t.get_fontsize() for t in ax.get_yticklabels()) >= 9
    vmin, vmax = ax.images[0].get_clim()
    assert vmin == -vmax and vmax == pytest.approx(float(m.abs().max()))
    assert ax.images[0].get_cmap().name.startswith("RdBu") and "centred at 0" in bar.get_ylabel()
    width, height = fig.get_size_inches()
    assert height > 10
    plt.close(fig)
    ta = torch.softmax(torch.randn(6, n), dim=1)  # 6 readers of 31 layers: a wide, low figure
    fig = heatmap_figure(ta, [f"dec. attn {j}" for j in range(6)], layer_labels(n), "ta")
    assert fig.get_size_inches()[1] < 6 < fig.get_size_inches()[0]
    assert (
        fig.axes[0].images[0].get_clim()[0] == 0.0
        and fig.axes[0].images[0].get_cmap().name == "viridis"
    )
    plt.close(fig)
