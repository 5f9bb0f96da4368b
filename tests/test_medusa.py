"""``medusa:DIR``: heads written here from FasterDecoding/Medusa's key names (``medusa_model.py``: per head i,
``i.j.linear`` ResBlocks and ``i.L`` the output layer, saved as ``medusa_lm_head.pt``), never from our module; the
drafted tree compared with an independent re-implementation of Medusa's heads and candidate tree, with a negative
control (head d drafting depth d + 1, one off); lossless end to end, chains and trees, growing and static caches."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from specdraft_eval.drafts import load_draft
from specdraft_eval.engine.drafter import static_tree
from specdraft_eval.engine.loop import autoregressive_generate, speculative_generate
from specdraft_eval.engine.sampling import Sampler
from specdraft_eval.errors import SpecdecError
from specdraft_eval.models.targets import Target

HIDDEN, VOCAB = 32, 64


def write_medusa(path: Path, target, heads: int = 3, layers: int = 1, choices: list | None = None,
                 extra: dict | None = None, seed: int = 3) -> Path:
    """Medusa's layout: config.json (medusa_num_heads, medusa_num_layers, base model) and medusa_lm_head.pt; each
    head's ResBlock is one module repeated ``layers`` times upstream, so its keys repeat one tensor; the output
    layers start as the target's head plus noise (Medusa initialises them from it)."""
    draw = torch.Generator().manual_seed(seed)
    state = {}
    for i in range(heads):
        weight, bias = torch.randn(HIDDEN, HIDDEN, generator=draw) / HIDDEN ** 0.5, 0.1 * torch.randn(HIDDEN,
                                                                                                      generator=draw)
        for j in range(layers):
            state[f"{i}.{j}.linear.weight"], state[f"{i}.{j}.linear.bias"] = weight, bias
        state[f"{i}.{layers}.weight"] = (target.get_output_embeddings().weight.detach()
                                         + 0.5 * torch.randn(VOCAB, HIDDEN, generator=draw))
    state |= extra or {}
    path.mkdir(parents=True)
    torch.save(state, path / "medusa_lm_head.pt")
    config = {"medusa_num_heads": heads, "medusa_num_layers": layers, "base_model_name_or_path": "tiny"}
    if choices is not None:
        config["medusa_choices"] = choices
    (path / "config.json").write_text(json.dumps(config))
    return path


def reference_tree(path: Path, target, tokens: list[int], paths: list[tuple[int, ...]], offset: int = 0) -> list[int]:
    """Medusa's candidates (``generate_candidates``): head i's logits from the base model's last hidden state,
    x + SiLU(W x + b) L times then the output layer; node (r_0..r_d) is head d's r_d-th best token."""
    state = torch.load(path / "medusa_lm_head.pt", weights_only=True)
    config = json.loads((path / "config.json").read_text())
    layers = config["medusa_num_layers"]
    with torch.no_grad():
        hidden = target(torch.tensor([tokens[:-1]]), output_hidden_states=True).hidden_states[-1][0, -1]
        tops = []
        for i in range(config["medusa_num_heads"]):
            x = hidden
            for j in range(layers):
                x = x + torch.nn.functional.silu(x @ state[f"{i}.{j}.linear.weight"].T + state[f"{i}.{j}.linear.bias"])
            tops.append((x @ state[f"{i}.{layers}.weight"].T).argsort(descending=True).tolist())
    return [tops[min(len(p) - 1 + offset, len(tops) - 1)][p[-1]] for p in paths]


def drafted(path: Path, target, tokens: list[int], budget: int, shape: str = "") -> tuple[list[int], list | None]:
    drafter = load_draft(f"medusa:{path}{shape}", Target(target, None))
    with torch.no_grad():
        drafter.observe(target(torch.tensor([tokens[:-1]]), output_hidden_states=True).hidden_states[-1][0])
    proposal = drafter.propose(tokens, budget, Sampler())
    return proposal.tokens, proposal.parents


SEQUENCES = [[5, 9, 2, 7, 7, 3, 11, 4], list(range(10, 40, 3)), [1, 2]]


