"""``zoo leaderboard``: tables (markdown, CSV, HTML) and plots from lm-eval results files.

Reads the ``config.specdec`` records (:mod:`specdraft_eval.measure.record`) that ``lm_eval --model specdec`` writes. Output is deterministic: rows
are sorted, floats rounded, and PNGs carry no software or date metadata.
"""

from __future__ import annotations

import csv
import html
import io
import re
import statistics
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from tabulate import tabulate

from specdraft_eval.errors import SpecdecError
from specdraft_eval.files import atomic_write
from specdraft_eval.measure.profiles import Calibration, read_calibration_file
from specdraft_eval.measure.record import (
    Configuration,
    ResultsFile,
    configurations,
    scan_results,
)
from specdraft_eval.measure.report import positions

COLUMNS = [
    ("target", "target"), ("hardware", "hardware"), ("draft", "draft"), ("task", "task"), ("gamma", "γ"),
    ("dynamic_gamma", "dynamic γ"),
    ("speedup", "speedup"), ("speedup_min", "speedup min"), ("speedup_max", "speedup max"), ("runs", "runs"),
    ("tar", "TAR"), ("accuracy", "accuracy"), ("draft_accuracy", "draft accuracy"),
    ("draft_bits_per_byte", "draft bits/byte"),
    ("documents", "documents"), ("tokens_per_second", "tokens/s"), ("baseline_tokens_per_second", "plain tokens/s"),
    ("draft_ms_per_token", "draft ms/token"), ("verify_ms_per_step", "verify ms/step"),
    ("acceptance_by_position", "acceptance by position"),
    ("tar_p50", "TAR p50 of requests"), ("accepted_per_step", "accepted/step"),
    ("acceptance_rate", "acceptance rate"), ("draft_parameters_m", "draft params (M)"),
    ("draft_layers", "draft layers"), ("date", "date"), ("lm_eval", "lm-eval"), ("specdraft_eval", "specdraft-eval"),
]
GROUPED = ("target", "hardware")  # headings of the page, not columns of its tables
DECIMALS = {"speedup": 2, "speedup_min": 2, "speedup_max": 2, "tar": 2, "tar_p50": 2, "accepted_per_step": 2, "acceptance_rate": 2, "accuracy": 2,
            "draft_accuracy": 2, "draft_bits_per_byte": 2, "tokens_per_second": 1, "baseline_tokens_per_second": 1, "verify_ms_per_step": 1,
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


LM_SUFFIX = "_lm"
"""A task's log-likelihood variant (``tasks/*_lm.yaml``): bits per byte of the task's reference answers."""


def lm_scores(files: list[ResultsFile]) -> dict[tuple[str, str], float]:
    """Bits per byte by (model, task) from the scoring runs (``*_lm`` tasks; the model is the run's draft with
    ``score=draft``, else its target), the median over runs; keyed by the generative task's name."""
    found: dict[tuple[str, str], list[float]] = {}
    for file in files:
        model = file.record.draft if file.record.runtime.get("score") == "draft" else file.record.target
        for task, metrics in file.results.items():
            value = metrics.get("bits_per_byte,none") if isinstance(metrics, dict) else None
            if task.endswith(LM_SUFFIX) and isinstance(value, (int, float)):
                found.setdefault((model, task.removesuffix(LM_SUFFIX)), []).append(float(value))
    return {key: statistics.median(values) for key, values in found.items()}


def collect(paths: list[Path]) -> list[dict]:
    """The leaderboard's rows: one per configuration (target, hardware, draft, γ, dynamic γ) and task, its runs
    merged. A run without baseline timing whose target is some row's draft measured that draft's own accuracy: it
    fills those rows' ``draft_accuracy`` instead of being a row itself; a scoring run (``*_lm`` tasks) fills
    ``draft_bits_per_byte`` (and ``target_bits_per_byte``, for the figures)."""
    files = scan_results(paths, scoring=True)
    rows = [row for config in configurations([f for f in files if f.record.per_task])
            for row in rows_from_configuration(config)]
    if not rows:
        raise SpecdecError("no specdec results found: run lm_eval --model specdec ... --output_path DIR first")
    drafts = {row["draft"] for row in rows}
    as_draft = [row for row in rows if row["target"] in drafts and row["speedup"] is None]
    own = {(row["target"], row["task"]): row["accuracy"] for row in as_draft}
    scores = lm_scores(files)
    rows = [row for row in rows if row not in as_draft] or rows
    for row in rows:
        row["draft_accuracy"] = own.get((row["draft"], row["task"]))
        row["draft_bits_per_byte"] = scores.get((row["draft"], row["task"]))
        row["target_bits_per_byte"] = scores.get((row["target"], row["task"]))
    return sorted(rows, key=lambda r: (r["target"], r["hardware"] or "", r["task"], -(r["speedup"] or 0),
                                       -(r["tokens_per_second"] or 0), r["draft"]))


def read_sweeps(paths: list[Path]) -> list[Calibration]:
    """Latency sweeps (``sweep*.json``: ``zoo profile --sweep --out`` or ``scripts/gpu_check.py``'s part 1) under
    the results folders, by hardware name."""
    found = [read_calibration_file(file) for root in map(Path, paths) if root.is_dir()
             for file in sorted(root.rglob("sweep*.json"))]
    return sorted(found, key=lambda sweep: sweep.hardware)


def rank_correlation(xs: list[float], ys: list[float]) -> float | None:
    """Spearman's ρ (ties share their mean rank); None for fewer than 3 points or a constant side."""
    def ranks(values: list[float]) -> list[float]:
        order = sorted(range(len(values)), key=values.__getitem__)
        out = [0.0] * len(values)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
                j += 1
            for k in range(i, j + 1):
                out[order[k]] = (i + j) / 2
            i = j + 1
        return out

    if len(xs) < 3 or len(set(xs)) < 2 or len(set(ys)) < 2:
        return None
    return statistics.correlation(ranks(xs), ranks(ys))


@dataclass(frozen=True)
class LmFinding:
    """TAR against the draft models' own language-modelling quality on one task (the founding paper's Figure 2)."""

    task: str
    points: list[dict]  # the rows with a draft bits/byte and a TAR
    tar_rho: float | None  # Spearman ρ(bits/byte, TAR): -1 when a better LM (fewer bits) always had a higher TAR
    first_rho: float | None  # the same against acceptance at the first draft position
    target_bits_per_byte: float | None


def lm_findings(rows: list[dict]) -> list[LmFinding]:
    """Per task, the model drafts whose own bits per byte were scored, and how their TAR ranks against it: one point
    per draft, its fixed-γ row where it has one (dynamic γ's TAR counts the steps it backed off to plain decoding)."""
    findings = []
    for task in sorted({r["task"] for r in rows}):
        chosen: dict[str, dict] = {}
        for row in sorted((r for r in rows if r["task"] == task and r["draft_bits_per_byte"] is not None
                           and r["tar"] is not None), key=lambda r: (r["dynamic_gamma"] == "no", -r["gamma"])):
            chosen[row["draft"]] = row  # the last wins: fixed γ over dynamic, then the smallest γ
        points = sorted(chosen.values(), key=lambda r: r["draft_bits_per_byte"])
        if not points:
            continue
        bits = [r["draft_bits_per_byte"] for r in points]
        first = [(r["acceptance_rate_per_position"] or [0.0])[0] for r in points]
        findings.append(LmFinding(task, points, rank_correlation(bits, [r["tar"] for r in points]),
                                  rank_correlation(bits, first), points[0]["target_bits_per_byte"]))
    return findings


def _rho(value: float | None) -> str:
    return "undefined" if value is None else f"{value:+.2f}"


FINDINGS_TITLE = "TAR against the draft's own language-modelling quality"
FINDINGS_INTRO = (
    "Each model draft's bits per byte on the same documents' reference answers (the task's `_lm` variant, scored by "
    "the draft itself with `score=draft`; lower is a better language model) against its TAR as a draft (with dynamic "
    "γ, steps where γ backed off to 0 count TAR 1: first-position acceptance, over drafted tokens only, measures the "
    "draft itself). Spearman's rank correlation (−1: the better the language model, the higher the TAR, always):")
FINDINGS_HEADERS = ["draft", "task", "bits/byte", "TAR", "acceptance by position", "γ", "dynamic γ"]


def _finding_lines(findings: list[LmFinding]) -> list[str]:
    """One line per task: its rank correlations."""
    lines = []
    for f in findings:
        target = f" (the target itself: {f.target_bits_per_byte:.2f} bits/byte)" if f.target_bits_per_byte else ""
        lines.append(f"{f.task.removeprefix('specdec_')}: ρ(bits/byte, TAR) = {_rho(f.tar_rho)}, ρ(bits/byte, "
                     f"first-position acceptance) = {_rho(f.first_rho)}, {len(f.points)} drafts{target}")
    return lines


def _finding_rows(findings: list[LmFinding]) -> list[list]:
    """The points behind the correlations, as table cells (:data:`FINDINGS_HEADERS`)."""
    return [[short_draft(r["draft"]), r["task"].removeprefix("specdec_"), f"{r['draft_bits_per_byte']:.2f}",
             f"{r['tar']:.2f}", positions(r["acceptance_rate_per_position"]), r["gamma"], r["dynamic_gamma"]]
            for f in findings for r in f.points]


def findings_text(findings: list[LmFinding]) -> list[str]:
    """Markdown lines: the rank correlations and the points behind them."""
    if not findings:
        return []
    table = [[_md(cell) for cell in row] for row in _finding_rows(findings)]
    return (["## " + FINDINGS_TITLE, "", FINDINGS_INTRO, ""] + [f"- {line}" for line in _finding_lines(findings)]
            + ["", tabulate(table, headers=FINDINGS_HEADERS, tablefmt="github", disable_numparse=True), ""])


def _ranges(match: re.Match) -> str:
    ids = [int(i) for i in match.group(1).split(",")]
    parts, start = [], ids[0]
    for previous, current in zip(ids, [*ids[1:], None]):
        if current != previous + 1:
            parts.append(str(start) if start == previous else f"{start}-{previous}")
            start = current
    return "layers:" + "+".join(parts)


def short_draft(name: str) -> str:
    """A draft's name for people: a layer view's list as ranges (``layers:0,1,2,29`` -> ``layers:0-2+29``)."""
    return re.sub(r"layers:(\d+(?:,\d+)*)", _ranges, name)


def _cell(key: str, value):
    """``value`` rounded to what the measurement supports, a draft's layer list as ranges (for people: markdown
    and HTML)."""
    if key == "draft":
        return short_draft(value)
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
    "it), draft accuracy the same task run with the draft as the target, draft bits/byte the draft model's own "
    "bits per byte on the task's reference answers (lower: a better language model); TAR p50 of requests is the "
    "median over requests of each request's own TAR. The published rows: `bash leaderboard/reproduce.sh NAME` reruns "
    "one configuration (the names and their model_args are in the script; run it in the background, each job takes "
    "minutes to half an hour on 2 CPU cores)."
)
SWEEP_NOTE = ("Random-weight Llama shapes (latency only, no TAR): ms per batch-1 decoding step at context 128, the "
              "median over interleaved rounds (min-max beside), from `zoo profile --sweep --out` or "
              "`scripts/gpu_check.py` (part 1).")


