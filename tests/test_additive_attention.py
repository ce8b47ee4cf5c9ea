"""AdditiveAttention against a naive per-head, per-position loop (Bahdanau; RNMT+ multi-head)."""

import pytest
import torch

from fairseq_deep.modules.recurrent.additive_attention import AdditiveAttention


def naive(att, query, keys, mask):
    """Direct transcription: e_{h,j} = v_h . tanh(Wq^h q + Wk^h k_j), c_h = sum_j a_{h,j} V^h k_j."""
    B, T = query.size(0), keys.size(0)
    H, d = att.num_heads, att.head_dim
    out = []
    for b in range(B):
        heads = []
        for h in range(H):
            sl = slice(h * d, (h + 1) * d)
            q = query[b] @ att.query_proj.weight[sl].T
            e = []
            for j in range(T):
                k = keys[j, b] @ att.key_proj.weight[sl].T + att.key_proj.bias[sl]
                e.append(float("-inf") if mask[b, j] else (att.v[h] * torch.tanh(q + k)).sum())
            a = torch.softmax(torch.stack([torch.as_tensor(x) for x in e]), 0)
            vals = (
                keys[:, b] if att.value_proj is None else keys[:, b] @ att.value_proj.weight[sl].T
            )
            heads.append((a[:, None] * vals).sum(0))
        c = torch.cat(heads)
        out.append(att.out_proj(c) if att.out_proj is not None else c)
    return torch.stack(out)


@pytest.mark.parametrize("heads,project,out_dim", [(1, False, None), (4, True, None), (2, True, 5)])
def test_matches_naive_loop(heads, project, out_dim):
    torch.manual_seed(0)
    att = AdditiveAttention(
        6, 7, 8, num_heads=heads, project_values=project, out_dim=out_dim
    ).eval()
    T, B = 5, 3
    keys, query = torch.randn(T, B, 7), torch.randn(B, 6)
    mask = torch.zeros(B, T, dtype=torch.bool)
    mask[1, 3:] = True
    with torch.no_grad():
        ctx, attn = att(query, *att.precompute(keys), key_padding_mask=mask)
        ref = naive(att, query, keys, mask)
    torch.testing.assert_close(ctx, ref, rtol=1e-5, atol=1e-5)
    assert attn.shape == (B, heads, T) and torch.all(attn[1, :, 3:] == 0)
    torch.testing.assert_close(attn.sum(-1), torch.ones(B, heads))


def test_all_steps_at_once_equal_step_by_step():
    torch.manual_seed(0)
    att = AdditiveAttention(6, 7, 8, num_heads=4).eval()
    keys, queries = torch.randn(5, 3, 7), torch.randn(4, 3, 6)
    pk = att.precompute(keys)
    with torch.no_grad():
        full, _ = att(queries, *pk)
        steps = torch.stack([att(q, *pk)[0] for q in queries])
    torch.testing.assert_close(full, steps)
