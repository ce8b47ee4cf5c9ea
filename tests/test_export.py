"""fairseq-deep-export (issue 34): the fold into fairseq's own transformer is an identity for every
family that reduces (at depths up to 100 layers), the stock checkpoint decodes in plain
fairseq-generate (no --user-dir, torch's weights-only loader) as the original model does, the
CTranslate2 model scores and translates as fairseq does (beam 1 and beam 4), every other family is
refused in one line, and bad input leaves nothing behind."""

import importlib.util
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from fairseq.models.transformer import TransformerModel
from helpers import build_model, parse_model_args, tiny_dictionary
from test_cli_errors import assert_in_process_user_error, assert_user_error, in_process
from test_grow import save_tiny

from fairseq_deep import export as ex
from fairseq_deep.grow import grow
from fairseq_deep.models import families, reduction
from fairseq_deep.models.reduction import why_not_transformer

TOLERANCE = 1e-4  # log-probabilities: float32 rounding through up to 100 + 100 layers


def layers(n, m):
    return ["--encoder-layers", str(n), "--decoder-layers", str(m)]


def randomise(model, seed=0):
    """Layer norms and Admin's omegas away from their initial 1/0, as after training."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in [*model.named_parameters(), *model.named_buffers()]:
            if "layer_norm" in name or "layernorm" in name:
                p.copy_(
                    torch.rand(p.shape, generator=g) + 0.5
                    if name.endswith("weight")
                    else torch.randn(p.shape, generator=g) * 0.1
                )
            elif name.endswith("admin_omega"):  # the profile (a buffer)
                p.copy_(torch.rand(p.shape, generator=g) * 1.5 + 0.5)
            elif name.endswith("admin_omega_learned"):  # what training learned (a parameter)
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
            elif name.endswith("layer_scale"):  # LayerScale's lambda
                p.copy_(torch.rand(p.shape, generator=g) + 0.2)


def stock_of(arch, extra):
    """(original model, fairseq's transformer with the folded parameters, notes, largest difference of
    their log-probabilities)."""
    model, task = build_model(arch, extra)
    randomise(model)
    folded, changes, notes = reduction.fold(model)
    stock = ex.stock_model(
        ex.stock_args(parse_model_args(arch, extra), changes), task, folded, "test"
    )
    return model, stock, notes, ex.max_difference(model, stock, task)


_REDUCIBLE = [  # every family that reduces, pre- and post-norm, the schemes, embeddings shared or not
    ("transformer_prenorm", layers(3, 2)),
    ("transformer_postnorm", layers(3, 2)),
    ("transformer_dlcl", ["--dlcl-stacks", "none", *layers(2, 2)]),
    ("transformer_deepnorm", [*layers(6, 3), "--share-all-embeddings"]),
    (
        "transformer_deepnorm",
        [*layers(4, 2), "--deepnorm-alpha", "2.5,0.4", "--share-decoder-input-output-embed"],
    ),
    ("transformer_deepnorm", [*layers(2, 2), "--layernorm-embedding", "--no-scale-embedding"]),
    ("transformer_admin", [*layers(6, 3), "--share-all-embeddings"]),
    ("transformer_admin", [*layers(3, 2), "--encoder-learned-pos"]),
    ("transformer_dsinit", layers(3, 2)),
    ("transformer_ta_baseline", layers(3, 2)),
    ("transformer_ta_prenorm", ["--ta-disable", *layers(2, 2)]),
    ("transformer_agg_baseline", [*layers(3, 2), "--admin"]),
    ("transformer_deepnorm", [*layers(100, 100), "--share-all-embeddings"]),
    ("transformer_admin", [*layers(100, 12), "--share-all-embeddings"]),
    ("transformer_prenorm", layers(100, 6)),
    # issue 41: LayerScale folds into out_proj and fc2 (pre- and post-norm, beside DeepNorm's
    # scales); Mix-LN at ratio 0 is pre-norm and at ratio 1 post-norm
    ("transformer_layerscale", [*layers(3, 2), "--share-all-embeddings"]),
    ("transformer_deepnorm", [*layers(3, 2), "--layerscale"]),
    ("transformer_mixln", ["--mix-ln-ratio", "0", *layers(3, 2)]),
    ("transformer_mixln", ["--mix-ln-ratio", "1", *layers(3, 2)]),
]


def _tiny_row(family, tiny):
    """(--arch, flags) of a family's tiny configuration (a row of a family no row names)."""
    return tiny.arch, [*family.tiny_sizes, *tiny.model]