@dataclass(frozen=True)
class Page:
    """Everything a page shows besides the rows: the figures (file name, title), the LM findings, the latency
    sweeps, and whether ``zoo validate``'s plot lies beside it."""

    figures: list[tuple[str, str]]
    findings: list[LmFinding]
    sweeps: list[Calibration]
    validation: bool = False


def _sweep_table(sweep: Calibration) -> list[list]:
    return [[r.get("shape") or r["group"], r["layers"], r["hidden_size"], f"{r['ms_per_token']:.2f}",
             f"{r.get('ms_min', r['ms_per_token']):.2f}-{r.get('ms_max', r['ms_per_token']):.2f}"] for r in sweep.rows]


SWEEP_HEADERS = ["shape", "layers", "hidden", "ms/step", "min-max"]


def markdown(rows: list[dict], page: Page) -> str:
    """The leaderboard page in markdown."""
    out = ["# specdraft-eval leaderboard", "",
           "Generated by `zoo leaderboard` from the results files beside it; do not edit by hand.", ""]
    for (target, hw), group in _groups(rows).items():
        out += [f"## {target} on {hw}", "",
                tabulate([[_md(_cell(k, r[k])) for k, _ in SHOWN] for r in group], headers=[h for _, h in SHOWN],
                         tablefmt="github", missingval="-", disable_numparse=True), ""]
    out += ["Conventions: " + CONVENTIONS, ""] + findings_text(page.findings)
    for sweep in page.sweeps:
        out += [f"## Latency by depth and width on {sweep.hardware}", "", SWEEP_NOTE + f" The latency model's {sweep}.", "",
                tabulate(_sweep_table(sweep), headers=SWEEP_HEADERS, tablefmt="github", disable_numparse=True), ""]
    out += ["## Figures", ""] + [line for name, title in page.figures for line in (f"![{title}]({name})", "")]
    if page.validation:
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


