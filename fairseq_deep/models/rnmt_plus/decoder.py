"""The RNMT+ decoder (Chen et al. 2018, Sec. 4.1, Fig. 1).

Unidirectional layer-normalized LSTM layers.  The bottom layer's output queries a multi-head
additive attention over the (projected) encoder output; the attention context is fed to every
decoder layer and to the softmax.  As in lingvo's ``FRNNWithAttention``, the bottom layer reads
the previous step's context (input feeding) and its output at step t gives the context of step t,
which every upper layer and the softmax read at step t.  Residual connections from the third layer
up; dropout on the embeddings, on each layer output before it is added, and on the attention.
With ``--dlcl-stacks decoder|both`` layers 2..L and the softmax read a dynamic linear combination
of the layer outputs below them, as in the encoder (the loop of ``stack.py``); it is position-wise,
so incremental decoding needs no extra state.

Incremental decoding keeps each layer's (h, c), the last context, the projected encoder keys
and values and the source mask (computed once per sentence) in the incremental state; all are
reordered with the beam.  A step makes the host wait for the device nowhere (the mask's "is there
padding at all" is asked once per batch): ``benchmarks/step_cost.py`` counts it.
"""

from typing import Any, Dict, List, Optional

import torch
import torch.nn.functional as F
from fairseq.models import FairseqIncrementalDecoder
from torch import Tensor, nn

from ...modules.common.growth import declare_stack
from ...modules.common.reorder import reorder_batch
from ...modules.recurrent.additive_attention import AdditiveAttention
from ...modules.recurrent.ln_lstm import LayerNormLSTM
from .config import RNMTPlusConfig
from .stack import build_history, layer_output, residual_role, run_stack

CACHE = "rnmt_state"


