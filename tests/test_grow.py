"""fairseq-deep-grow (issue 27): growing to the same depth changes nothing, --method identity keeps
the shallow model's outputs where the family allows it, every depth-dependent tensor is rebuilt,
a grown checkpoint trains (with the bottom frozen), resumes and decodes through the real fairseq
scripts, and bad input ends in one line."""

import os
import sys

import pytest
import torch
from fairseq import checkpoint_utils
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.models import ARCH_MODEL_NAME_REGISTRY
from helpers import (
    TINY,
    TINY_RNMT,
    build_model,
    dtype_marker,
    parse_model_args,
    random_batch,
    run_cli,
)
from omegaconf import OmegaConf

from fairseq_deep.errors import UserError
from fairseq_deep.grow import depth_options, grow
from fairseq_deep.models import families
from fairseq_deep.modules.common.growth import base_layer_map
from fairseq_deep.modules.schemes.residual_schemes import deepnorm_constants
from fairseq_deep.tasks.freeze import freeze_bottom_layers


def save_tiny(arch, extra, path, seed=1):
    """A tiny model of ``arch`` saved as fairseq-train saves it (cfg with the model's namespace)."""
    model, task = build_model(arch, extra, seed=seed)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # as trained: ReZero's alphas are not the initial 0, nor norms' betas
        for name, p in model.named_parameters():
            if name.endswith(("rezero_alpha", "layer_scale")):
                p.fill_(0.5)
            elif name.endswith("norm.bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    args = parse_model_args(arch, extra)
    cfg = OmegaConf.to_container(
        convert_namespace_to_omegaconf(args), resolve=True, enum_to_str=True
    )
    state = {
        "cfg": cfg,
        "args": None,
        "model": model.state_dict(),
        "criterion": {},
        "optimizer_history": [
            {
                "criterion_name": "X",
                "optimizer_name": "Y",
                "lr_scheduler_state": {},
                "num_updates": 5,
            }
        ],
        "task_state": {},
        "extra_state": {"train_iterator": {"epoch": 2}},
        "last_optimizer_state": {"state": {}},
    }
    checkpoint_utils.torch_persistent_save(state, str(path))
    return model, task


def load(path, task):
    models, _ = checkpoint_utils.load_model_ensemble([str(path)], task=task)
    return models[0].eval()


def logits(model, dictionary):
    src, lengths, prev = random_batch(dictionary)
    with torch.no_grad():
        return model(src, lengths, prev)[0]


def layers(n, m=None):
    return ["--encoder-layers", str(n), "--decoder-layers", str(n if m is None else m)]


HYBRID = [
    "--encoder-hidden-size",
    "8",
    "--decoder-hidden-size",
    "16",
]  # the hybrids' RNMT+ parts (default 1024)


# -- growing to the same depth is the identity -----------------------------------------------------

_SAME = [
    ("transformer_dlcl", layers(2)),
    ("transformer_dlcl_postnorm", ["--dlcl-softmax-weights", *layers(2)]),
    ("transformer_ta", layers(2)),
    ("transformer_hier_agg", layers(3, 2)),
    ("transformer_iterative_agg", layers(3, 2)),
    ("transformer_linear_agg", layers(2)),
    ("transformer_mla2", layers(2)),
    ("transformer_deepnorm", layers(2)),
    ("transformer_admin", layers(2)),
    ("transformer_rezero", layers(2)),
    ("rnmt_plus", ["--dlcl-stacks", "both", *layers(3)]),
    ("rnmt_plus_512_ta", ["--decoder-layers", "2"]),
    ("deep_att", layers(3, 2)),
    ("deep_ed_ff", layers(3, 2)),
    ("hybrid_transformer_rnmt", [*HYBRID, *layers(2)]),
    ("hybrid_rnmt_transformer", [*HYBRID, "--rnmt-encoder-layers", "2", "--decoder-layers", "2"]),
    ("transformer_dsinit", layers(2)),
    ("transformer_dense", layers(2)),
    ("transformer_mla3", layers(3, 2)),
    # issue 41: the stream-level schemes
    ("transformer_denseformer", layers(2)),
    ("transformer_mhc", layers(2)),  # the connections of static and dynamic ones travel alike
    ("transformer_resi_dual", layers(2)),
    ("transformer_ode_rk2", ["--ode-stacks", "both", *layers(2)]),
    ("transformer_b2t", layers(2)),  # issue 41's other schemes: IDENTITY below (grown twice each)
]


def same():
    """The rows above, and the first tiny configuration of every family that grows and that none
    of them is of (models/families.py)."""
    return families.cover(
        _SAME,
        arch=lambda row: row[0],
        default=lambda family, tiny: (tiny.arch, [*family.tiny_sizes, *tiny.model]),
        applies=lambda family: family.grows,
    )


SAME = same()


@pytest.mark.parametrize("method", ["stack", "interleave", "identity"])
@pytest.mark.parametrize("arch,extra", SAME, ids=[a for a, _ in SAME])
def test_same_depth_changes_nothing(arch, extra, method, tmp_path):
    model, task = save_tiny(arch, extra, tmp_path / "in.pt")
    args = parse_model_args(arch, extra)
    enc = getattr(
        args, depth_options(ARCH_MODEL_NAME_REGISTRY[arch], args)[0]
    )  # a hybrid's RNMT+ encoder: its own
    summary = grow(
        str(tmp_path / "in.pt"), str(tmp_path / "out.pt"), enc, args.decoder_layers, method
    )
    assert summary["encoder_layers"] == [enc, enc]
    grown = load(tmp_path / "out.pt", task)
    d = task.source_dictionary
    assert torch.equal(logits(model, d), logits(grown, d))  # bit for bit
    old, new = model.state_dict(), grown.state_dict()
    assert old.keys() == new.keys() and all(
        torch.equal(old[k], new[k]) for k in old if not dtype_marker(k)
    )


# -- --method identity -----------------------------------------------------------------------------

IDENTITY = [  # (arch, flags, grown encoder, decoder, tolerance): where the family allows it
    ("transformer_dlcl", layers(2), 5, 3, 0.0),  # the readout row ignores the new layers
    ("transformer_dlcl_postnorm", layers(2), 5, 3, 0.0),
    ("transformer_linear_agg", layers(2), 4, 3, 0.0),  # W_l = 0 for the new layers
    ("transformer_rezero", layers(2), 4, 3, 0.0),  # alpha = 0
    ("transformer_prenorm", layers(2), 4, 3, 0.0),  # output projections 0: x + 0 + 0
    (
        "transformer_ta_prenorm",
        layers(2),
        4,
        3,
        1e-6,
    ),  # the top entry's logit split among its copies
    ("rnmt_plus", ["--dlcl-stacks", "both", *layers(3)], 6, 5, 0.0),
    ("transformer_denseformer", layers(2), 4, 3, 0.0),  # the readout row ignores the new layers
    ("transformer_ode_rk2", ["--ode-stacks", "both", *layers(2)], 4, 3, 0.0),  # every F_i = 0
    # issue 41: pre-norm layers with their output projections 0 (and Peri-LN's output beta)
    ("transformer_subln", layers(2), 4, 3, 0.0),
    ("transformer_periln", layers(2), 4, 3, 0.0),
    ("transformer_dyt", layers(2), 4, 3, 0.0),
    ("transformer_layerscale", layers(2), 4, 3, 0.0),
    # Mix-LN keeps its post-norm bottom layers (1 of 2 -> 1 of 4) and adds pre-norm ones on top
    ("transformer_mixln", ["--mix-ln-ratio", "0.5", *layers(2)], 4, 3, 0.0),
]


@pytest.mark.parametrize("arch,extra,n,m,tol", IDENTITY, ids=[a for a, *_ in IDENTITY])
def test_identity_method_keeps_the_outputs(arch, extra, n, m, tol, tmp_path):
    model, task = save_tiny(arch, extra, tmp_path / "in.pt")
    grow(str(tmp_path / "in.pt"), str(tmp_path / "out.pt"), n, m, "identity")
    grown = load(tmp_path / "out.pt", task)
    assert len(grown.encoder.layers) == n and len(grown.decoder.layers) == m
    d = task.source_dictionary
    torch.testing.assert_close(logits(grown, d), logits(model, d), rtol=0, atol=tol)
    # ... and the stack method, the same depths, does change them (the test can tell)
    grow(str(tmp_path / "in.pt"), str(tmp_path / "stack.pt"), n, m, "stack")
    assert not torch.allclose(
        logits(load(tmp_path / "stack.pt", task), d), logits(model, d), atol=1e-4
    )


@pytest.mark.parametrize(
    "arch,extra,fragment",
    [
        ("transformer_postnorm", layers(2), "post-norm"),  # LN(x + 0) is not x
        ("transformer_admin", layers(2), "post-norm"),
        ("transformer_hier_agg", layers(2), "HierarchicalAggregationHistory"),
        ("deep_att", layers(2), "LSTM layers"),
        ("transformer_dlcl", ["--dlcl-softmax-weights", *layers(2)], "--dlcl-softmax-weights"),
        ("transformer_dsinit", layers(2), "post-norm"),
        ("transformer_b2t", layers(2), "post-norm B2T layers"),
        ("transformer_postnorm", ["--dyt", *layers(2)], "post-norm"),
        ("transformer_dense", layers(2), "DenseHistory"),
        ("transformer_mla3", layers(2), "multi-layer attention"),
        (
            "transformer_mla2",
            ["--encoder-normalize-before", "--decoder-normalize-before", *layers(2)],
            "multi-layer attention",
        ),  # pre-norm, but each layer also reads the layers below
        ("transformer_hc", layers(2), "hyper-connected"),
        ("transformer_mhc", layers(2), "hyper-connected"),
        ("transformer_resi_dual", layers(2), "ResiDual's post-LN layers"),
        ("transformer_denseformer", ["--denseformer-period", "2", *layers(2)], "period 2"),
    ],
)
def test_identity_method_refused_where_it_cannot_hold(arch, extra, fragment, tmp_path):
    save_tiny(arch, extra, tmp_path / "in.pt")
    with pytest.raises(UserError, match="--method identity") as e:
        grow(str(tmp_path / "in.pt"), str(tmp_path / "out.pt"), 4, None, "identity")
    assert fragment in str(e.value)


# -- what each method copies, and the depth-dependent tensors ------------------------------------


def test_layer_maps():
    assert base_layer_map("stack", 6, 12) == list(range(6)) * 2  # Li et al.: the top 6 stacked
    assert base_layer_map("stack", 6, 8) == [0, 1, 2, 3, 4, 5, 4, 5]  # the top 2
    assert base_layer_map("stack", 2, 6) == [0, 1, 0, 1, 0, 1]
    assert base_layer_map("interleave", 3, 6) == [0, 0, 1, 1, 2, 2]
    assert base_layer_map("interleave", 3, 5) == [0, 0, 1, 1, 2]


def test_stack_copies_layers_and_rebuilds_dlcl_weights(tmp_path):
    model, task = save_tiny("transformer_dlcl", layers(3, 2), tmp_path / "in.pt")
    grow(str(tmp_path / "in.pt"), str(tmp_path / "out.pt"), 5, None, "stack")
    grown = load(tmp_path / "out.pt", task)
    old, new = model.state_dict(), grown.state_dict()
    for j, src in enumerate([0, 1, 2, 1, 2]):  # the top 2 of 3 stacked
        for name in ("self_attn.k_proj.weight", "fc2.bias", "final_layer_norm.weight"):
            assert torch.equal(
                new[f"encoder.layers.{j}.{name}"], old[f"encoder.layers.{src}.{name}"]
            )
    for u, src in enumerate([0, 1, 2, 3, 2, 3]):  # the norms of the units (pre-norm: one per entry)
        if u:
            assert torch.equal(
                new[f"encoder.history.norms.{u}.weight"], old[f"encoder.history.norms.{src}.weight"]
            )
    w_old, w_new = old["encoder.history.weight"], new["encoder.history.weight"]
    assert w_new.shape == (6, 6)
    assert torch.equal(
        w_new[:3, :3], w_old[:3, :3]
    )  # the rows of the old layers keep their weights
    for r in range(3, 6):  # new rows (the old readout row included): the paper's average
        assert torch.allclose(w_new[r, : r + 1], torch.full((r + 1,), 1 / (r + 1)))
    assert torch.equal(
        new["decoder.history.weight"], old["decoder.history.weight"]
    )  # decoder not grown


def test_transparent_weights_keep_each_entry_share(tmp_path):
    model, task = save_tiny("transformer_ta", layers(2), tmp_path / "in.pt")
    with torch.no_grad():
        w = model.encoder.transparent_attention.weight
        w.copy_(torch.randn(w.shape))  # a trained model's weights, not the uniform start
    state = torch.load(tmp_path / "in.pt", weights_only=True)
    state["model"] = model.state_dict()
    torch.save(state, tmp_path / "in.pt")
    grow(str(tmp_path / "in.pt"), str(tmp_path / "out.pt"), 4, 3, "stack")
    grown = load(tmp_path / "out.pt", task)
    s_old = model.encoder.transparent_attention.weights()
    s_new = grown.encoder.transparent_attention.weights()
    assert s_new.shape == (5, 3)
    # units 0, 1, 2 -> 0, 1, 2, 1, 2 (entry 0 the embedding); decoder layers 0, 1 -> 0, 1, 1
    for j, c in enumerate([0, 1, 1]):
        torch.testing.assert_close(s_new[[1, 3], j].sum(), s_old[1, c])
        torch.testing.assert_close(s_new[[2, 4], j].sum(), s_old[2, c])
        torch.testing.assert_close(s_new[0, j], s_old[0, c])


@pytest.mark.parametrize("constants", ["new", "keep"])
def test_deepnorm_constants(constants, tmp_path):
    """DeepNorm's alpha depends on N and M: with the new depth's constants (the default) every
    copied layer computes LN(alpha' x + G(x)), another function than the shallow layer; with
    ``keep`` the grown bottom layers compute exactly what the shallow ones did."""
    model, task = save_tiny("transformer_deepnorm", layers(2), tmp_path / "in.pt")
    summary = grow(
        str(tmp_path / "in.pt"),
        str(tmp_path / "out.pt"),
        6,
        4,
        "stack",
        deepnorm_constants=constants,
    )
    grown = load(tmp_path / "out.pt", task)
    depths = (6, 4) if constants == "new" else (2, 2)
    for side in ("encoder", "decoder"):
        alpha = deepnorm_constants(side, *depths)[0]
        assert all(
            abs(layer.deepnorm_alpha - alpha) < 1e-12 for layer in getattr(grown, side).layers
        )
    x = torch.randn(5, 2, 16)
    with torch.no_grad():
        same = torch.equal(grown.encoder.layers[0](x, None), model.encoder.layers[0](x, None))
    assert same == (constants == "keep")
    assert bool(summary["notes"]) == (constants == "new")


def test_admin_and_rezero_parameters_travel_with_their_layer(tmp_path):
    model, task = save_tiny("transformer_admin", layers(2), tmp_path / "in.pt")
    with torch.no_grad():
        for i, layer in enumerate(model.encoder.layers):
            layer.admin_omega.fill_(i + 2.0)
            layer.admin_profiled.fill_(True)
    state = torch.load(tmp_path / "in.pt", weights_only=True)
    state["model"] = model.state_dict()
    torch.save(state, tmp_path / "in.pt")
    grow(str(tmp_path / "in.pt"), str(tmp_path / "out.pt"), 4, None, "stack")
    grown = load(tmp_path / "out.pt", task)
    assert [float(l.admin_omega[0, 0]) for l in grown.encoder.layers] == [2.0, 3.0, 2.0, 3.0]
    assert all(bool(l.admin_profiled) for l in grown.encoder.layers)  # not profiled again
    _, task = save_tiny("transformer_rezero", layers(2), tmp_path / "rz.pt")
    grow(str(tmp_path / "rz.pt"), str(tmp_path / "rz4.pt"), 4, None, "identity")
    assert [float(l.rezero_alpha) for l in load(tmp_path / "rz4.pt", task).encoder.layers][2:] == [
        0.0,
        0.0,
    ]


def test_recurrent_stacks_keep_their_roles(tmp_path):
    """Deep-Att's interleaved directions and RNMT+'s first layer (another input width) and
    residual connections (from layer 3) hold in the grown stacks."""
    _, task = save_tiny("deep_att", layers(3, 2), tmp_path / "da.pt")
    grow(str(tmp_path / "da.pt"), str(tmp_path / "da6.pt"), 6, 4, "interleave")
    grown = load(tmp_path / "da6.pt", task)
    for c, column in enumerate(grown.encoder.columns):
        assert [layer.reverse for layer in column.layers] == [(k + c) % 2 == 1 for k in range(6)]
    _, task = save_tiny("rnmt_plus", layers(2), tmp_path / "rn.pt")
    summary = grow(str(tmp_path / "rn.pt"), str(tmp_path / "rn5.pt"), 5, 4, "stack")
    origin = summary["origin"]
    # layers 2+ have a residual connection, layers 0-1 not: layer 2 copies layer 1? no: its role
    # differs (residual), so the nearest layer of its role... none: it is initialised
    assert origin["encoder.layers.2.weight_ih"].startswith("initialised")
    assert origin["encoder.layers.1.weight_ih"] == "copied from encoder.layers.1.weight_ih"
    assert origin["decoder.layers.3.weight_ih"].startswith("initialised")


def test_depth_named_arch_becomes_depth_free(tmp_path):
    _, task = save_tiny(
        "transformer_dlcl_postnorm_12l", ["--decoder-layers", "1"], tmp_path / "in.pt"
    )
    summary = grow(str(tmp_path / "in.pt"), str(tmp_path / "out.pt"), 14, None, "stack")
    assert summary["grown_arch"] == "transformer_dlcl_postnorm"
    state = torch.load(tmp_path / "out.pt", weights_only=True)
    assert (
        state["cfg"]["model"].arch == "transformer_dlcl_postnorm"
        and state["cfg"]["model"].encoder_layers == 14
    )
    assert (
        state["last_optimizer_state"] is None
        and state["extra_state"]["grown"][-1]["method"] == "stack"
    )
    assert len(load(tmp_path / "out.pt", task).encoder.layers) == 14


def test_freeze_bottom_layers():
    model, _ = build_model("transformer_dlcl", layers(4, 3))
    frozen = freeze_bottom_layers(model, "2,1")
    assert frozen > 0
    for name, p in model.named_parameters():
        bottom = any(
            name.startswith(p_)
            for p_ in ("encoder.layers.0.", "encoder.layers.1.", "decoder.layers.0.")
        )
        assert p.requires_grad != bottom, name
    with pytest.raises(UserError, match="fewer than the 5"):
        freeze_bottom_layers(build_model("transformer_dlcl", layers(4, 3))[0], "5")
    with pytest.raises(UserError, match="takes N or N,M"):
        freeze_bottom_layers(model, "two")


# -- bad input: one line -----------------------------------------------------------------------------


def run_grow(*argv):
    env = {k: v for k, v in os.environ.items() if k != "FAIRSEQ_DEEP_TRACEBACK"}
    return run_cli(
        sys.executable,
        "-m",
        "fairseq_deep.grow",
        *map(str, argv),
        env={**env, "OMP_NUM_THREADS": "1"},
        timeout=300,
        check=False,
    )


def assert_one_line(proc, *fragments):
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("fairseq-deep-grow: error: "), last
    for fragment in fragments:
        assert fragment in last, (fragment, last)


def test_bad_input_through_the_script(tmp_path):
    save_tiny("transformer_dlcl", layers(3), tmp_path / "in.pt")
    assert_one_line(
        run_grow(
            "--checkpoint", tmp_path / "in.pt", "--out", tmp_path / "o.pt", "--encoder-layers", "2"
        ),
        "--encoder-layers 2 is smaller than the checkpoint's 3 encoder layers",
    )
    (tmp_path / "notes.txt").write_text("not a checkpoint\n")
    assert_one_line(
        run_grow(
            "--checkpoint",
            tmp_path / "notes.txt",
            "--out",
            tmp_path / "o.pt",
            "--encoder-layers",
            "4",
        ),
        "notes.txt is not a checkpoint",
    )
    # issue 32: a cut checkpoint is called what fairseq-deep-generate calls it
    data = (tmp_path / "in.pt").read_bytes()
    (tmp_path / "cut.pt").write_bytes(data[: len(data) // 2])
    assert_one_line(
        run_grow(
            "--checkpoint", tmp_path / "cut.pt", "--out", tmp_path / "o.pt", "--encoder-layers", "4"
        ),
        "cut.pt",
        "is not a complete checkpoint",
        "probably truncated",
    )
    assert not (tmp_path / "o.pt").exists()


def test_bad_input(tmp_path):
    from fairseq_deep.grow import GrowError

    save_tiny("transformer_dlcl", layers(2), tmp_path / "in.pt")
    state = torch.load(tmp_path / "in.pt", weights_only=True)
    other = dict(
        state,
        cfg={**state["cfg"], "common": {**state["cfg"]["common"], "user_dir": "/opt/other_plugin"}},
    )
    model_args = vars(other["cfg"]["model"]).copy()
    model_args.update(arch="other_transformer", _name="other_transformer")
    other["cfg"]["model"] = type(state["cfg"]["model"])(**model_args)
    torch.save(other, tmp_path / "other.pt")
    with pytest.raises(UserError, match="--arch other_transformer.*--user-dir /opt/other_plugin"):
        grow(str(tmp_path / "other.pt"), str(tmp_path / "o.pt"), 4)
    model_args.update(
        arch="transformer", _name="transformer"
    )  # fairseq's own: not a family of ours
    other["cfg"]["model"] = type(state["cfg"]["model"])(**model_args)
    torch.save(other, tmp_path / "fairseq.pt")
    with pytest.raises(
        GrowError, match="fairseq's own --arch transformer.*e.g. --arch transformer_postnorm"
    ):
        grow(str(tmp_path / "fairseq.pt"), str(tmp_path / "o.pt"), 4)
    model_args.update(
        arch="lstm", _name="lstm"
    )  # issue 32: not a Transformer of ours for fairseq's lstm
    other["cfg"]["model"] = type(state["cfg"]["model"])(**model_args)
    torch.save(other, tmp_path / "lstm.pt")
    with pytest.raises(
        GrowError,
        match=r"fairseq's own --arch lstm.*\(e.g. --arch deep_att or rnmt_plus, nearest to fairseq's "
        r"lstm\)$",
    ):
        grow(str(tmp_path / "lstm.pt"), str(tmp_path / "o.pt"), 4)
    torch.save({"encoder.weight": torch.zeros(2)}, tmp_path / "weights.pt")
    with pytest.raises(UserError, match="is not a fairseq checkpoint"):
        grow(str(tmp_path / "weights.pt"), str(tmp_path / "o.pt"), 4)
    with pytest.raises(UserError, match="no such checkpoint file"):
        grow(str(tmp_path / "none.pt"), str(tmp_path / "o.pt"), 4)
    with pytest.raises(UserError, match="--method"):
        grow(str(tmp_path / "in.pt"), str(tmp_path / "o.pt"), 4, method="double")


def test_a_part_without_a_growth_rule_is_refused(tmp_path, monkeypatch):
    """Growth is declared by each family (``grows`` of its declaration, models/families.py) and
    stack (modules/common/growth.py): a family that does not grow or a stack that declares no rule is
    refused in one line, before anything is written."""
    from dataclasses import replace

    from fairseq_deep.grow import GrowError
    from fairseq_deep.models.transformer_stack import HistoryTransformerEncoder
    from fairseq_deep.modules.common.growth import STACKS

    save_tiny("transformer_dlcl", layers(2), tmp_path / "in.pt")
    with monkeypatch.context() as m:
        declared = families.get("transformer_dlcl")
        m.setitem(families._FAMILIES, "transformer_dlcl", replace(declared, grows=False))
        with pytest.raises(
            GrowError,
            match=r"^the family transformer_dlcl \(TransformerDLCLModel\) declares no "
            r"growth rule: [^\n]*$",
        ):
            grow(str(tmp_path / "in.pt"), str(tmp_path / "o.pt"), 4)
    with monkeypatch.context() as m:
        m.delitem(STACKS.declared, HistoryTransformerEncoder)
        with pytest.raises(
            GrowError,
            match=r"^the encoder of this model \(HistoryTransformerEncoder\) declares no "
            r"growth rule[^\n]*$",
        ):
            grow(str(tmp_path / "in.pt"), str(tmp_path / "o.pt"), 4)
    assert not (tmp_path / "o.pt").exists()


# -- through the real scripts: train shallow, grow, train with the bottom frozen, resume, decode -----

E2E = [
    ("transformer_dlcl", TINY, ["--share-all-embeddings"], 2, 4, "stack"),
    ("rnmt_plus", TINY_RNMT, [], 2, 3, "interleave"),
]


@pytest.mark.parametrize("arch,tiny,extra,shallow,deep,method", E2E, ids=[a for a, *_ in E2E])
def test_grown_checkpoint_trains_resumes_and_decodes(
    arch, tiny, extra, shallow, deep, method, synthetic_bin, tmp_path
):
    common = [
        str(synthetic_bin),
        "--arch",
        arch,
        *tiny,
        *extra,
        "--decoder-layers",
        "2",
        "--optimizer",
        "adam",
        "--lr",
        "0.002",
        "--max-tokens",
        "2000",
        "--seed",
        "1",
        "--cpu",
        "--num-workers",
        "0",
        "--no-progress-bar",
        "--log-interval",
        "1",
        "--no-epoch-checkpoints",
    ]
    run_cli(
        "fairseq-deep-train",
        *common,
        "--encoder-layers",
        str(shallow),
        "--max-update",
        "3",
        "--save-dir",
        str(tmp_path / "shallow"),
    )
    grown = tmp_path / "grown.pt"
    proc = run_cli(
        sys.executable,
        "-m",
        "fairseq_deep.grow",
        "--checkpoint",
        str(tmp_path / "shallow" / "checkpoint_last.pt"),
        "--out",
        str(grown),
        "--encoder-layers",
        str(deep),
        "--method",
        method,
    )
    assert f"--encoder-layers {deep}" in proc.stdout and "--restore-file" in proc.stdout
    deep_args = [
        *common,
        "--encoder-layers",
        str(deep),
        "--task",
        "translation_deep",
        "--freeze-grown-from",
        str(shallow),
        "--save-dir",
        str(tmp_path / "deep"),
    ]
    run_cli(
        "fairseq-deep-train",
        *deep_args,
        "--max-update",
        "2",
        "--restore-file",
        str(grown),
        "--reset-optimizer",
        "--reset-lr-scheduler",
        "--reset-dataloader",
    )
    before = torch.load(grown, weights_only=True)["model"]
    after = torch.load(tmp_path / "deep" / "checkpoint_last.pt", weights_only=True)
    assert after["optimizer_history"][-1]["num_updates"] == 2  # the schedule restarted from 0
    for key, value in before.items():
        if key.startswith("encoder.layers."):
            frozen = int(key.split(".")[2]) < shallow
            assert (
                torch.equal(after["model"][key], value) == frozen or not value.is_floating_point()
            ), key
    run_cli("fairseq-deep-train", *deep_args, "--max-update", "4")  # resumes checkpoint_last.pt
    resumed = torch.load(tmp_path / "deep" / "checkpoint_last.pt", weights_only=True)
    assert resumed["optimizer_history"][-1]["num_updates"] == 4
    out = run_cli(
        "fairseq-deep-generate",
        str(synthetic_bin),
        "--path",
        str(tmp_path / "deep" / "checkpoint_last.pt"),
        "--gen-subset",
        "test",
        "--beam",
        "2",
        "--batch-size",
        "32",
        "--cpu",
    ).stdout
    assert sum(line.startswith("H-") for line in out.splitlines()) == 101


# -- fairseq-deep-study --group li ----------------------------------------------------------------


def test_study_li_group_stages(tmp_path):
    from fairseq_deep import study

    baseline, systems = study.expand_group("li", [6, 12, 18])
    assert baseline == "dlcl_18"
    assert [(s.name, s.stages, s.depth) for s in systems] == [
        ("dlcl_6", [], 6),
        ("dlcl_18", [], 18),
        ("dlcl_6_12_18", [6, 12], 18),
    ]
    with pytest.raises(UserError, match="two depths"):
        study.expand_group("li", [6])
    args = study.get_parser().parse_args(
        [
            "--data",
            str(tmp_path),
            "--out",
            str(tmp_path),
            "--group",
            "li",
            "--minutes",
            "30",
            "--max-update",
            "300",
            "--cpu",
        ]
    )
    args.train_args_list, args.gen_args_list = [], []
    run_dir = str(tmp_path / "run")
    steps, final = study.stage_commands(args, systems[2], 1, run_dir)
    assert [name for name, _, _ in steps] == ["stage_6", "grow_12", "stage_12", "grow_18"]

    def value(cmd, option):  # fairseq keeps the last value of a repeated option
        return [cmd[i + 1] for i, a in enumerate(cmd) if a == option][-1]

    stage6, stage12 = steps[0][1], steps[2][1]
    assert value(stage6, "--encoder-layers") == "6" and "--restore-file" not in stage6
    assert value(stage12, "--encoder-layers") == "12" and value(stage12, "--restore-file").endswith(
        "grown_12.pt"
    )
    assert value(final, "--encoder-layers") == "18" and value(final, "--restore-file").endswith(
        "grown_18.pt"
    )
    assert {"--reset-optimizer", "--reset-lr-scheduler", "--reset-dataloader"} <= set(final)
    # the stages share the budget: a third of the updates each, the training time cumulative
    assert [value(c, "--max-update") for c in (stage6, stage12, final)] == ["100"] * 3
    assert [
        float(value(c, "--stop-time-hours")) for c in (stage6, stage12, final)
    ] == pytest.approx([1 / 6, 2 / 6, 3 / 6], abs=1e-5)
    # equal time: the grown checkpoints keep the stages' training time (fairseq-deep-grow's default resets it)
    assert (
        steps[1][1][-3:] == ["--method", "stack", "--keep-training-time"]
        and value(steps[1][1], "--encoder-layers") == "12"
    )
    os.makedirs(run_dir)
    open(
        os.path.join(run_dir, "checkpoint_last.pt"), "w"
    ).close()  # interrupted: fairseq resumes its own
    assert "--restore-file" not in study.stage_commands(args, systems[2], 1, run_dir)[1]
