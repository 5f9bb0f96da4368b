"""Output is cut where a stop completes before anything is counted: the speculative output has exactly plain
decoding's tokens, and tokens, TAR and per-position counts count only what is emitted up to the stop."""

from __future__ import annotations

import pytest
import torch
from support import hf_greedy, stop_when

from specdraft_eval import SpecdecError
from specdraft_eval.engine import loop
from specdraft_eval.engine.drafter import DrafterBase, Proposal
from specdraft_eval.engine.loop import autoregressive_generate_batch, speculative_generate_batch

LONG = 40


class Oracle(DrafterBase):
    """Drafts the target's own greedy continuation (every token accepted), as a chain or as a tree with a wrong
    sibling beside every node of the right path (a tree that branches below the root)."""

    def __init__(self, continuations: dict[tuple[int, ...], list[int]], tree: bool) -> None:
        self.continuations, self.tree = continuations, tree
        self.drafts_trees = tree
        self.name = "oracle-tree" if tree else "oracle"

    def propose(self, tokens, num_tokens, sampler) -> Proposal:
        prompt = next(p for p in self.continuations if tuple(tokens[: len(p)]) == p)
        done = len(tokens) - len(prompt)
        right = self.continuations[prompt][done : done + (num_tokens + 1) // 2 if self.tree else done + num_tokens]
        if not self.tree:
            return Proposal(right)
        tokens_, parents = [], []
        for depth, token in enumerate(right):  # the wrong sibling first, then the right node
            parent = len(tokens_) - 1 if depth else -1
            tokens_ += [(token + 1) % 64, token]
            parents += [parent, parent]
        return Proposal(tokens_, parents=parents)


def rows(target, count: int) -> tuple[list[list[int]], dict]:
    prompts = [torch.randint(0, 64, (4 + 3 * i,), generator=torch.Generator().manual_seed(7 + i)).tolist()
               for i in range(count)]
    return prompts, {tuple(p): hf_greedy(target, torch.tensor([p]), LONG) for p in prompts}


def stop_on(continuation: list[int], index: int):
    """A stop sequence that completes at token ``index`` of the greedy continuation: the tokens up to it."""
    return stop_when(lambda new: new[: index + 1] == continuation[: index + 1])


@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
@pytest.mark.parametrize("batch", [1, 4])
def test_a_stop_inside_an_accepted_run_cuts_there(target, tree, batch):
    prompts, continuations = rows(target, batch)
    where = [7, 11, 12, 13][:batch]  # a step accepts 4 (chain, or 4 deep) and emits 5: each cut is inside a run
    stops = lambda: [stop_on(continuations[tuple(p)], w) for p, w in zip(prompts, where)]  # noqa: E731
    gamma = 8 if tree else 4
    drafter = Oracle(continuations, tree)
    outputs, stats = speculative_generate_batch(target, drafter, prompts, LONG, num_draft_tokens=gamma, stops=stops())
    baseline, base = autoregressive_generate_batch(target, prompts, LONG, stops=stops())
    assert outputs == baseline
    assert [len(o) for o in outputs] == [w + 1 for w in where]
    assert stats.generated_tokens == base.baseline_tokens == sum(w + 1 for w in where)
    assert stats.overshoot_tokens > 0  # every row's last step emitted past its stop
    assert stats.accepted_tokens + stats.steps == stats.generated_tokens  # TAR counts only output
    # the cut step counts as if drafted only up to the stop (a tree: two nodes per depth, one of them right)
    assert stats.draft_tokens == (2 if tree else 1) * stats.accepted_tokens
    assert sum(stats.accepted_per_position) == stats.accepted_tokens


def test_negative_control_a_check_that_says_only_whether(target):
    """The old contract (stop somewhere in the tokens: keep them all) runs past the stop: the test above fails."""
    prompts, continuations = rows(target, 1)
    check = stop_on(continuations[tuple(prompts[0])], 7)
    whether = lambda new: len(new) if check(new) is not None else None  # noqa: E731
    outputs, stats = speculative_generate_batch(target, Oracle(continuations, False), prompts, LONG,
                                                num_draft_tokens=4, stops=[whether])
    assert len(outputs[0]) == 10 > 8 and stats.overshoot_tokens == 0


def test_negative_control_counting_the_whole_step(target, monkeypatch):
    """Counting the cut step's whole draft breaks TAR == output / steps."""
    monkeypatch.setattr(loop, "_counted", lambda proposal, path, kept: (len(proposal.tokens), len(path),
                                                                          proposal.depth))
    prompts, continuations = rows(target, 1)
    _, stats = speculative_generate_batch(target, Oracle(continuations, False), prompts, LONG, num_draft_tokens=4,
                                          stops=[stop_on(continuations[tuple(prompts[0])], 7)])
    assert stats.accepted_tokens + stats.steps > stats.generated_tokens


def test_eos_inside_an_accepted_run_is_counted_the_same_way(target):
    prompts, continuations = rows(target, 1)
    full = continuations[tuple(prompts[0])]
    eos = full[10]
    first = full.index(eos)
    outputs, stats = speculative_generate_batch(target, Oracle(continuations, False), prompts, LONG,
                                                num_draft_tokens=4, eos_token_id=eos)
    assert outputs[0] == full[: first + 1]
    assert stats.accepted_tokens + stats.steps == stats.generated_tokens == first + 1


def test_a_stop_check_must_say_how_many_tokens(target):
    with pytest.raises(SpecdecError, match="how many tokens to keep"):
        speculative_generate_batch(target, Oracle({(1, 2, 3): [4] * LONG}, False), [[1, 2, 3]], 8,
                                   stops=[lambda new: True])
