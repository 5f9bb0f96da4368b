"""``zoo leaderboard``: deterministic outputs, skipped and corrupt inputs, and the HTML in a real browser."""

from __future__ import annotations

import csv
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import run_cli
from specdraft_eval.record import SpecdecRecord
from specdraft_eval.stats import GenerationStats


def write_result(folder: Path, draft: str, tps_scale: float, task_acc: float = 0.5,
                 target: str = "smollm2-135m-instruct", baseline: bool = True) -> Path:
    stats = {
        "specdec_humaneval": GenerationStats(1, 10, 30, 12, 22, 0.1, 0.3 / tps_scale, 0.5, 1.0 / tps_scale, 22, 1.2,
                                             [10, 10, 10], [6, 4, 2], [4, 2, 2, 2], [2.2]),
        "specdec_mmlu_cot": GenerationStats(1, 10, 30, 6, 16, 0.1, 0.3, 0.5, 0.9, 16, 1.0,
                                            [10, 10, 10], [4, 2, 0], [6, 2, 2, 0], [1.6]),
    }
    if not baseline:
        for figures in stats.values():
            figures.baseline_tokens, figures.baseline_seconds = 0, 0.0
    block = SpecdecRecord.new(target, draft, 3, False, "cpu", stats).to_block()
    data = {"results": {"specdec_humaneval": {"alias": "x", "pass@1,none": task_acc, "pass@1_stderr,none": 0.1},
                        "specdec_mmlu_cot": {"exact_match,none": 0.25}},
            "config": {"specdec": block}, "date": 1764700000.0}
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"results_{re.sub(r'[^A-Za-z0-9]', '_', target + draft)}.json"
    path.write_text(json.dumps(data))
    return path


@pytest.fixture()
def results(tmp_path) -> Path:
    root = tmp_path / "results"
    for i, draft in enumerate(["prompt-lookup:3", "layers:0,1,2,3,4", "drafts/five"]):
        write_result(root / draft.replace("/", "_"), draft, 1.0 + i)
    return root


def build(results: Path, out: Path):
    return run_cli("zoo", "leaderboard", str(results), "--out", str(out))


