"""Speculative generation (batch size 1) over Hugging Face causal LMs, and its autoregressive twin.

Invariant of the loop: the target's KV cache holds every token but the last one emitted, so a
verification step feeds ``[last, d1..dk]`` and reads k+1 next-token distributions at once.
Greedy decoding accepts the longest prefix of the draft that matches the target's argmax; sampling uses
rejection sampling (Leviathan et al. 2023; Chen et al. 2023), so output follows the target's distribution.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch

from specdraft_eval import kv
from specdraft_eval.drafts.base import Drafter, Proposal
from specdraft_eval.errors import SpecdecError
from specdraft_eval.gamma import GammaController
from specdraft_eval.sampling import Sampler, make_generator
from specdraft_eval.stats import GenerationStats

StopCheck = Callable[[list[int]], bool]
"""Called with the tokens generated so far; True ends generation (lm-eval's stop sequences)."""


def clock(device: torch.device) -> float:
    """Seconds, after waiting for the device's queued work (the one clock for every timing)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def _prompt_list(input_ids) -> list[int]:
    if isinstance(input_ids, torch.Tensor):
        if input_ids.dim() == 2:
            if input_ids.shape[0] != 1:
                raise SpecdecError(f"input_ids has batch size {input_ids.shape[0]}: call once per row")
            input_ids = input_ids[0]
        input_ids = input_ids.tolist()
    prompt = [int(t) for t in input_ids]
    if not prompt:
        raise SpecdecError("empty prompt: give at least one input token (e.g. the BOS token)")
    return prompt


def _check_context(target, prompt: list[int], max_new_tokens: int) -> list[int]:
    limit = getattr(target.config, "max_position_embeddings", None)
    if limit is not None and len(prompt) + max_new_tokens > limit:
        raise SpecdecError(
            f"prompt of {len(prompt)} tokens plus max_new_tokens={max_new_tokens} exceeds the target's context of "
            f"{limit} tokens: shorten the prompt or generate fewer tokens"
        )
    return prompt


def _eos_ids(target, eos_token_id: int | Sequence[int] | None) -> set[int]:
    if eos_token_id is None:
        eos_token_id = getattr(target.generation_config, "eos_token_id", None)
    if eos_token_id is None:
        return set()
    return {int(eos_token_id)} if isinstance(eos_token_id, int) else {int(t) for t in eos_token_id}


def _setup(target, input_ids, max_new_tokens, do_sample, temperature, top_k, top_p, seed, eos_token_id):
    """Validate a request; return its prompt tokens, sampler and EOS ids."""
    if max_new_tokens < 0:
        raise SpecdecError(f"max_new_tokens must be >= 0 (got {max_new_tokens})")
    prompt = _check_context(target, _prompt_list(input_ids), max_new_tokens)
    sampler = Sampler(do_sample, temperature, top_k, top_p, make_generator(seed, target.device))
    return prompt, sampler, _eos_ids(target, eos_token_id)


def _verify(logits: torch.Tensor, proposal: Proposal, sampler: Sampler) -> tuple[int, int]:
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


def verify_step(target, cache: "kv.DynamicCache", tokens: list[int], proposal: Proposal, sampler: Sampler) -> tuple[int, int]:
    """One verification: run ``[last, *drafted]`` through the target on top of ``cache`` (which holds all of
    ``tokens`` but the last), accept, and roll the cache back to the accepted length. Returns (accepted draft
    tokens, the target's next token). ``zoo profile`` times exactly this call."""
    k = len(proposal.tokens)
    logits = kv.forward(target, [tokens[-1], *proposal.tokens], cache, k + 1)  # [k + 1, vocab]
    accepted, next_token = _verify(logits, proposal, sampler)
    kv.rollback(cache, len(tokens) + accepted)
    return accepted, next_token


def _finish(tokens: list[int], eos: set[int], max_new_tokens: int) -> tuple[list[int], bool]:
    """Cut at the first EOS (kept) and at the budget; say whether generation is over."""
    for i, token in enumerate(tokens[:max_new_tokens]):
        if token in eos:
            return tokens[: i + 1], True
    return tokens[:max_new_tokens], len(tokens) >= max_new_tokens


def prefill(target, prompt: list[int]) -> "kv.DynamicCache":
    cache = kv.new_cache()
    if len(prompt) > 1:
        kv.forward(target, prompt[:-1], cache, 1)
    return cache


@torch.inference_mode()
def speculative_generate(
    target,
    draft: Drafter,
    input_ids,
    max_new_tokens: int,
    num_draft_tokens: int = 4,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int | None = None,
    eos_token_id: int | Sequence[int] | None = None,
    stop: StopCheck | None = None,
    dynamic_gamma: bool = False,
    gamma_controller: GammaController | None = None,
) -> tuple[list[int], GenerationStats]:
    """Generate up to ``max_new_tokens`` tokens after ``input_ids`` with ``target``, drafting with ``draft``.

    Returns the new token ids (ending at EOS if one was produced) and the run's :class:`GenerationStats`.
    ``dynamic_gamma`` lets :class:`~specdraft_eval.gamma.GammaController` choose γ each step (0 to
    4×``num_draft_tokens``) from this generation's measured latencies and acceptance; pass the same
    ``gamma_controller`` to every generation of a run to let it learn from all of them (implies dynamic γ).
    """
    if not isinstance(num_draft_tokens, int) or isinstance(num_draft_tokens, bool) or num_draft_tokens < 1:
        raise SpecdecError(f"num_draft_tokens must be an integer >= 1 (got {num_draft_tokens!r})")
    prompt, sampler, eos = _setup(target, input_ids, max_new_tokens, do_sample, temperature, top_k, top_p, seed, eos_token_id)
    stats = GenerationStats(generations=1, prompt_tokens=len(prompt))
    if max_new_tokens == 0:
        return [], stats
    device = target.device
    start = clock(device)
    cache = prefill(target, prompt)
    draft.reset()
    decode_start = clock(device)
    stats.prefill_seconds = decode_start - start
    tokens, new = list(prompt), []
    controller = gamma_controller or (GammaController.around(num_draft_tokens) if dynamic_gamma else None)
    done = False
    while not done:
        t0 = clock(device)
        gamma = controller.gamma if controller else num_draft_tokens
        budget = min(gamma, max_new_tokens - len(new) - 1)
        proposal = draft.propose(tokens, budget, sampler) if budget > 0 else Proposal([])
        t1 = clock(device)
        k = len(proposal.tokens)
        accepted, next_token = verify_step(target, cache, tokens, proposal, sampler)
        t2 = clock(device)
        stats.record_step(k, accepted)
        stats.draft_seconds += t1 - t0
        stats.verify_seconds += t2 - t1
        emitted = [*proposal.tokens[:accepted], next_token]
        new, done = _finish(new + emitted, eos, max_new_tokens)
        tokens = prompt + new
        done = done or (stop is not None and stop(new))
        if controller:
            controller.update(k, accepted, t1 - t0, t2 - t1)
    stats.decode_seconds = clock(device) - decode_start
    stats.generated_tokens = len(new)
    stats.end_request()
    return new, stats


@torch.inference_mode()
def autoregressive_generate(
    target,
    input_ids,
    max_new_tokens: int,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int | None = None,
    eos_token_id: int | Sequence[int] | None = None,
    stop: StopCheck | None = None,
) -> tuple[list[int], GenerationStats]:
    """Plain token-by-token decoding through the same cache and timing path (the speedup baseline)."""
    prompt, sampler, eos = _setup(target, input_ids, max_new_tokens, do_sample, temperature, top_k, top_p, seed, eos_token_id)
    stats = GenerationStats()
    if max_new_tokens <= 0:
        return [], stats
    device = target.device
    cache = prefill(target, prompt)
    decode_start = clock(device)
    new: list[int] = []
    last, done = prompt[-1], False
    while not done:
        logits = kv.forward(target, [last], cache, 1)
        last = int(sampler.sample(sampler.probs(logits))) if do_sample else int(logits[-1].argmax())
        new, done = _finish(new + [last], eos, max_new_tokens)
        done = done or (stop is not None and stop(new))
    stats.baseline_seconds = clock(device) - decode_start
    stats.baseline_tokens = len(new)
    return new, stats


@torch.inference_mode()
def divergence(target, prompt: list[int], specdec: list[int], baseline: list[int]) -> dict | None:
    """Where two greedy decodings of ``prompt`` first differ, and by how much the target's logits there
    (one fresh forward pass over the common prefix) prefer the baseline's token over the speculative one:
    a margin near 0 is a near-tie that reduced precision can flip, a large one points at a bug."""
    index = next((i for i, (a, b) in enumerate(zip(specdec, baseline)) if a != b), min(len(specdec), len(baseline)))
    if index == len(baseline) or index == len(specdec):
        return None if index == len(baseline) else {"index": index, "specdec_token": None,
                                                     "baseline_token": baseline[index], "logit_margin": None}
    ids = torch.tensor([prompt + baseline[:index]], device=target.device)
    logits = target(ids).logits[0, -1].float()  # [vocab]
    return {"index": index, "specdec_token": specdec[index], "baseline_token": baseline[index],
            "logit_margin": round(float(logits[baseline[index]] - logits[specdec[index]]), 6)}

