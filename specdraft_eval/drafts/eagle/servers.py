"""How vLLM and SGLang read an EAGLE head: what they would read differently from our loader, and the layouts
``zoo export`` writes for them."""

from __future__ import annotations

from pathlib import Path

import torch

from specdraft_eval.drafts.checkpoint import read_json, weight_names
from specdraft_eval.drafts.eagle.formats import (
    HEAD_FILE,
    IGNORED,
    WEIGHT_FILES,
    WHAT,
    _directory,
    eagle3_taps,
    has_qk_norm,
    norm_before_residual,
    variant_of,
)
from specdraft_eval.drafts.eagle.module import EAGLE3
from specdraft_eval.errors import SpecdecError
from specdraft_eval.files import write_json

SERVERS = ("vllm", "sglang")
TOKEN_MAP = "token_map.pt"
"""Beside an EAGLE-1 head exported for SGLang: its reduced vocabulary as SGLang's ``--speculative-token-map``."""


def server_differences(arg: str, server: str) -> str | None:
    """What ``server``'s reader (:data:`SERVERS`) of the head ``arg`` would read differently from our loader, or None:
    then it serves the head as it is; else ``zoo export --to SERVER`` writes it as that server reads it."""
    directory = _directory(arg)
    config = read_json(directory / "config.json", WHAT)
    keys = weight_names(directory, WEIGHT_FILES, WHAT)
    meta = read_json(directory / HEAD_FILE, WHAT) if (directory / HEAD_FILE).is_file() else {}
    eagle3 = variant_of(config, keys) == EAGLE3
    found = (_vllm_differences if server == "vllm" else _sglang_differences)(config, keys, meta, eagle3, directory)
    return "; ".join(found) or None


def _vllm_differences(config: dict, keys: set[str], meta: dict, eagle3: bool, directory: Path) -> list[str]:
    """vLLM (``llama_eagle``, ``llama_eagle3``, its speculators config): an EAGLE-1 ``fc`` bias, which it builds
    none of; our reduced vocabulary, which it ignores; a speculators config without the proposal method it
    validates."""
    if eagle3:
        methods = (config.get("speculators_config") or {}).get("proposal_methods") or [{}]
        missing = "speculators_model_type" in config and "speculative_tokens" not in methods[0]
        found = ["no speculators_config.proposal_methods[0].speculative_tokens"] if missing else []
        return found + (["q/k norms (Qwen3 layers), which its Llama layers lack"] if has_qk_norm(keys) else [])
    found = ["an fc bias its eagle reader drops"] if "fc.bias" in keys else []
    if meta.get("token_ids"):
        found.append(f"a {len(meta['token_ids'])}-token vocabulary it ignores")
    return found


def sglang_taps(config: dict) -> list[int] | None:
    """The target layers whose inputs SGLang feeds an EAGLE-3 head: it reads only ``eagle_config``'s ids, as layer
    outputs (it taps the input of id + 1; ``set_eagle3_layers_to_capture``); None: its default, as ours."""
    listed = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    return sorted(i + 1 for i in listed) if listed else None


SGLANG_EAGLE3 = {"fc.weight", "norm.weight", "lm_head.weight", "embed_tokens.weight", "d2t", "t2d"}
"""What SGLang's ``LlamaForCausalLMEagle3.load_weights`` reads besides ``midlayer.*`` (its one decoder layer, without
attention biases): any other key it skips without a word."""


