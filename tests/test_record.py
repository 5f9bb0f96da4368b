"""The measurement record: per-position counters for every draft kind, conventions, round trips, merging,
TAR estimates at smaller γ, atomic writes, and the one-line messages for unusable files in every reader."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from support import RUNTIME, assert_one_line_error, drafts, run_cli, zoo_json

from specdraft_eval import autoregressive_generate, speculative_generate
from specdraft_eval.drafts.prompt_lookup import PromptLookupDrafter
from specdraft_eval.engine.loop import divergence
from specdraft_eval.files import atomic_write
from specdraft_eval.measure.stats import GenerationStats
from specdraft_eval.results.profiles import read_profile
from specdraft_eval.results.record import RecordError, SpecdecRecord, read_results


def run_requests(target, draft, do_sample: bool, gamma: int = 4, dynamic: bool = False) -> GenerationStats:
    total = GenerationStats()
    for seed in range(3):
        prompt = torch.randint(0, 64, (1, 6 + 5 * seed), generator=torch.Generator().manual_seed(seed))
        prompt = torch.cat([prompt, prompt], dim=1)  # repeats give prompt lookup something to copy
        _, stats = speculative_generate(target, draft, prompt, 24, num_draft_tokens=gamma, do_sample=do_sample,
                                        temperature=0.8, seed=seed, dynamic_gamma=dynamic)
        total = total + stats
    return total


@pytest.mark.parametrize("name", ["prompt-lookup", "layers", "other-model", "self", "reduced-head"])
@pytest.mark.parametrize("do_sample,dynamic", [(False, False), (True, False), (False, True)])
def test_per_position_counts_add_up(target, name, do_sample, dynamic):
    draft = drafts(target)[name]
    proposals = []  # the lengths of every proposal, seen from outside the engine's counters
    make = draft.batch_drafter

    def counting(count):  # the rows the engine drafts with: what they propose
        batch = make(count)
        propose = batch.propose

        def counted(tokens, budgets, samplers):
            made = propose(tokens, budgets, samplers)
            proposals.extend(len(p.tokens) for p in made if p.tokens or any(budgets))
            return made

        batch.propose = counted
        return batch

    draft.batch_drafter = counting
    stats = run_requests(target, draft, do_sample, dynamic=dynamic)
    s = stats.summary()
    assert s["tar"] == pytest.approx(s["accepted_per_step"] + 1)
    assert sum(stats.accepted_per_position) == stats.accepted_tokens
    assert sum(stats.drafted_per_position) == stats.draft_tokens == sum(proposals)
    assert sum(stats.acceptance_length_histogram) == stats.steps
    assert sum(n * c for n, c in enumerate(stats.acceptance_length_histogram)) == stats.accepted_tokens
    assert stats.drafted_per_position[0] == sum(1 for k in proposals if k)  # position 0 on every drafting step
    assert all(a <= d for a, d in zip(stats.accepted_per_position, stats.drafted_per_position))
    assert stats.accepted_per_position == sorted(stats.accepted_per_position, reverse=True)  # i+1 needs i
    assert len(stats.request_tars) == 3
    pcts = s["per_request_mean_accepted_length"]
    assert min(stats.request_tars) <= pcts["p10"] <= pcts["p50"] <= pcts["p90"] <= max(stats.request_tars)


def test_self_draft_accepts_every_position(target):
    stats = run_requests(target, drafts(target)["self"], False)
    assert stats.summary()["tar"] > 4.0
    assert stats.accepted_per_position == stats.drafted_per_position


def test_record_round_trips_and_merges(target):
    per_task = {"a": run_requests(target, drafts(target)["layers"], False),
                "b": run_requests(target, PromptLookupDrafter(), True)}
    record = SpecdecRecord.new("t", "layers:0,3", 4, False, "cpu", per_task, draft_model=target)
    block = json.loads(json.dumps(record.to_block()))
    again = SpecdecRecord.from_block(block)
    assert again == record
    assert again.to_block() == block
    assert block["tar"] == pytest.approx(block["accepted_per_step"] + 1)
    for figures in block["per_task"].values():
        assert figures["tar"] == pytest.approx(figures["accepted_per_step"] + 1)
    both = record.merge(again)
    assert both.total.steps == 2 * record.total.steps
    assert both.total.accepted_per_position == [2 * a for a in record.total.accepted_per_position]
    assert both.total.decode_seconds == pytest.approx(2 * record.total.decode_seconds)
    assert both.to_block()["tar"] == pytest.approx(block["tar"])
    with pytest.raises(Exception, match="different runs"):
        record.merge(SpecdecRecord.new("t", "other", 4, False, "cpu", per_task))


def test_a_baseline_mismatch_is_described_where_it_happened(target):
    """Numerical drift is traceable: the first differing token and the target's logit margin there."""
    prompt = [5, 9, 2, 7, 1]
    baseline, _ = autoregressive_generate(target, prompt, 12)
    with torch.inference_mode():
        logits = target(torch.tensor([prompt + baseline[:4]])).logits[0, -1]
    runner_up = int(logits.topk(2).indices[1])
    specdec = baseline[:4] + [runner_up] + baseline[5:]
    where = divergence(target, prompt, specdec, baseline)
    assert where.index == 4 and where.specdec_token == runner_up and where.baseline_token == baseline[4]
    assert where.logit_margin == pytest.approx(float(logits[baseline[4]] - logits[runner_up]), abs=1e-4)
    assert where.logit_margin > 0  # the baseline's greedy token is the argmax
    assert divergence(target, prompt, baseline + [3], baseline) is None  # ran past the end only: no divergence
    per_task = {"a": GenerationStats(baseline_mismatches=1), "b": GenerationStats()}
    where = replace(where, task="a")
    record = SpecdecRecord.new("t", "d", 4, False, "cpu", per_task, baseline_mismatch_details=[where])
    block = json.loads(json.dumps(record.to_block()))
    assert block["baseline_mismatch_details"] == [{"task": "a", "index": 4, "specdec_token": runner_up,
                                                   "baseline_token": baseline[4], "logit_margin": where.logit_margin}]
    assert block["baseline_mismatches"] == 1
    assert {t: f["baseline_mismatches"] for t, f in block["per_task"].items()} == {"a": 1, "b": 0}  # counted per task
    again = SpecdecRecord.from_block(block)
    merged = again.merge(again)
    assert merged.baseline_mismatch_details == [where] * 2
    assert merged.baseline_mismatches == 2 and merged.per_task["a"].baseline_mismatches == 2


