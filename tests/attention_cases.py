"""Shared-prefix attention cases and their reference in PyTorch, for the tests of the update's
attention kernels (`interpreted_triton.py`, `test_flash_varlen.py`)."""

import torch

from rlvr.models import fused
from rlvr.models.cpu_kernels import AttentionLayout


def packed_attention_reference(q, k, v, pk, pv, layout: AttentionLayout, scale: float):
    """`gpu_kernels.attention` in PyTorch: each row's keys laid out as its prefix's and then its
    own (zeros where not computed), the layout's visibility as an additive mask,
    `fused.attention`, and the outputs of the computed positions gathered back."""
    b, t = layout.rows.shape
    computed = layout.rows >= 0
    per_token = layout.rows[computed]  # the per-token row of each computed (b, i), in order
    where = computed.reshape(-1).nonzero().squeeze(-1)
    row_prefix = torch.searchsorted(layout.starts, torch.arange(b), right=True) - 1

    def laid_out(x: torch.Tensor) -> torch.Tensor:
        """[b, heads, t, dim] from per-token x, zeros where not computed."""
        full = x.new_zeros(b * t, *x.shape[1:]).index_copy(0, where, x[per_token])
        return full.view(b, t, *x.shape[1:]).transpose(1, 2)

    keys, values = (
        torch.cat([pre[row_prefix], laid_out(x)], dim=2) for pre, x in ((pk, k), (pv, v))
    )
    position = torch.arange(t)
    own = (layout.own_mask.bool() & computed)[:, None, :] & (position[None, :] <= position[:, None])
    own |= torch.eye(t, dtype=torch.bool)
    prefix = layout.prefix_mask.bool()[row_prefix][:, None, :].expand(b, t, -1)
    bias = fused.additive_bias(torch.cat([prefix, own], dim=2), q.dtype)
    out = fused.attention(laid_out(q), keys, values, bias, scale).transpose(1, 2)
    return q.new_empty(q.shape).index_copy(0, per_token, out.reshape(b * t, *q.shape[1:])[where])


def packed_attention_case(
    heads: int, kv_heads: int, dim: int, t: int, sp: int, hidden_key: bool = True,
    shuffled: bool = True,
):  # fmt: skip
    """Two prefixes of three and two rows, t positions per row: row 0 all computed (with an own
    key hidden from the queries after it, unless not `hidden_key`), row 1 its first two
    thirds, row 2 none, row 3 one block of 64, row 4 a few; the per-token rows in a shuffled
    order (in row order unless `shuffled`). The prefixes' keys are a transposed view, as
    `kv_cache.ConcatKV` keeps a prompt's; the first has 10 padded keys, the second a hidden one
    in the middle."""
    g = torch.Generator().manual_seed(4)
    lengths = [t, 2 * t // 3, 0, min(64, t), 5]
    computed = torch.arange(t)[None, :] < torch.tensor(lengths)[:, None]
    n = int(computed.sum())
    rows = torch.full((5, t), -1, dtype=torch.long)
    order = torch.randperm(n, generator=g)
    rows[computed] = order if shuffled else torch.arange(n)
    own_mask = torch.ones(5, t, dtype=torch.long)
    own_mask[0, 3] = 0 if hidden_key else 1
    prefix_mask = torch.ones(2, sp, dtype=torch.long)
    prefix_mask[0, :10] = 0
    prefix_mask[1, sp // 2] = 0
    layout = AttentionLayout(rows, own_mask, prefix_mask, torch.tensor([0, 3, 5]))
    q = torch.randn(n, heads, dim, generator=g)
    k, v = (torch.randn(n, kv_heads, dim, generator=g) for _ in range(2))
    pk, pv = (torch.randn(2, sp, kv_heads, dim, generator=g).transpose(1, 2) for _ in range(2))
    return (q, k, v, pk, pv), layout
