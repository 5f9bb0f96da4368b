"""What the rows show about the founding paper's finding: each draft's own language-modelling quality against
its TAR, as Spearman's rank correlation per task."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from zoo.report.leaderboard.rows import LeaderboardRow


def rank_correlation(xs: list[float], ys: list[float]) -> float | None:
    """Spearman's ρ (ties share their mean rank); None for fewer than 3 points or a constant side."""
    def ranks(values: list[float]) -> list[float]:
        order = sorted(range(len(values)), key=values.__getitem__)
        out = [0.0] * len(values)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
                j += 1
            for k in range(i, j + 1):
                out[order[k]] = (i + j) / 2
            i = j + 1
        return out

    if len(xs) < 3 or len(set(xs)) < 2 or len(set(ys)) < 2:
        return None
    return statistics.correlation(ranks(xs), ranks(ys))


@dataclass(frozen=True)
class LmFinding:
    """TAR against the draft models' own language-modelling quality on one task (the founding paper's Figure 2)."""

    task: str
    points: list[LeaderboardRow]  # the rows with a draft bits/byte and a TAR
    tar_rho: float | None  # Spearman ρ(bits/byte, TAR): -1 when a better LM (fewer bits) always had a higher TAR
    first_rho: float | None  # the same against acceptance at the first draft position
    target_bits_per_byte: float | None


def lm_findings(rows: list[LeaderboardRow]) -> list[LmFinding]:
    """Per task, the model drafts whose own bits per byte were scored, and how their TAR ranks against it: one point
    per draft, its fixed-γ row where it has one (dynamic γ's TAR counts the steps it backed off to plain decoding)."""
    findings = []
    for task in sorted({r.task for r in rows}):
        chosen: dict[str, LeaderboardRow] = {}
        for row in sorted((r for r in rows if r.task == task and r.draft_bits_per_byte is not None
                           and r.tar is not None), key=lambda r: (not r.dynamic_gamma, -r.gamma)):
            chosen[row.draft] = row  # the last wins: fixed γ over dynamic, then the smallest γ
        points = sorted(chosen.values(), key=lambda r: r.draft_bits_per_byte)
        if not points:
            continue
        bits = [r.draft_bits_per_byte for r in points]
        first = [(r.acceptance_rate_per_position or [0.0])[0] for r in points]
        findings.append(LmFinding(task, points, rank_correlation(bits, [r.tar for r in points]),
                                  rank_correlation(bits, first), points[0].target_bits_per_byte))
    return findings