def test_files_with_only_a_total_of_mismatches_get_per_task_counts_from_their_details():
    per_task = {"a": GenerationStats(), "b": GenerationStats(baseline_mismatches=2)}
    block = json.loads(json.dumps(SpecdecRecord.new("t", "d", 4, False, "cpu", per_task).to_block()))
    for figures in block["per_task"].values():  # as written before the per-task counter existed
        del figures["counters"]["baseline_mismatches"], figures["baseline_mismatches"]
    block["baseline_mismatch_details"] = [{"task": "b", "index": 3}, {"task": "b", "index": 0}]
    read = SpecdecRecord.from_block(block)
    assert read.baseline_mismatches == 2 and read.per_task["b"].baseline_mismatches == 2
    del block["baseline_mismatch_details"]  # files written before the details existed: the total is kept
    older = SpecdecRecord.from_block(block)
    assert older.baseline_mismatches == 2 and older.baseline_mismatch_details == []


def test_tar_estimate_at_smaller_gamma_from_the_histogram():
    stats = GenerationStats(steps=10, draft_tokens=40, accepted_tokens=17, acceptance_length_histogram=[3, 2, 2, 1, 2])
    # accepted 0,1,2,3,4 tokens in 3,2,2,1,2 steps: at γ'=2 the 3s and 4s stop at 2 -> (0+2+4+2+4)/10 + 1
    assert stats.tar_at(2) == pytest.approx(1 + 12 / 10)
    assert stats.tar_at(1) == pytest.approx(1 + 7 / 10)
    assert stats.tar_at(4) == pytest.approx(stats.summary()["tar"])
    assert GenerationStats().tar_at(2) is None


