"""The ``specdec`` result block (schema shared by lm-eval results, the zoo and the leaderboard)."""

from __future__ import annotations

import platform
from importlib.metadata import PackageNotFoundError, version

from tabulate import tabulate

from specdraft_eval.stats import GenerationStats

SCHEMA_VERSION = 1

TABLE_COLUMNS = [
    ("task", "task"),
    ("tar", "TAR"),
    ("acceptance_rate", "accept"),
    ("draft_ms_per_token", "draft ms/tok"),
    ("verify_ms_per_step", "verify ms/step"),
    ("tokens_per_second", "tok/s"),
    ("baseline_tokens_per_second", "base tok/s"),
    ("speedup", "speedup"),
    ("predicted_tokens_per_second", "pred tok/s"),
]


def hardware(device) -> str:
    """A short name for the device the run used."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return f"CPU: {line.split(':', 1)[1].strip()}"
    except OSError:
        pass
    return f"CPU: {platform.processor() or platform.machine()}"


def model_facts(model) -> dict:
    """Size of a draft or target: parameters (millions), decoder layers, KV-cache bytes per token in bf16.

    ``model`` None (a model-free draft such as prompt lookup) gives zeros.
    """
    if model is None:
        return {"parameters_m": 0.0, "layers": 0, "kv_bytes_per_token": 0}
    c = model.config
    heads = c.num_attention_heads
    kv_heads = getattr(c, "num_key_value_heads", heads)
    return {
        "parameters_m": sum(p.numel() for p in model.parameters()) / 1e6,
        "layers": c.num_hidden_layers,
        "kv_bytes_per_token": 2 * c.num_hidden_layers * kv_heads * (c.hidden_size // heads) * 2,
    }


def _version(package: str) -> str | None:
    try:
        return version(package)
    except PackageNotFoundError:
        return None


def specdec_block(
    target: str,
    draft: str,
    num_draft_tokens: int,
    dynamic_gamma: bool,
    device,
    per_task: dict[str, GenerationStats],
    baseline_mismatches: int = 0,
    draft_model=None,
) -> dict:
    """Everything a results file records about speculative decoding for one run."""
    total = sum(per_task.values(), GenerationStats())
    facts = model_facts(draft_model)
    return {
        "schema_version": SCHEMA_VERSION,
        "target": target,
        "draft": draft,
        "num_draft_tokens": num_draft_tokens,
        "dynamic_gamma": dynamic_gamma,
        "draft_parameters_m": facts["parameters_m"],
        "draft_layers": facts["layers"],
        "hardware": hardware(device),
        "versions": {p: _version(p) for p in ("specdraft-eval", "lm-eval", "torch", "transformers")},
        "generations": total.generations,
        **total.summary(),
        "baseline_mismatches": baseline_mismatches,
        "counters": total.as_dict(),
        "per_task": {task: {"generations": s.generations, **s.summary()} for task, s in sorted(per_task.items())},
    }


def table(block: dict) -> str:
    """The block as a text table: one row per task and an ``all`` row."""
    rows = [{"task": task, **figures} for task, figures in block["per_task"].items()]
    if len(rows) != 1:
        rows.append({"task": "all", **block})
    body = [[_fmt(row.get(key)) for key, _ in TABLE_COLUMNS] for row in rows]
    title = f"specdec: target={block['target']} draft={block['draft']} num_draft_tokens={block['num_draft_tokens']}"
    return title + "\n" + tabulate(body, headers=[h for _, h in TABLE_COLUMNS], tablefmt="github")


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"
    return str(value)
