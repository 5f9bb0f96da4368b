"""The narrow interface for anything that proposes tokens (cf. transformers' CandidateGenerator)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from specdraft_eval.sampling import Sampler


@dataclass
class Proposal:
    """Drafted tokens, and when the draft sampled, the warped distribution each came from.

    ``probs`` is ``[len(tokens), vocab]``, or None for a deterministic proposal (one-hot at each
    token: greedy model drafts and prompt lookup), which rejection sampling handles exactly.
    """

    tokens: list[int]
    probs: torch.Tensor | None = None


class Drafter(Protocol):
    """Proposes up to ``num_tokens`` continuations of ``tokens``; the target verifies them."""

    name: str
    model: torch.nn.Module | None
    """The draft's own causal LM (its size goes into the record), or None for a model-free kind."""

    def propose(self, tokens: list[int], num_tokens: int, sampler: Sampler) -> Proposal:
        """Draft up to ``num_tokens`` tokens following ``tokens`` (the whole sequence so far)."""
        ...

    def reset(self, capacity: int | None = None) -> None:
        """Forget all state (KV cache) before a new generation; ``capacity``: the most tokens the generation will
        hold, for a static KV cache of that size (None: a growing one)."""
        ...

    def fork(self) -> Drafter:
        """A drafter with the same weights or tables but state of its own, for one row of a batch (a stateless
        drafter may return itself)."""
        ...
