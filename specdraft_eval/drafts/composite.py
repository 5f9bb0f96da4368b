"""``A|B``: draft with A; where A proposes nothing, with B (e.g. ``prompt-lookup|DRAFT_DIR``).

Prompt lookup costs microseconds and, where the text repeats, proposes long runs the target accepts; a
model draft costs a few layers' worth of time per token but proposes everywhere. The composite asks its
parts in order and returns the first non-empty proposal, so each step's proposal is one part's own and
verification (greedy or rejection sampling against that part's distribution) stays exact.
"""

from __future__ import annotations

import torch

from specdraft_eval.drafts.spec import SEPARATOR
from specdraft_eval.engine.drafter import Drafter, DrafterBase, Proposal
from specdraft_eval.engine.sampling import Sampler
from specdraft_eval.errors import SpecdecError


class CompositeDrafter(DrafterBase):
    """The first of ``parts`` that proposes anything drafts the step; ``used`` counts steps per part."""

    def __init__(self, parts: list[Drafter]) -> None:
        self.parts = parts
        self.name = SEPARATOR.join(p.name for p in parts)
        self.used = [0] * len(parts)
        reading = {p.taps for p in parts if p.taps}
        if len(reading) > 1:
            raise SpecdecError(f"composite {self.name} has parts reading different hidden states of the target: "
                               "combine one feature-level head with model-free drafts")
        self.taps: tuple[int, ...] = next(iter(reading), ())
        self.drafts_trees = any(p.drafts_trees for p in parts)

    def observe(self, features: torch.Tensor) -> None:
        """Every part that reads features sees them all, whichever part drafted."""
        for part in self.parts:
            if part.taps:
                part.observe(features)

    def see(self, tokens: list[int]) -> None:
        for part in self.parts:
            part.see(tokens)

    @property
    def model(self):
        """The model of the first part that has one (its weights and depth are what the record reports)."""
        return next((p.model for p in self.parts if p.model is not None), None)

    def propose(self, tokens: list[int], num_tokens: int, sampler: Sampler) -> Proposal:
        for i, part in enumerate(self.parts):
            proposal = part.propose(tokens, num_tokens, sampler)
            if proposal.tokens:
                self.used[i] += 1
                return proposal
        return Proposal([])

    def describe(self) -> dict:
        return {name: state for part in self.parts for name, state in part.describe().items()}

    def ingest(self, tokens: list[int]) -> int:
        """Every part catches up (the most positions any part read)."""
        return max(part.ingest(tokens) for part in self.parts)

    def reset(self, capacity: int | None = None) -> None:
        for part in self.parts:
            part.reset(capacity)

    def fresh(self) -> CompositeDrafter:
        return CompositeDrafter([part.fresh() for part in self.parts])

    def fork(self) -> CompositeDrafter:
        twin = CompositeDrafter([part.fork() for part in self.parts])
        twin.used = self.used  # one count over every row of a batch
        return twin
