"""``zoo leaderboard``: results files -> rows (:mod:`.rows`), the drafts' LM findings (:mod:`.findings`), the pages
(:mod:`.render`) and the figures (:mod:`.figures`), each written atomically."""

from __future__ import annotations

from pathlib import Path

from specdraft_eval.files import atomic_write
from specdraft_eval.results.profiles import Calibration
from zoo.report.leaderboard.figures import main_group, plots
from zoo.report.leaderboard.findings import lm_findings
from zoo.report.leaderboard.render import Page, csv_text, html_page, markdown
from zoo.report.leaderboard.rows import LeaderboardRow, collect, read_sweeps


def write(rows: list[LeaderboardRow], out: Path, sweeps: list[Calibration] | None = None) -> list[Path]:
    """Render every output first, then write each file atomically into ``out``."""
    _, main = main_group(rows)
    findings = lm_findings(main)
    images = plots(rows, findings, sweeps or [])
    page = Page([(name, title) for name, (title, _) in images.items()], findings, sweeps or [],
                (out / "validation.png").is_file())
    files = {"README.md": markdown(rows, page), "leaderboard.csv": csv_text(rows), "index.html": html_page(rows, page),
             **{name: data for name, (_, data) in images.items()}}
    for name, data in sorted(files.items()):
        atomic_write(out / name, data)
    return [out / name for name in sorted(files)]


def build(paths: list[Path], out: Path) -> tuple[list[LeaderboardRow], list[Path]]:
    """``zoo leaderboard``: the rows and sweeps found under ``paths``, written into ``out``."""
    rows = collect(paths)
    return rows, write(rows, out, read_sweeps(paths))
