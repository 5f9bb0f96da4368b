"""The stock ``lm_eval`` console script runs ``--model specdec`` losslessly on the real SmolLM2 target."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support import run_cli

from specdraft_eval.models.targets import resolve
from specdraft_eval.results.record import sample_figures

pytestmark = pytest.mark.slow
TASKS = ["specdec_humaneval", "specdec_mmlu_cot"]
LIMIT = "4"
COMMON = ["--include_path", "tasks", "--tasks", *TASKS, "--limit", LIMIT, "--confirm_run_unsafe_code",
          "--gen_kwargs", "max_gen_toks=32", "--log_samples"]
SPECDEC_KEYS = {
    "target", "draft", "num_draft_tokens", "steps", "draft_tokens", "accepted_tokens", "generated_tokens", "tar",
    "accepted_per_step", "acceptance_rate", "drafted_per_position", "accepted_per_position",
    "acceptance_length_histogram", "per_request_mean_accepted_length", "acceptance_rate_per_position",
    "draft_ms_per_token", "verify_ms_per_step", "tokens_per_second",
    "baseline_tokens_per_second", "speedup", "predicted_tokens_per_second", "per_task", "baseline_tokens",
    "overshoot_tokens", "mean_acceptance_length", "conditional_acceptance_per_position", "accept_length",
    "mean_accepted_tokens",
}


def evaluate(out: Path, model: str, model_args: str, *extra: str, process: bool = False) -> tuple[dict, dict]:
    """Run lm_eval (in this process, or as the console script a user starts); return the results JSON and each task's
    samples ordered by doc id."""
    done = run_cli("lm_eval", "--model", model, "--model_args", model_args, "--output_path", str(out), *COMMON, *extra,
                   process=process)
    assert done.returncode == 0, done.stderr[-3000:]
    (out / "stdout.txt").write_text(done.stdout)
    results = json.loads(next(out.rglob("results_*.json")).read_text())
    samples = {}
    for task in TASKS:
        lines = next(out.rglob(f"samples_{task}_*.jsonl")).read_text().splitlines()
        samples[task] = sorted((json.loads(line) for line in lines), key=lambda s: s["doc_id"])
    return results, samples


@pytest.fixture(scope="module")
def hf_run(tmp_path_factory):
    source = resolve("smollm2-135m-instruct")
    return evaluate(tmp_path_factory.mktemp("hf"), "hf", f"pretrained={source.path},gguf_file={source.gguf_file}",
                    "--device", "cpu")


def test_specdec_is_registered_next_to_lm_evals_own_models():
    code = "from lm_eval.api.registry import get_model; print(get_model('specdec').__name__, get_model('hf').__name__)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.split() == ["SpecDecLM", "HFLM"], done.stderr


@pytest.mark.parametrize("draft,batch_size", [("prompt-lookup", "4"), ("layers:0-3+29", "2"),
                                              ("prompt-lookup:3x3|eagle:leaderboard/drafts/smollm2-eagle@2x4", "1"),
                                              ("suffix|eagle:leaderboard/drafts/smollm2-eagle@2x4", "4")])
def test_greedy_output_identical_to_hf(hf_run, tmp_path, draft, batch_size):
    """Batched speculative decoding (lm-eval batches of 2 and 4) against hf's batch-1 plain decoding; token trees
    (lookup, EAGLE-2, suffix in the composite) at batch 1 and 4."""
    hf_results, hf_samples = hf_run
    results, samples = evaluate(
        tmp_path, "specdec", f"pretrained=smollm2-135m-instruct,draft={draft},num_draft_tokens=3,baseline=true",
        "--batch_size", batch_size, process=draft == "prompt-lookup",  # once as a user runs it: its own process
    )
    for task in TASKS:
        assert [s["resps"] for s in samples[task]] == [s["resps"] for s in hf_samples[task]]
        assert results["results"][task] == hf_results["results"][task]
    block = results["config"]["specdec"]
    assert SPECDEC_KEYS <= set(block)
    assert set(block["per_task"]) == set(TASKS)
    assert block["baseline_mismatches"] == 0
    assert block["generated_tokens"] > 0 and block["speedup"] > 0
    assert block["tar"] == pytest.approx(block["accepted_per_step"] + 1)
    for figures in [block, *block["per_task"].values()]:
        assert sum(figures["accepted_per_position"]) == figures["accepted_tokens"]
        assert sum(figures["acceptance_length_histogram"]) == figures["steps"]
    assert "accept by position" in (tmp_path / "stdout.txt").read_text()
    for task in TASKS:  # --log_samples: each request's own figures, adding up to the task's
        requests = [sample_figures(sample) for sample in samples[task]]
        figures = block["per_task"][task]
        for key in ("generated_tokens", "steps", "accepted_tokens", "draft_tokens", "overshoot_tokens"):
            assert sum(r[key] for r in requests) == figures[key]
        assert sum(r["baseline_tokens"] for r in requests) == figures["baseline_tokens"]
        assert all(r["baseline_tokens"] == r["generated_tokens"] and r["baseline_ms"] > 0 for r in requests)
    grouped = run_cli("zoo", "samples", str(tmp_path), "--by", "task", "--json")  # zoo reads them back
    assert grouped.returncode == 0, grouped.stderr
    for group in json.loads(grouped.stdout):
        figures = block["per_task"][group["group"]]
        assert group["generated_tokens"] == figures["generated_tokens"]
        assert group["mean_acceptance_length"] == pytest.approx(figures["mean_acceptance_length"])