@pytest.mark.parametrize("layers", [0, 1, 2])
def test_medusa_drafts_the_tree_medusas_heads_give(tmp_path, target, layers):
    path = write_medusa(tmp_path / "heads", target, layers=layers)
    paths = static_tree(3, 3, 8)
    for tokens in SEQUENCES:
        mine, parents = drafted(path, target, tokens, 8, "@3")
        assert mine == reference_tree(path, target, tokens, paths), tokens
        assert parents == [-1 if len(p) == 1 else paths.index(p[:-1]) for p in paths]
        assert mine != reference_tree(path, target, tokens, paths, offset=1)  # negative control: heads one off


def test_medusa_choices_from_the_checkpoint_and_chains(tmp_path, target):
    """A checkpoint's medusa_choices (best first, Medusa's format) give the tree, its first γ paths; @1 a chain."""
    choices = [[0], [0, 0], [1], [0, 1], [2], [0, 0, 0], [1, 0]]
    path = write_medusa(tmp_path / "heads", target, choices=choices)
    tokens = SEQUENCES[0]
    first5 = sorted([tuple(c) for c in choices[:5]], key=lambda p: (len(p), p))
    assert drafted(path, target, tokens, 5)[0] == reference_tree(path, target, tokens, first5)
    chain, parents = drafted(path, target, tokens, 3, "@1")
    assert parents is None and chain == reference_tree(path, target, tokens, [(0,), (0, 0), (0, 0, 0)])


@pytest.mark.parametrize("shape,gamma", [("@1", 3), ("@2", 6), ("", 10)])
def test_medusa_is_lossless(tmp_path, target, shape, gamma):
    draft = load_draft(f"medusa:{write_medusa(tmp_path / 'heads', target)}{shape}", Target(target, None))
    for prompt in SEQUENCES:
        expected = autoregressive_generate(target, prompt, 30)[0]
        for static in (False, True):
            out, stats = speculative_generate(target, draft, prompt, 30, num_draft_tokens=gamma, static_cache=static)
            assert out == expected, (shape, prompt, static)
        assert stats.draft_tokens > 0 or len(prompt) < 3


@pytest.mark.parametrize("change,message", [
    (dict(extra={"0.1.weight2": torch.ones(1)}), "does not name: 0.1.weight2"),
    (dict(heads=2, extra={"2.1.weight": torch.ones(VOCAB, HIDDEN)}), "does not name: 2.1.weight"),
])
def test_bad_medusa_heads_are_refused_in_one_line(tmp_path, target, change, message):
    path = write_medusa(tmp_path / "heads", target, **change)
    with pytest.raises(SpecdecError, match=message):
        load_draft(f"medusa:{path}", Target(target, None))
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k != "medusa_num_heads"}))
    with pytest.raises(SpecdecError, match="lacks medusa_num_heads"):
        load_draft(f"medusa:{path}", Target(target, None))
    with pytest.raises(SpecdecError, match="bad Medusa tree"):
        load_draft(f"medusa:{path}@x", Target(target, None))


def test_train_head_kind_medusa_learns_and_its_heads_load_and_stay_lossless(tmp_path):
    """`zoo train-head --kind medusa`: trained heads agree with the target's next-next tokens well above untrained
    (identity ResBlocks, the target's head: they predict t+1, not t+2+i); written in Medusa's layout, they load under
    the strict loader and draft losslessly."""
    from support import SMALL, prompts_file, save_tiny

    from specdraft_eval.models.targets import LoadSettings
    from zoo.build.train_head import HeadTraining, train_head

    tiny = save_tiny(tmp_path / "tiny", layers=4)
    settings = HeadTraining(str(prompts_file(tmp_path)), steps=250, kind="medusa", medusa_heads=2, **SMALL)
    result = train_head(str(tiny), tmp_path / "heads", settings)
    untrained = train_head(str(tiny), tmp_path / "untrained", HeadTraining(
        str(prompts_file(tmp_path)), steps=1, kind="medusa", medusa_heads=2, **{**SMALL, "lr": 0.0}))
    trained, baseline = result.record["top1_agreement_by_head"], untrained.record["top1_agreement_by_head"]
    assert result.draft == f"medusa:{tmp_path / 'heads'}" and len(trained) == 2
    assert trained[0] > baseline[0] + 0.1, (trained, baseline)
    config = json.loads((tmp_path / "heads" / "config.json").read_text())
    assert (config["medusa_num_heads"], config["medusa_num_layers"]) == (2, 1)
    loaded = LoadSettings().load(str(tiny))
    draft = load_draft(result.draft, loaded)
    for prompt in SEQUENCES:
        assert speculative_generate(loaded.model, draft, prompt, 30, num_draft_tokens=4)[0] == \
            autoregressive_generate(loaded.model, prompt, 30)[0]
    # --vocab-top 16: vLLM's layout, the 16 commonest tokens' rows of the same heads and their token_map
    cut = train_head(str(tiny), tmp_path / "cut", HeadTraining(
        str(prompts_file(tmp_path)), steps=1, kind="medusa", medusa_heads=2, **{**SMALL, "vocab_top": 16}))
    config = json.loads((tmp_path / "cut" / "config.json").read_text())
    assert (config["model_type"], config["num_heads"], config["vocab_size"], config["truncated_vocab_size"]) == \
        ("medusa", 2, VOCAB, 16)
    draft = load_draft(cut.draft, loaded)
    assert draft.model.out[0].out_features == 16 and len(set(draft.model.token_map.tolist())) == 16
    for prompt in SEQUENCES:
        assert speculative_generate(loaded.model, draft, prompt, 30, num_draft_tokens=4)[0] == \
            autoregressive_generate(loaded.model, prompt, 30)[0]


