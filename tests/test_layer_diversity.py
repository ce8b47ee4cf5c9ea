"""The layer-diversity criterion (Dou et al. 2018, Eq. 9-10): its value against a naive loop with
padding excluded, its sign, its gradient reaching the layers, and the one layer-state interface
on every model of the package."""

import math

import pytest
import torch
from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion
from fairseq.logging import metrics
from fairseq.models import ARCH_MODEL_REGISTRY
from helpers import build_model, random_batch, tiny_dictionary

from fairseq_deep.criterions.layer_diversity import (
    LayerDiversityCriterion,
    LayerStates,
    forward_with_layer_states,
    layer_diversity,
)


def naive_diversity(states, padding_mask):
    """Eq. 10 word for word: 1/(L-1) sum_l 1/N sum_n (1 - cos^2(h^l_n, h^{l+1}_n)), n non-padding."""
    T, B = states[0].shape[:2]
    total = 0.0
    for l in range(len(states) - 1):
        d, n = 0.0, 0
        for t in range(T):
            for b in range(B):
                if padding_mask is not None and padding_mask[b, t]:
                    continue
                u, v = states[l][t, b].double(), states[l + 1][t, b].double()
                cos = float(u @ v) / (math.sqrt(float(u @ u)) * math.sqrt(float(v @ v)))
                d += 1 - cos**2
                n += 1
        total += d / n
    return total / (len(states) - 1)


def test_diversity_equals_naive_computation_with_padding_excluded():
    g = torch.Generator().manual_seed(0)
    states = [torch.randn(6, 3, 8, generator=g) for _ in range(4)]
    pad = torch.zeros(3, 6, dtype=torch.bool)
    pad[1, 4:] = True
    pad[2, :2] = True
    value = layer_diversity(LayerStates(states, pad))
    assert abs(value.item() - naive_diversity(states, pad)) < 1e-5
    # what sits at padding positions does not matter
    noisy = [s.clone() for s in states]
    for s in noisy:
        s[4:, 1] = torch.randn(2, 8, generator=g)
        s[:2, 2] = 0.0
    assert abs(layer_diversity(LayerStates(noisy, pad)).item() - value.item()) < 1e-6
    assert (
        abs(layer_diversity(LayerStates(states, None)).item() - naive_diversity(states, None))
        < 1e-5
    )


def test_diversity_extremes():
    x = torch.randn(5, 2, 8)
    assert layer_diversity(LayerStates([x, 3 * x, -x], None)).item() == pytest.approx(0.0, abs=1e-6)
    e1, e2 = torch.zeros(5, 2, 8), torch.zeros(5, 2, 8)
    e1[..., 0], e2[..., 1] = 1.0, 1.0
    assert layer_diversity(LayerStates([e1, e2], None)).item() == pytest.approx(1.0)
    assert layer_diversity(LayerStates([x], None)).item() == 0.0


def _sample(task, model, bsz=3):
    d = task.source_dictionary
    src, lengths, prev = random_batch(d, bsz=bsz, tgt_len=6)
    prev[0, -2:] = d.pad()  # a padded target
    target = torch.cat([prev[:, 1:], prev.new_full((bsz, 1), d.eos())], dim=1)
    target[0, -3:] = d.pad()
    return {
        "net_input": {"src_tokens": src, "src_lengths": lengths, "prev_output_tokens": prev},
        "target": target,
        "ntokens": int(target.ne(d.pad()).sum()),
        "nsentences": bsz,
    }


def _criterion(task, lam=1.0, stacks="both"):
    return LayerDiversityCriterion(
        task, sentence_avg=False, label_smoothing=0.1, diversity_lambda=lam, diversity_stacks=stacks
    )


ARCHS = [
    ("transformer_dlcl", []),
    ("transformer_dlcl_postnorm", []),
    ("transformer_ta", []),
    ("transformer_hier_agg", ["--mla-layers", "2"]),
    ("transformer_agg_baseline", []),
    (
        "rnmt_plus",
        [
            "--encoder-hidden-size",
            "16",
            "--decoder-hidden-size",
            "16",
            "--rnmt-attention-heads",
            "2",
        ],
    ),
]


def _build(arch, flags):
    """build_model with TINY Transformer flags, or a tiny recurrent model (other flags)."""
    if not arch.startswith("rnmt"):
        return build_model(arch, flags)
    from fairseq import options, tasks

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(
        parser,
        [
            "dummy",
            "--task",
            "translation",
            "--arch",
            arch,
            "--cpu",
            "--encoder-embed-dim",
            "16",
            "--decoder-embed-dim",
            "16",
            "--dropout",
            "0",
            "--attention-dropout",
            "0",
            *flags,
        ],
    )
    d = tiny_dictionary()
    task = tasks.translation.TranslationTask(args, d, d)
    torch.manual_seed(1)
    return task.build_model(args).eval(), task


