"""Gather ``zoo rank``'s inputs (profile or roofline latency, results or measured TAR) and rank."""

from __future__ import annotations

import warnings
from pathlib import Path

from specdraft_eval.drafts import load_draft
from specdraft_eval.errors import SpecdecError
from specdraft_eval.offline_data import task_prompts
from specdraft_eval.record import RecordWarning, model_facts, scan_results
from specdraft_eval.targets import ALIASES, load_target
from zoo import catalog, hardware
from zoo import profile as prof
from zoo.rank import (DEFAULT_MAX_NEW_TOKENS, DEFAULT_RESULTS, DEFAULT_TASK, MEASURE_GAMMAS, Candidate, measure,
                      missing_tar_hint, rank, tar_from_results)

PROFILE_CONTEXT = 256
PROFILE_REPEATS = 7


def default_drafts(target_name: str, depth: int) -> list[str]:
    """prompt-lookup, a 5-layer view of the target, and catalog drafts available without a download."""
    from huggingface_hub import try_to_load_from_cache

    names = ["prompt-lookup", f"layers:0-{min(5, depth) - 1}"]
    for entry in catalog.entries(target_name) if catalog.family_of(target_name) else []:
        if entry["name"] == target_name:
            continue
        if entry["name"] in ALIASES or isinstance(try_to_load_from_cache(entry["hub_id"], "config.json"), str):
            names.append(entry["name"] if entry["name"] in ALIASES else entry["hub_id"])
    return names


def run_rank(target_name: str, gpu: str = "this", task: str = DEFAULT_TASK, n_measure: int = 0,
             drafts: list[str] | None = None, gammas: list[int] | None = None,
             results: list[Path] = list(DEFAULT_RESULTS), max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS) -> list[dict]:
    """Rank ``drafts`` (default: the defaults plus every draft with results for this target) for ``gpu``.

    ``gammas`` None ranks every γ results give a TAR for (up to the largest γ run), or 1, 2, 4, 8.
    """
    accelerator = None if gpu == "this" else hardware.accelerator(gpu)
    if n_measure < 0:
        raise SpecdecError(f"--measure {n_measure} must be >= 0")
    prompts_text = task_prompts(task)[:n_measure] if n_measure else []
    files = scan_results(results)
    target, tokenizer = load_target(target_name)
    records = {f.record.draft: f.record for f in files if f.record.target == target_name}
    names = drafts or default_drafts(target_name, target.config.num_hidden_layers) + sorted(records)
    drafters, record_only = {}, {}
    for name in names:
        try:
            drafter = load_draft(name, target, tokenizer)
        except SpecdecError as exc:
            if drafts or name not in records:
                raise
            if accelerator is None:
                warnings.warn(f"skipping {name}: it has results but cannot be loaded here to time it ({exc})",
                              RecordWarning, stacklevel=2)
            else:
                record_only[name] = records[name]  # a named GPU: the record's draft size is enough
            continue
        drafters.setdefault(drafter.name, drafter)
    candidates = []
    for name, drafter in drafters.items():
        facts = model_facts(getattr(drafter, "model", None))
        candidates.append(Candidate(name, 0.0, "", facts["parameters_m"] or None, facts["kv_bytes_per_token"]))
    for name, record in record_only.items():
        candidates.append(Candidate(name, 0.0, "", record.draft_parameters_m or None))
    for c in candidates:
        c.tar, c.tar_source = tar_from_results(files, target_name, task, c.draft)
        c.missing = missing_tar_hint(target_name, task, c.draft)
    wanted = gammas or (list(MEASURE_GAMMAS) if prompts_text else
                        sorted({g for c in candidates for g in c.tar}) or list(MEASURE_GAMMAS))
    if accelerator is None:
        profile = prof.ensure_profile(target, target_name, list(drafters.values()), wanted, PROFILE_CONTEXT,
                                      PROFILE_REPEATS)
        t_target, t_verify = profile["t_target_ms"], profile["t_verify_ms"]
    else:
        params = model_facts(target)["parameters_m"] * 1e6
        t_target = hardware.forward_seconds(params, 1, accelerator) * 1000
        t_verify = {g: hardware.forward_seconds(params, g + 1, accelerator) * 1000 for g in wanted}
    prompts = [tokenizer(text, return_tensors="pt").input_ids[:, -512:] for text in prompts_text]
    for c in candidates:
        if accelerator is None:
            c.t_draft_ms, c.draft_source = profile["drafts"][c.draft]["t_draft_ms"], "profile"
        else:
            params = (c.parameters_m or 0.0) * 1e6
            c.t_draft_ms = hardware.forward_seconds(params, 1, accelerator) * 1000 if params else 0.0
            c.draft_source = f"estimate ({accelerator.name})"
        if prompts and c.draft in drafters:
            stats = measure(target, drafters[c.draft], prompts, wanted, max_new_tokens)
            summaries = {g: s.summary() for g, s in stats.items()}
            c.tar = {g: s["tar"] for g, s in summaries.items()}
            c.tar_source = {g: f"measured ({len(prompts)} prompts)" for g in summaries}
            c.measured_tps = {g: s["tokens_per_second"] for g, s in summaries.items()}
    return rank(candidates, t_target, {g: t_verify[g] for g in wanted if g in t_verify}, gammas)