def test_saving_medusa_heads_with_a_vocabulary_keeps_those_tokens_rows(tmp_path, target):
    """save_medusa with token ids: vLLM's reader on the written files drafts, for each head, the best of those tokens
    by the original heads' own logits (Medusa's reference on the FasterDecoding heads, restricted to the ids)."""
    from safetensors.torch import load_file

    from specdraft_eval.drafts.medusa import read_heads
    from zoo.build.train_head import save_medusa

    original = write_medusa(tmp_path / "heads", target)
    heads, _ = read_heads(original)
    ids = list(range(0, VOCAB, 3))
    (tmp_path / "cut").mkdir()
    save_medusa(tmp_path / "cut", heads, "tiny", {"token_ids": ids}, ids)
    state, config = load_file(str(tmp_path / "cut" / "model.safetensors")), json.loads(
        (tmp_path / "cut" / "config.json").read_text())
    assert state["token_map"].tolist() == ids and "token_ids" not in config["specdraft_eval"]
    reference = torch.load(original / "medusa_lm_head.pt", weights_only=True)
    for tokens in SEQUENCES:
        with torch.no_grad():
            hidden = target(torch.tensor([tokens[:-1]]), output_hidden_states=True).hidden_states[-1][0, -1]
        best = []
        for i in range(3):
            x = hidden + torch.nn.functional.silu(hidden @ reference[f"{i}.0.linear.weight"].T
                                                  + reference[f"{i}.0.linear.bias"])
            best.append(ids[int((x @ reference[f"{i}.1.weight"][ids].T).argmax())])
        assert vllm_medusa_chain(state, config, hidden) == best == drafted(tmp_path / "cut", target, tokens, 3, "@1")[0]


# --- vLLM's Medusa reader (model_executor/models/medusa.py, transformers_utils/configs/medusa.py), from its source ---


def vllm_medusa_config(config: dict) -> dict:
    """MedusaConfig.from_pretrained: every key with 'num' and 'heads' becomes num_heads, with 'num' and 'layers'
    num_hidden_layers."""
    out = dict(config)
    for key in list(out):
        if "num" in key and "heads" in key:
            out["num_heads"] = out.pop(key)
        elif "num" in key and "layers" in key:
            out["num_hidden_layers"] = out.pop(key)
    return out


def vllm_medusa_logits(state: dict, config: dict, hidden: torch.Tensor) -> list[torch.Tensor]:
    """Medusa.load_weights + forward + compute_logits: head i a ResidualBlock (num_hidden_layers linear layers,
    x + SiLU(layer(x)) each, a bias only with medusa_fc_bias) then lm_heads[i] (lm_heads.0 for all with
    original_lm_head); with truncated_vocab_size below vocab_size, a lm_heads weight larger than token_map is indexed
    by it, and each head's logits fill the token_map positions of a vocabulary-wide -inf row."""
    state = {k.removeprefix("medusa_heads."): v for k, v in state.items()}
    token_map = state.pop("token_map", None)
    vocab = config["vocab_size"]
    if config.get("truncated_vocab_size", vocab) >= vocab:
        token_map = None
    logits = []
    for i in range(config["num_heads"]):
        x = hidden
        for j in range(config["num_hidden_layers"]):
            bias = state[f"blocks.{i}.layers.{j}.bias"].float() if config.get("medusa_fc_bias") else 0
            x = x + torch.nn.functional.silu(x @ state[f"blocks.{i}.layers.{j}.weight"].float().T + bias)
        weight = state["lm_heads.0.weight" if config.get("original_lm_head") else f"lm_heads.{i}.weight"].float()
        if token_map is not None and weight.shape[0] > token_map.shape[0]:
            weight = weight[token_map]
        row = x @ weight.T
        if token_map is not None:
            full = -torch.inf * torch.ones(vocab)
            full[token_map] = row
            row = full
        logits.append(row)
    return logits