def reducible():
    """The rows above, and one of every family whose rule is the residual stacks' that none of
    them is of (its first tiny configuration: models/families.py)."""
    return families.cover(
        _REDUCIBLE,
        arch=lambda row: row[0],
        default=_tiny_row,
        applies=lambda family: family.reduction is reduction.residual_stacks,
    )


REDUCIBLE = reducible()


@pytest.mark.parametrize(
    "arch,extra", REDUCIBLE, ids=[f"{a}{'_' + '_'.join(e)}" for a, e in REDUCIBLE]
)
def test_the_fold_is_an_identity(arch, extra):
    model, stock, notes, difference = stock_of(arch, extra)
    assert why_not_transformer(_family(arch), model) is None
    assert type(stock) is TransformerModel
    assert all(type(m).__module__.split(".")[0] in ("fairseq", "torch") for m in stock.modules())
    folds = any(w in " ".join([arch, *extra]) for w in ("deepnorm", "admin", "layerscale"))
    assert bool(notes) == folds, notes
    assert difference < TOLERANCE if folds else difference == 0, (
        difference
    )  # nothing folded: bit for bit


def _family(arch):
    from fairseq.models import ARCH_MODEL_NAME_REGISTRY

    return ARCH_MODEL_NAME_REGISTRY[arch]


@pytest.mark.parametrize("arch", ["transformer_deepnorm", "transformer_admin"])
def test_the_check_sees_a_scale_left_unfolded(arch, monkeypatch):
    """The identity above has teeth: the same models without the fold differ."""
    monkeypatch.setattr(
        reduction,
        "residual_scales",
        lambda layer: torch.ones(len(reduction.sublayer_names(layer)), layer.embed_dim),
    )
    assert stock_of(arch, layers(3, 2))[3] > 1e-2


def test_the_check_sees_a_layerscale_left_unfolded(monkeypatch):
    monkeypatch.setattr(reduction, "output_scales", lambda layer: [])
    assert stock_of("transformer_layerscale", layers(3, 2))[3] > 1e-2


_REFUSED = [
    ("transformer_dlcl", layers(2, 2), "DLCL: every layer reads a weighted sum"),
    ("transformer_dlcl_postnorm", ["--dlcl-stacks", "decoder", *layers(2, 2)], "(its decoder)"),
    ("transformer_ta", layers(2, 2), "transparent attention"),
    ("transformer_ta_nores", layers(2, 2), "no residual connections (--ta-no-encoder-residual)"),
    ("transformer_dense", layers(2, 2), "dense connections"),
    ("transformer_linear_agg", layers(2, 2), "linear layer aggregation"),
    ("transformer_iterative_agg", layers(2, 2), "iterative layer aggregation"),
    ("transformer_hier_agg", layers(3, 2), "hierarchical layer aggregation"),
    ("transformer_mla2", layers(2, 2), "multi-layer attention"),
    ("transformer_rezero", layers(2, 2), "ReZero"),
    ("transformer_denseformer", layers(2, 2), "DenseFormer: every block reads"),
    ("transformer_hc", layers(2, 2), "hyper-connections: n residual streams"),
    ("transformer_mhc", layers(2, 2), "hyper-connections: n residual streams"),
    ("transformer_resi_dual", layers(2, 2), "ResiDual: a post-LN stream and a dual stream"),
    ("transformer_ode_rk2", layers(2, 2), "ODE Transformer blocks evaluate each layer"),
    ("transformer_b2t", layers(2, 2), "B2T adds each layer's input"),
    ("transformer_subln", layers(2, 2), "Sub-LN (Magneto) adds a layer norm"),
    ("transformer_periln", layers(2, 2), "Peri-LN normalises each sublayer's output"),
    ("transformer_mixln", ["--mix-ln-ratio", "0.5", *layers(2, 2)], "Mix-LN: 1 of its 2 layers"),
    ("transformer_dyt", layers(2, 2), "DyT replaces every layer norm"),
    ("rnmt_plus", layers(2, 2), "RNMT+ is a recurrent model"),
    ("deep_att", layers(2, 2), "Deep-Att is a recurrent model"),
    (
        "hybrid_transformer_rnmt",
        ["--encoder-hidden-size", "8", "--decoder-hidden-size", "16", *layers(2, 2)],
        "the hybrids combine RNMT+ LSTM stacks",
    ),
]


