"""The verifier: one target pass over every row's ``[last, *drafted]`` and the acceptance rule (greedy: the
longest prefix equal to the target's argmax; sampling: rejection sampling, Leviathan et al. 2023, Chen et al. 2023)."""

from __future__ import annotations

import torch

from specdraft_eval.engine.drafter import Proposal
from specdraft_eval.engine.kv_cache import BatchCache
from specdraft_eval.engine.sampling import Sampler


def accept(logits: torch.Tensor, proposal: Proposal, sampler: Sampler) -> tuple[int, int]:
    """Return (accepted draft tokens, the target's next token after them)."""
    drafted = proposal.tokens
    if not sampler.do_sample:
        choice = logits.argmax(-1).tolist()
        n = 0
        while n < len(drafted) and drafted[n] == choice[n]:
            n += 1
        return n, choice[n]
    p = sampler.probs(logits)
    for i, token in enumerate(drafted):
        q_token = float(proposal.probs[i, token]) if proposal.probs is not None else 1.0
        if sampler.uniform(p.device) * q_token < float(p[i, token]):
            continue  # accepted with probability min(1, p/q)
        residual = p[i].clone()
        if proposal.probs is None:
            residual[token] = 0.0
        else:
            q = proposal.probs[i].to(residual.dtype)
            q = torch.nn.functional.pad(q, (0, residual.shape[-1] - q.shape[-1]))
            residual = (residual - q).clamp_min_(0.0)
        total = residual.sum()
        residual = residual / total if total > 0 else p[i]
        return i, int(sampler.sample(residual[None]))
    return len(drafted), int(sampler.sample(p[len(drafted)][None]))


def verify_step(target, cache: BatchCache, tokens: list[list[int]], proposals: list[Proposal],
                samplers: list[Sampler]) -> list[tuple[int, int]]:
    """One verification of every row: run ``[last, *drafted]`` through the target on top of ``cache`` (which holds
    all of each row's ``tokens`` but the last), accept, and drop the rejected columns. Returns, per row, (accepted
    draft tokens, the target's next token). ``zoo profile`` times exactly this call."""
    width = 1 + max(len(p.tokens) for p in proposals)
    logits = cache.forward(target, [[row[-1], *p.tokens] for row, p in zip(tokens, proposals, strict=True)],
                           width)  # [rows, width, vocab]
    verdicts = [accept(logits[i, : len(p.tokens) + 1], p, sampler)
                for i, (p, sampler) in enumerate(zip(proposals, samplers, strict=True))]
    cache.keep([accepted + 1 for accepted, _ in verdicts])
    return verdicts
