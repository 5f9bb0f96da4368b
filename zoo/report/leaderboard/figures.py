"""The leaderboard's figures (deterministic PNGs): speedup against draft cost with the analytical model's curves,
TAR against the draft's own bits per byte, acceptance by position, latency against depth and width."""

from __future__ import annotations

import re
import statistics

from specdraft_eval.results.profiles import Calibration
from zoo.report.leaderboard.findings import LmFinding
from zoo.report.leaderboard.render import groups, rho_text, short_draft
from zoo.report.leaderboard.rows import LeaderboardRow
from zoo.report.plotting import png_bytes


def _configuration(row: LeaderboardRow) -> str:
    """A plot key: the draft (folders dropped from paths) with its γ and engine, e.g. ``prompt-lookup:3 γ4 dynamic``,
    ``prompt-lookup:3 γ4 (vllm)``."""
    draft = re.sub(r"[^|:]*/", "", short_draft(row.draft))
    return (f"{draft} γ{row.gamma}" + (" dynamic" if row.dynamic_gamma else "")
            + (f" ({row.engine})" if row.engine != "specdec" else ""))


def main_group(rows: list[LeaderboardRow]) -> tuple[str, list[LeaderboardRow]]:
    """The target and hardware with the most rows (the figures' subject): its name and rows."""
    (target, hw), main = max(groups(rows).items(), key=lambda item: (len(item[1]), item[0]))
    return f"{target} on {hw}", main


ANALYTICAL_TARS = (1.25, 1.5, 2.0, 2.5, 3.0)
"""The TAR of each analytical-model curve on the speedup figure."""


