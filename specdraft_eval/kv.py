"""KV-cache helpers shared by the engine (target) and model drafts."""

from __future__ import annotations

import torch
from transformers import DynamicCache


def new_cache() -> DynamicCache:
    return DynamicCache()


def rollback(cache: DynamicCache, length: int) -> None:
    """Drop cached positions past ``length`` (transformers' ``crop`` takes minus the count to drop)."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


def forward(model, tokens: list[int], cache: DynamicCache, keep_logits: int) -> torch.Tensor:
    """Run ``tokens`` through ``model`` on top of ``cache``; return the last ``keep_logits`` logits rows."""
    ids = torch.tensor([tokens], dtype=torch.long, device=model.device)
    out = model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=keep_logits)
    return out.logits[0]