@pytest.mark.parametrize("arch,flags", ARCHS, ids=[a for a, _ in ARCHS])
def test_every_model_exposes_its_layer_states(arch, flags):
    if arch not in ARCH_MODEL_REGISTRY:
        pytest.skip(f"{arch} is not registered (yet)")
    model, task = _build(arch, ["--encoder-layers", "3", "--decoder-layers", "2", *flags])
    sample = _sample(task, model)
    with torch.no_grad():
        net_output, layers = forward_with_layer_states(
            model, sample["net_input"], task.target_dictionary.pad()
        )
        reference = model(**sample["net_input"])
    torch.testing.assert_close(net_output[0], reference[0])  # the same forward pass as training
    enc, dec = layers["encoder"], layers["decoder"]
    assert len(enc.states) == 3 and len(dec.states) == 2  # layers 1..L, the embedding excluded
    assert enc.padding_mask.shape == sample["net_input"]["src_tokens"].shape
    assert dec.padding_mask.shape == sample["net_input"]["prev_output_tokens"].shape
    value = _criterion(task).diversity(layers)
    assert 0.0 <= value.item() <= 1.0


def test_criterion_is_cross_entropy_minus_lambda_diversity():
    model, task = build_model(
        "transformer_hier_agg", ["--encoder-layers", "3", "--decoder-layers", "3"]
    )
    sample = _sample(task, model)
    ref = LabelSmoothedCrossEntropyCriterion(task, sentence_avg=False, label_smoothing=0.1)
    with torch.no_grad():
        ce, size, _ = ref(model, sample)
        loss0, _, log0 = _criterion(task, lam=0.0)(model, sample)
        loss, size2, log = _criterion(task, lam=1.0)(model, sample)
        _, layers = forward_with_layer_states(
            model, sample["net_input"], task.target_dictionary.pad()
        )
    torch.testing.assert_close(loss0, ce)
    naive = 0.5 * (
        naive_diversity(layers["encoder"].states, layers["encoder"].padding_mask)
        + naive_diversity(layers["decoder"].states, layers["decoder"].padding_mask)
    )
    assert size == size2 == sample["ntokens"]
    assert abs(log["diversity"].item() / size - naive) < 1e-5
    torch.testing.assert_close(loss, ce - naive * size, rtol=1e-5, atol=1e-4)


def test_gradient_reaches_the_layers_and_a_step_increases_diversity():
    model, task = build_model(
        "transformer_dlcl", ["--encoder-layers", "3", "--decoder-layers", "3"]
    )
    model.train()
    sample = _sample(task, model)
    crit = _criterion(task)
    _, layers = forward_with_layer_states(model, sample["net_input"], task.target_dictionary.pad())
    before = crit.diversity(layers)
    (-before).backward()  # the diversity part of the minimised loss
    for stack in (model.encoder, model.decoder):
        for i, layer in enumerate(stack.layers):
            grad = layer.fc2.weight.grad if i < len(stack.layers) - 1 else layer.fc1.weight.grad
            assert grad is not None and grad.abs().sum() > 0, (type(stack).__name__, i)
    assert model.decoder.embed_tokens.weight.grad.abs().sum() > 0
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p.add_(-0.05 * p.grad)  # a gradient step on the minimised quantity
        _, layers = forward_with_layer_states(
            model, sample["net_input"], task.target_dictionary.pad()
        )
    assert crit.diversity(layers) > before  # minimising the loss maximises diversity (Sec. 3.2)


def test_diversity_is_logged_as_its_own_metric():
    with metrics.aggregate() as agg:
        LayerDiversityCriterion.reduce_metrics(
            [
                {"loss": 10.0, "nll_loss": 9.0, "diversity": 3.0, "ntokens": 10, "sample_size": 10},
                {"loss": 10.0, "nll_loss": 9.0, "diversity": 5.0, "ntokens": 10, "sample_size": 10},
            ]
        )
        values = agg.get_smoothed_values()
    assert values["diversity"] == pytest.approx(0.4)
    assert "nll_loss" in values and "loss" in values


def test_a_model_without_layer_states_gets_a_clear_error():
    model, task = build_model(
        "transformer_agg_baseline", ["--encoder-layers", "2", "--decoder-layers", "2"]
    )
    sample = _sample(task, model)
    forward = model.encoder.forward_scriptable

    def no_states(*args, **kwargs):
        out = forward(*args, **kwargs)
        out["encoder_states"] = []
        return out

    model.encoder.forward_scriptable = no_states
    with pytest.raises(ValueError, match="encoder_states.*forward_with_layer_states"):
        _criterion(task)(model, sample)
