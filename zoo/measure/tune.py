"""``zoo tune``: measure the contenders for a target on a task's tuning prompts, successive halving, winners stored.

The contenders are :func:`specdraft_eval.integration.autotune.candidate_set`'s that load here (every kind's file-free
candidates, the shipped drafts and ``--drafts``, composites of the best model-free draft with each model-based one),
each with dynamic γ. A round gives every survivor the same prompts (:func:`zoo.build.held_in.tuning_prompts`: documents
no draft was built from and the leaderboard does not measure; ``batch_size`` at a time, with the task's stop
strings) and decodes them once plainly too, interleaved, so each survivor's speedup is over the same output; the
better half goes on to a round of twice as many new prompts (the last round takes what is left), until one is left,
the prompts run out or the budget would (each round's time is estimated from the last). Every output must equal
plain decoding's.
The winner and the last round's other survivors go to this machine's results store
(:mod:`specdraft_eval.results.store`), where ``draft=auto`` reads them first.
``evaluate`` N then measures *every* contender on the task's first N documents (the leaderboard's), the exhaustive
check of the choice.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from specdraft_eval.drafts.spec import kind_versions
from specdraft_eval.engine.loop import autoregressive_generate_batch
from specdraft_eval.engine.params import DecodeParams, RunSettings, text_stop
from specdraft_eval.engine.session import Session
from specdraft_eval.errors import SpecdecError
from specdraft_eval.files import atomic_write
from specdraft_eval.integration.autotune import Contender, Halving, candidate_set, contenders, halving_schedule
from specdraft_eval.integration.offline_data import TASK_STOPS, task_prompts
from specdraft_eval.measure.environment import hardware
from specdraft_eval.measure.stats import GenerationStats
from specdraft_eval.models.targets import LoadSettings
from specdraft_eval.results import store
from specdraft_eval.results.record import SpecdecRecord
from zoo.build.held_in import tuning_prompts
from zoo.progress import Tick, no_progress
from zoo.report.plotting import png_bytes

MAX_NEW_TOKENS = 256  # the bundled tasks' max_gen_toks


@dataclass
class TuneRow:
    """One contender: how far it went, what it measured on the tuning prompts, and on the evaluation documents."""

    draft: str
    num_draft_tokens: int
    rounds: int
    prompts: int
    tar: float | None
    speedup: float | None
    evaluated_speedup: float | None = None
    chosen: bool = False


@dataclass
class TuneResult:
    """``zoo tune``'s report: a row per contender (best first), the choice, and where it was written."""

    target: str
    task: str
    hardware: str
    batch_size: int
    budget_minutes: float
    seconds: float
    rows: list[TuneRow] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    stored: list[str] = field(default_factory=list)
    evaluation_documents: int = 0
    evaluation_seconds: float = 0.0
    plot: str | None = None

    @property
    def chosen(self) -> TuneRow:
        return next(r for r in self.rows if r.chosen)

    def to_json(self) -> dict:
        return {**asdict(self), "chosen": asdict(self.chosen)}


@dataclass
class _Prompts:
    """Token ids of the prompts and plain decoding's outputs of them (computed as rounds reach them)."""

    ids: list[list[int]]
    expected: dict[int, list[int]] = field(default_factory=dict)


