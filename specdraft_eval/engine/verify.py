"""The verifier: one target pass over every row's ``[last, *drafted]`` and the acceptance rule (greedy: the
longest path of drafted tokens equal to the target's argmax; sampling: rejection sampling, Leviathan et al. 2023,
Chen et al. 2023), decided for every row at once on the device, with one host read per step (cf. vLLM's
``rejection_sampler.py``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn import Module

from specdraft_eval.engine import host
from specdraft_eval.engine.drafter import Proposal
from specdraft_eval.engine.kv_cache import BatchCache
from specdraft_eval.engine.sampling import Sampler


@dataclass
class _Nodes:
    """Every row's drafted nodes as tensors, padded to the widest row's ``N``: ``tokens`` and ``parents`` ``[B, N]``
    (padding: token 0, parent -2, which no row's current node equals), ``ancestors`` ``[B, N, N]`` (node n sees m:
    m is n or one of its ancestors) and ``depths`` ``[B, N]`` (0 for padding)."""

    tokens: torch.Tensor
    parents: torch.Tensor
    ancestors: torch.Tensor
    depths: torch.Tensor

    @classmethod
    def of(cls, proposals: list[Proposal], device) -> _Nodes:
        rows, width = len(proposals), max(len(p.tokens) for p in proposals)
        tokens = torch.tensor([p.tokens + [0] * (width - len(p.tokens)) for p in proposals], dtype=torch.long)
        parents = torch.tensor([p.tree + [-2] * (width - len(p.tokens)) for p in proposals], dtype=torch.long)
        ancestors = torch.zeros(rows, width, width, dtype=torch.bool)
        chain = torch.ones(width, width, dtype=torch.bool).tril()
        for row, proposal in enumerate(proposals):
            count = len(proposal.tokens)
            if proposal.parents is None:  # a chain: every earlier node
                ancestors[row, :count, :count] = chain[:count, :count]
                continue
            for node, parent in enumerate(proposal.parents):
                ancestors[row, node, node] = True
                if parent >= 0:
                    ancestors[row, node] |= ancestors[row, parent]
        return cls(tokens.to(device), parents.to(device), ancestors.to(device), ancestors.sum(-1).to(device))


def _greedy(logits: torch.Tensor, nodes: _Nodes) -> tuple[torch.Tensor, torch.Tensor]:
    """From the root, move to the first child (in node order) whose token is the target's argmax until none is:
    the accepted leaf per row (-1: none) and the target's token after it. ``logits`` ``[B, 1 + N, vocab]``."""
    choice = logits.argmax(-1)  # [B, 1 + N]
    parents, tokens = nodes.parents, nodes.tokens
    if not parents.shape[1]:  # nothing drafted: a plain step
        return torch.full_like(choice[:, 0], -1), choice[:, 0]
    match = (parents > -2) & (tokens == choice.gather(1, (parents + 1).clamp_min(0)))  # [B, N]
    width = parents.shape[1]
    earlier = torch.ones(width, width, dtype=torch.bool, device=parents.device).tril(-1)  # [N, N]: m < n
    siblings = (parents[:, :, None] == parents[:, None, :]) & earlier  # [B, N, N]
    first = match & ~(siblings & match[:, None, :]).any(-1)  # no earlier sibling matches
    reached = (parents > -2) & ~(nodes.ancestors & ~first[:, None, :]).any(-1)  # its whole path matches: one chain
    best = (reached * nodes.depths).max(-1)  # the deepest reached node
    leaf = torch.where(best.values > 0, best.indices, -1)  # [B]
    return leaf, choice.gather(1, (leaf + 1)[:, None])[:, 0]


