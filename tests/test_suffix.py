"""``suffix``: suffix decoding over the request's text and the run's earlier outputs. The proposals are checked
against trees worked out by hand from the definition (occurrences of the longest earlier suffix, each node's
probability its share of them, best-first, at least MIN_PROB), greedy output against transformers' own."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_llama
from test_engine import hf_greedy

from specdraft_eval.drafts.suffix import KIND, MIN_PROB, _best_first
from specdraft_eval.engine.loop import speculative_generate, speculative_generate_batch
from specdraft_eval.engine.sampling import Sampler
from specdraft_eval.errors import SpecdecError


def _paths(proposal) -> dict[tuple[int, ...], int]:
    paths: list[tuple[int, ...]] = []
    for token, parent in zip(proposal.tokens, proposal.tree, strict=True):
        paths.append((paths[parent] if parent >= 0 else ()) + (token,))
    return {path: i for i, path in enumerate(paths)}


def test_the_longest_earlier_suffix_proposes_what_followed_it_as_a_counted_tree():
    draft = KIND.load("local", None)
    # "0 9 1 2 3" occurred twice before (then 5 6 7 8 0, then 4 6 7 8 10); "1 2 3" once more at the start (then
    # 4), which the longer matches overrule
    tokens = [1, 2, 3, 4, 0, 9, 1, 2, 3, 5, 6, 7, 8, 0, 9, 1, 2, 3, 4, 6, 7, 8, 10, 0, 9, 1, 2, 3]
    proposal = draft.propose(tokens, 16, Sampler())
    # match length 5: at most 5 deep; each branch holds half the occurrences (>= MIN_PROB)
    assert set(_paths(proposal)) == {(5,), (5, 6), (5, 6, 7), (5, 6, 7, 8), (5, 6, 7, 8, 0), (4,), (4, 6),
                                     (4, 6, 7), (4, 6, 7, 8), (4, 6, 7, 8, 10)}
    assert proposal.tokens[:2] == [5, 4]  # best-first: both depth-1 nodes (p = 0.5) before any deeper one
    assert len(draft.propose(tokens, 3, Sampler()).tokens) == 3  # the budget caps the nodes
    chain = draft.propose([7, 1, 2, 3, 1, 2], 8, Sampler())  # one occurrence of "1 2" (length 2): 2 deep
    assert chain.parents is None and chain.tokens == [3, 1]
    assert draft.propose([1, 2, 3, 4], 8, Sampler()).tokens == []  # "3 4" never occurred before


@pytest.mark.parametrize("occurrences", [9, 12])
def test_continuations_less_likely_than_min_prob_are_left_out(occurrences):
    continuations = [[7, 8] if i == 3 else [5, 6] for i in range(occurrences)]  # 5 6 every time but once
    proposal = _best_first(continuations, 8)
    assert proposal.tokens[:2] == [5, 6]
    assert (proposal.tokens[2:] == [7, 8]) == (1 / occurrences >= MIN_PROB)


def test_earlier_outputs_of_the_run_are_searched_and_not_concurrent_ones():
    target = tiny_llama(seed=0)
    draft = KIND.load(None, None)
    prompt = [3, 4, 5]
    first, _ = speculative_generate(target, draft, prompt, 24, num_draft_tokens=4)
    local = KIND.load("local", None)
    context = [60, 61, *first[4:6]]  # a bigram of the first output, in a new prompt
    draft.reset()
    assert draft.propose(context, 4, Sampler()).tokens[:1] == first[6:7]
    assert local.propose(context, 4, Sampler()).tokens == []
    # a batch: rows see the outputs of earlier generations, then their own rows' only after the batch
    twin = KIND.load(None, None)
    rows = [[3, 4, 5], [9, 8, 7, 6]]
    out, _ = speculative_generate_batch(target, twin, rows, 20, num_draft_tokens=4)
    forked = twin.fork()
    forked.reset()
    stored = list(forked.corpus.outputs)  # each row's output up to its last drafting step (≤ γ + 1 short)
    assert len(stored) == len(rows)
    assert all(any(o[:len(s)] == s and len(o) - 5 <= len(s) < len(o) for o in out) for s in stored)


@pytest.mark.parametrize("rows", [1, 4])
@pytest.mark.parametrize("arg", [None, "local"])
def test_suffix_decodes_as_the_target_does(rows, arg):
    target = tiny_llama(seed=1)
    prompts = [[2 + i, 7, 7, 9, 2 + i, 7] for i in range(rows)]
    expected = [hf_greedy(target, torch.tensor([p]), 40) for p in prompts]
    draft = KIND.load(arg, None)
    for _ in range(2):  # the second pass drafts from the first one's outputs too
        out, stats = speculative_generate_batch(target, draft, prompts, 40, num_draft_tokens=6)
        assert out == expected and stats.accepted_tokens > 0


def test_a_bad_suffix_option_is_one_line():
    with pytest.raises(SpecdecError, match="draft=suffix:local"):
        KIND.load("global", None)


def test_a_zoo_ngram_directory_seeds_the_corpus(tmp_path):
    from conftest import word_tokenizer

    from specdraft_eval.drafts.ngram import save_continuations
    from specdraft_eval.drafts.spec import DraftSpec
    from specdraft_eval.models.targets import Target

    tokenizer = word_tokenizer(["a", "b", "c"])
    save_continuations(tmp_path, tokenizer, [[5, 6, 7, 8, 9]], {})
    draft = KIND.load(str(tmp_path), Target(tiny_llama(), tokenizer))
    assert draft.name == f"suffix:{tmp_path}"
    assert draft.propose([1, 2, 6, 7], 4, Sampler()).tokens == [8, 9]  # from the first request on
    assert DraftSpec.parse(f"suffix:{tmp_path}").path() == tmp_path and DraftSpec.parse("suffix:local").path() is None
    with pytest.raises(SpecdecError, match="zoo ngram"):
        KIND.load(str(tmp_path / "missing"), None)
