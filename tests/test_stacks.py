"""Issue 23: one package on both fairseq stacks (the official fairseq 0.12.2 of Python <= 3.10,
ve-fairseq 0.12.3 of Python >= 3.11; CI runs this file on both).

fairseq 0.12.2's encoder layer has a "BetterTransformer" fast path: eight fused parameter copies
per layer and, after a state dict was loaded, a fused kernel in eval mode that our stacks would
feed wrongly (decoding then depends on the batch size, or crashes).
``modules.common.better_transformer.without_better_transformer`` takes it out of every encoder layer the
package builds.  What must hold on either stack:

* every parameter gets a gradient (torch DDP without ``--find-unused-parameters``), and none is a
  fused copy (the same parameter count on both stacks);
* a checkpoint of either stack loads strictly on the other and computes the same thing: one
  written on 0.12.2 holds the fused copies and the ``_float_tensor`` buffer of sinusoidal
  positions, one written on later fairseq holds neither;
* a model loaded from a state dict (what fairseq-generate does) translates a sentence the same
  alone or in a padded batch, in-process and through the real fairseq-train / fairseq-generate.
"""

import re
import sys

import pytest
import torch
from fairseq.modules import SinusoidalPositionalEmbedding
from fairseq.modules.transformer_layer import TransformerEncoderLayerBase
from fairseq.sequence_generator import SequenceGenerator
from helpers import PLUGIN_DIR, TINY, build_family, dtype_marker, random_batch, run_cli

from benchmarks import precision_matrix
from benchmarks.precision_matrix import FAMILIES  # every tiny configuration of every family
from fairseq_deep.models import families
from fairseq_deep.modules.common.better_transformer import BETTER_TRANSFORMER_PARAMS

# post-norm encoders: the ones 0.12.2's fast path would take (plus a pre-norm one for contrast),
# and the stream-level schemes (issue 41), whose layers carry several streams or run twice
_POST_NORM = [
    "transformer_ta",
    "transformer_dlcl_postnorm",
    "transformer_rezero",
    "transformer_deepnorm",
    "transformer_admin",
    "hybrid_transformer_rnmt",
    "transformer_dlcl",
    "transformer_denseformer",
    "transformer_hc",
    "transformer_mhc",
    "transformer_resi_dual",
    "transformer_ode_rk2",
    # issue 41's per-layer schemes, post- and pre-norm
    *("transformer_b2t", "transformer_subln", "transformer_periln", "transformer_mixln"),
    *("transformer_dyt", "transformer_layerscale"),
]


def post_norm():
    """The rows above, and the first tiny configuration of every family with Transformer layers
    that none of them is of (models/families.py)."""
    rows = precision_matrix.rows()
    return families.cover(
        _POST_NORM,
        arch=lambda name: rows[name][1],
        default=lambda family, tiny: tiny.name,
        applies=lambda family: family.transformer_layers,
    )


POST_NORM = post_norm()


def build(family, seed=0):
    return build_family(FAMILIES[family], seed)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_parameter_gets_a_gradient_and_none_is_a_fused_copy(family):
    model, d = build(family)
    model.train()
    src, lengths, prev = random_batch(d)
    out = model(src, lengths, prev)
    model.get_normalized_probs(out, log_probs=True).sum().backward()
    unused = [n for n, p in model.named_parameters() if p.grad is None]
    assert not unused, f"parameters without a gradient (DDP would stop): {unused}"
    fused = [
        n for n, _ in model.named_parameters() if n.rsplit(".", 1)[-1] in BETTER_TRANSFORMER_PARAMS
    ]
    assert not fused, fused


def as_written_by_fairseq_0_12_2(model, state):
    """``state`` as fairseq 0.12.2 saves it: the fused copies of every fairseq encoder layer (zeros,
    as a model trained from scratch holds them) and the ``_float_tensor`` of sinusoidal positions."""
    state = dict(state)
    for name, module in model.named_modules():
        if isinstance(module, TransformerEncoderLayerBase):
            attn, fc1, fc2 = module.self_attn, module.fc1, module.fc2
            shapes = {
                "in_proj_weight": (3 * attn.q_proj.out_features, attn.q_proj.in_features),
                "in_proj_bias": (3 * attn.q_proj.out_features,),
                "out_proj_weight": tuple(attn.out_proj.weight.shape),
                "out_proj_bias": tuple(attn.out_proj.bias.shape),
                "fc1_weight": tuple(fc1.weight.shape),
                "fc1_bias": tuple(fc1.bias.shape),
                "fc2_weight": tuple(fc2.weight.shape),
                "fc2_bias": tuple(fc2.bias.shape),
            }
            state.update({f"{name}.{k}": torch.zeros(s) for k, s in shapes.items()})
        if isinstance(module, SinusoidalPositionalEmbedding):
            state[f"{name}._float_tensor"] = torch.FloatTensor(1)
    return state