def _sampled(logits: torch.Tensor, proposals: list[Proposal], nodes: _Nodes, samplers: list[Sampler]
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """Rejection sampling for every row at once: visiting nodes in order, a node whose parent is its row's current
    node is tried; the target's residual distribution ``r`` at the current node accepts token x with probability
    min(1, r(x)/q(x)) (q(x) = 1 for a deterministic node) and moves there (``r`` becomes the target's distribution
    at x), or rejects it and ``r`` becomes norm(max(0, r - q)) (a deterministic node: x zeroed). The next token is
    drawn from ``r`` at the end (EAGLE's evaluate_posterior with q = 1 for trees; Leviathan et al. for chains). Each
    row draws its uniforms from its own generator: one per node tried and one for the next token."""
    rows, width, device = nodes.tokens.shape[0], nodes.tokens.shape[1], logits.device
    p = samplers[0].probs(logits.flatten(0, 1)).view(*logits.shape[:2], -1)  # [B, 1 + N, vocab]
    vocab, index = p.shape[-1], torch.arange(rows, device=device)
    uniforms = torch.zeros(rows, width + 1, device=device)  # [B, N + 1]: a row's nodes', then its next token's
    for row, (proposal, sampler) in enumerate(zip(proposals, samplers, strict=True)):
        count = len(proposal.tokens)  # as many draws as alone, whatever the batch's width
        drawn = torch.rand(count + 1, generator=sampler.generator, device=device)
        uniforms[row, :count], uniforms[row, width] = drawn[:count], drawn[count]
    drafted = [i for i, proposal in enumerate(proposals) if proposal.probs is not None]
    q = None  # [B, N, vocab]: a sampled chain's draft distributions (zero for deterministic rows)
    if drafted:
        q = torch.zeros(rows, width, vocab, dtype=p.dtype, device=device)
        for i in drafted:
            probs = proposals[i].probs
            q[i, : probs.shape[0], : probs.shape[1]] = probs.to(p.dtype)[:, :vocab]
        sampled_row = torch.zeros(rows, dtype=torch.bool, device=device)
        sampled_row[drafted] = True
    current = torch.full((rows,), -1, dtype=torch.long, device=device)
    residual = p[:, 0]  # [B, vocab]
    for n in range(width):
        tried = nodes.parents[:, n] == current  # [B]
        token = nodes.tokens[:, n : n + 1]  # [B, 1]
        weight = residual.gather(1, token)[:, 0]
        draft = torch.ones_like(weight) if q is None else torch.where(sampled_row, q[:, n].gather(1, token)[:, 0], 1.0)
        accepted = tried & (uniforms[:, n] * draft < weight)
        rest = residual.scatter(1, token, 0.0)  # a deterministic node rejected: its token zeroed
        if q is not None:
            rest = torch.where(sampled_row[:, None], (residual - q[:, n]).clamp_min(0.0), rest)
        total = rest.sum(-1, keepdim=True)
        rest = torch.where(total > 0, rest / total.clamp_min(torch.finfo(rest.dtype).tiny), p[index, current + 1])
        residual = torch.where(accepted[:, None], p[:, n + 1], torch.where((tried & ~accepted)[:, None], rest,
                                                                           residual))
        current = torch.where(accepted, n, current)
    cdf = residual.double().cumsum(-1)  # inverse-CDF draw: a zero-probability token is never chosen
    after = torch.searchsorted(cdf, (uniforms[:, width].double() * cdf[:, -1])[:, None], right=True)[:, 0]
    return current, after.clamp_max(vocab - 1)


def accept(logits: torch.Tensor, proposals: list[Proposal], samplers: list[Sampler]) -> list[tuple[list[int], int]]:
    """Per row: (the accepted nodes, root to leaf, as indices into its proposal's tokens; the target's next token
    after them). ``logits[row, 0]`` is the target's at the row's root, ``logits[row, 1 + i]`` at its node i. Both
    rules give exactly the target's (warped) distribution; greedy is the target's own output. Decided on the device
    for every row at once; one host read."""
    nodes = _Nodes.of(proposals, logits.device)
    width = 1 + nodes.tokens.shape[1]
    logits = logits[:, :width]
    leaf, after = (_sampled(logits, proposals, nodes, samplers) if samplers[0].do_sample
                   else _greedy(logits, nodes))
    verdicts = []
    for proposal, (node, token) in zip(proposals, host.read(torch.stack([leaf, after], 1)), strict=True):
        path = []
        while node >= 0:
            path.append(node)
            node = proposal.tree[node]
        verdicts.append((path[::-1], token))
    return verdicts


def verify_step(target_model: Module, cache: BatchCache, tokens: list[list[int]], proposals: list[Proposal],
                samplers: list[Sampler]) -> list[tuple[list[int], int]]:
    """One verification of every row: run ``[last, *drafted]`` through the target on top of ``cache`` (which holds
    all of each row's ``tokens`` but the last; a tree's nodes see only their ancestors), accept, and drop the
    columns off the accepted path. Returns, per row, (accepted nodes, the target's next token). ``zoo profile``
    times exactly this call."""
    width = 1 + max(len(p.tokens) for p in proposals)
    branching = any(p.parents is not None and p.parents != list(range(-1, len(p.tokens) - 1)) for p in proposals)
    trees = [[-1, *(1 + parent for parent in p.tree)] for p in proposals] if branching else None  # parent columns
    logits = cache.forward(target_model, [[row[-1], *p.tokens] for row, p in zip(tokens, proposals, strict=True)],
                           width, trees=trees)  # [rows, width, vocab]
    verdicts = accept(logits, proposals, samplers)
    cache.keep([[0, *(1 + node for node in path)] for path, _ in verdicts])
    return verdicts
