"""Seeded sampling under lm-eval's ``repeats`` (pass@k, maj@k): each copy of a request samples a stream of its own,
derived from (seed, request, repeat), so a document's k samples differ, a rerun gives them again, and batch size
changes nothing; for a head, a draft model and prompt lookup, through a real in-process ``lm_eval`` evaluation."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import save_tiny

TASKS = Path(__file__).parent / "tasks"


@pytest.fixture(scope="module")
def task_manager():
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=str(TASKS))


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, str]:
    """The target, a draft model sharing its tokenizer, and an (untrained) EAGLE head for it."""
    from transformers import AutoModelForCausalLM

    from specdraft_eval.drafts.eagle import new_head
    from zoo.build.train_head import save_head

    root = tmp_path_factory.mktemp("repeats")
    target = save_tiny(root / "target")
    draft = save_tiny(root / "draft", seed=5, layers=1)
    head = root / "head"
    head.mkdir()
    save_head(head, new_head(AutoModelForCausalLM.from_pretrained(target), seed=3), {"target": "tiny",
                                                                                     "token_ids": None})
    return {"target": str(target), "model": str(draft), "eagle": f"eagle:{head}", "prompt-lookup": "prompt-lookup"}


def samples(models: dict, draft: str, batch_size: int, task_manager, seed: int = 1234) -> list[list[str]]:
    """Each document's sampled answers (its ``repeats`` copies, in order)."""
    from lm_eval import simple_evaluate

    out = simple_evaluate(model="specdec", model_args=f"pretrained={models['target']},draft={models[draft]},"
                          f"num_draft_tokens=3,kernels=plain,seed={seed}", tasks=["specdec_test_repeats"],
                          batch_size=batch_size, device="cpu", log_samples=True, task_manager=task_manager)
    docs = sorted(out["samples"]["specdec_test_repeats"], key=lambda s: s["doc_id"])
    return [list(doc["resps"][0]) for doc in docs]  # one request, its copies' answers in order


@pytest.mark.parametrize("draft", ["eagle", "model", "prompt-lookup"])
def test_repeats_sample_distinct_answers_again_on_a_rerun_and_at_any_batch_size(models, task_manager, draft):
    one = samples(models, draft, 1, task_manager)
    assert len(one) == 5 and all(len(answers) == 4 for answers in one)
    assert all(len(set(answers)) == 4 for answers in one), one  # one stream per copy: 4 different samples
    four = samples(models, draft, 4, task_manager)
    assert four == one  # a row's stream does not depend on which rows share its batch
    assert samples(models, draft, 4, task_manager) == one  # and a rerun draws it again
    assert samples(models, draft, 4, task_manager, seed=7) != one  # the seed does choose the streams
