"""Additive attention (Bahdanau et al. 2015), single- or multi-head.

* Deep-Att (Zhou et al. 2016, Eq. 9): one head, the annotations themselves are the values.
* RNMT+ (Chen et al. 2018, Sec. 4.1): multi-head additive attention, 4 heads.

For head h with d_h = attn_dim / num_heads:

    e_{h,j} = v_h . tanh(W_q^h q + W_k^h k_j)        a_{h,.} = softmax_j(e_{h,.})
    c_h     = sum_j a_{h,j} V_h k_j                  c = [c_1; ...; c_H]   (optionally W_o c)

The projections of the keys and values do not depend on the query: :meth:`precompute` does them
once per source sentence (store the result in the incremental state); :meth:`forward` then costs
one query projection and the scores per decoding step.
"""

from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class AdditiveAttention(nn.Module):
    def __init__(
        self,
        query_dim: int,
        key_dim: int,
        attn_dim: int,
        num_heads: int = 1,
        project_values: bool = True,
        out_dim: Optional[int] = None,
        dropout: float = 0.0,
    ):
        super().__init__()
        if attn_dim % num_heads != 0:
            raise ValueError(f"attention dim {attn_dim} is not divisible by {num_heads} heads")
        if not project_values and num_heads != 1:
            raise ValueError("unprojected values (Bahdanau) need a single head")
        self.num_heads = num_heads
        self.head_dim = attn_dim // num_heads
        self.query_proj = nn.Linear(query_dim, attn_dim, bias=False)
        self.key_proj = nn.Linear(key_dim, attn_dim, bias=True)
        self.value_proj = nn.Linear(key_dim, attn_dim, bias=False) if project_values else None
        self.v = nn.Parameter(torch.empty(num_heads, self.head_dim))
        nn.init.normal_(self.v, std=self.head_dim**-0.5)
        value_dim = attn_dim if project_values else key_dim
        self.out_proj = nn.Linear(value_dim, out_dim) if out_dim is not None else None
        self.dropout = dropout
        self.output_dim = out_dim if out_dim is not None else value_dim

    def precompute(self, keys: Tensor) -> Tuple[Tensor, Tensor]:
        """Project the (T x B x key_dim) keys and values once per source sentence."""
        values = keys if self.value_proj is None else self.value_proj(keys)
        return self.key_proj(keys), values

    def forward(
        self,
        query: Tensor,
        proj_keys: Tensor,
        values: Tensor,
        key_padding_mask: Optional[Tensor] = None,
    ) -> Tuple[Tensor, Tensor]:
        """query: (*, B, query_dim), e.g. one step (B x Q) or all steps (Tq x B x Q);
        proj_keys, values: from :meth:`precompute`, T x B x *; key_padding_mask: B x T (True = pad).

        Returns the context (*, B, output_dim) and the attention weights (*, B, H, T)."""
        T, B, _ = proj_keys.shape
        lead = query.shape[:-2]
        H, d = self.num_heads, self.head_dim
        q = self.query_proj(query).view(*lead, 1, B, H, d)  # broadcast over source positions
        k = proj_keys.view(T, B, H, d)
        scores = (torch.tanh(q + k) * self.v).sum(-1)  # (*, T, B, H)
        scores = scores.movedim(-3, -1)  # (*, B, H, T)
        if key_padding_mask is not None:
            scores = scores.masked_fill(key_padding_mask[:, None, :], float("-inf"))
        attn = F.softmax(scores.float(), dim=-1).type_as(scores)
        attn = F.dropout(attn, p=self.dropout, training=self.training)
        v = values.view(T, B, H, -1)
        context = torch.einsum("...bht,tbhd->...bhd", attn, v).reshape(*lead, B, -1)
        if self.out_proj is not None:
            context = self.out_proj(context)
        return context, attn
