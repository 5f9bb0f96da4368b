"""The static KV cache and the compiled step (``static_cache`` / ``compile``): the same tokens as the growing cache
and as transformers' own greedy decoding, for every draft kind, batch 1 and batch N (holes and rows leaving)."""

from __future__ import annotations

import logging

import pytest
import torch
from conftest import save_tiny, tiny_llama
from test_engine import drafts, hf_greedy

from specdraft_eval.engine import graphs
from specdraft_eval.engine.loop import (
    autoregressive_generate,
    speculative_generate,
    speculative_generate_batch,
)

KINDS = ["prompt-lookup", "layers", "other-model", "self", "reduced-head", "composite", "ngram"]


@pytest.fixture(scope="module")
def target():
    return tiny_llama(seed=0)


@pytest.mark.parametrize("name", KINDS)
@pytest.mark.parametrize("gamma,dynamic", [(1, False), (4, False), (3, True)])
def test_static_cache_gives_the_targets_own_greedy_tokens(target, name, gamma, dynamic):
    draft = drafts(target)[name]
    for seed in range(3):
        prompt = torch.randint(0, 64, (1, 5 + seed), generator=torch.Generator().manual_seed(seed))
        out, stats = speculative_generate(target, draft, prompt, 30, num_draft_tokens=gamma, dynamic_gamma=dynamic,
                                          static_cache=True)
        assert out == hf_greedy(target, prompt, 30), (name, seed)
        assert stats.generated_tokens == 30


@pytest.mark.parametrize("name", KINDS)
def test_static_cache_batches_keep_holes_and_rows_leaving(target, name):
    """Rows of different lengths, accepting different counts, leaving at their budgets: each row as alone."""
    rows = [list(range(2, 2 + n)) for n in (3, 11, 6, 15, 4)]
    draft = drafts(target)[name]
    grown, _ = speculative_generate_batch(target, draft, rows, 60, num_draft_tokens=4)
    static, _ = speculative_generate_batch(target, draft, rows, 60, num_draft_tokens=4, static_cache=True)
    assert static == grown == [hf_greedy(target, torch.tensor([row]), 60) for row in rows]
    plain, _ = speculative_generate_batch(target, draft, rows, 60, num_draft_tokens=8, dynamic_gamma=True,
                                          static_cache=True)  # dynamic γ up to 32: the capacity still holds
    assert plain == grown


def test_static_cache_sampling_draws_as_the_growing_cache(target):
    draft = drafts(target)["layers"]
    prompt = torch.arange(2, 9)[None]
    for seed in range(3):
        args = dict(num_draft_tokens=3, do_sample=True, temperature=0.8, top_k=20, seed=seed)
        assert (speculative_generate(target, draft, prompt, 25, static_cache=True, **args)[0]
                == speculative_generate(target, draft, prompt, 25, **args)[0])


def test_a_failed_compile_falls_back_with_one_warning(target, monkeypatch, caplog):
    """Where torch.compile cannot compile the step, one warning says so and the tokens are the same."""
    from torch._dynamo.exc import TorchDynamoException

    def broken(fn, **kwargs):
        def call(**inputs):
            raise TorchDynamoException("no backend here")
        return call

    monkeypatch.setattr(torch, "compile", broken)
    monkeypatch.setattr(graphs, "_COMPILED", type(graphs._COMPILED)())
    prompt = torch.arange(2, 12)[None]
    with caplog.at_level(logging.WARNING, logger="specdraft_eval.engine.graphs"):
        out, _ = speculative_generate(target, drafts(target)["prompt-lookup"], prompt, 20, compile=True)
        again, _ = speculative_generate(target, drafts(target)["prompt-lookup"], prompt, 20, compile=True)
    assert out == again == hf_greedy(target, prompt, 20)
    warnings = [r for r in caplog.records if "running it eagerly" in r.getMessage()]
    assert len(warnings) == 1 and "no backend here" in warnings[0].getMessage()


@pytest.mark.slow
def test_compiled_steps_give_the_same_tokens(target):
    """torch.compile on the CPU (inductor): the target's decode and verification steps at every width, compiled once
    per model; speculative and plain decoding alike."""
    prompt = torch.arange(2, 12)[None]
    expected = hf_greedy(target, prompt, 40)
    for name in ("prompt-lookup", "layers"):
        assert speculative_generate(target, drafts(target)[name], prompt, 40, num_draft_tokens=3,
                                    compile=True)[0] == expected, name
    assert autoregressive_generate(target, prompt, 40, compile=True)[0] == expected
    assert graphs.compiled(target).compiled is not None  # it compiled: no fallback


def test_specdec_records_its_runtime(tmp_path):
    from specdraft_eval.integration import lm_eval_model

    tiny = save_tiny(tmp_path / "tiny")
    lm = lm_eval_model.SpecDecLM(pretrained=str(tiny), draft="prompt-lookup", device="cpu", static_cache="true")
    runtime = lm.specdec_info()["runtime"]
    assert runtime == {"static_cache": True, "compile": False, "attention": lm.model.config._attn_implementation,
                       "score": "target"}
    chosen = lm_eval_model.SpecDecLM(pretrained=str(tiny), draft="prompt-lookup", device="cpu",
                                     attn_implementation="eager")  # the switch: as with --model hf
    assert chosen.specdec_info()["runtime"]["attention"] == "eager"
