"""``zoo validate``: check the analytical model the way the founding paper did (its Appendix D, Figure 12), on any
configuration.

Profile latencies first (:func:`zoo.profile.engine_latency`, on random tokens at each *context bucket* of the
measured prompts: their lengths split into up to three groups, each profiled at its median length, verification
up to the largest γ a run can use), then run every task, draft, γ (and with ``dynamic``, dynamic γ) end to end;
predict each request's time from its bucket's profile and its *counts* (TAR, the mix of draft lengths from the
per-position counts, its prompt length), never from its own seconds, and compare the run's tokens/s with the
measured ones.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from specdraft_eval.drafts.composite import CompositeDrafter
from specdraft_eval.engine.loop import speculative_generate
from specdraft_eval.files import atomic_write, write_json
from specdraft_eval.measure.analytical import Latencies, predicted_from_latencies
from specdraft_eval.measure.environment import hardware
from specdraft_eval.measure.profiles import Profile
from specdraft_eval.measure.stats import GenerationStats
from specdraft_eval.models.targets import LoadSettings
from zoo.plotting import png_bytes
from zoo.progress import Tick, no_progress
from zoo.prompts import check_positive
from zoo.timing import context_tokens, engine_latency

BUCKETS = 3
TASKS = ("specdec_humaneval", "specdec_mmlu_cot")


@dataclass(frozen=True)
class ValidationRow:
    """One (task, draft, γ, dynamic γ): predicted against measured tokens/s, medians over repeats with min and max,
    the signed deviation, TAR and the loop's share of decode time."""

    task: str
    draft: str
    gamma: int
    dynamic_gamma: bool
    predicted_tokens_per_second: float
    measured_tokens_per_second: float
    deviation: float
    predicted_min: float
    predicted_max: float
    measured_min: float
    measured_max: float
    tar: float | None
    loop_overhead: float | None


@dataclass(frozen=True)
class Validation:
    """A ``zoo validate`` run: its rows and the deviations' distribution (``validation.json`` at the edge)."""

    target: str
    hardware: str
    tasks: list[str]
    prompts: dict[str, int]
    max_new_tokens: int
    repeats: int
    profile_contexts: list[int]
    rows: list[ValidationRow]

    @property
    def deviations(self) -> list[float]:
        return sorted(abs(r.deviation) for r in self.rows)

    @property
    def median_abs_deviation(self) -> float:
        return statistics.median(self.deviations)

    @property
    def max_abs_deviation(self) -> float:
        return self.deviations[-1]

    @property
    def p90_abs_deviation(self) -> float:
        deviations = self.deviations
        return deviations[min(len(deviations) - 1, int(0.9 * len(deviations)))]

    def to_json(self) -> dict:
        deviations = self.deviations
        return {**asdict(self), "median_abs_deviation": self.median_abs_deviation,
                "max_abs_deviation": self.max_abs_deviation, "p90_abs_deviation": self.p90_abs_deviation,
                "within_5_percent": sum(d <= 0.05 for d in deviations) / len(deviations)}


def deviation(predicted: float, measured: float) -> float:
    """Signed fraction: +0.03 means the prediction is 3% above the measurement."""
    return predicted / measured - 1


