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
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from specdraft_eval.drafts.composite import SEPARATOR
from specdraft_eval.record import RecordWarning, scan_results

REPO = Path(__file__).resolve().parents[1]
DEFAULT_RESULTS = [REPO / "leaderboard" / "results"]
FALLBACK = {"draft": "prompt-lookup", "num_draft_tokens": 4, "dynamic_gamma": True}


@dataclass
class Recommendation:
    """What ``auto`` resolves to for ``target`` (and ``task``), why, and every candidate scored."""

    target: str
    task: str | None
    draft: str
    num_draft_tokens: int
    dynamic_gamma: bool
    reason: str
    candidates: list[dict] = field(default_factory=list)


def _part_path(part: str, kinds) -> Path | None:
    """The file or folder a draft part needs: a model path, or the directory of a kind that takes one
    (``path_marker``, e.g. ``ngram:DIR``); None for kinds without files."""
    kind, _, arg = part.partition(":")
    if kind in kinds:
        return Path(os.path.expanduser(arg)) if getattr(kinds[kind], "path_marker", None) else None
    return Path(os.path.expanduser(part))


def _localised(draft: str) -> str | None:
    """``draft`` with relative paths that exist only under the repository made absolute; None if a part
    is missing (neither a built-in kind, an alias, nor an existing path from here or from the repository)."""
    from specdraft_eval.drafts import draft_kinds
    from specdraft_eval.targets import ALIASES

    kinds, parts = draft_kinds(), []
    for part in draft.split(SEPARATOR):
        path = _part_path(part, kinds)
        if path is None or part in ALIASES or path.exists():
            parts.append(part)
        elif not path.is_absolute() and (REPO / path).exists():
            parts.append(part.replace(str(path), str(REPO / path), 1))
        else:
            return None
    return SEPARATOR.join(parts)


def candidates(target: str, results: list[Path]) -> list[dict]:
    """Per configuration measured for ``target`` with baseline timing: speedup and TAR per task."""
    merged: dict[tuple, dict] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RecordWarning)  # zoo leaderboard reports unusable files; here they are skipped
        found = scan_results([p for p in results if Path(p).exists()])
    for file in found:
        record = file.record
        if record.target != target:
            continue
        key = (record.draft, record.num_draft_tokens, record.dynamic_gamma, record.hardware)
        entry = merged.setdefault(key, {"draft": record.draft, "num_draft_tokens": record.num_draft_tokens,
                                        "dynamic_gamma": record.dynamic_gamma, "hardware": record.hardware,
                                        "speedup": {}, "tar": {}, "files": []})
        entry["files"].append(str(file.path))
        for task, stats in record.per_task.items():
            summary = stats.summary()
            if summary["speedup"]:
                entry["speedup"][task], entry["tar"][task] = summary["speedup"], summary["tar"]
    return [dict(c, loadable=_localised(c["draft"]) is not None) for c in merged.values() if c["speedup"]]


def _score(candidate: dict, task: str | None) -> float | None:
    speedups = candidate["speedup"]
    if task is not None:
        return speedups.get(task)
    return math.exp(sum(math.log(s) for s in speedups.values()) / len(speedups))


def recommend(target: str, task: str | None = None, results: list[Path] | None = None,
              hardware: str | None = None) -> Recommendation:
    """The fastest measured configuration for ``target`` that loads here, those measured on ``hardware`` (this
    machine's name, :func:`specdraft_eval.record.hardware`) first (see the module docstring)."""
    scored = []
    for candidate in candidates(target, results if results is not None else DEFAULT_RESULTS):
        candidate["score"] = _score(candidate, task)
        scored.append(candidate)
    scored.sort(key=lambda c: (hardware is not None and c["hardware"] != hardware, -(c["score"] or 0)))
    best = next((c for c in scored if c["loadable"] and c["score"] and c["score"] > 1.0), None)
    where = f"on {task}" if task else "geometric mean over the tasks measured"
    if best is None:
        reason = (f"no measured configuration for {target} that loads here beats plain decoding ({where}); "
                  "prompt lookup needs no weights and dynamic γ backs off where it does not pay")
        return Recommendation(target, task, reason=reason, candidates=scored, **FALLBACK)
    elsewhere = hardware is not None and best["hardware"] != hardware
    reason = (f"fastest measured: {best['score']:.2f}x plain decoding ({where}) on {best['hardware']}"
              + (f", not this machine ({hardware}): no measurement from here" if elsewhere else "")
              + f", from {len(best['files'])} results file(s)")
    return Recommendation(target, task, _localised(best["draft"]), best["num_draft_tokens"], best["dynamic_gamma"],
                          reason, scored)
