"""``zoo bench --batch-size 1,2,4,8``: tokens/s against batch size, speculative and plain, in our batched engine.

Every batch size decodes the same prompts (batch B takes them B at a time), greedily, speculative and plain
interleaved in each repeat, after a warm-up, for each draft under each γ policy asked for (``--gamma 2,4,dynamic``:
fixed γs and dynamic γ, whose controller learns over a repeat's batches and chooses γ per batch size, 0 where
speculation does not pay). Per draft, γ and batch size: median tokens/s [min–max over repeats]
both ways, their ratio, TAR, the target's and the draft's KV-cache bytes per token (at the weights' dtype) and
peak memory of one batch each way. Each row's output must equal plain decoding of that prompt alone, token for
token. The study says up to which batch size speculation pays.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch

from specdraft_eval.drafts.spec import kind_versions
from specdraft_eval.engine.loop import (
    autoregressive_generate_batch,
    speculative_generate_batch,
)
from specdraft_eval.engine.params import DecodeParams, GammaPolicy, RunSettings
from specdraft_eval.engine.session import Session
from specdraft_eval.errors import SpecdecError
from specdraft_eval.measure.environment import ModelFacts, dtype_name, hardware
from specdraft_eval.measure.stats import GenerationStats
from specdraft_eval.measure.timers import peak_memory_mb
from specdraft_eval.models.kernels import distinct_weight_bytes
from specdraft_eval.models.targets import LoadSettings
from specdraft_eval.results import store
from specdraft_eval.results.profiles import Spread
from specdraft_eval.results.record import SpecdecRecord
from zoo.measure.bench.result import BenchPlan
from zoo.progress import Tick, no_progress

SCHEMA_VERSION = 3  # 2: spreads carry n, the task; 3: a row per γ policy (gamma), draft ms per step, host reads


@dataclass(frozen=True)
class BatchRow:
    """One draft under one γ policy at one batch size: tokens/s speculative and plain (median [min–max] over
    repeats), the median speedup, TAR, draft milliseconds per verification pass (the batch's drafting), host reads
    per pass, KV bytes per token and peak memory."""

    draft: str
    gamma: str  # "4", or "dynamic" (starting at the study's γ)
    batch_size: int
    tokens_per_second: Spread
    plain_tokens_per_second: Spread
    speedup: float
    tar: float | None
    target_kv_bytes_per_token: int
    draft_kv_bytes_per_token: int
    peak_mb: float
    plain_peak_mb: float
    draft_ms_per_pass: float = 0.0
    host_reads_per_pass: float | None = None
    mean_gamma: float | None = None  # drafted tokens per row per step (dynamic γ: what it chose)
    tar_by_repeat: list[float | None] | None = None  # each repeat's own TAR (each a fresh draft)

    def to_json(self) -> dict:
        return {**asdict(self), "tokens_per_second": self.tokens_per_second.to_json(),
                "plain_tokens_per_second": self.plain_tokens_per_second.to_json()}


@dataclass
class BatchStudy:
    """``zoo bench --batch-size``: the rows, the largest batch at which each draft (and γ policy) still paid, and
    where."""

    hardware: str
    dtype: str
    threads: int
    prompts: int
    max_new_tokens: int
    num_draft_tokens: int
    repeats: int
    rows: list[BatchRow] = field(default_factory=list)
    pays_up_to_batch: dict[str, int | None] = field(default_factory=dict)
    task: str | None = None

    def to_json(self) -> dict:
        return {"schema_version": SCHEMA_VERSION, **asdict(self), "rows": [r.to_json() for r in self.rows]}


def _batches(prompts: list[list[int]], size: int) -> list[list[list[int]]]:
    return [prompts[i:i + size] for i in range(0, len(prompts), size)]


Measured = Callable[[object, GammaPolicy, int, GenerationStats], None]
"""Told each (drafter, γ policy, batch size) measured, with its counters summed over the repeats."""


def run_batch_study(target, tokenizer, drafters: list, prompts: list[str], batch_sizes: list[int], plan: BenchPlan,
                    on_run: Callable[[], None] = lambda: None,
                    policies: list[GammaPolicy] | None = None,
                    on_measured: Measured = lambda *measured: None) -> BatchStudy:
    """Run the study (see the module docstring) under each of ``policies`` (default: the plan's fixed γ); raise
    :class:`SpecdecError` naming a prompt whose output differs from plain decoding."""
    repeats, max_new_tokens = plan.repeats, plan.max_new_tokens
    policies = policies or [GammaPolicy(plan.gamma)]
    ids = [tokenizer(p).input_ids[-512:] for p in prompts]  # long few-shot prompts: keep prefill comparable
    autoregressive_generate_batch(target, [ids[0]], min(8, max_new_tokens))  # warm-up
    expected = [autoregressive_generate_batch(target, [row], max_new_tokens)[0][0] for row in ids]
    rows = []
    for drafter in drafters:
        for policy in policies:
            run = RunSettings(policy)
            for size in batch_sizes:
                row, totals = _measure(target, drafter, run, ids, expected, size, repeats, max_new_tokens, on_run)
                rows.append(row)
                on_measured(drafter, policy, size, sum(totals, GenerationStats()))
    pays = {}
    for drafter in drafters:
        for policy in policies:
            label = _label(policy)
            paying = [r.batch_size for r in rows if (r.draft, r.gamma) == (drafter.name, label) and r.speedup > 1]
            pays[f"{drafter.name} γ={label}"] = max(paying) if paying else None
    return BatchStudy(hardware(target.device), dtype_name(target.dtype), torch.get_num_threads(), len(prompts),
                      max_new_tokens, plan.gamma, repeats, rows, pays)


def _label(policy: GammaPolicy) -> str:
    return "dynamic" if policy.dynamic_gamma else str(policy.num_draft_tokens)


def _measure(target, drafter, run: RunSettings, ids: list[list[int]], expected: list[list[int]], size: int,
             repeats: int, max_new_tokens: int, on_run: Callable[[], None]) -> tuple[BatchRow, list[GenerationStats]]:
    """One draft under one γ policy at one batch size (a warm-up, then ``repeats`` sessions with the baseline): its
    row and each repeat's counters."""
    speculative_generate_batch(target, drafter.fresh(), ids[:size], min(8, max_new_tokens), run=run)  # warm-up
    autoregressive_generate_batch(target, ids[:size], min(8, max_new_tokens))
    spec, plain, totals = [], [], []
    for repeat in range(repeats):  # one session per repeat: the baseline first every other batch and repeat, a
        # fresh draft (no repeat, γ policy or batch size finds another's outputs in a suffix cache)
        session = Session(target, drafter.fresh(), run, baseline=True, baseline_first=bool(repeat % 2))
        for batch_index, batch in enumerate(_batches(ids, size)):
            outputs = session.generate(batch, DecodeParams(max_new_tokens)).outputs
            for offset, output in enumerate(outputs):
                if output != expected[batch_index * size + offset]:
                    raise SpecdecError(
                        f"batch {size}, draft {drafter.name}: prompt {batch_index * size + offset} differs "
                        "from plain decoding: a bug, please report it with this command")
            on_run()
        total = session.stats["default"]
        spec.append(total.tokens_per_second)
        plain.append(total.baseline_tokens_per_second)
        totals.append(total)
    resident = distinct_weight_bytes(target, drafter.model)
    first, passes = ids[:size], totals[0].verify_passes
    return BatchRow(
        drafter.name, _label(run.gamma), size, Spread.of(spec), Spread.of(plain),
        statistics.median(s / p for s, p in zip(spec, plain, strict=True)), totals[0].tar,
        ModelFacts.of(target).kv_bytes_per_token, ModelFacts.of(drafter.model).kv_bytes_per_token,
        peak_memory_mb(lambda: speculative_generate_batch(target, drafter.fresh(), first, max_new_tokens, run=run),
                       target.device, resident),
        peak_memory_mb(lambda: autoregressive_generate_batch(target, first, max_new_tokens),
                       target.device, distinct_weight_bytes(target)),
        draft_ms_per_pass=statistics.median(t.draft_seconds / t.verify_passes * 1000 for t in totals),
        host_reads_per_pass=totals[0].host_reads / passes if passes else None,
        mean_gamma=totals[0].draft_tokens / totals[0].steps if totals[0].steps else None,
        tar_by_repeat=[t.tar for t in totals]), totals


def study(target_name: str, drafts: list[str], prompts: list[str], plan: BenchPlan, settings: LoadSettings,
          batch_sizes: list[int], tick: Tick = no_progress, policies: list[GammaPolicy] | None = None,
          task: str | None = None) -> BatchStudy:
    """``zoo bench --batch-size``: load the target and drafts with ``settings`` and :func:`run_batch_study`; each
    configuration's counters go to this machine's results store under ``task`` (default ``default``: a prompt
    file's)."""
    from zoo.measure.loading import load_run

    target, drafters = load_run(target_name, drafts, settings)
    runs = len(drafters) * len(policies or [None])
    tick(0, total=sum(-(-len(prompts) // size) for size in batch_sizes) * plan.repeats * runs)

    def stored(drafter, policy: GammaPolicy, size: int, stats: GenerationStats) -> None:
        """Each configuration measured goes to this machine's results store, where draft=auto reads it first."""
        record = SpecdecRecord.new(target_name, drafter.name, policy.num_draft_tokens, policy.dynamic_gamma,
                                   target.model.device, {task or "default": stats}, drafter.model,
                                   runtime=RunSettings(policy).runtime(target.model), batch_size=size,
                                   kind_versions=kind_versions(drafter.name))
        store.save(record, "zoo bench")

    return run_batch_study(target.model, target.tokenizer, drafters, prompts, batch_sizes, plan, on_run=tick,
                           policies=policies, on_measured=stored)
