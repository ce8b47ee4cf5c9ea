"""Deep-Att / Deep-ED decoder (Zhou et al. 2016, Sec. 3.1, Eq. 9, 10).

A single column of forward F-F LSTM layers.  Layer 1 reads x_t = [c_t, y_{t-1}] (Eq. 10) with
y_0 = 0; c_t is the static vector of Deep-ED, or for Deep-Att the additive attention (Bahdanau)
over the projected interface W_p e, queried by the first layer's previous output h^1_{t-1}
(Eq. 8, 9).  The softmax reads Dr(h) of the top layer only.

Because c_t depends on h^1_{t-1}, layer 1 runs step by step (its y-part of W_f for all steps at
once); layers 2..n_d then run over the whole sequence.  Incremental decoding keeps (h, s) of every
layer and the attention's key projection (computed once per sentence) in the incremental state;
the f of each layer is recomputed from the step's input, so a step equals the full pass.

Precision: with float16/bfloat16 parameters or under autocast, everything up to the top h (the
stack, c_t and the attention, which read the float32 interface) runs in float32, as explained in
:mod:`fairseq_deep.modules.recurrent.fast_forward_lstm`; the top h, in [-1, 1], returns to the output projection's
dtype.  The incremental state is float32 then.  Under ``.half()``
(--fp16) every parameter but the output projection stays float32 (issue 24): the unscaled
gradients of the F-F stack, the embeddings and the attention pass 65504 (see
:mod:`fairseq_deep.modules.recurrent.fast_forward_lstm`), so only the output layer runs in float16.
"""

from typing import Dict, List, Optional

import torch
import torch.nn.functional as F
from fairseq.models import FairseqIncrementalDecoder
from torch import Tensor, nn

from ...modules.common.growth import declare_stack
from ...modules.common.precision import Float32UnderHalf
from ...modules.common.reorder import reorder_batch
from ...modules.recurrent.additive_attention import AdditiveAttention
from ...modules.recurrent.fast_forward_lstm import (
    FFLSTMStack,
    no_autocast,
    wide_dtype,
    wide_linear,
    with_dtype,
)
from .config import DeepAttConfig


