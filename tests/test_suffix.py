"""``suffix``: ArcticInference's suffix tree driven as vLLM's proposer drives it.

The reference is a transcription of vLLM's ``SuffixDecodingProposer.propose`` (``vllm/v1/spec_decode/
suffix_decoding.py``: a request's prompt starts it, each step's sampled tokens are added before it speculates on the
last ``max_tree_depth`` tokens with ``max_spec_tokens`` = γ) replayed over the token streams our engine produced;
negative controls show the comparison tells other conventions apart (outputs added only when a request ends, as our
earlier implementation did; no global cache). Worked examples check upstream's own definition (every match length
scored by the sum of its tokens' count ratios, drafts capped at ``max_spec_factor × match``, ``min_token_prob``)."""

from __future__ import annotations

import pytest
import torch
from arctic_inference.suffix_decoding import SuffixDecodingCache
from support import hf_greedy, tiny_llama

from specdraft_eval.drafts.spec import DraftSpec
from specdraft_eval.drafts.suffix import KIND, SuffixDrafter
from specdraft_eval.engine.loop import speculative_generate_batch
from specdraft_eval.engine.sampling import Sampler
from specdraft_eval.errors import SpecdecError


class Recording(SuffixDrafter):
    """Our drafter, logging (request, tokens, budget, drafted tokens) at every step of every row, and (request,
    tokens, None, None) each time the engine shows it a row's tokens without asking for a draft."""

    def __init__(self, cache, log: list) -> None:
        super().__init__(cache)
        self.log = log

    def fork(self) -> Recording:
        return Recording(self.cache, self.log)

    def see(self, tokens):
        super().see(tokens)
        self.log.append((self.request, list(tokens), None, None))

    def propose(self, tokens, num_tokens, sampler):
        proposal = super().propose(tokens, num_tokens, sampler)
        self.log.append((self.request, list(tokens), num_tokens, proposal.tokens))
        return proposal


def vllm_replay(log: list, max_tree_depth: int = 24, max_cached_requests: int = 10000, max_spec_factor: float = 1.0,
                min_token_prob: float = 0.1, add_when_done: bool = False) -> list[list[int]]:
    """What vLLM's proposer drafts at each logged step (its ``propose``, transcribed): a request not yet active
    starts with its prompt; the tokens sampled since its last step are added, then it speculates (an entry without
    a budget only adds). ``add_when_done`` (a negative control): responses join the global cache only once their
    request has ended."""
    cache = SuffixDecodingCache(max_tree_depth=max_tree_depth, max_cached_requests=max_cached_requests)
    seen: dict[int, int] = {}  # request -> tokens the cache has
    pending: dict[int, list[int]] = {}
    drafts = []
    for request, tokens, budget, _ in log:
        if request not in cache.active_requests:
            for finished, response in pending.items():  # (the control) earlier requests' outputs, now
                if finished != request and response and finished in cache.active_requests:
                    cache.add_active_response(finished, response)
                    pending[finished] = []
            cache.start_request(request, tokens)
            seen[request] = len(tokens)
        sampled = tokens[seen[request]:]
        seen[request] = len(tokens)
        if sampled and add_when_done:
            pending[request] = pending.get(request, []) + sampled
        elif sampled:
            cache.add_active_response(request, sampled)
        if budget is None:
            continue
        draft = cache.speculate(request, tokens[-max_tree_depth:], max_spec_tokens=budget,
                                max_spec_factor=max_spec_factor, min_token_prob=min_token_prob)
        drafts.append(list(draft.token_ids))
    return drafts


def _stream(arg: str | None, rows: int, passes: int = 2) -> tuple[list, list[list[int]]]:
    """Our engine's log over ``passes`` runs of the same prompts (the later ones find the earlier outputs)."""
    target = tiny_llama(seed=3)
    log: list = []
    draft = Recording(KIND.load(arg, None).cache, log)
    prompts = [[2 + i, 9, 9, 4, 2 + i, 9, 5] for i in range(rows)]
    expected = [hf_greedy(target, torch.tensor([p]), 48) for p in prompts]
    for _ in range(passes):
        out, _ = speculative_generate_batch(target, draft, prompts, 48, num_draft_tokens=8)
        assert out == expected  # lossless, whatever it drafts
    return log, [entry[3] for entry in log if entry[2] is not None]


