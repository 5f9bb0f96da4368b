"""EAGLE heads against the upstream conventions, not our own: checkpoints written here from the upstream key names
and shapes (vLLM ``speculators``' ``Eagle3DraftModel`` and ``LlamaDecoderEagle3FirstLayer``, the EAGLE repository's
``cnets1.py`` and ``midlayer`` layout, vLLM's ``llama_eagle3.py`` loader), never from our module's ``state_dict()``,
and drafted tokens and hidden states compared with an independent re-implementation of the upstream forward in plain
torch below. Negative controls: the reference with one convention changed (norm before the residual, tap order,
``d2t``'s direction) disagrees, so a wrong convention in the loader cannot pass."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from support import observed

from specdraft_eval.drafts.eagle import KIND
from specdraft_eval.engine.sampling import Sampler
from specdraft_eval.errors import SpecdecError
from specdraft_eval.models.targets import Target

TARGET_LAYERS = 6  # the `target` and `tiny` fixtures' depth

VOCAB, HIDDEN, HEADS, KV_HEADS, EPS, THETA = 64, 32, 4, 2, 1e-6, 10000.0


# --- checkpoints in the upstream layouts ---------------------------------------------------------------------------


def _norm(draw: torch.Generator, width: int) -> torch.Tensor:
    return 1 + 0.3 * torch.randn(width, generator=draw)  # not ones: a norm in the wrong place shows


def _linear(draw: torch.Generator, out: int, into: int) -> torch.Tensor:
    return torch.randn(out, into, generator=draw) / math.sqrt(into)


def _layer(draw: torch.Generator, prefix: str, hidden: int, heads: int, kv_heads: int, qkv_in: int,
           first_eagle3: bool, qkv_bias: bool = False, qk_norm: bool = False) -> dict[str, torch.Tensor]:
    """One decoder layer's keys as upstream names them (``hidden_norm`` only on EAGLE-3's first layer; Qwen3's
    ``q_norm``/``k_norm`` over the head dimension)."""
    dim = hidden // heads
    state = {f"{prefix}self_attn.q_proj.weight": _linear(draw, heads * dim, qkv_in),
             f"{prefix}self_attn.k_proj.weight": _linear(draw, kv_heads * dim, qkv_in),
             f"{prefix}self_attn.v_proj.weight": _linear(draw, kv_heads * dim, qkv_in),
             f"{prefix}self_attn.o_proj.weight": _linear(draw, hidden, heads * dim),
             f"{prefix}mlp.gate_proj.weight": _linear(draw, 2 * hidden, hidden),
             f"{prefix}mlp.up_proj.weight": _linear(draw, 2 * hidden, hidden),
             f"{prefix}mlp.down_proj.weight": _linear(draw, hidden, 2 * hidden),
             f"{prefix}input_layernorm.weight": _norm(draw, hidden),
             f"{prefix}post_attention_layernorm.weight": _norm(draw, hidden)}
    if first_eagle3:
        state[f"{prefix}hidden_norm.weight"] = _norm(draw, hidden)
    if qkv_bias:
        for name, rows in (("q", heads * dim), ("k", kv_heads * dim), ("v", kv_heads * dim)):
            state[f"{prefix}self_attn.{name}_proj.bias"] = 0.1 * torch.randn(rows, generator=draw)
    if qk_norm:
        state[f"{prefix}self_attn.q_norm.weight"], state[f"{prefix}self_attn.k_norm.weight"] = _norm(draw, dim), \
            _norm(draw, dim)
    return state


def _layer_config(hidden: int, heads: int, kv_heads: int, layers: int) -> dict:
    return {"model_type": "llama", "hidden_size": hidden, "intermediate_size": 2 * hidden, "num_attention_heads": heads,
            "num_key_value_heads": kv_heads, "num_hidden_layers": layers, "rms_norm_eps": EPS, "rope_theta": THETA,
            "max_position_embeddings": 512, "vocab_size": VOCAB, "hidden_act": "silu"}


DRAFT_IDS = [0, 1, 2, 5, 8, 13, 21, 34, 40, 50, 63]


def write_eagle3(path: Path, *, layers: int = 1, norm_before_residual: bool | None = None, norm_before_fc: bool = False,
                 width: int = HIDDEN, taps: list[int] | None = None, taps_under: str = "top", midlayer: bool = False,
                 embedding: bool = False, extra: dict | None = None, seed: int = 7, family: str = "llama") -> Path:
    """An EAGLE-3 head as speculators saves it (``midlayer``: as the EAGLE repository does): ``fc`` [H, 3·Ht],
    optional ``input_norm`` (``norm_before_fc``), ``layers.N`` (the first with a 2H attention input and
    ``hidden_norm``), ``norm``, ``lm_head`` over the draft vocabulary, ``d2t`` (offsets) and ``t2d``, the training
    copies of the verifier's norm and head; ``embedding``: its own ``embed_tokens`` (required when ``width`` differs
    from the target's); ``family``: the layers' (``qwen3``: q/k norms; ``qwen2``: q/k/v biases)."""
    draw = torch.Generator().manual_seed(seed)
    heads, kv_heads = (HEADS, KV_HEADS) if width == HIDDEN else (2, 1)
    state = {"fc.weight": _linear(draw, width, 3 * HIDDEN), "norm.weight": _norm(draw, width),
             "lm_head.weight": _linear(draw, len(DRAFT_IDS), width),
             "d2t": torch.tensor(DRAFT_IDS) - torch.arange(len(DRAFT_IDS)),
             "t2d": torch.isin(torch.arange(VOCAB), torch.tensor(DRAFT_IDS)),
             "verifier_norm.weight": torch.ones(HIDDEN), "verifier_lm_head.weight": torch.randn(VOCAB, HIDDEN)}
    for i in range(layers):
        state |= _layer(draw, f"layers.{i}.", width, heads, kv_heads, 2 * width if i == 0 else width, i == 0,
                        qkv_bias=family == "qwen2", qk_norm=family == "qwen3")
    if norm_before_fc:
        state["input_norm.weight"] = _norm(draw, 3 * HIDDEN)
    if embedding:
        state["embed_tokens.weight"] = torch.randn(VOCAB, width, generator=draw)
    state |= extra or {}
    if midlayer:
        state = {k.replace("layers.0.", "midlayer."): v for k, v in state.items()}
    path.mkdir(parents=True)
    from safetensors.torch import save_file

    save_file(state, str(path / "model.safetensors"))
    layer = {**_layer_config(width, heads, kv_heads, layers), "model_type": family}
    listed = taps or [2, 3, 1]
    if midlayer:  # the EAGLE repository's config: the layer's fields at the top
        config = {**layer, "draft_vocab_size": len(DRAFT_IDS), "eagle_aux_hidden_state_layer_ids": listed}
    else:
        config = {"speculators_model_type": "eagle3", "architectures": ["Eagle3Speculator"],
                  "transformer_layer_config": layer, "draft_vocab_size": len(DRAFT_IDS),
                  "norm_before_fc": norm_before_fc,
                  "speculators_config": {"algorithm": "eagle3", "verifier": {"name_or_path": "tiny"},
                                         "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}]}}
        if width != HIDDEN:
            config["target_hidden_size"] = HIDDEN
        if norm_before_residual is not None:
            config["norm_before_residual"] = norm_before_residual
        if taps_under == "top":
            config["eagle_aux_hidden_state_layer_ids"] = listed
        else:
            config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": listed}
    (path / "config.json").write_text(json.dumps(config))
    return path


def write_eagle1(path: Path, target, *, qkv_bias: bool = False, seed: int = 9) -> Path:
    """An EAGLE-1 head as the EAGLE repository saves it (``cnets1.py``): ``fc`` over [embedding ‖ feature] with a
    bias, ``layers.0`` (its input norm present and unused), a copy of the target's embedding, a Llama config."""
    draw = torch.Generator().manual_seed(seed)
    state = {"fc.weight": _linear(draw, HIDDEN, 2 * HIDDEN), "fc.bias": 0.1 * torch.randn(HIDDEN, generator=draw),
             "embed_tokens.weight": target.get_input_embeddings().weight.detach().clone(),
             **_layer(draw, "layers.0.", HIDDEN, HEADS, KV_HEADS, HIDDEN, False, qkv_bias)}
    path.mkdir(parents=True)
    torch.save(state, path / "pytorch_model.bin")
    config = {**_layer_config(HIDDEN, HEADS, KV_HEADS, 1), "architectures": ["LlamaForCausalLM"], "bias": True}
    if qkv_bias:
        config["qkv_bias"] = True
    (path / "config.json").write_text(json.dumps(config))
    return path


