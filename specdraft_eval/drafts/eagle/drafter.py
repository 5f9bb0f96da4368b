"""The EAGLE drafter: a head drafting a chain or EAGLE-2's dynamic tree from the target's features; tree shapes."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from specdraft_eval.drafts.eagle.module import EagleHead
from specdraft_eval.drafts.kind import split_shape
from specdraft_eval.drafts.model import choose
from specdraft_eval.engine import kv_cache
from specdraft_eval.engine.drafter import DrafterBase, Proposal
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
    """Drafts with an :class:`EagleHead`, a chain or (``tree``) EAGLE-2's dynamic tree. State per row: the target's
    features not yet fed to the head and the head's KV cache over (feature t, token t+1) pairs, kept for the
    target's features and rolled back for its own."""

    def __init__(self, head: EagleHead, target, name: str, token_ids: list[int] | None,
                 tree: TreeShape | None = None) -> None:
        self.model, self.name, self.taps, self.tree = head, name, head.taps, tree
        self.drafts_trees = tree is not None
        self.vocab_size = target.config.vocab_size
        self._embed = head.embed_tokens if head.embed_tokens is not None else target.get_input_embeddings()
        self._ids = torch.tensor(token_ids, dtype=torch.long, device=target.device) if token_ids else None
        if head.lm_head is None:
            head.use_target_head(target, token_ids)
        kernels.apply(head, kernels.kernels_of(target))  # the head runs the target's kernels
        self.reset()

    def reset(self, capacity: int | None = None) -> None:
        room = (self.tree.depth - 1) * self.tree.topk if self.tree else 0  # a tree's frontiers, fed then dropped
        self._cache = kv_cache.new_cache(self.model.config, None if capacity is None else capacity + room)
        self._pending: list[torch.Tensor] = []  # the target's features not yet fed to the head
        self._seen = 0  # positions whose target features have arrived
        self._fed = 0  # (feature, next token) pairs in the head's cache computed from the target's features

    def fork(self) -> EagleDrafter:
        twin = copy.copy(self)
        twin.reset()
        return twin

    def observe(self, features: torch.Tensor) -> None:
        if len(features):
            self._pending.append(features)
            self._seen += len(features)

    def _feed(self, tokens: list[int], upto: int) -> int:
        """Feed the head the (feature, next token) pairs of positions ``_fed``..``upto`` - 1 (after rolling its cache
        back to them); the last one fed leaves ``_last``, its prediction of the next position's features."""
        kv_cache.rollback(self._cache, self._fed)
        count = upto - self._fed
        if count <= 0:
            return 0
        device = self._embed.weight.device
        pending = torch.cat(self._pending)  # [seen - fed, F]
        features = pending[:count][None].to(self._embed.weight.dtype)  # [1, count, F]
        ids = torch.tensor([tokens[self._fed + 1: upto + 1]], device=device)  # the token after each position
        positions = torch.arange(self._fed, upto, device=device)[None]
        self._last = self.model(self._embed(ids), features, self._cache, positions)[:, -1:]  # [1, 1, H]
        self._pending, self._fed = [pending[count:]] if count < len(pending) else [], upto
        return count

    def catch_up(self, tokens: list[int]) -> int:
        return self._feed(tokens, self._seen - 1)

    def propose(self, tokens: list[int], num_tokens: int, sampler: Sampler) -> Proposal:
        if self._seen != len(tokens) - 1:
            raise SpecdecError(f"draft {self.name}: has the target's features of {self._seen} positions for "
                               f"{len(tokens)} tokens; an EAGLE head needs an engine that calls observe(): a bug")
        if self._seen == 0 or num_tokens < 1:
            return Proposal([])
        head, device = self.model, self._embed.weight.device
        self._feed(tokens, self._seen)
        if self.tree is not None:
            return self._grow(num_tokens)
        hidden = self._last
        drafted: list[int] = []
        rows: list[torch.Tensor] = []
        for i in range(num_tokens):
            token, probs = choose(head.logits(hidden[0, -1]).float(), sampler, self._ids, self.vocab_size)
            drafted.append(token)
            if probs is not None:
                rows.append(probs)
            if i + 1 < num_tokens:
                position = torch.tensor([[self._seen + i]], device=device)
                hidden = head(self._embed(torch.tensor([[token]], device=device)), hidden, self._cache, position,
                              own=True)
        return Proposal(drafted, torch.stack(rows) if rows else None)

    def _grow(self, budget: int) -> Proposal:
        """EAGLE-2's dynamic tree (``topK_genrate``): the top-k children of the root, then per depth one head pass
        over the frontier (each node attending to the committed prefix and its own ancestors), every child scored
        by its path's summed log-probability and the best k kept as the next frontier; the ``budget`` best nodes
        of all scored ones form the tree. Deterministic (no draws): lossless under sampling too."""
        head, device, k = self.model, self._embed.weight.device, self.tree.topk
        tokens: list[int] = []
        parents: list[int] = []
        scores: list[float] = []

        def expand(hidden: torch.Tensor, frontier: list[int]) -> list[int]:
            """Score the top-k children of each frontier node (-1: the root) from ``hidden`` [n, H]; return the
            new nodes."""
            logp = torch.log_softmax(head.logits(hidden).float(), dim=-1)  # [n, head vocabulary]
            top = logp.topk(min(k, logp.shape[-1]), dim=-1)
            ids = self._ids[top.indices] if self._ids is not None else top.indices  # [n, k] target ids
            new = []
            for row, parent in enumerate(frontier):
                base = scores[parent] if parent >= 0 else 0.0
                for token, value in zip(ids[row].tolist(), top.values[row].tolist(), strict=True):
                    new.append(len(tokens))
                    tokens.append(token)
                    parents.append(parent)
                    scores.append(base + value)
            return new

        frontier = [-1]
        hidden = self._last[0]  # [1, H]
        fed: list[int] = []  # tree nodes in the head's cache past the committed prefix, in order
        fed_hidden = self._last[0, :0]  # [len(fed), H]: their outputs (the inputs of their children)
        for depth in range(self.tree.depth):
            children = expand(hidden, frontier)
            if depth + 1 == self.tree.depth:
                break
            cut = sorted(scores, reverse=True)[budget - 1] if len(scores) >= budget else float("-inf")
            frontier = sorted(children, key=lambda n: -scores[n])[:k]
            if scores[frontier[0]] < cut:  # no descendant can make the budget's cut
                break
            inputs = (self._last[0].expand(len(frontier), -1) if depth == 0  # each node's parent's output
                      else fed_hidden[[fed.index(parents[n]) for n in frontier]])
            hidden = head(self._embed(torch.tensor([[tokens[n] for n in frontier]], device=device)), inputs[None],
                          self._cache, torch.full((1, len(frontier)), self._seen + depth, device=device), own=True,
                          mask=self._tree_mask(fed, frontier, parents))[0]  # [k, H]
            fed_hidden = torch.cat([fed_hidden, hidden])
            fed += frontier
        keep = sorted(sorted(range(len(tokens)), key=lambda n: (-scores[n], n))[:budget])  # parents before children
        where = {node: i for i, node in enumerate(keep)}
        return Proposal([tokens[n] for n in keep], parents=[where[parents[n]] if parents[n] >= 0 else -1 for n in keep])

    def _tree_mask(self, fed: list[int], frontier: list[int], parents: list[int]) -> torch.Tensor:
        """``[1, 1, len(frontier), keys]`` additive: each frontier node sees the committed prefix, its ancestors
        among the ``fed`` nodes and itself."""
        committed = self._fed
        keys = self._cache.get_mask_sizes(len(frontier), 0)[0]  # a static cache: its whole allocation
        allowed = torch.zeros(len(frontier), keys, dtype=torch.bool)
        allowed[:, :committed] = True
        slot = {node: i for i, node in enumerate(fed + frontier)}
        for row, node in enumerate(frontier):
            while node >= 0:
                allowed[row, committed + slot[node]] = True
                node = parents[node]
        return kv_cache.additive(allowed[None].to(self._embed.weight.device), self.model.dtype)


def split(arg: str) -> tuple[str, TreeShape | None]:
    """``DIR``, ``DIR@K`` or ``DIR@KxD`` -> the head (a directory or hub id) and its tree shape (None: a chain)."""
    where, shape = split_shape(arg)
    return where, None if shape is None else TreeShape.parse(shape, arg)
