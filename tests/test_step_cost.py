"""What a step costs, counted by ``benchmarks/step_cost.py`` (issue 24): identities that hold
whatever the machine's speed.

* Layer aggregation is position-wise (Dou et al. 2018): a decoding step adds exactly the matrix
  products of the new position's combination, never a recomputation over earlier positions.  The
  FLOPs of a decoding step are therefore a formula of the model's sizes: dense aggregation adds
  none, the linear combination L products d x d, iterative aggregation L - 1 AGG nodes; in
  training the linear combination adds L products per position and stack forward, twice that
  backward.
* No decoder of ours makes the host wait for the device at a step where its reference does not
  (a host sync stalls a GPU's launch queue): RNMT+ and Deep-Att at most once a batch, the aggregation
  stacks as many as fairseq's own decoder (its padding test).
"""

import importlib.util
import os
import subprocess
import sys

import pytest
import torch

from benchmarks import step_cost

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

L, D, FFN, BATCH, BEAM = 2, 16, 24, 3, 2
TINY = [
    "--device",
    "cpu",
    "--layers",
    str(L),
    "--embed-dim",
    str(D),
    "--ffn-dim",
    str(FFN),
    "--heads",
    "2",
    "--hidden",
    str(D),
    "--vocab",
    "60",
    "--gen-batch",
    str(BATCH),
    "--beam",
    str(BEAM),
    "--src-len",
    "7",
    "--gen-len",
    "5",
    "--train-batch",
    "3",
    "--train-len",
    "4",
    "--repeats",
    "1",
]


def run(phase):
    args = step_cost.get_parser().parse_args(TINY)
    return {
        name: {r["arch"]: r for r in step_cost.run_group(name, args, phase)}
        for name in step_cost.GROUPS
    }


@pytest.fixture(scope="module")
def groups():
    return run("decode")


@pytest.fixture(scope="module")
def training():
    return run("train")


def decoder_flops_per_step(row):
    return row["decoder_mflop"] * 1e6


def test_every_step_is_counted(groups):
    for rows in groups.values():
        for row in rows.values():
            assert row["steps"] == 6  # gen_len 5 forced, plus the step that ends every hypothesis
            assert row["per_step"]["decoder"]["kernels"] > 0 and row["encoder"]["kernels"] > 0


def test_aggregation_adds_exactly_the_new_positions_products(groups):
    rows = groups["aggregation"]
    base = decoder_flops_per_step(rows["transformer_agg_baseline"])
    hypotheses = BATCH * BEAM
    # dense: sums only
    assert decoder_flops_per_step(rows["transformer_dense"]) == base
    # linear (Eq. 5): H = sum_l W_l H^l, one d x d product per layer for the new position
    assert (
        decoder_flops_per_step(rows["transformer_linear_agg"]) - base == L * 2 * hypotheses * D * D
    )
    # iterative (Eq. 6): L - 1 AGG nodes LN(W_2 sigmoid(W_1 [x; y] + b_1) + b_2 + x + y), F's width the FFN's
    node = 2 * hypotheses * (2 * D * FFN + FFN * D)
    assert decoder_flops_per_step(rows["transformer_iterative_agg"]) - base == (L - 1) * node


def test_no_decoder_of_ours_waits_for_the_device_more_than_its_reference(groups):
    recurrent = groups["recurrent"]
    for arch in ("rnmt_plus", "deep_att_ff"):  # at most once per batch (is the source padded?)
        row = recurrent[arch]
        assert row["per_step"]["decoder"]["syncs"] * row["steps"] <= 1, arch
    aggregation = groups["aggregation"]
    reference = aggregation["transformer_agg_baseline"]["per_step"]["decoder"]["syncs"]
    for arch, row in aggregation.items():
        assert row["per_step"]["decoder"]["syncs"] == reference, arch


def test_the_table_has_a_row_per_system_and_the_reference_at_one(groups):
    rows = list(groups["recurrent"].values())
    text = step_cost.table(rows)
    assert len(text.splitlines()) == 2 + len(rows)
    reference = groups["recurrent"]["lstm"]
    assert (
        reference["ratio_launch_bound"]
        == reference["ratio_compute_bound"]
        == reference["ratio_measured"]
        == 1
    )


