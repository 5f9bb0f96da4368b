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
from specdraft_eval.files import atomic_write
from specdraft_eval.stats import GenerationStats
from zoo.profile import measure_and_write

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
    import io

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
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", metadata={"Software": None})
    plt.close(fig)
    atomic_write(path, buffer.getvalue())
