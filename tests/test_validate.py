"""``zoo validate``: the prediction uses a separate profile and the run's counts, never the run's seconds."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from conftest import run_cli, save_tiny
from specdraft_eval.analytical import Latencies, predicted_from_latencies, steps_by_draft_length
from specdraft_eval.stats import GenerationStats
from test_zoo_cli import assert_one_line_error
from zoo.validate import deviation

LATENCIES = Latencies({0: 40.0, 1: 45.0, 2: 50.0, 3: 55.0, 4: 60.0}, t_draft_ms=5.0, draft_prefill_ms_per_token=0.1)


def run_counts(**seconds) -> GenerationStats:
    return GenerationStats(generations=2, steps=12, draft_tokens=10 + 8 + 5 + 5, accepted_tokens=16,
                           generated_tokens=30, prompt_tokens=100, drafted_per_position=[10, 8, 5, 5],
                           accepted_per_position=[8, 4, 2, 2], acceptance_length_histogram=[4, 4, 2, 0, 2], **seconds)


def test_draft_length_mix_from_per_position_counts():
    # 12 steps; 10 drafted >= 1 token, 8 >= 2, 5 >= 3, 5 >= 4
    assert steps_by_draft_length([10, 8, 5, 5], 12) == {0: 2, 1: 2, 2: 3, 4: 5}


def test_hand_worked_prediction():
    # 2·40 + 2·(5 + 45) + 3·(2·5 + 50) + 5·(4·5 + 60) = 760 ms of steps, + 100 prompt tokens · 0.1 ms = 770 ms
    assert predicted_from_latencies(run_counts(), LATENCIES) == pytest.approx(30 / 0.770)


def test_prediction_never_reads_the_runs_own_seconds():
    fast = run_counts(draft_seconds=0.1, verify_seconds=0.2, decode_seconds=0.31, prefill_seconds=0.05)
    slow = replace(fast, draft_seconds=90.0, verify_seconds=120.0, decode_seconds=500.0, prefill_seconds=9.0)
    assert predicted_from_latencies(fast, LATENCIES) == predicted_from_latencies(slow, LATENCIES)
    assert predicted_from_latencies(fast, replace(LATENCIES, t_draft_ms=10.0)) < predicted_from_latencies(fast, LATENCIES)


def test_missing_verify_size_gives_no_prediction():
    partial = replace(LATENCIES, t_verify_ms={0: 40.0, 1: 45.0})
    assert predicted_from_latencies(run_counts(), partial) is None


def test_deviation_is_a_signed_fraction():
    assert deviation(103.0, 100.0) == pytest.approx(0.03)
    assert deviation(95.0, 100.0) == pytest.approx(-0.05)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return save_tiny(tmp_path_factory.mktemp("validate") / "target", layers=4)


def test_validate_cli_rows_plot_and_figures(tiny, tmp_path):
    plot = tmp_path / "out" / "validation.png"
    done = run_cli("zoo", "validate", "--target", str(tiny), "--drafts", "prompt-lookup", "--drafts", "layers:0-1",
                   "--prompts", "1", "--repeats", "2", "--gamma", "1,2", "--max-new-tokens", "8", "--plot", str(plot),
                   "--json", env={"SPECDRAFT_EVAL_CACHE": str(tmp_path / "cache")})
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(done.stdout)
    assert {(r["draft"], r["gamma"]) for r in rows} == {(d, g) for d in ("prompt-lookup:3", "layers:0,1") for g in (1, 2)}
    for row in rows:
        assert {"draft", "gamma", "predicted_tokens_per_second", "measured_tokens_per_second", "deviation"} <= set(row)
        assert row["predicted_min"] <= row["predicted_tokens_per_second"] <= row["predicted_max"]
        assert row["measured_min"] <= row["measured_tokens_per_second"] <= row["measured_max"]
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    saved = json.loads(plot.with_suffix(".json").read_text())
    assert saved["rows"] == rows and saved["max_abs_deviation"] == max(abs(r["deviation"]) for r in rows)


def test_validate_bad_input(tiny):
    assert_one_line_error(run_cli("zoo", "validate", "--target", str(tiny), "--prompts", "0"), "--prompts 0 must be >= 1")
    assert_one_line_error(run_cli("zoo", "validate", "--target", str(tiny), "--prompts", "200"), "leaves too few")
