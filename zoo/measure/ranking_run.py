"""Gather ``zoo rank``'s inputs (profile or roofline latency, results or measured TAR) and rank."""

from __future__ import annotations

import warnings
from dataclasses import replace
from functools import partial

from specdraft_eval import published
from specdraft_eval.drafts.kind import all_candidates
from specdraft_eval.errors import SpecdecError
from specdraft_eval.files import RecordWarning
from specdraft_eval.integration.offline_data import task_prompts
from specdraft_eval.measure.environment import ModelFacts
from specdraft_eval.models.targets import ALIASES, LoadSettings, Target
from specdraft_eval.results import store
from specdraft_eval.results.profiles import read_calibration
from specdraft_eval.results.record import scan_results
from zoo.build import catalog
from zoo.measure import latency_model, paper, shapes
from zoo.measure.loading import load_one
from zoo.measure.rank import (
    MEASURE_GAMMAS,
    Candidate,
    RankOptions,
    RankResult,
    measure,
    missing_tar_hint,
    rank,
    tar_from_results,
    tree_depth,
)
from zoo.measure.timing import ensure_profile

PROFILE_CONTEXT = 256
PROFILE_REPEATS = 7


def default_drafts(target_name: str, depth: int) -> list[str]:
    """Every kind's candidates (prompt-lookup, a 5-layer view of the target, suffix, ...) and catalog drafts
    available without a download."""
    from huggingface_hub import try_to_load_from_cache

    names = [found.draft for found in all_candidates(depth)]
    for entry in catalog.entries(target_name) if catalog.family_of(target_name) else []:
        if entry.name == target_name:
            continue
        if entry.name in ALIASES or isinstance(try_to_load_from_cache(entry.hub_id, "config.json"), str):
            names.append(entry.name if entry.name in ALIASES else entry.hub_id)
    return names


def run_rank(target_name: str, options: RankOptions = RankOptions(),
             settings: LoadSettings = LoadSettings(kernels="onednn")) -> RankResult:
    """Rank ``options.drafts`` (default: the defaults plus every draft with results for this target; with a named
    GPU every catalog draft of the target's family) for ``options.gpu``.

    ``gpu`` "this" loads the models with ``settings`` and times them on its device (the profile of that device);
    a named GPU ranks from shapes alone (the catalog or config.json files) with the latency model of
    :mod:`zoo.measure.latency_model`, KV-cache reads counted at ``context`` tokens, so no weights are needed unless
    ``measure`` asks to measure TAR. ``gammas`` None ranks every γ results give a TAR for (up to the largest γ
    run), or 1, 2, 4, 8.
    """
    gpu, task, n_measure, drafts, gammas = options.gpu, options.task, options.measure, options.drafts, options.gammas
    results, max_new_tokens = options.results, options.max_new_tokens
    runtime, context = options.runtime, options.context
    if n_measure < 0 or context < 0:
        raise SpecdecError(f"--measure {n_measure} and --context {context} must be >= 0")
    if options.gpus < 1 or (options.gpus > 1 and gpu == "this"):
        raise SpecdecError(f"--gpus {options.gpus}: give a number >= 1, with a named --gpu (this machine's profile "
                           "times one process)")
    accelerator = None if gpu == "this" else latency_model.accelerator(gpu, read_calibration(gpu))
    own = store.paths(target_name) if results is None else []  # this machine's results first (zoo.measure.rank)
    files = [f for f in scan_results([*own, *(results if results is not None else [published.results()])])
             if f.record.runtime.engine_name == "specdec"]  # rank predicts our engine: vLLM's rows are not its
    mine = frozenset(own)
    records = {f.record.draft: f.record for f in files if f.record.target == target_name}
    if accelerator is None:
        return _rank_here(target_name, options, files, records, settings, mine)
    target = shapes.model_shape(target_name)
    family = [e.name for e in catalog.entries(target_name) if target_name.lower() not in (e.name, e.hub_id.lower())
              ] if catalog.family_of(target_name) else []
    names = drafts or [*(found.draft for found in all_candidates(target.shape.layers)), *family, *sorted(records)]
    resolved = {}
    for name in names:
        r = shapes.draft_shape(name, target.shape, records.get(name))
        resolved.setdefault(r.name, r)
    latency = f"{accelerator.source}: {accelerator.name}, {runtime}"
    candidates = []
    for name, r in resolved.items():
        gpus = options.gpus if r.shares_target else 1  # a layer view runs the target's sharded layers
        t_draft = (latency_model.forward_seconds(r.shape, 1, accelerator, runtime, context, gpus) * 1000
                   if r.shape else 0.0)
        where = f"{r.source}, sharded over {gpus}" if gpus > 1 else r.source
        c = Candidate(name, t_draft, f"{latency} ({where})" if r.shape else "model-free",
                      r.shape.parameters / 1e6 if r.shape else None,
                      r.shape.kv_bytes_per_token() if r.shape else 0)
        c.tar, c.tar_source = tar_from_results(files, target_name, task, name, mine)
        c.missing, c.tree_depth = missing_tar_hint(target_name, task, name), tree_depth(name)
        candidates.append(c)
    if n_measure:
        _measure_tar(settings.load(target_name), task, n_measure, candidates, gammas or list(MEASURE_GAMMAS),
                     max_new_tokens)
    wanted = gammas or sorted({g for c in candidates for g in c.tar}) or list(MEASURE_GAMMAS)
    step = partial(latency_model.forward_seconds, target.shape, gpu=accelerator, runtime=runtime, context=context,
                   gpus=options.gpus)  # the target sharded over --gpus; drafts on one
    t_target = step(1) * 1000
    t_verify = {g: step(g + 1) * 1000 for g in wanted}
    result = rank(candidates, t_target, t_verify, gammas, latency_model.model_error(accelerator.name, runtime))
    entry = catalog.find(target_name)
    if entry is None or entry.name not in paper.TARGETS:
        return result
    return replace(result, published=paper.compare(target.shape, accelerator, runtime, context, options.gpus,
                                                   gammas or list(MEASURE_GAMMAS)))


