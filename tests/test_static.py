"""The static KV cache and the compiled step (``static_cache`` / ``compile``): the same tokens as the growing cache
and as transformers' own greedy decoding, for every draft kind, batch 1 and batch N (holes and rows leaving)."""

from __future__ import annotations

import logging

import pytest
import torch
from support import drafts, hf_greedy, save_tiny, tiny_llama

from specdraft_eval.engine import graphs
from specdraft_eval.engine.loop import (
    autoregressive_generate,
    speculative_generate,
    speculative_generate_batch,
)

KINDS = ["prompt-lookup", "layers", "other-model", "self", "reduced-head", "composite", "ngram"]


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
    monkeypatch.setattr(graphs, "STATIC_CACHES", graphs.StaticCachesByModel())  # fresh ones, the old back after
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
    from support import RandomTree

    tree = RandomTree(target, 64)
    tree.drafts_trees = True
    out, stats = speculative_generate(target, tree, prompt, 40, num_draft_tokens=4, compile=True)
    assert out == expected and stats.trees and stats.recompiles == 0  # the tree step compiled, in the warm-up
    assert autoregressive_generate(target, prompt, 40, compile=True)[0] == expected
    assert graphs.static_caches(target, 1, True).step.compiled is not None  # it compiled: no fallback


def test_specdec_records_its_runtime(tmp_path):
    from specdraft_eval.integration import lm_eval_model

    tiny = save_tiny(tmp_path / "tiny")
    lm = lm_eval_model.SpecDecLM(pretrained=str(tiny), draft="prompt-lookup", device="cpu", static_cache="true")
    runtime = lm.specdec_info()["runtime"]
    assert runtime == {"static_cache": True, "compile": False, "attention": lm.model.config._attn_implementation,
                       "score": "target", "kernels": "onednn"}
    chosen = lm_eval_model.SpecDecLM(pretrained=str(tiny), draft="prompt-lookup", device="cpu",
                                     attn_implementation="eager")  # the switch: as with --model hf
    assert chosen.specdec_info()["runtime"]["attention"] == "eager"


@pytest.fixture
def dynamo_only(monkeypatch):
    """``torch.compile`` with dynamo's own graphs run eagerly (``backend="eager"``): dynamo compiles, guards and
    counts exactly as with inductor, in a fraction of the time; fresh runtimes and dynamo caches."""
    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: real(fn, **{**kw, "backend": "eager", "mode": None}))
    monkeypatch.setattr(graphs, "STATIC_CACHES", graphs.StaticCachesByModel())  # fresh ones, the old back after
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


# an lm-eval-like run: prompts of different lengths, batches of 1 and 3 rows (buckets 1 and 4), γ 2, 4 and dynamic γ
RUN = [(gamma, dynamic, [list(range(2, 2 + n)) for n in lengths])
       for gamma, dynamic in [(2, False), (4, False), (3, True)]
       for lengths in [(5,), (3, 11, 6), (17,), (9, 4, 13)]]


def test_compiled_steps_compile_once_per_bucket_and_never_after_the_warm_up(dynamo_only):
    """Every width and attention reach of every request reuses the run's graphs: width 1 and the dynamic width, per
    batch bucket (two buckets here: 4 graphs, over 3 reaches of the 768-position cache), all compiled in the
    warm-up; timed steps compile nothing (``recompiles`` 0)."""
    target = tiny_llama(seed=0)
    draft = drafts(target)["prompt-lookup"]
    before = graphs.compiled_graphs()
    warm_ups = []
    for gamma, dynamic, rows in RUN:
        out, stats = speculative_generate_batch(target, draft, rows, 30, num_draft_tokens=gamma,
                                                dynamic_gamma=dynamic, compile=True, capacity=600)
        assert out == [hf_greedy(target, torch.tensor([row]), 30) for row in rows]
        assert stats.recompiles == 0, (gamma, dynamic, len(rows))
        warm_ups.append(stats.compile_seconds)
    assert graphs.compiled_graphs() - before <= 2 * 2
    assert warm_ups[0] > 0 and warm_ups[1] > 0  # the first request of each bucket paid for the compilation


def test_a_longer_request_grows_the_capacity_in_steps_and_counts_it_as_warm_up(dynamo_only):
    """Without a run's capacity, requests share the target's runtime while they fit; a longer one grows it to the
    next multiple of CAPACITY_STEP, compiled in its warm-up, never in timed steps."""
    target = tiny_llama(seed=0)
    draft = drafts(target)["prompt-lookup"]
    short = speculative_generate(target, draft, torch.arange(2, 8)[None], 20, compile=True)[1]
    first = graphs.static_caches(target, 1, True)
    assert first.capacity == graphs.CAPACITY_STEP
    again = speculative_generate(target, draft, torch.arange(2, 30)[None], 20, compile=True)[1]
    assert graphs.static_caches(target, 1, True) is first and again.compile_seconds == 0 and again.recompiles == 0
    long = torch.randint(2, 64, (1, graphs.CAPACITY_STEP), generator=torch.Generator().manual_seed(0))
    grown = speculative_generate(target, draft, long, 20, compile=True)[1]
    assert graphs.static_caches(target, 1, True).capacity == 2 * graphs.CAPACITY_STEP
    assert short.compile_seconds > 0 and grown.compile_seconds > 0 and grown.recompiles == 0