def _sglang_differences(config: dict, keys: set[str], meta: dict, eagle3: bool, directory: Path) -> list[str]:
    """SGLang (``llama_eagle3``): weights it does not read (:data:`SGLANG_EAGLE3`: speculators' ``layers.*``, an
    input norm, later layers, attention biases), a residual taken after ``hidden_norm``, tap ids it reads otherwise;
    (``llama_eagle``): no ``fc`` bias (it builds one), a config ``bias``/``attention_bias`` without attention biases
    (it builds them from that flag), our reduced vocabulary without its token map."""
    if eagle3:
        dropped = sorted(k for k in keys if k not in IGNORED and k.removeprefix("model.") not in SGLANG_EAGLE3
                         and not (k.startswith("midlayer.") and not k.endswith("_proj.bias") and not has_qk_norm({k})))
        found = [f"weights it drops ({', '.join(dropped[:3])}{', ...' if len(dropped) > 3 else ''})"] if dropped else []
        if norm_before_residual(config):
            found.append("a residual taken after hidden_norm (norm_before_residual), which it takes before")
        if sglang_taps(config) != eagle3_taps(config):
            found.append("tap ids it reads otherwise (only eagle_config's, as layer outputs)")
        return found
    biases = any(k.startswith("layers.0.self_attn.") and k.endswith("_proj.bias") for k in keys)
    found = [] if "fc.bias" in keys else ["no fc bias (it builds one)"]
    if (config.get("bias") or config.get("attention_bias")) and not biases:
        found.append("config bias without attention biases (it builds them from that flag)")
    if meta.get("token_ids") and not (directory / TOKEN_MAP).is_file():
        found.append(f"a {len(meta['token_ids'])}-token vocabulary it reads only from a token map")
    return found


SPECULATIVE_TOKENS = 3
"""The proposal method's draft length written where a speculators config names none (EAGLE-3's training depth)."""