def test_atomic_write_leaves_nothing_behind_on_failure(tmp_path):
    path = tmp_path / "f.json"
    atomic_write(path, "old")

    class Boom(str):
        def encode(self, *args):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic_write(path, Boom("new"))
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["f.json"]


def test_an_atomic_folder_gets_the_umasks_permissions_whatever_its_writers_used(tmp_path):
    """mkdtemp makes 0700 and safetensors writes 0600: a published draft must be readable by others."""
    import os

    from specdraft_eval.files import atomic_output

    previous = os.umask(0o022)
    try:
        with atomic_output(tmp_path / "draft", directory=True) as tmp:
            (tmp / "model.safetensors").write_bytes(b"x")
            (tmp / "model.safetensors").chmod(0o600)
    finally:
        os.umask(previous)
    assert (tmp_path / "draft").stat().st_mode & 0o777 == 0o755
    assert (tmp_path / "draft" / "model.safetensors").stat().st_mode & 0o777 == 0o644


# --- unusable files: one line naming the file, in every reader ---------------------------------------------


def good_results(folder: Path, draft: str = "prompt-lookup:3", gamma: int = 3, target: str = "t") -> Path:
    stats = GenerationStats(3, 10, 30, 12, 22, 0.1, 0.3, 0.5, 1.0, 22, 1.2, [10, 10, 10], [6, 4, 2], [4, 2, 2, 2],
                            [0, 0, 0, 10], [2.0, 2.2, 2.4])
    record = SpecdecRecord.new(target, draft, gamma, False, "cpu", {"specdec_humaneval": stats}, runtime=RUNTIME)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"results_{draft.replace(':', '_').replace(',', '_').replace('/', '_')}_{gamma}.json"
    path.write_text(json.dumps({"results": {"specdec_humaneval": {"pass@1,none": 0.0}},
                                "config": {"specdec": record.to_block()}, "date": 1764700000.0}))
    return path


