"""Draft registry, layer views, tokenizer checks, and model resolution (aliases, paths, hub cache)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from support import save_tiny, tiny_llama

from specdraft_eval import SpecdecError, load_draft, load_target, speculative_generate
from specdraft_eval.drafts.layers import layer_view, parse_layers
from specdraft_eval.models.targets import resolve

WORDS = ["<unk>", "</s>", *[f"w{i}" for i in range(62)]]


def test_parse_layers():
    assert parse_layers("0-3,29", 30) == [0, 1, 2, 3, 29]
    assert parse_layers("0-1+5", 30) == [0, 1, 5]
    for bad, message in [("0-3,30", "out of range"), ("a", "bad layer list"), ("3,1", "increasing"), ("", "bad layer")]:
        with pytest.raises(SpecdecError, match=message):
            parse_layers(bad, 30)


def test_layer_view_shares_weights_and_leaves_target_intact():
    target = tiny_llama(layers=4)
    view = layer_view(target, [0, 3])
    assert len(view.model.layers) == 2 and len(target.model.layers) == 4
    assert view.model.layers[1].self_attn.q_proj.weight is target.model.layers[3].self_attn.q_proj.weight
    assert [layer.self_attn.layer_idx for layer in view.model.layers] == [0, 1]
    assert [layer.self_attn.layer_idx for layer in target.model.layers] == [0, 1, 2, 3]
    assert target.config.num_hidden_layers == 4 and view.config.num_hidden_layers == 2
    ids = torch.arange(6)[None]
    with torch.inference_mode():
        full = target(ids).logits
        again = target(ids).logits
    assert torch.equal(full, again)


def test_layer_view_hooks_stay_on_the_view():
    target = tiny_llama(layers=4)
    view = layer_view(target, [0, 1])
    calls = []
    handle = view.register_forward_hook(lambda *args: calls.append("view"))
    with torch.inference_mode():
        target(torch.arange(3)[None])
        view(torch.arange(3)[None])
    handle.remove()
    assert calls == ["view"]


def test_prompt_lookup_proposes_what_transformers_proposes():
    from transformers.generation.candidate_generator import (
        PromptLookupCandidateGenerator,
    )

    from specdraft_eval.drafts.prompt_lookup import PromptLookupDrafter
    from specdraft_eval.engine.sampling import Sampler

    generator = torch.Generator().manual_seed(0)
    ours = PromptLookupDrafter(max_ngram=3)
    for trial in range(300):
        tokens = torch.randint(0, 4 + trial % 12, (2 + trial % 60,), generator=generator).tolist()
        theirs = PromptLookupCandidateGenerator(num_output_tokens=4, max_matching_ngram_size=3, max_length=1000)
        candidates, _ = theirs.get_candidates(torch.tensor([tokens]))
        assert ours.propose(tokens, 4, Sampler()).tokens == candidates[0, len(tokens):].tolist(), tokens


def test_load_draft_kinds(tiny):
    loaded = load_target(str(tiny))
    model = loaded.model
    assert load_draft("prompt-lookup:2", loaded).name == "prompt-lookup:2"
    lookup = load_draft("prompt-lookup:2-3", loaded)
    assert (lookup.name, lookup.min_ngram, lookup.max_ngram) == ("prompt-lookup:2-3", 2, 3)
    assert lookup.propose([5, 6, 7, 9, 7], 2, None).tokens == []  # only a 1-gram (7) matches
    assert lookup.propose([5, 6, 7, 9, 6, 7], 2, None).tokens == [9, 6]
    assert load_draft("layers:0,2", loaded).name == "layers:0,2"
    composite = load_draft(f"prompt-lookup | {tiny}", loaded)
    assert composite.name == f"prompt-lookup:3|{tiny}" and composite.model is composite.parts[1].model
    separate = load_draft(str(tiny), loaded)
    out, stats = speculative_generate(model, separate, torch.arange(2, 9)[None], 10)
    assert stats.accepted_tokens == stats.draft_tokens  # same weights as the target: all accepted


@pytest.mark.parametrize(
    "spec,message",
    [
        ("", "empty draft"),
        ("prompt-lookup:x", "bad prompt-lookup size"),
        ("prompt-lookup:0", "n-gram sizes must satisfy 1 <= MIN <= N"),
        ("prompt-lookup:3-2", "n-gram sizes must satisfy 1 <= MIN <= N"),
        ("prompt-lookup:a-2", "bad prompt-lookup size"),
        ("layers:", "layers needs a list"),
        ("layers:0,9", "out of range"),
        ("no-such-draft", "unknown model 'no-such-draft'"),
        ("/no/such/dir.gguf", "GGUF file not found"),
        ("prompt-lookup|", "bad composite draft"),
        ("prompt-lookup|layers:0,9", "out of range"),
    ],
)
def test_bad_drafts(tiny, spec, message):
    loaded = load_target(str(tiny))
    with pytest.raises(SpecdecError, match=message):
        load_draft(spec, loaded)


def test_tokenizer_mismatch_is_caught(tiny, tmp_path):
    other = save_tiny(tmp_path / "other", words=["<unk>", "</s>", *[f"v{i}" for i in range(62)]])
    loaded = load_target(str(tiny))
    with pytest.raises(SpecdecError, match="tokenizer mismatch"):
        load_draft(str(other), loaded)


def test_resolve_alias_paths_and_hub_ids(tmp_path):
    alias = resolve("smollm2-135m-instruct")
    assert alias.gguf_file == "SmolLM2-135M-Instruct.Q4_1.gguf" and os.path.isfile(os.path.join(alias.path,
                                                                                                alias.gguf_file))
    assert resolve("HuggingFaceTB/SmolLM2-360M-Instruct").path == "HuggingFaceTB/SmolLM2-360M-Instruct"
    with pytest.raises(SpecdecError, match="without config.json"):
        resolve(str(tmp_path))
    with pytest.raises(SpecdecError, match="unknown model"):
        resolve("definitely not a model")


def _hub_env(cache: Path) -> dict:
    return {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}


def test_hub_id_loads_from_populated_cache_offline(tmp_path):
    """A hub id resolves from the HF cache layout with HF_HUB_OFFLINE=1 (what `zoo pull` leaves)."""
    snapshot = tmp_path / "hub" / "models--acme--tiny" / "snapshots" / ("a" * 40)
    save_tiny(snapshot)
    (tmp_path / "hub" / "models--acme--tiny" / "refs").mkdir()
    (tmp_path / "hub" / "models--acme--tiny" / "refs" / "main").write_text("a" * 40)
    code = "from specdraft_eval import load_target; print(load_target('acme/tiny').model.config.num_hidden_layers)"
    done = subprocess.run([sys.executable, "-c", code], env=_hub_env(tmp_path / "hub"), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "4"


def test_hub_id_missing_offline_is_one_clear_error(tmp_path):
    code = "from specdraft_eval import load_target; load_target('acme/absent')"
    done = subprocess.run([sys.executable, "-c", code], env=_hub_env(tmp_path), capture_output=True, text=True)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("specdraft_eval.errors.SpecdecError: cannot load model 'acme/absent'")
    assert "zoo pull acme/absent" in last
