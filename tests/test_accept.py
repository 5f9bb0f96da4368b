"""Acceptance for a whole batch on the device: the greedy rule equals the per-row walk it replaced (written out
here from its definition), on random trees with repeated sibling tokens; one host read per step whatever the
batch size. (Sampled acceptance: the chi-square tests in test_sampling.py.)"""

from __future__ import annotations

import random

import torch

from specdraft_eval.engine import host
from specdraft_eval.engine.drafter import Proposal
from specdraft_eval.engine.sampling import Sampler
from specdraft_eval.engine.verify import accept


def walk(logits: torch.Tensor, proposal: Proposal) -> tuple[list[int], int]:
    """The greedy rule, one row: from the root, move to the first child (in node order) whose token is the target's
    argmax at its parent, until none is; then the argmax there."""
    choice = logits.argmax(-1).tolist()
    path, node = [], -1
    while True:
        step = next((c for c, parent in enumerate(proposal.tree)
                     if parent == node and proposal.tokens[c] == choice[node + 1]), None)
        if step is None:
            return path, choice[node + 1]
        path.append(node := step)


def random_proposal(rng: random.Random, vocab: int) -> Proposal:
    size = rng.randrange(0, 9)
    tokens = [rng.randrange(vocab) for _ in range(size)]
    if rng.random() < 0.4:
        return Proposal(tokens)
    return Proposal(tokens, parents=[rng.randrange(-1, i) for i in range(size)])


def test_greedy_acceptance_of_a_batch_is_the_per_row_walk():
    rng, vocab = random.Random(0), 3  # 3 tokens: siblings repeat tokens, paths match often
    for trial in range(200):
        proposals = [random_proposal(rng, vocab) for _ in range(rng.randrange(1, 6))]
        width = 1 + max(len(p.tokens) for p in proposals)
        logits = torch.randn(len(proposals), width, vocab, generator=torch.Generator().manual_seed(trial))
        # make agreement likely: the argmax at each column is often the token of some child
        for row, p in enumerate(proposals):
            for node, parent in enumerate(p.tree):
                if rng.random() < 0.6:
                    logits[row, parent + 1, p.tokens[node]] += 5.0
        expected = [walk(logits[row, : len(p.tokens) + 1], p) for row, p in enumerate(proposals)]
        assert accept(logits, proposals, [Sampler()] * len(proposals)) == expected, trial


def test_one_host_read_per_step_whatever_the_batch_size():
    rng = random.Random(1)
    for rows in (1, 4, 16):
        for sampler in (Sampler(), Sampler(do_sample=True, temperature=0.8)):
            proposals = [random_proposal(rng, 5) for _ in range(rows)]
            width = 1 + max(len(p.tokens) for p in proposals)
            before = host.reads()
            accept(torch.randn(rows, width, 5), proposals, [sampler] * rows)
            assert host.reads() - before == 1
