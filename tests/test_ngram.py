"""The n-gram draft (`zoo ngram`, ``draft=ngram:DIR``): its tables, its file checks and the build command."""

from __future__ import annotations

import json

import pytest
from support import run_cli, save_tiny, tiny_llama, word_tokenizer

from specdraft_eval import SpecdecError
from specdraft_eval.drafts import load_draft
from specdraft_eval.drafts.ngram import (
    NGRAM_FILE,
    NGramDrafter,
    load_continuations,
    save_continuations,
)
from specdraft_eval.engine.sampling import Sampler
from specdraft_eval.models.targets import Target

GREEDY = Sampler(False, 1.0, 0, 1.0, None)


def test_longest_context_wins_and_the_chain_stops_where_nothing_matches():
    draft = NGramDrafter([[1, 2, 3, 4], [9, 2, 3, 7], [5, 2, 3, 7]], max_n=3, min_n=2)
    assert draft.propose([8, 2, 3], 3, GREEDY).tokens == [7]  # (2, 3) -> 7 twice, 4 once; (3, 7) never continues
    assert draft.propose([1, 2, 3], 3, GREEDY).tokens == [4]  # the 3-gram (1, 2, 3) -> 4 beats the 2-gram
    assert draft.propose([1, 2], 2, GREEDY).tokens == [3, 4]  # (1, 2) -> 3, then (1, 2, 3) -> 4
    assert draft.propose([6, 6], 4, GREEDY).tokens == []
    assert draft.propose([1, 2], 1, GREEDY).tokens == [3]  # never more than asked for


def test_ties_go_to_the_smaller_token_whatever_the_order():
    assert NGramDrafter([[1, 2, 9], [1, 2, 5]], 2, 2).propose([1, 2], 1, GREEDY).tokens == [5]
    assert NGramDrafter([[1, 2, 5], [1, 2, 9]], 2, 2).propose([1, 2], 1, GREEDY).tokens == [5]


def test_a_tree_grows_best_first_over_each_contexts_likeliest_next_tokens():
    draft = NGramDrafter([[1, 2, 3, 4, 5], [1, 2, 3, 4, 6], [1, 2, 3, 7, 8]], max_n=2, min_n=1, branches=2)
    # (2, 3) -> 4 (2/3), 7 (1/3); (3, 4) -> 5, 6 (1/2 each: 1/3 along the path); (3, 7) -> 8 (1/3 along)
    tree = draft.propose([1, 2, 3], 5, GREEDY)
    assert (tree.tokens, tree.parents) == ([4, 7, 5, 6, 8], [-1, -1, 0, 0, 1])  # ties: the earlier-found first
    assert draft.propose([1, 2, 3], 3, GREEDY).tokens == [4, 7, 5]
    assert NGramDrafter([[1, 2, 3, 4, 5]], 2, 1, branches=2).propose([9, 3], 4, GREEDY).tokens == [4, 5]


def test_ngram_trees_decode_as_the_target_does(tmp_path, tokenizer):
    import torch
    from support import hf_greedy

    from specdraft_eval.engine.loop import speculative_generate_batch

    target = tiny_llama(seed=2)
    prompts = [[3, 4, 5, 3], [4, 4, 6]]
    expected = [hf_greedy(target, torch.tensor([p]), 30) for p in prompts]
    other = [hf_greedy(tiny_llama(seed=3), torch.tensor([p]), 30) for p in prompts]  # another model's habits
    save_continuations(tmp_path, tokenizer, [p + e for p, e in zip(prompts * 2, expected + other, strict=True)], {})
    draft = load_draft(f"ngram:{tmp_path}@3", Target(target, tokenizer))
    out, stats = speculative_generate_batch(target, draft, prompts, 30, num_draft_tokens=6)
    assert out == expected and stats.accepted_tokens > 0 and stats.trees
    with pytest.raises(SpecdecError, match="ngram:DIR@B"):
        load_draft(f"ngram:{tmp_path}@0", Target(target, tokenizer))


@pytest.fixture()
def tokenizer():
    return word_tokenizer(["a", "b", "c"])


def test_saved_draft_loads_by_kind_and_by_directory(tmp_path, tokenizer):
    save_continuations(tmp_path, tokenizer, [[3, 4, 5, 3, 4, 6]], {"source": "x"})
    for spec in (f"ngram:{tmp_path}", str(tmp_path)):
        draft = load_draft(spec, Target(tiny_llama(), tokenizer))
        assert draft.propose([3, 4], 2, GREEDY).tokens == [5, 3]


@pytest.mark.parametrize("problem,message", [
    ("missing", "build an n-gram draft with `zoo ngram"),
    ("not json", "cannot read n-gram draft"),
    ("other format", "is not a specdraft-ngram/1 file"),
    ("other tokenizer", "built with another tokenizer"),
])
def test_unusable_draft_directories_are_one_line_errors(tmp_path, tokenizer, problem, message):
    if problem != "missing":
        save_continuations(tmp_path, word_tokenizer(["x", "y"]) if problem == "other tokenizer" else tokenizer, [[1,
                                                                                                                  2]],
                                                                                                                  {})
    if problem == "not json":
        (tmp_path / NGRAM_FILE).write_text('{"format": ')
    elif problem == "other format":
        (tmp_path / NGRAM_FILE).write_text(json.dumps({"format": "something"}))
    with pytest.raises(SpecdecError, match=message) as info:
        load_continuations(tmp_path, tokenizer)
    assert "\n" not in str(info.value)


def test_zoo_ngram_builds_a_draft_from_the_targets_own_continuations(tmp_path):
    model = save_tiny(tmp_path / "tiny")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("w1 w2 w3\n\nw4 w5\n\nw6\n")
    out = tmp_path / "draft"
    done = run_cli("zoo", "ngram", str(model), "--out", str(out), "--prompts", str(prompts), "--new-tokens", "12",
                   "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["prompts"] == 3 and 3 <= report["tokens"] <= 36 and report["draft"] == f"ngram:{out}"
    sequences = json.loads((out / NGRAM_FILE).read_text())["sequences"]
    assert len(sequences) == 3 and all(1 <= len(s) <= 12 for s in sequences)
    again = run_cli("zoo", "ngram", str(model), "--out", str(out), "--prompts", str(prompts))
    assert again.returncode == 1 and again.stderr.strip().startswith("zoo: error:") and "exists" in again.stderr
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    done = run_cli("zoo", "ngram", str(model), "--out", str(tmp_path / "d2"), "--prompts", str(empty))
    assert done.returncode == 1 and "has no prompts" in done.stderr and not (tmp_path / "d2").exists()
