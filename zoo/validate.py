"""``zoo validate``: check the analytical model the way the founding paper did (its Appendix D, Figure 12).

Profile latencies first (:func:`zoo.profile.engine_latency`, on prompts the validation does not use), then
run every draft and γ end to end; predict each run's tokens/s from the profile and the run's *counts* (TAR,
the mix of draft lengths from the per-position counts, prompt lengths), never from its own seconds, and
compare with the measured tokens/s.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path

from specdraft_eval.analytical import predicted_from_latencies
from specdraft_eval.engine import speculative_generate
from specdraft_eval.errors import SpecdecError
from specdraft_eval.environment import hardware
from specdraft_eval.files import atomic_write, write_json
from specdraft_eval.stats import GenerationStats
from specdraft_eval.targets import LoadSettings
from zoo.leaderboard import png_bytes
from zoo.profile import measure_and_write
from zoo.progress import Tick, no_progress

PROFILE_PROMPTS = 2


def check_options(n_prompts: int, repeats: int, max_new_tokens: int) -> None:
    for name, value in (("--prompts", n_prompts), ("--repeats", repeats), ("--max-new-tokens", max_new_tokens)):
        if value < 1:
            raise SpecdecError(f"{name} {value} must be >= 1")


def deviation(predicted: float, measured: float) -> float:
    """Signed fraction: +0.03 means the prediction is 3% above the measurement."""
    return predicted / measured - 1


def validate(target, target_name: str, drafters: list, prompts: list[list[int]], profile_prompts: list[list[int]],
             gammas: list[int], repeats: int, max_new_tokens: int,
             on_run: Callable[[], None] = lambda: None) -> dict:
    """Profile, then measure every (draft, γ) ``repeats`` times over ``prompts``; rows of predicted against
    measured tokens/s (medians over repeats, with min and max) and their deviation."""
    context = round(statistics.mean(len(p) for p in profile_prompts))
    profile, _ = measure_and_write(target, target_name, drafters, gammas, context, max_new_tokens, None,
                                   prompts=profile_prompts)
    on_run()
    runs: dict[tuple[str, int], list[GenerationStats]] = {}
    for _ in range(repeats):  # repeats outermost: slow drifts of the machine spread over every configuration
        for drafter in drafters:
            for gamma in gammas:
                total = GenerationStats()
                for ids in prompts:
                    total = total + speculative_generate(target, drafter, ids, max_new_tokens, num_draft_tokens=gamma)[1]
                runs.setdefault((drafter.name, gamma), []).append(total)
                on_run()
    rows = []
    for (draft, gamma), totals in runs.items():
        latencies = profile.latencies(draft)
        predicted = [predicted_from_latencies(t, latencies) for t in totals]
        measured = [t.tokens_per_second for t in totals]
        summary = sum(totals, GenerationStats())
        p, m = statistics.median(predicted), statistics.median(measured)
        rows.append({
            "draft": draft, "gamma": gamma,
            "predicted_tokens_per_second": p, "measured_tokens_per_second": m, "deviation": deviation(p, m),
            "predicted_min": min(predicted), "predicted_max": max(predicted),
            "measured_min": min(measured), "measured_max": max(measured),
            "tar": summary.tar, "loop_overhead": summary.loop_overhead,
        })
    deviations = [abs(r["deviation"]) for r in rows]
    return {"target": target_name, "hardware": hardware(target.device), "prompts": len(prompts),
            "max_new_tokens": max_new_tokens, "repeats": repeats, "profile_context": context,
            "median_abs_deviation": statistics.median(deviations), "max_abs_deviation": max(deviations),
            "rows": rows}


def plot(result: dict, path: Path) -> None:
    """Predicted against measured tokens/s with min–max bars over repeats (the paper's Figure 12)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 5), dpi=100)
    rows = result["rows"]
    for draft in sorted({r["draft"] for r in rows}):
        mine = [r for r in rows if r["draft"] == draft]
        ax.errorbar([r["measured_tokens_per_second"] for r in mine], [r["predicted_tokens_per_second"] for r in mine],
                    xerr=[[r["measured_tokens_per_second"] - r["measured_min"] for r in mine],
                          [r["measured_max"] - r["measured_tokens_per_second"] for r in mine]],
                    yerr=[[r["predicted_tokens_per_second"] - r["predicted_min"] for r in mine],
                          [r["predicted_max"] - r["predicted_tokens_per_second"] for r in mine]],
                    fmt="o", capsize=3, label=draft)
        for r in mine:
            ax.annotate(f"γ={r['gamma']}", (r["measured_tokens_per_second"], r["predicted_tokens_per_second"]),
                        fontsize=6, xytext=(3, 3), textcoords="offset points")
    values = [v for r in rows for v in (r["measured_min"], r["measured_max"], r["predicted_min"], r["predicted_max"])]
    low, high = min(values) * 0.9, max(values) * 1.1
    ax.plot([low, high], [low, high], "k-", lw=0.8, label="predicted = measured")
    ax.fill_between([low, high], [low * 0.95, high * 0.95], [low * 1.05, high * 1.05], color="0.9", label="±5%")
    ax.set_xlim(low, high)
    ax.set_ylim(low, high)
    ax.set_xlabel("measured tokens/s")
    ax.set_ylabel("predicted tokens/s (profile latencies, measured TAR)")
    ax.set_title(f"{result['target']}: median |dev| {result['median_abs_deviation']:.1%}, "
                 f"max {result['max_abs_deviation']:.1%}", fontsize=9)
    ax.legend(fontsize=7)
    atomic_write(path, png_bytes(fig))


def run(target_name: str, drafts: list[str], task: str, n_prompts: int, gammas: list[int], repeats: int,
        max_new_tokens: int, plot_path: Path, settings: LoadSettings, tick: Tick = no_progress) -> dict:
    """``zoo validate``: load the target and drafts with ``settings``, :func:`validate` on the task's prompts,
    write the plot at ``plot_path`` and the figures beside it (``.json``); return the figures."""
    from specdraft_eval.drafts import load_draft
    from specdraft_eval.offline_data import task_prompts

    check_options(n_prompts, repeats, max_new_tokens)
    texts = task_prompts(task)
    if len(texts) < n_prompts + PROFILE_PROMPTS:
        raise SpecdecError(f"--prompts {n_prompts} leaves too few of {task}'s {len(texts)} prompts for the profile: "
                           f"use at most {len(texts) - PROFILE_PROMPTS}")
    model, tokenizer = settings.load(target_name)
    drafters = [load_draft(name, model, tokenizer) for name in drafts]
    ids = [tokenizer(t).input_ids[-512:] for t in texts[: n_prompts + PROFILE_PROMPTS]]
    tick(0, total=1 + repeats * len(drafters) * len(gammas))
    result = validate(model, target_name, drafters, ids[:n_prompts], ids[n_prompts:], gammas, repeats,
                      max_new_tokens, on_run=tick)
    plot(result, plot_path)
    write_json(plot_path.with_suffix(".json"), result)
    return result


def table_rows(result: dict) -> list[dict]:
    """The rows as a text table shows them."""
    return [{"draft": r["draft"], "γ": r["gamma"], "predicted tok/s": r["predicted_tokens_per_second"],
             "measured tok/s": r["measured_tokens_per_second"],
             "measured min–max": f"{r['measured_min']:.3g}–{r['measured_max']:.3g}",
             "deviation": f"{r['deviation']:+.1%}", "TAR": r["tar"], "loop overhead": f"{r['loop_overhead']:.1%}"}
            for r in result["rows"]]