def as_written_by_later_fairseq(state):
    return {k: v for k, v in state.items() if not dtype_marker(k)}


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("writer", ["fairseq-0.12.2", "later-fairseq"])
def test_a_checkpoint_of_either_stack_loads_and_computes_the_same(family, writer):
    model, d = build(family, seed=0)
    state = model.state_dict()
    saved = (
        as_written_by_fairseq_0_12_2(model, state)
        if writer == "fairseq-0.12.2"
        else as_written_by_later_fairseq(state)
    )
    fresh, _ = build(family, seed=1)
    fresh.load_state_dict(saved, strict=True)  # fairseq's route: its upgrade_state_dict first
    model.eval(), fresh.eval()
    src, lengths, prev = random_batch(d)
    with torch.no_grad():
        torch.testing.assert_close(
            fresh(src, lengths, prev)[0], model(src, lengths, prev)[0], rtol=0, atol=0
        )


def _sentences(d, n=7, seed=3):
    g = torch.Generator().manual_seed(seed)
    return [
        torch.cat(
            [
                torch.randint(d.nspecial, len(d), (int(length),), generator=g),
                torch.tensor([d.eos()]),
            ]
        )
        for length in torch.randint(1, 9, (n,), generator=g)
    ]


def _translate(model, d, sentences):
    """fairseq's beam search over one left-padded batch (fairseq's translation task pads sources
    on the left): [(tokens, score)] per sentence."""
    width = max(len(s) for s in sentences)
    src = torch.full((len(sentences), width), d.pad())
    for i, s in enumerate(sentences):
        src[i, width - len(s) :] = s
    sample = {
        "net_input": {"src_tokens": src, "src_lengths": torch.tensor([len(s) for s in sentences])}
    }
    generator = SequenceGenerator([model], d, beam_size=3, max_len_a=0, max_len_b=8)
    with torch.no_grad():
        hyps = generator.generate([model], sample)
    return [(h[0]["tokens"].tolist(), float(h[0]["score"])) for h in hyps]


@pytest.mark.parametrize("family", POST_NORM)
def test_a_loaded_model_translates_the_same_alone_and_in_a_padded_batch(family):
    model, d = build(family)
    model.load_state_dict(
        model.state_dict()
    )  # as fairseq-generate builds it: loaded from a state dict
    model.eval()
    sentences = _sentences(d)
    batched = _translate(model, d, sentences)
    alone = [_translate(model, d, [s])[0] for s in sentences]
    assert [t for t, _ in batched] == [t for t, _ in alone]
    for (_, a), (_, b) in zip(batched, alone):
        assert abs(a - b) < 1e-4, (a, b)
    # and the encoder: each sentence's states alone equal its rows of the padded batch
    width = max(len(s) for s in sentences)
    src = torch.stack([torch.cat([torch.full((width - len(s),), d.pad()), s]) for s in sentences])
    with torch.no_grad():
        full = model.encoder(src, src_lengths=torch.tensor([len(s) for s in sentences]))[
            "encoder_out"
        ][0]
        for i, s in enumerate(sentences):
            one = model.encoder(s[None], src_lengths=torch.tensor([len(s)]))["encoder_out"][0]
            torch.testing.assert_close(full[width - len(s) :, i], one[:, 0], rtol=1e-4, atol=1e-5)


def _hypotheses(log):
    return sorted(re.findall(r"^H-(\d+)\t\S+\t(.*)$", log, re.M), key=lambda h: int(h[0]))


@pytest.mark.parametrize("arch", ["transformer_ta", "transformer_dlcl_postnorm"])
def test_fairseq_generate_gives_the_same_hypotheses_at_batch_size_1_and_64(
    synthetic_bin, tmp_path, arch
):
    """The held-out failure of issue 23 through the real tools: post-norm models trained by
    fairseq-train, decoded by fairseq-generate from the checkpoint one sentence at a time and 64 at
    a time."""
    run_cli(
        sys.executable,
        "-m",
        "fairseq_cli.train",
        str(synthetic_bin),
        "--user-dir",
        PLUGIN_DIR,
        "--task",
        "translation",
        "--arch",
        arch,
        *TINY,
        "--encoder-layers",
        "3",
        "--decoder-layers",
        "2",
        "--optimizer",
        "adam",
        "--lr",
        "0.005",
        "--max-tokens",
        "1000",
        "--max-update",
        "30",
        "--save-dir",
        str(tmp_path),
        "--seed",
        "1",
        "--cpu",
        "--num-workers",
        "0",
        "--no-progress-bar",
        "--no-epoch-checkpoints",
        "--disable-validation",
    )
    logs = {}
    for batch_size in (1, 64):
        logs[batch_size] = run_cli(
            sys.executable,
            "-m",
            "fairseq_cli.generate",
            str(synthetic_bin),
            "--user-dir",
            PLUGIN_DIR,
            "--path",
            str(tmp_path / "checkpoint_last.pt"),
            "--gen-subset",
            "test",
            "--beam",
            "4",
            "--batch-size",
            str(batch_size),
            "--cpu",
            "--num-workers",
            "0",
        ).stdout
    one, many = _hypotheses(logs[1]), _hypotheses(logs[64])
    assert len(one) == 101 and one == many
