"""The narrow interface for anything that proposes tokens (cf. transformers' CandidateGenerator)."""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Protocol

import torch

from specdraft_eval.engine.sampling import Sampler


@dataclass
class Proposal:
    """Drafted tokens, as one chain or as a tree of candidate continuations, and when the draft sampled, the warped
    distribution each came from.

    ``parents`` None: a chain (token i follows token i - 1). Otherwise token i follows ``parents[i]``, -1 being the
    last emitted token (the root), every parent before its children (a chain is ``[-1, 0, 1, ...]``); the target
    verifies every node in one pass and keeps the longest path it agrees with. ``probs`` is ``[len(tokens), vocab]``
    for a sampled chain, or None for a deterministic proposal (one-hot at each token: greedy model drafts, prompt
    lookup, top-k and lookup trees), which rejection sampling handles exactly, several children at once for trees.
    """

    tokens: list[int]
    probs: torch.Tensor | None = None
    parents: list[int] | None = None

    def __post_init__(self) -> None:
        if self.parents is not None:
            if len(self.parents) != len(self.tokens) or any(not -1 <= p < i for i, p in enumerate(self.parents)):
                raise ValueError(f"a tree's parents must come before their children: {self.parents}")
            if self.probs is not None:
                raise ValueError("a tree's nodes must not depend on the draft's random draws (probs=None)")

    @property
    def tree(self) -> list[int]:
        """Each node's parent (-1: the root): ``parents``, or a chain's."""
        return self.parents if self.parents is not None else list(range(-1, len(self.tokens) - 1))

    @property
    def depths(self) -> list[int]:
        """Each node's depth (1: a child of the root)."""
        depths: list[int] = []
        for parent in self.tree:
            depths.append(1 + (depths[parent] if parent >= 0 else 0))
        return depths

    @property
    def depth(self) -> int:
        """Nodes on the longest root-to-leaf path (a chain: its length)."""
        return max(self.depths, default=0)


def merge(continuations: list[list[int]], budget: int) -> Proposal:
    """Continuations of the same sequence merged into one token tree (shared prefixes once), breadth first across
    them in their order, at most ``budget`` nodes: one continuation is a chain, several are as wide at depth 1 as
    they disagree there. An empty list proposes nothing."""
    tokens: list[int] = []
    parents: list[int] = []
    node_of: dict[tuple[int, ...], int] = {}  # a prefix -> its node
    for depth in range(max(map(len, continuations), default=0)):
        for continuation in continuations:
            prefix = tuple(continuation[: depth + 1])
            if len(prefix) == depth + 1 and prefix not in node_of:
                if len(tokens) == budget:
                    return Proposal(tokens, parents=parents) if len(continuations) > 1 else Proposal(tokens)
                node_of[prefix] = len(tokens)
                tokens.append(prefix[-1])
                parents.append(node_of[prefix[:-1]] if depth else -1)
    return Proposal(tokens, parents=parents) if len(continuations) > 1 else Proposal(tokens)


def static_tree(topk: int, depth: int, nodes: int) -> list[tuple[int, ...]]:
    """A static tree of ``nodes`` paths of child ranks (Medusa's and vLLM's ``speculative_token_tree`` form) for a
    dynamic top-``topk`` tree ``depth`` deep: the paths a head whose rank-r choice is accepted with probability
    proportional to 1/(r + 1) at every depth would rank first (best-first; parents before children)."""
    chosen: list[tuple[int, ...]] = []
    heap = [(-1.0 / (rank + 1), 1, (rank,)) for rank in range(topk)]  # ties: the shallower path first
    heapq.heapify(heap)
    while heap and len(chosen) < nodes:
        negative, length, path = heapq.heappop(heap)
        chosen.append(path)
        if length < depth:
            for rank in range(topk):
                heapq.heappush(heap, (negative / (rank + 1), length + 1, path + (rank,)))
    return sorted(chosen, key=lambda path: (len(path), path))


def tree_parents(paths: list[tuple[int, ...]]) -> list[int]:
    """Each path's parent index in ``paths`` (-1: the root), for paths ordered parents first."""
    index = {path: i for i, path in enumerate(paths)}
    return [index[path[:-1]] if len(path) > 1 else -1 for path in paths]


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

    def ingest(self, tokens: list[int]) -> int:
        """Read what the draft has not seen of ``tokens`` but the last (which ``propose`` reads): the prompt before a
        generation's first draft, and what was emitted while it drafted nothing (dynamic γ at 0). Returns how many
        positions it read (0 for a draft without such state); the engine times this as the draft's prefill."""
        ...

    def fork(self) -> Drafter:
        """A drafter with the same weights or tables but state of its own, for one row of a batch (a stateless
        drafter may return itself)."""
        ...

    def fresh(self) -> Drafter:
        """A drafter with the same weights, tables and warm start but none of the state earlier generations left
        (a suffix cache's responses): what every measurement starts from, so that no repeat, γ policy or batch size
        inherits another's corpus. A drafter whose state ends with each generation may return itself."""
        ...

    drafts_trees: bool
    """Whether ``propose`` may return token trees (a compiled run then also warms up the tree step)."""

    taps: tuple[int, ...]
    """Which of the target's hidden states the draft reads back (cf. transformers' ``update_candidate_strategy``):
    ``i`` is the input of decoder layer i, :data:`FINAL` the last hidden state after the final norm; () for none."""

    def observe(self, features: torch.Tensor) -> None:
        """Feedback after each target pass (prefill and verification): ``[n, len(taps) * hidden]``, the target's
        hidden states at ``taps`` for the n positions this row kept, in order. Called only when ``taps``."""
        ...

    def see(self, tokens: list[int]) -> None:
        """The row's whole sequence after its prefill and after every step, drafted or not, its last step's
        included (vLLM's proposers see every step's sampled tokens): a draft that keeps what a run generates (a
        suffix cache) adds them; others ignore it."""
        ...

    def batch_drafter(self, count: int) -> BatchDrafter:
        """Drafting for a batch of ``count`` rows (the engine's only way in): one call drafts every row."""
        ...

    def describe(self) -> dict:
        """State the record reports beside the counters (e.g. a corpus's size at the run's start and end), by
        name; {} for none."""
        ...


