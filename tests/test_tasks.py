"""The bundled tasks load offline from installed packages, and their metrics score real answers."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tasks"))
import utils as task_utils  # noqa: E402  (tasks/utils.py, as lm-eval's !function loads it)


def test_humaneval_loads_all_problems_and_scores_the_canonical_solution():
    docs = task_utils.load_humaneval()["test"]
    assert len(docs) == 164
    doc = docs[0]
    assert task_utils.process_humaneval(doc, [doc["canonical_solution"]]) == {"pass@1": 1.0}
    assert task_utils.process_humaneval(doc, ["    return None\n"]) == {"pass@1": 0.0}


def test_mmlu_cot_has_every_worked_question_with_leave_one_out_shots():
    docs = task_utils.load_mmlu_cot()["test"]
    assert len(docs) == 282
    doc = docs[0]
    assert doc["prompt"].endswith("A: Let's think step by step.")
    assert doc["prompt"].count("\n\nQ: ") == 5  # four other worked examples, then the question
    assert doc["question"] not in doc["prompt"].rsplit("Q: ", 1)[0]
    right = f" ... The answer is ({doc['answer']})."
    wrong_letter = "A" if doc["answer"] != "A" else "B"
    assert task_utils.process_mmlu_cot(doc, [right]) == {"exact_match": 1.0}
    assert task_utils.process_mmlu_cot(doc, [f"The answer is ({wrong_letter})."]) == {"exact_match": 0.0}
    assert task_utils.process_mmlu_cot(doc, ["no answer"]) == {"exact_match": 0.0}


def test_every_task_is_indexed_and_says_whether_it_needs_the_hub():
    from lm_eval.tasks import TaskManager

    names = {t for t in TaskManager(include_path=str(ROOT / "tasks")).all_tasks if t.startswith("specdec_")}
    files = list((ROOT / "tasks").rglob("*.yaml"))
    assert names == {f.stem for f in files}
    for f in files:
        text = f.read_text().replace("!function", "")
        needs_hub = yaml.safe_load(text)["metadata"]["needs_hub"]
        assert needs_hub == (f.parent.name == "hub"), f
