"""The EAGLE drafter: a head drafting a chain or EAGLE-2's dynamic tree from the target's features; tree shapes."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from types import SimpleNamespace

import torch

from specdraft_eval.drafts.eagle.module import EagleHead
from specdraft_eval.drafts.kind import split_shape
from specdraft_eval.drafts.model import draft_chains
from specdraft_eval.engine import host, kv_cache
from specdraft_eval.engine.drafter import DrafterBase, Proposal
from specdraft_eval.engine.kv_cache import BatchCache
from specdraft_eval.engine.sampling import Sampler
from specdraft_eval.errors import SpecdecError
from specdraft_eval.models import kernels


@dataclass(frozen=True)
class TreeShape:
    """EAGLE-2's dynamic tree: each step expands the ``topk`` best-scoring frontier nodes by their ``topk`` best
    children (score: the sum of the head's log-probabilities along the path), ``depth`` nodes deep at most; the
    step's node budget (γ) keeps the best-scoring nodes. EAGLE's ``top_k``; its ``depth`` is ours minus one."""

    topk: int
    depth: int

    DEFAULT_DEPTH = 6

    @classmethod
    def parse(cls, text: str, arg: str) -> TreeShape:
        """``K`` or ``KxD`` (``D`` default :data:`DEFAULT_DEPTH`)."""
        topk, _, depth = text.partition("x")
        if not topk.isdigit() or int(topk) < 1 or (depth and (not depth.isdigit() or int(depth) < 1)):
            raise SpecdecError(f"bad eagle tree in {arg!r}: use eagle:DIR@K or eagle:DIR@KxD (top-k K >= 1 per "
                               "step, D >= 1 deep), e.g. eagle:DIR@4x6")
        return cls(int(topk), int(depth) if depth else cls.DEFAULT_DEPTH)


class EagleDrafter(DrafterBase):
    """Drafts with an :class:`EagleHead`, a chain or (``tree``) EAGLE-2's dynamic tree. Its state (the target's
    features not yet fed to the head and the head's KV cache over (feature t, token t+1) pairs) lives in
    :class:`EagleBatchDrafter`: one row's here, a batch's in :meth:`batch_drafter`, where every row drafts in the
    same head passes."""

    def __init__(self, head: EagleHead, target, name: str, token_ids: list[int] | None,
                 tree: TreeShape | None = None) -> None:
        self.model, self.name, self.taps, self.tree = head, name, head.taps, tree
        self.drafts_trees = tree is not None
        self.vocab_size = target.config.vocab_size
        self.embed = head.embed_tokens if head.embed_tokens is not None else target.get_input_embeddings()
        self.ids = torch.tensor(token_ids, dtype=torch.long, device=target.device) if token_ids else None
        if head.lm_head is None:
            head.use_target_head(target, token_ids)
        kernels.apply(head, kernels.kernels_of(target))  # the head runs the target's kernels
        self._alone = EagleBatchDrafter(self, 1)

    def reset(self, capacity: int | None = None) -> None:
        self._alone.reset(capacity)

    def fork(self) -> EagleDrafter:
        twin = copy.copy(self)
        twin._alone = EagleBatchDrafter(twin, 1)
        return twin

    def batch_drafter(self, count: int) -> EagleBatchDrafter:
        return EagleBatchDrafter(self, count)

    def observe(self, features: torch.Tensor) -> None:
        self._alone.observe(0, features)

    def ingest(self, tokens: list[int]) -> int:
        return self._alone.ingest([tokens], [0])[0]

    def propose(self, tokens: list[int], num_tokens: int, sampler: Sampler) -> Proposal:
        return self._alone.propose([tokens], [num_tokens], [sampler])[0]


class _HeadAsModel:
    """The head as :class:`~specdraft_eval.engine.kv_cache.BatchCache` runs a model: token ids in (each column's
    token t+1), with ``features`` (``[rows, width, F]``: the target's features of positions t, or with ``own`` the
    head's previous outputs) set before each pass; the head's hidden states out, as ``logits``."""

    def __init__(self, drafter: EagleDrafter) -> None:
        self.head, self.embed = drafter.model, drafter.embed
        self.config, self.device, self.dtype = drafter.model.config, drafter.model.device, drafter.model.dtype
        self.features: torch.Tensor | None = None
        self.own = False

    def __call__(self, input_ids, attention_mask, position_ids, cache, use_cache, logits_to_keep):
        if position_ids is None:  # no holes: every row as long as the cache
            start = kv_cache.length(cache)
            position_ids = torch.arange(start, start + input_ids.shape[1], device=input_ids.device)[None]
        hidden = self.head(self.embed(input_ids), self.features.to(self.embed.weight.dtype), cache,
                           position_ids.expand(input_ids.shape[0], -1), own=self.own, mask=attention_mask)
        return SimpleNamespace(logits=hidden)


class EagleBatchDrafter:
    """:class:`~specdraft_eval.engine.drafter.BatchDrafter` for a head: every row's (feature, token) pairs in one
    batched KV cache (holes where rows fed fewer), and every drafting row's next position in one head pass: one per
    drafted token of a chain, one per depth of EAGLE-2's tree. The head's own passes are dropped after each draft (the
    target's features replace them)."""

    def __init__(self, drafter: EagleDrafter, count: int) -> None:
        self.drafter, self.count = drafter, count
        self.step = _HeadAsModel(drafter)
        self.reset()

    def reset(self, capacity: int | None = None) -> None:
        """Forget every row (the head's cache grows: its passes are not compiled, ``capacity`` is not needed)."""
        self.cache = BatchCache(self.count)
        self.pending: list[list[torch.Tensor]] = [[] for _ in range(self.count)]  # features not yet fed, per row
        self.seen = [0] * self.count  # positions whose target features have arrived
        self.fed = [0] * self.count  # pairs in the head's cache computed from the target's features
        self.last: list[torch.Tensor | None] = [None] * self.count  # [H]: the head's output at the last pair fed

    def see(self, tokens: list[list[int]], rows: list[int]) -> None:
        """Nothing kept of what the run generates: the cache follows the rows through propose and observe."""

    def observe(self, row: int, features: torch.Tensor) -> None:
        if len(features):
            self.pending[row].append(features)
            self.seen[row] += len(features)

    def select(self, rows: list[int]) -> None:
        if any(self.fed):
            self.cache.select(rows)
        else:  # nothing in the head's cache yet
            self.cache = BatchCache(len(rows))
        self.count = len(rows)
        self.pending, self.seen, self.fed, self.last = ([values[row] for row in rows]
                                                        for values in (self.pending, self.seen, self.fed, self.last))

    def _pass(self, tokens: list[list[int]], features: list[torch.Tensor | None], own: bool, keep: list[int],
              layout: kv_cache.StepLayout | None = None) -> torch.Tensor:
        """One head pass over every row's ``tokens`` (rows that feed nothing: []) with their ``features`` (``[n, F]``
        each), keeping each row's first ``keep[row]`` columns; the outputs ``[rows, width, H]``."""
        width = max(map(len, tokens))
        size = next(f for f in features if f is not None).shape[-1]
        padded = torch.zeros(self.count, width, size, dtype=self.drafter.embed.weight.dtype,
                             device=self.drafter.embed.weight.device)
        for row, rows_features in enumerate(features):
            if rows_features is not None:
                padded[row, : len(rows_features)] = rows_features
        self.step.features, self.step.own = padded, own
        hidden = self.cache.forward(self.step, tokens, width, layout=layout)  # [rows, width, H]
        self.cache.keep([list(range(n)) for n in keep])
        return hidden

    def _feed(self, rows: list[int], tokens: list[list[int]], upto: list[int]) -> list[int]:
        """Feed each of ``rows`` its pairs of positions ``fed``..``upto`` - 1; its last output is ``last``."""
        counts = [0] * self.count
        feeding: list[list[int]] = [[] for _ in range(self.count)]
        features: list[torch.Tensor | None] = [None] * self.count
        for row, sequence, end in zip(rows, tokens, upto, strict=True):
            count = end - self.fed[row]
            if count > 0:
                pending = torch.cat(self.pending[row])  # [seen - fed, F]
                counts[row], features[row] = count, pending[:count]
                feeding[row] = sequence[self.fed[row] + 1: end + 1]  # the token after each position
                self.pending[row] = [pending[count:]] if count < len(pending) else []
        if any(counts):
            hidden = self._pass(feeding, features, own=False, keep=counts)
            for row, count in enumerate(counts):
                if count:
                    self.last[row], self.fed[row] = hidden[row, count - 1], self.fed[row] + count
        return [counts[row] for row in rows]

    def ingest(self, tokens: list[list[int]], rows: list[int]) -> list[int]:
        return self._feed(rows, [tokens[row] for row in rows], [self.seen[row] - 1 for row in rows])

    def propose(self, tokens: list[list[int]], budgets: list[int], samplers: list[Sampler]) -> list[Proposal]:
        name = self.drafter.name
        for row, sequence in enumerate(tokens):
            if self.seen[row] != len(sequence) - 1:
                raise SpecdecError(f"draft {name}: has the target's features of {self.seen[row]} positions for "
                                   f"{len(sequence)} tokens; an EAGLE head needs an engine that calls observe(): a bug")
        drafting = [row for row, budget in enumerate(budgets) if budget > 0 and self.seen[row]]
        proposals = [Proposal([]) for _ in tokens]
        if not drafting:
            return proposals
        self._feed(drafting, [tokens[row] for row in drafting], [self.seen[row] for row in drafting])
        mark = self.cache.mark()
        try:
            drafted = (self._trees(drafting, budgets) if self.drafter.tree is not None
                       else self._chains(drafting, [budgets[row] for row in drafting], samplers))
        finally:
            self.cache.restore(mark)
        for row, proposal in zip(drafting, drafted, strict=True):
            proposals[row] = proposal
        return proposals

    def _chains(self, drafting: list[int], budgets: list[int], samplers: list[Sampler]) -> list[Proposal]:
        """Each drafting row's chain of its budget's tokens: one head pass per position for all of them."""
        head, drafter = self.drafter.model, self.drafter
        hidden = torch.stack([self.last[row] for row in drafting])  # [R, H]

        def advance(chosen: list[int]) -> torch.Tensor:
            nonlocal hidden
            feeding: list[list[int]] = [[] for _ in range(self.count)]
            features: list[torch.Tensor | None] = [None] * self.count
            for j, row in enumerate(drafting):
                feeding[row], features[row] = [chosen[j]], hidden[j: j + 1]
            hidden = self._pass(feeding, features, own=True, keep=[len(f) for f in feeding])[drafting, 0]
            return head.logits(hidden).float()

        return draft_chains(head.logits(hidden).float(), budgets, [samplers[row] for row in drafting], drafter.ids,
                            drafter.vocab_size, advance)

    def _trees(self, drafting: list[int], budgets: list[int]) -> list[Proposal]:
        """EAGLE-2's dynamic tree (``topK_genrate``) for each drafting row: the top-k children of the root, then per
        depth one head pass over every row's frontier (each node attending to its row's committed pairs and its own
        ancestors), every child scored by its path's summed log-probability and the best k kept as the next
        frontier; a row's ``budget`` best nodes of all scored ones form its tree. Deterministic (no draws):
        lossless under sampling too."""
        head, drafter, k = self.drafter.model, self.drafter, self.drafter.tree.topk
        start = self.cache.columns
        trees = [_Growing() for _ in drafting]
        frontiers: list[list[int]] = [[-1] for _ in drafting]
        hidden = torch.stack([self.last[row] for row in drafting])  # [sum of frontiers, H]
        for depth in range(drafter.tree.depth):
            logp = torch.log_softmax(head.logits(hidden).float(), dim=-1)  # [n, head vocabulary]
            top = logp.topk(min(k, logp.shape[-1]), dim=-1)
            ids = drafter.ids[top.indices] if drafter.ids is not None else top.indices  # [n, k] target ids
            values, ids = host.read(torch.stack([top.values.double(), ids.double()]))
            at = 0
            for tree, frontier in zip(trees, frontiers, strict=True):
                tree.children = [tree.add(parent, [int(t) for t in ids[at + i]], values[at + i])
                                 for i, parent in enumerate(frontier)]
                at += len(frontier)
            if depth + 1 == drafter.tree.depth:
                break
            feeding: list[list[int]] = [[] for _ in range(self.count)]
            features: list[torch.Tensor | None] = [None] * self.count
            outputs = list(hidden.split([len(f) for f in frontiers]))  # per row: its frontier's outputs
            for j, (row, tree) in enumerate(zip(drafting, trees, strict=True)):
                frontier = tree.next_frontier(budgets[row], k) if frontiers[j] else []
                if frontier:
                    inputs = [outputs[j][frontiers[j].index(tree.parents[n])] if depth else outputs[j][0]
                              for n in frontier]  # each node's parent's output
                    feeding[row], features[row] = [tree.tokens[n] for n in frontier], torch.stack(inputs)
                frontiers[j] = frontier
            if not any(frontiers):
                break
            columns = self.cache.columns
            layout = self._layout(drafting, trees, frontiers, depth, start, max(map(len, feeding)))
            out = self._pass(feeding, features, own=True, keep=[len(f) for f in feeding], layout=layout)
            for j, row in enumerate(drafting):
                for slot, node in enumerate(frontiers[j]):
                    trees[j].column[node] = columns + slot
            hidden = torch.cat([out[row, : len(frontiers[j])] for j, row in enumerate(drafting)])
        return [tree.proposal(budgets[row]) for tree, row in zip(trees, drafting, strict=True)]

    def _layout(self, drafting: list[int], trees: list[_Growing], frontiers: list[list[int]], depth: int, start: int,
               width: int) -> kv_cache.StepLayout:
        """What each frontier node sees (its row's committed pairs before column ``start``, then its ancestors among
        the tree's fed nodes) and its position (its row's next position plus ``depth``)."""
        device = self.drafter.embed.weight.device
        visible = torch.ones(self.count, width, self.cache.columns, dtype=torch.bool)
        visible[:, :, start:] = False  # the tree's earlier columns: only a node's ancestors
        for j, row in enumerate(drafting):
            for slot, node in enumerate(frontiers[j]):
                parent = trees[j].parents[node]
                while parent >= 0:
                    visible[row, slot, trees[j].column[parent]] = True
                    parent = trees[j].parents[parent]
        positions = torch.tensor([self.seen[row] + depth for row in range(self.count)], device=device)
        return kv_cache.StepLayout(visible.to(device), positions[:, None].expand(-1, width))


class _Growing:
    """One row's EAGLE-2 tree while it grows: nodes (token, parent, path score), the newest children and where
    each fed node sits in the head's cache."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.parents: list[int] = []
        self.scores: list[float] = []
        self.children: list[list[int]] = []  # per frontier node: its new children
        self.column: dict[int, int] = {}

    def add(self, parent: int, tokens: list[int], values: list[float]) -> list[int]:
        """``parent``'s children ``tokens`` with log-probabilities ``values``; their node indices."""
        base = self.scores[parent] if parent >= 0 else 0.0
        new = []
        for token, value in zip(tokens, values, strict=True):
            new.append(len(self.tokens))
            self.tokens.append(token)
            self.parents.append(parent)
            self.scores.append(base + value)
        return new

    def next_frontier(self, budget: int, k: int) -> list[int]:
        """The k best new children, or none when no descendant can make the budget's cut."""
        children = [node for nodes in self.children for node in nodes]
        cut = sorted(self.scores, reverse=True)[budget - 1] if len(self.scores) >= budget else float("-inf")
        frontier = sorted(children, key=lambda n: -self.scores[n])[:k]
        return frontier if frontier and self.scores[frontier[0]] >= cut else []

    def proposal(self, budget: int) -> Proposal:
        """The ``budget`` best-scoring nodes, parents before children."""
        keep = sorted(sorted(range(len(self.tokens)), key=lambda n: (-self.scores[n], n))[:budget])
        where = {node: i for i, node in enumerate(keep)}
        return Proposal([self.tokens[n] for n in keep],
                        parents=[where[self.parents[n]] if self.parents[n] >= 0 else -1 for n in keep])


def split(arg: str) -> tuple[str, TreeShape | None]:
    """``DIR``, ``DIR@K`` or ``DIR@KxD`` -> the head (a directory or hub id) and its tree shape (None: a chain)."""
    where, shape = split_shape(arg)
    return where, None if shape is None else TreeShape.parse(shape, arg)