def vllm_medusa_chain(state: dict, config: dict, hidden: torch.Tensor) -> list[int]:
    """Medusa.sample: top-1 per head."""
    return [int(row.argmax()) for row in vllm_medusa_logits(state, config, hidden)]


def write_vllm_medusa(path: Path, target, truncated: int | None = None, full_rows: bool = False,
                      shared: bool = False, heads: int = 3, seed: int = 5) -> Path:
    """vLLM's layout written from its key names: blocks.i.layers.0 with bias, lm_heads.i (one, lm_heads.0, with
    original_lm_head) over the whole vocabulary or, with ``truncated``, a token_map of that many token ids (shuffled)
    and output rows for those tokens (or the whole vocabulary's with ``full_rows``, which vLLM indexes)."""
    from safetensors.torch import save_file

    draw = torch.Generator().manual_seed(seed)
    state = {}
    for i in range(heads):
        state[f"blocks.{i}.layers.0.weight"] = torch.randn(HIDDEN, HIDDEN, generator=draw) / HIDDEN ** 0.5
        state[f"blocks.{i}.layers.0.bias"] = 0.1 * torch.randn(HIDDEN, generator=draw)
    token_map = torch.randperm(VOCAB, generator=draw)[:truncated] if truncated else None
    for i in range(1 if shared else heads):
        rows = target.get_output_embeddings().weight.detach() + 0.5 * torch.randn(VOCAB, HIDDEN, generator=draw)
        state[f"lm_heads.{i}.weight"] = rows if token_map is None or full_rows else rows[token_map].contiguous()
    if token_map is not None:
        state["token_map"] = token_map
    path.mkdir(parents=True)
    save_file(state, str(path / "model.safetensors"))
    config = {"model_type": "medusa", "architectures": ["MedusaModel"], "hidden_size": HIDDEN, "vocab_size": VOCAB,
              "num_heads": heads, "num_hidden_layers": 1, "medusa_fc_bias": True,
              "truncated_vocab_size": truncated or VOCAB, "original_lm_head": shared}
    (path / "config.json").write_text(json.dumps(config))
    return path


@pytest.mark.parametrize("truncated, full_rows, shared", [(16, False, False), (16, True, False), (None, False, True),
                                                          (24, False, True)])
def test_vllms_reduced_vocabulary_and_shared_head_draft_what_vllm_computes(tmp_path, target, truncated, full_rows,
                                                                           shared):
    """vLLM's token_map (rows for its tokens, or the whole vocabulary's indexed by it) and original_lm_head: our
    chain is vLLM's top-1 per head and our tree's nodes are its heads' r-th best tokens, over the vocabulary-wide
    logits vLLM builds; reading the output rows' indices as token ids (no map) is the negative control; the export
    writes the same heads back in vLLM's layout, map included."""
    from safetensors.torch import load_file

    from zoo.build.export import export_head

    path = write_vllm_medusa(tmp_path / "heads", target, truncated, full_rows, shared)
    state, config = load_file(str(path / "model.safetensors")), json.loads((path / "config.json").read_text())
    out = Path(export_head(path, "vllm", tmp_path / "vllm").path)
    exported, exported_config = load_file(str(out / "model.safetensors")), json.loads((out / "config.json").read_text())
    assert ("token_map" in exported) == (truncated is not None)
    assert exported_config["truncated_vocab_size"] == (truncated or VOCAB)
    paths = static_tree(2, 3, 6)
    control = []
    for tokens in SEQUENCES:
        with torch.no_grad():
            hidden = target(torch.tensor([tokens[:-1]]), output_hidden_states=True).hidden_states[-1][0, -1]
        logits = vllm_medusa_logits(state, config, hidden)
        assert drafted(path, target, tokens, 3, "@1")[0] == vllm_medusa_chain(state, config, hidden)
        ranked = [row.argsort(descending=True).tolist() for row in logits]
        assert drafted(path, target, tokens, 6, "@2")[0] == [ranked[len(p) - 1][p[-1]] for p in paths]
        assert drafted(out, target, tokens, 6, "@2")[0] == [ranked[len(p) - 1][p[-1]] for p in paths]
        if truncated:  # a reader that takes the output rows' indices for token ids
            token_map = state["token_map"]
            control.append([int(row[token_map].argmax()) for row in logits] != drafted(path, target, tokens, 3,
                                                                                       "@1")[0])
    assert not truncated or any(control)


