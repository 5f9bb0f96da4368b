"""``zoo leaderboard``: tables (markdown, CSV, HTML) and plots from lm-eval results files.

Reads the ``config.specdec`` records (:mod:`specdraft_eval.record`) that ``lm_eval --model specdec`` writes. Output is deterministic: rows
are sorted, floats rounded, and PNGs carry no software or date metadata.
"""

from __future__ import annotations

import csv
import html
import io
import re
import statistics
from datetime import datetime, timezone
from pathlib import Path

from tabulate import tabulate

from specdraft_eval.errors import SpecdecError
from specdraft_eval.files import atomic_write
from specdraft_eval.record import Configuration, configurations, scan_results
from specdraft_eval.report import positions

COLUMNS = [
    ("target", "target"), ("hardware", "hardware"), ("draft", "draft"), ("task", "task"),
    ("speedup", "speedup"), ("speedup_min", "speedup min"), ("speedup_max", "speedup max"), ("runs", "runs"),
    ("tar", "TAR"), ("accuracy", "accuracy"), ("draft_accuracy", "draft accuracy"),
    ("documents", "documents"), ("tokens_per_second", "tokens/s"), ("baseline_tokens_per_second", "plain tokens/s"),
    ("draft_ms_per_token", "draft ms/token"), ("verify_ms_per_step", "verify ms/step"),
    ("acceptance_by_position", "acceptance by position"), ("gamma", "γ"), ("dynamic_gamma", "dynamic γ"),
    ("tar_p50", "TAR p50 of requests"), ("accepted_per_step", "accepted/step"),
    ("acceptance_rate", "acceptance rate"), ("draft_parameters_m", "draft params (M)"),
    ("draft_layers", "draft layers"), ("date", "date"), ("lm_eval", "lm-eval"), ("specdraft_eval", "specdraft-eval"),
]
GROUPED = ("target", "hardware")  # headings of the page, not columns of its tables
DECIMALS = {"speedup": 2, "speedup_min": 2, "speedup_max": 2, "tar": 2, "tar_p50": 2, "accepted_per_step": 2, "acceptance_rate": 2, "accuracy": 2,
            "draft_accuracy": 2, "tokens_per_second": 1, "baseline_tokens_per_second": 1, "verify_ms_per_step": 1,
            "draft_parameters_m": 1}
"""Decimals shown: speedup and TAR to 0.01 (their run-to-run spread here is a few percent), times to 0.1 ms."""


def _accuracy(task_results: dict) -> tuple[str | None, float | None]:
    for key, value in sorted(task_results.items()):
        if "," in key and "stderr" not in key and isinstance(value, (int, float)):
            return key.split(",")[0], float(value)
    return None, None


TIMED = ("tokens_per_second", "baseline_tokens_per_second", "draft_ms_per_token", "verify_ms_per_step")
"""Figures that depend on the machine's speed that day: the median over a configuration's runs (counters, and so
TAR and acceptance, are summed over runs instead)."""


def _day(date) -> str:
    return datetime.fromtimestamp(float(date), tz=timezone.utc).date().isoformat() if isinstance(date, (int, float)) \
        else str(date or "")


def rows_from_configuration(config: Configuration) -> list[dict]:
    """Leaderboard rows (one per task) of one configuration: every results file of it merged (a rerun, or a run
    of ``auto``, which records what it resolved to)."""
    latest = max(config.files, key=lambda f: str(f.date or ""))
    record = latest.record
    rows = []
    for task, stats in sorted(config.per_task.items()):
        figures = stats.summary()
        runs = [f for f in config.files if task in f.record.per_task]
        timed = {key: [f.record.per_task[task].summary()[key] for f in runs] for key in TIMED}
        scores = [score for score in (_accuracy(f.results.get(task, {})) for f in runs) if score[1] is not None]
        spread = config.speedup_spread(task)
        rows.append({
            "target": config.target, "draft": config.draft, "draft_parameters_m": record.draft_parameters_m or None,
            "draft_layers": record.draft_layers or None, "task": task,
            "metric": scores[0][0] if scores else None,
            "accuracy": statistics.median(v for _, v in scores) if scores else None,
            "draft_accuracy": None, "documents": stats.generations or None,
            **{k: figures[k] for k, _ in COLUMNS if k in figures},
            **{k: statistics.median(v) if None not in v else None for k, v in timed.items()},
            "speedup": config.speedup(task), "speedup_min": spread[0] if spread else None,
            "speedup_max": spread[1] if spread else None, "runs": len(runs),
            "acceptance_rate_per_position": figures["acceptance_rate_per_position"],
            "acceptance_by_position": positions(figures["acceptance_rate_per_position"]),
            "tar_p50": (figures["per_request_mean_accepted_length"] or {}).get("p50"),
            "gamma": config.num_draft_tokens, "dynamic_gamma": "yes" if config.dynamic_gamma else "no",
            "hardware": config.hardware or None, "date": _day(latest.date),
            "lm_eval": record.versions.get("lm-eval"), "specdraft_eval": record.versions.get("specdraft-eval"),
        })
    return rows


