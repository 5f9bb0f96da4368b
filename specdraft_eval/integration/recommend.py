"""``draft=auto``: the draft that measured fastest for a target, from results files (the one record).

Candidates are the (draft, γ, dynamic γ) configurations with baseline timing in the results files for the
target whose drafts load here (built-in kinds, or directories and files that exist). The score is the
measured speedup on the task asked for, else the geometric mean over the tasks measured; configurations
measured on the hardware ``auto`` runs on come first (a speedup on one machine says little about another's),
and the reason says when the winner was measured elsewhere. Without a
configuration that beats plain decoding the answer is prompt lookup with dynamic γ: it needs no weights,
and dynamic γ falls back to autoregressive steps where lookup finds nothing.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from specdraft_eval import published
from specdraft_eval.drafts.spec import AUTO, DraftSpec, draft_kinds
from specdraft_eval.errors import SpecdecError
from specdraft_eval.files import RecordWarning
from specdraft_eval.measure.environment import hardware
from specdraft_eval.measure.record import Configuration, configurations, scan_results
from specdraft_eval.models.targets import ALIASES, Target

FALLBACK_DRAFT, FALLBACK_GAMMA = "prompt-lookup", 4  # with dynamic γ


@dataclass
class ScoredConfiguration:
    """One measured configuration for the target: its speedup per task (the median over results files, with
    min and max), TAR per task, its score and whether its draft loads here."""

    draft: str
    num_draft_tokens: int
    dynamic_gamma: bool
    hardware: str
    speedup: dict[str, float]
    speedup_spread: dict[str, tuple[float, float]]
    tar: dict[str, float]
    files: list[str]
    loadable: bool
    score: float | None = None


@dataclass
class Recommendation:
    """What ``auto`` resolves to for ``target`` (and ``task``), why, and every candidate scored."""

    target: str
    task: str | None
    draft: str
    num_draft_tokens: int
    dynamic_gamma: bool
    reason: str
    candidates: list[ScoredConfiguration] = field(default_factory=list)

    def table_rows(self) -> list[dict]:
        """The candidates as the text table shows them."""
        return [{"draft": c.draft, "γ": c.num_draft_tokens, "dynamic γ": c.dynamic_gamma,
                 "speedup by task": ", ".join(f"{t} {v:.2f}x" for t, v in sorted(c.speedup.items())),
                 "score": c.score, "loads here": c.loadable} for c in self.candidates]


def localised(draft: str) -> str | None:
    """``draft`` with relative paths that exist only among the published files made absolute; None if a part
    is missing (neither a kind without files, an alias, nor an existing path from here or the published base)."""
    kinds = draft_kinds()
    spec = DraftSpec.parse(draft, kinds)
    if spec.kind == AUTO:
        return None
    parts = []
    for part in spec.leaves():
        path = part.path(kinds)
        if path is None or part.arg in ALIASES or path.exists():
            parts.append(part)
        elif not path.is_absolute() and (published.base() / path).exists():
            parts.append(part.with_path(published.base() / path))
        else:
            return None
    return DraftSpec.composite(parts).name


def _candidate(config: Configuration) -> ScoredConfiguration:
    tasks = [t for t in sorted(config.per_task) if config.speedup(t)]
    return ScoredConfiguration(config.draft, config.num_draft_tokens, config.dynamic_gamma, config.hardware,
                     {t: config.speedup(t) for t in tasks}, {t: config.speedup_spread(t) for t in tasks},
                     {t: config.per_task[t].tar for t in tasks}, [str(f.path) for f in config.files],
                     localised(config.draft) is not None)


def candidates(target: str, results: list[Path]) -> list[ScoredConfiguration]:
    """Per configuration measured for ``target`` with baseline timing, across every results file."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RecordWarning)  # zoo leaderboard reports unusable files; here they are skipped
        found = scan_results([p for p in results if Path(p).exists()])
    return [c for c in map(_candidate, configurations(found, target)) if c.speedup]


def _score(candidate: ScoredConfiguration, task: str | None) -> float | None:
    speedups = candidate.speedup
    if task is not None:
        return speedups.get(task)
    return math.exp(sum(math.log(s) for s in speedups.values()) / len(speedups))


def recommend(target: str, task: str | None = None, results: list[Path] | None = None,
              hardware: str | None = None) -> Recommendation:
    """The fastest measured configuration for ``target`` that loads here, those measured on ``hardware`` (this
    machine's name, :func:`specdraft_eval.measure.environment.hardware`) first (see the module docstring). ``results``
    default: the published results (:mod:`specdraft_eval.published`)."""
    scored = candidates(target, results if results is not None else [published.results()])
    for candidate in scored:
        candidate.score = _score(candidate, task)
    scored.sort(key=lambda c: (hardware is not None and c.hardware != hardware, -(c.score or 0)))
    best = next((c for c in scored if c.loadable and c.score and c.score > 1.0), None)
    where = f"on {task}" if task else "geometric mean over the tasks measured"
    if best is None:
        reason = (f"no measured configuration for {target} that loads here beats plain decoding ({where}); "
                  "prompt lookup needs no weights and dynamic γ backs off where it does not pay")
        return Recommendation(target, task, FALLBACK_DRAFT, FALLBACK_GAMMA, True, reason, scored)
    elsewhere = hardware is not None and best.hardware != hardware
    reason = (f"fastest measured: {best.score:.2f}x plain decoding ({where}) on {best.hardware}"
              + (f", not this machine ({hardware}): no measurement from here" if elsewhere else "")
              + f", from {len(best.files)} results file(s)")
    return Recommendation(target, task, localised(best.draft), best.num_draft_tokens, best.dynamic_gamma,
                          reason, scored)


def resolve_auto(target: Target) -> Recommendation:
    """What ``draft=auto`` means for ``target``: the recommendation for its name on the hardware it runs on (the
    one rule: ``lm_eval --model specdec`` applies its γ and dynamic γ as well, ``zoo`` commands its draft)."""
    if target.name is None:
        raise SpecdecError("draft=auto needs a target loaded by name (load_target(NAME)): its name picks the "
                           "measured results; load it so, or name a draft")
    return recommend(target.name, hardware=hardware(target.model.device))


def resolve_draft(draft: str, target: Target) -> str:
    """``draft``, or the draft ``auto`` resolves to for ``target`` (:func:`resolve_auto`)."""
    return resolve_auto(target).draft if DraftSpec.parse(draft).kind == AUTO else draft
