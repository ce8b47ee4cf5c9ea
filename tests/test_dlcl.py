"""transformer_dlcl (Wang et al. 2019): identities with fairseq's Transformer, incremental decoding,
gradient flow and the O(L) memory of the layer history."""

import re

import pytest
import torch
from helpers import build_model, parse_model_args, random_batch

from fairseq_deep.modules.histories.layer_history import DynamicLinearCombination

PRENORM = ["--encoder-normalize-before", "--decoder-normalize-before"]
LAYERS = ["--encoder-layers", "3", "--decoder-layers", "2"]
RESIDUAL = ["--dlcl-init", "residual"]


def _outputs(model, dictionary, **batch_kw):
    src, lengths, prev = random_batch(dictionary, **batch_kw)
    with torch.no_grad():
        return model(src, lengths, prev)[0]


def _load_into(dlcl, fairseq_model, rename=lambda k: k):
    state = {rename(k): v for k, v in fairseq_model.state_dict().items()}
    missing, unexpected = dlcl.load_state_dict(state, strict=False)
    assert not unexpected, unexpected
    assert all(".history." in k for k in missing), missing


def test_prenorm_residual_setting_is_fairseq_prenorm_transformer():
    """Eq. 8 with W[l+1,l]=1, other weights 0 and no layer norm is the pre-norm residual net."""
    ref, task = build_model("transformer", [*PRENORM, *LAYERS], seed=1)
    dlcl, _ = build_model("transformer_dlcl", [*LAYERS, *RESIDUAL, "--dlcl-no-layer-norm"], seed=2)
    _load_into(dlcl, ref)
    d = task.source_dictionary
    torch.testing.assert_close(_outputs(dlcl, d), _outputs(ref, d), rtol=1e-5, atol=1e-5)


def test_postnorm_residual_setting_is_fairseq_postnorm_transformer():
    """Eq. 9 with residual weights: LN_{l+1}(y_l) is layer l's own post-norm, moved into G."""
    ref, task = build_model("transformer", LAYERS, seed=1)
    dlcl, _ = build_model("transformer_dlcl_postnorm", [*LAYERS, *RESIDUAL], seed=2)

    def rename(key):
        m = re.match(r"(encoder|decoder)\.layers\.(\d+)\.final_layer_norm\.(weight|bias)$", key)
        return f"{m[1]}.history.norms.{int(m[2]) + 1}.{m[3]}" if m else key

    _load_into(dlcl, ref, rename)
    d = task.source_dictionary
    torch.testing.assert_close(_outputs(dlcl, d), _outputs(ref, d), rtol=1e-5, atol=1e-5)


def test_postnorm_without_dlcl_layer_norm_keeps_fairseq_layers():
    ref, task = build_model("transformer", LAYERS, seed=1)
    dlcl, _ = build_model(
        "transformer_dlcl_postnorm", [*LAYERS, *RESIDUAL, "--dlcl-no-layer-norm"], seed=2
    )
    _load_into(dlcl, ref)
    d = task.source_dictionary
    torch.testing.assert_close(_outputs(dlcl, d), _outputs(ref, d), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", ["transformer_prenorm", "transformer_postnorm"])
def test_baselines_are_fairseq_transformer(arch):
    """The Table 1 baselines (--dlcl-stacks none) run fairseq's computation in our loop."""
    flags = PRENORM if arch == "transformer_prenorm" else []
    ref, task = build_model("transformer", [*flags, *LAYERS], seed=1)
    ours, _ = build_model(arch, LAYERS, seed=2)
    _load_into(ours, ref)
    assert not any(".history." in k for k in ours.state_dict())
    d = task.source_dictionary
    torch.testing.assert_close(_outputs(ours, d), _outputs(ref, d), rtol=1e-5, atol=1e-5)


def test_dlcl_is_not_the_residual_net_by_default():
    """Guards the identities above: the default (avg init, layer norm) computes something else."""
    ref, task = build_model("transformer", [*PRENORM, *LAYERS], seed=1)
    dlcl, _ = build_model("transformer_dlcl", LAYERS, seed=2)
    _load_into(dlcl, ref)
    d = task.source_dictionary
    assert not torch.allclose(_outputs(dlcl, d), _outputs(ref, d), atol=1e-3)


def _perturb_history(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, DynamicLinearCombination):
            with torch.no_grad():
                m.weight.add_(0.3 * torch.randn(m.weight.shape, generator=g))


@pytest.mark.parametrize(
    "arch,flags",
    [
        ("transformer_dlcl", []),
        ("transformer_dlcl_postnorm", []),
        ("transformer_dlcl", ["--dlcl-softmax-weights", "--dlcl-normalize-embed"]),
        ("transformer_dlcl", ["--dlcl-stacks", "decoder", "--dlcl-init", "one"]),
    ],
)
def test_incremental_decoding_equals_full_pass(arch, flags):
    model, task = build_model(arch, [*LAYERS, *flags])
    _perturb_history(model)
    d = task.source_dictionary
    src, lengths, prev = random_batch(d, tgt_len=6)
    with torch.no_grad():
        enc = model.encoder(src, lengths)
        full, _ = model.decoder(prev, encoder_out=enc)
        state = {}
        steps = [
            model.decoder(prev[:, : t + 1], encoder_out=enc, incremental_state=state)[0]
            for t in range(prev.size(1))
        ]
    assert all(s.size(1) == 1 for s in steps)  # one new position per step, nothing recomputed
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=1e-5)


