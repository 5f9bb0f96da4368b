"""``draft=auto``: the draft that measured fastest for a target, from results files (the one record).

Candidates are the configurations (:class:`~specdraft_eval.results.record.RunKey`) with baseline timing for the
target whose drafts load here (built-in kinds, or directories and files that exist), from this machine's results
store (:mod:`specdraft_eval.results.store`: the user's own ``lm_eval`` runs, ``zoo tune`` and ``zoo bench``) and the
published results. The score is the measured speedup on the task asked for, else the geometric mean over the tasks
measured (a task nobody measured: the geometric mean, the reason saying so). Evidence, not source, ranks: the user's
own measurement of a configuration (this machine's store) replaces the published figures of that configuration,
then configurations measured on the hardware ``auto`` runs on come first (a speedup on one machine says little about
another's), with the runtime it runs (dtype, kernels, attention, static cache, compiled steps) and at its batch
size, then those measured by today's specdraft-eval, then the score. The reason says which source the winner came
from and when it was measured elsewhere or otherwise. Without a configuration that beats plain decoding the answer
is prompt lookup with dynamic γ, and :attr:`Recommendation.tune` says whether nothing was measured for this target
(on the task asked for), hardware and batch size (``draft=auto`` may then tune inside the run:
:mod:`specdraft_eval.integration.auto`).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import InvalidVersion, Version

from specdraft_eval import published
from specdraft_eval.drafts.spec import AUTO, DraftSpec, draft_kinds, replaced
from specdraft_eval.engine.params import RunSettings
from specdraft_eval.errors import SpecdecError
from specdraft_eval.files import RecordWarning
from specdraft_eval.measure.environment import hardware, versions
from specdraft_eval.models.targets import ALIASES, Target
from specdraft_eval.results import store
from specdraft_eval.results.record import Configuration, RunKey, Runtime, configurations, scan_results

FALLBACK_DRAFT, FALLBACK_GAMMA = "prompt-lookup", 4  # with dynamic γ


@dataclass
class ScoredConfiguration:
    """One measured configuration for the target: its speedup per task (the median over results files, with
    min and max), TAR per task, its score and whether its draft loads here."""

    key: RunKey
    speedup: dict[str, float]
    speedup_spread: dict[str, tuple[float, float]]
    tar: dict[str, float]
    files: list[str]
    loadable: bool
    own: bool = False  # measured by this machine's user (from the results store)
    code_version: str | None = None  # the newest specdraft-eval that measured it
    score: float | None = None

    @property
    def source(self) -> str:
        return "this machine's results" if self.own else "published"


@dataclass
class Recommendation:
    """What ``auto`` resolves to for ``target`` (and ``task``), why, and every candidate scored."""

    target: str
    task: str | None
    draft: str
    num_draft_tokens: int
    dynamic_gamma: bool
    reason: str
    runtime: Runtime | None = None  # the measured runtime of the choice (None: the fallback, measured nowhere)
    candidates: list[ScoredConfiguration] = field(default_factory=list)
    tune: bool = False  # nothing measured for this target (and task), hardware and batch size: auto may tune
    on_task: bool = False  # the choice was measured on the task asked for (else: across the tasks measured)

    def table_rows(self) -> list[dict]:
        """The candidates as the text table shows them."""
        return [{"draft": c.key.draft, "γ": c.key.num_draft_tokens, "dynamic γ": c.key.dynamic_gamma,
                 "source": c.source, "code": c.code_version, "batch": c.key.batch_size,
                 "hardware": c.key.hardware, "runtime": str(c.key.runtime),
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


def _version(text: str | None) -> Version:
    try:
        return Version(text or "0")
    except InvalidVersion:
        return Version("0")


def _candidate(config: Configuration, own: bool) -> ScoredConfiguration:
    tasks = [t for t in sorted(config.per_task) if config.speedup(t)]
    newest = max((f.record.code_version for f in config.files), key=_version, default=None)
    return ScoredConfiguration(config.key, {t: config.speedup(t) for t in tasks},
                               {t: config.speedup_spread(t) for t in tasks}, {t: config.per_task[t].tar for t in tasks},
                               [str(f.path) for f in config.files], localised(config.key.draft) is not None, own,
                               newest)


def _usable(paths: list[Path]) -> list:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RecordWarning)  # zoo leaderboard reports unusable files; here they are skipped
        found = scan_results([p for p in paths if Path(p).exists()])
    return [f for f in found if not replaced(f.record.draft, f.record.kind_versions)]  # a replaced kind's figures


def candidates(target: str, results: list[Path], own: list[Path] = ()) -> list[ScoredConfiguration]:
    """Per configuration measured for ``target`` with baseline timing: the user's own results (``own``: this
    machine's store) and the published ``results``, where the user's measurement of a configuration replaces the
    published figures of the same configuration (same hardware, runtime and batch size: one :class:`RunKey`)."""
    mine = [_candidate(config, True) for config in configurations(_usable(own), target)]
    measured = {c.key for c in mine}
    published_only = [_candidate(config, False) for config in configurations(_usable(results), target)
                      if config.key not in measured]
    return [c for c in mine + published_only if c.speedup]


def _score(candidate: ScoredConfiguration, task: str | None) -> float | None:
    """The speedup on ``task``, or (None) the geometric mean over the tasks measured."""
    speedups = candidate.speedup
    if task is not None:
        return speedups.get(task)
    return math.exp(sum(math.log(s) for s in speedups.values()) / len(speedups))


def recommend(target: str, task: str | None = None, results: list[Path] | None = None,
              hardware: str | None = None, runtime: Runtime | None = None, batch_size: int = 1,
              own: list[Path] | None = None, engine: str = "specdec") -> Recommendation:
    """The fastest measured configuration for ``target`` that loads here, in the order the module docstring gives:
    ``own`` results (default: this machine's store, :func:`specdraft_eval.results.store.paths`) measured on
    ``hardware`` (this machine's name, :func:`specdraft_eval.measure.environment.hardware`), today's code, then
    ``hardware``, ``runtime`` and ``batch_size``. ``results`` default: the published results
    (:mod:`specdraft_eval.published`). Only configurations measured in ``engine`` count (``vllm``: ``engine=vllm``'s):
    one engine's speed says nothing of another's."""
    own = store.paths(target) if own is None else own
    scored = [c for c in candidates(target, results if results is not None else [published.results()], own)
              if c.key.runtime.engine_name == engine]
    today = _version(versions().get("specdraft-eval"))
    on_task = task is not None and any(task in c.speedup for c in scored if c.loadable)
    for candidate in scored:
        candidate.score = _score(candidate, task if on_task else None)
    scored.sort(key=lambda c: (hardware is not None and c.key.hardware != hardware,
                               runtime is not None and c.key.runtime != runtime, c.key.batch_size != batch_size,
                               _version(c.code_version) < today, -(c.score or 0)))
    here = [c for c in scored if c.loadable and c.key.hardware == hardware and c.key.batch_size == batch_size
            and (task is None or task in c.speedup)]
    tune = hardware is not None and not here
    best = next((c for c in scored if c.loadable and c.score and c.score > 1.0), None)
    where = (f"on {task}" if on_task else "geometric mean over the tasks measured"
             + (f" ({task}: measured by none)" if task else ""))
    if best is None:
        reason = (f"no configuration measured in {engine} for {target} that loads here beats plain decoding "
                  f"({where}); prompt lookup needs no weights"
                  + (" and dynamic γ backs off where it does not pay" if engine == "specdec" else ""))
        return Recommendation(target, task, FALLBACK_DRAFT, FALLBACK_GAMMA, engine == "specdec", reason, None, scored,
                              tune)
    key = best.key
    elsewhere = hardware is not None and key.hardware != hardware
    otherwise = runtime is not None and key.runtime != runtime
    older = _version(best.code_version) < today
    reason = (f"fastest measured: {best.score:.2f}x plain decoding ({where}) on {key.hardware}, from {best.source}"
              + (f", not this machine ({hardware}): no measurement from here" if elsewhere else "")
              + f", runtime {key.runtime}"
              + (f", not the one asked for ({runtime}): none measured with it" if otherwise else "")
              + (f", batch size {key.batch_size}, not {batch_size}" if key.batch_size != batch_size else "")
              + (f", by specdraft-eval {best.code_version} (older than this one)" if older else "")
              + f", from {len(best.files)} results file(s)")
    return Recommendation(target, task, localised(key.draft), key.num_draft_tokens, key.dynamic_gamma,
                          reason, key.runtime, scored, tune, on_task)


def resolve_auto(target: Target, runtime: Runtime | None = None, batch_size: int = 1,
                 task: str | None = None) -> Recommendation:
    """What ``draft=auto`` means for ``target`` (on ``task``, when given: the configuration measured best on it,
    else the best across the tasks measured): the recommendation for its name on the hardware it runs on, with the
    ``runtime`` it runs (default: eager, its loaded dtype, kernels and attention) at ``batch_size``. The one rule:
    ``lm_eval --model specdec`` applies its γ and dynamic γ as well, per task (and tunes where
    :attr:`Recommendation.tune`), ``zoo`` commands its draft."""
    if target.name is None:
        raise SpecdecError("draft=auto needs a target loaded by name (load_target(NAME)): its name picks the "
                           "measured results; load it so, or name a draft")
    return recommend(target.name, task, hardware=hardware(target.model.device),
                     runtime=runtime or RunSettings().runtime(target.model), batch_size=batch_size)


def resolve_draft(draft: str, target: Target) -> str:
    """``draft``, or the draft ``auto`` resolves to for ``target`` (:func:`resolve_auto`)."""
    return resolve_auto(target).draft if DraftSpec.parse(draft).kind == AUTO else draft
