"""What only a GPU run checks (marker ``gpu``; skipped, with the reason, where no CUDA device is visible): compiled
steps as CUDA graphs (``mode="reduce-overhead"``) over the static cache, batches and token trees through them, and
bfloat16's divergences measured by their logit margins. The CPU suite runs the same code paths eagerly, with
inductor's C++ and with dynamo's eager backend; ``pytest -m gpu`` on a GPU machine runs these."""

from __future__ import annotations

import pytest
import torch
from support import hf_greedy, tiny_llama

from specdraft_eval.drafts import load_draft
from specdraft_eval.engine import graphs
from specdraft_eval.engine.loop import (
    autoregressive_generate,
    divergence,
    speculative_generate,
    speculative_generate_batch,
)
from specdraft_eval.models.targets import Target
from zoo.measure.bench.result import NEAR_TIE_LOGIT_MARGIN

pytestmark = pytest.mark.gpu

PROMPTS = [list(range(2, 12)), [5, 9, 5, 9, 5, 9, 7], list(range(20, 60))]


@pytest.fixture(scope="module")
def target():
    return tiny_llama(seed=0).to("cuda")


def greedy(model, prompt: list[int], n: int) -> list[int]:
    """transformers' own greedy continuation, on the model's device."""
    return hf_greedy(model, torch.tensor([prompt], device=model.device), n)


@pytest.mark.parametrize("draft", ["prompt-lookup", "layers:0,3", "prompt-lookup:3x2"])
def test_cuda_graph_steps_give_the_targets_own_tokens_and_compile_only_in_the_warm_up(target, draft):
    drafter = load_draft(draft, Target(target, None))
    for prompt in PROMPTS:
        out, stats = speculative_generate(target, drafter, prompt, 40, num_draft_tokens=4, compile=True)
        assert out == greedy(target, prompt, 40), (draft, prompt)
        assert stats.recompiles == 0, (draft, prompt)  # every width (and the tree step) warmed up before the clock
    assert autoregressive_generate(target, PROMPTS[0], 40, compile=True)[0] == greedy(target, PROMPTS[0], 40)
    assert graphs.static_caches(target, 1, True).step.compiled is not None  # it compiled: no eager fallback


def test_cuda_graph_batches_give_each_row_its_own_tokens(target):
    drafter = load_draft("layers:0,3", Target(target, None))
    rows = [list(range(2, 2 + n)) for n in (3, 11, 6, 15)]
    outputs, stats = speculative_generate_batch(target, drafter, rows, 40, num_draft_tokens=4, compile=True)
    assert outputs == [greedy(target, row, 40) for row in rows] and stats.recompiles == 0


def test_bfloat16_divergences_are_near_ties_by_their_logit_margins():
    """In bfloat16 a speculative output may leave plain decoding's where two tokens nearly tie; each divergence's
    margin (one fresh forward pass) must be within the near-tie bound, or it is a bug."""
    model = tiny_llama(seed=3).to("cuda", torch.bfloat16)
    drafter = load_draft("layers:0,3", Target(model, None))
    margins = []
    for seed in range(8):
        prompt = torch.randint(0, 64, (12,), generator=torch.Generator().manual_seed(seed)).tolist()
        out = speculative_generate(model, drafter, prompt, 40, num_draft_tokens=4)[0]
        plain = autoregressive_generate(model, prompt, 40)[0]
        if out != plain:
            margins.append(divergence(model, prompt, out, plain).logit_margin)
    assert all(m is not None and abs(m) <= NEAR_TIE_LOGIT_MARGIN for m in margins), margins