def refused():
    """The rows above, and one of every family that never reduces (``reduction.never(why)``)
    that none of them is of: its first tiny configuration, refused with the reason it declares."""
    return families.cover(
        _REFUSED,
        arch=lambda row: row[0],
        default=lambda family, tiny: (*_tiny_row(family, tiny), family.reduction.why),
        applies=lambda family: isinstance(family.reduction, reduction.Never),
    )


REFUSED = refused()


@pytest.mark.parametrize("arch,extra,fragment", REFUSED, ids=[a for a, *_ in REFUSED])
def test_every_other_family_is_refused_with_its_reason(arch, extra, fragment):
    model, _ = build_model(arch, extra)
    why = why_not_transformer(_family(arch), model)
    assert why is not None and fragment in why, why


# -- checkpoints and the command line ------------------------------------------------------------


def tiny_export_input(tmp_path, arch, extra, name="in.pt"):
    """A tiny checkpoint of ``arch`` (its task naming src -> tgt) and a data folder with its
    dictionaries."""
    save_tiny(arch, extra, tmp_path / name)
    state = torch.load(tmp_path / name, weights_only=True)
    state["cfg"]["task"].update(source_lang="src", target_lang="tgt")
    torch.save(state, tmp_path / name)
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    for lang in ("src", "tgt"):
        tiny_dictionary().save(str(data / f"dict.{lang}.txt"))
    return tmp_path / name, data


