"""Attention for a batch's masked steps of several tokens per row, without copying the cache for grouped queries.

transformers' ``sdpa`` attention under grouped-query attention (``num_key_value_groups`` g > 1) avoids copying the
keys and values g times only for a single query token (it folds the g query heads of a KV head into its queries)
or without a mask (``enable_gqa``). A speculative step of a batch has both several tokens per row and a mask, so
each layer copied its whole cache g times (``repeat_kv``): at batch 16 × up to 512 prompt tokens, about a third of
a width-2 step on the CPU (``scripts/step_widths.py``). :func:`grouped_queries` folds the queries instead, for the
eager steps it wraps (a compiled step keeps the attention it was traced with): the g query heads of a KV head and
their ``width`` tokens become one head of g × ``width`` queries, each with its own token's mask row. Each query's
attention is the same sum over the same keys, so the logits match the unfolded ones (tests: ``tests/test_batch.py``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS


def folded_sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' ``sdpa`` attention, with a masked step's grouped query heads folded into their KV heads.

    query ``[rows, heads, width, dim]``; key, value ``[rows, kv heads, positions, dim]``; attention_mask
    ``[rows, 1, width, positions]``. Returns ``[rows, width, heads, dim]`` as ``sdpa_attention_forward`` does."""
    groups = getattr(module, "num_key_value_groups", 1)
    rows, heads, width, dim = query.shape
    if groups == 1 or width == 1 or attention_mask is None or attention_mask.shape[1] != 1:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    kv_heads, positions = heads // groups, attention_mask.shape[-1]
    folded = query.reshape(rows, kv_heads, groups * width, dim)  # head h = k·g + j, token t → query j·width + t
    mask = attention_mask[:, :, None].expand(rows, 1, groups, width, positions).reshape(rows, 1, groups * width,
                                                                                       positions)
    out = torch.nn.functional.scaled_dot_product_attention(folded, key, value, attn_mask=mask, dropout_p=dropout,
                                                           scale=scaling)  # [rows, kv heads, g × width, dim]
    return out.reshape(rows, heads, width, dim).transpose(1, 2).contiguous(), None


@contextmanager
def grouped_queries(width: int, masked: bool) -> Iterator[None]:
    """Within this block, ``sdpa`` attention is :func:`folded_sdpa` (for a masked step ``width`` tokens wide), where it
    is transformers' own (an ``sdpa`` the user registered is left alone)."""
    if width == 1 or not masked or ALL_ATTENTION_FUNCTIONS["sdpa"] is not sdpa_attention_forward:
        yield
        return
    ALL_ATTENTION_FUNCTIONS["sdpa"] = folded_sdpa
    try:
        yield
    finally:
        del ALL_ATTENTION_FUNCTIONS["sdpa"]