class BatchDrafter(Protocol):
    """A batch's drafting (cf. vLLM's proposers): every live row's state, one call per step for all of them. Row
    indices are the live rows' positions, renumbered when rows leave (:meth:`select`). :class:`RowByRowDrafter` drafts
    row by row with a drafter's forks; a kind that can draft every row in one pass (a head, a model) returns its own."""

    def reset(self, capacity: int | None = None) -> None:
        """Forget all state before a batch (``capacity``: as :meth:`Drafter.reset`)."""
        ...

    def ingest(self, tokens: list[list[int]], rows: list[int]) -> list[int]:
        """:meth:`Drafter.ingest` for each of ``rows`` (``tokens``: every live row's sequence): positions read."""
        ...

    def propose(self, tokens: list[list[int]], budgets: list[int], samplers: list[Sampler]) -> list[Proposal]:
        """Each live row's proposal of up to ``budgets[row]`` tokens after ``tokens[row]`` (0: none)."""
        ...

    def observe(self, row: int, features: torch.Tensor) -> None:
        """:meth:`Drafter.observe` for one row."""
        ...

    def see(self, tokens: list[list[int]], rows: list[int]) -> None:
        """:meth:`Drafter.see` for each of ``rows`` (``tokens``: every live row's sequence): after the prefill
        every row, after a step the rows it finished (a row that goes on sees its tokens when next asked to
        :meth:`propose`, whatever its budget, as vLLM's proposer adds a request's tokens just before drafting)."""
        ...

    def select(self, rows: list[int]) -> None:
        """Only the live ``rows`` stay (the others finished), in this order."""
        ...


class RowByRowDrafter:
    """:class:`BatchDrafter` as one drafter per row (the first the drafter itself, the rest its forks), each asked in
    turn: model-free kinds, whose proposals cost microseconds per row."""

    def __init__(self, drafter: Drafter, count: int) -> None:
        self.drafters = [drafter] + [drafter.fork() for _ in range(count - 1)]

    def reset(self, capacity: int | None = None) -> None:
        for drafter in self.drafters:
            drafter.reset(capacity)

    def ingest(self, tokens: list[list[int]], rows: list[int]) -> list[int]:
        return [self.drafters[row].ingest(tokens[row]) for row in rows]

    def propose(self, tokens: list[list[int]], budgets: list[int], samplers: list[Sampler]) -> list[Proposal]:
        return [drafter.propose(sequence, budget, sampler) if budget > 0 else drafter.see(sequence) or Proposal([])
                for drafter, sequence, budget, sampler in zip(self.drafters, tokens, budgets, samplers, strict=True)]

    def observe(self, row: int, features: torch.Tensor) -> None:
        self.drafters[row].observe(features)

    def see(self, tokens: list[list[int]], rows: list[int]) -> None:
        for row in rows:
            self.drafters[row].see(tokens[row])

    def select(self, rows: list[int]) -> None:
        self.drafters = [self.drafters[row] for row in rows]


FINAL = -1
"""A tap: the target's last hidden state after its final norm (the input of its output head)."""


class DrafterBase:
    """The :class:`Drafter` defaults a draft kind subclasses: no model, no state (``reset`` does nothing, ``fork``
    returns the drafter itself, ``ingest`` reads nothing), no features read back (``taps = ()``) and chains only
    (``drafts_trees``). Set ``name``, implement ``propose``,
    and override the rest where they do not fit (a drafter with a KV cache resets and forks it)."""

    name: str
    model: torch.nn.Module | None = None
    taps: tuple[int, ...] = ()
    drafts_trees: bool = False

    def propose(self, tokens: list[int], num_tokens: int, sampler: Sampler) -> Proposal:
        raise NotImplementedError(f"{type(self).__name__} must implement propose(tokens, num_tokens, sampler)")

    def ingest(self, tokens: list[int]) -> int:
        """Nothing to read ahead: ``propose`` reads what it needs."""
        return 0

    def reset(self, capacity: int | None = None) -> None:
        """Nothing to forget."""

    def fork(self) -> DrafterBase:
        """Stateless: every row may share this drafter."""
        return self

    def fresh(self) -> DrafterBase:
        """No state outlives a generation (``reset`` forgets it): this drafter is already fresh."""
        return self

    def observe(self, features: torch.Tensor) -> None:
        """Nothing to read."""

    def see(self, tokens: list[int]) -> None:
        """Nothing kept of what the run generates."""

    def describe(self) -> dict:
        """No state to report."""
        return {}

    def batch_drafter(self, count: int) -> BatchDrafter:
        """Row by row (:class:`RowByRowDrafter`): a kind that drafts every row in one pass overrides this."""
        return RowByRowDrafter(self, count)