def _html_table(headers: list[str], body: list[list]) -> str:
    """A sortable table: numbers right-aligned, text left."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    lines = []
    for cells in body:
        tds = []
        for value in cells:
            text = "-" if value is None else str(value)
            css = "" if re.fullmatch(r"[-+0-9.]+", text) else ' class="t"'
            tds.append(f'<td{css} data-v="{html.escape(text)}">{html.escape(text)}</td>')
        lines.append("<tr>" + "".join(tds) + "</tr>")
    return (f'<div class="wrap"><table class="board"><thead><tr>{head}</tr></thead><tbody>\n' + "\n".join(lines)
            + "\n</tbody></table></div>")


def html_page(rows: list[dict], page: Page) -> str:
    """One sortable table per target and hardware, the LM findings, the latency sweeps (filtered by hardware with
    the rows), then the figures."""
    out = [HTML_HEAD + html.escape(CONVENTIONS) + "</p>"]
    hardware = sorted({hw for _, hw in _groups(rows)} | {sweep.hardware for sweep in page.sweeps})
    out.append('<p>Hardware: <select id="hardware"><option value="">all</option>'
               + "".join(f'<option>{html.escape(hw)}</option>' for hw in hardware) + "</select></p>")
    for (target, hw), group in _groups(rows).items():
        body = [[None if row[key] is None else _cell(key, row[key]) for key, _ in SHOWN] for row in group]
        out += [f'<section class="hw" data-hw="{html.escape(hw)}"><h2>{html.escape(target)} on {html.escape(hw)}</h2>',
                _html_table([h for _, h in SHOWN], body), "</section>"]
    if page.findings:
        out += [f"<h2>{html.escape(FINDINGS_TITLE)}</h2>", f'<p class="note">{html.escape(FINDINGS_INTRO)}</p>',
                "<ul>" + "".join(f"<li>{html.escape(line)}</li>" for line in _finding_lines(page.findings)) + "</ul>",
                _html_table(FINDINGS_HEADERS, _finding_rows(page.findings))]
    for sweep in page.sweeps:
        out += [f'<section class="hw" data-hw="{html.escape(sweep.hardware)}"><h2>Latency by depth and width on '
                f'{html.escape(sweep.hardware)}</h2><p class="note">{html.escape(SWEEP_NOTE)} The latency model\'s '
                f'{html.escape(str(sweep))}.</p>', _html_table(SWEEP_HEADERS, _sweep_table(sweep)), "</section>"]
    figures = page.figures + ([("validation.png", "predicted against measured tokens/s (zoo validate)")]
                              if page.validation else [])
    out += ["<h2>Figures</h2>"] + [f'<p>{html.escape(title)} (click for full size)</p><a href="{name}">'
                                   f'<img src="{name}" alt="{html.escape(title)}"></a>' for name, title in figures]
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
    draft = re.sub(r"[^|:]*/", "", short_draft(row["draft"]))
    return f"{draft} γ{row['gamma']}" + (" dynamic" if row["dynamic_gamma"] == "yes" else "")


def _main(rows: list[dict]) -> tuple[str, list[dict]]:
    """The target and hardware with the most rows (the figures' subject): its name and rows."""
    (target, hw), main = max(_groups(rows).items(), key=lambda item: (len(item[1]), item[0]))
    return f"{target} on {hw}", main


ANALYTICAL_TARS = (1.25, 1.5, 2.0, 2.5, 3.0)
"""The TAR of each analytical-model curve on the speedup figure."""


def plots(rows: list[dict], findings: list[LmFinding], sweeps: list[Calibration]) -> dict[str, tuple[str, bytes]]:
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

    where, main = _main(rows)
    drafts = sorted({_configuration(r) for r in main})
    colour = {d: plt.get_cmap("tab20")(i % 20) for i, d in enumerate(drafts)}
    tasks = sorted({r["task"] for r in main})
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
    timed = [r for r in main if r["draft_ms_per_token"] and r["baseline_tokens_per_second"] and r["speedup"]]

    def in_plain_steps(row: dict, key: str) -> float:
        """``row[key]`` (ms) as a fraction of the row's plain decoding step."""
        return row[key] * row["baseline_tokens_per_second"] / 1000

    cost = [in_plain_steps(row, "draft_ms_per_token") for row in timed]
    for row, c in zip(timed, cost):
        ax.scatter(c, row["speedup"], color=colour[_configuration(row)], marker=marker[row["task"]], s=40, zorder=3)
    curves = []
    if timed:
        # the model's curves at γ 4, verification costing what it cost these runs relative to a plain step
        verify = statistics.median([in_plain_steps(r, "verify_ms_per_step") for r in timed if r["verify_ms_per_step"]]
                                   or [1.0])
        low, high = min(0.001, min(cost)), max(2.0, 1.5 * max(cost))
        xs = [low * (high / low) ** (i / 99) for i in range(100)]
        for i, tar in enumerate(ANALYTICAL_TARS):
            style = {"color": "black", "alpha": 0.3 + 0.14 * i, "linewidth": 1, "linestyle": "--"}
            ax.plot(xs, [predicted_speedup(tar, 4, x, verify, 1.0) for x in xs], **style)
            curves.append(Line2D([], [], **style, label=f"TAR {tar:g}, γ 4"))
        ax.set_xscale("log")
        ax.set_ylim(0, max(2.5, max(r["speedup"] for r in timed) * 1.1))
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
        "speedup against draft latency, with the analytical model's curves (the founding paper's Figure 8)", png_bytes(fig))

    fig, ax, key = figure()
    points = [r for f in findings for r in f.points]
    for row in points:
        ax.scatter(row["draft_bits_per_byte"], row["tar"], color=colour[_configuration(row)], marker=marker[row["task"]],
                   s=40)
    for f in findings:
        if f.target_bits_per_byte:
            ax.axvline(f.target_bits_per_byte, color="grey", linestyle=":", linewidth=1)
    if points:
        legends(ax, key, {_configuration(r) for r in points}, "upper left")
        ax.set_xscale("log")
        shown_bits = [r["draft_bits_per_byte"] for r in points] + [f.target_bits_per_byte for f in findings
                                                                   if f.target_bits_per_byte]
        ticks = [t for t in (0.2, 0.5, 1, 2, 5, 10, 20, 50, 100) if min(shown_bits) / 1.5 <= t <= max(shown_bits) * 1.5]
        ax.set_xticks(ticks, labels=[f"{t:g}" for t in ticks])
        ax.minorticks_off()
        ax.invert_xaxis()  # better language models to the right
        ax.set_ylim(0.95, max(1.5, max(r["tar"] for r in points) * 1.1))
        rho = "; ".join(f"{f.task.removeprefix('specdec_')} {_rho(f.tar_rho)} ({len(f.points)} drafts)"
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
        rates = row["acceptance_rate_per_position"]
        if rates:
            ax.plot(range(len(rates)), rates, marker=marker[row["task"]], color=colour[_configuration(row)], linewidth=1)
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
        deep = sorted((r for r in sweep.rows if r["group"] == "depth"), key=lambda r: r["layers"])
        widths = statistics.mode(r["hidden_size"] for r in deep) if deep else None
        wide = sorted((r for r in sweep.rows if r["layers"] == 4 and r["group"] in ("depth", "width")),
                      key=lambda r: r["hidden_size"])
        for ax, chosen, x in ((depth, deep, "layers"), (width, wide, "hidden_size")):
            if not chosen:
                continue
            ax.errorbar([r[x] for r in chosen], [r["ms_per_token"] for r in chosen],
                        yerr=[[r["ms_per_token"] - r.get("ms_min", r["ms_per_token"]) for r in chosen],
                              [r.get("ms_max", r["ms_per_token"]) - r["ms_per_token"] for r in chosen]],
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


def write(rows: list[dict], out: Path, sweeps: list[Calibration] | None = None) -> list[Path]:
    """Render every output first, then write each file atomically into ``out``."""
    _, main = _main(rows)
    findings = lm_findings(main)
    images = plots(rows, findings, sweeps or [])
    page = Page([(name, title) for name, (title, _) in images.items()], findings, sweeps or [],
                (out / "validation.png").is_file())
    files = {"README.md": markdown(rows, page), "leaderboard.csv": csv_text(rows), "index.html": html_page(rows, page),
             **{name: data for name, (_, data) in images.items()}}
    for name, data in sorted(files.items()):
        atomic_write(out / name, data)
    return [out / name for name in sorted(files)]


def build(paths: list[Path], out: Path) -> tuple[list[dict], list[Path]]:
    """``zoo leaderboard``: the rows and sweeps found under ``paths``, written into ``out``."""
    rows = collect(paths)
    return rows, write(rows, out, read_sweeps(paths))
