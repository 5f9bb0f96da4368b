"""Soak: 500 requests in one process: memory flat after warm-up, and no state carried between requests."""

from __future__ import annotations

import importlib.util

import torch
from support import ROOT, tiny_llama

from specdraft_eval.drafts.composite import CompositeDrafter
from specdraft_eval.drafts.layers import layer_view
from specdraft_eval.drafts.model import ModelDrafter
from specdraft_eval.drafts.prompt_lookup import PromptLookupDrafter

spec = importlib.util.spec_from_file_location("soak", ROOT / "scripts" / "soak.py")
soak_script = importlib.util.module_from_spec(spec)
spec.loader.exec_module(soak_script)


def test_500_requests_keep_memory_flat_and_answers_independent_of_their_predecessors():
    target = tiny_llama(seed=0)
    drafter = CompositeDrafter([PromptLookupDrafter(), ModelDrafter(layer_view(target, [0, 3]), "layers:0,3", 64)])
    prompts = [torch.randint(0, 64, (4 + 3 * i,),
                             generator=torch.Generator().manual_seed(i)).tolist() for i in range(7)]
    report = soak_script.soak(target, drafter, prompts, requests=500, new_tokens=8)
    assert report["distinct_predecessors_min"] >= 5  # each prompt asked after several different ones
    assert report["requests_differing_from_first_answer"] == []
    assert report["rss_growth_after_warmup"] < 0.05, report["rss_mib_by_request"]