def _decode_round(target, tokenizer, survivors: list[Contender], sessions: dict[int, Session], prompts: _Prompts,
                  indices: list[int], batch_size: int, task: str, tick: Tick) -> None:
    """Every survivor decodes ``indices`` (``batch_size`` at a time), plain decoding once, interleaved per batch
    (plain decoding first in every other batch, after the survivors in the others: neither side always runs on the
    warmer machine); each survivor's stats gain its own and plain decoding's of the same batches."""
    params = DecodeParams(MAX_NEW_TOKENS)

    def stops(rows: int):
        return [text_stop(tokenizer, TASK_STOPS[task]) for _ in range(rows)]

    for start in range(0, len(indices), batch_size):
        chunk = indices[start:start + batch_size]
        batch = [prompts.ids[i] for i in chunk]
        plain_first = chunk[0] // batch_size % 2 == 0  # alternating over the whole tuning, rounds included
        plain = _plain(target, batch, chunk, params, stops, prompts, tick) if plain_first else None
        results = []
        for contender in survivors:
            results.append(sessions[id(contender)].generate(batch, params, lambda rows=len(batch): stops(rows), task))
            tick()
        plain = plain or _plain(target, batch, chunk, params, stops, prompts, tick)
        for contender, result in zip(survivors, results, strict=True):
            for i, output in zip(chunk, result.outputs, strict=True):
                if output != prompts.expected[i]:
                    raise SpecdecError(f"draft {contender.drafter.name}: prompt {i} differs from plain "
                                       "decoding: a bug, please report it with this command")
            contender.add(result.stats + plain, len(batch))


def _plain(target, batch: list[list[int]], chunk: list[int], params: DecodeParams, stops, prompts: _Prompts,
           tick: Tick) -> GenerationStats:
    """Plain decoding of one batch: its outputs become the prompts' expected ones; its stats."""
    outputs, plain = autoregressive_generate_batch(target, batch, params, stops=stops(len(batch)))
    for i, output in zip(chunk, outputs, strict=True):
        prompts.expected[i] = output
    tick()
    return plain


def cached_catalog_drafts(target_name: str) -> list[str]:
    """The catalog's drafts for ``target_name``'s family that are already in the Hugging Face cache (``zoo pull``)."""
    from huggingface_hub import try_to_load_from_cache

    from zoo.build import catalog

    if catalog.family_of(target_name) is None:
        return []
    return [e.hub_id for e in catalog.entries(target_name)
            if target_name.lower() not in (e.name, e.hub_id.lower())
            and isinstance(try_to_load_from_cache(e.hub_id, "config.json"), str)]


def _batches_planned(count: int, first: int) -> int:
    """Batches successive halving decodes for ``count`` contenders (plain decoding's included) if no budget cuts it."""
    return sum((survivors + 1) * per for survivors, per in halving_schedule(count, first))


