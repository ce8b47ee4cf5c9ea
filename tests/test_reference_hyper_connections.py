"""Issue 41: hyper-connections checked against the authors' side's installable code, the
``hyper-connections`` package 0.4.11 (lucidrains; the ``reference`` test extra), on copied weights.

* one sublayer's connection (:class:`HyperConnection`) around a branch function: static and dynamic
  hyper-connections against ``HyperConnections`` (static: its input-dependent part 0), mHC against
  ``ManifoldConstrainedHyperConnections``: the new streams and every gradient (of the streams, the
  branch and each connection parameter);
* a whole pre-norm encoder layer of fairseq with hyper-connections (``--hyper-connections``)
  against fairseq's own sublayers wrapped by the package's modules, one per sublayer: the wiring
  (which connection serves which sublayer, the order, the padding mask) and the gradients.

The package's dynamic hyper-connections normalise with an RMSNorm where the paper (and this
package) uses a layer norm: that module is swapped for ours, everything else is the package's.
Skipped when the package is not installed (``pip install -e .[reference]``).
"""

import pytest
import torch
from helpers import build_model, random_batch
from torch import nn

hc_package = pytest.importorskip(
    "hyper_connections", reason="the reference extra (hyper-connections==0.4.11) is not installed"
)
from hyper_connections.hyper_connections import HyperConnections  # noqa: E402
from hyper_connections.manifold_constrained_hyper_connections import (  # noqa: E402
    ManifoldConstrainedHyperConnections,
)

from fairseq_deep.modules.schemes.hyper_connections import HyperConnection  # noqa: E402

N, T, B, D = 3, 5, 2, 8


def theirs_layout(streams):
    """Ours, n x T x B x d -> the package's (t s) x B x d: streams folded into the first dimension."""
    n, t = streams.shape[:2]
    return streams.transpose(0, 1).reshape(t * n, *streams.shape[2:])


def reference_for(ours: HyperConnection, index: int):
    """The package's module of the same kind, holding a copy of ``ours``'s parameters."""
    with torch.no_grad():
        if ours.kind == "mhc":
            ref = ManifoldConstrainedHyperConnections(ours.n, dim=ours.dim, layer_index=index)
            ref.dynamic_alpha_fn.copy_(ours.dynamic_alpha[None])
            ref.dynamic_beta_fn.copy_(ours.dynamic_beta)
            ref.pre_branch_scale.copy_(ours.alpha_scale[:1])
            ref.residual_scale.copy_(ours.alpha_scale[1:])
            ref.h_post_scale.copy_(ours.beta_scale[0])
            ref.norm.gamma.copy_(ours.norm.weight - 1)
        else:
            ref = HyperConnections(ours.n, dim=ours.dim, layer_index=index)
            if ours.kind == "static":
                ref.dynamic_alpha_fn.zero_()
                ref.dynamic_beta_fn.zero_()
            else:
                ref.dynamic_alpha_fn.copy_(ours.dynamic_alpha)
                ref.dynamic_beta_fn.copy_(ours.dynamic_beta)
                ref.dynamic_alpha_scale.copy_(ours.alpha_scale[0])
                ref.dynamic_beta_scale.copy_(ours.beta_scale[0])
                ref.norm = ours.norm  # the paper's layer norm (the package: an RMSNorm)
        ref.static_alpha.copy_(ours.static[1:, :])
        ref.static_beta.copy_(ours.static[0, 1:])
    return ref


def perturbed(kind: str, index: int, seed: int = 0) -> HyperConnection:
    """A connection whose every parameter is away from its initial value (else a wrong index or
    transpose could go unseen)."""
    torch.manual_seed(seed)
    hc = HyperConnection(kind, N, D, index)
    with torch.no_grad():
        for p in hc.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return hc


def _grads(params):
    return [p.grad.clone() for p in params]


