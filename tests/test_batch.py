"""Batched speculative decoding: each row gets what it gets alone (greedy: token for token), rows leave when done,
holes are squeezed out, and sampling at batch 4 follows the target's distribution."""

from __future__ import annotations

import contextlib
from collections import Counter

import pytest
import torch
from support import PROMPT, SAMPLES, VOCAB, drafts, exact_joint, fit, hf_greedy, stop_when, tiny_llama

from specdraft_eval.engine.kv_cache import BatchCache
from specdraft_eval.engine.loop import (
    autoregressive_generate,
    autoregressive_generate_batch,
    prefill,
    speculative_generate,
    speculative_generate_batch,
)
from specdraft_eval.engine.sampling import Sampler

KINDS = ["prompt-lookup", "layers", "other-model", "self", "reduced-head", "composite", "ngram"]


@pytest.fixture(scope="module")
def kinds(target) -> dict:
    """Every draft kind once (each generation resets its state; a batch forks it per row)."""
    return drafts(target)


def prompts(count: int = 8) -> list[list[int]]:
    """Prompts of lengths 1 to 36 (a one-token prompt has nothing to prefill), some of them repetitive."""
    generator = torch.Generator().manual_seed(11)
    rows = [torch.randint(0, 64, (1 + 5 * i,), generator=generator).tolist() for i in range(count)]
    rows[3] = [5, 6, 7, 8] * 6  # prompt lookup copies long runs here, so rows accept very different amounts
    return rows


@pytest.mark.parametrize("name", KINDS)
@pytest.mark.parametrize("gamma,dynamic", [(3, False), (5, True)])
def test_each_row_equals_its_batch_one_output(target, kinds, name, gamma, dynamic):
    rows = prompts()
    draft = kinds[name]
    singles = [speculative_generate(target, draft, row, 24, num_draft_tokens=gamma,
                                    dynamic_gamma=dynamic) for row in rows]
    for batch in (2, 4, 8):
        for start in range(0, len(rows), batch):
            outputs, stats = speculative_generate_batch(target, draft, rows[start:start + batch], 24,
                                                        num_draft_tokens=gamma, dynamic_gamma=dynamic)
            assert outputs == [new for new, _ in singles[start:start + batch]], (name, batch, start)
            assert stats.generations == len(outputs) and stats.generated_tokens == sum(map(len, outputs))
            if not dynamic:  # the same proposals row by row: the same counters, summed
                alone = [s for _, s in singles[start:start + batch]]
                assert (stats.steps, stats.draft_tokens, stats.accepted_tokens) == (
                    sum(s.steps for s in alone), sum(s.draft_tokens for s in alone),
                    sum(s.accepted_tokens for s in alone))
                assert stats.accepted_per_position == sum((s for s in alone), type(stats)()).accepted_per_position
                assert sorted(stats.request_tars) == sorted(t for s in alone for t in s.request_tars)


def test_autoregressive_batch_equals_rows_alone(target):
    rows = prompts()
    outputs, stats = autoregressive_generate_batch(target, rows, 20)
    assert outputs == [autoregressive_generate(target, row, 20)[0] for row in rows]
    assert stats.baseline_tokens == 8 * 20 and stats.baseline_seconds > 0


def test_rows_leave_at_eos_budget_and_stop(target, kinds):
    rows = prompts()
    full = [hf_greedy(target, torch.tensor([row]), 30) for row in rows]
    eos = full[0][5]  # row 0 ends at its 6th token at the latest; others where they produce it, if at all
    stops = [None, stop_when(lambda new: len(new) >= 3), None, None, stop_when(lambda new: 9 in new), None, None, None]
    outputs, _ = speculative_generate_batch(target, kinds["composite"], rows, 30, num_draft_tokens=4,
                                            eos_token_id=eos, stops=stops)
    for row, out, stop in zip(rows, outputs, stops, strict=True):
        alone, _ = speculative_generate(target, kinds["composite"], row, 30, num_draft_tokens=4,
                                        eos_token_id=eos, stop=stop)
        assert out == alone
    assert len(outputs[0]) <= 6 and outputs[0][-1] == eos
    assert len(outputs[1]) == 3  # cut where the stop completes, in the same step


