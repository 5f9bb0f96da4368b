"""A draft that is a causal LM with its own KV cache: a separate small model or a layer view."""

from __future__ import annotations

import torch

from specdraft_eval import kv
from specdraft_eval.drafts.base import Proposal
from specdraft_eval.sampling import Sampler


class ModelDrafter:
    """Drafts autoregressively with ``model``; keeps its cache across steps and rolls it back.

    ``vocab_size`` is the target's: logits beyond it (padding rows of a larger head) are never drafted.
    """

    def __init__(self, model, name: str, vocab_size: int) -> None:
        self.model, self.name, self.vocab_size = model, name, vocab_size
        self.reset()

    def reset(self) -> None:
        self._cache = kv.new_cache()
        self._cached: list[int] = []  # the tokens whose keys/values are in the cache

    def _common_prefix(self, tokens: list[int]) -> int:
        limit = min(len(self._cached), len(tokens) - 1)  # always feed at least one token
        n = 0
        while n < limit and self._cached[n] == tokens[n]:
            n += 1
        return n

    def propose(self, tokens: list[int], num_tokens: int, sampler: Sampler) -> Proposal:
        keep = self._common_prefix(tokens)
        kv.rollback(self._cache, keep)
        logits = kv.forward(self.model, tokens[keep:], self._cache, 1)[-1, : self.vocab_size]
        drafted: list[int] = []
        rows: list[torch.Tensor] = []
        for i in range(num_tokens):
            if sampler.do_sample:
                probs = sampler.probs(logits[None])
                token = int(sampler.sample(probs))
                rows.append(probs[0])
            else:
                token = int(logits.argmax())
            drafted.append(token)
            if i + 1 < num_tokens:
                logits = kv.forward(self.model, [token], self._cache, 1)[-1, : self.vocab_size]
        self._cached = tokens + drafted[:-1]
        return Proposal(drafted, torch.stack(rows) if rows else None)
