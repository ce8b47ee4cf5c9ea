"""fairseq's Transformer encoder and decoder with their layer loop handed to a layer history.

Everything but the loop is fairseq's (`TransformerEncoderBase`, `TransformerDecoderBase`,
`TransformerEncoderLayerBase`, `TransformerDecoderLayerBase`): embeddings, masks, layers, the final
layer norm of pre-norm stacks, output projection, incremental state of the attention layers.
The loop reads each layer's input from a :class:`~fairseq_deep.modules.histories.layer_history.LayerHistory` and pushes
its output back; with the residual history it computes exactly what fairseq's loop computes.

Layers are built by one depth-aware hook, ``build_layer(cfg, index, num_layers)``: fairseq's
constructor calls ``build_encoder_layer(cfg)`` once per layer, bottom first, without saying which;
the stacks here count the calls, hand the hook the layer's index (0-based) and the stack's depth,
and wrap what it returns once for activation checkpointing and FSDP, as fairseq does.  A scheme
whose layers depend on their depth (DeepNorm, DS-Init, Admin: a residual scale or an
initialisation of layer l of N) is applied to what ``build_layer`` returns
(:func:`~fairseq_deep.modules.schemes.residual_schemes.apply_schemes`), so it composes with every history
and every layer class, and to the stack's own norms once it is built (``finish_stack``: Mix-LN's
final norm, DyT); a stack whose layers differ in kind (multi-layer attention) overrides
``build_layer`` only.

GPKD's group permutation (Li et al. 2021, ``--gpkd-*-groups``) changes the loop in one place: in
training it runs each group's layers in an order drawn per batch, and the history records its
entries in that execution order (its rows belong to positions, not layers); Skipping Sub-Layer is a
mixin on each built layer's residual connection (``apply_skipping``): both in
:mod:`~fairseq_deep.modules.schemes.gpkd`.
"""

import functools
import logging
from typing import Any, Dict, List, Optional

import torch
from fairseq.dataclass.utils import gen_parser_from_dataclass
from fairseq.distributed import fsdp_wrap
from fairseq.models import ARCH_CONFIG_REGISTRY
from fairseq.models.transformer import (
    TransformerDecoderBase,
    TransformerEncoderBase,
    TransformerModel,
)
from fairseq.modules.checkpoint_activations import checkpoint_wrapper
from fairseq.modules.transformer_layer import (
    TransformerDecoderLayerBase,
    TransformerEncoderLayerBase,
)
from torch import Tensor, nn

from ..modules.common.better_transformer import without_better_transformer
from ..modules.common.growth import declare_stack
from ..modules.histories.layer_history import LayerHistory
from ..modules.schemes.gpkd import GPKDConfig, apply_skipping, check_gpkd, ordered
from ..modules.schemes.residual_schemes import (
    AdminProfile,
    ResidualSchemesConfig,
    apply_schemes,
    finish_stack,
    scheme_names,
)
from ..modules.schemes.stream_schemes import (
    StreamSchemesConfig,
    apply_streams,
    stream_history,
    stream_scheme_names,
)
from .flags import add_new_flag_names

logger = logging.getLogger(__name__)


class TechniqueTransformerModel(TransformerModel):
    """fairseq's TransformerModel plus one technique: its options (``options``, a FairseqDataclass
    whose flags are added to fairseq's) and its base preset (``base_arch``, the ``--arch`` whose
    defaults every model of the class starts from).  Subclasses build their encoder and decoder."""

    options = None
    base_arch = ""
    #: flags renamed to carry their technique's prefix: {old: new}; the old flag still works
    renamed_flags: Dict[str, str] = {}
    #: whether the family takes group permutation and Skipping Sub-Layer (Li et al. 2021), which
    #: the paper defines for the pre-norm Transformer and DLCL (modules/schemes/gpkd.py)
    gpkd_defined = False

    @classmethod
    def hub_models(cls):
        return {}  # fairseq's downloadable transformers are not models of this class

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        gen_parser_from_dataclass(parser, cls.options(), delete_default=True, with_prefix="")
        gen_parser_from_dataclass(
            parser, ResidualSchemesConfig(), delete_default=True, with_prefix=""
        )
        gen_parser_from_dataclass(
            parser, StreamSchemesConfig(), delete_default=True, with_prefix=""
        )
        gen_parser_from_dataclass(parser, GPKDConfig(), delete_default=True, with_prefix="")
        add_new_flag_names(parser, cls.renamed_flags)

    @classmethod
    def build_model(cls, args, task):
        ARCH_CONFIG_REGISTRY[cls.base_arch](args)
        check_gpkd(args, cls.gpkd_defined)  # refused by name where the paper does not define it
        model = super().build_model(args, task)
        if scheme_names(args):
            logger.info(
                f"residual/initialisation schemes: {scheme_names(args)} (modules/schemes/residual_schemes.py)"
            )
        if stream_scheme_names(args):
            logger.info(
                f"stream scheme: {stream_scheme_names(args)} (modules/schemes/stream_schemes.py)"
            )
        return model