def test_holes_are_squeezed_out(target, kinds, monkeypatch):
    """Rows that accept little next to one that accepts a lot leave holes; compaction removes them, losslessly."""
    squeezed = []
    compact = BatchCache.compact

    def spy(self):
        before = self.columns
        compact(self)
        if self.columns < before:
            squeezed.append((before, self.columns))

    monkeypatch.setattr(BatchCache, "compact", spy)
    rows = [[5, 6, 7, 8] * 6, *prompts(4)[:3]]
    outputs, _ = speculative_generate_batch(target, kinds["prompt-lookup"], rows, 120, num_draft_tokens=8)
    assert squeezed, "no compaction happened"
    assert outputs == [speculative_generate(target, kinds["prompt-lookup"], row, 120, num_draft_tokens=8)[0]
                       for row in rows]


def test_seeded_sampling_rows_equal_their_batch_one_output(target, kinds):
    rows = prompts()
    draft = kinds["composite"]
    alone = [speculative_generate(target, draft, row, 16, do_sample=True, seed=3, temperature=0.9)[0] for row in rows]
    together, _ = speculative_generate_batch(target, draft, rows, 16, do_sample=True, seed=3, temperature=0.9)
    assert together == alone


@pytest.mark.parametrize("name", ["layers", "other-model", "reduced-head", "eagle", "prompt-lookup"])
def test_seeded_rows_draw_their_own_streams_at_any_batch_size(target, kinds, name):
    """Seeded sampling: a row's stream is its request's and repeat's, so a batch (rows near their budget drafting
    fewer tokens than the others, and drawing only those) gives each row its batch-one sample, and the repeats of
    one prompt are different samples."""
    draft = _heads(target)["eagle"] if name == "eagle" else kinds[name]
    rows, sampled = prompts(6), {"do_sample": True, "seed": 3, "temperature": 0.9, "num_draft_tokens": 4}
    alone = [speculative_generate(target, draft, row, 13, **sampled)[0] for row in rows]
    together, _ = speculative_generate_batch(target, draft, rows, 13, **sampled)
    assert together == alone
    repeated, _ = speculative_generate_batch(target, draft, [rows[1]] * 4, 13, **sampled)
    assert repeated[0] == alone[1] and len({tuple(r) for r in repeated}) == 4
    assert repeated == [speculative_generate(target, draft, rows[1], 13, repeat=k, **sampled)[0] for k in range(4)]