def tune(target_name: str, task: str, settings: LoadSettings, batch_size: int = 1, budget_minutes: float = 15.0,
         drafts: list[str] | None = None, first_prompts: int = 4, evaluate: int = 0, plot: Path | None = None,
         tick: Tick = no_progress, clock: Callable[[], float] = time.monotonic) -> TuneResult:
    """``zoo tune`` (see the module docstring): ``first_prompts`` prompts per survivor in the first round
    (times ``batch_size``), doubling per round, within ``budget_minutes``; ``evaluate`` > 0 also measures every
    contender on the task's first ``evaluate`` documents; ``plot``: a bar chart of each contender's speedup."""
    if task not in TASK_STOPS:
        raise SpecdecError(f"unknown task {task!r}: zoo tune runs the bundled tasks ({', '.join(TASK_STOPS)})")
    if batch_size < 1 or first_prompts < 1 or budget_minutes <= 0 or evaluate < 0:
        raise SpecdecError("--batch-size and --first-prompts must be >= 1, --budget > 0 and --evaluate >= 0")
    started = clock()
    target = settings.load(target_name)
    model, tokenizer = target.model, target.tokenizer
    extra = [*(drafts or []), *cached_catalog_drafts(target_name)]
    found, skipped = contenders(target, candidate_set(model.config.num_hidden_layers, extra))
    if not found:
        raise SpecdecError(f"no draft loads for {target_name}: {'; '.join(skipped)}")
    pool = _Prompts([tokenizer(p).input_ids for p in tuning_prompts(task)])
    sessions = {id(c): Session(model, c.drafter, RunSettings(c.policy)) for c in found}
    autoregressive_generate_batch(model, [pool.ids[0]], 8)  # warm-up
    halving, used, per, rounds_started = Halving(found), 0, first_prompts * batch_size, clock()
    tick(0, total=_batches_planned(len(found), first_prompts))
    for survivors in halving.rounds():
        indices = list(range(used, min(used + per, len(pool.ids))))  # never a prompt twice: a draft that keeps
        # the run's outputs (suffix) would find its own earlier answer (2.59x on a reused pool, 1.38x on new prompts)
        rate = (clock() - rounds_started) / max(sum(c.requests for c in found) + used, 1)  # s per prompt decoded
        if not indices or (used and clock() - started + rate * len(indices) * (len(survivors) + 1)
                           > budget_minutes * 60):
            break
        _decode_round(model, tokenizer, survivors, sessions, pool, indices, batch_size, task, tick)
        used, per = used + len(indices), per * 2
    winner = halving.winner
    result = TuneResult(target_name, task, hardware(model.device), batch_size, budget_minutes, 0.0, skipped=skipped)
    runtime = RunSettings().runtime(model)  # every contender's session runs the default settings
    for contender in halving.alive:
        record = SpecdecRecord.new(target_name, contender.drafter.name, contender.policy.num_draft_tokens, True,
                                   model.device, {task: contender.stats}, contender.drafter.model, runtime=runtime,
                                   batch_size=batch_size, kind_versions=kind_versions(contender.drafter.name))
        result.stored.append(str(store.save(record, "zoo tune")))
    result.seconds = clock() - started  # the tuning's own time; the evaluation's is apart
    evaluated, result.evaluation_seconds = (_evaluate(target, found, task, evaluate, batch_size, tick)
                                            if evaluate else ({}, 0.0))
    result.evaluation_documents = evaluate
    result.rows = sorted((TuneRow(c.drafter.name, c.policy.num_draft_tokens, c.rounds, c.requests, c.stats.tar,
                                  c.stats.speedup, evaluated.get(id(c)), c is winner) for c in found),
                         key=lambda r: (not r.chosen, -r.rounds, -(r.speedup or 0)))
    if plot is not None:
        _plot(result, plot)
        result.plot = str(plot)
    return result


def _evaluate(target, found: list[Contender], task: str, documents: int, batch_size: int,
              tick: Tick) -> tuple[dict[int, float | None], float]:
    """Every contender's speedup on the task's first ``documents`` (by the contender's id), and the seconds spent."""
    started, model, tokenizer = time.monotonic(), target.model, target.tokenizer
    prompts = _Prompts([tokenizer(p).input_ids for p in task_prompts(task)[:documents]])
    fresh, _ = contenders(target, [c.candidate for c in found])  # loaded again: no state from the tuning
    sessions = {id(c): Session(model, c.drafter, RunSettings(c.policy)) for c in fresh}
    tick(0, total=(len(fresh) + 1) * -(-documents // batch_size))
    _decode_round(model, tokenizer, fresh, sessions, prompts, list(range(len(prompts.ids))), batch_size, task, tick)
    return {id(c): e.stats.speedup for c, e in zip(found, fresh, strict=True)}, time.monotonic() - started


def _plot(result: TuneResult, path: Path) -> None:
    """Measured speedup per contender (tuning prompts, and the evaluation documents where measured)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in result.rows if r.speedup]
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(rows) + 1.5))
    names = [("★ " if r.chosen else "") + r.draft.replace(str(Path.cwd()) + "/", "") for r in rows]
    y = range(len(rows))
    ax.barh([i + 0.2 for i in y], [r.speedup for r in rows], height=0.4, label="tuning prompts")
    if any(r.evaluated_speedup for r in rows):
        ax.barh([i - 0.2 for i in y], [r.evaluated_speedup or 0 for r in rows], height=0.4,
                label=f"first {result.evaluation_documents} documents (evaluation)")
    ax.axvline(1.0, color="grey", linewidth=0.8)
    ax.set_yticks(list(y), names, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("speedup over plain decoding (same output)")
    ax.set_title(f"zoo tune: {result.target} on {result.task}, batch {result.batch_size}", fontsize=9)
    ax.legend(fontsize=7)
    atomic_write(path, png_bytes(fig))