def collect(paths: list[Path]) -> list[dict]:
    """The leaderboard's rows: one per configuration (target, hardware, draft, γ, dynamic γ) and task, its runs
    merged. A run without baseline timing whose target is some row's draft measured that draft's own accuracy: it
    fills those rows' ``draft_accuracy`` instead of being a row itself."""
    rows = [row for config in configurations(scan_results(paths)) for row in rows_from_configuration(config)]
    if not rows:
        raise SpecdecError("no specdec results found: run lm_eval --model specdec ... --output_path DIR first")
    drafts = {row["draft"] for row in rows}
    as_draft = [row for row in rows if row["target"] in drafts and row["speedup"] is None]
    own = {(row["target"], row["task"]): row["accuracy"] for row in as_draft}
    rows = [row for row in rows if row not in as_draft] or rows
    for row in rows:
        row["draft_accuracy"] = own.get((row["draft"], row["task"]))
    return sorted(rows, key=lambda r: (r["target"], r["hardware"] or "", r["task"], -(r["speedup"] or 0),
                                       -(r["tokens_per_second"] or 0), r["draft"]))


def _cell(key: str, value):
    """``value`` rounded to what the measurement supports (for people: markdown and HTML)."""
    if isinstance(value, float):
        if key in DECIMALS:
            return f"{value:.{DECIMALS[key]}f}"
        return f"{value:.2f}" if abs(value) < 10 else f"{value:.1f}"
    return value


def _md(value):
    """A markdown table cell: a composite draft's ``|`` escaped so that it does not split the cell."""
    return value.replace("|", "\\|") if isinstance(value, str) else value


def _groups(rows: list[dict]) -> dict[tuple, list[dict]]:
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault((row["target"], row["hardware"] or "unknown hardware"), []).append(row)
    return groups


SHOWN = [(k, h) for k, h in COLUMNS if k not in GROUPED]
CONVENTIONS = (
    "One row per configuration (target, hardware, draft, γ, dynamic γ) and task: its runs merged (counters summed, so "
    "TAR and acceptance are over every run; speedup is the median over runs with min and max; tokens/s and latencies "
    "the median; a run of draft=auto is listed under the draft it resolved to). "
    "Speedup is tokens/s over plain decoding of the same requests on the same kernels, timed in the same run. TAR is "
    "tokens emitted per verification step, the target's own token included (the founding paper's TAR, vLLM's mean "
    "acceptance length); accepted/step excludes that token; acceptance by position is accepted / drafted at draft "
    "positions 0, 1, 2, ...; accuracy is the task's metric for the target (speculative decoding does not change "
    "it), draft accuracy the same task run with the draft as the target; TAR p50 of requests is the median over "
    "requests of each request's own TAR. The published rows: `bash leaderboard/reproduce.sh NAME` reruns one "
    "configuration (the names and their model_args are in the script; run it in the background, each job takes "
    "minutes to half an hour on 2 CPU cores)."
)
PLOTS = [("tokens_per_second_vs_draft_ms.png", "tokens/s against draft latency (the founding paper's Figure 8)"),
         ("tar_vs_draft_accuracy.png", "TAR against the draft's own task accuracy (the founding paper's Figure 2)"),
         ("acceptance_by_position.png", "acceptance by draft position")]


def markdown(rows: list[dict], validation: bool = False) -> str:
    """The leaderboard page; ``validation``: link the ``zoo validate`` plot published beside it."""
    out = ["# specdraft-eval leaderboard", "",
           "Generated by `zoo leaderboard` from the results files beside it; do not edit by hand.", ""]
    for (target, hw), group in _groups(rows).items():
        out += [f"## {target} on {hw}", "",
                tabulate([[_md(_cell(k, r[k])) for k, _ in SHOWN] for r in group], headers=[h for _, h in SHOWN],
                         tablefmt="github", missingval="-", disable_numparse=True), ""]
    out += ["Conventions: " + CONVENTIONS, ""] + [line for name, title in PLOTS for line in (f"![{title}]({name})", "")]
    if validation:
        out += ["## The analytical model, checked", "",
                "Predicted tokens/s (latencies from a separate profile, measured TAR) against measured tokens/s, "
                "from `zoo validate` (figures in [validation.json](validation.json)):", "",
                "![predicted against measured tokens/s](validation.png)", ""]
    return "\n".join(out)