@pytest.mark.parametrize("rows", [1, 3])
def test_suffix_drafts_what_vllms_proposer_drafts_on_the_same_stream(rows):
    log, ours = _stream(None, rows)
    assert sum(map(len, ours)) > 50 and len({entry[0] for entry in log}) == 2 * rows
    assert ours == vllm_replay(log)
    # negative controls: the comparison tells these conventions apart on this stream
    assert ours != vllm_replay(log, add_when_done=True)  # outputs added only once a request ends
    assert ours != vllm_replay(log, max_cached_requests=0)  # no global cache of earlier outputs
    assert ours != vllm_replay(log, max_spec_factor=2.0)


def test_parameters_reach_the_cache_as_vllm_passes_them():
    log, ours = _stream("?max_tree_depth=12&max_spec_factor=0.5&min_token_prob=0.3", 2)
    assert ours == vllm_replay(log, max_tree_depth=12, max_spec_factor=0.5, min_token_prob=0.3)
    assert ours != vllm_replay(log)
    log, ours = _stream("?max_cached_requests=0", 2)
    assert ours == vllm_replay(log, max_cached_requests=0)


def test_upstreams_definition_on_worked_examples():
    """[1 2 3 4 5 1 2 3]: every match length ends in a token followed once of twice (the other at the end), so each
    drafted token is 0.5 likely; the draft is capped at the match length (factor 1): "3" drafts [4], "2 3" [4 5],
    "1 2 3" [4 5 1] with the best score (1.5); the longest match wins ties."""
    draft = KIND.load(None, None)
    assert draft.propose([1, 2, 3, 4, 5, 1, 2, 3], 8, Sampler()).tokens == [4, 5, 1]
    assert draft.propose([1, 2, 3, 4, 5, 1, 2, 3], 2, Sampler()).tokens == [4, 5]  # γ caps it
    cache = SuffixDecodingCache(max_tree_depth=24)
    cache.start_request(0, [1, 2, 3, 4, 5, 1, 2, 3])
    best = cache.speculate(0, [1, 2, 3, 4, 5, 1, 2, 3], max_spec_tokens=8)
    assert (best.token_ids, best.probs, best.score, best.match_len) == ([4, 5, 1], [0.5] * 3, 1.5, 3)
    # "3 7 8" occurred 3 times before (then 9, 9, 6) and once at the end: 9 is 2/4 likely, 6 1/4, and after "3 7 8 9"
    # 0 and 1 are 1/4 each; the draft is at most 3 long (the match is)
    corpus = [3, 7, 8, 9, 0, 3, 7, 8, 9, 1, 3, 7, 8, 6, 2, 3, 7, 8]
    cache.start_request(1, corpus)
    path = cache.speculate(1, corpus, max_spec_tokens=8)
    assert (path.token_ids[0], path.probs, path.score, path.match_len) == (9, [0.5, 0.25, 0.25], 1.0, 3)
    assert cache.speculate(1, corpus, max_spec_tokens=8, min_token_prob=0.3).token_ids == [9]
    tree = cache.speculate(1, corpus, max_spec_tokens=8, use_tree_spec=True)
    assert tree.token_ids[0] == 9 and sorted(tree.probs) == [0.25, 0.25, 0.5] and tree.score == 1.0
    assert KIND.load(None, None).propose(corpus, 8, Sampler()).tokens == path.token_ids
    ours = KIND.load("tree", None).propose(corpus, 8, Sampler())
    assert ours.tokens == tree.token_ids and ours.tree == tree.parents