def test_bad_input_ends_in_one_line_and_writes_nothing(tmp_path, capsys, monkeypatch):
    checkpoint, data = tiny_export_input(tmp_path, "transformer_dlcl", layers(2, 2))

    def refused(*argv, fragments=()):
        result = in_process(ex.cli_main, ["--checkpoint", *argv], capsys, monkeypatch)
        # the one line is the whole output: not after fairseq's dictionary lines (issue 40)
        assert_in_process_user_error(result, "fairseq-deep-export", *fragments, alone=True)
        assert sorted(os.listdir(tmp_path)) == before, "an export that failed left something behind"

    before = sorted(os.listdir(tmp_path))
    refused(
        checkpoint,
        "--data",
        data,
        "--out",
        tmp_path / "o",
        "--format",
        "fairseq",
        fragments=["does not reduce to fairseq's transformer: DLCL", "fairseq-deep-interactive"],
    )
    (tmp_path / "notes.txt").write_text("not a checkpoint\n")
    before = sorted(os.listdir(tmp_path))
    refused(
        tmp_path / "notes.txt",
        "--data",
        data,
        "--out",
        tmp_path / "o",
        fragments=["is not a checkpoint"],
    )
    torch.save({"encoder.weight": torch.zeros(2)}, tmp_path / "weights.pt")
    before = sorted(os.listdir(tmp_path))
    refused(
        tmp_path / "weights.pt",
        "--data",
        data,
        "--out",
        tmp_path / "o",
        fragments=["not a fairseq checkpoint"],
    )

    ours, _ = tiny_export_input(tmp_path, "transformer_postnorm", layers(2, 2), "postnorm.pt")
    state = torch.load(ours, weights_only=True)
    model_args = vars(state["cfg"]["model"])
    model_args.update(arch="transformer", _name="transformer")  # fairseq's own: not a model of ours
    torch.save(state, tmp_path / "fairseq.pt")
    before = sorted(os.listdir(tmp_path))
    refused(
        tmp_path / "fairseq.pt",
        "--data",
        data,
        "--out",
        tmp_path / "o",
        fragments=["fairseq's own --arch transformer"],
    )
    (tmp_path / "empty").mkdir()
    before = sorted(os.listdir(tmp_path))
    refused(
        ours,
        "--data",
        tmp_path / "empty",
        "--out",
        tmp_path / "o",
        fragments=["has no dict.src.txt nor dict.tgt.txt"],
    )
    refused(
        ours, "--data", tmp_path / "nowhere", "--out", tmp_path / "o", fragments=["no such folder"]
    )
    refused(ours, "--data", data, "--out", tmp_path / "empty", fragments=["--out", "exists"])
    other = tmp_path / "other"
    other.mkdir()
    for lang in ("src", "tgt"):
        tiny_dictionary(7).save(str(other / f"dict.{lang}.txt"))
    before = sorted(os.listdir(tmp_path))
    refused(
        ours, "--data", other, "--out", tmp_path / "o", fragments=["embeds 24 symbols", "has 11"]
    )
    refused(
        ours,
        "--data",
        data,
        "--out",
        tmp_path / "o",
        "--format",
        "fairseq",
        "--quantization",
        "int8",
        fragments=["--quantization applies to --format ctranslate2"],
    )
    # the timing's decoding settings (--format ctranslate2), before any work
    if importlib.util.find_spec("ctranslate2") is not None:
        for option, value in (
            ("--timing-beam", "0"),
            ("--timing-max-len-b", "-1"),
            ("--timing-batch-size", "0"),
        ):
            refused(
                ours,
                *["--data", data, "--out", tmp_path / "o", option, value],
                fragments=[f"{option} {value}: give at least"],
            )
    # argparse's own errors too: one line, not after its usage block
    refused(ours, "--data", data, fragments=["the following arguments are required: --out"])


def test_an_export_prints_its_summary_alone(tmp_path, capsys, monkeypatch):
    """Issue 40: the one line of a good export is its whole output (no INFO lines of fairseq's
    task and dictionaries before it)."""
    checkpoint, data = tiny_export_input(tmp_path, "transformer_postnorm", layers(2, 2))
    argv = [
        "--checkpoint",
        checkpoint,
        "--data",
        data,
        "--out",
        tmp_path / "o",
        "--format",
        "fairseq",
    ]
    status, out, err = in_process(ex.cli_main, argv, capsys, monkeypatch)
    assert status == 0, err[-3000:]
    assert err == "" and out.count("\n") == 1, (out, err[-3000:])
    assert out.startswith(
        f"{tmp_path / 'o'}: fairseq transformer checkpoint of transformer_postnorm"
    )


def test_the_script_in_its_own_process(tmp_path):
    """One run as a user runs it: a refusal is one line on stderr, exit status 2."""
    checkpoint, data = tiny_export_input(tmp_path, "transformer_rezero", layers(2, 2))
    env = {k: v for k, v in os.environ.items() if k != "FAIRSEQ_DEEP_TRACEBACK"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "fairseq_deep.export",
            "--checkpoint",
            str(checkpoint),
            "--data",
            str(data),
            "--out",
            str(tmp_path / "o"),
        ],
        capture_output=True,
        text=True,
        env={**env, "OMP_NUM_THREADS": "1"},
        timeout=300,
    )
    assert_user_error(proc, "fairseq-deep-export", "ReZero", "fairseq-deep-interactive", alone=True)
    assert not (tmp_path / "o").exists()