@pytest.mark.parametrize("change, message", [
    (lambda s, c: s.pop("token_map"), "needs a token_map of 16 token ids"),
    (lambda s, c: s.__setitem__("token_map", s["token_map"] + VOCAB), "outside the vocabulary of 64"),
    (lambda s, c: c.__setitem__("truncated_vocab_size", 12), "needs a token_map of 12 token ids"),
])
def test_bad_reduced_vocabularies_are_refused_in_one_line(tmp_path, target, change, message):
    from safetensors.torch import load_file, save_file

    path = write_vllm_medusa(tmp_path / "heads", target, truncated=16)
    state, config = load_file(str(path / "model.safetensors")), json.loads((path / "config.json").read_text())
    change(state, config)
    save_file(state, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(SpecdecError, match=message) as info:
        load_draft(f"medusa:{path}", Target(target, None))
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("layers", [1, 2])
def test_a_vllm_export_is_what_vllms_medusa_reads_and_drafts_the_same_chain(tmp_path, target, layers):
    """Every key the export writes is a parameter of vLLM's Medusa (its names, bias by medusa_fc_bias), the whole
    vocabulary (truncated_vocab_size = vocab_size: no token map), and vLLM's forward on the exported weights drafts
    our chain from the original; the serving mapping takes the export, chains only."""
    from safetensors.torch import load_file

    from specdraft_eval.integration.serving import speculative_config
    from zoo.build.export import export_head

    original = write_medusa(tmp_path / "heads", target, layers=layers)
    with pytest.raises(SpecdecError, match="zoo export .* --to vllm"):
        speculative_config(f"medusa:{original}@1", 3)
    result = export_head(original, "vllm", tmp_path / "vllm")
    out = Path(result.path)
    config = vllm_medusa_config(json.loads((out / "config.json").read_text()))
    state = load_file(str(out / "model.safetensors"))
    params = {f"blocks.{i}.layers.{j}.{p}" for i in range(3) for j in range(layers)
              for p in (("weight", "bias") if config.get("medusa_fc_bias") else ("weight",))}
    params |= {f"lm_heads.{i}.weight" for i in range(3)}
    assert config["model_type"] == "medusa" and set(state) == params
    assert config["truncated_vocab_size"] == config["vocab_size"] == VOCAB and config["hidden_size"] == HIDDEN
    for tokens in SEQUENCES:
        with torch.no_grad():
            hidden = target(torch.tensor([tokens[:-1]]), output_hidden_states=True).hidden_states[-1][0, -1]
        chain = drafted(original, target, tokens, 3, "@1")[0]
        assert vllm_medusa_chain(state, config, hidden) == chain == drafted(out, target, tokens, 3, "@1")[0]
    assert speculative_config(f"medusa:{out}@1", 3) == result.serve | {"num_speculative_tokens": 3}
    assert result.serve["method"] == "medusa"
    with pytest.raises(SpecdecError, match="top-1 chains"):
        speculative_config(f"medusa:{out}", 3)
    with pytest.raises(SpecdecError, match="sglang has no Medusa reader"):
        export_head(original, "sglang", tmp_path / "sglang")


def test_profile_times_medusa_heads_and_counts_their_weights(tmp_path, target):
    """zoo profile on Medusa heads (no attention, so no KV cache): timed, their weights counted."""
    from zoo.measure.timing import engine_latency

    draft = load_draft(f"medusa:{write_medusa(tmp_path / 'heads', target)}@1", Target(target, None))
    _, drafts = engine_latency(target, [draft], [1, 3], [list(range(2, 20))], 3)
    timing = drafts[draft.name]
    assert timing.t_draft.median > 0 and timing.kv_bytes_per_token == 0
    assert timing.parameters_m * 1e6 == pytest.approx(3 * (HIDDEN * HIDDEN + HIDDEN + VOCAB * HIDDEN))