def test_min_score_leaves_weak_drafts_to_the_next_part_as_arctics_hybrid_does():
    from specdraft_eval.drafts.composite import CompositeDrafter
    from specdraft_eval.drafts.prompt_lookup import PromptLookupDrafter

    tokens = [1, 2, 3, 4, 5, 1, 2, 3]  # suffix's best draft: [4 5 1], score 1.5
    assert KIND.load("?min_score=1.5", None).propose(tokens, 8, Sampler()).tokens == [4, 5, 1]
    assert KIND.load("?min_score=1.6", None).propose(tokens, 8, Sampler()).tokens == []
    both = CompositeDrafter([KIND.load("?min_score=2", None), PromptLookupDrafter(3)])
    assert both.propose(tokens, 8, Sampler()).tokens == PromptLookupDrafter(3).propose(tokens, 8, Sampler()).tokens
    assert both.used == [0, 1]


def test_responses_join_the_cache_as_they_are_generated_and_the_record_counts_them():
    draft = KIND.load(None, None)
    draft.propose([5, 6, 7], 4, Sampler())
    draft.propose([5, 6, 7, 8, 9, 10], 4, Sampler())  # 8 9 10 generated: in the global cache already
    other = draft.fork()
    assert other.propose([40, 8, 9], 4, Sampler()).tokens == [10]  # another row finds them at once
    state = draft.describe()["suffix_cache"]
    assert (state["tokens_at_start"], state["tokens_at_end"], state["warm"]) == (0, 3, False)
    assert not state["persisted_across_runs"]
    draft.reset()
    assert KIND.load(None, None).describe()["suffix_cache"]["tokens_at_end"] == 0  # a new run starts empty


@pytest.mark.parametrize("rows", [1, 4])
@pytest.mark.parametrize("arg", [None, "tree", "?max_cached_requests=0"])
def test_suffix_decodes_as_the_target_does(rows, arg):
    target = tiny_llama(seed=1)
    prompts = [[2 + i, 7, 7, 9, 2 + i, 7] for i in range(rows)]
    expected = [hf_greedy(target, torch.tensor([p]), 40) for p in prompts]
    draft = KIND.load(arg, None)
    for _ in range(2):  # the second pass drafts from the first one's outputs too
        out, stats = speculative_generate_batch(target, draft, prompts, 40, num_draft_tokens=6)
        assert out == expected and stats.accepted_tokens > 0


def test_settings_parse_name_and_refuse_in_one_line():
    assert DraftSpec.parse("suffix:tree?min_token_prob=0.2&max_tree_depth=64").value.name == \
        "suffix:tree?max_tree_depth=64&min_token_prob=0.2"  # the record's name: non-defaults, in one order
    assert KIND.load(None, None).name == "suffix" and not KIND.load(None, None).drafts_trees
    assert KIND.load("tree", None).drafts_trees
    for bad, message in [("global", "draft=suffix:tree"), ("?max_tree_depth=x", "not an integer"),
                         ("?depth=3", "max_tree_depth=..."), ("?min_token_prob=2", "out of range")]:
        with pytest.raises(SpecdecError, match=message):
            KIND.load(bad, None)
    parsed = DraftSpec.parse("suffix|prompt-lookup:2-3")
    assert parsed.with_parameters({"max_tree_depth": "32"}) == "suffix?max_tree_depth=32|prompt-lookup:2-3"
    with pytest.raises(SpecdecError, match="setting of draft kind 'suffix'"):
        DraftSpec.parse("prompt-lookup").with_parameters({"min_token_prob": 0.2})


def test_model_args_fold_into_the_draft_string():
    from specdraft_eval.integration.model_args import SpecdecArgs

    args = {"draft": "suffix:tree", "max_tree_depth": 64, "min_token_prob": "0.2", "dtype": "float32"}
    assert SpecdecArgs.take(args).draft == "suffix:tree?max_tree_depth=64&min_token_prob=0.2"
    assert args == {"dtype": "float32"}  # the rest is the hf model's
    with pytest.raises(SpecdecError, match="draft 'auto' has no part"):
        SpecdecArgs.take({"draft": "auto", "max_spec_factor": 2})


