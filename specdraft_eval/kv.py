"""KV-cache helpers shared by the engine (target) and model drafts: a growing cache (transformers'
``DynamicCache``) or a static one preallocated to a capacity (``StaticCache``: no tensor changes shape from step
to step, which CUDA graphs need). Both roll back by length."""

from __future__ import annotations

import torch
from transformers import DynamicCache, StaticCache
from transformers.cache_utils import Cache


def new_cache(config=None, capacity: int | None = None) -> Cache:
    """A growing cache, or with ``capacity`` a static one of that many positions for a model of ``config``."""
    return DynamicCache() if capacity is None else StaticCache(config=config, max_cache_len=capacity)


def is_static(cache: Cache) -> bool:
    return isinstance(cache, StaticCache)


def length(cache: Cache) -> int:
    """Cached positions (a static cache's filled prefix)."""
    return int(cache.get_seq_length())


def rollback(cache: Cache, keep: int) -> None:
    """Drop cached positions past ``keep`` (transformers' ``crop`` takes minus the count to drop; a static cache
    only moves its length, and the next write overwrites what was dropped)."""
    extra = length(cache) - keep
    if extra > 0:
        cache.crop(-extra)


def select_rows(cache: Cache, index: torch.Tensor) -> None:
    """Keep only the batch rows ``index`` (in that order)."""
    for layer in cache.layers:
        if is_static(cache):
            layer.keys, layer.values = layer.keys[index], layer.values[index]
            layer.batch_size = len(index)
        else:
            layer.batch_select_indices(index)


def forward(model, tokens: list[int], cache: Cache, keep_logits: int) -> torch.Tensor:
    """Run ``tokens`` through ``model`` on top of ``cache``; return the last ``keep_logits`` logits rows."""
    ids = torch.tensor([tokens], dtype=torch.long, device=model.device)
    out = model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=keep_logits)
    return out.logits[0]
