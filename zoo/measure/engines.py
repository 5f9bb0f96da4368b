"""``zoo compare``: the same prompts and draft in our engine and in vLLM, side by side, per batch size.

Each repeat decodes every prompt in batches of each size four ways: our engine speculatively and plainly (one
:class:`~specdraft_eval.engine.session.Session` with its baseline, its steps as vLLM takes them:
:attr:`~specdraft_eval.engine.params.RunSettings.steps_as_vllm`) and vLLM speculatively and plainly (one
:class:`~specdraft_eval.integration.vllm_engine.VllmSession`, its two servers), the two engines in alternating order
from repeat to repeat. Greedy, no stop strings (each request ends at its token budget or EOS, so vLLM reports every
request's own metrics). With ``dynamic_gamma`` our engine chooses γ each step (between 0 and 4x γ; vLLM has no such
mode and drafts γ always): its best configuration beside vLLM's; with ``static_cache`` ours (both sides) decodes over a
preallocated KV cache. Acceptance is compared as vLLM counts it (per
position: steps whose draft token i was accepted over drafts; mean acceptance length), from the first repeat. Every
measurement starts from a fresh draft state in both engines (a stateful draft, such as suffix decoding's cache: a
new vLLM server). Times are end to end (prefill included) for both: vLLM's as its client sees them, over HTTP on the
same machine.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from specdraft_eval.drafts import load_draft
from specdraft_eval.engine.params import DecodeParams, GammaPolicy, RunSettings
from specdraft_eval.engine.session import Session
from specdraft_eval.integration.vllm_engine import VllmRun, VllmSession, vllm_model_dir
from specdraft_eval.measure.stats import GenerationStats
from specdraft_eval.models.targets import load_target
from specdraft_eval.results.profiles import Spread
from zoo.progress import Tick, no_progress

ENGINES = ("specdec", "vllm")


@dataclass
class EngineRow:
    """One engine at one batch size: speculative and plain tokens/s and speedup over the repeats (median, min,
    max), acceptance as vLLM counts it (first repeat), and whether greedy outputs matched."""

    engine: str
    batch_size: int
    tokens_per_second: Spread
    plain_tokens_per_second: Spread
    speedup: Spread
    mean_acceptance_length: float | None
    acceptance_by_position: list[float]
    identical_to_own_plain: int  # requests whose speculative output equals the same engine's plain output
    identical_to_other_engine: int | None = None  # ... equals the other engine's speculative output
    requests: int = 0

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class EngineComparison:
    """``zoo compare``'s result: the rows, and the largest per-position acceptance difference at each size."""

    target: str
    draft: str
    num_draft_tokens: int
    max_new_tokens: int
    prompts: int
    vllm_version: str
    rows: list[EngineRow] = field(default_factory=list)
    dynamic_gamma: bool = False  # ours chose γ per step (vLLM: γ every step)
    static_cache: bool = False  # ours decoded over a preallocated KV cache

    def position_difference(self, batch_size: int) -> float | None:
        """max |ours - vLLM's| over positions of the per-position acceptance at ``batch_size``."""
        ours, theirs = (next(r for r in self.rows if r.engine == e and r.batch_size == batch_size) for e in ENGINES)
        if not ours.acceptance_by_position or not theirs.acceptance_by_position:
            return None
        return max(abs(a - b) for a, b in zip(ours.acceptance_by_position, theirs.acceptance_by_position))

    def to_json(self) -> dict:
        sizes = sorted({r.batch_size for r in self.rows})
        return {"target": self.target, "draft": self.draft, "num_draft_tokens": self.num_draft_tokens,
                "max_new_tokens": self.max_new_tokens, "prompts": self.prompts, "vllm_version": self.vllm_version,
                "dynamic_gamma": self.dynamic_gamma, "static_cache": self.static_cache,
                "rows": [r.to_json() for r in self.rows],
                "acceptance_difference_by_batch_size": {str(s): self.position_difference(s) for s in sizes}}


def _batches(ids: list[list[int]], size: int) -> list[list[list[int]]]:
    return [ids[i : i + size] for i in range(0, len(ids), size)]


def _acceptance(stats: GenerationStats) -> tuple[float | None, list[float]]:
    return stats.mean_acceptance_length, [round(x, 4) for x in stats.acceptance_rate_per_position]


def compare_engines(target_name: str, draft: str, prompts: list[str], num_draft_tokens: int, max_new_tokens: int,
                    batch_sizes: list[int], repeats: int, tick: Tick = no_progress,
                    dynamic_gamma: bool = False, static_cache: bool = False) -> EngineComparison:
    """Decode ``prompts`` with ``draft`` in both engines at each batch size (see the module's docstring)."""
    target = load_target(target_name, kernels="onednn")
    drafter = load_draft(draft, target)
    ids = [target.tokenizer(p).input_ids[-512:] for p in prompts]
    run = VllmRun(vllm_model_dir(target_name), draft, num_draft_tokens, baseline=True, max_num_seqs=max(batch_sizes),
                  max_model_len=max(len(i) for i in ids) + max_new_tokens + num_draft_tokens + 8)
    params = DecodeParams(max_new_tokens)
    ours = RunSettings(GammaPolicy(num_draft_tokens, dynamic_gamma), static_cache=static_cache, steps_as_vllm=True)
    stateful = drafter.fresh() is not drafter  # (a suffix cache: fresh for every measurement in both engines)
    tick(0, total=len(batch_sizes) * repeats * 2)
    vllm = VllmSession(run, target.model)
    result = EngineComparison(target_name, drafter.name, num_draft_tokens, max_new_tokens, len(ids), vllm.version,
                              dynamic_gamma=dynamic_gamma, static_cache=static_cache)
    try:
        for size in batch_sizes:
            measured: dict[str, list[tuple[GenerationStats, list[list[int]]]]] = {e: [] for e in ENGINES}
            for repeat in range(repeats):
                for engine in (ENGINES if repeat % 2 == 0 else ENGINES[::-1]):
                    if engine == "vllm" and stateful and (size, repeat) != (batch_sizes[0], 0):
                        vllm.renew()  # an empty suffix cache, as ours starts each measurement
                    session = (Session(target.model, drafter.fresh(), ours, baseline=True) if engine == "specdec"
                               else vllm)
                    task = f"batch {size} repeat {repeat}"
                    outputs = []
                    for batch in _batches(ids, size):
                        outputs += session.generate(batch, params, task=task).outputs
                    measured[engine].append((session.stats[task], outputs))
                    tick()
            result.rows += _rows(measured, size, len(ids))
    finally:
        vllm.close()
    return result


def _rows(measured: dict, size: int, requests: int) -> list[EngineRow]:
    rows = []
    for engine, runs in measured.items():
        first = runs[0][0]
        mal, by_position = _acceptance(first)
        other = measured[ENGINES[1 - ENGINES.index(engine)]][0][1]
        rows.append(EngineRow(
            engine, size, Spread.of([_tps(s) for s, _ in runs]), Spread.of([_plain_tps(s) for s, _ in runs]),
            Spread.of([_tps(s) / _plain_tps(s) for s, _ in runs]), mal, by_position,
            requests - first.baseline_mismatches, sum(a == b for a, b in zip(runs[0][1], other)), requests))
    return rows


def _tps(stats: GenerationStats) -> float:
    """Tokens/s end to end (prefill included; vLLM's wall time holds its prefill)."""
    return stats.generated_tokens / (stats.prefill_seconds + stats.decode_seconds)


def _plain_tps(stats: GenerationStats) -> float:
    seconds = stats.baseline_seconds + stats.baseline_prefill_seconds
    return stats.baseline_tokens / seconds