@pytest.mark.parametrize("draft_kind", ["model", "prompt-lookup"])
def test_sampling_at_batch_four_follows_target_distribution(draft_kind):
    from specdraft_eval.drafts.model import ModelDrafter
    from specdraft_eval.drafts.prompt_lookup import PromptLookupDrafter

    target = tiny_llama(seed=0, vocab=VOCAB)
    draft = (ModelDrafter(tiny_llama(seed=7, vocab=VOCAB, layers=1), "d", VOCAB) if draft_kind == "model"
             else PromptLookupDrafter())
    setting = {"temperature": 0.9, "top_k": 6}
    expected = exact_joint(target, Sampler(True, **setting))
    # seed=None: the rows draw from the global generator, one stream shared by the batch. (Seed 0 with the batched
    # acceptance's draws gave p12 = 5e-4 at 2,000 samples and 0.44 at 8,000; seeds 1-3: 0.72-0.93.)
    torch.manual_seed(1)
    samples, counts = [], Counter()
    for _ in range(SAMPLES // 4):
        outputs, stats = speculative_generate_batch(target, draft, [PROMPT] * 4, 3, num_draft_tokens=3,
                                                    do_sample=True, **setting)
        samples.extend(outputs)
        counts.update(drafted=stats.draft_tokens, accepted=stats.accepted_tokens)
    assert 0 < counts["accepted"] < counts["drafted"]
    p12, p3 = fit(samples, expected)
    assert p12 > 1e-3 and p3 > 1e-3, (p12, p3)


def _heads(target) -> dict:
    """An EAGLE head (random, its fc scaled so its choices are not near-uniform) drafting chains and 2x3 trees."""
    from specdraft_eval.drafts.eagle import EagleDrafter, TreeShape, new_head

    head = new_head(target, seed=3)
    with torch.no_grad():
        head.fc.weight.mul_(4.0)
    return {"eagle": EagleDrafter(head, target, "eagle", None),
            "eagle-tree": EagleDrafter(head, target, "eagle-tree", None, TreeShape(2, 3))}


@pytest.mark.parametrize("name", ["eagle", "eagle-tree"])
@pytest.mark.parametrize("gamma,dynamic", [(3, False), (4, True)])
def test_a_batched_head_gives_each_row_its_batch_one_output(target, name, gamma, dynamic):
    """Rows of different lengths drafted in one head pass per position (chains) or per depth (trees), leaving at
    different steps: each row's output equals its own at batch 1, which equals plain decoding."""
    draft, rows = _heads(target)[name], prompts()
    singles = [speculative_generate(target, draft, row, 20, num_draft_tokens=gamma, dynamic_gamma=dynamic)[0]
               for row in rows]
    assert singles == [autoregressive_generate(target, row, 20)[0] for row in rows]
    for batch in (3, 8):
        for start in range(0, len(rows), batch):
            outputs, stats = speculative_generate_batch(target, draft, rows[start:start + batch], 20,
                                                        num_draft_tokens=gamma, dynamic_gamma=dynamic)
            assert outputs == singles[start:start + batch], (name, batch, start)
            assert stats.draft_tokens > 0


@pytest.mark.parametrize("name", ["prompt-lookup", "layers", "eagle", "eagle-tree"])
def test_head_passes_and_host_reads_per_step_do_not_grow_with_the_batch(target, kinds, name):
    """The same prompt as 1, 4 and 8 rows: every step identical across rows, so the draft's forward passes and the
    host reads per verification pass must be the same at every batch size (per-row drafting would multiply them)."""
    draft = {**kinds, **_heads(target)}[name]
    model = draft.model
    calls = [0]
    hook = model.register_forward_pre_hook(lambda module, args: calls.__setitem__(0, calls[0] + 1)) if model else None
    prompt = [5, 6, 7, 8] * 4 + [9, 10]
    seen = {}
    try:
        for batch in (1, 4, 8):
            calls[0] = 0
            _, stats = speculative_generate_batch(target, draft, [prompt] * batch, 16, num_draft_tokens=3)
            assert stats.verify_passes == stats.steps // batch
            seen[batch] = (calls[0] / stats.verify_passes, stats.host_reads / stats.verify_passes)
    finally:
        if hook:
            hook.remove()
    assert seen[1] == seen[4] == seen[8], seen
    assert seen[1][1] <= 1 + 3  # the verifier's one read, and a model draft's one per drafted position


@pytest.mark.parametrize("kernels", ["plain", "onednn"])
def test_a_padded_step_feeds_its_linear_layers_the_real_tokens_only(monkeypatch, kernels):
    """Rows that fed fewer tokens than the widest (one drafted four, the others nothing) run only their real tokens
    through the linear layers, and every real token's logits are what the padded step gives (kernels: PyTorch's
    linears and oneDNN's pre-packed ones, which the hooks must both reach). Control: with the padding fed
    (MOST_REAL 0: never gather), the linear layers see every column."""
    from specdraft_eval.engine import ragged
    from specdraft_eval.models.kernels import apply

    target = tiny_llama(seed=5, layers=2)
    if kernels == "onednn":
        apply(target, "onednn")
    prompts = [[1, 2, 3, 4, 5], [6, 7, 8], [9, 10, 11, 12], [13, 14]]
    fed = [[5, 20, 21, 22, 23], [8], [12], [14]]  # [last, *drafted]: one row drafted four tokens

    def step(most_real: float) -> tuple[torch.Tensor, set[int]]:
        monkeypatch.setattr(ragged, "MOST_REAL", most_real)
        seen: list[int] = []
        with torch.inference_mode():
            cache = prefill(target, prompts)  # padded too: gathered or not, as the step
            # (the step's own hooks come first: these count what the linear layers are handed)
            handles = [m.register_forward_pre_hook(lambda m, args: seen.append(args[0].shape[:-1].numel()))
                       for m in target.modules() if isinstance(m, torch.nn.Linear) or hasattr(m, "packed")]
            logits = cache.forward(target, fed, 5)
        for handle in handles:
            handle.remove()
        return logits, set(seen)

    gathered, seen = step(0.75)
    padded, seen_padded = step(0.0)
    assert seen_padded == {len(prompts) * 5}  # control: every column, padding included
    assert seen == {sum(map(len, fed))}  # the step's linears saw the 8 real tokens only
    for row, tokens in enumerate(fed):
        torch.testing.assert_close(gathered[row, : len(tokens)], padded[row, : len(tokens)], rtol=1e-5, atol=1e-5)


def test_a_masked_step_folds_grouped_queries_and_its_logits_match_transformers_own_attention(monkeypatch):
    """A batch's masked step of several tokens per row, under grouped-query attention (4 query heads, 2 KV heads):
    the engine folds each KV head's query heads into its queries (no copy of the cache per query head) and every
    token's logits equal transformers' own sdpa attention, which copies the keys and values per query head
    (``repeat_kv``: the control counts its calls, none in the folded step)."""
    import transformers.integrations.sdpa_attention as sdpa

    from specdraft_eval.engine import attention, kv_cache

    target = tiny_llama(seed=6, layers=2)
    assert target.config.num_key_value_heads < target.config.num_attention_heads
    prompts = [[1, 2, 3, 4, 5], [6, 7, 8], [9, 10, 11, 12]]
    fed = [[5, 20, 21], [8, 30, 31], [12, 40, 41]]
    copies = []
    real_repeat = sdpa.repeat_kv
    monkeypatch.setattr(sdpa, "repeat_kv", lambda states, n: copies.append(n) or real_repeat(states, n))

    def step() -> torch.Tensor:
        with torch.inference_mode():
            return prefill(target, prompts).forward(target, fed, 3)

    folded = step()
    assert copies == []
    monkeypatch.setattr(kv_cache, "grouped_queries", lambda width, masked: contextlib.nullcontext())
    unfolded = step()
    assert copies  # control: transformers' attention copied the cache
    assert "sdpa" not in attention.ALL_ATTENTION_FUNCTIONS._local_mapping  # the fold lasted its step only
    torch.testing.assert_close(folded, unfolded, rtol=1e-5, atol=1e-5)


def test_the_growing_cache_appends_in_place_and_holds_what_transformers_dynamic_layer_holds():
    """The same updates, crops, row selections and a replaced tensor (a compaction's gather) applied to our
    in-place layer and to transformers' ``DynamicLayer`` leave equal keys and values after every operation; an
    update with room to spare writes into the same tensor (the control: ``DynamicLayer`` allocates a new one)."""
    from transformers.cache_utils import DynamicLayer

    from specdraft_eval.engine.kv_cache import GrowingLayer

    torch.manual_seed(0)
    ours, theirs = GrowingLayer(), DynamicLayer()

    def both(operation) -> None:
        for layer in (ours, theirs):
            operation(layer)
        torch.testing.assert_close(ours.keys, theirs.keys, rtol=0, atol=0)
        torch.testing.assert_close(ours.values, theirs.values, rtol=0, atol=0)

    def update(width: int):
        keys, values = torch.randn(4, 2, width, 8), torch.randn(4 if ours.keys is None else ours.keys.shape[0],
                                                               2, width, 8)
        keys = keys[: values.shape[0]]
        return lambda layer: layer.update(keys, values)

    both(update(20))  # a prefill
    before = (ours.keys.data_ptr(), theirs.keys.data_ptr())
    both(update(1))
    assert ours.keys.data_ptr() == before[0] and theirs.keys.data_ptr() != before[1]
    both(update(5))
    both(lambda layer: layer.crop(-3))  # a rejected draft
    both(update(2))
    both(lambda layer: layer.batch_select_indices(torch.tensor([0, 2, 3])))  # a row finished
    both(update(1))
    both(lambda layer: setattr(layer, "keys", layer.keys.flip(2).contiguous()) or setattr(
        layer, "values", layer.values.flip(2).contiguous()))  # replaced, as a gather does
    both(update(40))  # past the room: moved
    both(update(1))


def test_an_sdpa_the_user_registered_is_left_alone_by_the_fold():
    """Where ``sdpa`` is not transformers' own (a user's override), a masked wide step runs the user's function and
    the override is still there after it."""
    from specdraft_eval.engine.attention import ALL_ATTENTION_FUNCTIONS, sdpa_attention_forward

    calls = []

    def users(*args, **kwargs):
        calls.append(1)
        return sdpa_attention_forward(*args, **kwargs)

    target = tiny_llama(seed=6, layers=2)
    ALL_ATTENTION_FUNCTIONS["sdpa"] = users
    try:
        with torch.inference_mode():
            prefill(target, [[1, 2, 3, 4], [5, 6]]).forward(target, [[4, 7, 8], [6, 9, 10]], 3)
        assert calls and ALL_ATTENTION_FUNCTIONS["sdpa"] is users
    finally:
        del ALL_ATTENTION_FUNCTIONS["sdpa"]