def test_training_the_linear_combination_adds_its_products_forward_and_twice_backward(training):
    rows = training["aggregation"]
    base, dense, linear = (
        rows[a] for a in ("transformer_agg_baseline", "transformer_dense", "transformer_linear_agg")
    )
    assert (
        dense["forward_mflop"] == base["forward_mflop"]
        and dense["backward_mflop"] == base["backward_mflop"]
    )
    positions = 3 * 4  # --train-batch x --train-len, in each of the two stacks
    added = 2 * L * 2 * positions * D * D / 1e6
    assert linear["forward_mflop"] - base["forward_mflop"] == pytest.approx(added, rel=1e-9)
    # backward: the gradients of each product's input and of its weight
    assert linear["backward_mflop"] - base["backward_mflop"] == pytest.approx(2 * added, rel=1e-9)
    assert step_cost.table(list(rows.values())).count("\n") == len(rows) + 1


def test_a_fused_lstm_is_counted_as_its_products():
    """torch's counter leaves nn.LSTM's fused layer (oneDNN here, cuDNN on a GPU) at zero FLOPs;
    step_cost counts its input and recurrent products, which is what the same layer costs when
    run step by step (a packed batch of unequal lengths takes that path on a CPU)."""
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(6, 5, num_layers=2, bidirectional=True)
    x = torch.randn(4, 3, 6)
    per_row = 2 * (4 * 5 * 6 + 4 * 5 * 5) + 2 * (
        4 * 5 * 10 + 4 * 5 * 5
    )  # two layers, two directions
    with step_cost.flop_counter() as mode:
        lstm(x)
    assert mode.get_total_flops() == 2 * 12 * per_row
    packed = torch.nn.utils.rnn.pack_padded_sequence(x, torch.tensor([4, 3, 1]))
    with step_cost.flop_counter() as mode:
        lstm(packed)
    assert mode.get_total_flops() == 2 * 8 * per_row


COUNT_TRITON = """
import torch
from benchmarks import step_cost  # the subprocess runs in the repository root
from fairseq_deep.modules.recurrent.ln_lstm import LayerNormLSTM
layer = LayerNormLSTM(4, 3, impl="triton")
counter = step_cost.OpCounter(("all",), "all")
with torch.no_grad(), counter:
    layer(torch.randn(5, 2, 4))
print(counter.ops["all"]["triton:_fwd_step"], counter.totals("all")["kernels"])
"""


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_triton_launches_are_counted_as_kernels():
    """The fused cells' kernels are no ATen calls: step_cost counts their launches (here in
    Triton's CPU interpreter, one per time step of the layer)."""
    run = subprocess.run(
        [sys.executable, "-c", COUNT_TRITON],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1"),
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    launches, kernels = map(int, run.stdout.split()[-2:])
    assert launches == 5 and kernels > launches


def test_each_sinkhorn_iteration_adds_four_kernels_per_decoder_sublayer_and_no_flops():
    """Issue 47: what mHC's Sinkhorn-Knopp costs (Xie et al. 2025, Eq. 9): each iteration divides
    the residual mixing's columns by their sums and its rows by theirs: 4 kernels, no matrix
    product, in each of a decoder layer's 3 sublayers at every decoding step.  Its cost is launches,
    which bound a GPU at beam search's batches (the ``schemes`` group's launch-bound ratio)."""
    from benchmarks.deep_att_speed import dictionary

    args = step_cost.get_parser().parse_args(TINY)
    d = dictionary(args.vocab)
    rows = {}
    for iters in (1, 3):
        argv = step_cost.transformer_argv("transformer_mhc", args)
        model = step_cost.harness.build_model(
            argv + ["--hc-sinkhorn-iters", str(iters)], d, "cpu", 1
        )
        rows[iters], _ = step_cost.decode_counted(model, d, args)
    per_step = {k: r["per_step"]["decoder"]["kernels"] for k, r in rows.items()}
    assert per_step[3] - per_step[1] == pytest.approx(2 * 4 * 3 * L)  # per step: a mean
    assert rows[3]["step_mflop"] == rows[1]["step_mflop"]
    assert rows[3]["encoder"]["kernels"] - rows[1]["encoder"]["kernels"] == 2 * 4 * 2 * L


def test_a_profile_has_a_section_per_system_with_its_operators(tmp_path):
    """``--profile FILE``: one more step of each system under torch's profiler, a section each (the
    GPU window's step_cost profiles the decoding steps whose GPU targets were missed)."""
    path = tmp_path / "profile.md"
    args = step_cost.get_parser().parse_args(TINY + ["--profile", str(path)])
    rows = step_cost.run_group("schemes", args, "decode")
    sections = path.read_text().split("## ")[1:]
    assert [s.splitlines()[0] for s in sections] == [
        f"decode, schemes: {r['label']} ({r['arch']}), CPU" for r in rows
    ]
    for section in sections:
        assert "aten::addmm" in section and "# of Calls" in section