class DeepAttDecoder(Float32UnderHalf, FairseqIncrementalDecoder):
    def __init__(self, args, dictionary, embed_tokens: nn.Embedding, context_dim: int):
        super().__init__(dictionary)
        args = DeepAttConfig.from_namespace(
            args
        )  # the dataclass defaults where a namespace has none
        self.embed_tokens = embed_tokens
        self.max_target_positions = args.max_target_positions
        self.dropout = args.dropout
        self.context_dim = context_dim
        H, n = args.decoder_hidden_size, args.decoder_layers
        self.stack = FFLSTMStack(
            context_dim + embed_tokens.embedding_dim,
            H,
            [False] * n,
            ff_mode=args.ff_mode,
            dropout=args.dropout,
            impl=args.deep_att_cell_impl,
        )
        self.attention = None
        if args.ff_interface == "att":
            self.attention = AdditiveAttention(
                H, context_dim, args.ff_attention_dim or H, num_heads=1, project_values=False
            )
        self.output_projection = nn.Linear(H, len(dictionary))

    def forward(
        self,
        prev_output_tokens,
        encoder_out=None,
        incremental_state=None,
        features_only: bool = False,
        **unused,
    ):
        x, extra = self.extract_features(prev_output_tokens, encoder_out, incremental_state)
        if not features_only:
            x = self.output_layer(x)
        return x, extra

    def extract_features(
        self, prev_output_tokens, encoder_out=None, incremental_state=None, **unused
    ):
        cache = None
        if incremental_state is not None:
            prev_output_tokens = prev_output_tokens[:, -1:]
            cache = self.get_incremental_state(incremental_state, "state")
        y = self.embed_tokens(prev_output_tokens).transpose(0, 1)  # T x B x E
        if cache is None:  # y_0 = 0 (Eq. 10)
            y = torch.cat([torch.zeros_like(y[:1]), y[1:]], dim=0)
        n = len(self.stack.layers)
        states = None if cache is None else [(cache[f"h{k}"], cache[f"s{k}"]) for k in range(n)]
        context = encoder_out["encoder_out"][0]
        attn = None
        new_cache: Dict[str, Optional[Tensor]] = {}
        if self.attention is None:  # Deep-ED: c_t = e, constant
            x = torch.cat([context.expand(y.size(0), -1, -1), y.to(context.dtype)], dim=-1)
            f, h, states, _ = self.stack(x, None, states)
        else:
            mask = encoder_out["encoder_padding_mask"]
            mask = mask[0] if len(mask) > 0 else None
            # keys = precompute(context)[0] (values are not projected), in float32 under --fp16
            keys = (
                cache["keys"]
                if cache is not None
                else wide_linear(self.attention.key_proj, context)
            )
            new_cache["keys"] = keys
            first, attn = self._first_layer(y, context, keys, mask, states)
            f, h, states, _ = self.stack(None, None, states, first=first)
        for k, (hk, sk) in enumerate(states):
            new_cache[f"h{k}"], new_cache[f"s{k}"] = hk, sk
        if incremental_state is not None:
            self.set_incremental_state(incremental_state, "state", new_cache)
        h = F.dropout(
            h.to(self.output_projection.weight.dtype), p=self.dropout, training=self.training
        )
        return h.transpose(0, 1), {"attn": [attn], "inner_states": [h]}

    def _first_layer(self, y: Tensor, values: Tensor, keys: Tensor, mask: Optional[Tensor], states):
        """Layer 1 of Deep-Att, step by step: c_t from h^1_{t-1} (Eq. 9), f^1_t = W_f^1 [c_t, y_t]."""
        layer = self.stack.layers[0]
        dt = wide_dtype(y)  # float32 for float16/bfloat16 or under autocast
        w_c, w_y = layer.proj.weight.to(dt).split([self.context_dim, y.size(-1)], dim=1)
        with no_autocast(y):
            pre = F.linear(y.to(dt), w_y, layer.proj.bias.to(dt))  # the y-part of f^1, all steps
        h, s = states[0] if states is not None else layer.cell.zero_state(y.size(1), y)
        h, s = h.to(dt), s.to(dt)
        attention = with_dtype(self.attention, dt)
        fs: List[Tensor] = []
        hs: List[Tensor] = []
        attns: List[Tensor] = []
        for t in range(y.size(0)):
            with no_autocast(y):
                c, a = attention(h, keys, values, mask)  # B x C, B x 1 x S
                f_t = pre[t] + F.linear(c, w_c)
            out, (h, s) = layer.cell(f_t[None], (h, s))
            fs.append(f_t)
            hs.append(out[0])
            attns.append(a[:, 0])
        attn = torch.stack(attns, dim=1)  # B x T x S
        return (torch.stack(fs), torch.stack(hs), (h, s)), attn

    def _apply(self, fn, recurse=True):
        """The output projection follows ``fn`` (float16 under ``.half()``/--fp16); every other
        parameter stays float32 there (:class:`Float32UnderHalf`, issue 24)."""
        if recurse:
            self.output_projection._apply(fn)
        return super()._apply(fn, recurse)  # applying fn again to the projection changes nothing

    def output_layer(self, features):
        return self.output_projection(features)

    def reorder_incremental_state(self, incremental_state, new_order: Tensor):
        cache = self.get_incremental_state(incremental_state, "state")
        if cache is None:
            return
        # the attention keys are S x B x A, every (h, s) B x H
        self.set_incremental_state(
            incremental_state, "state", reorder_batch(cache, new_order, ("keys",))
        )

    def max_positions(self):
        return self.max_target_positions


# fairseq-deep-grow (modules/common/growth.py): the decoder's one column of F-F LSTM layers
declare_stack(DeepAttDecoder, layers=lambda stack: {"stack.layers": stack.stack.layers})
