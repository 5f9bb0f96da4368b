"""A request's settings (:class:`DecodeParams`: budget, sampling, seed, EOS) apart from a run's (:class:`RunSettings`:
γ policy, static cache, compiled steps, capacity), and the per-row stop check."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace

import torch
from torch.nn import Module

from specdraft_eval.engine.gamma import GammaController
from specdraft_eval.engine.sampling import Sampler, make_generator, stream_seed
from specdraft_eval.errors import SpecdecError
from specdraft_eval.models.targets import runtime_of
from specdraft_eval.results.record import Runtime

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


def text_stop(tokenizer, stop: list[str] | None) -> StopCheck | None:
    """A :data:`StopCheck` for stop strings (lm-eval's ``until``): how many tokens to keep, the one that completes a
    stop string last (as plain decoding stops on it). It decodes only the tokens that can hold a new match: those
    since the last call, plus a margin of one token per character of the longest stop string. One check serves one
    generation; None without stop strings."""
    stops = [s for s in stop or [] if s]
    if not stops:
        return None
    margin = max(len(s) for s in stops) + 1
    checked = [0]  # tokens seen by earlier calls

    def check(new: list[int]) -> int | None:
        start, seen = max(0, checked[0] - margin), checked[0]
        checked[0] = len(new)

        def hit(end: int) -> bool:
            text = tokenizer.decode(new[start:end], skip_special_tokens=False)
            return any(s in text for s in stops)

        return first_stop(new, seen, hit)

    return check


class FixedGamma:
    """γ that never changes: :class:`~specdraft_eval.engine.gamma.GammaController`'s interface for a fixed γ."""

    def __init__(self, gamma: int) -> None:
        self.gamma = self.max_num_draft_tokens = gamma

    def next_step(self, rows: int, prober: int = 0) -> list[int]:
        """γ for every row (a fixed γ never probes: ``prober`` is unused)."""
        return [self.gamma] * rows

    def update(self, drafted, accepted, draft_seconds: float, verify_seconds: float, asked=None) -> None:
        """Nothing to learn."""


@dataclass(frozen=True)
class GammaPolicy:
    """γ for every step: ``num_draft_tokens`` (a chain's length, a tree's node budget), or ``dynamic_gamma``:
    chosen each step by a :class:`~specdraft_eval.engine.gamma.GammaController` between 0 and 4×``num_draft_tokens``."""

    num_draft_tokens: int = 4
    dynamic_gamma: bool = False

    def __post_init__(self) -> None:
        gamma = self.num_draft_tokens
        if not isinstance(gamma, int) or isinstance(gamma, bool) or gamma < 1:
            raise SpecdecError(f"num_draft_tokens must be an integer >= 1 (got {gamma!r})")

    def controller(self) -> GammaController | FixedGamma:
        """What chooses each step's γ (a dynamic one learns: share it across a run's requests)."""
        gamma = self.num_draft_tokens
        return GammaController.around(gamma) if self.dynamic_gamma else FixedGamma(gamma)

    @property
    def max_num_draft_tokens(self) -> int:
        """The widest step's draft tokens."""
        return self.controller().max_num_draft_tokens


def row_positions(prompt_tokens: int, max_new_tokens: int, max_num_draft_tokens: int) -> int:
    """The most KV cache positions one row can fill: its prompt, its budget and the widest step's draft tokens."""
    return prompt_tokens + max_new_tokens + max_num_draft_tokens


@dataclass(frozen=True)
class RunSettings:
    """A run's engine settings, the same for every request of it: γ, the target's and model drafts' KV caches
    preallocated (``static_cache``: :mod:`~specdraft_eval.engine.graphs`), the target's steps compiled (``compile``:
    CUDA graphs on a GPU; implies ``static_cache``) and the positions a static cache holds at least (``capacity``:
    the run's longest row, :func:`row_positions`, so that every request shares one shape; None: each its own).
    ``steps_as_vllm``: steps as vLLM takes them, so that both engines draft from the same contexts (``zoo compare``):
    a row's first step drafts nothing (vLLM's prefill emits a request's first token), and every later one drafts γ
    tokens even past the token budget (vLLM drafts them, counts what it accepted and discards what the budget cuts:
    our ``cut_*`` counters)."""

    gamma: GammaPolicy = GammaPolicy()
    static_cache: bool = False
    compile: bool = False
    capacity: int | None = None
    steps_as_vllm: bool = False

    def __post_init__(self) -> None:
        if self.compile:
            object.__setattr__(self, "static_cache", True)  # compiled steps need fixed tensor addresses
        if self.capacity is not None and (not isinstance(self.capacity, int) or self.capacity < 1):
            raise SpecdecError(f"capacity must be a positive integer (got {self.capacity!r})")

    @classmethod
    def of(cls, run: RunSettings | None, settings: dict) -> RunSettings:
        """``run`` (default: the defaults) with the run-level keywords among ``settings`` taken out and applied:
        ``num_draft_tokens``, ``dynamic_gamma``, ``static_cache``, ``compile``, ``capacity``."""
        run = run or cls()
        gamma = {key: settings.pop(key) for key in ("num_draft_tokens", "dynamic_gamma") if key in settings}
        fields = {key: settings.pop(key) for key in ("static_cache", "compile", "capacity") if key in settings}
        if gamma:
            fields["gamma"] = replace(run.gamma, **gamma)
        return replace(run, **fields) if fields else run

    def runtime(self, target_model: Module) -> Runtime:
        """The runtime key of a run with these settings on ``target_model``: its dtype, kernels, attention and
        tensor-parallel degree as loaded (:class:`~specdraft_eval.models.targets.LoadSettings`), the static cache and
        compiled steps as set here: derived, never given twice."""
        return runtime_of(target_model, self.static_cache, self.compile)


@dataclass(frozen=True)
class DecodeParams:
    """One generation request's settings, as vLLM's ``SamplingParams``: the token budget, sampling, the seed and EOS.
    Every engine entry point takes it after ``(target_model, draft, prompts)``; the run's :class:`RunSettings`, per-row
    stop checks and a shared γ controller are keyword arguments beside it."""

    max_new_tokens: int
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    eos_token_id: int | Sequence[int] | None = None

    def __post_init__(self) -> None:
        if self.max_new_tokens < 0:
            raise SpecdecError(f"max_new_tokens must be >= 0 (got {self.max_new_tokens})")
        Sampler(self.do_sample, self.temperature, self.top_k, self.top_p)  # one-line errors for bad sampling

    @classmethod
    def of(cls, params: DecodeParams | int | None, **settings) -> DecodeParams:
        """``params`` itself (with ``settings`` replaced), or the request that the token budget and ``settings``
        (fields as keywords, ``max_new_tokens`` among them when no budget is given) name."""
        unknown = set(settings) - {f.name for f in fields(cls)}
        if unknown:
            raise SpecdecError(f"unknown generation settings {sorted(unknown)}: a request takes "
                               f"{', '.join(f.name for f in fields(cls))}; a run takes num_draft_tokens, "
                               "dynamic_gamma, "
                               "static_cache, compile and capacity")
        if isinstance(params, DecodeParams):
            return replace(params, **settings) if settings else params
        return cls(**settings) if params is None else cls(params, **settings)

    def sampler(self, device: torch.device, prompt: Sequence[int] = (), repeat: int = 0) -> Sampler:
        """One row's sampler, with a generator of its own: with ``seed``, seeded for this request (``prompt``) and
        ``repeat`` of it (:func:`~specdraft_eval.engine.sampling.stream_seed`); without, torch's global one."""
        seed = None if self.seed is None else stream_seed(self.seed, prompt, repeat)
        return Sampler(self.do_sample, self.temperature, self.top_k, self.top_p, make_generator(seed, device))

    def eos(self, target_model: Module) -> set[int]:
        """EOS ids: ``eos_token_id``, else the target's generation config's."""
        eos = self.eos_token_id
        if eos is None:
            eos = getattr(target_model.generation_config, "eos_token_id", None)
        if eos is None:
            return set()
        return {int(eos)} if isinstance(eos, int) else {int(t) for t in eos}
