"""``zoo leaderboard``: deterministic outputs, skipped and corrupt inputs, and the HTML in a real browser."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import run_cli
from specdraft_eval.report import specdec_block
from specdraft_eval.stats import GenerationStats


def write_result(folder: Path, draft: str, tps_scale: float, task_acc: float = 0.5) -> Path:
    stats = {
        "specdec_humaneval": GenerationStats(1, 10, 30, 12, 22, 0.1, 0.3 / tps_scale, 0.5, 1.0 / tps_scale, 22, 1.2),
        "specdec_mmlu_cot": GenerationStats(1, 10, 30, 6, 16, 0.1, 0.3, 0.5, 0.9, 16, 1.0),
    }
    block = specdec_block("smollm2-135m-instruct", draft, 3, False, "cpu", stats)
    data = {"results": {"specdec_humaneval": {"alias": "x", "pass@1,none": task_acc, "pass@1_stderr,none": 0.1},
                        "specdec_mmlu_cot": {"exact_match,none": 0.25}},
            "config": {"specdec": block}, "date": 1764700000.0}
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"results_{re.sub(r'[^A-Za-z0-9]', '_', draft)}.json"
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
    assert names == ["README.md", "index.html", "leaderboard.csv", "tar_vs_draft_accuracy.png",
                     "tokens_per_second_vs_draft_ms.png"]
    for name in names:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    csv_lines = (first / "leaderboard.csv").read_text().splitlines()
    assert len(csv_lines) == 1 + 6
    header = csv_lines[0].split(",")
    for column in ("target", "draft", "draft_parameters_m", "draft_layers", "task", "accuracy", "tar",
                   "mean_accepted_length", "acceptance_rate", "draft_ms_per_token", "verify_ms_per_step",
                   "tokens_per_second", "speedup", "gamma", "hardware", "date", "lm_eval", "specdraft_eval"):
        assert column in header
    assert "## smollm2-135m-instruct on CPU" in (first / "README.md").read_text()


def test_skips_foreign_and_unknown_schema_files_with_a_warning(results, tmp_path):
    (results / "other").mkdir()
    (results / "other" / "results_hf.json").write_text(json.dumps({"results": {}, "config": {"model": "hf"}}))
    future = json.loads(next(results.rglob("results_prompt*.json")).read_text())
    future["config"]["specdec"]["schema_version"] = 99
    (results / "other" / "results_future.json").write_text(json.dumps(future))
    done = build(results, tmp_path / "out")
    assert done.returncode == 0
    assert "results_hf.json: no config.specdec block" in done.stderr
    assert "results_future.json: unknown specdec schema version 99" in done.stderr


def test_corrupt_file_is_an_error_and_nothing_is_written(results, tmp_path):
    (results / "results_broken.json").write_text('{"config": {"specdec": ')
    out = tmp_path / "out"
    done = build(results, out)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("zoo: error: corrupt results file") and "results_broken.json" in last
    assert not out.exists() or list(out.iterdir()) == []


@pytest.mark.skipif(shutil.which("chromium") is None, reason="Debian's chromium is not installed (.ci/run installs it)")
def test_html_page_loads_shows_every_row_and_sorts_in_headless_chromium(results, tmp_path):
    out = tmp_path / "out"
    assert build(results, out).returncode == 0
    page = (out / "index.html").read_text()
    # Click the tokens/s header twice (descending) after the page's own script ran, then dump the DOM.
    probe = """<script>
var th = Array.prototype.filter.call(document.querySelectorAll('#board th'), function (h) { return h.textContent === 'tokens/s'; })[0];
th.click(); th.click();
</script></body>"""
    (out / "probe.html").write_text(page.replace("</body>", probe))
    dom = subprocess.run(
        ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}",
         "--virtual-time-budget=3000", "--dump-dom", f"file://{out / 'probe.html'}"],
        capture_output=True, text=True, timeout=120,
    ).stdout
    rows = re.findall(r"<tr>(.*?)</tr>", dom.split("<tbody>")[1])
    assert len(rows) == 6
    col = [h for h in re.findall(r"<th[^>]*>(.*?)</th>", dom)].index("tokens/s")
    values = [float(re.findall(r'data-v="([^"]*)"', r)[col]) for r in rows]
    assert values == sorted(values, reverse=True) and values[0] > values[-1]
