"""``zoo leaderboard``: deterministic outputs, skipped and corrupt inputs, and the HTML in a real browser."""

from __future__ import annotations

import csv
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from support import RUNTIME, run_cli, write_result

from specdraft_eval.errors import SpecdecError
from specdraft_eval.results.record import Runtime, SpecdecRecord, read_results


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
                     "speedup_vs_draft_latency.png", "tar_vs_draft_bits_per_byte.png"]
    for name in names:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    csv_lines = (first / "leaderboard.csv").read_text().splitlines()
    assert len(csv_lines) == 1 + 6
    header = csv_lines[0].split(",")
    for column in ("target", "draft", "draft_parameters_m", "draft_layers", "task", "accuracy", "tar",
                   "accepted_per_step", "acceptance_by_position", "tar_p50", "acceptance_rate", "draft_ms_per_token",
                   "verify_ms_per_step",
                   "tokens_per_second", "speedup", "gamma", "hardware", "date", "lm_eval", "specdraft_eval"):
        assert column in header
    readme = (first / "README.md").read_text()
    assert "## smollm2-135m-instruct on CPU" in readme
    page = (first / "index.html").read_text()  # acceptance by position: the HTML page and the CSV, not the markdown
    assert ">0.60 0.40 0.20</td>" in page and ">0.40 0.20 0.00</td>" in page
    assert "| layers:0-4 " in readme and "\"layers:0,1,2,3,4\"" in "\n".join(csv_lines)  # ranges for people, ids in CSV
    assert "### specdec_humaneval" in readme and "### specdec_mmlu_cot" in readme  # a table per task
    assert max(len(line) for line in readme.splitlines() if line.startswith("|")) <= 120


def test_the_markdown_tables_fit_120_columns_whatever_the_drafts_names(results, tmp_path):
    """A composite of long paths is elided in its middle in the markdown (whole in the CSV and the HTML page)."""
    long = "prompt-lookup:2-3|eagle:/a/very/long/folder/of/someones/own/drafts/an-eagle-head-for-this-target@2x4"
    write_result(results / "long", long, 1.3)
    out = tmp_path / "out"
    assert build(results, out).returncode == 0
    readme = (out / "README.md").read_text()
    tables = [line for line in readme.splitlines() if line.startswith("|")]
    assert max(map(len, tables)) <= 120
    elided = [line for line in tables if "…" in line]
    assert elided and all(line.startswith("| prompt-lookup:2-3") and "@2x4 " in line for line in elided)
    assert long in (out / "leaderboard.csv").read_text() and long in (out / "index.html").read_text()


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
    assert len(lines) == 1 and lines[0].startswith("zoo: error:")
    assert str(path) in lines[0] and MESSAGES[kind] in lines[0]
    assert not out.exists() or list(out.iterdir()) == []


def test_version_1_files_are_converted_and_left_off_the_board(results, tmp_path):
    path = next(results.rglob("results_*prompt*.json"))
    data = json.loads(path.read_text())
    block = data["config"]["specdec"]
    old_tar = block["per_task"]["specdec_humaneval"]["accepted_per_step"]
    block["schema_version"] = 1
    for figures in [block, *block["per_task"].values()]:  # what version 1 wrote
        figures["mean_accepted_length"], figures["tar"] = figures["tar"], figures.pop("accepted_per_step")
        del figures["counters"]
    path.write_text(json.dumps(data))
    record = read_results(path).record
    assert record.per_task["specdec_humaneval"].tar == pytest.approx(old_tar + 1, abs=1e-3)
    assert record.per_task["specdec_humaneval"].accepted_per_step == pytest.approx(old_tar, abs=1e-3)
    assert not record.current  # read, but measured by older code: left off the board, with a warning
    out = tmp_path / "out"
    done = build(results, out)
    assert done.returncode == 0 and "measured by older code" in done.stderr and str(path) in done.stderr
    rows = list(csv.DictReader((out / "leaderboard.csv").open()))
    assert rows and not any(r["draft"] == "prompt-lookup:3" for r in rows)