def test_a_grown_model_exports_when_its_family_does(tmp_path):
    checkpoint, data = tiny_export_input(tmp_path, "transformer_admin", layers(2, 2))
    state = torch.load(checkpoint, weights_only=True)
    with torch.no_grad():  # as after the first training batch: omega profiled, not 1
        for key in state["model"]:
            if key.endswith("admin_omega"):
                state["model"][key].uniform_(0.5, 2.0)
            elif key.endswith("admin_profiled"):
                state["model"][key].fill_(True)
    torch.save(state, checkpoint)
    grow(str(checkpoint), str(tmp_path / "grown.pt"), 4, 3, "stack")
    summary = ex.export(str(tmp_path / "grown.pt"), str(data), str(tmp_path / "out"), "fairseq")
    assert summary["grown"][-1]["encoder_layers"] == [2, 4] and summary["folded"]
    assert summary["max_logprob_difference"] < TOLERANCE
    assert sorted(os.listdir(tmp_path / "out")) == [
        "dict.src.txt",
        "dict.tgt.txt",
        ex.SUMMARY,
        ex.STOCK_CHECKPOINT,
    ]
    saved = torch.load(
        tmp_path / "out" / ex.STOCK_CHECKPOINT, weights_only=True
    )  # plain types only
    assert (
        saved["cfg"]["model"]["arch"] == "transformer"
        and saved["cfg"]["model"]["encoder_layers"] == 4
    )
    assert (
        saved["cfg"]["common"]["user_dir"] is None
        and saved["cfg"]["task"]["_name"] == "translation"
    )
    hub = TransformerModel.from_pretrained(
        str(tmp_path / "out"), checkpoint_file=ex.STOCK_CHECKPOINT
    )
    assert type(hub.models[0]) is TransformerModel and isinstance(
        hub.translate("w1 w2 w3", beam=2), str
    )


