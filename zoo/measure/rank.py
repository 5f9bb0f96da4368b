"""``zoo rank``: rank drafts for a target and a GPU by the analytical model's predicted tokens/s.

Latency comes from a profile of this machine (``--gpu this``) or a roofline estimate for a named GPU;
TAR from results files for the same target, task and draft (merged over files; smaller γ estimated from the
per-position counts, :meth:`GenerationStats.tar_at`), or measured on N prompts of the task.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from specdraft_eval.measure.analytical import break_even_tar, predicted_tokens_per_second
from specdraft_eval.measure.stats import GenerationStats
from specdraft_eval.results.record import ResultsFile
from zoo.measure.paper import Comparison

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
    tree_depth: int | None = None  # an EAGLE-2 tree's: one draft pass per depth, not per node

    def passes(self, gamma: int) -> int:
        """Draft forward passes per step at γ: a chain's γ, an EAGLE-2 tree's depth (one pass over each depth's
        frontier, charged as one token's)."""
        return min(gamma, self.tree_depth) if self.tree_depth else gamma


def tree_depth(draft: str) -> int | None:
    """The depth of the token tree ``draft`` grows one draft pass per depth (its first such part's, in a
    composite), None for a chain."""
    from specdraft_eval.drafts.spec import DraftSpec, draft_kinds

    kinds = draft_kinds()
    depths = (kinds[p.kind].tree_depth(p.value) for p in DraftSpec.parse(draft, kinds).leaves() if p.kind in kinds)
    return next((d for d in depths if d), None)


def tar_from_results(files: list[ResultsFile], target: str, task: str, draft: str,
                     own: frozenset[Path] = frozenset()) -> tuple[dict[int, float], dict[int, str]]:
    """TAR per γ for ``draft`` on ``task`` from fixed-γ records (only this machine's, ``own``, where it has any):
    records at the same γ merged (counts summed), and every smaller γ not run estimated from the nearest larger γ's
    acceptance histogram."""
    merged: dict[int, GenerationStats] = {}
    hardware: dict[int, set[str]] = {}
    matching = [entry for entry in files if entry.record.target == target and entry.record.draft == draft
                and not entry.record.dynamic_gamma and task in entry.record.per_task]
    mine = [entry for entry in matching if entry.path in own]
    for entry in mine or matching:
        record = entry.record
        gamma = record.num_draft_tokens
        merged[gamma] = merged.get(gamma, GenerationStats()) + record.per_task[task]
        hardware.setdefault(gamma, set()).add(record.hardware or "unknown hardware")
    tar, source = {}, {}
    for gamma, stats in sorted(merged.items()):
        if stats.steps:
            tar[gamma] = stats.tar
            whose = "this machine's results" if mine else "results"
            source[gamma] = f"{whose} γ={gamma} ({stats.generations} requests; {', '.join(sorted(hardware[gamma]))})"
    for gamma, stats in sorted(merged.items()):  # smallest first: estimates come from the nearest larger γ
        for smaller in range(1, gamma):
            estimate = stats.tar_at(smaller)
            if smaller not in tar and estimate is not None:
                tar[smaller], source[smaller] = estimate, f"estimate from γ={gamma} results"
    return tar, source


def measure(target, drafter, prompts: list[list[int]], gammas: list[int],
            max_new_tokens: int) -> dict[int, GenerationStats]:
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


@dataclass(frozen=True)
class RankOptions:
    """What ``zoo rank`` ranks and how: the GPU (``this``: measure here), the task whose TAR counts, prompts to
    measure TAR on (0: results only), the drafts (None: the defaults), γ values (None: what the results give),
    results folders (None: the published ones), tokens per measured request, the named GPU's runtime and the
    context at which KV-cache reads are counted."""

    gpu: str = "this"
    task: str = DEFAULT_TASK
    measure: int = 0
    drafts: list[str] | None = None
    gammas: list[int] | None = None
    results: list[Path] | None = None
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    runtime: str = "eager"
    context: int = 128
    gpus: int = 1


@dataclass(frozen=True)
class RankRow:
    """One draft's prediction at its best γ (and at every γ), with the sources of its inputs."""

    draft: str
    best_gamma: int | None
    predicted_tokens_per_second: float | None
    predicted_by_gamma: dict[int, float]
    speedup: float | None
    tar: float | None
    tar_source: str
    measured_tokens_per_second: float | None
    draft_ms_per_token: float
    parameters_m: float | None
    kv_bytes_per_token: int
    latency_source: str
    break_even_tar: dict[int, float] = field(default_factory=dict)  # per γ: the TAR for a speedup of 1


@dataclass(frozen=True)
class RankResult:
    """The ranking: the target's autoregressive latency, how far the latency model is from what was measured on
    that GPU (None where nothing was, or for this machine's own profile), the rows, best first, and the founding
    paper's published figures beside their predictions (its targets on a named GPU, :mod:`zoo.measure.paper`)."""

    target_ms_per_token: float
    latency_model_error: str | None
    rows: list[RankRow]
    published: list[Comparison] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"target_ms_per_token": self.target_ms_per_token, "latency_model_error": self.latency_model_error,
                "rows": [asdict(row) for row in self.rows], "published": [asdict(c) for c in self.published]}