def wrap_layer(layer: nn.Module, cfg) -> nn.Module:
    """fairseq's activation checkpointing and FSDP wrapping of a built layer (as in its
    ``build_encoder_layer``): a checkpointed layer is always FSDP-wrapped, whatever its size."""
    checkpoint = cfg.checkpoint_activations
    if checkpoint:
        layer = checkpoint_layer(layer, offload_to_cpu=cfg.offload_activations)
    return fsdp_wrap(layer, min_num_params=cfg.min_params_to_wrap if not checkpoint else 0)


def checkpoint_layer(layer: nn.Module, offload_to_cpu: bool = False) -> nn.Module:
    """fairseq's ``checkpoint_wrapper``, which also sees the tensors of a keyword argument that is
    a list of tensors (the lower layers' states of multi-layer attention).

    fairseq's wrapper hands autograd the tensor arguments only; a list is passed through as an
    object, so no gradient would flow back through its tensors.  Here such a list travels as one
    keyword argument per tensor and is put back together inside the checkpoint, where the layer's
    own ``forward`` runs (in the forward pass and again in backward).  Partials of module-level
    functions and bound methods, as fairseq's own, so that a deep copy of the model is its own.
    """
    layer.forward = functools.partial(_forward_with_lists, layer.forward)
    checkpoint_wrapper(layer, offload_to_cpu=offload_to_cpu)
    layer.forward = functools.partial(_forward_with_items, layer.forward)
    return layer


def _forward_with_items(checkpointed, *args, **kwargs):
    """Outside the checkpoint: every list of tensors as one keyword argument per item, ``lower[i]``."""
    flat = {}
    for name, value in kwargs.items():
        if isinstance(value, list) and value and all(isinstance(v, Tensor) for v in value):
            flat.update((f"{name}[{i}]", v) for i, v in enumerate(value))
        else:
            flat[name] = value
    return checkpointed(*args, **flat)


def _forward_with_lists(forward, *args, **kwargs):
    """Inside the checkpoint: the items put back into their lists, in order."""
    plain: Dict[str, Any] = {}
    for name, value in kwargs.items():
        if name.endswith("]"):  # "lower[0]", "lower[1]", ... (keyword names no caller can write)
            plain.setdefault(name.partition("[")[0], []).append(value)
        else:
            plain[name] = value
    return forward(*args, **plain)


def _check_history(history: LayerHistory, layerdrop: float, side: str):
    if layerdrop > 0 and history.indexed_by_depth:
        raise ValueError(
            f"--{side}-layerdrop skips layers, which would shift the rows of the layer "
            f"combination; set --{side}-layerdrop 0 with this architecture"
        )


def _takes_over_post_norm(history: LayerHistory, normalize_before: bool) -> bool:
    """Eq. 9 of Wang et al.: the post-norm LN of layer l becomes the LN of row l+1."""
    return not normalize_before and getattr(history, "use_layer_norm", False)


def _give_norm_to_history(layer: nn.Module, taken_over: bool):
    """Drop a built layer's post-norm LN where the history applies it (``_takes_over_post_norm``).
    Done before the layer is wrapped: a module assigned to an FSDP-wrapped layer lands on the
    wrapper, and the layer's own LN would go on computing (tests/test_fsdp_wrap.py)."""
    if taken_over:
        layer.final_layer_norm = nn.Identity()