def test_the_record_names_grown_continued_and_averaged(synthetic_bin, tmp_path):
    """grow -> continue training (--restore-file, resets) -> resume -> average -> export: the
    export's record names the growth, the continued run and the averaged inputs (fairseq-train
    saves a fresh extra_state: patches/checkpoint_history keeps the history)."""
    from fairseq.data import Dictionary
    from test_grow_families import fairseq_train, save_shallow, train_config

    from fairseq_deep.average_checkpoints import average_checkpoints
    from fairseq_deep.model_options import model_command

    dictionary = Dictionary.load(str(synthetic_bin / "dict.src.txt"))
    shallow, grown = tmp_path / "shallow.pt", tmp_path / "grown.pt"
    save_shallow("transformer_prenorm", layers(1, 1), dictionary, shallow)  # 7 updates
    options = grow(str(shallow), str(grown), 2, 1, "stack")["model_options"]
    save = tmp_path / "deep"
    cfg = train_config(
        [
            str(synthetic_bin),
            "--user-dir",
            os.path.dirname(os.path.abspath(ex.__file__)),
            "--task",
            "translation",
            *model_command(options),
            *["--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "400", "--seed", "1"],
            *["--cpu", "--num-workers", "0", "--no-progress-bar", "--disable-validation"],
            *["--no-epoch-checkpoints", "--save-dir", str(save), "--max-update", "2"],
            *["--restore-file", str(grown), "--reset-optimizer", "--reset-lr-scheduler"],
            "--reset-dataloader",
        ]
    )
    fairseq_train(cfg)
    shutil.copyfile(save / "checkpoint_last.pt", tmp_path / "after2.pt")
    fairseq_train(  # the same run resumed from its own checkpoint_last.pt: nothing added
        cfg,
        checkpoint__restore_file="checkpoint_last.pt",
        checkpoint__reset_optimizer=False,
        checkpoint__reset_lr_scheduler=False,
        checkpoint__reset_dataloader=False,
        optimization__max_update=3,
    )
    inputs = [str(save / "checkpoint_last.pt"), str(tmp_path / "after2.pt")]
    torch.save(average_checkpoints(inputs), tmp_path / "average.pt")

    summary = ex.export(
        str(tmp_path / "average.pt"), str(synthetic_bin), str(tmp_path / "out"), "fairseq"
    )
    assert summary == json.loads((tmp_path / "out" / ex.SUMMARY).read_text())
    [growth] = summary["grown"]
    assert growth["from"] == str(shallow) and growth["encoder_layers"] == [1, 2]
    assert summary["continued"] == [
        {
            "from": str(grown),
            "num_updates": 7,  # the grown checkpoint's (the shallow model's)
            "save_dir": str(save),
            "reset": ["dataloader", "lr_scheduler", "optimizer"],
        }
    ]
    assert summary["averaged"] == [{"inputs": inputs, "num_updates": [3, 2]}]


# -- CTranslate2: its scores are fairseq's, for each kind of fold --------------------------------


@pytest.mark.parametrize(
    "arch,extra",
    [
        ("transformer_prenorm", layers(3, 2)),
        ("transformer_deepnorm", [*layers(3, 2), "--share-all-embeddings"]),
        ("transformer_admin", layers(3, 2)),
        ("transformer_layerscale", layers(3, 2)),
        ("transformer_mixln", ["--mix-ln-ratio", "1", *layers(3, 2)]),  # post-norm at last
    ],
)
def test_ctranslate2_scores_equal_fairseqs(arch, extra, tmp_path):
    ctranslate2 = pytest.importorskip("ctranslate2")
    checkpoint, data = tiny_export_input(tmp_path, arch, extra)
    state = torch.load(checkpoint, weights_only=True)
    model, task = build_model(arch, extra)
    randomise(model)
    state["model"] = model.state_dict()
    torch.save(state, checkpoint)
    ex.export(str(checkpoint), str(data), str(tmp_path / "ct2"))
    config = json.loads((tmp_path / "ct2" / "config.json").read_text())
    assert (
        config["add_source_eos"] and config["decoder_start_token"] == "</s>"
    )  # fairseq's source + </s>
    d = task.source_dictionary
    g = torch.Generator().manual_seed(3)
    sources = [torch.randint(d.nspecial, len(d), (n,), generator=g).tolist() for n in (3, 6, 9)]
    targets = [torch.randint(d.nspecial, len(d), (n,), generator=g).tolist() for n in (4, 2, 7)]
    translator = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu", intra_threads=1)
    scored = translator.score_batch(
        [[d[i] for i in s] for s in sources], [[d[i] for i in t] for t in targets]
    )
    for s, t, result in zip(sources, targets, scored):
        src = torch.tensor([s + [d.eos()]])
        prev = torch.tensor([[d.eos()] + t])
        with torch.no_grad():
            lprobs = model(src, torch.tensor([len(s) + 1]), prev)[0].log_softmax(-1)[0]
        expected = lprobs.gather(1, torch.tensor(t + [d.eos()])[:, None])[:, 0]
        assert result.tokens[-1] == "</s>"
        torch.testing.assert_close(torch.tensor(result.log_probs), expected, atol=1e-4, rtol=0)


# -- a trained model, through the real fairseq-generate and CTranslate2 -------------------------


def test_parts_that_state_nothing_are_refused():
    """A new history, or a layer whose residual connection states no scale, is not taken for the
    residual network: refused, not exported wrong."""
    from fairseq_deep.modules.histories.layer_history import LayerHistory
    from fairseq_deep.modules.schemes import residual_schemes

    class DoubledResidual:  # a new residual scheme, mixed in as apply_schemes does
        def residual_connection(self, x, residual):
            return 2 * residual + x

    model, _ = build_model("transformer_postnorm", layers(2, 2))
    assert why_not_transformer("transformer_dlcl", model) is None
    residual_schemes._mix(model.encoder.layers[1], DoubledResidual)
    assert (
        "(DoubledTransformerEncoderLayerBase) have a residual connection of their own"
        in why_not_transformer("transformer_dlcl", model)
    )
    model, _ = build_model("transformer_postnorm", layers(2, 2))
    model.decoder.history.__class__ = type("NewHistory", (LayerHistory,), {})
    assert (
        why_not_transformer("transformer_dlcl", model)
        == "a combination of earlier layers (its decoder)"
    )