def test_gradients_reach_embeddings_of_30_layer_model():
    model, task = build_model("transformer_dlcl_30l", ["--decoder-layers", "2"])
    model.train()
    src, lengths, prev = random_batch(task.source_dictionary)
    out, _ = model(src, lengths, prev)
    out.log_softmax(-1).mean().backward()
    emb = model.encoder.embed_tokens.weight.grad
    assert emb is not None and torch.isfinite(emb).all() and emb.abs().sum() > 0
    w = model.encoder.history.weight
    assert w.shape == (31, 31)
    assert torch.isfinite(w.grad).all() and w.grad.tril().abs().sum() > 0
    assert w.grad.triu(1).abs().sum() == 0  # the upper triangle is not a connection


def _saved_bytes(model, src, lengths):
    """Bytes of the distinct storages autograd keeps for backward of one encoder pass."""
    storages = {}

    def pack(t):
        if t.device.type == "cpu" and t.numel() > 0:
            s = t.untyped_storage()
            storages[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model.encoder(src, lengths)["encoder_out"][0].sum().backward()
    return sum(storages.values())


def test_history_memory_grows_linearly_not_quadratically():
    """A 30-layer DLCL encoder keeps about what a plain 30-layer pre-norm encoder keeps.

    Re-stacking all earlier outputs at every layer (the authors' code) would keep
    sum_l (l+1) = 496 layer-sized copies instead of ~2 extra per layer."""
    extra = ["--decoder-layers", "1", "--encoder-embed-dim", "32", "--decoder-embed-dim", "32"]
    plain, task = build_model("transformer_prenorm_30l", extra)
    dlcl, _ = build_model("transformer_dlcl_30l", extra)
    plain.train(), dlcl.train()
    src, lengths, _ = random_batch(task.source_dictionary, bsz=4, src_len=20)
    ratio = _saved_bytes(dlcl, src, lengths) / _saved_bytes(plain, src, lengths)
    assert ratio < 1.5, ratio


def test_unknown_option_value_names_the_option(capsys):
    with pytest.raises(SystemExit):
        parse_model_args("transformer_dlcl", ["--dlcl-init", "uniform"])
    assert "--dlcl-init" in capsys.readouterr().err


def test_preset_with_conflicting_depth_names_the_option():
    with pytest.raises(
        ValueError, match=r"--encoder-layers 20.*--arch transformer_dlcl --encoder-layers 20"
    ):
        parse_model_args("transformer_dlcl_30l", ["--encoder-layers", "20"])
    with pytest.raises(ValueError, match=r"--arch transformer_postnorm --encoder-layers 12"):
        parse_model_args("transformer_postnorm_16l", ["--encoder-layers", "12"])
    args = parse_model_args("transformer_dlcl_30l", ["--encoder-layers", "30"])
    assert args.encoder_layers == 30 and args.decoder_layers == 6


def test_softmax_weights_need_average_init():
    with pytest.raises(ValueError, match="--dlcl-init avg"):
        build_model("transformer_dlcl", ["--dlcl-softmax-weights", "--dlcl-init", "residual"])


def test_softmax_logits_do_not_load_as_plain_weights():
    """Same name and shape, other meaning: loading across --dlcl-softmax-weights stops and names
    the flag; a checkpoint without the saved flag (older) loads as before."""
    soft, _ = build_model("transformer_dlcl", [*LAYERS, "--dlcl-softmax-weights"])
    plain, _ = build_model("transformer_dlcl", LAYERS)
    with pytest.raises(RuntimeError, match="add --dlcl-softmax-weights"):
        plain.load_state_dict(soft.state_dict())
    with pytest.raises(RuntimeError, match="drop --dlcl-softmax-weights"):
        soft.load_state_dict(plain.state_dict())
    same, _ = build_model("transformer_dlcl", LAYERS, seed=2)
    older = {k: v for k, v in plain.state_dict().items() if not k.endswith("softmax_rows")}
    same.load_state_dict(older)
    assert torch.equal(same.encoder.history.weight, plain.encoder.history.weight)


def test_presets_follow_the_paper():
    a = parse_model_args("transformer_dlcl_30l")
    assert (a.encoder_layers, a.decoder_layers, a.encoder_embed_dim) == (
        30,
        6,
        16,
    )  # TINY sets dims
    assert a.encoder_normalize_before and a.dlcl_stacks == "both" and a.dlcl_init == "avg"
    b = parse_model_args("transformer_postnorm_20l")
    assert not b.encoder_normalize_before and b.dlcl_stacks == "none" and b.encoder_layers == 20
    big = options_without_tiny("transformer_dlcl_big")
    assert (big.encoder_embed_dim, big.encoder_ffn_embed_dim, big.encoder_attention_heads) == (
        1024,
        4096,
        16,
    )


def options_without_tiny(arch):
    from fairseq import options

    parser = options.get_training_parser()
    return options.parse_args_and_arch(parser, ["dummy", "--task", "translation", "--arch", arch])


def test_fixed_weights_are_a_buffer():
    model, _ = build_model(
        "transformer_dlcl", [*LAYERS, "--dlcl-fixed-weights", "--dlcl-init", "one"]
    )
    names = {n for n, _ in model.named_parameters()}
    assert "encoder.history.weight" not in names
    assert torch.equal(
        model.encoder.history.weight, torch.ones(4, 4).tril()
    )  # All-One, lower triangle
    assert "encoder.history.weight" in model.state_dict()  # still saved in checkpoints


def test_weighted_sum_gradients_match_autograd():
    """The fused combination (one autograd node, no stacked copy) against double-precision
    finite differences, and against the plain sum of products."""
    from fairseq_deep.modules.histories.layer_history import weighted_sum

    torch.manual_seed(0)
    w = torch.randn(4, dtype=torch.double, requires_grad=True)
    entries = [torch.randn(3, 2, 5, dtype=torch.double, requires_grad=True) for _ in range(4)]
    assert torch.autograd.gradcheck(lambda w, *e: weighted_sum(w, list(e)), (w, *entries))
    torch.testing.assert_close(weighted_sum(w, entries), sum(w[k] * entries[k] for k in range(4)))


@pytest.mark.parametrize(
    "arch,flags",
    [
        ("transformer_dlcl", []),
        ("transformer_dlcl_postnorm", []),
        ("transformer_dlcl", ["--dlcl-softmax-weights"]),
    ],
)
def test_inference_path_equals_autograd_path(arch, flags):
    """Without autograd (beam search) the rows are summed with Python-float weights; with autograd
    by one autograd node: both compute Eq. 8/9."""
    model, task = build_model(arch, [*LAYERS, *flags])
    _perturb_history(model)
    src, lengths, prev = random_batch(task.source_dictionary)
    with torch.no_grad():
        inference = model(src, lengths, prev)[0]
    training = model(src, lengths, prev)[0]
    assert training.requires_grad
    torch.testing.assert_close(inference, training.detach(), rtol=1e-5, atol=1e-5)


def _history_pass(hist, state_cls, x, layers):
    """The inputs of every layer and the readout of a stack of `layers` over `hist`."""
    states = state_cls(hist, x)
    inputs = []
    for layer in layers:
        inputs.append(states.next_input())
        states.push(torch.tanh(layer(inputs[-1])))
    return inputs, states.readout()


def _grads(loss, params, **kw):
    grads = torch.autograd.grad(loss, params, allow_unused=True, **kw)
    return [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads)]