class FairseqTransformerEncoder(TransformerEncoderBase):
    """fairseq's own Transformer encoder (the hybrids' Transformer parts), its layers without
    fairseq 0.12.2's fused fast path (modules/common/better_transformer.py) and under the initialisation
    scheme of ``cfg`` (``--ds-init``; the hybrids refuse the residual schemes, their Transformer
    parts being pre-norm)."""

    def __init__(self, cfg, dictionary, embed_tokens):
        self._layers_built = 0
        super().__init__(cfg, dictionary, embed_tokens)

    def build_encoder_layer(self, cfg):
        index, self._layers_built = self._layers_built, self._layers_built + 1
        layer = without_better_transformer(
            TransformerEncoderLayerBase(cfg, return_fc=self.return_fc)
        )
        return wrap_layer(apply_schemes(layer, cfg, "encoder", index, cfg.encoder.layers), cfg)


class FairseqTransformerDecoder(TransformerDecoderBase):
    """fairseq's own Transformer decoder (a hybrid's Transformer decoder), its layers under the
    initialisation scheme of ``cfg`` (``--ds-init``), as :class:`FairseqTransformerEncoder`."""

    def __init__(self, cfg, dictionary, embed_tokens, no_encoder_attn=False):
        self._layers_built = 0
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn)

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        index, self._layers_built = self._layers_built, self._layers_built + 1
        layer = TransformerDecoderLayerBase(cfg, no_encoder_attn)
        return wrap_layer(apply_schemes(layer, cfg, "decoder", index, cfg.decoder.layers), cfg)


class HistoryTransformerEncoder(TransformerEncoderBase):
    """Transformer encoder whose layer l+1 reads ``history.next_input()`` (Wang et al. Eq. 7)."""

    def __init__(self, cfg, dictionary, embed_tokens, history: LayerHistory):
        self._layers_built = 0  # fairseq's constructor builds the layers in order, bottom first
        history = stream_history(cfg, "encoder", history)  # DenseFormer, hyper-connections, ...
        self._history_norms = _takes_over_post_norm(history, cfg.encoder.normalize_before)
        super().__init__(cfg, dictionary, embed_tokens)
        _check_history(history, self.encoder_layerdrop, "encoder")
        self.history = history
        self.gpkd_groups = GPKDConfig.from_namespace(cfg).gpkd_encoder_groups  # Li et al. 2021
        finish_stack(self, cfg, "encoder", cfg.encoder.layers)  # the stack's own norms

    def build_encoder_layer(self, cfg):
        """fairseq's hook, called once per layer: builds layer ``index`` of N (without fairseq
        0.12.2's fused fast path, modules/common/better_transformer.py), applies the residual and
        initialisation schemes of ``cfg`` (modules/schemes/residual_schemes.py) and wraps it."""
        index, self._layers_built = self._layers_built, self._layers_built + 1
        if index == 0:
            self.admin_profile = AdminProfile()  # shared by the stack's layers under --admin
        layer = without_better_transformer(self.build_layer(cfg, index, cfg.encoder.layers))
        _give_norm_to_history(layer, self._history_norms)
        layer = apply_schemes(layer, cfg, "encoder", index, cfg.encoder.layers, self.admin_profile)
        layer = apply_skipping(layer, cfg, "encoder", index, cfg.encoder.layers)
        return wrap_layer(apply_streams(layer, cfg, "encoder", index), cfg)

    def build_layer(self, cfg, index: int, num_layers: int) -> nn.Module:
        """Layer ``index`` (0-based, bottom first) of a stack of ``num_layers``, unwrapped:
        fairseq's layer here; override to make a layer that depends on its depth."""
        return TransformerEncoderLayerBase(cfg, return_fc=self.return_fc)

    #: how many inputs of lower layers the loop hands to `forward_layer` (multi-layer attention)
    lower_window = 0

    def forward_layer(self, idx: int, layer, x: Tensor, lower: List[Tensor], **kwargs):
        """Run encoder layer `idx` on its input x.  `lower` holds the inputs of up to
        `lower_window` layers below it, nearest last (empty unless a subclass asks for them)."""
        return layer(x, **kwargs)

    def forward_scriptable(
        self,
        src_tokens,
        src_lengths: Optional[Tensor] = None,
        return_all_hiddens: bool = False,
        token_embeddings: Optional[Tensor] = None,
    ):
        padding_mask = src_tokens.eq(self.padding_idx)
        has_pads = bool(padding_mask.any())
        x, encoder_embedding = self.forward_embedding(src_tokens, token_embeddings)
        if has_pads:
            x = x * (1 - padding_mask.unsqueeze(-1).type_as(x))
        x = x.transpose(0, 1)  # B x T x C -> T x B x C

        encoder_states = [x] if return_all_hiddens else []
        states = self.history.start(x)
        lower: List[Tensor] = []  # inputs of the layers below, kept only when lower_window > 0
        # group permutation (GPKD): in training, each group's layers in an order of this pass
        for idx, layer in enumerate(ordered(self.layers, self.gpkd_groups, self.training)):
            x_in = states.next_input()
            x = self.forward_layer(
                idx, layer, x_in, lower, encoder_padding_mask=padding_mask if has_pads else None
            )
            if self.lower_window > 0:
                lower = (lower + [x_in])[-self.lower_window :]
            states.push(x)
            if return_all_hiddens:
                encoder_states.append(self.history.hidden(x))
        x = states.readout()
        if self.layer_norm is not None:
            x = self.layer_norm(x)

        return {
            "encoder_out": [x],  # T x B x C
            "encoder_padding_mask": [padding_mask],  # B x T
            "encoder_embedding": [encoder_embedding],  # B x T x C
            "encoder_states": encoder_states,  # List[T x B x C]
            "fc_results": [],
            "src_tokens": [],
            "src_lengths": [
                src_tokens.ne(self.padding_idx).sum(dim=1, dtype=torch.int32).reshape(-1, 1)
            ],
        }


