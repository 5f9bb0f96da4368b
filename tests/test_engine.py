"""The engine is lossless: greedy equals the target's own greedy decoding, token for token."""

from __future__ import annotations

import pytest
import torch
from support import drafts, hf_greedy, stop_when, tiny_llama

from specdraft_eval import SpecdecError, autoregressive_generate, speculative_generate
from specdraft_eval.drafts.model import ModelDrafter
from specdraft_eval.drafts.prompt_lookup import PromptLookupDrafter


@pytest.mark.parametrize("name", ["prompt-lookup", "layers", "other-model", "self", "reduced-head", "composite",
                                  "ngram"])
@pytest.mark.parametrize("gamma,dynamic", [(1, False), (3, False), (5, True)])
def test_greedy_matches_transformers_generate(target, name, gamma, dynamic):
    draft = drafts(target)[name]
    for seed in range(4):
        prompt = torch.randint(0, 64, (1, 5 + 7 * seed), generator=torch.Generator().manual_seed(seed))
        expected = hf_greedy(target, prompt, 30)
        out, stats = speculative_generate(target, draft, prompt, 30, num_draft_tokens=gamma, dynamic_gamma=dynamic)
        assert out == expected
        assert stats.generated_tokens == 30
        assert stats.accepted_tokens <= stats.draft_tokens
        assert stats.steps + stats.accepted_tokens >= 30  # each step emits accepted + 1


def test_self_draft_accepts_everything(target):
    prompt = torch.arange(10)[None]
    _, stats = speculative_generate(target, ModelDrafter(target, "self", 64), prompt, 20, num_draft_tokens=4)
    summary = stats.summary()
    assert summary["acceptance_rate"] == 1.0
    assert summary["tar"] == 5.0 and summary["accepted_per_step"] == 4.0


def test_autoregressive_baseline_matches_generate(target):
    prompt = torch.arange(3, 12)[None]
    out, stats = autoregressive_generate(target, prompt, 25)
    assert out == hf_greedy(target, prompt, 25)
    assert stats.baseline_tokens == 25 and stats.baseline_seconds > 0


def test_eos_ends_generation_and_is_kept(target):
    prompt = torch.arange(8)[None]
    full = hf_greedy(target, prompt, 30)
    eos = full[12]
    first = full.index(eos)
    out, _ = speculative_generate(target, PromptLookupDrafter(), prompt, 30, eos_token_id=eos)
    assert out == full[: first + 1]


def test_stop_callback_and_budget(target):
    prompt = torch.arange(8)[None]
    out, _ = speculative_generate(target, drafts(target)["self"], prompt, 30, stop=stop_when(lambda new: len(new) >= 7))
    assert len(out) == 7
    out, _ = speculative_generate(target, drafts(target)["self"], prompt, 6, num_draft_tokens=4)
    assert len(out) == 6
    assert speculative_generate(target, PromptLookupDrafter(), prompt, 0)[0] == []


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"num_draft_tokens": 0}, "num_draft_tokens must be an integer >= 1"),
        ({"num_draft_tokens": -3}, "num_draft_tokens must be an integer >= 1"),
        ({"do_sample": True, "temperature": 0.0}, "temperature must be > 0"),
        ({"do_sample": True, "top_p": 1.5}, "top_p must be in (0, 1]"),
        ({"do_sample": True, "top_p": 0.0}, "top_p must be in (0, 1]"),
        ({"do_sample": True, "temperature": -1.0}, "temperature must be"),
    ],
)
def test_bad_arguments_raise_one_line_errors(target, kwargs, message):
    with pytest.raises(SpecdecError, match=message.replace("(", r"\(").replace(")", r"\)")):
        speculative_generate(target, PromptLookupDrafter(), torch.arange(4)[None], 5, **kwargs)


def test_empty_prompt_is_an_error(target):
    with pytest.raises(SpecdecError, match="empty prompt"):
        speculative_generate(target, PromptLookupDrafter(), torch.zeros(1, 0, dtype=torch.long), 5)


def test_prompt_longer_than_context_is_an_error(target):
    with pytest.raises(SpecdecError, match="exceeds the target's context of 512 tokens"):
        speculative_generate(target, PromptLookupDrafter(), torch.zeros(1, 510, dtype=torch.long), 5)


def test_reduced_head_proposes_only_its_tokens():
    draft = ModelDrafter(tiny_llama(seed=1, layers=2), "reduced", 64, token_ids=[5, 7, 9])
    from specdraft_eval.engine.sampling import Sampler

    assert set(draft.propose(list(range(10)), 6, Sampler()).tokens) <= {5, 7, 9}
    proposal = draft.propose(list(range(10)), 3, Sampler(True, generator=torch.Generator().manual_seed(0)))
    assert proposal.probs.shape == (3, 64)
    assert torch.allclose(proposal.probs.sum(-1), torch.ones(3))
    assert float(proposal.probs.detach()[:, [i for i in range(64) if i not in (5, 7, 9)]].sum()) == 0.0
    with pytest.raises(SpecdecError, match="must lie in 0..63"):
        ModelDrafter(tiny_llama(seed=1, layers=2), "bad", 64, token_ids=[70])
