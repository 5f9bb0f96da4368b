"""``zoo rank``: rank drafts for a target and a GPU by the analytical model's predicted tokens/s.

Latency comes from a profile of this machine (``--gpu this``) or a roofline estimate for a named GPU;
TAR from results files for the same target, task and draft (merged over files; smaller γ estimated from the
per-position counts, :meth:`GenerationStats.tar_at`), or measured on N prompts of the task.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specdraft_eval.measure.analytical import predicted_tokens_per_second
from specdraft_eval.measure.record import ResultsFile
from specdraft_eval.measure.stats import GenerationStats

DEFAULT_TASK = "specdec_humaneval"
DEFAULT_MAX_NEW_TOKENS = 64
MEASURE_GAMMAS = (1, 2, 4, 8)
"""γ values ranked when no ``--gamma`` is given and no results say which γ ran."""


@dataclass
class Candidate:
    """One draft's inputs to the model and where each came from."""

    draft: str
    t_draft_ms: float
    draft_source: str
    parameters_m: float | None = None
    kv_bytes_per_token: int = 0
    tar: dict[int, float] = field(default_factory=dict)
    tar_source: dict[int, str] = field(default_factory=dict)  # per γ: results, estimate from a larger γ, measured
    measured_tps: dict[int, float] = field(default_factory=dict)  # shown beside the prediction, never used by it
    missing: str = "missing"  # what to run when there is no TAR


def tar_from_results(files: list[ResultsFile], target: str, task: str, draft: str) -> tuple[dict[int, float], dict[int, str]]:
    """TAR per γ for ``draft`` on ``task`` from fixed-γ records: records at the same γ merged (counts summed),
    and every smaller γ not run estimated from the nearest larger γ's acceptance histogram."""
    merged: dict[int, GenerationStats] = {}
    hardware: dict[int, set[str]] = {}
    for entry in files:
        record = entry.record
        if record.target != target or record.draft != draft or record.dynamic_gamma or task not in record.per_task:
            continue
        gamma = record.num_draft_tokens
        merged[gamma] = merged.get(gamma, GenerationStats()) + record.per_task[task]
        hardware.setdefault(gamma, set()).add(record.hardware or "unknown hardware")
    tar, source = {}, {}
    for gamma, stats in sorted(merged.items()):
        if stats.steps:
            tar[gamma] = stats.tar
            source[gamma] = f"results γ={gamma} ({stats.generations} requests; {', '.join(sorted(hardware[gamma]))})"
    for gamma, stats in sorted(merged.items()):  # smallest first: estimates come from the nearest larger γ
        for smaller in range(1, gamma):
            estimate = stats.tar_at(smaller)
            if smaller not in tar and estimate is not None:
                tar[smaller], source[smaller] = estimate, f"estimate from γ={gamma} results"
    return tar, source


def measure(target, drafter, prompts: list[list[int]], gammas: list[int], max_new_tokens: int) -> dict[int, GenerationStats]:
    """Run the engine on ``prompts`` at each γ; the stats give TAR and measured tokens/s."""
    from specdraft_eval.engine.loop import speculative_generate

    out = {}
    for gamma in gammas:
        total = GenerationStats()
        for ids in prompts:
            _, stats = speculative_generate(target, drafter, ids, max_new_tokens, num_draft_tokens=gamma)
            total = total + stats
        out[gamma] = total
    return out


def missing_tar_hint(target: str, task: str, draft: str) -> str:
    """Where a draft's missing TAR would come from."""
    return (f"missing: `zoo rank --measure N` or `lm_eval --model specdec --model_args pretrained={target},"
            f"draft={draft}` on {task}")


def table_rows(rows: list[dict]) -> list[dict]:
    """Ranked rows as the text table shows them (every γ's prediction on one line)."""
    keys = ["draft", "best_gamma", "predicted_tokens_per_second", "measured_tokens_per_second", "speedup", "tar",
            "tar_source", "draft_ms_per_token", "kv_bytes_per_token", "latency_source"]
    return [{**{k: r[k] for k in keys[:3]},
             "tokens/s by γ": "  ".join(f"{g}: {tps:.3g}" for g, tps in r["predicted_by_gamma"].items()) or None,
             **{k: r[k] for k in keys[3:]}} for r in rows]


def rank(candidates: list[Candidate], t_target_ms: float, t_verify_ms: dict[int, float],
         gammas: list[int] | None = None) -> list[dict]:
    """Rows sorted by predicted tokens/s at each draft's best γ (drafts without TAR last).

    Every γ with a TAR (restricted to ``gammas`` when given) and a verification time is predicted.
    """
    rows = []
    for c in candidates:
        predicted = {
            gamma: predicted_tokens_per_second(tar, gamma, c.t_draft_ms / 1000, t_verify_ms[gamma] / 1000)
            for gamma, tar in sorted(c.tar.items())
            if gamma in t_verify_ms and (gammas is None or gamma in gammas)
        }
        best = max(predicted, key=predicted.get) if predicted else None
        rows.append(
            {
                "draft": c.draft,
                "best_gamma": best,
                "predicted_tokens_per_second": predicted[best] if best else None,
                "predicted_by_gamma": predicted,
                "speedup": predicted[best] * t_target_ms / 1000 if best else None,
                "tar": c.tar.get(best) if best else None,
                "tar_source": c.tar_source[best] if best else c.missing,
                "measured_tokens_per_second": c.measured_tps.get(best) if best else None,
                "draft_ms_per_token": c.t_draft_ms,
                "target_ms_per_token": t_target_ms,
                "parameters_m": c.parameters_m,
                "kv_bytes_per_token": c.kv_bytes_per_token,
                "latency_source": c.draft_source,
            }
        )
    rows.sort(key=lambda r: -(r["predicted_tokens_per_second"] or -1))
    return rows