def csv_text(rows: list[dict]) -> str:
    """Every column, floats to 4 decimals (for scripts; the pages round for people)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow([k for k, _ in COLUMNS] + ["metric"])
    for row in rows:
        writer.writerow([("" if row[k] is None else round(row[k], 4) if isinstance(row[k], float) else row[k])
                         for k, _ in COLUMNS] + [row["metric"] or ""])
    return buffer.getvalue()


HTML_HEAD = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>specdraft-eval leaderboard</title>
<style>body{font-family:sans-serif;margin:1.5em;font-size:14px}table{border-collapse:collapse;margin-bottom:1em}
th,td{border:1px solid #ccc;padding:3px 6px;text-align:right;white-space:nowrap}th{cursor:pointer;background:#f3f3f3}
td.t{text-align:left}.wrap{overflow-x:auto}img{width:100%;max-width:1100px;display:block;margin-bottom:1em}
p.note{max-width:70em;color:#444}</style>
</head><body><h1>specdraft-eval leaderboard</h1>
<p class="note">Click a column header to sort. """
HTML_SCRIPT = """<script>
document.getElementById('hardware').addEventListener('change', function (e) {
  document.querySelectorAll('section.hw').forEach(function (s) {
    s.style.display = (!e.target.value || s.getAttribute('data-hw') === e.target.value) ? '' : 'none';
  });
});
document.querySelectorAll('table.board').forEach(function (table) {
  var heads = table.querySelectorAll('th');
  heads.forEach(function (th, col) {
    th.addEventListener('click', function () {
      var body = table.querySelector('tbody');
      var rows = Array.prototype.slice.call(body.rows);
      var up = th.getAttribute('data-order') !== 'asc';
      rows.sort(function (a, b) {
        var x = a.cells[col].getAttribute('data-v'), y = b.cells[col].getAttribute('data-v');
        var nx = parseFloat(x), ny = parseFloat(y);
        var c = (!isNaN(nx) && !isNaN(ny)) ? nx - ny : x.localeCompare(y);
        return up ? c : -c;
      });
      heads.forEach(function (h) { h.removeAttribute('data-order'); });
      th.setAttribute('data-order', up ? 'asc' : 'desc');
      rows.forEach(function (r) { body.appendChild(r); });
    });
  });
});
</script></body></html>
"""


def html_page(rows: list[dict]) -> str:
    """One sortable table per target and hardware, the figures people compare first, then the plots."""
    out = [HTML_HEAD + html.escape(CONVENTIONS) + "</p>"]
    hardware = sorted({hw for _, hw in _groups(rows)})
    out.append('<p>Hardware: <select id="hardware"><option value="">all</option>'
               + "".join(f'<option>{html.escape(hw)}</option>' for hw in hardware) + "</select></p>")
    head = "".join(f"<th>{html.escape(h)}</th>" for _, h in SHOWN)
    for (target, hw), group in _groups(rows).items():
        body = []
        for row in group:
            cells = []
            for key, _ in SHOWN:
                text = "-" if row[key] is None else str(_cell(key, row[key]))
                css = ' class="t"' if isinstance(row[key], str) else ""
                cells.append(f'<td{css} data-v="{html.escape(text)}">{html.escape(text)}</td>')
            body.append("<tr>" + "".join(cells) + "</tr>")
        out += [f'<section class="hw" data-hw="{html.escape(hw)}"><h2>{html.escape(target)} on {html.escape(hw)}</h2>',
                f'<div class="wrap"><table class="board"><thead><tr>{head}</tr></thead><tbody>',
                *body, "</tbody></table></div></section>"]
    out += ["<h2>Plots</h2>"] + [f'<p>{html.escape(title)} (click for full size)</p><a href="{name}">'
                                 f'<img src="{name}" alt="{html.escape(title)}"></a>' for name, title in PLOTS]
    return "\n".join(out) + "\n" + HTML_SCRIPT