def test_a_zoo_ngram_directory_warms_the_cache(tmp_path):
    from support import word_tokenizer

    from specdraft_eval.drafts.ngram import save_continuations
    from specdraft_eval.models.targets import Target

    tokenizer = word_tokenizer(["a", "b", "c"])
    save_continuations(tmp_path, tokenizer, [[5, 6, 7, 8, 9]], {})
    draft = KIND.load(str(tmp_path), Target(tiny_llama(), tokenizer))
    assert draft.name == f"suffix:{tmp_path}"
    assert draft.propose([1, 2, 6, 7], 4, Sampler()).tokens == [8, 9]  # from the first request on
    state = draft.describe()["suffix_cache"]
    assert state["warm"] and state["tokens_at_start"] == 5 and state["warmed_from"] == str(tmp_path)
    assert DraftSpec.parse(f"suffix:tree:{tmp_path}").value.warm_from == str(tmp_path)
    assert DraftSpec.parse(f"suffix:{tmp_path}").path() == tmp_path and DraftSpec.parse("suffix").path() is None
    with pytest.raises(SpecdecError, match="zoo ngram"):
        KIND.load(str(tmp_path / "missing"), None)
    with pytest.raises(SpecdecError, match="would warm nothing"):
        KIND.load(f"{tmp_path}?max_cached_requests=0", None)


@pytest.mark.parametrize("shared", [False, True])
def test_every_measured_repeat_starts_from_a_fresh_cache(monkeypatch, shared):
    """zoo bench's repeats (the batch study's sessions) each measure a fresh draft: equal TAR on every repeat of
    the same prompts. The control shares one drafter's cache across repeats, as before: the later repeats find
    the earlier repeats' answers and accept far more."""
    from specdraft_eval.engine.params import RunSettings
    from zoo.measure.bench.batch import _measure

    if shared:
        monkeypatch.setattr(SuffixDrafter, "fresh", lambda self: self)
    target = tiny_llama(seed=3)
    prompts = [[2 + i, 9, 9, 4, 2 + i, 9, 5] for i in range(3)]
    expected = [hf_greedy(target, torch.tensor([p]), 32) for p in prompts]
    _, totals = _measure(target, KIND.load(None, None), RunSettings(), prompts, expected, 3, 3, 32, lambda: None)
    tars = [t.tar for t in totals]
    if shared:
        assert tars[1] > tars[0] * 1.2 and tars[2] > tars[0] * 1.2, tars
    else:
        assert tars == [tars[0]] * 3 and tars[0] > 1, tars


def test_fresh_keeps_the_warm_start_and_nothing_else(tmp_path):
    from support import word_tokenizer

    from specdraft_eval.drafts.composite import CompositeDrafter
    from specdraft_eval.drafts.ngram import save_continuations
    from specdraft_eval.models.targets import Target

    tokenizer = word_tokenizer(["a", "b", "c"])
    save_continuations(tmp_path, tokenizer, [[5, 6, 7, 8, 9]], {})
    draft = KIND.load(str(tmp_path), Target(tiny_llama(), tokenizer))
    draft.propose([1, 2, 3, 4, 11, 12, 13], 4, Sampler())
    draft.propose([1, 2, 3, 4, 11, 12, 13, 14, 15], 4, Sampler())  # its response joins the cache
    assert draft.describe()["suffix_cache"]["tokens_at_end"] == 7
    again = draft.fresh()
    assert again.cache is not draft.cache and again.describe()["suffix_cache"]["tokens_at_end"] == 5
    composite = CompositeDrafter([draft, KIND.load(None, None)]).fresh()
    assert [part.describe()["suffix_cache"]["tokens_at_end"] for part in composite.parts] == [5, 0]