def _fold_fc_bias(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """EAGLE-1's ``fc`` bias b moved into layer 0's attention: its input x + b (no input norm) makes q, k, v
    W·x + W·b and the residual x + b, so q/k/v get W·b and o gets b added to any bias they have."""
    bias = state.pop("fc.bias", None)
    if bias is None:
        return state
    prefix = "layers.0.self_attn."
    for name in ("q", "k", "v"):
        weight = state[f"{prefix}{name}_proj.weight"].float()
        state[f"{prefix}{name}_proj.bias"] = state.get(f"{prefix}{name}_proj.bias", 0) + weight @ bias.float()
    state[f"{prefix}o_proj.bias"] = state.get(f"{prefix}o_proj.bias", 0) + bias.float()
    return state


def proposal_depth(config: dict) -> int:
    """The draft length a config's proposal method names (EAGLE-3's training depth), else :data:`SPECULATIVE_TOKENS`."""
    methods = (config.get("speculators_config") or {}).get("proposal_methods") or [{}]
    return methods[0].get("speculative_tokens", SPECULATIVE_TOKENS)


def vllm_layout(head: Path, config: dict, state: dict, meta: dict, variant: str):
    """vLLM: EAGLE-3 in speculators' layout and config; EAGLE-1 with its ``fc`` bias folded into the attention."""
    notes: list[str] = []
    if any(".q_norm." in k for k in state):
        raise SpecdecError(f"vLLM's EAGLE readers build Llama layers: head {head} has Qwen3's q/k norms, which they "
                           "lack; serve it here (draft=eagle:DIR)")
    if variant == EAGLE3:
        layer = dict(config.get("transformer_layer_config") or {k: v for k, v in config.items()
                                                                if k not in ("draft_vocab_size",)})
        speculators, taps = "speculators_model_type" in config, eagle3_taps(config)
        speculators_config = dict(config.get("speculators_config") or {"algorithm": EAGLE3})
        methods = speculators_config.get("proposal_methods") or [{"proposal_type": "greedy"}]
        methods[0] = {"speculative_tokens": SPECULATIVE_TOKENS, **methods[0]}
        written = {**({k: v for k, v in config.items() if k != "eagle_config"} if speculators else {}),
                   "speculators_model_type": EAGLE3, "architectures": ["Eagle3Speculator"],
                   "transformer_layer_config": layer, "draft_vocab_size": _draft_vocab(config, state),
                   "norm_before_residual": norm_before_residual(config),
                   "speculators_config": {**speculators_config, "proposal_methods": methods}}
        if taps:
            written["eagle_aux_hidden_state_layer_ids"] = taps
        return written, state, {}, notes
    state = _fold_fc_bias({k: v for k, v in state.items()
                           if k not in ("embed_tokens.weight", "layers.0.input_layernorm.weight")})
    biased = any(k.startswith("layers.") and k.endswith("_proj.bias") for k in state)
    written = {k: v for k, v in config.items() if k not in ("qkv_bias",)}
    written.update(attention_bias=biased, bias=biased, architectures=["LlamaForCausalLM"])
    if meta.get("token_ids"):
        notes.append(f"vLLM drafts over the target's whole vocabulary: this head was trained to choose among "
                     f"{len(meta['token_ids'])} tokens, so vLLM's drafts differ where the whole vocabulary's "
                     "best token is outside them")
    return written, state, {}, notes


def _draft_vocab(config: dict, state: dict) -> int | None:
    return int(len(state["d2t"])) if "d2t" in state else config.get("draft_vocab_size")


def sglang_layout(head: Path, config: dict, state: dict, meta: dict, variant: str):
    """SGLang: EAGLE-3 as ``LlamaForCausalLMEagle3`` (``midlayer.*``, a flat Llama config, taps under both names:
    ids for vLLM and us at the top, ids - 1 under ``eagle_config`` for SGLang); EAGLE-1 as ``LlamaForCausalLMEagle``
    (an ``fc`` bias, zero where the head had none; attention biases only where it has them; a token map for our
    reduced vocabulary, ``eagle.json`` kept for our loader). Heads it cannot run as they are trained: one line."""
    layers = {k.split(".")[1] for k in state if k.startswith("layers.")}
    if variant == EAGLE3:
        taps = eagle3_taps(config)
        refusal = ("the residual after hidden_norm (norm_before_residual), which SGLang takes before"
                   if norm_before_residual(config) else "a norm before fc (input_norm)" if "input_norm.weight" in state
                   else f"{len(layers)} decoder layers (SGLang's reader has one)" if len(layers) > 1
                   else "attention biases" if any(k.endswith("_proj.bias") for k in state)
                   else "q/k norms (Qwen3 layers)" if any(".q_norm." in k for k in state)
                   else "a tap on the target's embedding (layer 0's input), which SGLang's ids cannot name"
                   if taps and 0 in taps else None)
        if refusal:
            raise SpecdecError(f"SGLang's EAGLE-3 reader cannot run head {head} as it was trained ({refusal}): serve "
                               "it with vLLM (`zoo export --to vllm`)")
        layer = dict(config.get("transformer_layer_config") or config)
        written = {k: v for k, v in layer.items() if not k.startswith(("speculators", "eagle", "architectures"))}
        written.update(architectures=["LlamaForCausalLMEagle3"], model_type="llama", num_hidden_layers=1,
                       draft_vocab_size=_draft_vocab(config, state), tie_word_embeddings=False,
                       bias="fc.bias" in state)
        if "target_hidden_size" in config:
            written["target_hidden_size"] = config["target_hidden_size"]
        if taps:
            written.update(eagle_aux_hidden_state_layer_ids=taps,
                           eagle_config={"eagle_aux_hidden_state_layer_ids": [t - 1 for t in taps]})
        state = {("midlayer." + k.removeprefix("layers.0.") if k.startswith("layers.0.") else k): v
                 for k, v in state.items() if k in SGLANG_EAGLE3 or k.startswith("layers.0.")}
        return written, state, {}, []
    state = {k: v for k, v in state.items() if k not in ("embed_tokens.weight", "layers.0.input_layernorm.weight")}
    if "fc.bias" not in state:
        state["fc.bias"] = torch.zeros(state["fc.weight"].shape[0], dtype=state["fc.weight"].dtype)
    prefix = "layers.0.self_attn."
    biased = any(k.startswith(prefix) and k.endswith("_proj.bias") for k in state)
    if biased:  # SGLang builds q, k, v and o biases from one flag: the missing ones are zero
        for name in "qkvo":
            weight = state[f"{prefix}{name}_proj.weight"]
            state.setdefault(f"{prefix}{name}_proj.bias", torch.zeros(weight.shape[0], dtype=weight.dtype))
    written = {k: v for k, v in config.items() if k not in ("qkv_bias",)}
    written.update(architectures=["LlamaForCausalLMEagle"], attention_bias=biased, bias=biased)
    files = {}
    if meta.get("token_ids"):
        ids = torch.tensor(meta["token_ids"])
        files = {TOKEN_MAP: lambda path: torch.save(ids, path),
                 HEAD_FILE: lambda path: write_json(path, meta)}
    return written, state, files, []