# --- the upstream forward, re-implemented ---------------------------------------------------------------------------


def rms(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * weight


def rope(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Llama's rotary embedding of ``x`` [T, heads, d] (rotate-half convention)."""
    d = x.shape[-1]
    angles = positions[:, None].float() / THETA ** (torch.arange(0, d, 2).float() / d)  # [T, d/2]
    cos, sin = torch.cat([angles, angles], -1).cos()[:, None], torch.cat([angles, angles], -1).sin()[:, None]
    half = torch.cat([-x[..., d // 2:], x[..., : d // 2]], -1)
    return x * cos + half * sin


def attention(h: torch.Tensor, w: dict, prefix: str, heads: int, kv_heads: int) -> torch.Tensor:
    """Causal multi-head attention over positions 0..T-1 (grouped key/value heads), ``h`` [T, in] -> [T, hidden]."""
    def proj(name: str, count: int) -> torch.Tensor:
        out = h @ w[f"{prefix}{name}_proj.weight"].T + w.get(f"{prefix}{name}_proj.bias", 0)
        return out.view(len(h), count, -1)

    positions = torch.arange(len(h))
    q, k, v = proj("q", heads), proj("k", kv_heads), proj("v", kv_heads)
    if f"{prefix}q_norm.weight" in w:  # Qwen3: RMS norm per head before RoPE
        q, k = rms(q, w[f"{prefix}q_norm.weight"]), rms(k, w[f"{prefix}k_norm.weight"])
    q, k = rope(q, positions), rope(k, positions)
    k, v = k.repeat_interleave(heads // kv_heads, 1), v.repeat_interleave(heads // kv_heads, 1)
    scores = torch.einsum("thd,shd->hts", q, k) / math.sqrt(q.shape[-1])
    scores = scores + torch.full((len(h), len(h)), float("-inf")).triu(1)
    out = torch.einsum("hts,shd->thd", scores.softmax(-1), v).reshape(len(h), -1)
    return out @ w[f"{prefix}o_proj.weight"].T + w.get(f"{prefix}o_proj.bias", 0)


def mlp(h: torch.Tensor, w: dict, prefix: str) -> torch.Tensor:
    gate, up = h @ w[f"{prefix}mlp.gate_proj.weight"].T, h @ w[f"{prefix}mlp.up_proj.weight"].T
    return (torch.nn.functional.silu(gate) * up) @ w[f"{prefix}mlp.down_proj.weight"].T


def eagle3_layers(x: torch.Tensor, w: dict, layers: int, width: int, before_residual: bool) -> torch.Tensor:
    """speculators' decoder stack: the first layer over [norm(embedding) ‖ hidden_norm(hidden)], the rest plain."""
    heads, kv_heads = (HEADS, KV_HEADS) if width == HIDDEN else (2, 1)
    embeds, hidden = x[:, :width], x[:, width:]
    normed = rms(hidden, w["layers.0.hidden_norm.weight"])
    residual = normed if before_residual else hidden
    h = torch.cat([rms(embeds, w["layers.0.input_layernorm.weight"]), normed], -1)
    h = residual + attention(h, w, "layers.0.self_attn.", heads, kv_heads)
    h = h + mlp(rms(h, w["layers.0.post_attention_layernorm.weight"]), w, "layers.0.")
    for i in range(1, layers):
        p = f"layers.{i}."
        h = h + attention(rms(h, w[p + "input_layernorm.weight"]), w, p + "self_attn.", heads, kv_heads)
        h = h + mlp(rms(h, w[p + "post_attention_layernorm.weight"]), w, p)
    return h


def reference_eagle3(w: dict, target, tokens: list[int], taps: list[int], gamma: int, *, layers: int = 1,
                     width: int = HIDDEN, before_residual: bool = True, d2t_sign: int = 1) -> tuple[list[int],
                                                                                                    torch.Tensor]:
    """Draft ``gamma`` tokens as vLLM runs an EAGLE-3 head: taps = the inputs of those target layers
    (``output_hidden_states[t]``) in ``taps``' order, ``fc`` (after ``input_norm`` where present), the feature of
    position t paired with token t+1, the head's own pre-norm output fed back, logits through ``norm`` and
    ``lm_head``, target id = draft id + d2t. Returns the drafted target ids and the hidden states of the target's
    positions."""
    with torch.no_grad():
        states = target(torch.tensor([tokens[:-1]]), output_hidden_states=True).hidden_states
        features = torch.cat([states[t][0] for t in taps], -1)  # [n, 3 Ht]
        if "input_norm.weight" in w:
            features = rms(features, w["input_norm.weight"])
        hidden = features @ w["fc.weight"].T  # [n, H]
        embed = w.get("embed_tokens.weight", target.get_input_embeddings().weight)
        ids, drafted, first = list(tokens[1:]), [], None
        for _ in range(gamma):
            out = eagle3_layers(torch.cat([embed[ids], hidden], -1), w, layers, width, before_residual)
            first = out if first is None else first
            draft = int((rms(out[-1], w["norm.weight"]) @ w["lm_head.weight"].T).argmax())
            drafted.append(draft + d2t_sign * int(w["d2t"][draft]))
            ids.append(drafted[-1])
            hidden = torch.cat([hidden, out[-1:]])
    return drafted, first


def reference_eagle1(w: dict, target, tokens: list[int], gamma: int, hot: list[int] | None = None) -> list[int]:
    """EAGLE-1 (``cnets1.py``): fc over [embedding ‖ feature] (the target's last hidden state after its norm),
    layer 0 without its input norm, no final norm, the target's output head (its ``hot`` rows only: SGLang's token
    map); own output fed back."""
    with torch.no_grad():
        feature = target(torch.tensor([tokens[:-1]]), output_hidden_states=True).hidden_states[-1][0]
        embed = w.get("embed_tokens.weight", target.get_input_embeddings().weight)
        head = target.get_output_embeddings().weight
        hot = torch.tensor(hot) if hot is not None else torch.arange(len(head))
        head = head[hot]
        ids, drafted = list(tokens[1:]), []
        for _ in range(gamma):
            x = torch.cat([embed[ids], feature], -1) @ w["fc.weight"].T + w["fc.bias"]
            h = x + attention(x, w, "layers.0.self_attn.", HEADS, KV_HEADS)
            h = h + mlp(rms(h, w["layers.0.post_attention_layernorm.weight"]), w, "layers.0.")
            drafted.append(int(hot[(h[-1] @ head.T).argmax()]))
            ids.append(drafted[-1])
            feature = torch.cat([feature, h[-1:]])
    return drafted


def _weights(path: Path) -> dict[str, torch.Tensor]:
    if (path / "model.safetensors").is_file():
        from safetensors.torch import load_file

        state = load_file(str(path / "model.safetensors"))
    else:
        state = torch.load(path / "pytorch_model.bin", weights_only=True)
    return {k.replace("midlayer.", "layers.0."): v for k, v in state.items()}


def ours(path: Path, target, tokens: list[int], gamma: int, taps: list[int] | None) -> list[int]:
    """Our drafter's chain, fed the target's features as the engine feeds them."""
    drafter = KIND.load(str(path), Target(target, None))
    with torch.no_grad():
        states = target(torch.tensor([tokens[:-1]]), output_hidden_states=True).hidden_states
    drafter.observe(torch.cat([states[t][0] for t in taps], -1) if taps else states[-1][0])
    return drafter.propose(tokens, gamma, Sampler()).tokens


SEQUENCES = [[5, 9, 2, 7, 7, 3, 11, 4], list(range(10, 40, 3)), [1, 2]]
VARIANTS = {  # name: (write_eagle3 arguments, the reference's layers, width, norm before the residual)
    "speculators": (dict(norm_before_residual=False), 1, HIDDEN, False),
    "speculators-defaults": (dict(), 1, HIDDEN, True),  # no norm_before_residual: vLLM's True
    "two-layers-norm-before-fc": (dict(layers=2, norm_before_fc=True, norm_before_residual=True), 2, HIDDEN, True),
    "narrow-own-embedding": (dict(width=16, embedding=True), 1, 16, True),
    "taps-under-eagle-config": (dict(taps_under="eagle_config", taps=[4, 1, 3]), 1, HIDDEN, True),
    "eagle-repository-midlayer": (dict(midlayer=True), 1, HIDDEN, False),
    "qwen3-layers": (dict(family="qwen3", layers=2, norm_before_residual=False), 2, HIDDEN, False),
    "qwen2-layers": (dict(family="qwen2"), 1, HIDDEN, True),
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_eagle3_layouts_draft_the_tokens_the_upstream_forward_drafts(tmp_path, target, variant):
    kwargs, layers, width, before_residual = VARIANTS[variant]
    path = write_eagle3(tmp_path / variant, **kwargs)
    w, taps = _weights(path), sorted(kwargs.get("taps", [2, 3, 1]))  # the target produces its layers in order
    for tokens in SEQUENCES:
        expected, _ = reference_eagle3(w, target, tokens, taps, 4, layers=layers, width=width,
                                       before_residual=before_residual)
        assert ours(path, target, tokens, 4, taps) == expected, (variant, tokens)
    drafter = KIND.load(str(path), Target(target, None))  # the head's hidden states themselves, position by position
    tokens = SEQUENCES[1]
    _, hidden = reference_eagle3(w, target, tokens, taps, 1, layers=layers, width=width,
                                 before_residual=before_residual)
    with torch.no_grad():
        states = target(torch.tensor([tokens[:-1]]), output_hidden_states=True).hidden_states
        features = torch.cat([states[t][0] for t in taps], -1)[None]
        mine = drafter.model(drafter.embed(torch.tensor([tokens[1:]])), features, None,
                             torch.arange(len(tokens) - 1)[None])[0]
    torch.testing.assert_close(mine, hidden, rtol=1e-4, atol=1e-4)


def test_the_reference_fails_a_wrong_convention(tmp_path, target):
    """Negative controls: the residual taken on the other side of the norm, the taps in their listed order, and d2t
    read backwards each draft other tokens than the head does on some sequence."""
    path = write_eagle3(tmp_path / "head", norm_before_residual=True, taps=[4, 1, 3])
    w = _weights(path)
    right = [ours(path, target, t, 4, [1, 3, 4]) for t in SEQUENCES]
    assert right == [reference_eagle3(w, target, t, [1, 3, 4], 4)[0] for t in SEQUENCES]
    for taps, wrong in (([1, 3, 4], dict(before_residual=False)), ([4, 1, 3], {}), ([1, 3, 4], dict(d2t_sign=-1))):
        drafted = [reference_eagle3(w, target, t, taps, 4, **wrong)[0] for t in SEQUENCES]
        assert drafted != right, (taps, wrong)


@pytest.mark.parametrize("qkv_bias", [False, True])
def test_eagle1_repository_heads_draft_the_tokens_the_upstream_forward_drafts(tmp_path, target, qkv_bias):
    path = write_eagle1(tmp_path / f"eagle1-{qkv_bias}", target, qkv_bias=qkv_bias)
    w = _weights(path)
    for tokens in SEQUENCES:
        assert ours(path, target, tokens, 4, None) == reference_eagle1(w, target, tokens, 4), tokens


def test_the_engine_hands_an_eagle3_head_the_inputs_of_its_layers_in_ascending_order(tmp_path, target):
    """Taps listed out of order under eagle_config: the features the engine observes are the inputs of those
    decoder layers (output_hidden_states[t]), concatenated by ascending layer, as vLLM collects them."""
    from specdraft_eval.engine.loop import speculative_generate

    drafter = KIND.load(str(write_eagle3(tmp_path / "head", taps=[4, 1, 3], taps_under="eagle_config")),
                    Target(target, None))
    seen = observed(drafter)
    prompt = list(range(2, 12))
    out, _ = speculative_generate(target, drafter, prompt, 10, num_draft_tokens=2)
    with torch.no_grad():
        states = target(torch.tensor([prompt + out]), output_hidden_states=True).hidden_states
    features = torch.cat(seen)
    expected = torch.cat([states[t][0] for t in (1, 3, 4)], -1)[: len(features)]
    torch.testing.assert_close(features, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("change,message", [
    (dict(extra={"fc_norm.weight": torch.ones(HIDDEN)}), "does not model: fc_norm.weight"),
    (dict(extra={"layers.0.self_attn.q_norm.weight": torch.ones(8)}), "llama decoder layers with q/k norms"),
    (dict(family="mistral"), "mistral decoder layers without q/k norms"),
    (dict(extra={"embed_tokens.weight": torch.ones(VOCAB, 7)}), "has an embed_tokens of [64, 7]"),
    (dict(width=16), "has no embed_tokens of its own"),
])
def test_a_checkpoint_key_is_read_or_refused_in_one_line(tmp_path, target, change, message):
    path = write_eagle3(tmp_path / "head", **change)
    with pytest.raises(SpecdecError, match=message.replace("[", r"\[").replace("]", r"\]")):
        KIND.load(str(path), Target(target, None))


def test_a_config_that_miscounts_its_layers_is_refused(tmp_path, target):
    path = write_eagle3(tmp_path / "head", layers=2)
    config = json.loads((path / "config.json").read_text())
    config["transformer_layer_config"]["num_hidden_layers"] = 1
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(SpecdecError, match="its config says 1 decoder layers, its weights hold 2"):
        KIND.load(str(path), Target(target, None))


# --- exports: what vLLM's readers require -----------------------------------------------------------------------------


def test_an_eagle1_export_is_what_vllm_reads_and_drafts_the_same_tokens(tmp_path, target):
    """vLLM's llama_eagle has no fc bias and takes attention biases from config attention_bias/bias: the export folds
    the bias into them exactly, so the exported head drafts the original's tokens; serving maps only the export."""
    from specdraft_eval.integration.serving import speculative_config
    from zoo.build.export import export_head

    for qkv_bias in (False, True):
        original = write_eagle1(tmp_path / f"eagle1-{qkv_bias}", target, qkv_bias=qkv_bias)
        with pytest.raises(SpecdecError, match="an fc bias its eagle reader drops.*zoo export"):
            speculative_config(f"eagle:{original}", 4)
        out = tmp_path / f"vllm-{qkv_bias}"
        result = export_head(original, "vllm", out)
        config, state = json.loads((out / "config.json").read_text()), _weights(out)
        assert "fc.bias" not in state and "embed_tokens.weight" not in state and "qkv_bias" not in config
        assert config["attention_bias"] is config["bias"] is True  # vLLM: q/k/v and o biases, all present
        assert {f"layers.0.self_attn.{p}_proj.bias" for p in "qkvo"} <= set(state)
        for tokens in SEQUENCES:
            assert ours(out, target, tokens, 4, None) == ours(original, target, tokens, 4, None), tokens
        assert speculative_config(f"eagle:{out}", 4) == result.serve | {"num_speculative_tokens": 4}


def test_an_eagle3_export_carries_what_vllm_validates(tmp_path, target):
    """speculators' config with the proposal method vLLM requires, norm_before_residual and ascending taps written
    out (the EAGLE repository's midlayer layout converted): the same tokens under our loader."""
    from zoo.build.export import export_head

    for midlayer in (False, True):
        original = write_eagle3(tmp_path / f"head-{midlayer}", midlayer=midlayer, taps=[4, 1, 3])
        if not midlayer:  # a speculators config without the proposal method vLLM validates
            config = json.loads((original / "config.json").read_text())
            config["speculators_config"] = {"algorithm": "eagle3"}
            (original / "config.json").write_text(json.dumps(config))
        out = tmp_path / f"vllm-{midlayer}"
        result = export_head(original, "vllm", out)
        written = json.loads((out / "config.json").read_text())
        assert written["speculators_model_type"] == "eagle3" and result.method == "eagle3"
        assert written["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 3
        assert written["norm_before_residual"] is (not midlayer)  # speculators' default True, the repository's False
        assert written["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]
        assert not any(k.startswith("midlayer.") for k in _weights(out))
        for tokens in SEQUENCES:
            assert ours(out, target, tokens, 4, [1, 3, 4]) == ours(original, target, tokens, 4, [1, 3, 4]), tokens


def test_zoo_export_cli(tmp_path, target):
    from support import run_cli

    original = write_eagle1(tmp_path / "head", target)
    done = run_cli("zoo", "export", str(original), "--to", "vllm", "--out", str(tmp_path / "out"), "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["serve"]["method"] == "eagle"
    again = run_cli("zoo", "export", str(original), "--to", "vllm", "--out", str(tmp_path / "out"))
    assert again.returncode == 1 and again.stderr.strip().splitlines()[-1].startswith("zoo: error: --out")
    other = run_cli("zoo", "export", str(original), "--to", "tgi", "--out", str(tmp_path / "tgi"))
    assert other.returncode == 1 and "exports go to vllm, sglang" in other.stderr and not (tmp_path / "tgi").exists()


# --- SGLang's readers (srt/models/llama_eagle.py, llama_eagle3.py; set_eagle3_layers_to_capture), from their source --


def sglang_eagle3_params(layers: int = 1) -> set[str]:
    """LlamaForCausalLMEagle3's parameters after its load_weights name mapping (q/k/v -> qkv_proj, gate/up ->
    gate_up_proj; ``model.`` prefixed where the bare name is not a parameter): a checkpoint key outside them is
    skipped without a word."""
    layer = {"self_attn.qkv_proj.weight", "self_attn.o_proj.weight", "mlp.gate_up_proj.weight", "mlp.down_proj.weight",
             "input_layernorm.weight", "hidden_norm.weight", "post_attention_layernorm.weight"}
    return ({"model.embed_tokens.weight", "model.fc.weight", "model.norm.weight", "lm_head.weight"}
            | {f"model.midlayer.{k}" for k in layer})


def sglang_eagle3_reads(key: str) -> bool:
    if key in ("d2t", "t2d"):
        return True  # d2t -> hot_token_id; t2d skipped on purpose
    for shard, stacked in ((".q_proj", ".qkv_proj"), (".k_proj", ".qkv_proj"), (".v_proj", ".qkv_proj"),
                           (".gate_proj", ".gate_up_proj"), (".up_proj", ".gate_up_proj")):
        if shard in key:
            key = key.replace(shard, stacked)
            break
    return key in sglang_eagle3_params() or f"model.{key}" in sglang_eagle3_params()


def sglang_taps(config: dict, depth: int) -> list[int]:
    """The target layers whose inputs SGLang captures: eagle_config's ids + 1, else 2, L // 2, L - 3."""
    listed = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    return sorted(i + 1 for i in listed) if listed else [2, depth // 2, depth - 3]


def test_an_eagle3_export_for_sglang_is_what_its_reader_reads_and_drafts_the_same_tokens(tmp_path, target):
    """Every key the export writes is one SGLang's loader reads, its taps (eagle_config ids + 1) are the head's,
    and SGLang's forward (one midlayer, the residual before hidden_norm) on the exported weights drafts the tokens
    our loader drafts from the original; vLLM's reading of the same files (top-level ids as layer inputs) agrees."""
    from zoo.build.export import export_head

    original = write_eagle3(tmp_path / "head", midlayer=True, taps=[4, 1, 3])
    result = export_head(original, "sglang", tmp_path / "sglang")
    out = Path(result.path)
    config = json.loads((out / "config.json").read_text())
    from safetensors.torch import load_file

    raw = load_file(str(out / "model.safetensors"))
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["tie_word_embeddings"] is False
    assert config["draft_vocab_size"] == len(raw["d2t"]) == raw["lm_head.weight"].shape[0]
    assert all(sglang_eagle3_reads(k) for k in raw), sorted(k for k in raw if not sglang_eagle3_reads(k))
    assert sglang_taps(config, 6) == config["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]
    assert result.serve["speculative-algorithm"] == "EAGLE3"
    w = {k.replace("midlayer.", "layers.0."): v for k, v in raw.items()}
    for tokens in SEQUENCES:
        expected = ours(original, target, tokens, 4, [1, 3, 4])
        assert reference_eagle3(w, target, tokens, sglang_taps(config, 6), 4, before_residual=False)[0] == expected
        assert ours(out, target, tokens, 4, [1, 3, 4]) == expected


@pytest.mark.parametrize("change, message", [
    (dict(), "norm_before_residual"),  # speculators' default: the residual after hidden_norm
    (dict(norm_before_residual=False, layers=2), "2 decoder layers"),
    (dict(norm_before_residual=False, norm_before_fc=True), "a norm before fc"),
])
def test_heads_sglang_cannot_run_as_trained_are_refused_in_one_line(tmp_path, target, change, message):
    from zoo.build.export import export_head

    with pytest.raises(SpecdecError, match=f"SGLang's EAGLE-3 reader cannot run head .*{message}.*--to vllm"):
        export_head(write_eagle3(tmp_path / "head", **change), "sglang", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_an_eagle1_export_for_sglang_is_what_its_reader_reads_and_drafts_the_same_tokens(tmp_path, target):
    """SGLang's llama_eagle: fc always with a bias (zero where the head had none), attention biases for q, k, v and
    o from one config flag (attention_bias or bias), layer 0's input norm deleted, the target's embedding and head,
    a reduced vocabulary only through --speculative-token-map: the exported head read that way drafts our tokens."""
    from support import eagle_dir

    from zoo.build.export import export_head

    hot = [0, 2, 3, 7, 9, 11, 20, 31, 40, 63]
    for name, original in (("repo", write_eagle1(tmp_path / "repo", target)),
                           ("qkv", write_eagle1(tmp_path / "qkv", target, qkv_bias=True)),
                           ("ours", eagle_dir(tmp_path, target, hot))):
        out = Path(export_head(original, "sglang", tmp_path / f"sglang-{name}").path)
        config, w = json.loads((out / "config.json").read_text()), {k: v.float() for k, v in _weights(out).items()}
        flag = bool(config.get("attention_bias") or config.get("bias"))
        biases = {f"layers.0.self_attn.{p}_proj.bias" for p in "qkvo"}
        assert config["architectures"] == ["LlamaForCausalLMEagle"] and "fc.bias" in w
        assert (biases <= set(w)) if flag else not (biases & set(w)), name
        assert "layers.0.input_layernorm.weight" not in w
        token_map = torch.load(out / "token_map.pt") if (out / "token_map.pt").is_file() else None
        assert (token_map.tolist() if token_map is not None else None) == (hot if name == "ours" else None)
        for tokens in SEQUENCES:
            reference = reference_eagle1(w, target, tokens, 4, hot=None if token_map is None else token_map.tolist())
            assert reference == ours(original, target, tokens, 4, None) == ours(out, target, tokens, 4, None), name


def test_qwen3_layer_heads_load_here_and_are_refused_by_the_servers_exports(tmp_path, target):
    """Neither vLLM's nor SGLang's EAGLE-3 reader has q/k norms: the mapping names the difference, and both exports
    refuse in one line, writing nothing."""
    from specdraft_eval.drafts.eagle import server_differences
    from zoo.build.export import export_head

    head = write_eagle3(tmp_path / "head", family="qwen3", norm_before_residual=False)
    assert "q/k norms" in server_differences(str(head), "vllm")
    midlayer = write_eagle3(tmp_path / "midlayer", family="qwen3", midlayer=True, taps=[1, 2, 3])
    assert "midlayer.self_attn.k_norm.weight" in server_differences(str(midlayer), "sglang")
    for to, message in (("vllm", "vLLM's EAGLE readers build Llama layers"), ("sglang", "q/k norms")):
        with pytest.raises(SpecdecError, match=message):
            export_head(head, to, tmp_path / to)
        assert not (tmp_path / to).exists()
