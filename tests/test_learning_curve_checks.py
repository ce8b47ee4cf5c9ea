"""The checks of issue 25 (RNMT+ and MLA learning slower than their baselines), kept as tests.

* Multi-layer attention (Dou et al. Eq. 8): the self-attention of layer l attends H^{l-1} (the
  layer's own input) and its extra attention H^{l-2} (the input of layer l-1), with the layer's
  query, in both stacks; the decoder's extra attention is causal like its self-attention.
* RNMT+: with fairseq's left-padded sources, no attention weight falls on padding, and every
  parameter group gets a gradient.
"""

import pytest
import torch
from helpers import build_model, random_batch


def _capture(module, store, key):
    def hook(mod, args, kwargs, out):
        store[key] = {
            name: kwargs.get(name)
            for name in ("query", "key", "value", "attn_mask", "key_padding_mask")
        }

    return module.register_forward_hook(hook, with_kwargs=True)


@pytest.mark.parametrize("stack", ["encoder", "decoder"])
def test_mla_attends_the_two_layers_below_with_the_layers_query(stack):
    model, task = build_model(
        "transformer_mla2", ["--encoder-layers", "3", "--decoder-layers", "3"]
    )
    src, lengths, prev = random_batch(task.source_dictionary, tgt_len=5)
    layers = getattr(model, stack).layers
    inputs, seen, hooks = {}, {}, []
    for i, layer in enumerate(layers):
        hooks.append(
            layer.register_forward_pre_hook(
                lambda mod, args, kwargs, i=i: inputs.__setitem__(
                    i, args[0] if args else kwargs["x"]
                ),
                with_kwargs=True,
            )
        )
        if hasattr(layer, "lower_attention"):
            hooks.append(_capture(layer.self_attn, seen, (i, "own")))
            hooks.append(_capture(layer.lower_attention.attns[0], seen, (i, "lower")))
    with torch.no_grad():
        model(src, lengths, prev)
    for h in hooks:
        h.remove()
    assert not hasattr(layers[0], "lower_attention")  # layer 1 has one layer below it
    for i in (1, 2):  # layers 2 and 3 (post-norm: the states are not normalised first)
        own, lower = seen[(i, "own")], seen[(i, "lower")]
        assert torch.equal(own["key"], inputs[i])  # C_{-1}: H^{l-1}, the layer's input
        assert torch.equal(lower["key"], inputs[i - 1]) and torch.equal(
            lower["value"], inputs[i - 1]
        )  # H^{l-2}
        assert torch.equal(lower["query"], own["query"])  # Q^l, the same query
        if stack == "decoder":  # causal, as the layer's own self-attention
            assert lower["attn_mask"] is not None and torch.equal(
                lower["attn_mask"], own["attn_mask"]
            )
        else:
            assert torch.equal(lower["key_padding_mask"], own["key_padding_mask"])
            assert lower["key_padding_mask"][-1, :2].all()  # the left-padded source


def test_rnmt_plus_attention_ignores_left_padding_and_every_group_learns():
    model, task = build_model("rnmt_plus", ["--encoder-layers", "2", "--decoder-layers", "3"])
    src, lengths, prev = random_batch(task.source_dictionary, tgt_len=5)
    assert src[-1, 0] == task.source_dictionary.pad()  # fairseq left-pads the source
    model.train()
    out, extra = model(src, lengths, prev)
    attn = extra["attn"][0]  # B x T x S
    assert attn[-1, :, :2].abs().max() == 0  # no weight on the two pads, at any target step
    out.logsumexp(-1).mean().backward()
    groups = {}
    for name, p in model.named_parameters():
        groups.setdefault(".".join(name.split(".")[:2]), []).append(
            p.grad is not None and p.grad.abs().sum() > 0
        )
    assert all(any(v) for v in groups.values()), {k: v for k, v in groups.items() if not any(v)}
    for name in ("decoder.attention", "encoder.layers", "decoder.layers", "encoder.embed_tokens"):
        assert any(groups[name]), name
