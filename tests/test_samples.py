"""zoo samples: each request's figures from lm-eval's samples lines (lm-eval 0.4's layout), grouped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import run_cli

from specdraft_eval.errors import SpecdecError
from specdraft_eval.measure.stats import GenerationStats
from zoo.report.samples import group_samples


def line(subject: str, correct: bool, drafted_accepted: list[tuple[int, int]]) -> str:
    """A sample as lm-eval 0.4.13 writes one (arguments as gen_args_0/arg_N), with a request's figures appended."""
    stats = GenerationStats(baseline_tokens=0)
    for drafted, accepted in drafted_accepted:
        stats.record_step(drafted, accepted)
    stats.generated_tokens = stats.accepted_tokens + stats.steps
    stats.decode_seconds, stats.baseline_tokens, stats.baseline_seconds = 1.0, stats.generated_tokens, 2.0
    arguments = {"gen_args_0": {"arg_0": "Q?", "arg_1": {"until": ["\n"]},
                                "arg_2": {"specdec": stats.request_figures()}}}
    return json.dumps({"doc_id": 0, "doc": {"subject": subject}, "arguments": arguments, "metrics": ["exact_match"],
                       "exact_match": float(correct)})


def write(folder: Path, lines: list[str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "samples_specdec_mmlu_cot_2026-12-06T00-00-00.000000.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_groups_sum_each_requests_counters(tmp_path):
    write(tmp_path, [line("algebra", True, [(4, 4), (4, 0)]), line("algebra", False, [(4, 1)]),
                     line("law", False, [(2, 2), (0, 0)])])
    by_subject = {g.group: g for g in group_samples([tmp_path], "subject")}
    algebra = by_subject["algebra"]
    assert (algebra.requests, algebra.generated_tokens) == (2, 5 + 1 + 2)
    assert algebra.mean_acceptance_length == pytest.approx(1 + 5 / 3)  # vLLM's: 3 drafts
    assert algebra.acceptance_rate_per_position == pytest.approx([2 / 3, 1 / 3, 1 / 3, 1 / 3])
    assert algebra.speedup == pytest.approx(2.0)  # each request: its tokens in 1 s against plain decoding's 2 s
    assert by_subject["law"].mean_acceptance_length == 3.0  # the γ = 0 step is no draft
    assert [g.group for g in group_samples([tmp_path], "correct")] == ["correct", "wrong"]
    assert [g.group for g in group_samples([tmp_path], "task")] == ["specdec_mmlu_cot"]


def test_bad_input_is_one_line(tmp_path):
    path = write(tmp_path / "a", [line("x", True, [(1, 1)]), json.dumps({"doc": {}, "arguments": {}})])
    with pytest.raises(SpecdecError, match="no specdec figures"):
        group_samples([path], "task")
    with pytest.raises(SpecdecError, match="no field 'nope'"):
        group_samples([write(tmp_path / "b", [line("x", True, [(1, 1)])])], "nope")
    done = run_cli("zoo", "samples", str(tmp_path / "missing"))
    assert done.returncode == 1 and done.stderr.strip().count("\n") == 0 and "does not exist" in done.stderr
