"""Speculative sampling follows the target's (warped) distribution: chi-square tests on a tiny model."""

from __future__ import annotations

import pytest
import torch
from support import PROMPT, SAMPLES, VOCAB, exact_joint, fit, tiny_llama, warped

from specdraft_eval import speculative_generate, speculative_generate_batch
from specdraft_eval.drafts import suffix
from specdraft_eval.drafts.composite import CompositeDrafter
from specdraft_eval.drafts.eagle import EagleDrafter, TreeShape, new_head
from specdraft_eval.drafts.model import ModelDrafter
from specdraft_eval.drafts.prompt_lookup import PromptLookupDrafter
from specdraft_eval.engine.sampling import Sampler

ROWS = 50  # the chi-square tests sample 50 rows per batched generation


@pytest.fixture(scope="module")
def target():
    return tiny_llama(seed=0, vocab=VOCAB)


SETTINGS = [
    {"temperature": 1.0},
    {"temperature": 0.7, "top_k": 5},
    {"temperature": 1.3, "top_p": 0.8},
    {"temperature": 0.9, "top_k": 6, "top_p": 0.9},
]


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()))
@pytest.mark.parametrize("draft_kind", ["model", "reduced-head", "prompt-lookup", "composite", "eagle", "eagle-reduced",
                                        "eagle-tree", "suffix", "suffix-tree"])
def test_emitted_tokens_follow_target_distribution(target, setting, draft_kind):
    if draft_kind in ("composite", "suffix", "suffix-tree", "eagle-tree") and setting is not SETTINGS[0]:
        pytest.skip("each composite proposal is one part's own; trees take the same rule at every setting")
    drafts = {
        "model": lambda: ModelDrafter(tiny_llama(seed=7, vocab=VOCAB, layers=1), "d", VOCAB),
        "reduced-head": lambda: ModelDrafter(tiny_llama(seed=7, vocab=VOCAB, layers=1), "r", VOCAB, [0, 1, 3, 4, 6]),
        "prompt-lookup": PromptLookupDrafter,
        "composite": lambda: CompositeDrafter([PromptLookupDrafter(), ModelDrafter(tiny_llama(seed=7, vocab=VOCAB,
                                                                                              layers=1), "d", VOCAB)]),
        "eagle": lambda: EagleDrafter(new_head(target, seed=7), target, "e", None),
        "eagle-reduced": lambda: EagleDrafter(new_head(target, [0, 1, 3, 4, 6], seed=7), target, "e",
                                              [0, 1, 3, 4, 6]),
        "eagle-tree": lambda: EagleDrafter(new_head(target, seed=7), target, "e", None, TreeShape(3, 3)),
        "suffix": lambda: suffix.KIND.load(None, None),
        "suffix-tree": lambda: suffix.KIND.load("tree", None),
    }
    draft = drafts[draft_kind]()
    expected = exact_joint(target, Sampler(True, **setting))
    torch.manual_seed(SETTINGS.index(setting))  # seed=None: rows draw from the global generator, one after another
    samples, drafted, accepted = [], 0, 0
    for _ in range(SAMPLES // ROWS):  # rows of a batch are independent samples (each is what batch 1 gives it)
        outputs, stats = speculative_generate_batch(target, draft, [PROMPT] * ROWS, 3, num_draft_tokens=3,
                                                    do_sample=True, **setting)
        samples.extend(outputs)
        drafted, accepted = drafted + stats.draft_tokens, accepted + stats.accepted_tokens
    assert 0 < accepted < drafted  # both acceptance and rejection paths were exercised
    p12, p3 = fit(samples, expected)
    assert p12 > 1e-3 and p3 > 1e-3, (p12, p3)


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()))
def test_the_samplers_warping_is_the_definitions(target, setting):
    """The engine's warping (transformers' warpers) against :func:`warped`, on the target's own logits."""
    with torch.inference_mode():
        logits = target(torch.tensor([PROMPT])).logits[0]  # [len(PROMPT), VOCAB]
    ours = Sampler(True, **setting).probs(logits).double()
    assert torch.allclose(ours, torch.stack([warped(row, **setting) for row in logits]), atol=1e-6)


def test_batch_one_sampling_follows_target_distribution(target):
    """The same test one request at a time, each with its own seed (the model draft, the first setting)."""
    draft = ModelDrafter(tiny_llama(seed=7, vocab=VOCAB, layers=1), "d", VOCAB)
    expected = exact_joint(target, Sampler(True))
    samples = [speculative_generate(target, draft, PROMPT, 3, num_draft_tokens=3, do_sample=True, seed=seed)[0]
               for seed in range(SAMPLES)]
    p12, p3 = fit(samples, expected)
    assert p12 > 1e-3 and p3 > 1e-3, (p12, p3)


def test_the_test_rejects_the_draft_distribution(target):
    """Negative control: samples from the draft alone must fail the same fit."""
    draft_model = tiny_llama(seed=7, vocab=VOCAB, layers=1)
    expected = exact_joint(target, Sampler(True))
    samples = []
    for seed in range(SAMPLES):
        gen = torch.Generator().manual_seed(seed)
        tokens = list(PROMPT)
        with torch.inference_mode():
            for _ in range(3):
                probs = torch.softmax(draft_model(torch.tensor([tokens])).logits[0, -1], -1)
                tokens.append(int(torch.multinomial(probs, 1, generator=gen)))
        samples.append(tokens[len(PROMPT) :])
    p12, p3 = fit(samples, expected)
    assert min(p12, p3) < 1e-6


def test_seeded_sampling_is_reproducible(target):
    draft = PromptLookupDrafter()
    runs = [speculative_generate(target, draft, PROMPT, 12, do_sample=True, seed=42)[0] for _ in range(2)]
    assert runs[0] == runs[1]
