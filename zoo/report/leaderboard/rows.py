"""The leaderboard's rows: results files -> one :class:`LeaderboardRow` per configuration and task (runs
merged), scoring runs -> the drafts' bits per byte, sweep files -> latency calibrations."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

from specdraft_eval.errors import SpecdecError
from specdraft_eval.results.profiles import Calibration, read_calibration_file
from specdraft_eval.results.record import (
    Configuration,
    ResultsFile,
    configurations,
    scan_results,
)
from specdraft_eval.results.report import positions

COLUMNS = [
    ("target", "target"), ("hardware", "hardware"), ("draft", "draft"), ("engine", "engine"), ("task", "task"),
    ("gamma", "γ"),
    ("dynamic_gamma", "dynamic γ"), ("runtime", "runtime"),
    ("speedup", "speedup"), ("speedup_min", "speedup min"), ("speedup_max", "speedup max"),
    ("end_to_end_speedup", "speedup end to end"), ("runs", "runs"),
    ("tar", "TAR"), ("accuracy", "accuracy"), ("draft_accuracy", "draft accuracy"),
    ("draft_bits_per_byte", "draft bits/byte"),
    ("documents", "documents"), ("tokens_per_second", "tokens/s"), ("baseline_tokens_per_second", "plain tokens/s"),
    ("draft_ms_per_token", "draft ms/token"), ("verify_ms_per_step", "verify ms/step"),
    ("acceptance_by_position", "acceptance by position (vLLM)"),
    ("conditional_acceptance", "conditional acceptance (SPEED-Bench)"),
    ("mean_acceptance_length", "mean acceptance length (vLLM)"), ("accept_length", "accept length (SGLang)"),
    ("mean_accepted_tokens", "mean accepted tokens (Spec-Bench)"),
    ("generated_tokens", "tokens"), ("baseline_tokens", "plain tokens"), ("overshoot_tokens", "overshoot tokens"),
    ("tar_p50", "TAR p50 of requests"), ("accepted_per_step", "accepted/step"),
    ("acceptance_rate", "acceptance rate"), ("draft_parameters_m", "draft params (M)"),
    ("draft_layers", "draft layers"), ("date", "date"), ("lm_eval", "lm-eval"), ("specdraft_eval", "specdraft-eval"),
]
GROUPED = ("target", "hardware")  # headings of the page, not columns of its tables


def _accuracy(task_results: dict) -> tuple[str | None, float | None]:
    for key, value in sorted(task_results.items()):
        if "," in key and "stderr" not in key and isinstance(value, (int, float)):
            return key.split(",")[0], float(value)
    return None, None


TIMED = ("tokens_per_second", "baseline_tokens_per_second", "draft_ms_per_token", "verify_ms_per_step")
"""Figures that depend on the machine's speed that day: the median over a configuration's runs (counters, and so
TAR and acceptance, are summed over runs instead)."""

def _day(date) -> str:
    return datetime.fromtimestamp(float(date), tz=timezone.utc).date().isoformat() if isinstance(date, (int, float)) \
        else str(date or "")


@dataclass(frozen=True)
class LeaderboardRow:
    """One configuration (:class:`~specdraft_eval.results.record.RunKey`) on one task, its runs merged: what every page,
    table and figure shows (:data:`COLUMNS`, plus the metric's name, acceptance per position as numbers and the
    target's own bits per byte)."""

    target: str
    hardware: str | None
    draft: str
    task: str
    gamma: int
    dynamic_gamma: bool
    runtime: str  # dtype, kernels, attention and static cache or compiled steps (Runtime's text)
    speedup: float | None
    speedup_min: float | None
    speedup_max: float | None
    runs: int
    tar: float | None
    accuracy: float | None
    documents: int | None
    tokens_per_second: float | None
    baseline_tokens_per_second: float | None
    draft_ms_per_token: float | None
    verify_ms_per_step: float | None
    acceptance_by_position: str
    tar_p50: float | None
    accepted_per_step: float | None
    acceptance_rate: float | None
    draft_parameters_m: float | None
    draft_layers: int | None
    date: str
    lm_eval: str | None
    specdraft_eval: str | None
    metric: str | None
    acceptance_rate_per_position: list[float]
    engine: str = "specdec"  # who decoded: ours, or vLLM (engine=vllm: "vllm", its version in the runtime)
    conditional_acceptance: str | None = None
    mean_acceptance_length: float | None = None
    accept_length: float | None = None
    mean_accepted_tokens: float | None = None
    generated_tokens: int | None = None
    baseline_tokens: int | None = None
    overshoot_tokens: int | None = None
    end_to_end_speedup: float | None = None  # the median over runs, prefill included (Spec-Bench's wall time)
    draft_accuracy: float | None = None
    draft_bits_per_byte: float | None = None
    target_bits_per_byte: float | None = None


def _median(values: list) -> float | None:
    return statistics.median(values) if None not in values else None


def rows_from_configuration(config: Configuration) -> list[LeaderboardRow]:
    """Leaderboard rows (one per task) of one configuration: every results file of it merged (a rerun, or a run
    of ``auto``, which records what it resolved to)."""
    latest = max(config.files, key=lambda f: str(f.date or ""))
    record = latest.record
    key, rows = config.key, []
    for task, stats in sorted(config.per_task.items()):
        runs = [f for f in config.files if task in f.record.per_task]
        timed = [f.record.per_task[task] for f in runs]
        scores = [score for score in (_accuracy(f.results.get(task, {})) for f in runs) if score[1] is not None]
        spread = config.speedup_spread(task)
        rows.append(LeaderboardRow(
            target=key.target, hardware=key.hardware or None, engine=key.runtime.engine.split(" ")[0] or "specdec",
            draft=key.draft, task=task, gamma=key.num_draft_tokens,
            dynamic_gamma=key.dynamic_gamma, runtime=str(key.runtime), speedup=config.speedup(task),
            speedup_min=spread[0] if spread else None, speedup_max=spread[1] if spread else None, runs=len(runs),
            tar=stats.tar, accuracy=statistics.median(v for _, v in scores) if scores else None,
            documents=stats.generations or None,
            tokens_per_second=_median([s.tokens_per_second for s in timed]),
            baseline_tokens_per_second=_median([s.baseline_tokens_per_second for s in timed]),
            draft_ms_per_token=_median([s.draft_ms_per_token for s in timed]),
            verify_ms_per_step=_median([s.verify_ms_per_step for s in timed]),
            acceptance_by_position=positions(stats.acceptance_rate_per_position),
            tar_p50=(stats.request_tar_percentiles or {}).get("p50"), accepted_per_step=stats.accepted_per_step,
            acceptance_rate=stats.acceptance_rate, draft_parameters_m=record.draft_parameters_m or None,
            draft_layers=record.draft_layers or None, date=_day(latest.date), lm_eval=record.versions.get("lm-eval"),
            specdraft_eval=record.versions.get("specdraft-eval"), metric=scores[0][0] if scores else None,
            acceptance_rate_per_position=stats.acceptance_rate_per_position,
            conditional_acceptance=positions(stats.conditional_acceptance_per_position),
            mean_acceptance_length=stats.mean_acceptance_length, accept_length=stats.accept_length,
            mean_accepted_tokens=stats.mean_accepted_tokens, generated_tokens=stats.generated_tokens,
            baseline_tokens=stats.baseline_tokens or None, overshoot_tokens=stats.overshoot_tokens,
            end_to_end_speedup=_median([s.end_to_end_speedup for s in timed]),
        ))
    return rows


LM_SUFFIX = "_lm"
"""A task's log-likelihood variant (``tasks/*_lm.yaml``): bits per byte of the task's reference answers."""


def lm_scores(files: list[ResultsFile]) -> dict[tuple[str, str], float]:
    """Bits per byte by (model, task) from the scoring runs (``*_lm`` tasks; the model is the run's draft with
    ``score=draft``, else its target), the median over runs; keyed by the generative task's name."""
    found: dict[tuple[str, str], list[float]] = {}
    for file in files:
        model = file.record.draft if file.record.score == "draft" else file.record.target
        for task, metrics in file.results.items():
            value = metrics.get("bits_per_byte,none") if isinstance(metrics, dict) else None
            if task.endswith(LM_SUFFIX) and isinstance(value, (int, float)):
                found.setdefault((model, task.removesuffix(LM_SUFFIX)), []).append(float(value))
    return {key: statistics.median(values) for key, values in found.items()}

def collect(paths: list[Path]) -> list[LeaderboardRow]:
    """The leaderboard's rows: one per configuration (:class:`~specdraft_eval.results.record.RunKey`) and task,
    its runs merged. A run without baseline timing whose target is some row's draft measured that draft's own accuracy:
    it fills those rows' ``draft_accuracy`` instead of being a row itself; a scoring run (``*_lm`` tasks) fills
    ``draft_bits_per_byte`` (and ``target_bits_per_byte``, for the figures)."""
    files = scan_results(paths, scoring=True)
    rows = [row for config in configurations([f for f in files if f.record.per_task])
            for row in rows_from_configuration(config)]
    if not rows:
        raise SpecdecError("no specdec results found: run lm_eval --model specdec ... --output_path DIR first")
    drafts = {row.draft for row in rows}
    as_draft = [row for row in rows if row.target in drafts and row.speedup is None]
    own = {(row.target, row.task): row.accuracy for row in as_draft}
    scores = lm_scores(files)
    rows = [replace(row, draft_accuracy=own.get((row.draft, row.task)),
                    draft_bits_per_byte=scores.get((row.draft, row.task)),
                    target_bits_per_byte=scores.get((row.target, row.task)))
            for row in ([row for row in rows if row not in as_draft] or rows)]
    return sorted(rows, key=lambda r: (r.target, r.hardware or "", r.task, -(r.speedup or 0),
                                       -(r.tokens_per_second or 0), r.draft))


def read_sweeps(paths: list[Path]) -> list[Calibration]:
    """Latency sweeps (``sweep*.json``: ``zoo profile --sweep --out`` or ``scripts/gpu_check.py``'s part 1) under
    the results folders, by hardware name."""
    found = [read_calibration_file(file) for root in map(Path, paths) if root.is_dir()
             for file in sorted(root.rglob("sweep*.json"))]
    return sorted(found, key=lambda sweep: sweep.hardware)
