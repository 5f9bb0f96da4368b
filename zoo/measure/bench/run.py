"""``zoo bench``: our engine against transformers' own decoding, side by side on the same prompts.

Per draft and prompt, interleaved and after a warm-up, greedy: the target's autoregressive
``generate``; transformers' assisted generation with the same draft at a constant γ; our engine at the
same γ and with dynamic γ. All of these run the same kernels (``specdraft_eval.models.kernels``); when those are
the pre-packed ones, transformers' autoregressive and assisted generation also run once more on a plain copy
of the models, which is what a user would otherwise run. With ``compile``, the same configurations also run
compiled beside the eager ones: ours with ``compile=true`` (one static cache shape for the bench, every width
compiled in the warm-up) and transformers' ``generate`` with its own static cache and compilation, both on plain
kernels (what compiles); each row gives its warm-up seconds (compilation included) and the graphs compiled during
its timed runs apart. Every output must equal the autoregressive one token for token. Wall time is split into the
target's and the draft's passes (our speculative engine's own clock; transformers' rows: module hooks) and the
rest (engine overhead).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

import torch

from specdraft_eval.drafts.model import ModelDrafter
from specdraft_eval.drafts.prompt_lookup import PromptLookupDrafter
from specdraft_eval.engine import graphs
from specdraft_eval.engine.drafter import Drafter
from specdraft_eval.engine.gamma import GammaController
from specdraft_eval.engine.loop import NoDraft, divergence, speculative_generate
from specdraft_eval.measure.stats import GenerationStats
from specdraft_eval.measure.timers import ForwardTimer, clock, peak_memory_mb
from specdraft_eval.models import kernels
from specdraft_eval.models.targets import LoadSettings
from specdraft_eval.results.profiles import Spread
from zoo.measure.bench.result import (
    ASSISTED,
    AUTOREGRESSIVE,
    OURS,
    OURS_DYNAMIC,
    OURS_PLAIN,
    BenchPlan,
    BenchResult,
    BenchRow,
    StepFigures,
    check_lossless,
    near_tie,
)
from zoo.measure.prompts import check_positive
from zoo.progress import Tick, no_progress


@dataclass
class Run:
    """One generation of one configuration on one prompt."""

    prompt_tokens: int
    tokens: list[int]
    wall: float
    target_calls: list[float]
    draft_calls: list[float]
    stats: GenerationStats | None = None


@dataclass
class Config:
    """A way to decode: ``engine`` is one of the four names above; ``drafter`` None for autoregressive;
    ``target`` the model it runs on (its kernels: ``kernels.kernels_of``)."""

    engine: str
    target: torch.nn.Module
    drafter: Drafter | None = None
    compiled: bool = False  # ours: compile=true; transformers: its static cache, compiled
    runs: list[list[Run]] = field(default_factory=list)  # [repeat][prompt]
    peak_mb: float | None = None
    controller: GammaController | None = None  # dynamic γ: one per configuration and repeat, learning over its prompts
    warm_up_seconds: float = 0.0  # the first call's wall time, compilation included: outside every timed run
    timed_compiles: int = 0  # graphs compiled during the timed runs

    @property
    def kernels(self) -> str:
        return kernels.kernels_of(self.target)

    @property
    def draft_model(self) -> torch.nn.Module | None:
        return self.drafter.model if self.drafter is not None else None

    @property
    def draft(self) -> str | None:
        return self.drafter.name if self.drafter is not None else None


def assisted_kwargs(drafter, gamma: int) -> dict | None:
    """transformers ``generate`` arguments for the same draft at constant γ, or None if it has no equivalent."""
    if isinstance(drafter, PromptLookupDrafter):
        return {"prompt_lookup_num_tokens": gamma, "max_matching_ngram_size": drafter.max_ngram}
    if isinstance(drafter, ModelDrafter) and not drafter.reduced_head:
        return {"assistant_model": drafter.model, **_constant(gamma)}
    return None


def _constant(gamma: int) -> dict:
    """Constant γ: no schedule, and no early stop on the assistant's confidence (default threshold 0.4)."""
    return {"num_assistant_tokens": gamma, "num_assistant_tokens_schedule": "constant",
            "assistant_confidence_threshold": 0.0}


def _compile_config(device: torch.device):
    """transformers' automatic compilation of ``generate``'s decoding step: its defaults on a GPU (CUDA graphs); on
    the CPU, where it does not compile unless told to, inductor's default mode."""
    from transformers import CompileConfig

    config = CompileConfig() if device.type == "cuda" else CompileConfig(mode="default")
    config._compile_all_devices = device.type != "cuda"
    return config


