"""The leaderboard rendered: markdown, CSV and a sortable HTML page (tables, findings, latency sweeps)."""

from __future__ import annotations

import csv
import html
import io
import re
from dataclasses import dataclass

from tabulate import tabulate

from specdraft_eval.results.profiles import Calibration
from specdraft_eval.results.report import positions
from zoo.report.leaderboard.findings import LmFinding
from zoo.report.leaderboard.rows import COLUMNS, GROUPED, LeaderboardRow

DECIMALS = {"mean_acceptance_length": 2, "accept_length": 2, "mean_accepted_tokens": 2, "speedup": 2,
            "end_to_end_speedup": 2,
            "speedup_min": 2, "speedup_max": 2, "tar": 2, "tar_p50": 2, "accepted_per_step": 2, "acceptance_rate": 2,
            "accuracy": 2, "draft_accuracy": 2, "draft_bits_per_byte": 2, "tokens_per_second": 1,
            "baseline_tokens_per_second": 1, "verify_ms_per_step": 1, "draft_parameters_m": 1}
"""Decimals shown: speedup and TAR to 0.01 (their run-to-run spread here is a few percent), times to 0.1 ms."""


def rho_text(value: float | None) -> str:
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
        lines.append(f"{f.task.removeprefix('specdec_')}: ρ(bits/byte, TAR) = {rho_text(f.tar_rho)}, ρ(bits/byte, "
                     f"first-position acceptance) = {rho_text(f.first_rho)}, {len(f.points)} drafts{target}")
    return lines


