"""``zoo validate``: check the analytical model the way the founding paper did (its Appendix D, Figure 12), on any
configuration.

Each repeat is a sitting: profile latencies first (:func:`zoo.measure.timing.engine_latency`, on random tokens at each
*context bucket* of the measured prompts: their lengths split into up to three groups, each profiled at its median
length, verification up to the largest γ a run can use; and the loop's own time per step, plain and per draft),
then run every task, draft, γ (and with ``dynamic``, dynamic γ) end to end, each request followed by plain decoding
of it. Predict each request's time from its bucket's profile and its *counts* (TAR, the mix of draft lengths, the
draft's prefill), never from its own seconds; the predicted *speedup* (the profile's ratios: drift of the machine
between the profile and the run cancels) is compared with the run's speedup over its interleaved plain decoding,
and tokens/s beside it.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from specdraft_eval.drafts.composite import CompositeDrafter
from specdraft_eval.engine.loop import NoDraft, autoregressive_generate, speculative_generate
from specdraft_eval.errors import SpecdecError
from specdraft_eval.files import atomic_write, write_json
from specdraft_eval.measure.analytical import Latencies, predicted_from_latencies
from specdraft_eval.measure.environment import hardware
from specdraft_eval.measure.stats import GenerationStats
from specdraft_eval.models.targets import LoadSettings
from specdraft_eval.results.profiles import Profile
from zoo.measure.prompts import check_positive
from zoo.measure.timing import context_tokens, engine_latency
from zoo.progress import Tick, no_progress
from zoo.report.plotting import png_bytes

BUCKETS = 3
TASKS = ("specdec_humaneval", "specdec_mmlu_cot")


@dataclass(frozen=True)
class ValidationRow:
    """One (task, draft, γ, dynamic γ): the predicted speedup over plain decoding against the measured one (each
    repeat's run against plain decoding of the same prompts interleaved with it), and predicted against measured
    tokens/s; medians over repeats with min and max, signed deviations, TAR and the loop's share of decode time."""

    task: str
    draft: str
    gamma: int
    dynamic_gamma: bool
    predicted_speedup: float
    measured_speedup: float
    speedup_deviation: float
    predicted_speedup_min: float
    predicted_speedup_max: float
    measured_speedup_min: float
    measured_speedup_max: float
    predicted_tokens_per_second: float
    measured_tokens_per_second: float
    deviation: float  # of tokens/s
    predicted_min: float
    predicted_max: float
    measured_min: float
    measured_max: float
    tar: float | None
    loop_overhead: float | None


@dataclass(frozen=True)
class Validation:
    """A ``zoo validate`` run: its rows and the deviations' distributions (``validation.json`` at the edge): of
    the speedup (what the model is for) and, beside it, of tokens/s."""

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
        """|speedup deviation| of every row, sorted."""
        return sorted(abs(r.speedup_deviation) for r in self.rows)

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

    @property
    def tokens_per_second_deviations(self) -> tuple[float, float]:
        """Median and max |tokens/s deviation|."""
        found = sorted(abs(r.deviation) for r in self.rows)
        return statistics.median(found), found[-1]

    def to_json(self) -> dict:
        deviations, (tps_median, tps_max) = self.deviations, self.tokens_per_second_deviations
        return {**asdict(self), "median_abs_deviation": self.median_abs_deviation,
                "max_abs_deviation": self.max_abs_deviation, "p90_abs_deviation": self.p90_abs_deviation,
                "within_5_percent": sum(d <= 0.05 for d in deviations) / len(deviations),
                "tokens_per_second_median_abs_deviation": tps_median, "tokens_per_second_max_abs_deviation": tps_max}


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


PLAIN = ""
"""The loop's own time of plain decoding, in :attr:`Sitting.loop_ms`."""


@dataclass(frozen=True)
class Sitting:
    """One context bucket's latencies in one repeat: the profile, and the loop's own ms per step outside the
    draft's and the target's passes, per draft (:data:`PLAIN`: plain decoding), measured beside it."""

    profile: Profile
    loop_ms: dict[str, float]

    def latencies(self, draft: str, parts: list[str], used: list[int] | None) -> Latencies | None:
        """What a prediction for a request of ``draft`` needs (a composite's from its ``parts``' and ``used``)."""
        found = composite_latencies(self.profile, parts, used) if parts and used else self.profile.latencies(draft)
        return replace(found, loop_ms_per_step=self.loop_ms[draft]) if found else None

    @property
    def plain_ms_per_token(self) -> float:
        """A plain decoding step: the target's one-token pass and the loop's own time."""
        return self.profile.t_target_ms + self.loop_ms[PLAIN]


@dataclass(frozen=True)
class Request:
    """One prompt in one run: the speculative generation's stats, plain decoding's of the same prompt right after
    it, the sitting its prediction reads, and for a composite the steps each part drafted."""

    stats: GenerationStats
    plain: GenerationStats
    sitting: Sitting
    used: list[int] | None


def _loop_ms(target, drafter, tokens: list[int], steps: int, gamma: int) -> float:
    """The loop's own ms per step (outside the draft's and the target's passes) generating ``steps`` tokens."""
    stats = speculative_generate(target, drafter, tokens, steps, num_draft_tokens=gamma)[1]
    return stats.loop_overhead * stats.decode_seconds / stats.steps * 1000


def sitting(target, target_name: str, drafters: list, timed: list, gammas: list[int], context: int,
            steps: int) -> Sitting:
    """Profile one context bucket (:func:`zoo.measure.timing.engine_latency` on random tokens) and time the loop's own
    work per step, plain and per draft, on the same tokens."""
    tokens = context_tokens(context, target.config.vocab_size)
    verify, drafts = engine_latency(target, timed, gammas, [tokens], steps)
    profile = Profile(hardware(target.device), target_name, context, steps, verify, drafts)
    loop = {drafter.name: _loop_ms(target, drafter, tokens, steps, max(gammas)) for drafter in drafters}
    return Sitting(profile, {PLAIN: _loop_ms(target, NoDraft(), tokens, steps, 1), **loop})


def predicted(requests: list[Request], draft: str, parts: list[str]) -> tuple[float, float] | None:
    """A run's predicted tokens/s and speedup over plain decoding, request by request from its sitting's latencies
    and its counts (a composite's from its parts' latencies and the steps each drafted): Σ tokens / Σ predicted
    seconds, against plain decoding's Σ tokens / Σ (tokens × a plain step)."""
    seconds = plain_seconds = 0.0
    for request in requests:
        latencies = request.sitting.latencies(draft, parts, request.used)
        tps = predicted_from_latencies(request.stats, latencies) if latencies else None
        if tps is None:
            return None
        seconds += request.stats.generated_tokens / tps
        plain_seconds += request.plain.baseline_tokens * request.sitting.plain_ms_per_token / 1000
    tokens = sum(r.stats.generated_tokens for r in requests)
    plain_tokens = sum(r.plain.baseline_tokens for r in requests)
    return tokens / seconds, (tokens / seconds) / (plain_tokens / plain_seconds)


def measured(requests: list[Request]) -> tuple[float, float]:
    """A run's measured tokens/s and speedup over the plain decoding interleaved with it."""
    total = sum((r.stats + r.plain for r in requests), GenerationStats())
    return total.tokens_per_second, total.speedup


def _parts(drafter) -> list:
    """A composite's parts (each profiled and charged for the steps it drafted), else none."""
    return list(drafter.parts) if isinstance(drafter, CompositeDrafter) else []


def _request(target, drafter, ids: list[int], max_new_tokens: int, gamma: int, dynamic_gamma: bool,
             at: Sitting) -> Request:
    """One prompt: the speculative generation, then plain decoding of the same prompt."""
    before = list(drafter.used) if _parts(drafter) else None
    stats = speculative_generate(target, drafter, ids, max_new_tokens, num_draft_tokens=gamma,
                                 dynamic_gamma=dynamic_gamma)[1]
    used = [a - b for a, b in zip(drafter.used, before)] if before is not None else None
    return Request(stats, autoregressive_generate(target, ids, max_new_tokens)[1], at, used)


def validate(target, target_name: str, drafters: list, prompts: dict[str, list[list[int]]], gammas: list[int],
             repeats: int, max_new_tokens: int, dynamic: bool = False,
             on_run: Callable[[], None] = lambda: None) -> Validation:
    """Per repeat: profile each context bucket (:func:`sitting`), then measure every (task, draft, γ, dynamic γ)
    over the task's ``prompts``, each request followed by plain decoding of it. Rows of predicted against measured
    speedup and tokens/s (medians over repeats, with min and max) and their deviations."""
    largest = 4 * max(gammas) if dynamic else max(gammas)  # dynamic γ chooses up to 4×γ
    contexts = context_buckets([len(p) for task_prompts in prompts.values() for p in task_prompts])
    timed = list({d.name: d for drafter in drafters for d in [drafter, *_parts(drafter)]}.values())
    runs: dict[tuple, list[list[Request]]] = {}
    buckets = sorted(set(contexts.values()))
    for _ in range(repeats):  # a sitting per repeat: its profile and its runs close together in time
        sittings = {}
        for context in buckets:
            sittings[context] = sitting(target, target_name, drafters, timed, sorted({*gammas, largest}), context,
                                        max_new_tokens)
            on_run()
        for task, task_prompts in prompts.items():
            for drafter in drafters:
                for gamma in gammas:
                    for dynamic_gamma in (False, True) if dynamic else (False,):
                        fresh = drafter.fresh()  # no earlier repeat's or γ's outputs in its state
                        run = [_request(target, fresh, ids, max_new_tokens, gamma, dynamic_gamma,
                                        sittings[contexts[len(ids)]]) for ids in task_prompts]
                        runs.setdefault((task, drafter, gamma, dynamic_gamma), []).append(run)
                        on_run()
    rows = []
    for (task, drafter, gamma, dynamic_gamma), repeated in runs.items():
        parts = [part.name for part in _parts(drafter)]
        predictions = [predicted(run, drafter.name, parts) for run in repeated]
        if None in predictions:
            raise SpecdecError(f"validate: the profile lacks a latency {drafter.name} at γ {gamma} needs: a bug")
        measurements = [measured(run) for run in repeated]
        tps, speedup = ([p[i] for p in predictions] for i in (0, 1))
        m_tps, m_speedup = ([m[i] for m in measurements] for i in (0, 1))
        summary = sum((r.stats for run in repeated for r in run), GenerationStats())
        ps, ms, pt, mt = (statistics.median(v) for v in (speedup, m_speedup, tps, m_tps))
        rows.append(ValidationRow(task, drafter.name, gamma, dynamic_gamma, ps, ms, deviation(ps, ms), min(speedup),
                                  max(speedup), min(m_speedup), max(m_speedup), pt, mt, deviation(pt, mt), min(tps),
                                  max(tps), min(m_tps), max(m_tps), summary.tar, summary.loop_overhead))
    return Validation(target_name, hardware(target.device), list(prompts),
                      {task: len(p) for task, p in prompts.items()}, max_new_tokens, repeats, buckets, rows)


def plot(result: Validation, path: Path) -> None:
    """Predicted against measured speedup over plain decoding, with min–max bars over repeats (after the paper's
    Figure 12, which plots tokens/s)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 5), dpi=100)
    rows = result.rows
    for draft in sorted({r.draft for r in rows}):
        mine = [r for r in rows if r.draft == draft]
        ax.errorbar([r.measured_speedup for r in mine], [r.predicted_speedup for r in mine],
                    xerr=[[r.measured_speedup - r.measured_speedup_min for r in mine],
                          [r.measured_speedup_max - r.measured_speedup for r in mine]],
                    yerr=[[r.predicted_speedup - r.predicted_speedup_min for r in mine],
                          [r.predicted_speedup_max - r.predicted_speedup for r in mine]],
                    fmt="o", capsize=3, label=draft)
        for r in mine:
            ax.annotate(f"γ={r.gamma}" + (" dyn" if r.dynamic_gamma else ""), (r.measured_speedup, r.predicted_speedup),
                        fontsize=6, xytext=(3, 3), textcoords="offset points")
    values = [v for r in rows for v in (r.measured_speedup_min, r.measured_speedup_max, r.predicted_speedup_min,
                                        r.predicted_speedup_max)]
    low, high = min(values) * 0.9, max(values) * 1.1
    ax.plot([low, high], [low, high], "k-", lw=0.8, label="predicted = measured")
    ax.fill_between([low, high], [low * 0.95, high * 0.95], [low * 1.05, high * 1.05], color="0.9", label="±5%")
    ax.set_xlim(low, high)
    ax.set_ylim(low, high)
    ax.set_xlabel("measured speedup (against plain decoding interleaved with the run)")
    ax.set_ylabel("predicted speedup (profile latencies, measured TAR)")
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


def workload(drafts: list[str], tasks: list[str], gammas: list[int], n_prompts: int, repeats: int,
             max_new_tokens: int, dynamic: bool) -> str:
    """What a validation will generate, said before it starts: its runs and generations, and the quick mode."""
    runs = len(tasks) * len(drafts) * len(gammas) * (2 if dynamic else 1)
    generations = 2 * runs * repeats * n_prompts  # speculative and plain
    return (f"zoo validate: {runs} configuration(s) x {repeats} repeat(s) x {n_prompts} prompt(s), speculative and "
            f"plain:\n  {generations} generations of up to {max_new_tokens} tokens after profiling the target (the bar "
            "shows the time left; --quick: a first look)")


def run(target_name: str, drafts: list[str], tasks: list[str], n_prompts: int, gammas: list[int], repeats: int,
        max_new_tokens: int, plot_path: Path, settings: LoadSettings, dynamic: bool = False,
        tick: Tick = no_progress) -> Validation:
    """``zoo validate``: load the target and drafts with ``settings``, :func:`validate` on each task's first
    ``n_prompts`` prompts, write the plot at ``plot_path`` and the figures beside it (``.json``); return them."""
    from specdraft_eval.integration.offline_data import task_prompts
    from zoo.measure.loading import load_run

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
    """The rows as the CLI's text table shows them, within 120 columns: speedups (median, min–max over repeats)
    first; tokens/s are in ``--json``."""
    return [{"task": r.task.removeprefix("specdec_"), "draft": r.draft,
             "γ": r.gamma if not r.dynamic_gamma else f"{r.gamma} dyn",
             "pred speedup": f"{r.predicted_speedup:.3g} ({r.predicted_speedup_min:.3g}–{r.predicted_speedup_max:.3g})",
             "speedup": f"{r.measured_speedup:.3g} ({r.measured_speedup_min:.3g}–{r.measured_speedup_max:.3g})",
             "deviation": f"{r.speedup_deviation:+.1%}", "TAR": r.tar,
             "overhead": f"{r.loop_overhead:.1%}"}
            for r in result.rows]