@pytest.mark.skipif(shutil.which("chromium") is None, reason="Debian's chromium is not installed (.ci/run installs it)")
def test_html_page_loads_shows_every_row_and_sorts_in_headless_chromium(results, tmp_path):
    out = tmp_path / "out"
    assert build(results, out).returncode == 0
    page = (out / "index.html").read_text()
    # Click the tokens/s header twice (descending) after the page's own script ran, note whether speedup, TAR
    # and accuracy are on screen, then dump the DOM.
    probe = """<script>
var th = Array.prototype.filter.call(document.querySelectorAll('table.board th'),
                                    function (h) { return h.textContent === 'tokens/s'; })[0];
th.click(); th.click();
var seen = ['speedup', 'TAR', 'accuracy'].map(function (name) {
  var h = Array.prototype.filter.call(document.querySelectorAll('table.board th'),
                                      function (x) { return x.textContent === name; })[0];
  var box = h.getBoundingClientRect();
  return box.right <= window.innerWidth && box.bottom <= window.innerHeight;
});
document.body.setAttribute('data-visible', seen.join(','));
</script></body>"""
    (out / "probe.html").write_text(page.replace("</body>", probe))
    dom = subprocess.run(
        ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--window-size=1400,1000",
         f"--user-data-dir={tmp_path / 'profile'}",
         "--virtual-time-budget=3000", "--dump-dom", f"file://{out / 'probe.html'}"],
        capture_output=True, text=True, timeout=120,
    ).stdout
    rows = re.findall(r"<tr>(.*?)</tr>", dom.split("<tbody>")[1])
    assert len(rows) == 6
    assert "acceptance by position" in dom
    assert 'data-visible="true,true,true"' in dom  # speedup, TAR and accuracy without scrolling at 1400x1000
    assert all(f'<img src="{name}"' in dom for name in ("speedup_vs_draft_latency.png",
                                                        "tar_vs_draft_bits_per_byte.png"))
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
    from specdraft_eval.results.record import scan_results
    from zoo.report.leaderboard.rows import collect

    for scale in (2.0, 4.0):  # two more runs of prompt-lookup:3, faster each time
        write_result(results / f"rerun-{scale}", "prompt-lookup:3", scale)
    rows = [r for r in collect([results]) if r.draft == "prompt-lookup:3"]
    assert len(rows) == 2  # one per task
    by_task = {r.task: r for r in rows}
    humaneval = by_task["specdec_humaneval"]
    speedups = sorted(f.record.per_task["specdec_humaneval"].speedup for f in scan_results([results])
                      if f.record.draft == "prompt-lookup:3")
    assert humaneval.runs == 3
    assert (humaneval.speedup_min, humaneval.speedup, humaneval.speedup_max) == tuple(speedups)
    assert humaneval.documents == 3  # generations summed over the runs
    out = tmp_path / "page"
    assert build(results, out).returncode == 0
    lines = (out / "leaderboard.csv").read_text().splitlines()
    assert len(lines) == 1 + 6 and sum("prompt-lookup:3" in line for line in lines) == 2


EAGER = Runtime("float32", "onednn", False, False, "sdpa")


@pytest.mark.parametrize("other", [Runtime("bfloat16", "onednn", False, False, "sdpa"),
                                   Runtime("float32", "plain", False, False, "sdpa"),
                                   Runtime("float32", "plain", True, True, "sdpa"),
                                   Runtime("float32", "onednn", False, False, "eager")],
                         ids=["dtype", "kernels", "compiled", "attention"])
def test_runs_of_another_runtime_are_another_row_and_never_merge(tmp_path, other):
    """Runs alike but for the dtype, the kernels, compiled steps or the attention backend: two rows each (one per
    task), every figure their own, and the records refuse to merge."""
    from specdraft_eval.results.record import read_results
    from zoo.report.leaderboard.rows import collect

    first = write_result(tmp_path / "a", "prompt-lookup:3", 1.0, runtime=EAGER)
    second = write_result(tmp_path / "b", "prompt-lookup:3", 3.0, runtime=other)
    rows = collect([tmp_path])
    assert len(rows) == 4 and {r.runtime for r in rows} == {str(EAGER), str(other)}
    assert all(r.runs == 1 and r.speedup_min == r.speedup_max for r in rows)
    assert str(EAGER) == "float32 onednn sdpa" and (not other.compile or str(other).endswith(" compiled"))
    with pytest.raises(SpecdecError, match="cannot merge records of different runs"):
        read_results(first).record.merge(read_results(second).record)
    assert read_results(second).record.runtime == other  # written and read back whole