def context_buckets(lengths: list[int], buckets: int = BUCKETS) -> dict[int, int]:
    """Each prompt length -> the context its bucket is profiled at: the lengths, sorted, split into up to
    ``buckets`` groups of equal count, each represented by its median."""
    ordered = sorted(set(lengths))
    size = -(-len(ordered) // min(buckets, len(ordered)))
    groups = [ordered[i:i + size] for i in range(0, len(ordered), size)]
    return {length: round(statistics.median(group)) for group in groups for length in group}


def composite_latencies(profile: Profile, parts: list[str], used: list[int]) -> Latencies | None:
    """A composite's latencies for one request: each part's time per drafted token weighted by the share of the
    request's steps that part drafted (its counts, not its seconds); every part it called read the prompt."""
    timings = [profile.latencies(part) for part in parts]
    if any(t is None for t in timings) or not sum(used):
        return None
    return replace(timings[0], t_draft_ms=sum(u * t.t_draft_ms for u, t in zip(used, timings)) / sum(used),
                   draft_prefill_ms_per_token=sum(t.draft_prefill_ms_per_token for t in timings))


def predicted_tokens_per_second(runs: list[tuple[GenerationStats, Profile, list[int] | None]], draft: str,
                                parts: list[str] | None = None) -> float | None:
    """A run's tokens/s predicted request by request, each from its bucket's profile (a composite's from its
    parts' latencies and the steps each drafted, :func:`composite_latencies`): Σ tokens / Σ predicted seconds."""
    seconds = 0.0
    for stats, profile, used in runs:
        latencies = composite_latencies(profile, parts, used) if parts and used else profile.latencies(draft)
        tps = predicted_from_latencies(stats, latencies) if latencies else None
        if tps is None:
            return None
        seconds += stats.generated_tokens / tps
    return sum(stats.generated_tokens for stats, *_ in runs) / seconds if seconds else None


def _parts(drafter) -> list:
    """A composite's parts (each profiled and charged for the steps it drafted), else none."""
    return list(drafter.parts) if isinstance(drafter, CompositeDrafter) else []


def _request(target, drafter, ids: list[int], max_new_tokens: int, gamma: int,
             dynamic_gamma: bool) -> tuple[GenerationStats, list[int] | None]:
    """One generation's stats and, for a composite, the steps each part drafted in it."""
    before = list(drafter.used) if _parts(drafter) else None
    stats = speculative_generate(target, drafter, ids, max_new_tokens, num_draft_tokens=gamma,
                                 dynamic_gamma=dynamic_gamma)[1]
    return stats, [a - b for a, b in zip(drafter.used, before)] if before is not None else None


def validate(target, target_name: str, drafters: list, prompts: dict[str, list[list[int]]], gammas: list[int],
             repeats: int, max_new_tokens: int, dynamic: bool = False,
             on_run: Callable[[], None] = lambda: None) -> Validation:
    """Profile each context bucket, then measure every (task, draft, γ, dynamic γ) ``repeats`` times over the task's
    ``prompts``; rows of predicted against measured tokens/s (medians over repeats, with min and max) and their
    deviation, and the deviations' distribution."""
    largest = 4 * max(gammas) if dynamic else max(gammas)  # dynamic γ chooses up to 4×γ
    contexts = context_buckets([len(p) for task_prompts in prompts.values() for p in task_prompts])
    timed = list({d.name: d for drafter in drafters for d in [drafter, *_parts(drafter)]}.values())
    profiles = {}
    for context in sorted(set(contexts.values())):  # cache growing over the generation, as the runs see it
        verify, drafts = engine_latency(target, timed, sorted({*gammas, largest}),
                                        [context_tokens(context, target.config.vocab_size)], max_new_tokens)
        profiles[context] = Profile(hardware(target.device), target_name, context, max_new_tokens, verify, drafts)
        on_run()
    runs: dict[tuple, list[list[tuple[GenerationStats, Profile, list[int] | None]]]] = {}
    for _ in range(repeats):  # repeats outermost: slow drifts of the machine spread over every configuration
        for task, task_prompts in prompts.items():
            for drafter in drafters:
                for gamma in gammas:
                    for dynamic_gamma in (False, True) if dynamic else (False,):
                        run = []
                        for ids in task_prompts:
                            stats, used = _request(target, drafter, ids, max_new_tokens, gamma, dynamic_gamma)
                            run.append((stats, profiles[contexts[len(ids)]], used))
                        runs.setdefault((task, drafter, gamma, dynamic_gamma), []).append(run)
                        on_run()
    rows = []
    for (task, drafter, gamma, dynamic_gamma), repeated in runs.items():
        parts = [part.name for part in _parts(drafter)]
        predicted = [predicted_tokens_per_second(run, drafter.name, parts) for run in repeated]
        totals = [sum((stats for stats, *_ in run), GenerationStats()) for run in repeated]
        measured = [t.tokens_per_second for t in totals]
        summary = sum(totals, GenerationStats())
        p, m = statistics.median(predicted), statistics.median(measured)
        rows.append(ValidationRow(task, drafter.name, gamma, dynamic_gamma, p, m, deviation(p, m), min(predicted),
                                  max(predicted), min(measured), max(measured), summary.tar, summary.loop_overhead))
    return Validation(target_name, hardware(target.device), list(prompts),
                      {task: len(p) for task, p in prompts.items()}, max_new_tokens, repeats, sorted(profiles), rows)


def plot(result: Validation, path: Path) -> None:
    """Predicted against measured tokens/s with min–max bars over repeats (the paper's Figure 12)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 5), dpi=100)
    rows = result.rows
    for draft in sorted({r.draft for r in rows}):
        mine = [r for r in rows if r.draft == draft]
        ax.errorbar([r.measured_tokens_per_second for r in mine], [r.predicted_tokens_per_second for r in mine],
                    xerr=[[r.measured_tokens_per_second - r.measured_min for r in mine],
                          [r.measured_max - r.measured_tokens_per_second for r in mine]],
                    yerr=[[r.predicted_tokens_per_second - r.predicted_min for r in mine],
                          [r.predicted_max - r.predicted_tokens_per_second for r in mine]],
                    fmt="o", capsize=3, label=draft)
        for r in mine:
            ax.annotate(f"γ={r.gamma}", (r.measured_tokens_per_second, r.predicted_tokens_per_second),
                        fontsize=6, xytext=(3, 3), textcoords="offset points")
    values = [v for r in rows for v in (r.measured_min, r.measured_max, r.predicted_min, r.predicted_max)]
    low, high = min(values) * 0.9, max(values) * 1.1
    ax.plot([low, high], [low, high], "k-", lw=0.8, label="predicted = measured")
    ax.fill_between([low, high], [low * 0.95, high * 0.95], [low * 1.05, high * 1.05], color="0.9", label="±5%")
    ax.set_xlim(low, high)
    ax.set_ylim(low, high)
    ax.set_xlabel("measured tokens/s")
    ax.set_ylabel("predicted tokens/s (profile latencies, measured TAR)")
    ax.set_title(f"{result.target}: median |dev| {result.median_abs_deviation:.1%}, "
                 f"max {result.max_abs_deviation:.1%}", fontsize=9)
    ax.legend(fontsize=7)
    atomic_write(path, png_bytes(fig))


GRID_DRAFTS = ("prompt-lookup", "layers:0-4", "prompt-lookup:2-3|layers:0-4")
DEFAULT_DRAFTS = ("prompt-lookup", "layers:0-4")


def configurations(tasks: list[str] | None, drafts: list[str] | None, gammas: list[int],
                   grid: bool) -> tuple[list[str], list[str], list[int]]:
    """The tasks, drafts and γ a validation runs: as given, with defaults; ``grid``: both tasks, γ 1-4."""
    if grid:
        return list(tasks or TASKS), list(drafts or GRID_DRAFTS), [1, 2, 3, 4]
    return list(tasks or TASKS[:1]), list(drafts or DEFAULT_DRAFTS), gammas


def run(target_name: str, drafts: list[str], tasks: list[str], n_prompts: int, gammas: list[int], repeats: int,
        max_new_tokens: int, plot_path: Path, settings: LoadSettings, dynamic: bool = False,
        tick: Tick = no_progress) -> Validation:
    """``zoo validate``: load the target and drafts with ``settings``, :func:`validate` on each task's first
    ``n_prompts`` prompts, write the plot at ``plot_path`` and the figures beside it (``.json``); return them."""
    from specdraft_eval.integration.offline_data import task_prompts
    from zoo.loading import load_run

    check_positive(prompts=n_prompts, repeats=repeats, max_new_tokens=max_new_tokens)
    texts = {task: task_prompts(task)[:n_prompts] for task in tasks}
    target, drafters = load_run(target_name, drafts, settings)
    model, tokenizer = target.model, target.tokenizer
    keep = min(512, getattr(model.config, "max_position_embeddings", 512 + max_new_tokens) - max_new_tokens)
    ids = {task: [tokenizer(t).input_ids[-keep:] for t in prompts] for task, prompts in texts.items()}
    runs = len(tasks) * len(drafters) * len(gammas) * (2 if dynamic else 1)
    tick(0, total=BUCKETS + repeats * runs)
    result = validate(model, target_name, drafters, ids, gammas, repeats, max_new_tokens, dynamic, on_run=tick)
    plot(result, plot_path)
    write_json(plot_path.with_suffix(".json"), result.to_json())
    return result


def table_rows(result: Validation) -> list[dict]:
    """The rows as the CLI's text table shows them."""
    return [{"task": r.task, "draft": r.draft, "γ": r.gamma if not r.dynamic_gamma else f"{r.gamma} dyn",
             "predicted tok/s": r.predicted_tokens_per_second, "measured tok/s": r.measured_tokens_per_second,
             "measured min–max": f"{r.measured_min:.3g}–{r.measured_max:.3g}",
             "deviation": f"{r.deviation:+.1%}", "TAR": r.tar, "loop overhead": f"{r.loop_overhead:.1%}"}
            for r in result.rows]