@contextmanager
def _assistant_settings(kwargs: dict):
    """transformers reads the assistant's schedule from the assistant's own generation config, not from
    ``generate``'s arguments: give it a copy holding the constant-γ settings while the run lasts."""
    assistant = kwargs.get("assistant_model")
    if assistant is None:
        yield
        return
    saved = assistant.generation_config
    assistant.generation_config = copy.deepcopy(saved)
    assistant.generation_config.update(**_constant(kwargs["num_assistant_tokens"]))
    try:
        yield
    finally:
        assistant.generation_config = saved


def configurations(target, drafters: list, gamma: int, plain: tuple | None = None,
                   compile: bool = False) -> list[Config]:
    """The autoregressive reference first; per draft assisted (where transformers has it), ours, ours
    dynamic; then, given ``plain`` = (plain-kernel target, its drafters), transformers' runs on those; with
    ``compile``, the autoregressive and our configurations again, compiled, on the plain-kernel models."""
    configs = [Config(AUTOREGRESSIVE, target), Config(OURS_PLAIN, target)]
    for drafter in drafters:
        if assisted_kwargs(drafter, gamma) is not None:
            configs.append(Config(ASSISTED, target, drafter))
        configs += [Config(OURS, target, drafter), Config(OURS_DYNAMIC, target, drafter)]
    if plain is not None:
        plain_target, plain_drafters = plain
        configs.append(Config(AUTOREGRESSIVE, plain_target))
        configs += [Config(ASSISTED, plain_target, d) for d in plain_drafters if assisted_kwargs(d, gamma) is not None]
    if compile:
        model, models_drafters = plain if plain is not None else (target, drafters)
        configs += [Config(AUTOREGRESSIVE, model, compiled=True), Config(OURS_PLAIN, model, compiled=True)]
        configs += [Config(engine, model, d, compiled=True) for d in models_drafters for engine in (OURS, OURS_DYNAMIC)]
    return configs


class Bench:
    """Runs configurations on prompts and keeps every run."""

    def __init__(self, configs: list[Config], gamma: int, max_new_tokens: int, capacity: int) -> None:
        from transformers import GenerationConfig

        self.gamma, self.max_new_tokens, self.capacity = gamma, max_new_tokens, capacity
        eos = configs[0].target.generation_config.eos_token_id
        self.generation_config = GenerationConfig(
            max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos,
            pad_token_id=eos if isinstance(eos, int) else (eos[0] if eos else 0))
        self.timers = {id(c.target): ForwardTimer(c.target) for c in configs}

    def generate(self, config: Config, ids: torch.Tensor, max_new_tokens: int | None = None) -> Callable[[], tuple]:
        """A function running ``config`` once on ``ids``, returning (new tokens, stats or None)."""
        budget = max_new_tokens or self.max_new_tokens
        if config.engine == OURS_DYNAMIC and config.controller is None:
            config.controller = GammaController.around(self.gamma)
        runtime = {"compile": config.compiled, "capacity": self.capacity}  # one static shape for the whole bench
        if config.engine == OURS_PLAIN:  # autoregressive_generate's loop, its clock's split kept
            return lambda: speculative_generate(config.target, NoDraft(), ids, budget, num_draft_tokens=1, **runtime)
        if config.engine in (OURS, OURS_DYNAMIC):
            return lambda: speculative_generate(config.target, config.drafter, ids, budget, num_draft_tokens=self.gamma,
                                                gamma_controller=config.controller, **runtime)
        kwargs = assisted_kwargs(config.drafter, self.gamma) if config.engine == ASSISTED else {}
        if config.compiled:
            kwargs = {"cache_implementation": "static", "compile_config": _compile_config(config.target.device)}
        generation_config = self.generation_config.__class__(**{**self.generation_config.to_diff_dict(),
                                                                 "max_new_tokens": budget})

        def run():
            with torch.inference_mode(), _assistant_settings(kwargs):
                out = config.target.generate(ids, attention_mask=torch.ones_like(ids),
                                           generation_config=generation_config, **kwargs)
            return out[0, ids.shape[1]:].tolist(), None

        return run

    def warm_up(self, config: Config, ids: torch.Tensor) -> None:
        """The first call at the bench's shapes, timed apart: kernel and allocator set-up, and compilation."""
        start = clock(config.target.device)
        self.generate(config, ids, min(16, self.max_new_tokens))()
        config.warm_up_seconds = clock(config.target.device) - start

    def run(self, config: Config, ids: torch.Tensor) -> Run:
        draft_timer = ForwardTimer(config.draft_model)
        target_timer = self.timers[id(config.target)]
        fn = self.generate(config, ids)
        target_timer.take()
        compiles = graphs.compiled_graphs()
        start = clock(config.target.device)
        tokens, stats = fn()
        wall = clock(config.target.device) - start
        config.timed_compiles += graphs.compiled_graphs() - compiles
        run = Run(ids.shape[1], tokens, wall, target_timer.take(), draft_timer.take(), stats)
        draft_timer.close()
        return run

    def close(self) -> None:
        for timer in self.timers.values():
            timer.close()


