"""Pre-packed oneDNN linears: the same function as nn.Linear, applied everywhere a run touches, off on request."""

from __future__ import annotations

import pytest
import torch
from support import tiny_llama

from specdraft_eval import SpecdecError, autoregressive_generate, speculative_generate
from specdraft_eval.drafts.layers import layer_view
from specdraft_eval.drafts.model import ModelDrafter
from specdraft_eval.measure.environment import parameter_count
from specdraft_eval.models import kernels

pytestmark = pytest.mark.skipif(not kernels.supported(torch.nn.Linear(2, 2)), reason="PyTorch built without oneDNN")


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(1, 48), (2, 48), (5, 48), (8, 48), (1, 3, 48), (2, 7, 48)])
def test_packed_linear_computes_what_nn_linear_does(bias, shape):
    torch.manual_seed(0)
    linear = torch.nn.Linear(48, 80, bias=bias)
    x = torch.randn(*shape)
    with torch.inference_mode():
        expected = linear(x)
        packed = kernels.PackedLinear(linear)
        got = packed(x)
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert packed.nbytes == 48 * 80 * 4


def test_apply_swaps_every_linear_and_plain_keeps_them():
    model = kernels.apply(tiny_llama(seed=0), "plain")
    count = sum(p.numel() for p in model.parameters())
    assert parameter_count(model) == count
    assert kernels.kernels_of(model) == "plain" and any(isinstance(m, torch.nn.Linear) for m in model.modules())
    kernels.apply(model, "onednn")
    assert kernels.kernels_of(model) == "onednn"
    assert not any(isinstance(m, torch.nn.Linear) for m in model.modules())
    assert parameter_count(model) == count  # packed weights still counted (ModelFacts, the leaderboard)
    with pytest.raises(SpecdecError, match="kernels='fast' is unknown: use kernels=onednn"):
        kernels.apply(model, "fast")


def test_greedy_with_packed_kernels_equals_plain_generate():
    """Losslessness across kernels: our engine on packed weights (target, layer view, separate draft) emits
    what transformers' generate emits on the plain model, and the packed autoregressive baseline agrees."""
    plain = tiny_llama(seed=0)
    fast = kernels.apply(tiny_llama(seed=0))
    other = kernels.apply(tiny_llama(seed=1, layers=2))
    view = layer_view(fast, [0, 3])
    assert kernels.kernels_of(view) == "onednn"  # the view shares the packed layers
    for seed in range(3):
        prompt = torch.randint(0, 64, (1, 6 + 5 * seed), generator=torch.Generator().manual_seed(seed))
        expected = plain.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=24, do_sample=False,
                                  pad_token_id=0)[0, prompt.shape[1]:].tolist()
        assert autoregressive_generate(fast, prompt, 24)[0] == expected
        for draft in (ModelDrafter(view, "layers:0,3", 64), ModelDrafter(other, "other", 64)):
            assert speculative_generate(fast, draft, prompt, 24, num_draft_tokens=3)[0] == expected


def test_a_model_draft_follows_its_targets_kernels(tmp_path):
    from support import save_tiny

    from specdraft_eval import load_draft, load_target

    path = save_tiny(tmp_path / "tiny")
    for choice in kernels.KERNELS:
        loaded = load_target(str(path), kernels=choice)
        assert kernels.kernels_of(load_draft(str(path), loaded).model) == choice