@pytest.mark.parametrize("normalize_before,softmax", [(True, False), (False, False), (True, True)])
def test_training_rows_equal_the_per_entry_products(normalize_before, softmax):
    """With autograd each entry's gradient is formed once, by its own row (`_DeferredRow`): the
    same values and gradients as the per-entry products of `weighted_sum`, for a loss on the
    readout, on an inner layer's input only (the backward starts below the top row), and twice
    over one graph."""
    from fairseq_deep.modules.histories.layer_history import EntryState, _TrainingState

    torch.manual_seed(0)
    hist = DynamicLinearCombination(4, 6, normalize_before, softmax=softmax).double()
    layers = [torch.nn.Linear(6, 6).double() for _ in range(4)]
    with torch.no_grad():
        for p in hist.parameters():
            p.add_(0.3 * torch.randn(p.shape, dtype=p.dtype))
    x = torch.randn(3, 2, 6, dtype=torch.double, requires_grad=True)
    params = [x, *hist.parameters(), *(p for layer in layers for p in layer.parameters())]
    losses = {
        "readout": lambda ins, out: (out**2).sum(),
        "inner": lambda ins, out: (ins[2] ** 2).sum(),
    }
    for name, loss_of in losses.items():
        (ins, out), (ref_ins, ref_out) = (
            _history_pass(hist, cls, x, layers) for cls in (_TrainingState, EntryState)
        )
        torch.testing.assert_close(out, ref_out)
        ref = _grads(loss_of(ref_ins, ref_out), params)
        loss = loss_of(ins, out)
        for _again in range(2):  # a second backward over the same graph starts clean
            for g, r in zip(_grads(loss, params, retain_graph=True), ref):
                torch.testing.assert_close(g, r, msg=name)
    assert torch.autograd.gradcheck(
        lambda x: _history_pass(hist, _TrainingState, x, layers)[1], (x,)
    )