@pytest.mark.parametrize("kind", ["static", "dynamic", "mhc"])
def test_one_connection_gives_the_packages_streams_and_gradients(kind):
    ours = perturbed(kind, index=4)
    ref = reference_for(ours, index=4)
    torch.manual_seed(1)
    branch = nn.Sequential(nn.Linear(D, D), nn.Tanh())
    streams = torch.randn(N, T, B, D, requires_grad=True)
    theirs_in = theirs_layout(streams.detach()).requires_grad_()

    h, mixed, beta = ours.width(streams)
    new = ours.depth(branch(h), mixed, beta)
    new.pow(2).sum().backward()
    grads_ours = _grads([streams, *branch.parameters()])
    branch.zero_grad()

    ref_new = ref.decorate_branch(branch)(theirs_in)
    ref_new.pow(2).sum().backward()
    torch.testing.assert_close(theirs_layout(new), ref_new, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(theirs_layout(grads_ours[0]), theirs_in.grad, rtol=1e-5, atol=1e-6)
    for g, p in zip(grads_ours[1:], branch.parameters()):
        torch.testing.assert_close(g, p.grad, rtol=1e-5, atol=1e-6)
    # every parameter of the connection
    torch.testing.assert_close(ours.static.grad[1:, :], ref.static_alpha.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ours.static.grad[0, 1:], ref.static_beta.grad, rtol=1e-5, atol=1e-6)
    assert ours.static.grad[0, 0] == 0  # the unused corner of the HC matrix
    if kind == "dynamic":
        for ours_p, ref_p in (
            (ours.dynamic_alpha, ref.dynamic_alpha_fn),
            (ours.dynamic_beta, ref.dynamic_beta_fn),
        ):
            torch.testing.assert_close(ours_p.grad, ref_p.grad, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(ours.alpha_scale.grad[0], ref.dynamic_alpha_scale.grad)
        torch.testing.assert_close(ours.beta_scale.grad[0], ref.dynamic_beta_scale.grad)
    if kind == "mhc":
        torch.testing.assert_close(
            ours.dynamic_alpha.grad, ref.dynamic_alpha_fn.grad[0], rtol=1e-5, atol=1e-6
        )
        torch.testing.assert_close(
            ours.dynamic_beta.grad, ref.dynamic_beta_fn.grad, rtol=1e-5, atol=1e-6
        )
        torch.testing.assert_close(
            ours.alpha_scale.grad,
            torch.cat([ref.pre_branch_scale.grad, ref.residual_scale.grad]),
            rtol=1e-5,
            atol=1e-6,
        )
        torch.testing.assert_close(ours.beta_scale.grad[0], ref.h_post_scale.grad)
        torch.testing.assert_close(ours.norm.weight.grad, ref.norm.gamma.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["static", "dynamic", "mhc"])
def test_a_hyper_connected_fairseq_layer_is_the_packages_modules_around_its_sublayers(kind):
    model, task = build_model(
        "transformer_prenorm",
        ["--encoder-layers", "2", "--hyper-connections", kind, "--hc-streams", str(N)],
    )
    layer = model.encoder.layers[1]  # its sublayers are the stack's 3rd and 4th: A_m = e_2, e_0
    with torch.no_grad():
        for p in layer.hyper_connections.parameters():
            p.add_(0.3 * torch.randn_like(p))
    refs = [reference_for(hc, 2 + k) for k, hc in enumerate(layer.hyper_connections)]
    src, _, _ = random_batch(task.source_dictionary, bsz=B, src_len=T)
    pad = src.eq(task.source_dictionary.pad())
    streams = torch.randn(N, T, B, layer.embed_dim, requires_grad=True)

    def attention(h):
        return layer.self_attn(
            query=layer.self_attn_layer_norm(h),
            key=layer.self_attn_layer_norm(h),
            value=layer.self_attn_layer_norm(h),
            key_padding_mask=pad,
            need_weights=False,
        )[0]

    def ffn(h):
        return layer.fc2(layer.activation_fn(layer.fc1(layer.final_layer_norm(h))))

    ours = layer(streams, encoder_padding_mask=pad)
    ours.pow(2).sum().backward()
    grad_ours = {n: p.grad.clone() for n, p in layer.named_parameters()}
    layer.zero_grad()
    theirs_in = theirs_layout(streams.detach()).requires_grad_()
    theirs = refs[1].decorate_branch(ffn)(refs[0].decorate_branch(attention)(theirs_in))
    theirs.pow(2).sum().backward()

    torch.testing.assert_close(theirs_layout(ours), theirs, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(theirs_layout(streams.grad), theirs_in.grad, rtol=1e-4, atol=1e-5)
    for name, p in layer.named_parameters():
        if not name.startswith("hyper_connections."):
            torch.testing.assert_close(grad_ours[name], p.grad, rtol=1e-4, atol=1e-5, msg=name)
    for k, ref in enumerate(refs):
        torch.testing.assert_close(
            grad_ours[f"hyper_connections.{k}.static"][1:, :],
            ref.static_alpha.grad,
            rtol=1e-4,
            atol=1e-5,
        )
