"""The narrow interface for anything that proposes tokens (cf. transformers' CandidateGenerator)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from specdraft_eval.engine.sampling import Sampler


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

    taps: tuple[int, ...]
    """Which of the target's hidden states the draft reads back (cf. transformers' ``update_candidate_strategy``):
    ``i`` is the input of decoder layer i, :data:`FINAL` the last hidden state after the final norm; () for none."""

    def observe(self, features: torch.Tensor) -> None:
        """Feedback after each target pass (prefill and verification): ``[n, len(taps) * hidden]``, the target's
        hidden states at ``taps`` for the n positions this row kept, in order. Called only when ``taps``."""
        ...


FINAL = -1
"""A tap: the target's last hidden state after its final norm (the input of its output head)."""


class DrafterBase:
    """The :class:`Drafter` defaults a draft kind subclasses: no model, no state (``reset`` does nothing, ``fork``
    returns the drafter itself) and no features read back (``taps = ()``). Set ``name``, implement ``propose``,
    and override the rest where they do not fit (a drafter with a KV cache resets and forks it)."""

    name: str
    model: torch.nn.Module | None = None
    taps: tuple[int, ...] = ()

    def propose(self, tokens: list[int], num_tokens: int, sampler: Sampler) -> Proposal:
        raise NotImplementedError(f"{type(self).__name__} must implement propose(tokens, num_tokens, sampler)")

    def reset(self, capacity: int | None = None) -> None:
        """Nothing to forget."""

    def fork(self) -> DrafterBase:
        """Stateless: every row may share this drafter."""
        return self

    def observe(self, features: torch.Tensor) -> None:
        """Nothing to read."""