def _finding_rows(findings: list[LmFinding]) -> list[list]:
    """The points behind the correlations, as table cells (:data:`FINDINGS_HEADERS`)."""
    return [[short_draft(r.draft), r.task.removeprefix("specdec_"), f"{r.draft_bits_per_byte:.2f}",
             f"{r.tar:.2f}", positions(r.acceptance_rate_per_position), r.gamma, yes_no(r.dynamic_gamma)]
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
    if isinstance(value, bool):
        return yes_no(value)
    if isinstance(value, float):
        if key in DECIMALS:
            return f"{value:.{DECIMALS[key]}f}"
        return f"{value:.2f}" if abs(value) < 10 else f"{value:.1f}"
    return value


def yes_no(value: bool) -> str:
    """A flag as the pages, the CSV and the plot keys spell it."""
    return "yes" if value else "no"


def _md(value):
    """A markdown table cell: a composite draft's ``|`` escaped so that it does not split the cell."""
    return value.replace("|", "\\|") if isinstance(value, str) else value


def groups(rows: list[LeaderboardRow]) -> dict[tuple, list[LeaderboardRow]]:
    groups: dict[tuple, list[LeaderboardRow]] = {}
    for row in rows:
        groups.setdefault((row.target, row.hardware or "unknown hardware"), []).append(row)
    return groups


SHOWN = [(k, h) for k, h in COLUMNS if k not in GROUPED]
CONVENTIONS = (
    "One row per configuration (target, hardware, draft, γ, dynamic γ, runtime: the target's dtype, CPU kernels, "
    "attention backend and static cache or compiled steps, ? where a file did not record it) and task: its runs "
    "merged, never runs of another runtime (counters summed, so "
    "TAR and acceptance are over every run; speedup is the median over runs with min and max; tokens/s and latencies "
    "the median; a run of draft=auto is listed under the draft it resolved to). "
    "Speedup is tokens/s over plain decoding of the same requests on the same kernels, timed in the same run (the "
    "two alternate which goes first), decode only; speedup end to end times the requests' wall time, the target's "
    "prefill included, as Spec-Bench does (- for runs from before plain decoding's prefill was kept); both count "
    "only the output up to the stop (tokens equals plain tokens "
    "greedily; overshoot tokens were emitted past a stop and discarded). TAR is tokens emitted per verification "
    "step, the target's own token included (the founding paper's TAR); accepted/step excludes that token; the "
    "acceptance figures are named as each engine defines them (docs/acceptance.md): acceptance by position is vLLM's "
    "(accepted at position i / drafts), conditional acceptance SPEED-Bench's (accepted at i / steps that drafted i "
    "having accepted i - 1; - where undefined or not counted by the run's code), "
    "mean acceptance length vLLM's (1 + accepted / drafts, counted before the stop as vLLM counts), accept length "
    "SGLang's (tokens / steps), mean accepted "
    "tokens Spec-Bench's and EAGLE's (tokens per target pass); accuracy is the task's metric for the target "
    "(speculative decoding does not change it), draft accuracy the same task run with the draft as the target, "
    "draft bits/byte the draft model's own "
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
    return [[r.shape or r.group, r.layers, r.hidden_size, f"{r.ms_per_token:.2f}",
             f"{r.low:.2f}-{r.high:.2f}"] for r in sweep.rows]


SWEEP_HEADERS = ["shape", "layers", "hidden", "ms/step", "min-max"]


WIDTH = 120  # the markdown page's tables fit a terminal this wide
BOARD_HEADERS = ["draft", "γ", "dyn. γ", "runtime", "speedup", "TAR", "accuracy"]
BOARD_NOTE = ("Each task's table shows the figures a reader compares; every column (tokens/s, latencies, acceptance "
              "as each engine defines it, token counts, versions) is in [leaderboard.csv](leaderboard.csv) and the "
              "sortable [index.html](index.html). Speedup: the median over runs, [min-max] where there were several; "
              "dyn. γ: dynamic γ; "
              "drafts in `leaderboard/drafts/` are named by their folder here.")


def _board_draft(name: str, width: int) -> str:
    """A draft's name in the markdown table: the drafts folder left out, the middle elided beyond ``width``."""
    name = short_draft(name).replace("leaderboard/drafts/", "")
    return name if len(name) <= width else name[: width // 2 - 1] + "…" + name[-(width - width // 2):]


def _board_row(row: LeaderboardRow, draft_width: int) -> list:
    spread = (f" [{_cell('speedup_min', row.speedup_min)}-{_cell('speedup_max', row.speedup_max)}]"
              if row.speedup_min is not None and row.runs > 1 else "")
    speedup = None if row.speedup is None else f"{_cell('speedup', row.speedup)}{spread}"
    return [_md(_board_draft(row.draft, draft_width)), row.gamma, _cell("dynamic_gamma", row.dynamic_gamma),
            row.runtime, speedup, _cell("tar", row.tar), _cell("accuracy", row.accuracy)]


def board_table(group: list[LeaderboardRow]) -> str:
    """One task's rows as a markdown table no wider than :data:`WIDTH` (the draft column takes what is left)."""
    def table(draft_width: int) -> str:
        body = [["-" if cell is None else str(cell) for cell in _board_row(r, draft_width)] for r in group]
        widths = [max(map(len, column)) for column in zip(BOARD_HEADERS, *body)]
        lines = [BOARD_HEADERS, ["-" * w for w in widths], *body]
        return "\n".join("| " + " | ".join(c.ljust(w) for c, w in zip(line, widths)) + " |" for line in lines)

    draft_width = max(len(short_draft(r.draft)) for r in group)
    while draft_width > 12 and max(map(len, table(draft_width).splitlines())) > WIDTH:
        draft_width -= 1
    return table(draft_width)


def markdown(rows: list[LeaderboardRow], page: Page) -> str:
    """The leaderboard page in markdown: per target and hardware, a table per task that fits :data:`WIDTH`."""
    out = ["# specdraft-eval leaderboard", "",
           "Generated by `zoo leaderboard` from the results files beside it; do not edit by hand.", "", BOARD_NOTE,
           ""]
    for (target, hw), group in groups(rows).items():
        out += [f"## {target} on {hw}", ""]
        for task in dict.fromkeys(r.task for r in group):
            out += [f"### {task}", "", board_table([r for r in group if r.task == task]), ""]
    out += ["Conventions: " + CONVENTIONS, ""] + findings_text(page.findings)
    for sweep in page.sweeps:
        out += [f"## Latency by depth and width on {sweep.hardware}", "", SWEEP_NOTE + f" The latency model's {sweep}.",
                "",
                tabulate(_sweep_table(sweep), headers=SWEEP_HEADERS, tablefmt="github", disable_numparse=True), ""]
    out += ["## Figures", ""] + [line for name, title in page.figures for line in (f"![{title}]({name})", "")]
    if page.validation:
        out += ["## The analytical model, checked", "",
                "Predicted speedup over plain decoding (each repeat's own profile and loop time, the runs' counts) "
                "against the speedup measured over plain decoding interleaved with the runs, from `zoo validate` "
                "(figures, tokens/s beside them, in [validation.json](validation.json)):", "",
                "![predicted against measured speedup](validation.png)", ""]
    return "\n".join(out)


def _csv_cell(value):
    if value is None:
        return ""
    if isinstance(value, bool):
        return yes_no(value)
    return round(value, 4) if isinstance(value, float) else value


def csv_text(rows: list[LeaderboardRow]) -> str:
    """Every column, floats to 4 decimals (for scripts; the pages round for people)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow([k for k, _ in COLUMNS] + ["metric"])
    for row in rows:
        writer.writerow([_csv_cell(getattr(row, k)) for k, _ in COLUMNS] + [row.metric or ""])
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


def html_page(rows: list[LeaderboardRow], page: Page) -> str:
    """One sortable table per target and hardware, the LM findings, the latency sweeps (filtered by hardware with
    the rows), then the figures."""
    out = [HTML_HEAD + html.escape(CONVENTIONS) + "</p>"]
    hardware = sorted({hw for _, hw in groups(rows)} | {sweep.hardware for sweep in page.sweeps})
    out.append('<p>Hardware: <select id="hardware"><option value="">all</option>'
               + "".join(f'<option>{html.escape(hw)}</option>' for hw in hardware) + "</select></p>")
    for (target, hw), group in groups(rows).items():
        body = [[None if getattr(row, key) is None else _cell(key, getattr(row, key)) for key, _ in SHOWN]
                for row in group]
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
    figures = page.figures + ([("validation.png", "predicted against measured speedup (zoo validate)")]
                              if page.validation else [])
    out += ["<h2>Figures</h2>"] + [f'<p>{html.escape(title)} (click for full size)</p><a href="{name}">'
                                   f'<img src="{name}" alt="{html.escape(title)}"></a>' for name, title in figures]
    return "\n".join(out) + "\n" + HTML_SCRIPT
