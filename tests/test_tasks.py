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


def test_lm_variants_score_the_reference_continuation_in_bits_per_byte():
    """The `_lm` tasks: the log-likelihood of each task's reference answer after its prompt, as (nats, bytes) for
    lm-eval's bits_per_byte aggregation; the MMLU-CoT reference continues the prompt's cue without repeating it."""
    import math

    from lm_eval.api.metrics import bits_per_byte

    humaneval, mmlu = task_utils.load_humaneval()["test"][0], task_utils.load_mmlu_cot()["test"][0]
    continuation = task_utils.worked_continuation(mmlu)
    assert mmlu["prompt"].endswith(task_utils.COT_CUE) and not continuation.startswith(task_utils.COT_CUE)
    assert continuation.startswith(" ") and continuation.rstrip().endswith(f"The answer is ({mmlu['answer']}).")
    items = [task_utils.process_bits_per_byte(humaneval, [(-10.0, False)])["bits_per_byte"],
             task_utils.process_bits_per_byte(mmlu, [(-30.0, True)])["bits_per_byte"]]
    assert items == [(-10.0, len(humaneval["canonical_solution"].encode())), (-30.0, len(continuation.encode()))]
    assert bits_per_byte(items) == 40.0 / (items[0][1] + items[1][1]) / math.log(2)
    for name in ("specdec_humaneval_lm", "specdec_mmlu_cot_lm"):
        config = yaml.safe_load((ROOT / "tasks" / f"{name}.yaml").read_text().replace("!function", ""))
        assert config["output_type"] == "loglikelihood" and config["target_delimiter"] == ""
