"""One generation request's settings (:class:`DecodeParams`) and the per-row stop check."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch

from specdraft_eval.engine.sampling import Sampler, make_generator
from specdraft_eval.errors import SpecdecError

StopCheck = Callable[[list[int]], "int | None"]
"""Called with the tokens generated so far (one check serves one generation, called as they grow): where a stop
sequence completes, how many of them to keep (the index of the token completing it, plus one), so that the loop cuts
the row there in the same step; None to go on (lm-eval's stop sequences). :func:`first_stop` finds that length."""


def first_stop(new: list[int], checked: int, hit: Callable[[int], bool]) -> int | None:
    """The shortest length ``end`` in ``checked + 1 .. len(new)`` for which ``hit(end)`` holds (a stop sequence is
    complete in ``new[:end]``), or None; ``checked``: how many tokens earlier calls saw (none of them stopped).
    ``hit(len(new))`` is asked first, so a step without a stop costs one check."""
    if len(new) <= checked or not hit(len(new)):
        return None
    return next(end for end in range(checked + 1, len(new) + 1) if hit(end))


@dataclass(frozen=True)
class DecodeParams:
    """One generation request's settings, as transformers' ``GenerationConfig`` or vLLM's ``SamplingParams``:
    the token budget, γ (or dynamic γ), sampling, the seed and EOS. Every engine entry point takes it after
    ``(target, draft, prompts)``; per-row stop checks and a shared γ controller are keyword arguments beside it."""

    max_new_tokens: int
    num_draft_tokens: int = 4
    dynamic_gamma: bool = False
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    eos_token_id: int | Sequence[int] | None = None
    static_cache: bool = False  # the target's and model drafts' KV caches preallocated (engine.graphs)
    compile: bool = False  # the target's decode and verification steps compiled (CUDA graphs on a GPU); implies
    # static_cache, which __post_init__ sets
    capacity: int | None = None  # static cache positions to allocate at least: a run's longest request, so that
    # every request of the run shares one shape (None: this request's own)

    def __post_init__(self) -> None:
        if self.compile:
            object.__setattr__(self, "static_cache", True)  # compiled steps need fixed tensor addresses
        gamma = self.num_draft_tokens
        if not isinstance(gamma, int) or isinstance(gamma, bool) or gamma < 1:
            raise SpecdecError(f"num_draft_tokens must be an integer >= 1 (got {gamma!r})")
        if self.capacity is not None and (not isinstance(self.capacity, int) or self.capacity < 1):
            raise SpecdecError(f"capacity must be a positive integer (got {self.capacity!r})")
        if self.max_new_tokens < 0:
            raise SpecdecError(f"max_new_tokens must be >= 0 (got {self.max_new_tokens})")
        Sampler(self.do_sample, self.temperature, self.top_k, self.top_p)  # one-line errors for bad sampling

    @classmethod
    def of(cls, params: DecodeParams | int | None, **settings) -> DecodeParams:
        """``params`` itself (with ``settings`` replaced), or the request that the token budget and ``settings``
        (fields as keywords, ``max_new_tokens`` among them when no budget is given) name."""
        if isinstance(params, DecodeParams):
            return replace(params, **settings) if settings else params
        return cls(**settings) if params is None else cls(params, **settings)

    def sampler(self, device: torch.device) -> Sampler:
        """A sampler with a generator of its own, seeded with ``seed`` (each row of a batch gets one)."""
        return Sampler(self.do_sample, self.temperature, self.top_k, self.top_p, make_generator(self.seed, device))

    def eos(self, target) -> set[int]:
        """EOS ids: ``eos_token_id``, else the target's generation config's."""
        eos = self.eos_token_id
        if eos is None:
            eos = getattr(target.generation_config, "eos_token_id", None)
        if eos is None:
            return set()
        return {int(eos)} if isinstance(eos, int) else {int(t) for t in eos}