def plots(rows: list[LeaderboardRow], findings: list[LmFinding],
          sweeps: list[Calibration]) -> dict[str, tuple[str, bytes]]:
    """The figures by file name, each with its title, for the target and hardware with the most rows: speedup
    against draft cost with the analytical model's curves, TAR against the draft's own bits per byte, acceptance by
    position, and (given sweeps) latency against depth and width. A colour per draft, a marker per task, keys in
    legends (no text at points)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.legend import Legend
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    from specdraft_eval.measure.analytical import predicted_speedup

    where, main = main_group(rows)
    drafts = sorted({_configuration(r) for r in main})
    colour = {d: plt.get_cmap("tab20")(i % 20) for i, d in enumerate(drafts)}
    tasks = sorted({r.task for r in main})
    marker = {t: "osD^v<>"[i % 7] for i, t in enumerate(tasks)}

    def figure():
        fig, (ax, key) = plt.subplots(1, 2, figsize=(13, 6), dpi=100, gridspec_kw={"width_ratios": [2.2, 1.4]})
        key.axis("off")
        return fig, ax, key

    def legends(ax, key, shown: set[str], where_tasks: str) -> None:
        """Keys: colour = draft and γ beside the plot, marker = task in the plot's empty corner ``where_tasks``."""
        key.legend(handles=[Line2D([], [], color=colour[d], marker="s", linestyle="", label=d)
                            for d in drafts if d in shown], title="draft and γ", fontsize=10 if len(shown) <= 20 else 8,
                   title_fontsize=11, loc="upper left", frameon=False)
        handles = [Line2D([], [], color="grey", marker=marker[t], linestyle="") for t in tasks]
        ax.add_artist(Legend(ax, handles, [t.removeprefix("specdec_") for t in tasks], title="task", fontsize=10,
                             title_fontsize=11, loc=where_tasks, frameon=False))  # beside any legend ax has

    images: dict[str, tuple[str, bytes]] = {}
    fig, ax, key = figure()
    timed = [r for r in main if r.draft_ms_per_token and r.baseline_tokens_per_second and r.speedup]

    def in_plain_steps(row: LeaderboardRow, key: str) -> float:
        """``getattr(row, key)`` (ms) as a fraction of the row's plain decoding step."""
        return getattr(row, key) * row.baseline_tokens_per_second / 1000

    cost = [in_plain_steps(row, "draft_ms_per_token") for row in timed]
    for row, c in zip(timed, cost):
        ax.scatter(c, row.speedup, color=colour[_configuration(row)], marker=marker[row.task], s=40, zorder=3)
    curves = []
    if timed:
        # the model's curves at γ 4, verification costing what it cost these runs relative to a plain step
        verify = statistics.median([in_plain_steps(r, "verify_ms_per_step") for r in timed if r.verify_ms_per_step]
                                   or [1.0])
        low, high = min(0.001, min(cost)), max(2.0, 1.5 * max(cost))
        xs = [low * (high / low) ** (i / 99) for i in range(100)]
        for i, tar in enumerate(ANALYTICAL_TARS):
            style = {"color": "black", "alpha": 0.3 + 0.14 * i, "linewidth": 1, "linestyle": "--"}
            ax.plot(xs, [predicted_speedup(tar, 4, x, verify, 1.0) for x in xs], **style)
            curves.append(Line2D([], [], **style, label=f"TAR {tar:g}, γ 4"))
        ax.set_xscale("log")
        ax.set_ylim(0, max(2.5, max(r.speedup for r in timed) * 1.1))
    ax.axhline(1.0, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("draft cost: ms per drafted token / ms per plain target step (log scale)")
    ax.set_ylabel("speedup over plain decoding (same run)")
    ax.set_title("Speedup against draft latency\ndashed: the analytical model TAR / (γ·c + v), c = draft cost, "
                 f"v = verify / plain step ({verify if timed else 0:.2f} here)\n{where}", fontsize=11)
    if curves:
        ax.legend(handles=curves, title="analytical model", fontsize=9, title_fontsize=10, loc="upper right",
                  frameon=False)
    legends(ax, key, {_configuration(r) for r in timed}, "lower left")
    images["speedup_vs_draft_latency.png"] = (
        "speedup against draft latency, with the analytical model's curves (the founding paper's Figure 8)",
        png_bytes(fig))

    fig, ax, key = figure()
    points = [r for f in findings for r in f.points]
    for row in points:
        ax.scatter(row.draft_bits_per_byte, row.tar, color=colour[_configuration(row)], marker=marker[row.task],
                   s=40)
    for f in findings:
        if f.target_bits_per_byte:
            ax.axvline(f.target_bits_per_byte, color="grey", linestyle=":", linewidth=1)
    if points:
        legends(ax, key, {_configuration(r) for r in points}, "upper left")
        ax.set_xscale("log")
        shown_bits = [r.draft_bits_per_byte for r in points] + [f.target_bits_per_byte for f in findings
                                                                   if f.target_bits_per_byte]
        ticks = [t for t in (0.2, 0.5, 1, 2, 5, 10, 20, 50, 100) if min(shown_bits) / 1.5 <= t <= max(shown_bits) * 1.5]
        ax.set_xticks(ticks, labels=[f"{t:g}" for t in ticks])
        ax.minorticks_off()
        ax.invert_xaxis()  # better language models to the right
        ax.set_ylim(0.95, max(1.5, max(r.tar for r in points) * 1.1))
        rho = "; ".join(f"{f.task.removeprefix('specdec_')} {rho_text(f.tar_rho)} ({len(f.points)} drafts)"
                        for f in findings)
    else:
        ax.text(0.5, 0.5, "no draft bits per byte yet:\nscore a draft with the _lm tasks and score=draft",
                ha="center", va="center", transform=ax.transAxes)
        rho = "no points"
    ax.set_xlabel("draft's own bits per byte on the task's reference answers\n(log scale; better language model to "
                  "the right; dotted: the target)")
    ax.set_ylabel("TAR (tokens per verification step)")
    ax.set_title(f"TAR against the draft's language-modelling quality\nSpearman ρ(bits/byte, TAR): {rho}\n{where}",
                 fontsize=11)
    images["tar_vs_draft_bits_per_byte.png"] = (
        "TAR against the draft's own language-modelling quality (the founding paper's Figure 2)", png_bytes(fig))

    fig, ax, key = figure()
    shown = set()
    for row in main:
        rates = row.acceptance_rate_per_position
        if rates:
            ax.plot(range(len(rates)), rates, marker=marker[row.task], color=colour[_configuration(row)], linewidth=1)
            shown.add(_configuration(row))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("draft position (0-based)")
    ax.set_ylabel("accepted / drafted at the position")
    ax.set_ylim(0, 1.05)
    if shown:
        legends(ax, key, shown, "upper right")
    ax.set_title(f"Acceptance by draft position\n{where}", fontsize=11)
    images["acceptance_by_position.png"] = ("acceptance by draft position", png_bytes(fig))
    if sweeps:
        images["latency_vs_depth_and_width.png"] = ("latency against depth and width (random-weight shapes, latency "
                                                    "only; the founding paper's Figure 4)", _sweep_figure(sweeps))
    return images


def _sweep_figure(sweeps: list[Calibration]) -> bytes:
    """Two panels per the founding paper's latency figure: ms per step against depth (the sweep's depth rows, at
    their width) and against width (its rows at 4 layers), a line per hardware, log scales."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

    fig, (depth, width) = plt.subplots(1, 2, figsize=(13, 5.5), dpi=100)
    for i, sweep in enumerate(sweeps):
        colour = plt.get_cmap("tab10")(i % 10)
        deep = sorted((r for r in sweep.rows if r.group == "depth"), key=lambda r: r.layers)
        widths = statistics.mode(r.hidden_size for r in deep) if deep else None
        wide = sorted((r for r in sweep.rows if r.layers == 4 and r.group in ("depth", "width")),
                      key=lambda r: r.hidden_size)
        for ax, chosen, x in ((depth, deep, "layers"), (width, wide, "hidden_size")):
            if not chosen:
                continue
            ax.errorbar([getattr(r, x) for r in chosen], [r.ms_per_token for r in chosen],
                        yerr=[[r.ms_per_token - r.low for r in chosen],
                              [r.high - r.ms_per_token for r in chosen]],
                        marker="o", color=colour, capsize=3,
                        label=f"{sweep.hardware}" + (f" (width {widths})" if ax is depth else " (4 layers)"))
    plain = FuncFormatter(lambda value, _: f"{value:g}")
    for ax, label in ((depth, "decoder layers"), (width, "hidden size")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_minor_locator(NullLocator())
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_formatter(plain)
        ax.set_xlabel(label + " (log scale)")
        ax.set_ylabel("ms per batch-1 step (log scale)")
        ax.legend(fontsize=10, frameon=False)
    depth.set_title("Latency against depth", fontsize=11)
    width.set_title("Latency against width", fontsize=11)
    fig.suptitle("Random-weight Llama shapes, context 128: latency only (no TAR)", fontsize=11)
    return png_bytes(fig)
