"""Token trees: several candidate continuations per step, verified in one target pass with an ancestor mask and
depth positions. Greedy output equals transformers' own greedy ``generate`` (batch 1 and N, growing and static
caches, eager and sdpa attention); sampled output follows the target's distribution (chi-square, with a biased rule
as the negative control); the mask is checked against the same path run alone as a chain."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest
import torch
from support import PROMPT, SAMPLES, VOCAB, RandomTree, exact_joint, fit, hf_greedy, tiny_llama

from specdraft_eval.engine import verify
from specdraft_eval.engine.drafter import DrafterBase, Proposal, merge
from specdraft_eval.engine.kv_cache import BatchCache
from specdraft_eval.engine.loop import prefill, speculative_generate, speculative_generate_batch
from specdraft_eval.engine.sampling import Sampler


def test_a_tree_proposal_checks_its_shape():
    assert Proposal([5, 6, 7], parents=[-1, -1, 0]).depth == 2 and Proposal([5, 6]).tree == [-1, 0]
    with pytest.raises(ValueError, match="before their children"):
        Proposal([5, 6], parents=[1, -1])
    with pytest.raises(ValueError, match="random draws"):
        Proposal([5], probs=torch.ones(1, 8), parents=[-1])


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_the_ancestor_mask_gives_each_path_the_logits_it_gets_alone(attention):
    """Every node's logits in one tree pass equal those of its root-to-node path fed as a chain (the additive 4D
    mask and depth positions; a bool mask would be off under eager attention)."""
    model = tiny_llama(seed=3)
    model.config._attn_implementation = attention
    prompt, tokens, parents = [5, 9, 2, 7], [11, 12, 13, 14, 15], [-1, -1, 0, 0, 2]
    with torch.inference_mode():
        cache = prefill(model, [prompt])
        tree = cache.forward(model, [[prompt[-1], *tokens]], 6, trees=[[-1, 0, 0, 1, 1, 3]])[0]
        for node in range(len(tokens)):
            path, at = [], node
            while at >= 0:
                path.insert(0, tokens[at])
                at = parents[at]
            alone = model(torch.tensor([prompt + path])).logits[0, -1]
            torch.testing.assert_close(tree[1 + node], alone, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("static", [False, True])
def test_greedy_trees_give_the_targets_own_tokens(target, static):
    draft = RandomTree(target, 64)
    for seed in range(3):
        prompt = torch.randint(0, 64, (1, 5 + 6 * seed), generator=torch.Generator().manual_seed(seed))
        out, stats = speculative_generate(target, draft, prompt, 30, num_draft_tokens=6, static_cache=static)
        assert out == hf_greedy(target, prompt, 30), seed
        assert stats.accepted_tokens > 0 and stats.draft_tokens > stats.accepted_tokens
        assert len(stats.drafted_per_position) <= 6  # per depth, not per node


@pytest.mark.parametrize("static", [False, True])
def test_greedy_trees_in_batches_with_chains_beside_them(target, static):
    """Rows of different lengths, trees of different widths (padded columns see only themselves), rows leaving,
    and a chain draft's row in the same pass: each row as alone."""
    rows = [list(range(2, 2 + n)) for n in (3, 11, 6, 15)]
    expected = [hf_greedy(target, torch.tensor([row]), 40) for row in rows]
    out, _ = speculative_generate_batch(target, RandomTree(target, 64), rows, 40, num_draft_tokens=5,
                                        static_cache=static)
    assert out == expected
    out, _ = speculative_generate_batch(target, RandomTree(target, 64, oracle=False), rows, 40, num_draft_tokens=3,
                                        static_cache=static)
    assert out == expected