def run_bench(target, target_name: str, tokenizer, drafters: list, prompts: list[str], plan: BenchPlan,
              on_run: Callable[[], None] = lambda: None, plain: tuple | None = None) -> BenchResult:
    """Warm up, run every configuration (:func:`configurations`) ``plan.repeats`` times on every prompt
    (interleaved), measure peak memory in one extra run each, and return the summary (see :func:`summarise`)."""
    gamma, repeats, max_new_tokens, compile = plan.gamma, plan.repeats, plan.max_new_tokens, plan.compile
    check_positive(gamma=gamma, repeats=repeats, max_new_tokens=max_new_tokens)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # assisted generation warns about its own defaults on every call
    configs = configurations(target, drafters, gamma, plain, compile)
    ids = [tokenizer(p, return_tensors="pt").input_ids.to(target.device) for p in prompts]
    largest = GammaController.around(gamma).max_num_draft_tokens  # dynamic γ's widest step
    bench = Bench(configs, gamma, max_new_tokens, max(len(i[0]) for i in ids) + max_new_tokens + largest + 1)
    for config in configs:
        bench.warm_up(config, ids[0])
    for _ in range(repeats):
        for config in configs:  # each repeat starts from the draft's own state, not the warm-up's or a repeat's,
            config.drafter = config.drafter.fresh() if config.drafter is not None else None
            config.controller = None  # and dynamic γ learns anew (over the repeat's prompts, as over a run's)
        runs = {id(c): [] for c in configs}
        for prompt in ids:
            for config in configs:
                runs[id(config)].append(bench.run(config, prompt))
                on_run()
        for config in configs:
            config.runs.append(runs[id(config)])
    longest = max(ids, key=lambda t: t.shape[1])
    for config in configs:
        resident = kernels.distinct_weight_bytes(config.target, config.draft_model)
        config.peak_mb = peak_memory_mb(bench.generate(config, longest), target.device, resident)
    bench.close()
    return summarise(configs, target, target_name, gamma, max_new_tokens, prompts, repeats,
                     [row[0].tolist() for row in ids], compile)


def _tps(runs: list[Run]) -> float:
    return sum(len(r.tokens) for r in runs) / sum(r.wall for r in runs)


def summarise(configs: list[Config], target, target_name: str, gamma: int, max_new_tokens: int, prompts: list[str],
              repeats: int, prompt_ids: list[list[int]], compile: bool = False) -> BenchResult:
    from specdraft_eval.measure.environment import dtype_name, hardware

    reference = configs[0]
    assisted = {(c.draft, c.kernels): c for c in configs if c.engine == ASSISTED}
    ours_plain = {c.compiled: c for c in configs if c.engine == OURS_PLAIN}  # eager and compiled beside each other
    rows = []
    for config in configs:
        rates = [_tps(runs) for runs in config.runs]
        flat = [r for runs in config.runs for r in runs]
        wall = sum(r.wall for r in flat)
        target_s, draft_s = sum(sum(r.target_calls) for r in flat), sum(sum(r.draft_calls) for r in flat)
        draft_only = kernels.distinct_weight_bytes(target, config.draft_model) - kernels.distinct_weight_bytes(target)
        mismatched = sorted({i for runs, ref_runs in zip(config.runs, reference.runs)
                             for i, (r, ref) in enumerate(zip(runs, ref_runs)) if r.tokens != ref.tokens})
        wheres = [divergence(target, prompt_ids[i], config.runs[0][i].tokens, reference.runs[0][i].tokens)
                  for i in mismatched]
        margins = [where.logit_margin if where else None for where in wheres]

        def versus(other: Config | None) -> Spread | None:
            if other is None:
                return None
            return Spread.of([a / b for a, b in zip(rates, [_tps(r) for r in other.runs])])

        ours = config.engine in (OURS, OURS_DYNAMIC)
        rows.append(BenchRow(
            config.engine, config.kernels, config.draft, gamma if config.drafter else None,
            config.engine == OURS_DYNAMIC, mismatched, margins,
            sum(near_tie(m, dtype_name(target.dtype)) for m in margins),
            sum(len(r.tokens) for r in flat), Spread.of(rates), versus(reference), versus(ours_plain[config.compiled]),
            _overhead(config, flat, target_s + draft_s, wall), config.peak_mb, draft_only / 2**20,
            _step_figures(config, flat, target_s, draft_s),
            versus(assisted.get((config.draft, config.kernels)) if ours else None),
            versus(assisted.get((config.draft, "plain")) if ours else None),
            compiled=config.compiled, warm_up_seconds=config.warm_up_seconds, timed_compiles=config.timed_compiles))
    ar_peak = reference.peak_mb
    for row in rows:
        row.memory_ok = (row.peak_mb <= (ar_peak + row.draft_weights_mb) * 1.10) if ar_peak else None
    return BenchResult(target_name, dtype_name(target.dtype), compile, hardware(target.device), gamma,
                       max_new_tokens, len(prompts), repeats, rows)


