"""Gather ``zoo rank``'s inputs (profile or roofline latency, results or measured TAR) and rank."""

from __future__ import annotations

from pathlib import Path

from specdraft_eval.drafts import load_draft
from specdraft_eval.errors import SpecdecError
from specdraft_eval.offline_data import task_prompts
from specdraft_eval.targets import ALIASES, load_target
from zoo import catalog, hardware
from zoo import profile as prof
from specdraft_eval.report import model_facts
from zoo.rank import Candidate, measure, rank, tar_from_results

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


def run_rank(target_name: str, gpu: str, task: str, n_measure: int, drafts: list[str] | None, gammas: list[int],
             results: list[Path], max_new_tokens: int) -> list[dict]:
    accelerator = None if gpu == "this" else hardware.accelerator(gpu)
    if n_measure < 0:
        raise SpecdecError(f"--measure {n_measure} must be >= 0")
    prompts_text = task_prompts(task)[:n_measure] if n_measure else []
    target, tokenizer = load_target(target_name)
    drafters = [load_draft(name, target, tokenizer) for name in drafts or default_drafts(target_name, target.config.num_hidden_layers)]
    if accelerator is None:
        path = prof.default_profile_path(target_name)
        profile = prof.read_profile(path)
        missing = [d for d in drafters if not profile or d.name not in profile["drafts"]]
        if profile is None or missing or not set(gammas) <= set(profile["t_verify_ms"]):
            profile = prof.measure_and_write(target, target_name, missing, gammas, PROFILE_CONTEXT, PROFILE_REPEATS,
                                             path)
        t_target, t_verify = profile["t_target_ms"], {int(k): v for k, v in profile["t_verify_ms"].items()}
    else:
        params = model_facts(target)["parameters_m"] * 1e6
        t_target = hardware.forward_seconds(params, 1, accelerator) * 1000
        t_verify = {g: hardware.forward_seconds(params, g + 1, accelerator) * 1000 for g in gammas}
    prompts = [tokenizer(text, return_tensors="pt").input_ids[:, -512:] for text in prompts_text]
    candidates = []
    for drafter in drafters:
        facts = model_facts(getattr(drafter, "model", None))
        params = facts["parameters_m"] * 1e6
        if accelerator is None:
            t_draft, source = profile["drafts"][drafter.name]["t_draft_ms"], "profile"
        else:
            t_draft = hardware.forward_seconds(params, 1, accelerator) * 1000 if params else 0.0
            source = f"estimate ({accelerator.name})"
        candidate = Candidate(drafter.name, t_draft, source, facts["parameters_m"] or None,
                              facts["kv_bytes_per_token"])
        candidate.tar, candidate.tar_source = tar_from_results(results, target_name, task, drafter.name)
        if prompts:
            stats = measure(target, drafter, prompts, gammas, max_new_tokens)
            summaries = {g: s.summary() for g, s in stats.items()}
            candidate.tar = {g: s["tar"] for g, s in summaries.items()}
            candidate.measured_tps = {g: s["tokens_per_second"] for g, s in summaries.items()}
            candidate.tar_source = f"measured ({len(prompts)} prompts)"
            if accelerator is None:  # this machine: the runs' own latencies beat the profile's
                candidate.t_verify_ms = {g: s["verify_ms_per_step"] for g, s in summaries.items()}
                drafted = sum(s.draft_tokens for s in stats.values())
                if drafted:
                    candidate.t_draft_ms = sum(s.draft_seconds for s in stats.values()) / drafted * 1000
                candidate.draft_source = "measured"
        candidates.append(candidate)
    return rank(candidates, t_target, {g: t_verify[g] for g in gammas if g in t_verify})