def test_sampled_trees_follow_the_target_distribution():
    tiny = tiny_llama(seed=0, vocab=VOCAB)
    expected = exact_joint(tiny, Sampler(True))
    torch.manual_seed(0)
    samples, drafted, accepted = [], 0, 0
    for _ in range(SAMPLES // 50):
        outputs, stats = speculative_generate_batch(tiny, RandomTree(tiny, VOCAB), [PROMPT] * 50, 3,
                                                    num_draft_tokens=4, do_sample=True)
        samples.extend(outputs)
        drafted, accepted = drafted + stats.draft_tokens, accepted + stats.accepted_tokens
    assert 0 < accepted < drafted
    p12, p3 = fit(samples, expected)
    assert p12 > 1e-3 and p3 > 1e-3, (p12, p3)


def _biased(logits, proposals, samplers):
    """A wrong rule, row by row: try each child with p(x) but leave rejected children in what it samples from."""
    verdicts = []
    for row, (proposal, sampler) in enumerate(zip(proposals, samplers, strict=True)):
        p, path, node = sampler.probs(logits[row, : len(proposal.tokens) + 1]), [], -1
        while True:
            children = [c for c, parent in enumerate(proposal.tree) if parent == node]
            step = next((c for c in children if float(torch.rand((), generator=sampler.generator))
                         < float(p[node + 1, proposal.tokens[c]])), None)
            if step is None:
                verdicts.append((path, int(sampler.sample(p[node + 1][None]))))
                break
            path.append(node := step)
    return verdicts


def test_the_test_rejects_trying_children_without_taking_out_the_rejected(monkeypatch):
    """Negative control: a rule that tries each child with p(x) but leaves rejected children in what it samples
    from emits them too often: the same fit fails."""
    tiny = tiny_llama(seed=0, vocab=VOCAB)
    monkeypatch.setattr(verify, "accept", _biased)
    expected = exact_joint(tiny, Sampler(True))
    torch.manual_seed(0)
    samples = []
    for _ in range(SAMPLES // 50):
        samples.extend(speculative_generate_batch(tiny, RandomTree(tiny, VOCAB), [PROMPT] * 50, 3,
                                                  num_draft_tokens=4, do_sample=True)[0])
    assert min(fit(samples, expected)) < 1e-6


class TopTree(DrafterBase):
    """A tree that branches below the root: the target's two likeliest tokens, the two likeliest after the first
    and the likeliest after the second (5 nodes, parents ``[-1, -1, 0, 0, 1]``), cut to the node budget."""

    name = "top-tree"
    drafts_trees = True

    def __init__(self, target) -> None:
        self.target = target
        self.ranked: dict[tuple[int, ...], list[int]] = {}  # a context's tokens by the target's probability

    def _top(self, tokens: list[int], k: int) -> list[int]:
        if (context := tuple(tokens)) not in self.ranked:  # 50 rows, one prompt, 8 tokens: contexts repeat
            with torch.inference_mode():
                self.ranked[context] = self.target(torch.tensor([tokens])).logits[0, -1].topk(VOCAB).indices
        return self.ranked[context][:k].tolist()

    def propose(self, tokens: list[int], num_tokens: int, sampler: Sampler) -> Proposal:
        a, b = self._top(tokens, 2)
        nodes = [a, b, *self._top(tokens + [a], 2), *self._top(tokens + [b], 1)][:num_tokens]
        return Proposal(nodes, parents=[-1, -1, 0, 0, 1][: len(nodes)])


def _top_tree_samples(tiny) -> tuple[list[list[int]], object]:
    torch.manual_seed(0)
    samples, total, draft = [], None, TopTree(tiny)
    for _ in range(SAMPLES // 50):
        outputs, stats = speculative_generate_batch(tiny, draft, [PROMPT] * 50, 6, num_draft_tokens=5,
                                                    do_sample=True)
        samples.extend(outputs)
        total = stats if total is None else total + stats
    return samples, total


def test_sampled_trees_that_branch_below_the_root_follow_the_target_distribution():
    """Every first step verifies a 5-node tree with siblings at depth 2 (x1 and x2 from the tree, x3 its bonus or
    a recovered token): the first three tokens follow the target's exact joint."""
    tiny = tiny_llama(seed=0, vocab=VOCAB)
    samples, stats = _top_tree_samples(tiny)
    assert stats.drafted_histogram[5] >= SAMPLES and 0 < stats.accepted_tokens < stats.draft_tokens
    assert stats.accepted_per_position[1] > 0  # paths through the depth-2 siblings were taken
    p12, p3 = fit(samples, exact_joint(tiny, Sampler(True)))
    assert p12 > 1e-3 and p3 > 1e-3, (p12, p3)


def test_negative_control_the_branching_tree_finds_the_biased_rule(monkeypatch):
    tiny = tiny_llama(seed=0, vocab=VOCAB)
    monkeypatch.setattr(verify, "accept", _biased)
    samples, _ = _top_tree_samples(tiny)
    assert min(fit(samples, exact_joint(tiny, Sampler(True)))) < 1e-6


def test_a_tree_keeps_only_its_accepted_path():
    model = tiny_llama(seed=3)
    with torch.inference_mode():
        cache: BatchCache = prefill(model, [[5, 9, 2, 7]])
        cache.forward(model, [[7, 11, 12, 13]], 4, trees=[[-1, 0, 0, 2]])
        cache.keep([[0, 2, 3]])
    assert cache.lengths == [3 + 3] and cache.mask[0].tolist() == [True] * 3 + [True, False, True, True]


def test_continuations_merge_into_a_tree_breadth_first_within_the_budget():
    merged = merge([[1, 2, 3], [1, 4], [5]], 10)
    assert (merged.tokens, merged.parents) == ([1, 5, 2, 4, 3], [-1, -1, 0, 0, 2])
    assert merge([[1, 2, 3], [1, 4], [5]], 3).tokens == [1, 5, 2]
    assert merge([[7, 8]], 5) == Proposal([7, 8]) and merge([], 5) == Proposal([])  # one continuation: a chain


def test_prompt_lookup_trees_propose_every_match_and_keep_the_targets_tokens(target):
    from specdraft_eval.drafts.prompt_lookup import KIND

    draft = KIND.load("3x4", None)
    assert draft.name == "prompt-lookup:3x4" and KIND.load("2-3x2", None).name == "prompt-lookup:2-3x2"
    proposal = draft.propose([1, 2, 3, 1, 2, 4, 1, 2, 5, 1, 2], 6, Sampler())
    assert proposal.tokens[:3] == [3, 4, 5] and proposal.parents[:3] == [-1, -1, -1]
    rows = [[3, 9, 3, 9, 4, 3, 9, 5, 3, 9, 3][: n] for n in (11, 7, 9)]
    expected = [hf_greedy(target, torch.tensor([row]), 30) for row in rows]
    for static in (False, True):
        assert speculative_generate_batch(target, draft, rows, 30, num_draft_tokens=6,
                                          static_cache=static)[0] == expected


@pytest.mark.parametrize("arg", ["3x", "3xa", "x2", "3x0"])
def test_prompt_lookup_tree_sizes_are_checked(arg):
    from specdraft_eval.drafts.prompt_lookup import KIND
    from specdraft_eval.errors import SpecdecError

    if arg == "3x":
        assert KIND.load(arg, None).branches == 1
        return
    with pytest.raises(SpecdecError, match="prompt-lookup:3x4"):
        KIND.load(arg, None)


def _reference_tree(head, embed, features: torch.Tensor, tokens: list[int], topk: int, depth: int,
                    budget: int) -> list[tuple[int, ...]]:
    """EAGLE-2's tree (``topK_genrate``) computed the slow way, as root-to-node paths in the order the drafter
    creates its nodes (per depth: the frontier by score, each node's children by rank): every node's children come
    from the head run afresh over the committed pairs and that node's own path as a chain (no tree mask, no shared
    cache), so a wrong mask or position in the drafter's one-pass-per-depth version shows up as other paths or
    another order."""
    from transformers import DynamicCache

    def hidden_after(path: tuple[int, ...]) -> torch.Tensor:
        cache, seen = DynamicCache(), len(tokens) - 1
        hidden = head(embed(torch.tensor([tokens[1:]])), features[None], cache, torch.arange(seen)[None])[:, -1:]
        for i, token in enumerate(path):
            hidden = head(embed(torch.tensor([[token]])), hidden, cache, torch.tensor([[seen + i]]), own=True)
        return hidden[0, -1]

    scores: dict[tuple[int, ...], float] = {}  # in creation order
    frontier: list[tuple[int, ...]] = [()]
    for _ in range(depth):
        children = []
        for path in frontier:
            logp = torch.log_softmax(head.logits(hidden_after(path)).float(), -1).topk(topk)
            for token, value in zip(logp.indices.tolist(), logp.values.tolist(), strict=True):
                scores[path + (token,)] = scores.get(path, 0.0) + value
                children.append(path + (token,))
        frontier = sorted(children, key=lambda c: -scores[c])[:topk]
    kept = set(sorted(scores, key=lambda c: -scores[c])[:budget])
    return [path for path in scores if path in kept]


def _paths(proposal: Proposal) -> list[tuple[int, ...]]:
    paths: list[tuple[int, ...]] = []
    for token, parent in zip(proposal.tokens, proposal.tree, strict=True):
        paths.append((paths[parent] if parent >= 0 else ()) + (token,))
    return paths


TREES = [(2, 4, 14), (3, 3, 21), (4, 3, 28), (1, 5, 5), (2, 3, 6)]
"""(top-k, depth, node budget): budgets that keep every scored node, so every head pass shapes the tree, and one
that cuts (2, 3, 6)."""
PREFIXES = [[3, 9], [5, 1, 8], [3, 9, 4, 11, 7, 2]]  # short prefixes: the tree's own nodes weigh in attention


def _matches(target, topk: int, depth: int, budget: int, static: bool, mutation: str | None = None,
             monkeypatch=None) -> list[bool]:
    """For each prefix, whether the drafter's tree equals the slow reference's, paths and order; ``mutation``
    breaks the drafter on purpose: ``mask`` (a frontier node also sees fed nodes that are not its ancestors) or
    ``position`` (tree passes one position too far)."""
    from specdraft_eval.drafts.eagle import EagleDrafter, TreeShape, new_head
    from specdraft_eval.drafts.eagle.drafter import EagleBatchDrafter

    head = new_head(target, seed=7)
    with torch.no_grad():  # larger logits (the random head's are near-uniform)
        head.fc.weight.mul_(4.0)
    drafter = EagleDrafter(head, target, "e", None, TreeShape(topk, depth))
    forward, layout = head.forward, EagleBatchDrafter._layout
    if mutation == "position":  # (the reference passes no mask: it runs unshifted)
        head.forward = lambda e, f, cache, positions, own=False, mask=None: forward(
            e, f, cache, positions + (mask is not None and mask.dim() == 4), own, mask)
    if mutation == "mask":
        def leaky(self, *args):
            laid = layout(self, *args)
            return replace(laid, visible=torch.ones_like(laid.visible))  # every fed node visible
        monkeypatch.setattr(EagleBatchDrafter, "_layout", leaky)
    found = []
    for seed, tokens in enumerate(PREFIXES):
        features = torch.randn(len(tokens) - 1, target.config.hidden_size,
                               generator=torch.Generator().manual_seed(seed))
        with torch.inference_mode():
            drafter.reset(64 if static else None)
            drafter.observe(features)
            proposal = drafter.propose(tokens, budget, Sampler())
            again = drafter.propose(tokens, budget, Sampler())  # the frontiers were rolled back
            expected = _reference_tree(head, target.get_input_embeddings(), features, tokens, topk, depth, budget)
        assert proposal.depth <= depth and _paths(again) == _paths(proposal)
        found.append(_paths(proposal) == expected and len(proposal.tokens) == min(budget, len(expected)))
    return found


@pytest.mark.parametrize(("topk", "depth", "budget"), TREES)
@pytest.mark.parametrize("static", [False, True])
def test_eagle2_dynamic_tree_matches_the_slow_reference(target, topk, depth, budget, static):
    assert all(_matches(target, topk, depth, budget, static))


@pytest.mark.parametrize("mutation", ["mask", "position"])
def test_negative_controls_a_leaky_mask_and_shifted_positions_fail_the_reference(target, mutation, monkeypatch):
    """The comparison above finds a frontier that sees non-ancestor nodes and positions shifted by one."""
    found = [ok for static in (False, True) for tree in TREES
             for ok in _matches(target, *tree, static, mutation, monkeypatch)]
    assert found.count(False) >= 5, found


def test_eagle2_trees_decode_as_the_target_does(target):
    from specdraft_eval.drafts.eagle import EagleDrafter, TreeShape, new_head

    head = new_head(target, seed=7)
    tree = EagleDrafter(head, target, "e", None, TreeShape(3, 4))
    rows = [list(range(2, 2 + n)) for n in (3, 11, 6)]
    expected = [hf_greedy(target, torch.tensor([row]), 30) for row in rows]
    for static in (False, True):
        out, stats = speculative_generate_batch(target, tree, rows, 30, num_draft_tokens=8, static_cache=static)
        assert out == expected and stats.draft_tokens > 0
        assert 1 < len(stats.drafted_per_position) <= 4  # per depth
    sampled = speculative_generate(target, tree, rows[0], 10, num_draft_tokens=8, do_sample=True, seed=0)[1]
    assert sampled.draft_tokens > sampled.steps  # sampling drafts the same (deterministic) tree


@pytest.mark.parametrize("arg", ["x3", "0", "3x0", "3xa", "a"])
def test_a_bad_eagle_tree_is_one_line(arg):
    from specdraft_eval.drafts.eagle import TreeShape
    from specdraft_eval.errors import SpecdecError

    with pytest.raises(SpecdecError, match=r"eagle:DIR@KxD"):
        TreeShape.parse(arg, f"dir@{arg}")
    assert TreeShape.parse("4", "d@4") == TreeShape(4, TreeShape.DEFAULT_DEPTH)


def test_flash_attention_refuses_a_tree_in_one_line(target):
    from specdraft_eval.errors import SpecdecError

    cache = prefill(target, [[3, 4, 5]])
    target.config._attn_implementation = "flash_attention_2"
    try:
        with pytest.raises(SpecdecError, match="sdpa or eager attention"):
            cache.forward(target, [[5, 6, 7]], 3, trees=[[-1, 0, 0]])
    finally:
        target.config._attn_implementation = "sdpa"


def test_tree_drafts_say_so_for_the_compiled_warm_up(target):
    from specdraft_eval.drafts import prompt_lookup, suffix
    from specdraft_eval.drafts.composite import CompositeDrafter
    from specdraft_eval.drafts.eagle import EagleDrafter, TreeShape, new_head
    from specdraft_eval.drafts.ngram import NGramDrafter

    head = new_head(target, seed=7)
    assert EagleDrafter(head, target, "e", None, TreeShape(2, 3)).drafts_trees
    assert not EagleDrafter(head, target, "e", None).drafts_trees
    assert prompt_lookup.KIND.load("3x2", None).drafts_trees and not prompt_lookup.KIND.load("3", None).drafts_trees
    assert NGramDrafter([[1, 2, 3]], branches=2).drafts_trees and not NGramDrafter([[1, 2, 3]]).drafts_trees
    assert suffix.KIND.load("tree", None).drafts_trees and not suffix.KIND.load(None, None).drafts_trees
    assert CompositeDrafter([prompt_lookup.KIND.load("3", None), suffix.KIND.load("tree", None)]).drafts_trees


class RootSiblings(DrafterBase):
    """The target's ``k`` likeliest next tokens as siblings under the root (a tree's first depth, as EAGLE-2's
    drafts it): verification tries them in turn, each against what the earlier rejections left."""

    name = "root-siblings"
    drafts_trees = True

    def __init__(self, target, k: int) -> None:
        self.target, self.k, self.known = target, k, {}

    def propose(self, tokens: list[int], num_tokens: int, sampler: Sampler) -> Proposal:
        if tuple(tokens) not in self.known:
            with torch.inference_mode():
                self.known[tuple(tokens)] = self.target(torch.tensor([tokens])).logits[0, -1].topk(self.k).indices
        top = self.known[tuple(tokens)].tolist()[:num_tokens]
        return Proposal(top, parents=[-1] * len(top))


def first_token_law(p: list[float], children: list[int], rule: str) -> list[float]:
    """The exact law of the first emitted token when deterministic siblings ``children`` are tried in turn against
    the target's distribution ``p`` (each accepted with probability min(1, r(x)), r the residual), then the next
    token drawn from r, under ``rule``: ``correct`` (a rejected child's token zeroed and r renormalised), ``no
    renormalisation`` (zeroed, not renormalised: later siblings accepted too rarely) or ``wrong residual`` (a
    rejected child left in r: it can still be drawn)."""
    residual, law, staying = list(p), [0.0] * len(p), 1.0
    for child in children:
        accepted = min(1.0, residual[child])
        law[child] += staying * accepted
        staying *= 1 - accepted
        if rule == "wrong residual":
            continue
        residual[child] = 0.0
        if rule == "correct":
            residual = [r / sum(residual) for r in residual]
    return [emitted + staying * r / sum(residual) for emitted, r in zip(law, residual, strict=True)]


MUTANTS = {  # the engine's own rule with one line changed (verify._sampled's source, edited and compiled)
    "no renormalisation": ("rest = torch.where(total > 0, rest / total.clamp_min(torch.finfo(rest.dtype).tiny), "
                           "p[index, current + 1])", "rest = torch.where(total > 0, rest, p[index, current + 1])"),
    "wrong residual": ("rest = residual.scatter(1, token, 0.0)", "rest = residual.clone()"),
}


def _mutate(monkeypatch, rule: str) -> None:
    import inspect
    import textwrap

    source = textwrap.dedent(inspect.getsource(verify._sampled))
    line, replacement = MUTANTS[rule]
    assert source.count(line) == 1, f"verify._sampled changed: update the {rule!r} mutant"
    namespace = dict(vars(verify))
    exec(compile(source.replace(line, replacement), verify.__file__, "exec"), namespace)
    monkeypatch.setattr(verify, "_sampled", namespace["_sampled"])


@pytest.mark.parametrize("rule", ["correct", "no renormalisation", "wrong residual"])
def test_sampled_siblings_follow_the_target_and_each_plausible_wrong_rule_fails_with_power(monkeypatch, rule):
    """The first token after a root of four sibling candidates (the target's likeliest, so each rejection matters):
    its law is the target's (chi-square, p > 1e-3). Each plausible wrong rule (:data:`MUTANTS`, the engine's own code
    with one line changed) has an exact law of its own (:func:`first_token_law`), from which the test's power
    against it is computed before sampling: at least 99%; the mutant then fails the same test."""
    from scipy.stats import chi2, ncx2
    from support import chi2_pvalue

    tiny = tiny_llama(seed=0, vocab=VOCAB)
    with torch.inference_mode():
        p = torch.softmax(tiny(torch.tensor([PROMPT])).logits[0, -1].double(), -1).tolist()
    children = sorted(range(VOCAB), key=lambda t: -p[t])[:4]
    assert first_token_law(p, children, "correct") == pytest.approx(p, abs=1e-12)  # the rule is lossless
    if rule != "correct":
        law = first_token_law(p, children, rule)
        noncentrality = SAMPLES * sum((m - q) ** 2 / q for m, q in zip(law, p, strict=True))
        power = ncx2.sf(chi2.isf(1e-3, VOCAB - 1), VOCAB - 1, noncentrality)
        assert power >= 0.99, (rule, noncentrality, power)
        _mutate(monkeypatch, rule)
    firsts, draft = [], RootSiblings(tiny, 4)
    for batch in range(SAMPLES // 250):  # one step per row: a stop after its first token
        outputs, _ = speculative_generate_batch(tiny, draft, [PROMPT] * 250, 5, num_draft_tokens=4, do_sample=True,
                                                seed=batch, stops=[lambda new: 1] * 250)
        firsts.extend(out[0] for out in outputs)
    observed = Counter((token,) for token in firsts)
    pvalue = chi2_pvalue(observed, {(t,): p[t] for t in range(VOCAB)}, [(t,) for t in range(VOCAB)], len(firsts))
    assert (pvalue > 1e-3) == (rule == "correct"), (rule, pvalue)