def _probe(cache: SuffixDecodingCache, outputs: list[list[int]]) -> list[tuple[float, int]]:
    """What the global cache of responses holds, read through a new request with an empty prompt: for the window of
    every length up to 24 ending at every position of every output, the longest match and the likeliest next
    token's probability (its count over the context's). One token only: which of two tied continuations a longer
    draft follows depends on the order tokens arrived in, the counts do not."""
    cache.start_request(-1, [])
    drafts = []
    for out in outputs:
        for end in range(1, len(out) + 1):
            for n in range(1, min(end, 24) + 1):
                draft = cache.speculate(-1, out[end - n: end], max_spec_tokens=1, max_spec_factor=4.0,
                                        min_token_prob=0.0)
                drafts.append((round(draft.score, 6), draft.match_len))
    cache.stop_request(-1)
    return drafts


class LateGamma:
    """γ 0 for a batch's first six steps, then 4 (as dynamic γ backs off where drafting does not pay)."""

    max_num_draft_tokens = 4

    def __init__(self) -> None:
        self.steps = 0

    def next_step(self, rows: int, prober: int = 0) -> list[int]:
        self.steps += 1
        return [0 if self.steps <= 6 else 4] * rows

    def update(self, *measured, asked=None) -> None:
        """Nothing to learn."""


@pytest.mark.parametrize("control", [None, "late first call", "last step dropped"])
def test_the_cache_holds_every_response_whole_as_vllms_proposer_leaves_it(monkeypatch, control):
    """Worked from vLLM's rules, not from our call log: a request starts with its prompt and every token it samples
    joins its response, its last step's included, so after a run the global cache holds each (prompt, output)
    pair's output whole. The batch's first steps decode plainly (the draft is first asked late, as where dynamic
    γ backs off) and rows finish at different steps. The controls are the engine before, one defect each: rows at
    budget 0 not shown their tokens (a late first call puts generated tokens into the prompt's tree), a finished
    row's last step never joining."""
    from specdraft_eval.engine.drafter import Proposal, RowByRowDrafter

    if control == "last step dropped":
        monkeypatch.setattr(RowByRowDrafter, "see", lambda self, tokens, rows: None)
        monkeypatch.setattr(SuffixDrafter, "see", lambda self, tokens, _real=SuffixDrafter.see: _real(self, tokens)
                            if self.request is None else None)  # ... but a request still starts with its prompt
        monkeypatch.setattr(SuffixDrafter, "propose", lambda self, tokens, n, sampler, _real=SuffixDrafter.propose,
                            _see=SuffixDrafter.see: (_see(self, tokens), _real(self, tokens, n, sampler))[1])
    if control == "late first call":
        monkeypatch.setattr(RowByRowDrafter, "propose", lambda self, tokens, budgets, samplers: [
            d.propose(t, b, s) if b > 0 else Proposal([]) for d, t, b, s in
            zip(self.drafters, tokens, budgets, samplers, strict=True)])
        monkeypatch.setattr(RowByRowDrafter, "see", lambda self, tokens, rows, _real=RowByRowDrafter.see: _real(
            self, tokens, [row for row in rows if self.drafters[row].request is not None]))  # never at the prefill
    target = tiny_llama(seed=3)
    prompts = [[2 + i, 9, 9, 4, 2 + i, 9, 5] for i in range(3)] + [[7, 3, 7, 3]]
    draft = KIND.load(None, None)
    outputs = []
    for budget in (40, 17):  # two batches: the second's rows find the first's responses
        out, _ = speculative_generate_batch(target, draft, prompts, budget, gamma_controller=LateGamma())
        assert out == [hf_greedy(target, torch.tensor([p]), budget) for p in prompts]
        outputs += out
    ours = draft.cache.cache
    for request in list(ours.active_requests):
        ours.stop_request(request)
    reference = SuffixDecodingCache(max_tree_depth=24, max_cached_requests=10000)
    for request, (prompt, output) in enumerate(zip(prompts * 2, outputs, strict=True)):
        reference.start_request(request, prompt)
        reference.add_active_response(request, output)
        reference.stop_request(request)
    assert (_probe(ours, outputs) == _probe(reference, outputs)) == (control is None)