def png_bytes(fig) -> bytes:
    """A matplotlib figure as deterministic PNG bytes (no software stamp); the figure is closed."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", metadata={"Software": None})
    plt.close(fig)
    return buffer.getvalue()


def _configuration(row: dict) -> str:
    """A plot key: the draft (folders dropped from paths) with its γ, e.g. ``prompt-lookup:3 γ4 dynamic``."""
    draft = re.sub(r"[^|:]*/", "", row["draft"])
    return f"{draft} γ{row['gamma']}" + (" dynamic" if row["dynamic_gamma"] == "yes" else "")


def plots(rows: list[dict]) -> dict[str, bytes]:
    """The PNGs by file name, for the target and hardware with the most rows: tokens/s against draft latency,
    TAR against the draft's own accuracy, acceptance by position. A colour per draft, a marker per task, keys in
    legends (no text at points)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = _groups(rows)
    (target, hw), main = max(groups.items(), key=lambda item: (len(item[1]), item[0]))
    drafts = sorted({_configuration(r) for r in main})
    colour = {d: plt.get_cmap("tab20")(i % 20) for i, d in enumerate(drafts)}
    tasks = sorted({r["task"] for r in main})
    marker = {t: "osD^v<>"[i % 7] for i, t in enumerate(tasks)}

    def figure():
        fig, (ax, key) = plt.subplots(1, 2, figsize=(13, 6), dpi=100, gridspec_kw={"width_ratios": [2.2, 1.4]})
        key.axis("off")
        return fig, ax, key

    def legends(key, shown: set[str]) -> None:
        """Keys beside the plot: colour = draft and γ, marker = task."""
        from matplotlib.lines import Line2D

        first = key.legend(handles=[Line2D([], [], color=colour[d], marker="s", linestyle="", label=d)
                                    for d in drafts if d in shown], title="draft and γ", fontsize=10,
                           title_fontsize=11, loc="upper left", frameon=False)
        key.add_artist(first)
        key.legend(handles=[Line2D([], [], color="grey", marker=marker[t], linestyle="", label=t.removeprefix("specdec_"))
                            for t in tasks], title="task", fontsize=10, title_fontsize=11, loc="lower left", frameon=False)

    where = f"{target} on {hw}"
    fig, ax, key = figure()
    shown = set()
    for row in main:
        if row["draft_ms_per_token"] is not None and row["tokens_per_second"] is not None:
            ax.scatter(row["draft_ms_per_token"], row["tokens_per_second"], color=colour[_configuration(row)],
                       marker=marker[row["task"]], s=40)
            shown.add(_configuration(row))
    for task in tasks:
        plain = [r["baseline_tokens_per_second"] for r in main if r["task"] == task and r["baseline_tokens_per_second"]]
        if plain:
            ax.axhline(sorted(plain)[len(plain) // 2], color="grey", linestyle=":", linewidth=1)
    ax.set_xscale("log")
    ax.set_xlabel("draft latency (ms per drafted token, log scale)")
    ax.set_ylabel("generated tokens per second")
    ax.set_title(f"Throughput against draft latency (dotted: plain decoding)\n{where}", fontsize=11)
    legends(key, shown)
    images = {"tokens_per_second_vs_draft_ms.png": png_bytes(fig)}

    fig, ax, key = figure()
    known = [r for r in main if r["draft_accuracy"] is not None and r["tar"] is not None]
    for row in known:
        ax.scatter(row["draft_accuracy"], row["tar"], color=colour[_configuration(row)], marker=marker[row["task"]], s=40)
    if known:
        legends(key, {_configuration(r) for r in known})
        high = max(r["draft_accuracy"] for r in known)
        ax.set_xlim(-0.02, max(0.25, high * 1.2))
    else:
        ax.text(0.5, 0.5, "no draft accuracies known yet:\nevaluate a draft as a target to add it",
                ha="center", va="center", transform=ax.transAxes)
    ax.set_ylim(0.98, max([1.5] + [r["tar"] * 1.1 for r in known]))
    ax.set_xlabel("draft's own task accuracy (fraction of documents; task metric)")
    ax.set_ylabel("TAR (tokens per verification step)")
    ax.set_title(f"TAR against the draft's own accuracy\n{where}", fontsize=11)
    images["tar_vs_draft_accuracy.png"] = png_bytes(fig)

    fig, ax, key = figure()
    shown = set()
    for row in main:
        rates = row["acceptance_rate_per_position"]
        if rates:
            ax.plot(range(len(rates)), rates, marker=marker[row["task"]], color=colour[_configuration(row)], linewidth=1)
            shown.add(_configuration(row))
    ax.set_xlabel("draft position (0-based)")
    ax.set_ylabel("accepted / drafted at the position")
    ax.set_ylim(0, 1.05)
    if shown:
        legends(key, shown)
    ax.set_title(f"Acceptance by draft position\n{where}", fontsize=11)
    images["acceptance_by_position.png"] = png_bytes(fig)
    return images


def write(rows: list[dict], out: Path) -> list[Path]:
    """Render every output first, then write each file atomically into ``out``."""
    files = {"README.md": markdown(rows, (out / "validation.png").is_file()), "leaderboard.csv": csv_text(rows),
             "index.html": html_page(rows),
             **plots(rows)}
    for name, data in sorted(files.items()):
        atomic_write(out / name, data)
    return [out / name for name in sorted(files)]
