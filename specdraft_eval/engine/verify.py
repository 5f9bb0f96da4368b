"""The verifier: one target pass over every row's ``[last, *drafted]`` and the acceptance rule (greedy: the
longest prefix equal to the target's argmax; sampling: rejection sampling, Leviathan et al. 2023, Chen et al. 2023)."""

from __future__ import annotations

import torch

from specdraft_eval.engine.drafter import Proposal
from specdraft_eval.engine.kv_cache import BatchCache
from specdraft_eval.engine.sampling import Sampler


def _children(proposal: Proposal) -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for node, parent in enumerate(proposal.tree):
        children.setdefault(parent, []).append(node)
    return children


def accept(logits: torch.Tensor, proposal: Proposal, sampler: Sampler) -> tuple[list[int], int]:
    """Return (the accepted nodes, root to leaf, as indices into ``proposal.tokens``; the target's next token
    after them). ``logits[0]`` is the target's at the root, ``logits[1 + i]`` at node i.

    Greedy: from the root, move to the child whose token is the target's argmax until none is. Sampling, a sampled
    chain: accept token i with min(1, p/q), on rejection sample from norm(max(0, p - q)). Sampling, deterministic
    nodes (one-hot q; several children of a tree at once): try each child x in turn, accepting it with the residual
    probability p(x), and on rejection zero p(x) and renormalise; when every child is rejected, sample from what is
    left (EAGLE's evaluate_posterior with q = 1). Both give exactly the target's distribution."""
    drafted = proposal.tokens
    if proposal.probs is not None:  # a sampled chain
        p = sampler.probs(logits)
        for i, token in enumerate(drafted):
            if sampler.uniform(p.device) * float(proposal.probs[i, token]) < float(p[i, token]):
                continue  # accepted with probability min(1, p/q)
            q = proposal.probs[i].to(p.dtype)
            residual = (p[i] - torch.nn.functional.pad(q, (0, p.shape[-1] - q.shape[-1]))).clamp_min_(0.0)
            total = residual.sum()
            return list(range(i)), int(sampler.sample((residual / total if total > 0 else p[i])[None]))
        return list(range(len(drafted))), int(sampler.sample(p[len(drafted)][None]))
    children, path, node = _children(proposal), [], -1
    if not sampler.do_sample:
        choice = logits.argmax(-1).tolist()
        while True:
            step = next((c for c in children.get(node, []) if drafted[c] == choice[node + 1]), None)
            if step is None:
                return path, choice[node + 1]
            path.append(node := step)
    p = sampler.probs(logits)
    while True:
        residual = p[node + 1]
        for child in children.get(node, []):
            if sampler.uniform(residual.device) < float(residual[drafted[child]]):
                path.append(node := child)
                break
            residual = residual.clone()
            residual[drafted[child]] = 0.0
            total = residual.sum()
            residual = residual / total if total > 0 else p[node + 1]
        else:
            return path, int(sampler.sample(residual[None]))


def verify_step(target, cache: BatchCache, tokens: list[list[int]], proposals: list[Proposal],
                samplers: list[Sampler]) -> list[tuple[list[int], int]]:
    """One verification of every row: run ``[last, *drafted]`` through the target on top of ``cache`` (which holds
    all of each row's ``tokens`` but the last; a tree's nodes see only their ancestors), accept, and drop the
    columns off the accepted path. Returns, per row, (accepted nodes, the target's next token). ``zoo profile``
    times exactly this call."""
    width = 1 + max(len(p.tokens) for p in proposals)
    branching = any(p.parents is not None and p.parents != list(range(-1, len(p.tokens) - 1)) for p in proposals)
    trees = [[-1, *(1 + parent for parent in p.tree)] for p in proposals] if branching else None  # parent columns
    logits = cache.forward(target, [[row[-1], *p.tokens] for row, p in zip(tokens, proposals, strict=True)],
                           width, trees=trees)  # [rows, width, vocab]
    verdicts = [accept(logits[i, : len(p.tokens) + 1], p, sampler)
                for i, (p, sampler) in enumerate(zip(proposals, samplers, strict=True))]
    cache.keep([[0, *(1 + node for node in path)] for path, _ in verdicts])
    return verdicts