ENGINE_CLOCKED = (OURS, OURS_DYNAMIC, OURS_PLAIN)
"""Rows timed by our engine's own clock (``GenerationStats``), which compiled steps do not bypass."""


def _overhead(config: Config, flat: list[Run], forward_s: float, wall: float) -> float:
    """Share of the wall time outside the model passes: our engine's own split (draft, its prefill, verification),
    else the module hooks' forward seconds."""
    if config.engine in ENGINE_CLOCKED:
        stats = sum((r.stats for r in flat), GenerationStats())
        return 1 - (stats.draft_seconds + stats.draft_prefill_seconds + stats.verify_seconds) / wall
    return 1 - forward_s / wall


def _step_figures(config: Config, flat: list[Run], target_s: float, draft_s: float) -> StepFigures:
    """TAR, draft ms per token, verify ms per step (a prediction from these same seconds would only measure the loop
    overhead, which the ``overhead`` column gives; ``zoo validate`` predicts from a separate profile). Our engine's
    rows read its own clock (``GenerationStats``), which times compiled steps too (a compiled step calls the
    model's ``forward`` directly, past the module hooks); transformers' rows read the hooks."""
    stats = sum((r.stats for r in flat if r.stats is not None), GenerationStats())
    if config.engine not in ENGINE_CLOCKED:  # one target call per step
        draft_calls = sum(len(r.draft_calls) for r in flat)
        steps = sum(len(r.target_calls) for r in flat)
        return StepFigures(sum(len(r.tokens) for r in flat) / steps if steps else None,
                           draft_s / draft_calls * 1000 if draft_calls else None,
                           target_s / steps * 1000 if steps else None, None)
    drafted = stats.draft_tokens  # plain decoding: TAR 1.0, no draft
    by_repeat = [sum((r.stats for r in runs if r.stats is not None), GenerationStats()).tar for runs in config.runs]
    return StepFigures(stats.tar, stats.draft_ms_per_token, stats.verify_ms_per_step,
                       drafted / stats.steps if stats.steps and drafted else None,
                       stats.acceptance_figures if drafted else None, by_repeat if drafted else None)


def bench(target_name: str, drafts: list[str], prompts: list[str], plan: BenchPlan, settings: LoadSettings,
          tick: Tick = no_progress) -> BenchResult:
    """``zoo bench``: load the target with ``settings`` (and, where ours runs other kernels, a plain copy for
    transformers as users run it), time every configuration (:func:`run_bench`) and refuse a result whose tokens
    differ beyond reduced precision's near-ties (:func:`check_lossless`)."""
    from zoo.measure.loading import load_run

    check_positive(gamma=plan.gamma, repeats=plan.repeats, max_new_tokens=plan.max_new_tokens)
    target, drafters = load_run(target_name, drafts, settings)
    model, tokenizer = target.model, target.tokenizer
    plain = None
    if settings.kernels != "plain":  # transformers as users run it, too
        plain_target, plain_drafters = load_run(target_name, drafts, replace(settings, kernels="plain"))
        plain = plain_target.model, plain_drafters
    tick(0, total=plan.repeats * len(prompts) * len(configurations(model, drafters, plan.gamma, plain)))
    result = run_bench(model, target_name, tokenizer, drafters, prompts, plan, on_run=tick, plain=plain)
    result.lossless = check_lossless(result, prompts)
    return result