def test_outputs_are_complete_and_deterministic(results, tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    assert build(results, first).returncode == 0
    assert build(results, second).returncode == 0
    names = sorted(p.name for p in first.iterdir())
    assert names == ["README.md", "acceptance_by_position.png", "index.html", "leaderboard.csv",
                     "tar_vs_draft_accuracy.png", "tokens_per_second_vs_draft_ms.png"]
    for name in names:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    csv_lines = (first / "leaderboard.csv").read_text().splitlines()
    assert len(csv_lines) == 1 + 6
    header = csv_lines[0].split(",")
    for column in ("target", "draft", "draft_parameters_m", "draft_layers", "task", "accuracy", "tar",
                   "accepted_per_step", "acceptance_by_position", "tar_p50", "acceptance_rate", "draft_ms_per_token", "verify_ms_per_step",
                   "tokens_per_second", "speedup", "gamma", "hardware", "date", "lm_eval", "specdraft_eval"):
        assert column in header
    readme = (first / "README.md").read_text()
    assert "## smollm2-135m-instruct on CPU" in readme
    assert "| 0.60 0.40 0.20  " in readme and "| 0.40 0.20 0.00  " in readme  # acceptance by position


def test_a_drafts_own_run_fills_its_accuracy_column_and_figures_are_rounded(results, tmp_path):
    """A run with the draft as the target and no baseline timing is the draft's accuracy, not a group of rows."""
    write_result(results / "as-target", "prompt-lookup:3", 1.0, task_acc=0.125, target="drafts/five", baseline=False)
    out = tmp_path / "out"
    assert build(results, out).returncode == 0
    rows = list(csv.DictReader((out / "leaderboard.csv").open()))
    assert len(rows) == 6 and {r["target"] for r in rows} == {"smollm2-135m-instruct"}
    accuracy = {(r["draft"], r["task"]): r["draft_accuracy"] for r in rows}
    assert accuracy[("drafts/five", "specdec_humaneval")] == "0.125"
    assert accuracy[("drafts/five", "specdec_mmlu_cot")] == "0.25"
    assert accuracy[("prompt-lookup:3", "specdec_humaneval")] == ""
    readme = (out / "README.md").read_text()
    assert "## drafts/five" not in readme
    table = [line.split("|") for line in readme.splitlines() if line.startswith("| drafts/five ")]
    header = [h.strip() for h in next(line for line in readme.splitlines() if line.startswith("| draft ")).split("|")]
    speedup, tar = (table[0][header.index(name)].strip() for name in ("speedup", "TAR"))
    assert re.fullmatch(r"\d+\.\d\d", speedup) and re.fullmatch(r"\d+\.\d\d", tar)  # two decimals, no more


BAD_FILES = {
    "corrupt": '{"config": {"specdec": ',
    "truncated": None,  # a real results file cut in half
    "foreign": json.dumps({"results": {}, "config": {"model": "hf"}}),
    "newer": None,  # schema version 99
}


def bad_file(results: Path, kind: str) -> Path:
    """Write one unusable results file of ``kind`` into ``results/other``."""
    good = next(results.rglob("results_*prompt*.json")).read_text()
    text = BAD_FILES[kind]
    if kind == "truncated":
        text = good[: len(good) // 2]
    elif kind == "newer":
        data = json.loads(good)
        data["config"]["specdec"]["schema_version"] = 99
        text = json.dumps(data)
    path = results / "other" / f"results_{kind}.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    return path


MESSAGES = {"corrupt": "not readable JSON", "truncated": "not readable JSON",
            "foreign": "no config.specdec block", "newer": "written by a newer specdraft-eval"}


@pytest.mark.parametrize("kind", list(BAD_FILES))
def test_unusable_file_in_a_folder_is_skipped_with_one_warning(results, tmp_path, kind):
    path = bad_file(results, kind)
    done = build(results, tmp_path / "out")
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stderr.splitlines() if line.startswith("zoo: warning:")]
    assert len(warnings) == 1 and str(path) in warnings[0] and MESSAGES[kind] in warnings[0]
    assert "Traceback" not in done.stderr
    assert len((tmp_path / "out" / "leaderboard.csv").read_text().splitlines()) == 1 + 6


@pytest.mark.parametrize("kind", list(BAD_FILES))
def test_unusable_named_file_is_an_error_and_nothing_is_written(results, tmp_path, kind):
    path = bad_file(results, kind)
    out = tmp_path / "out"
    done = run_cli("zoo", "leaderboard", str(path), "--out", str(out))
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("zoo: error:") and str(path) in lines[0] and MESSAGES[kind] in lines[0]
    assert not out.exists() or list(out.iterdir()) == []


def test_version_1_files_are_converted(results, tmp_path):
    path = next(results.rglob("results_*prompt*.json"))
    data = json.loads(path.read_text())
    block = data["config"]["specdec"]
    old_tar = block["per_task"]["specdec_humaneval"]["accepted_per_step"]
    block["schema_version"] = 1
    for figures in [block, *block["per_task"].values()]:  # what version 1 wrote
        figures["mean_accepted_length"], figures["tar"] = figures["tar"], figures.pop("accepted_per_step")
        del figures["counters"]
    path.write_text(json.dumps(data))
    out = tmp_path / "out"
    assert build(results, out).returncode == 0
    rows = list(csv.DictReader((out / "leaderboard.csv").open()))
    row = next(r for r in rows if r["draft"] == "prompt-lookup:3" and r["task"] == "specdec_humaneval")
    assert float(row["tar"]) == pytest.approx(old_tar + 1, abs=1e-3)
    assert float(row["accepted_per_step"]) == pytest.approx(old_tar, abs=1e-3)


@pytest.mark.skipif(shutil.which("chromium") is None, reason="Debian's chromium is not installed (.ci/run installs it)")
def test_html_page_loads_shows_every_row_and_sorts_in_headless_chromium(results, tmp_path):
    out = tmp_path / "out"
    assert build(results, out).returncode == 0
    page = (out / "index.html").read_text()
    # Click the tokens/s header twice (descending) after the page's own script ran, note whether speedup, TAR
    # and accuracy are on screen, then dump the DOM.
    probe = """<script>
var th = Array.prototype.filter.call(document.querySelectorAll('table.board th'), function (h) { return h.textContent === 'tokens/s'; })[0];
th.click(); th.click();
var seen = ['speedup', 'TAR', 'accuracy'].map(function (name) {
  var h = Array.prototype.filter.call(document.querySelectorAll('table.board th'), function (x) { return x.textContent === name; })[0];
  var box = h.getBoundingClientRect();
  return box.right <= window.innerWidth && box.bottom <= window.innerHeight;
});
document.body.setAttribute('data-visible', seen.join(','));
</script></body>"""
    (out / "probe.html").write_text(page.replace("</body>", probe))
    dom = subprocess.run(
        ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--window-size=1400,1000", f"--user-data-dir={tmp_path / 'profile'}",
         "--virtual-time-budget=3000", "--dump-dom", f"file://{out / 'probe.html'}"],
        capture_output=True, text=True, timeout=120,
    ).stdout
    rows = re.findall(r"<tr>(.*?)</tr>", dom.split("<tbody>")[1])
    assert len(rows) == 6
    assert "acceptance by position" in dom
    assert 'data-visible="true,true,true"' in dom  # speedup, TAR and accuracy without scrolling at 1400x1000
    assert all(f'<img src="{name}"' in dom for name in ("tokens_per_second_vs_draft_ms.png", "tar_vs_draft_accuracy.png"))
    col = [h for h in re.findall(r"<th[^>]*>(.*?)</th>", dom)].index("tokens/s")
    values = [float(re.findall(r'data-v="([^"]*)"', r)[col]) for r in rows]
    assert values == sorted(values, reverse=True) and values[0] > values[-1]