class RNMTPlusDecoder(FairseqIncrementalDecoder):
    def __init__(self, args, dictionary, embed_tokens: nn.Embedding, encoder_output_dim: int):
        super().__init__(dictionary)
        args = RNMTPlusConfig.from_namespace(
            args
        )  # the dataclass defaults where a namespace has none
        self.embed_tokens = embed_tokens
        self.padding_idx = embed_tokens.padding_idx
        self.max_target_positions = args.max_target_positions
        self.dropout = args.dropout
        self.num_layers = args.decoder_layers
        self.residual_start = args.rnmt_decoder_residual_start
        E = embed_tokens.embedding_dim
        H = self.hidden_size = args.decoder_hidden_size
        if self.num_layers < 1:
            raise ValueError(f"--decoder-layers must be at least 1, got {self.num_layers}")
        if self.residual_start == 1 and E != H:
            raise ValueError(
                f"--rnmt-decoder-residual-start 1 adds the embedding ({E}) to the first layer's "
                f"output ({H}): use 2 or more, or --decoder-embed-dim {H}"
            )
        if H % args.rnmt_attention_heads != 0:
            raise ValueError(
                f"--decoder-hidden-size {H} is not divisible by --rnmt-attention-heads "
                f"{args.rnmt_attention_heads}"
            )
        self.attention = AdditiveAttention(
            query_dim=H,
            key_dim=encoder_output_dim,
            attn_dim=H,
            num_heads=args.rnmt_attention_heads,
            project_values=True,
            dropout=args.attention_dropout,
        )
        C = self.context_dim = self.attention.output_dim
        init = args.rnmt_init_scale or None
        self.layers = nn.ModuleList(
            LayerNormLSTM(
                (E if i == 0 else H) + C,
                H,
                cell_clip=args.rnmt_cell_clip,
                output_tanh=args.rnmt_output_tanh,
                init_scale=init,
                layer_norm=not args.rnmt_no_layer_norm,
                impl=str(args.rnmt_lstm_impl),
            )
            for i in range(self.num_layers)
        )
        self.history = build_history(args, "decoder", self.num_layers, H)
        self.share_input_output_embed = args.share_decoder_input_output_embed
        if self.share_input_output_embed:
            self.project_out_dim = nn.Linear(H + C, E, bias=False)
            self.output_projection = nn.Linear(E, len(dictionary), bias=False)
            self.output_projection.weight = embed_tokens.weight
        else:
            self.project_out_dim = None
            self.output_projection = nn.Linear(H + C, len(dictionary), bias=False)
            nn.init.normal_(self.output_projection.weight, std=(H + C) ** -0.5)

    # -- state ------------------------------------------------------------------------------

    def _initial_state(
        self, encoder_out, batch_size: int, like: Tensor
    ) -> Dict[str, Optional[Tensor]]:
        keys, values = self.attention.precompute(encoder_out["encoder_out"][0])
        zeros = like.new_zeros(self.num_layers, batch_size, self.hidden_size)
        # whether the attention needs the source mask is asked once per batch, not at every step
        # (the question makes the host wait for the device)
        masks = encoder_out["encoder_padding_mask"]
        padding_mask = masks[0] if len(masks) > 0 and masks[0].any() else None
        return {
            "hiddens": zeros,
            "cells": zeros,
            "context": like.new_zeros(batch_size, self.context_dim),
            "keys": keys,
            "values": values,
            "padding_mask": padding_mask,
        }

    def reorder_incremental_state(self, incremental_state, new_order: Tensor):
        state = self.get_incremental_state(incremental_state, CACHE)
        if state is None:
            return
        # layers x B x H states, S x B x A keys and values; the context is B x C, the mask B x S
        new_state = reorder_batch(state, new_order, ("hiddens", "cells", "keys", "values"))
        self.set_incremental_state(incremental_state, CACHE, new_state)

    # -- forward ------------------------------------------------------------------------------

    def forward(
        self,
        prev_output_tokens,
        encoder_out=None,
        incremental_state=None,
        features_only: bool = False,
        **kwargs,
    ):
        x, extra = self.extract_features(prev_output_tokens, encoder_out, incremental_state)
        if not features_only:
            x = self.output_layer(x)
        return x, extra

    def extract_features(
        self, prev_output_tokens, encoder_out=None, incremental_state=None, **kwargs
    ):
        if encoder_out is None:
            raise ValueError("the RNMT+ decoder attends an encoder: encoder_out is required")
        if incremental_state is not None:
            prev_output_tokens = prev_output_tokens[:, -1:]
        B, T = prev_output_tokens.shape
        x = self.embed_tokens(prev_output_tokens)
        x = F.dropout(x, p=self.dropout, training=self.training).transpose(0, 1)  # T x B x E

        state = None
        if incremental_state is not None:
            state = self.get_incremental_state(incremental_state, CACHE)
        if state is None:
            state = self._initial_state(encoder_out, B, x)
        keys, values, padding_mask = state["keys"], state["values"], state["padding_mask"]
        hiddens, cells = state["hiddens"], state["cells"]

        # Bottom layer: one step at a time, its output queries the attention.
        bottom = self.layers[0]
        E = x.size(-1)
        w_emb, w_ctx = bottom.weight_ih[:, :E], bottom.weight_ih[:, E:]
        gates_emb = F.linear(x, w_emb)  # all steps at once
        h, c = hiddens[0:1], cells[0:1]
        context = state["context"]
        outs, contexts, attns = [], [], []
        for t in range(T):
            gates = (gates_emb[t] + F.linear(context, w_ctx)).unsqueeze(0)  # 1 x B x 4H
            h, c = bottom.step(gates, (h, c))
            context, attn = self.attention(h[0], keys, values, padding_mask)
            outs.append(h[0])
            contexts.append(context)
            attns.append(attn)
        new_h, new_c = [h], [c]
        ctx = torch.stack(contexts)  # T x B x C

        def run_layer(i: int, x: Tensor) -> Tensor:  # layers 2..L read the context of their step
            y, (h, c) = self.layers[i](
                torch.cat([x, ctx], dim=-1), state=(hiddens[i : i + 1], cells[i : i + 1])
            )
            new_h.append(h)
            new_c.append(c)
            return layer_output(i, x, y, self.residual_start, self.dropout, self.training)

        outputs: List[Tensor] = []
        first = layer_output(
            0, x, torch.stack(outs), self.residual_start, self.dropout, self.training
        )
        inner_states: List[Optional[Tensor]] = [x]
        x = run_stack(self.history, first, self.num_layers, run_layer, outputs).readout()
        inner_states.extend(outputs)

        if incremental_state is not None:
            self.set_incremental_state(
                incremental_state,
                CACHE,
                {
                    "hiddens": torch.cat(new_h),
                    "cells": torch.cat(new_c),
                    "context": context,
                    "keys": keys,
                    "values": values,
                    "padding_mask": padding_mask,
                },
            )

        features = torch.cat([x, ctx], dim=-1).transpose(0, 1)  # B x T x (H + C)
        attn_weights = torch.stack(attns).mean(dim=2).transpose(0, 1)  # B x T x S, heads averaged
        extra: Dict[str, Any] = {"attn": [attn_weights], "inner_states": inner_states}
        return features, extra

    def output_layer(self, features):
        if self.project_out_dim is not None:
            features = self.project_out_dim(features)
        return self.output_projection(features)

    def max_positions(self):
        return self.max_target_positions


# fairseq-deep-grow (modules/common/growth.py): as the encoder's (rnmt_plus/encoder.py)
declare_stack(
    RNMTPlusDecoder,
    layers=lambda stack: {"layers": stack.layers},
    unit_offset=0,
    layer_role=residual_role,
)
