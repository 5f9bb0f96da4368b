"""The real ``lm_eval`` command with ``--batch_size`` 2, 4, 8 and auto, with two data-parallel processes, with the
target sharded over two tensor-parallel processes (``torchrun``, ``tp_plan=auto``) and with ``parallelize=true`` on a
CPU-only machine: every document gets batch 1's output, the two data-parallel processes' merged record equals one
process's counts, and the tensor-parallel run writes one results file that says its degree."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import run_cli

pytestmark = pytest.mark.slow
TASK = "specdec_mmlu_cot"
COUNTS = ("generations", "steps", "draft_tokens", "accepted_tokens", "generated_tokens", "drafted_per_position",
          "accepted_per_position", "acceptance_length_histogram", "baseline_tokens")


def evaluate(tiny: Path, out: Path, *launcher: str, batch_size: str = "1", model_args: str = "") -> tuple[dict, list]:
    """One run over 5 documents (odd, so two processes get unequal shares); its specdec block and responses."""
    args = ["--model", "specdec", "--model_args",
            f"pretrained={tiny},draft=prompt-lookup|layers:0,baseline=true{model_args}",
            "--include_path", "tasks", "--tasks", TASK, "--limit", "5", "--gen_kwargs", "max_gen_toks=24",
            "--batch_size", batch_size, "--output_path", str(out), "--log_samples"]
    done = run_cli(*launcher, "-m", "lm_eval", *args) if launcher else run_cli("lm_eval", *args)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(next(out.rglob("results_*.json")).read_text())
    samples = sorted((json.loads(line) for line in next(out.rglob(f"samples_{TASK}_*.jsonl")).read_text().splitlines()),
                     key=lambda s: s["doc_id"])
    return results["config"]["specdec"], [s["resps"] for s in samples]


@pytest.fixture(scope="module")
def batch_one(tiny, tmp_path_factory):
    return evaluate(tiny, tmp_path_factory.mktemp("b1"))


BATCH_SIZES = ["2", "4", "8", "auto"]


@pytest.fixture(scope="module")
def batched(tiny, tmp_path_factory) -> dict:
    """The run at each batch size, one after another (in this process: no start-up to overlap)."""
    return {size: evaluate(tiny, tmp_path_factory.mktemp(f"b{size}"), batch_size=size) for size in BATCH_SIZES}


@pytest.mark.parametrize("batch_size", BATCH_SIZES)
def test_batch_sizes_give_batch_one_output(batched, batch_one, batch_size):
    block, responses = batched[batch_size]
    reference_block, reference = batch_one
    assert responses == reference
    assert block["baseline_mismatches"] == 0
    assert block["counters"]["generations"] == 5 and block["processes"] == 1
    assert block["generated_tokens"] == reference_block["generated_tokens"]


def test_two_processes_split_the_documents_and_merge_their_records(tiny, batch_one, tmp_path):
    launcher = ("accelerate", "launch", "--multi_gpu", "--num_processes", "2")  # on CPUs too: see docs/lm_eval.md
    block, responses = evaluate(tiny, tmp_path, *launcher)
    reference_block, reference = batch_one
    assert block["processes"] == 2
    # lm-eval appends its padding copy's answer to the padded request's responses (its own behaviour): compare firsts
    assert [r[0][:1] for r in responses] == [r[0][:1] for r in reference]
    assert {k: block["counters"][k] for k in COUNTS} == {k: reference_block["counters"][k] for k in COUNTS}
    assert block["baseline_mismatches"] == 0


def test_a_target_sharded_over_two_torchrun_processes_answers_as_one_process(tiny, batch_one, tmp_path):
    """``torchrun --nproc_per_node 2 -m lm_eval ... tp_plan=auto``: both ranks run every document on the sharded
    target (lm-eval's tensor-parallel mode), rank 0 alone writes, the record says tensor_parallel 2."""
    block, responses = evaluate(tiny, tmp_path, "torchrun", "--nproc_per_node", "2", model_args=",tp_plan=auto")
    reference_block, reference = batch_one
    assert len(list(tmp_path.rglob("results_*.json"))) == 1
    assert block["tensor_parallel"] == 2 and block["processes"] == 1 and block["baseline_mismatches"] == 0
    assert responses == reference
    assert {k: block["counters"][k] for k in COUNTS} == {k: reference_block["counters"][k] for k in COUNTS}


def test_parallelize_on_a_machine_without_gpus_runs_on_the_cpu(tiny, batch_one, tmp_path):
    block, responses = evaluate(tiny, tmp_path, model_args=",parallelize=true")
    assert responses == batch_one[1] and block["tensor_parallel"] == 1
