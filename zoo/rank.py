"""``zoo rank``: rank drafts for a target and a GPU by the analytical model's predicted tokens/s.

Latency comes from a profile of this machine (``--gpu this``) or a roofline estimate for a named GPU;
TAR from results files for the same target, task, draft and γ, or measured on N prompts of the task.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from specdraft_eval.analytical import predicted_tokens_per_second
from specdraft_eval.engine import speculative_generate
from specdraft_eval.stats import GenerationStats


@dataclass
class Candidate:
    """One draft's inputs to the model and where each came from."""

    draft: str
    t_draft_ms: float
    draft_source: str
    parameters_m: float | None = None
    kv_bytes_per_token: int = 0
    tar: dict[int, float] = field(default_factory=dict)
    tar_source: str = "missing"
    measured_tps: dict[int, float] = field(default_factory=dict)
    t_verify_ms: dict[int, float] = field(default_factory=dict)  # measured in this draft's own runs, per γ


def tar_from_results(paths: list[Path], target: str, task: str, draft: str) -> tuple[dict[int, float], str]:
    """TAR per γ for ``draft`` from lm-eval results files (``config.specdec``) under ``paths``."""
    found: dict[int, float] = {}
    sources = []
    for root in paths:
        for file in sorted(Path(root).rglob("results_*.json")) if Path(root).exists() else []:
            try:
                block = json.loads(file.read_text())["config"]["specdec"]
            except (KeyError, ValueError, TypeError):
                continue
            figures = block.get("per_task", {}).get(task)
            if block.get("target") == target and block.get("draft") == draft and figures and figures.get("tar") is not None:
                found[int(block["num_draft_tokens"])] = figures["tar"]
                sources.append(file.name)
    return found, (f"results ({len(sources)} files)" if found else "missing")


def measure(target, drafter, prompts: list[list[int]], gammas: list[int], max_new_tokens: int) -> dict[int, GenerationStats]:
    """Run the engine on ``prompts`` at each γ; the stats give TAR and measured tokens/s."""
    out = {}
    for gamma in gammas:
        total = GenerationStats()
        for ids in prompts:
            _, stats = speculative_generate(target, drafter, ids, max_new_tokens, num_draft_tokens=gamma)
            total = total + stats
        out[gamma] = total
    return out


def rank(candidates: list[Candidate], t_target_ms: float, t_verify_ms: dict[int, float]) -> list[dict]:
    """Rows sorted by predicted tokens/s at each draft's best γ (drafts without TAR last)."""
    rows = []
    for c in candidates:
        best = None
        verify = {**t_verify_ms, **c.t_verify_ms}
        for gamma, tar in c.tar.items():
            if gamma not in verify:
                continue
            tps = predicted_tokens_per_second(tar, gamma, c.t_draft_ms / 1000, verify[gamma] / 1000)
            if best is None or tps > best[1]:
                best = (gamma, tps)
        rows.append(
            {
                "draft": c.draft,
                "predicted_tokens_per_second": best[1] if best else None,
                "speedup": best[1] * t_target_ms / 1000 if best else None,
                "best_gamma": best[0] if best else None,
                "tar": c.tar.get(best[0]) if best else None,
                "measured_tokens_per_second": c.measured_tps.get(best[0]) if best else None,
                "draft_ms_per_token": c.t_draft_ms,
                "parameters_m": c.parameters_m,
                "kv_bytes_per_token": c.kv_bytes_per_token,
                "tar_source": c.tar_source,
                "latency_source": c.draft_source,
            }
        )
    rows.sort(key=lambda r: -(r["predicted_tokens_per_second"] or -1))
    return rows
