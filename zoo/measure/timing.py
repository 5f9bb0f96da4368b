"""Latencies as the engine runs them (its prefill, ``verify_step`` and clock) and the profiles built from them:
what ``zoo profile`` writes and ``zoo validate`` and ``zoo rank --gpu this`` read."""

from __future__ import annotations

import statistics
from pathlib import Path

import torch

from specdraft_eval.engine.drafter import Proposal, static_tree, tree_parents
from specdraft_eval.errors import SpecdecError
from specdraft_eval.measure.environment import ModelFacts, hardware
from specdraft_eval.models.kernels import kernels_of
from specdraft_eval.results.profiles import (
    DraftTiming,
    Profile,
    Spread,
    default_profile_path,
    read_profile,
    write_profile,
)

WARMUP_STEPS = 3


def context_tokens(length: int, vocab: int) -> list[int]:
    """A fixed random prompt of ``length`` tokens (seed 0): every profile times the same context."""
    return torch.randint(0, vocab, (length,), generator=torch.Generator().manual_seed(0)).tolist()


def filler(token: int, nodes: int, tree: bool) -> Proposal:
    """``nodes`` copies of ``token`` to verify: a chain, or (``tree``) an EAGLE-2-like tree (top-4, 6 deep:
    :func:`~specdraft_eval.engine.drafter.static_tree`) in depth-first order, so whatever the target accepts
    is the first columns (the cache rolls back as after a chain)."""
    if not tree or nodes < 2:
        return Proposal([token] * nodes)
    return Proposal([token] * nodes, parents=tree_parents(sorted(static_tree(4, 6, nodes))))


@torch.inference_mode()
def engine_latency(target, drafters: list, gammas: list[int], prompts: list[list[int]],
                   steps: int, trees: bool = False) -> tuple[dict[int, Spread], dict[str, DraftTiming]]:
    """Latencies as a generation experiences them, on the engine's own code and clock
    (:class:`~specdraft_eval.engine.probe.StepProbe`).

    For each prompt: prefill the target as the engine does, then for ``steps`` steps (after a warm-up) on a
    cache that grows by the target's own next token each step: time each draft's ``propose`` at every γ and
    the target's verification of k = max(γ)..1 draft tokens, rolling the cache back after each, exactly as a
    speculative step does, then its plain step (k = 0). Returns spreads of ``t_verify`` per k, and per draft
    its :class:`DraftTiming` (``t_draft`` per drafted token, ``draft_prefill_ms_per_token``: its
    :meth:`~specdraft_eval.engine.drafter.Drafter.ingest` on a prompt, per position read). ``trees``: verify k-node
    token trees (:func:`filler`) instead of chains.
    """
    from specdraft_eval.engine.probe import StepProbe

    verify: dict[int, list[float]] = {k: [] for k in range(max(gammas, default=0) + 1)}
    per_token = {d.name: [] for d in drafters}
    per_call = {d.name: [] for d in drafters}  # calls that drafted nothing (prompt lookup without a match)
    first_read = {d.name: [] for d in drafters}  # seconds per position of a draft's catch-up on each prompt
    for prompt in prompts:
        with StepProbe(target, prompt, drafters) as probe:
            for drafter in drafters:
                read = probe.ingest(drafter)
                if read is not None:
                    first_read[drafter.name].append(read)
            for step in range(WARMUP_STEPS + steps):
                timed = step >= WARMUP_STEPS
                for drafter in drafters:
                    for gamma in gammas:
                        seconds, k = probe.propose(drafter, gamma)
                        if timed:
                            (per_token[drafter.name] if k else per_call[drafter.name]).append(seconds / max(k, 1))
                for k in sorted(verify, reverse=True):  # k = 0 last: it leaves the cache one token longer
                    seconds = probe.verify(filler(probe.tokens[-1], k, trees)) if k else probe.advance()
                    if timed:
                        verify[k].append(seconds)
    drafts = {}
    for drafter in drafters:
        draft = Spread.of_seconds(per_token[drafter.name] or per_call[drafter.name])
        prefill = statistics.median(first_read[drafter.name]) if first_read[drafter.name] else 0.0
        facts = ModelFacts.of(drafter.model)
        drafts[drafter.name] = DraftTiming(draft, prefill * 1000, facts.parameters_m,
                                           facts.kv_bytes_per_token)
    return {k: Spread.of_seconds(v) for k, v in verify.items()}, drafts



def measure_and_write(target, target_name: str, drafters: list, gammas: list[int], context: int, repeats: int,
                      out: Path | None, prompts: list[list[int]] | None = None) -> tuple[Profile, Path]:
    """Measure (:func:`engine_latency`) and write a hardware profile, merging into an existing one of the same
    target and context. ``prompts`` default: one random prompt of ``context`` tokens. Returns it and its path.

    ``out`` None: the default path in the cache, where an unusable old profile is replaced with a warning; a
    named ``out`` that is unusable is an error.
    """
    if context < 1 or repeats < 1:
        raise SpecdecError("--context and --repeats must be >= 1")
    path = out or default_profile_path(target_name, str(target.device), kernels_of(target))
    old = read_profile(path, named=out is not None)
    same = old is not None and old.context == context
    verify, drafts = engine_latency(target, drafters, gammas,
                                    prompts or [context_tokens(context, target.config.vocab_size)], repeats)
    profile = Profile(hardware(target.device), target_name, context, repeats,
                      {**(old.t_verify if same else {}), **verify}, {**(old.drafts if same else {}), **drafts})
    write_profile(path, profile)
    return profile, path


def ensure_profile(target, target_name: str, drafters: list, gammas: list[int], context: int, repeats: int) -> Profile:
    """The cached profile of this machine, measuring first whatever it lacks (drafts, γ, or the context)."""
    path = default_profile_path(target_name, str(target.device), kernels_of(target))
    profile = read_profile(path, named=False)
    if profile and profile.context == context:
        missing = [d for d in drafters if d.name not in profile.drafts]
        if not missing and set(range(max(gammas) + 1)) <= set(profile.t_verify):
            return profile
    else:
        missing = drafters
    return measure_and_write(target, target_name, missing, gammas, context, repeats, path)[0]