def table_rows(result: RankResult, verbose: bool = False) -> list[dict]:
    """Ranked rows as the CLI's text table shows them: within 120 columns; ``verbose`` adds every γ's prediction,
    where each TAR and latency came from and the TAR each γ needs to break even, and drafts' whole paths (without
    it, folders are dropped: ``eagle:leaderboard/drafts/h`` shows as ``eagle:h``; ``--json`` has everything)."""
    rows = []
    for r in result.rows:
        row = {"draft": r.draft if verbose else re.sub(r"[^|:@]*/", "", r.draft), "γ": r.best_gamma,
               "pred tok/s": r.predicted_tokens_per_second,
               "tok/s here": r.measured_tokens_per_second, "speedup": r.speedup, "TAR": r.tar,
               "draft ms": r.draft_ms_per_token}
        if verbose:
            row |= {"tokens/s by γ": "  ".join(f"{g}: {tps:.3g}" for g, tps in r.predicted_by_gamma.items()) or None,
                    "tar_source": r.tar_source,
                    "break_even_tar": "  ".join(f"{g}: {t:.2f}" for g, t in r.break_even_tar.items()) or None,
                    "kv_bytes_per_token": r.kv_bytes_per_token, "latency_source": r.latency_source}
        rows.append(row)
    return rows


def rank(candidates: list[Candidate], t_target_ms: float, t_verify_ms: dict[int, float],
         gammas: list[int] | None = None, latency_model_error: str | None = None) -> RankResult:
    """Rows sorted by predicted tokens/s at each draft's best γ; drafts without TAR last, fastest draft first.

    Every γ with a TAR (restricted to ``gammas`` when given) and a verification time is predicted; a token tree of
    γ nodes is verified at width γ + 1 and drafted in :meth:`Candidate.passes` passes. Every row gives, at each γ
    with a verification time, the TAR the draft needs to break even.
    """
    rows = []
    for c in candidates:
        predicted = {
            gamma: predicted_tokens_per_second(tar, c.passes(gamma), c.t_draft_ms / 1000, t_verify_ms[gamma] / 1000)
            for gamma, tar in sorted(c.tar.items())
            if gamma in t_verify_ms and (gammas is None or gamma in gammas)
        }
        best = max(predicted, key=predicted.get) if predicted else None
        rows.append(RankRow(c.draft, best, predicted[best] if best else None, predicted,
                            predicted[best] * t_target_ms / 1000 if best else None, c.tar.get(best) if best else None,
                            c.tar_source[best] if best else c.missing, c.measured_tps.get(best) if best else None,
                            c.t_draft_ms, c.parameters_m, c.kv_bytes_per_token, c.draft_source,
                            {g: break_even_tar(c.passes(g), c.t_draft_ms, t_verify_ms[g], t_target_ms)
                             for g in sorted(t_verify_ms) if gammas is None or g in gammas}))
    rows.sort(key=lambda r: (-(r.predicted_tokens_per_second or -1), r.draft_ms_per_token))
    return RankResult(t_target_ms, latency_model_error, rows)