class HistoryTransformerDecoder(TransformerDecoderBase):
    """Transformer decoder whose layer l+1 reads ``history.next_input()``.

    The combination is position-wise: in incremental decoding each step combines the new
    position's layer outputs only; nothing of earlier positions is recomputed or cached.
    """

    def __init__(self, cfg, dictionary, embed_tokens, history: LayerHistory, no_encoder_attn=False):
        self._layers_built = 0  # fairseq's constructor builds the layers in order, bottom first
        history = stream_history(cfg, "decoder", history)
        self._history_norms = _takes_over_post_norm(history, cfg.decoder.normalize_before)
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn)
        _check_history(history, self.decoder_layerdrop, "decoder")
        self.history = history
        self.gpkd_groups = GPKDConfig.from_namespace(cfg).gpkd_decoder_groups
        finish_stack(self, cfg, "decoder", cfg.decoder.layers)

    def forward_embedding(self, prev_output_tokens, incremental_state=None) -> Tensor:
        """Token and position embeddings of the (last, when incremental) target positions, T x B x C."""
        positions = None
        if self.embed_positions is not None:
            positions = self.embed_positions(
                prev_output_tokens, incremental_state=incremental_state
            )
        if incremental_state is not None:
            prev_output_tokens = prev_output_tokens[:, -1:]
            if positions is not None:
                positions = positions[:, -1:]
        x = self.embed_scale * self.embed_tokens(prev_output_tokens.contiguous())
        if self.quant_noise is not None:
            x = self.quant_noise(x)
        if self.project_in_dim is not None:
            x = self.project_in_dim(x)
        if positions is not None:
            x = x + positions
        if self.layernorm_embedding is not None:
            x = self.layernorm_embedding(x)
        return self.dropout_module(x).transpose(0, 1)

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        """fairseq's hook, called once per layer: builds layer ``index`` of N, applies the residual
        and initialisation schemes of ``cfg`` and wraps it (as the encoder's hook)."""
        index, self._layers_built = self._layers_built, self._layers_built + 1
        if index == 0:
            self.admin_profile = AdminProfile()
        layer = self.build_layer(cfg, index, cfg.decoder.layers, no_encoder_attn)
        _give_norm_to_history(layer, self._history_norms)
        layer = apply_schemes(layer, cfg, "decoder", index, cfg.decoder.layers, self.admin_profile)
        layer = apply_skipping(layer, cfg, "decoder", index, cfg.decoder.layers)
        return wrap_layer(apply_streams(layer, cfg, "decoder", index), cfg)

    def build_layer(
        self, cfg, index: int, num_layers: int, no_encoder_attn: bool = False
    ) -> nn.Module:
        """Decoder layer ``index`` (0-based, bottom first) of ``num_layers``, unwrapped (as the
        encoder's hook)."""
        return TransformerDecoderLayerBase(cfg, no_encoder_attn)

    #: how many inputs of lower layers the loop hands to `forward_layer` (multi-layer attention)
    lower_window = 0

    def forward_layer(self, idx: int, layer, x: Tensor, lower: List[Tensor], *args, **kwargs):
        """Run decoder layer `idx` on its input x (the other arguments are fairseq's layer's).
        `lower` holds the inputs of up to `lower_window` layers below it, nearest last."""
        return layer(x, *args, **kwargs)

    def encoder_memory(
        self, encoder_out: Optional[Dict[str, List[Tensor]]], idx: int, incremental_state
    ):
        """The encoder states that decoder layer `idx` attends to (the top layer's, in fairseq)."""
        if encoder_out is None or len(encoder_out["encoder_out"]) == 0:
            return None
        return encoder_out["encoder_out"][0]

    def extract_features_scriptable(
        self,
        prev_output_tokens,
        encoder_out: Optional[Dict[str, List[Tensor]]],
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        full_context_alignment: bool = False,
        alignment_layer: Optional[int] = None,
        alignment_heads: Optional[int] = None,
    ):
        if alignment_layer is None:
            alignment_layer = self.num_layers - 1
        padding_mask: Optional[Tensor] = None
        if encoder_out is not None and len(encoder_out["encoder_padding_mask"]) > 0:
            padding_mask = encoder_out["encoder_padding_mask"][0]

        x = self.forward_embedding(prev_output_tokens, incremental_state)
        tokens = prev_output_tokens if incremental_state is None else prev_output_tokens[:, -1:]
        self_attn_padding_mask: Optional[Tensor] = None
        if self.cross_self_attention or tokens.eq(self.padding_idx).any():
            self_attn_padding_mask = tokens.eq(self.padding_idx)
        self_attn_mask = None
        if incremental_state is None and not full_context_alignment:
            self_attn_mask = self.buffered_future_mask(x)

        attn: Optional[Tensor] = None
        inner_states: List[Optional[Tensor]] = [x]
        states = self.history.start(x)
        lower: List[Tensor] = []  # inputs of the layers below, kept only when lower_window > 0
        # group permutation (GPKD): in training, each group's layers in an order of this pass
        for idx, layer in enumerate(ordered(self.layers, self.gpkd_groups, self.training)):
            x_in = states.next_input()
            x, layer_attn, _ = self.forward_layer(
                idx,
                layer,
                x_in,
                lower,
                self.encoder_memory(encoder_out, idx, incremental_state),
                padding_mask,
                incremental_state,
                self_attn_mask=self_attn_mask,
                self_attn_padding_mask=self_attn_padding_mask,
                need_attn=idx == alignment_layer,
                need_head_weights=idx == alignment_layer,
            )
            if self.lower_window > 0:
                lower = (lower + [x_in])[-self.lower_window :]
            states.push(x)
            inner_states.append(self.history.hidden(x))
            if layer_attn is not None and idx == alignment_layer:
                attn = layer_attn.float().to(x)
        if attn is not None:
            if alignment_heads is not None:
                attn = attn[:alignment_heads]
            attn = attn.mean(dim=0)  # average over heads

        x = states.readout()
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        x = x.transpose(0, 1)  # T x B x C -> B x T x C
        if self.project_out_dim is not None:
            x = self.project_out_dim(x)
        extra: Dict[str, Any] = {"attn": [attn], "inner_states": inner_states}
        return x, extra


# fairseq-deep-grow (modules/common/growth.py): the layers of every Transformer stack of the package; the
# units of a history and of transparent attention count the embedding as unit 0
for _stack in (
    HistoryTransformerEncoder,
    HistoryTransformerDecoder,
    FairseqTransformerEncoder,
    FairseqTransformerDecoder,
):
    declare_stack(_stack, layers=lambda stack: {"layers": stack.layers}, unit_offset=1)