def test_a_composite_drafts_bar_does_not_split_its_markdown_cell(tmp_path):
    write_result(tmp_path / "results", "prompt-lookup|drafts/ngram", 1.0)
    assert build(tmp_path / "results", tmp_path / "out").returncode == 0
    rows = [line for line in (tmp_path / "out" / "README.md").read_text().splitlines() if line.startswith("| prompt")]
    assert rows and all(line.startswith("| prompt-lookup\\|drafts/ngram ") for line in rows)


def test_one_row_per_configuration_runs_merged(results, tmp_path):
    """A rerun of a configuration (or an `auto` run that resolved to it) adds a run to its row, not a row: counters
    summed, speedup the median with min and max over runs, the number of runs shown."""
    from specdraft_eval.record import scan_results
    from zoo.leaderboard import collect

    for scale in (2.0, 4.0):  # two more runs of prompt-lookup:3, faster each time
        write_result(results / f"rerun-{scale}", "prompt-lookup:3", scale)
    rows = [r for r in collect([results]) if r["draft"] == "prompt-lookup:3"]
    assert len(rows) == 2  # one per task
    by_task = {r["task"]: r for r in rows}
    humaneval = by_task["specdec_humaneval"]
    speedups = sorted(f.record.per_task["specdec_humaneval"].speedup for f in scan_results([results])
                      if f.record.draft == "prompt-lookup:3")
    assert humaneval["runs"] == 3
    assert (humaneval["speedup_min"], humaneval["speedup"], humaneval["speedup_max"]) == tuple(speedups)
    assert humaneval["documents"] == 3  # generations summed over the runs
    out = tmp_path / "page"
    assert build(results, out).returncode == 0
    lines = (out / "leaderboard.csv").read_text().splitlines()
    assert len(lines) == 1 + 6 and sum("prompt-lookup:3" in line for line in lines) == 2
