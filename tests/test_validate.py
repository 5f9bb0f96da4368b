"""``zoo validate``: the prediction uses a separate profile and the run's counts, never the run's seconds."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from support import assert_one_line_error, run_cli

from specdraft_eval.measure.analytical import (
    Latencies,
    predicted_from_latencies,
    steps_by_draft_length,
)
from specdraft_eval.measure.stats import GenerationStats
from zoo.measure.validate import (
    PLAIN,
    Request,
    Sitting,
    composite_latencies,
    context_buckets,
    deviation,
    measured,
    predicted,
)

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
    # the loop's own 1 ms in each of the 12 steps
    assert predicted_from_latencies(run_counts(), replace(LATENCIES, loop_ms_per_step=1.0)) == pytest.approx(30 / 0.782)


def test_a_tree_step_is_charged_its_nodes_not_its_depth():
    stats = GenerationStats()
    for nodes, depth, accepted in [(4, 2, 2), (4, 3, 1), (2, 1, 0)]:  # 4-node trees 2-3 deep, a 2-node one
        stats.record_step(nodes, accepted, depth)
    stats.generated_tokens = 3 + 3
    assert stats.drafted_histogram == [0, 0, 1, 0, 2] and stats.drafted_per_position == [3, 2, 1]
    assert stats.trees and stats.tar_at(2) is None and not run_counts().trees  # no chain estimate for a tree
    # 2·(4·5 + 60) + (2·5 + 50) = 220 ms (charged by depth it would be 155 ms)
    assert predicted_from_latencies(stats, LATENCIES) == pytest.approx(6 / 0.220)


def test_prediction_never_reads_the_runs_own_seconds():
    fast = run_counts(draft_seconds=0.1, verify_seconds=0.2, decode_seconds=0.31, prefill_seconds=0.05)
    slow = replace(fast, draft_seconds=90.0, verify_seconds=120.0, decode_seconds=500.0, prefill_seconds=9.0)
    assert predicted_from_latencies(fast, LATENCIES) == predicted_from_latencies(slow, LATENCIES)
    assert predicted_from_latencies(fast, replace(LATENCIES, t_draft_ms=10.0)) < predicted_from_latencies(fast,
                                                                                                          LATENCIES)


def test_missing_verify_size_gives_no_prediction():
    partial = replace(LATENCIES, t_verify_ms={0: 40.0, 1: 45.0})
    assert predicted_from_latencies(run_counts(), partial) is None


def test_deviation_is_a_signed_fraction():
    assert deviation(103.0, 100.0) == pytest.approx(0.03)
    assert deviation(95.0, 100.0) == pytest.approx(-0.05)


def test_validate_cli_rows_plot_and_figures(tiny, tmp_path):
    plot = tmp_path / "out" / "validation.png"
    done = run_cli("zoo", "validate", "--target", str(tiny), "--drafts", "prompt-lookup", "--drafts", "layers:0-1",
                   "--prompts", "1", "--repeats", "2", "--gamma", "1,2", "--max-new-tokens", "8", "--plot", str(plot),
                   "--json", env={"SPECDRAFT_EVAL_CACHE": str(tmp_path / "cache")})
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(done.stdout)
    assert {(r["draft"], r["gamma"]) for r in rows} == {(d, g) for d in ("prompt-lookup:3", "layers:0,1") for g in (1,
                                                                                                                    2)}
    for row in rows:
        assert {"draft", "gamma", "predicted_speedup", "measured_speedup", "speedup_deviation",
                "predicted_tokens_per_second", "measured_tokens_per_second", "deviation"} <= set(row)
        for kind in ("predicted_speedup", "measured_speedup"):
            assert row[f"{kind}_min"] <= row[kind] <= row[f"{kind}_max"]
        assert row["predicted_min"] <= row["predicted_tokens_per_second"] <= row["predicted_max"]
        assert row["measured_min"] <= row["measured_tokens_per_second"] <= row["measured_max"]
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    saved = json.loads(plot.with_suffix(".json").read_text())
    assert saved["rows"] == rows and saved["max_abs_deviation"] == max(abs(r["speedup_deviation"]) for r in rows)
    assert saved["tokens_per_second_max_abs_deviation"] == max(abs(r["deviation"]) for r in rows)


def test_validate_bad_input(tiny):
    assert_one_line_error(run_cli("zoo", "validate", "--target", str(tiny), "--prompts", "0"),
                          "--prompts 0 must be >= 1")
    assert_one_line_error(run_cli("zoo", "validate", "--target", str(tiny), "--gamma", "0"), "bad --gamma")


def test_context_buckets_split_the_measured_lengths():
    buckets = context_buckets([10, 11, 12, 100, 101, 102, 400, 401, 402])
    assert buckets[10] == buckets[12] == 11 and buckets[100] == 101 and buckets[402] == 401
    assert context_buckets([7, 7]) == {7: 7}


def _profile(verify_ms: float, drafts: dict[str, float]):
    from specdraft_eval.results.profiles import DraftTiming, Profile, Spread

    def spread(ms: float) -> Spread:
        return Spread(ms, ms, ms, 1)

    return Profile("cpu", "t", 16, 1, {k: spread(verify_ms + 5 * k) for k in range(5)},
                   {name: DraftTiming(spread(ms), 0.1 if ms else 0.0) for name, ms in drafts.items()})


def plain_run(tokens: int, seconds: float) -> GenerationStats:
    return GenerationStats(baseline_tokens=tokens, baseline_seconds=seconds)


def test_each_request_is_predicted_from_its_own_buckets_profile():
    """Σ tokens / Σ predicted seconds, each request with its bucket's latencies: a long-context request with
    slower verification weighs as much as its tokens, not as one run's average."""
    short, long = (Sitting(_profile(ms, {"d": 5.0}), {PLAIN: 0.0, "d": 0.0}) for ms in (40.0, 80.0))
    requests = [Request(run_counts(), plain_run(30, 1.0), at, None) for at in (short, long)]
    alone = [predicted_from_latencies(run_counts(), at.profile.latencies("d")) for at in (short, long)]
    tps, _ = predicted(requests, "d", [])
    assert tps == pytest.approx(60 / (30 / alone[0] + 30 / alone[1]))