def test_compiled_tree_steps_compile_in_the_warm_up_only(dynamo_only, monkeypatch):
    """A draft of token trees runs its verification compiled too: one more graph per batch bucket (the 4D mask, its
    width and reach dynamic), compiled in the warm-up; the tokens are transformers' own. Negative control: a draft
    that does not say it drafts trees gets no tree warm-up, and its timed steps compile."""
    from support import RandomTree

    target = tiny_llama(seed=0)
    draft = RandomTree(target, 64)
    draft.drafts_trees = True
    before = graphs.compiled_graphs()
    for rows in ([list(range(2, 7))], [list(range(2, 2 + n)) for n in (3, 11, 6)], [list(range(5, 14))]):
        out, stats = speculative_generate_batch(target, draft, rows, 20, num_draft_tokens=5, compile=True,
                                                capacity=300)
        assert out == [hf_greedy(target, torch.tensor([row]), 20) for row in rows]
        assert stats.recompiles == 0 and stats.trees
    assert graphs.compiled_graphs() - before <= 3 * 2  # width 1, wider chains, trees; buckets 1 and 4
    monkeypatch.setattr(graphs, "STATIC_CACHES", graphs.StaticCachesByModel())  # fresh ones, the old back after
    draft.drafts_trees = False
    unwarmed = speculative_generate(target, draft, torch.arange(2, 12)[None], 20, num_draft_tokens=5, compile=True)[1]
    assert unwarmed.recompiles > 0


def test_a_tree_draft_after_a_chain_draft_on_one_runtime_warms_its_masked_chains(dynamo_only):
    """A run's runtime outlives it: after a chain draft warmed bucket 1's unmasked steps, a tree draft's chains come
    masked (its paths leave holes), another input form, which its own warm-up must compile (found rehearsing
    tests/test_gpu.py on the CPU); and back."""
    from specdraft_eval.drafts import load_draft
    from specdraft_eval.models.targets import Target

    target = tiny_llama(seed=0)
    prompt = list(range(2, 12))
    for name in ("prompt-lookup", "prompt-lookup:3x2", "prompt-lookup"):
        out, stats = speculative_generate(target, load_draft(name, Target(target, None)), prompt, 30,
                                          num_draft_tokens=4, compile=True)
        assert out == hf_greedy(target, torch.tensor([prompt]), 30) and stats.recompiles == 0, name


def test_the_count_fails_where_shapes_change_per_request(dynamo_only, monkeypatch):
    """Negative control: with the width static again (one graph per width), the same run compiles more graphs
    than the bound above, and a request wider than its warm-up recompiles during timed steps."""
    monkeypatch.setattr(torch._dynamo, "maybe_mark_dynamic", lambda tensor, dim: None)
    target = tiny_llama(seed=0)
    draft = drafts(target)["prompt-lookup"]
    before = graphs.compiled_graphs()
    for gamma, dynamic, rows in RUN[:2]:
        speculative_generate_batch(target, draft, rows, 30, num_draft_tokens=gamma, dynamic_gamma=dynamic,
                                   compile=True, capacity=200)
    assert graphs.compiled_graphs() - before > 2 * 2
    monkeypatch.setattr(graphs.StaticCaches, "warm_up", lambda self, cache, widths, trees=False: 0.0)
    monkeypatch.setattr(graphs, "STATIC_CACHES", graphs.StaticCachesByModel())  # fresh ones, the old back after
    cold = speculative_generate(target, draft, torch.arange(2, 12)[None], 20, compile=True)[1]
    assert cold.recompiles > 0


def test_compile_refuses_prepacked_kernels_with_the_fix(target):
    from specdraft_eval.errors import SpecdecError
    from specdraft_eval.models import kernels

    packed = kernels.apply(tiny_llama(seed=0), "onednn")
    if kernels.kernels_of(packed) != "onednn":
        pytest.skip("this PyTorch has no oneDNN")
    with pytest.raises(SpecdecError, match="kernels=plain"):
        speculative_generate(packed, drafts(packed)["prompt-lookup"], torch.arange(2, 9)[None], 5, compile=True)
    assert kernels.choose(None, True) == "plain" and kernels.choose(None, False) == "onednn"
    with pytest.raises(SpecdecError, match="use kernels=plain or leave kernels out"):
        kernels.choose("onednn", True)


def test_an_lm_eval_run_compiles_in_its_warm_up_only_and_records_it(tmp_path, dynamo_only):
    """``compile=true`` through lm-eval's model: documents of different lengths in batches of 1 and 3, one cache
    shape for the run (from its longest request), every graph compiled before the first timed step; the record
    carries the compile time apart and 0 recompiles, and its outputs are the eager run's."""
    from lm_eval.api.instance import Instance

    from specdraft_eval.integration.lm_eval_model import SpecDecLM

    tiny = save_tiny(tmp_path / "tiny")
    contexts = [" ".join(f"w{(3 * i + j) % 60 + 2}" for j in range(n)) for i, n in enumerate((4, 17, 9, 30, 12, 6, 21))]
    outputs = {}
    for batch_size, compile, gamma in [(1, "true", "dynamic"), (3, "true", "3"), (3, "false", "3")]:
        requests = [Instance("generate_until", {}, (c, {"until": ["w63"], "max_gen_toks": 24}), i, ("t", i, 0))
                    for i, c in enumerate(contexts)]
        for request in requests:
            request.task_name = "t"
        extra = {"dynamic_gamma": "true"} if gamma == "dynamic" else {"num_draft_tokens": gamma}
        lm = SpecDecLM(pretrained=str(tiny), draft="prompt-lookup", device="cpu", compile=compile,
                       batch_size=batch_size, **extra)
        outputs[(batch_size, compile, gamma)] = lm.generate_until(requests, disable_tqdm=True)
        block = lm.specdec_info()
        if compile == "true":
            assert block["recompiles"] == 0 and block["compile_seconds"] > 0
            assert block["runtime"]["compile"] is True and block["runtime"]["kernels"] == "plain"
            assert lm.session.run.capacity >= max(len(lm.tok_encode(c)) for c in contexts) + 24
    assert len(set(map(tuple, outputs.values()))) == 1