def write_score(folder: Path, model: str, bits: dict[str, float], as_draft: bool = True) -> Path:
    """A scoring run (the tasks' ``_lm`` variants): ``model`` scored as the draft (``score=draft``) or the target."""
    block = SpecdecRecord.new("smollm2-135m-instruct" if as_draft else model, model if as_draft else "prompt-lookup", 4,
                              False, "cpu", {}, score="draft" if as_draft else "target", runtime=RUNTIME).to_block()
    data = {"results": {f"{task}_lm": {"bits_per_byte,none": value, "bits_per_byte_stderr,none": "N/A"}
                        for task, value in bits.items()}, "config": {"specdec": block}, "date": 1764700000.0}
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"results_{re.sub(r'[^A-Za-z0-9]', '_', model)}.json"
    path.write_text(json.dumps(data))
    return path


def test_rank_correlation_is_spearmans_with_ties():
    from scipy.stats import spearmanr

    from zoo.report.leaderboard.findings import rank_correlation

    xs, ys = [3.0, 1.0, 2.0, 2.0, 5.0, 0.5], [1.0, 1.5, 1.0, 2.0, 1.0, 3.0]
    assert rank_correlation(xs, ys) == pytest.approx(spearmanr(xs, ys).statistic)
    assert rank_correlation([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert rank_correlation([1, 2, 3], [1, 1, 1]) is None and rank_correlation([1, 2], [1, 2]) is None


def test_scoring_runs_give_draft_bits_per_byte_and_the_rank_correlation(tmp_path):
    """Model drafts scored on their own (score=draft) fill `draft bits/byte`; the page prints Spearman's ρ between
    it and TAR per task and plots it; the scoring runs are not rows."""
    from scipy.stats import spearmanr

    root = tmp_path / "results"
    drafts = {"layers:0,1": (9.0, 0), "layers:0-9": (6.0, 2), "drafts/five": (2.0, 12), "drafts/six": (3.0, 8)}
    for draft, (bits, accepted) in drafts.items():
        write_result(root / draft.replace("/", "_"), draft, 1.0, accepted=accepted)
        write_score(root / f"lm_{draft.replace('/', '_')}", draft, {"specdec_humaneval": bits})
    write_result(root / "pl", "prompt-lookup:3", 1.0, accepted=20)  # not a model: no bits/byte, no point
    write_result(root / "five-dynamic", "drafts/five", 1.0, accepted=0, dynamic=True)  # a second row, not a point
    write_score(root / "lm_target", "smollm2-135m-instruct", {"specdec_humaneval": 0.3}, as_draft=False)
    from specdraft_eval.results.record import scan_results

    assert len(scan_results([root])) == 6 and len(scan_results([root], scoring=True)) == 11  # rank etc. skip them
    out = tmp_path / "out"
    assert build(root, out).returncode == 0
    rows = list(csv.DictReader((out / "leaderboard.csv").open()))
    assert len(rows) == 2 * 6  # five configurations, two tasks each; the scoring runs add none
    bits = {r["draft"]: r["draft_bits_per_byte"] for r in rows if r["task"] == "specdec_humaneval"
            and r["dynamic_gamma"] == "no"}
    assert bits == {"layers:0,1": "9.0", "layers:0-9": "6.0", "drafts/five": "2.0", "drafts/six": "3.0",
                    "prompt-lookup:3": ""}
    expected = spearmanr([b for b, _ in drafts.values()], [1 + a / 10 for _, a in drafts.values()]).statistic
    readme = (out / "README.md").read_text()
    assert f"humaneval: ρ(bits/byte, TAR) = {expected:+.2f}" in readme and "4 drafts" in readme
    assert "(the target itself: 0.30 bits/byte)" in readme
    assert "mmlu_cot: ρ" not in readme  # no draft was scored on it
    assert "ρ(bits/byte, TAR)" in (out / "index.html").read_text()


def test_latency_sweeps_beside_the_results_are_a_table_and_a_figure(results, tmp_path):
    """A sweep file (zoo profile --sweep --out, or gpu_check.py's part 1) adds a latency table for its hardware
    (a choice in the page's hardware filter) and the latency-vs-depth-and-width figure."""
    from specdraft_eval.files import write_json
    from specdraft_eval.results.profiles import SweepRow
    from zoo.measure.latency_model import fit_sweep

    rows = [SweepRow(group, layers, hidden, layers * hidden * hidden * 24, 1.0 + 0.6 * layers + hidden / 8192, 0.9,
                     30.0)
            for group, layers, hidden in [("depth", n, 4096) for n in (1, 2, 4, 8)] + [("width", 4, 1024), ("width", 4,
                                                                                                            8192)]]
    write_json(results / "sweeps" / "sweep_h200.json", fit_sweep(rows, "h200", "NVIDIA H200", 2).to_json())
    out = tmp_path / "out"
    assert build(results, out).returncode == 0
    assert (out / "latency_vs_depth_and_width.png").stat().st_size > 10_000
    readme = (out / "README.md").read_text()
    assert "## Latency by depth and width on NVIDIA H200" in readme and "latency only, no TAR" in readme
    assert "![latency against depth and width" in readme
    page = (out / "index.html").read_text()
    assert "<option>NVIDIA H200</option>" in page and 'data-hw="NVIDIA H200"' in page


@pytest.mark.parametrize("row, field", [
    ({"group": "depth", "layers": "four", "hidden_size": 512, "weight_bytes": 1, "ms_per_token": 1.0}, "layers"),
    ({"group": "depth", "layers": 4, "hidden_size": 512, "weight_bytes": 1}, "ms_per_token"),
    ("not a row", "not an object"),
])
def test_a_malformed_sweep_file_is_one_line_naming_the_file_and_the_field(results, tmp_path, row, field):
    from specdraft_eval.files import write_json
    from specdraft_eval.results.profiles import CALIBRATION_KIND, CALIBRATION_SCHEMA_VERSION

    sweep = results / "sweeps" / "sweep_bad.json"
    write_json(sweep, {"kind": CALIBRATION_KIND, "schema_version": CALIBRATION_SCHEMA_VERSION, "name": "bad",
                       "per_layer_ms": 0.5, "bandwidth_gb_s": None, "rows": [row]})
    out = tmp_path / "out"
    done = build(results, out)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and str(sweep) in lines[0] and field in lines[0], done.stderr
    assert not out.exists()  # nothing half-written


def test_the_published_board_rebuilds_byte_identical_from_its_results(tmp_path):
    """`zoo leaderboard leaderboard/results` (reproduce.sh's last step) gives the committed pages and figures byte for
    byte: a refactoring that changes a figure, a row or its order shows here (zoo validate's files, which the board
    shows where it finds them, are copied in first, as they sit beside the committed board)."""
    from zoo.report import leaderboard as board

    published = Path(__file__).resolve().parents[1] / "leaderboard"
    for name in ("validation.json", "validation.png"):
        shutil.copy(published / name, tmp_path / name)
    _, files = board.build([published / "results"], tmp_path)
    made = sorted(p.name for p in files if p.suffix in (".md", ".csv", ".html", ".png"))
    assert {"README.md", "leaderboard.csv", "index.html"} <= set(made) and len(made) >= 6
    for name in made:
        assert (tmp_path / name).read_bytes() == (published / name).read_bytes(), f"{name} differs from leaderboard/"
    stale = {p.name for p in published.glob("*.png")} - set(made) - {"validation.png"}
    assert not stale, f"figures the board no longer makes: {sorted(stale)}"
