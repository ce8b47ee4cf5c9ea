"""The stream-level schemes as settings of every Transformer stack: what a stack's residual stream
is and how its layers read and write it.

* DenseFormer (``--denseformer``, :mod:`.denseformer`): a layer history (depth-weighted averages);
* hyper-connections and mHC (``--hyper-connections``, :mod:`.hyper_connections`) and ResiDual
  (``--resi-dual``, :mod:`.resi_dual`): a history of several streams and a layer mixin whose
  ``residual_connection`` updates them per sublayer (:mod:`.residual_streams`);
* ODE Transformer (``--ode-method``, :mod:`.ode_block`): a layer mixin that evaluates the layer
  several times per block; the history stays the family's.

``models/transformer_stack.py`` calls :func:`stream_history` once per stack (it replaces the
family's residual history, or refuses a family whose history already combines layers) and
:func:`apply_streams` on each layer it builds, after the residual schemes and before activation
checkpointing and fully sharded wrapping.  One scheme at a time; what each composes with is
checked here, in one line each (:func:`check_streams`).
"""

import logging
from dataclasses import dataclass
from typing import List

from torch import nn

from ...errors import UserError
from ..histories.layer_history import LayerHistory
from .denseformer import DenseFormerConfig, build_denseformer
from .hyper_connections import (
    HyperConnectionHistory,
    HyperConnectionsConfig,
    apply_hyper_connections,
)
from .ode_block import ODEConfig, apply_ode
from .resi_dual import ResiDualConfig, ResiDualHistory, apply_resi_dual
from .residual_schemes import RESIDUAL_SCHEMES, ResidualSchemesConfig

logger = logging.getLogger(__name__)


@dataclass
class StreamSchemesConfig(DenseFormerConfig, HyperConnectionsConfig, ResiDualConfig, ODEConfig):
    """Every stream-level scheme's options; composed into every Transformer family."""


def chosen(opts: StreamSchemesConfig) -> List[str]:
    """The flags of the schemes that are on (``--denseformer``, ``--hyper-connections dynamic``, ...)."""
    return [
        flag
        for flag, on in (
            ("--denseformer", opts.denseformer),
            (f"--hyper-connections {opts.hyper_connections}", opts.hyper_connections != "none"),
            ("--resi-dual", opts.resi_dual),
            (f"--ode-method {opts.ode_method}", opts.ode_method != "none"),
        )
        if on
    ]


def _ode_sides(opts: StreamSchemesConfig) -> List[str]:
    if opts.ode_method == "none":
        return []
    return ["encoder", "decoder"] if opts.ode_stacks == "both" else [opts.ode_stacks]


def check_streams(cfg) -> StreamSchemesConfig:
    """The stream schemes' options of ``cfg`` (a TransformerConfig or namespace), or a UserError
    for a setting or combination that makes no sense."""
    opts = StreamSchemesConfig.from_namespace(cfg)
    on = chosen(opts)
    if len(on) > 1:
        raise UserError(f"{' and '.join(on)} each redefine the residual stream: choose one")
    for name, value, least in (
        ("--denseformer-dilation", opts.denseformer_dilation, 1),
        ("--denseformer-period", opts.denseformer_period, 1),
        ("--hc-streams", opts.hc_streams, 1),
        ("--hc-sinkhorn-iters", opts.hc_sinkhorn_iters, 1),
    ):
        if value < least:
            raise UserError(f"{name} must be at least {least}, got {value}")
    if not on:
        return opts
    residual = ResidualSchemesConfig.from_namespace(cfg)
    replaced = [f"--{s}" for s in RESIDUAL_SCHEMES if getattr(residual, s)]
    if replaced and (opts.hyper_connections != "none" or opts.resi_dual):
        raise UserError(
            f"{on[0]} and {replaced[0]} each replace the residual connection of every sublayer: "
            "choose one"
        )
    pre = {side: _normalize_before(cfg, side) for side in ("encoder", "decoder")}
    needs = {}
    if opts.hyper_connections != "none":
        needs = {"encoder": True, "decoder": True}
    elif opts.resi_dual:
        needs = {"encoder": False, "decoder": False}
    elif opts.ode_method != "none":
        needs = {side: True for side in _ode_sides(opts)}
    for side, before in needs.items():
        if pre[side] != before:
            norm = "pre-norm" if before else "post-norm"
            raise UserError(
                f"{on[0]} takes {norm} layers, but the {side} is "
                f"{'pre' if pre[side] else 'post'}-norm: use --arch "
                f"{'transformer_prenorm' if before else 'transformer_postnorm'} (or a preset of "
                "docs/deep_schemes.md)"
            )
    return opts


def _normalize_before(cfg, side: str) -> bool:
    sub = getattr(cfg, side, None)
    if sub is not None and hasattr(sub, "normalize_before"):
        return bool(sub.normalize_before)
    return bool(getattr(cfg, f"{side}_normalize_before"))


def stream_history(cfg, side: str, history: LayerHistory) -> LayerHistory:
    """The history of the ``side`` stack: ``history`` (the family's) unless a stream scheme
    replaces it, which needs it to be the residual one (DLCL, the aggregations and transparent
    attention's readout over the encoder are the family's: a stream scheme beside them is refused)."""
    opts = check_streams(cfg)
    on = chosen(opts)
    if not on or opts.ode_method != "none":
        return history
    why = history.not_residual()
    if why is not None:
        raise UserError(
            f"{on[0]} replaces the {side}'s layer history, which is already {why}: use a plain "
            "residual --arch (transformer_prenorm, transformer_postnorm, --dlcl-stacks none, ...)"
        )
    layers, dim = history.num_layers, getattr(cfg, side).embed_dim
    if opts.denseformer:
        return build_denseformer(cfg, layers, dim)
    if opts.resi_dual:
        return ResiDualHistory(layers, dim)
    return HyperConnectionHistory(layers, opts.hc_streams)


def apply_streams(layer: nn.Module, cfg, side: str, index: int) -> nn.Module:
    """Layer ``index`` (0-based) of the ``side`` stack under the stream scheme of ``cfg`` (the
    layer mixins of hyper-connections, ResiDual, the ODE block), changed in place and returned."""
    opts = StreamSchemesConfig.from_namespace(cfg)
    if opts.hyper_connections != "none":
        apply_hyper_connections(layer, opts, index)
    elif opts.resi_dual:
        apply_resi_dual(layer)
    elif side in _ode_sides(opts):
        apply_ode(layer, opts, side)
    return layer


def stream_scheme_names(cfg) -> str:
    """The stream scheme that is on, for logs (``--hyper-connections mhc``), or ``""``."""
    return " ".join(chosen(StreamSchemesConfig.from_namespace(cfg)))