def bad(folder: Path, kind: str, good: str) -> Path:
    text = {"corrupt": "{oops", "truncated": good[: len(good) // 2],
            "foreign": json.dumps({"config": {"model": "hf"}, "results": {}})}.get(kind)
    if kind == "newer":
        data = json.loads(good)
        (data["config"]["specdec"] if "config" in data else data)["schema_version"] = 99
        text = json.dumps(data)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"results_{kind}.json"
    path.write_text(text)
    return path


MESSAGES = {"corrupt": "not readable JSON", "truncated": "not readable JSON", "foreign": "no config.specdec",
            "newer": "written by a newer specdraft-eval"}
KINDS = list(MESSAGES)


@pytest.mark.parametrize("kind", KINDS)
def test_read_results_names_the_file(tmp_path, kind):
    path = bad(tmp_path, kind, good_results(tmp_path / "ok").read_text())
    with pytest.raises(RecordError, match=MESSAGES[kind]) as info:
        read_results(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("kind", KINDS)
def test_rank_warns_once_for_a_bad_file_in_a_folder_and_errors_for_a_named_one(tiny, tmp_path, kind):
    results = tmp_path / "results"
    good = good_results(results / "ok", target=str(tiny))
    path = bad(results / "bad", kind, good.read_text())
    base = ["zoo", "rank", "--target", str(tiny), "--gpu", "h100", "--drafts", "prompt-lookup"]
    done = run_cli(*base, "--results", str(results), "--json")
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stderr.splitlines() if line.startswith("zoo: warning:")]
    assert len(warnings) == 1 and str(path) in warnings[0] and MESSAGES[kind] in warnings[0]
    assert json.loads(done.stdout)["rows"][0]["predicted_tokens_per_second"] > 0
    assert_one_line_error(run_cli(*base, "--results", str(path)), str(path))


PROFILE_GOOD = {"kind": "specdraft_eval.profile", "schema_version": 2, "hardware": "cpu", "target": "t",
                "context": 16, "repeats": 1, "t_target_ms": 1.0, "t_verify_ms": {"1": 1.0}, "drafts": {}}


@pytest.mark.parametrize("kind", KINDS)
def test_profile_reader_errors_for_a_named_file_and_warns_for_the_cached_one(tiny, tmp_path, kind):
    path = bad(tmp_path, kind, json.dumps(PROFILE_GOOD))
    message = MESSAGES[kind] if kind != "foreign" else "not a zoo profile"
    with pytest.raises(RecordError, match=message):
        read_profile(path, named=True)
    with pytest.warns(UserWarning, match=message):
        assert read_profile(path, named=False) is None
    args = ["zoo", "profile", "--target", str(tiny), "--gamma", "1", "--repeats", "1", "--context", "8"]
    assert_one_line_error(run_cli(*args, "--out", str(path)), str(path))


def test_profile_then_rank_runs_clean(tiny, tmp_path):
    """The crash of issue 12: a profile at another context, then rank on this machine."""
    env = {"SPECDRAFT_EVAL_CACHE": str(tmp_path)}
    zoo_json("profile", "--target", str(tiny), "--context", "16", "--repeats", "1", "--gamma", "1", env=env)
    rows = zoo_json("rank", "--target", str(tiny), "--gpu", "this", "--gamma", "1,2", "--results", str(tmp_path),
                    "--drafts", "prompt-lookup", "--drafts", "layers:0-1", env=env)["rows"]
    assert {r["draft"] for r in rows} == {"prompt-lookup:3", "layers:0,1"}
    assert all(r["tar_source"].startswith("missing: ") for r in rows)


def test_rank_estimates_every_smaller_gamma_from_results(tiny, tmp_path):
    results = tmp_path / "results"
    good_results(results, target=str(tiny), gamma=3)
    done = run_cli("zoo", "rank", "--target", str(tiny), "--gpu", "a100-80gb", "--results", str(results),
                   "--verbose")
    assert done.returncode == 0, done.stderr
    rows = zoo_json("rank", "--target", str(tiny), "--gpu", "a100-80gb", "--results", str(results))["rows"]
    row = next(r for r in rows if r["draft"] == "prompt-lookup:3")
    assert set(row["predicted_by_gamma"]) == {"1", "2", "3"}
    assert "1: " in done.stdout and "3: " in done.stdout
    def source(gamma: str) -> str:
        ranked = zoo_json("rank", "--target", str(tiny), "--gpu", "a100-80gb", "--results", str(results), "--gamma",
                          gamma)
        return next(r for r in ranked["rows"] if r["draft"] == "prompt-lookup:3")["tar_source"]

    assert source("3").startswith("results γ=3") and source("1") == "estimate from γ=3 results"


def test_acceptance_figures_as_each_engine_defines_them():
    """A hand-worked run of four chain steps at γ = 3: drafted/accepted 3/2, 3/0, 0/0 (γ = 0: no draft), 2/2."""
    stats = GenerationStats()
    for drafted, accepted in [(3, 2), (3, 0), (0, 0), (2, 2)]:
        stats.record_step(drafted, accepted)
    stats.generated_tokens = 3 + 1 + 1 + 3  # each step emits accepted + 1
    figures = stats.acceptance_figures
    assert stats.drafts == 3
    assert figures["mean_acceptance_length"] == pytest.approx(1 + 4 / 3)  # vLLM: 1 + accepted / drafts
    assert figures["acceptance_rate_per_position"] == pytest.approx([2 / 3, 2 / 3, 0.0])  # vLLM: / drafts
    assert figures["conditional_acceptance_per_position"] == pytest.approx([2 / 3, 1.0, 0.0])  # SPEED-Bench
    assert figures["accept_length"] == 2.0  # SGLang: completion tokens / verification steps
    assert figures["mean_accepted_tokens"] == 2.0 == stats.tar  # Spec-Bench, EAGLE: tokens per target pass
    assert set(figures) <= set(stats.summary())


def test_acceptance_as_vllm_and_speed_bench_count_it_where_drafts_vary_in_length_and_a_stop_cuts():
    """Worked from each engine's own definition, on steps a prompt-lookup or suffix draft makes (drafts of varying
    length, γ = 3) and a final step a stop cuts. vLLM counts each step's drafted and accepted tokens before its stop
    check (scheduler: num_draft_tokens = len(spec_token_ids), num_accepted = len(generated) - 1); SPEED-Bench's
    conditional rate at i divides steps that accepted i by steps that drafted i having accepted i - 1."""
    from specdraft_eval.engine.drafter import Proposal
    from specdraft_eval.engine.loop import _counted

    # (drafted, accepted, tokens kept of the accepted + 1 emitted): the last step's stop completes at its 2nd token
    steps = [(3, 3, 4), (1, 1, 2), (2, 1, 2), (3, 1, 2), (3, 3, 2)]
    stats = GenerationStats()
    for drafted, accepted, kept in steps:
        stats.record_step(*_counted(Proposal(list(range(drafted))), list(range(accepted)), kept))
        stats.overshoot_tokens += accepted + 1 - kept  # as the loop counts the tokens it cut
    # vLLM, step by step: 5 drafts, 3+1+2+3+3 = 12 draft tokens, 3+1+1+1+3 = 9 accepted; per position
    # [5, 2, 2] (position 1: the first step's and the last's; position 2: the same two)
    assert stats.vllm_counters == {"num_drafts": 5, "num_draft_tokens": 12, "num_accepted_tokens": 9,
                                   "num_accepted_tokens_per_pos": [5, 2, 2]}
    assert stats.mean_acceptance_length == pytest.approx(1 + 9 / 5)
    assert stats.acceptance_rate_per_position == pytest.approx([5 / 5, 2 / 5, 2 / 5])
    # ours counts the last step as if its draft had ended at the stop: 1 drafted, 1 accepted
    assert (stats.draft_tokens, stats.accepted_tokens) == (10, 7) and stats.tar == pytest.approx(12 / 5)
    # SPEED-Bench: position 0: 5 accepted of 5 drafts; position 1: accepted in the first step only, reached by the
    # first, third and fourth (the second's draft ended at 0, the last's was cut there); position 2: 1 of 1
    assert stats.conditional_acceptance_per_position == pytest.approx([1.0, 1 / 3, 1.0])
    # (the rule "over accepted at i - 1" gives [1.0, 1/5, 1.0]: the steps whose drafts ended are not failures)
    stats.record_step(*_counted(Proposal([7, 8]), [0, 1], 1))  # a stop in the step's first token: no draft of ours
    stats.overshoot_tokens += 2
    assert stats.drafts == 5 and stats.vllm_counters["num_drafts"] == 6  # vLLM's draft, all its tokens accepted
    assert stats.vllm_counters["num_accepted_tokens"] == 11


def test_undefined_positions_are_null_in_json_and_a_dash_in_tables():
    from specdraft_eval.results.report import positions

    stats = GenerationStats()
    for drafted, accepted in [(3, 0), (3, 0)]:
        stats.record_step(drafted, accepted)
    assert stats.conditional_acceptance_per_position == [0.0, None, None]  # nobody reached positions 1 and 2
    assert stats.summary()["conditional_acceptance_per_position"] == [0.0, None, None]
    assert positions(stats.conditional_acceptance_per_position) == "0.00 - -"


def test_vllms_figures_are_unknown_for_counters_that_did_not_keep_the_cut():
    """Every token past a stop is an accepted draft token a cut removed: counters that kept the cut have as many
    cut accepted tokens as overshoot tokens, and only they give vLLM's figures (records from before: null)."""
    from specdraft_eval.engine.drafter import Proposal
    from specdraft_eval.engine.loop import _counted

    stats = GenerationStats()
    stats.record_step(*_counted(Proposal([1, 2, 3]), [0, 1, 2], 2))
    stats.overshoot_tokens = 2  # as the loop counts it: 4 emitted, 2 kept
    assert sum(stats.cut_accepted_per_position) == 2 and stats.mean_acceptance_length == 1 + 3 / 1
    old = GenerationStats(steps=1, draft_tokens=1, accepted_tokens=1, drafted_per_position=[1],
                          accepted_per_position=[1], drafted_histogram=[0, 1], overshoot_tokens=2)
    assert old.vllm_counters is None and old.mean_acceptance_length is None and old.acceptance_rate_per_position == []
    assert GenerationStats.of_request(stats.request_figures()).vllm_counters == stats.vllm_counters