def _measure_tar(target: Target, task: str, n: int, candidates: list[Candidate], gammas: list[int],
                 max_new_tokens: int, drafters: dict | None = None) -> None:
    """Measure TAR (and tokens/s here, shown beside the prediction) on the task's first ``n`` prompts."""
    prompts = [target.tokenizer(text, return_tensors="pt").input_ids[:, -512:] for text in task_prompts(task)[:n]]
    for c in candidates:
        drafter = (drafters or {}).get(c.draft) or load_one(target, c.draft)
        measured = measure(target.model, drafter, prompts, gammas, max_new_tokens)
        c.tar = {g: s.tar for g, s in measured.items()}
        c.tar_source = {g: f"measured ({len(prompts)} prompts)" for g in measured}
        c.measured_tps = {g: s.tokens_per_second for g, s in measured.items()}


def _rank_here(target_name: str, options: RankOptions, files: list, records: dict,
               settings: LoadSettings, mine: frozenset = frozenset()) -> RankResult:
    """``--gpu this``: load the models and take latencies from this machine's profile."""
    task, n_measure, drafts, gammas = options.task, options.measure, options.drafts, options.gammas
    max_new_tokens = options.max_new_tokens
    target = settings.load(target_name)
    names = drafts or default_drafts(target_name, target.model.config.num_hidden_layers) + sorted(records)
    drafters = {}
    for name in names:
        try:
            drafter = load_one(target, name)
        except SpecdecError as exc:
            if drafts or name not in records:
                raise
            warnings.warn(f"skipping {name}: it has results but cannot be loaded here to time it ({exc})",
                          RecordWarning, stacklevel=2)
            continue
        drafters.setdefault(drafter.name, drafter)
    candidates = []
    for name, drafter in drafters.items():
        facts = ModelFacts.of(drafter.model)
        c = Candidate(name, 0.0, "profile", facts.parameters_m or None, facts.kv_bytes_per_token)
        c.tar, c.tar_source = tar_from_results(files, target_name, task, name, mine)
        c.missing = missing_tar_hint(target_name, task, name)
        candidates.append(c)
    if n_measure:
        _measure_tar(target, task, n_measure, candidates, gammas or list(MEASURE_GAMMAS), max_new_tokens,
                     drafters)
    wanted = gammas or sorted({g for c in candidates for g in c.tar}) or list(MEASURE_GAMMAS)
    profile = ensure_profile(target.model, target_name, list(drafters.values()), wanted, PROFILE_CONTEXT,
                                  PROFILE_REPEATS)
    for c in candidates:
        c.t_draft_ms = profile.drafts[c.draft].t_draft_ms
    return rank(candidates, profile.t_target_ms, {g: profile.t_verify_ms[g] for g in wanted}, gammas)