def test_the_predicted_speedup_is_the_profiles_ratio_with_the_loops_own_time():
    """Hand-worked: 12 steps of the run's counts cost 760 ms of passes + 12 · 3 ms of loop + 10 ms of draft prefill;
    plain decoding of its 30 tokens costs 30 · (40 ms + 2 ms); the speedup is the ratio, the same whatever a
    uniformly slower machine does to every latency."""
    at = Sitting(_profile(40.0, {"d": 5.0}), {PLAIN: 2.0, "d": 3.0})
    request = Request(run_counts(), plain_run(30, 99.0), at, None)  # plain's own seconds are never read
    tps, speedup = predicted([request], "d", [])
    assert tps == pytest.approx(30 / 0.806)
    assert speedup == pytest.approx((30 / 0.806) / (30 / 1.260))
    timing = at.profile.drafts["d"]
    twice = replace(at.profile, t_verify={k: replace(v, median=2 * v.median) for k, v in at.profile.t_verify.items()},
                    drafts={"d": replace(timing, t_draft=replace(timing.t_draft, median=10.0),
                                         draft_prefill_ms_per_token=0.2)})
    slower = Sitting(twice, {PLAIN: 4.0, "d": 6.0})
    assert predicted([replace(request, sitting=slower)], "d", [])[1] == pytest.approx(speedup)


def test_the_measured_speedup_is_against_the_plain_decoding_interleaved_with_the_run():
    at = Sitting(_profile(40.0, {"d": 5.0}), {PLAIN: 0.0, "d": 0.0})
    requests = [Request(replace(run_counts(), decode_seconds=0.5), plain_run(30, 1.5), at, None),
                Request(replace(run_counts(), decode_seconds=1.0), plain_run(30, 1.5), at, None)]
    tps, speedup = measured(requests)
    assert tps == pytest.approx(60 / 1.5) and speedup == pytest.approx((60 / 1.5) / (60 / 3.0))


def test_a_composite_is_charged_for_the_part_that_drafted_each_step():
    """Lookup steps cost nothing, model steps 5 ms a token: a request whose steps the model drafted 3 times in 4
    is predicted with 3.75 ms a drafted token, from the parts' own profiled latencies."""
    profile = _profile(40.0, {"lookup": 0.0, "model": 5.0})
    mixed = composite_latencies(profile, ["lookup", "model"], [1, 3])
    assert mixed.t_draft_ms == pytest.approx(3.75) and mixed.draft_prefill_ms_per_token == pytest.approx(0.1)
    expected = predicted_from_latencies(run_counts(), replace(mixed, loop_ms_per_step=1.0))
    at = Sitting(profile, {PLAIN: 1.0, "lookup|model": 1.0})
    tps, _ = predicted([Request(run_counts(), plain_run(30, 1.0), at, [1, 3])], "lookup|model", ["lookup", "model"])
    assert tps == pytest.approx(expected)


@pytest.mark.slow  # 48 configurations through the real CLI: the full suite runs it
def test_validate_grid_covers_tasks_gammas_and_dynamic_gamma(tiny, tmp_path):
    plot = tmp_path / "grid.png"
    done = run_cli("zoo", "validate", "--target", str(tiny), "--grid", "--drafts", "prompt-lookup", "--drafts",
                   "prompt-lookup:2-3|layers:0-1", "--prompts", "1", "--repeats", "1", "--max-new-tokens", "6",
                   "--plot", str(plot), "--json", env={"SPECDRAFT_EVAL_CACHE": str(tmp_path / "cache")})
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(done.stdout)
    assert {(r["task"], r["draft"], r["gamma"], r["dynamic_gamma"]) for r in rows} == {
        (t, d, g, dyn) for t in ("specdec_humaneval", "specdec_mmlu_cot")
        for d in ("prompt-lookup:3", "prompt-lookup:2-3|layers:0,1") for g in (1, 2, 3, 4) for dyn in (False, True)}
    saved = json.loads(plot.with_suffix(".json").read_text())
    assert len(saved["profile_contexts"]) >= 1 and saved["p90_abs_deviation"] <= saved["max_abs_deviation"]
    assert all(r["predicted_tokens_per_second"] > 0 for r in rows)
