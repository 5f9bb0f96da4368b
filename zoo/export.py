"""``zoo export DIR --to vllm|sglang``: an EAGLE head as vLLM or SGLang loads it, as it is (Medusa heads: vLLM).

vLLM's readers (``model_executor/models/llama_eagle.py``, ``llama_eagle3.py``) differ from what ``zoo train-head``
and the EAGLE repository write: its EAGLE-1 ``fc`` has no bias and its attention biases come from the config's
``attention_bias``/``bias``; it drafts over the target's whole vocabulary (our ``eagle.json`` reduced vocabulary is
not read); an EAGLE-3 head's ``norm_before_residual`` defaults differ between its readers; its speculators config
must name ``proposal_methods[0].speculative_tokens``. The export makes each of these explicit:

- EAGLE-1: ``fc.bias`` b is folded into the first layer's attention biases (q, k, v get W·b, o gets b: the layer
  has no input norm, so this is exact), the config says ``attention_bias``/``bias`` accordingly, the embedding copy
  and the skipped input norm are dropped (vLLM shares the target's embedding).
- EAGLE-3: speculators' layout (the EAGLE repository's ``midlayer`` renamed to ``layers.0``), a speculators config
  with ``norm_before_residual`` and the tap layers written out and a proposal method.

SGLang's readers (``srt/models/llama_eagle.py``, ``llama_eagle3.py``, ``set_eagle3_layers_to_capture``) differ
otherwise: EAGLE-1's ``fc`` always has a bias and a config ``bias`` makes attention biases; a reduced vocabulary is
its ``--speculative-token-map``; EAGLE-3 reads ``midlayer.*`` (one layer, no attention biases, the residual before
``hidden_norm``) and skips any other key silently; its tap ids sit under ``eagle_config`` and name layer outputs
(it taps the input of id + 1, where vLLM and we read the ids as layer inputs). The export writes each as SGLang
reads it, and refuses in one line a head SGLang cannot run as it was trained (norm before the residual or before
``fc``, several layers, attention biases): vLLM serves those.

The exported head drafts what the original drafts under our loader (tested), except where the server itself
differs: a reduced vocabulary vLLM ignores is said in ``notes``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from specdraft_eval.drafts import medusa
from specdraft_eval.drafts.eagle import (
    EAGLE3,
    HEAD_FILE,
    SERVERS,
    SGLANG_EAGLE3,
    TOKEN_MAP,
    eagle3_taps,
    norm_before_residual,
    read_checkpoint,
    variant_of,
)
from specdraft_eval.errors import SpecdecError
from specdraft_eval.files import atomic_output, write_json
from specdraft_eval.integration.serving import sglang_args, speculative_config

SPECULATIVE_TOKENS = 3
"""The proposal method's draft length written where a speculators config names none (EAGLE-3's training depth)."""


@dataclass
class Export:
    """What ``zoo export`` wrote: where, for which server, the head's method, what serves it there (vLLM's
    ``speculative_config``, SGLang's server arguments), and anything the server will do differently from our
    loader."""

    path: str
    to: str
    method: str
    serve: dict  # vLLM's speculative_config, or SGLang's server arguments
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return asdict(self)


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


def export_head(head: Path, to: str, out: Path) -> Export:
    """Write ``head`` (an EAGLE head directory) to ``out`` as ``to`` (:data:`SERVERS`) loads it; see the module
    docstring. ``out`` must not exist; nothing is left half-written."""
    if to not in SERVERS:
        raise SpecdecError(f"--to {to!r}: exports go to {', '.join(SERVERS)}")
    if out.exists():
        raise SpecdecError(f"--out {out} exists: give a new directory")
    if medusa.is_medusa(head):
        return _medusa(head, to, out)
    config, state, meta = read_checkpoint(head)
    variant = variant_of(config, state)
    written, state, files, notes = (_vllm if to == "vllm" else _sglang)(head, config, state, meta, variant)
    _write(out, state, written, files)
    draft = f"eagle:{out.resolve()}"
    serve = speculative_config(draft, _depth(written)) if to == "vllm" else sglang_args(draft, _depth(written))
    return Export(str(out.resolve()), to, EAGLE3 if variant == EAGLE3 else "eagle", serve, notes)


def _write(out: Path, state: dict[str, torch.Tensor], config: dict, files: dict | None = None) -> None:
    """``out`` written atomically: ``model.safetensors``, ``config.json`` and ``files`` (name -> writer of a path)."""
    from safetensors.torch import save_file

    with atomic_output(out, directory=True) as tmp:
        save_file({k: v.detach().contiguous() for k, v in state.items()}, str(tmp / "model.safetensors"))
        (tmp / "config.json").write_text(json.dumps(config, indent=1, default=str))
        for name, write in (files or {}).items():
            write(tmp / name)


def _medusa(head: Path, to: str, out: Path) -> Export:
    """Medusa heads in vLLM's layout (``model_executor/models/medusa.py``, ``MedusaConfig``;
    :func:`~specdraft_eval.drafts.medusa.vllm_files`): the whole vocabulary, or a reduced one with its ``token_map``.
    SGLang has no Medusa reader."""
    if to != "vllm":
        raise SpecdecError(f"{to} has no Medusa reader: export Medusa heads --to vllm, or serve an EAGLE head there")
    heads, config = medusa.read_heads(head)
    state, written = medusa.vllm_files(heads)
    written |= {k: v for k, v in config.items() if k == "medusa_choices"}
    _write(out, state, written)
    return Export(str(out.resolve()), to, "medusa", speculative_config(f"medusa:{out.resolve()}@1", len(heads.out)),
                  ["vLLM's Medusa proposer drafts top-1 chains: serve it as medusa:DIR@1 (its trees run here)"])


def _depth(config: dict) -> int:
    """The draft length a config's proposal method names (EAGLE-3's training depth), else :data:`SPECULATIVE_TOKENS`."""
    methods = (config.get("speculators_config") or {}).get("proposal_methods") or [{}]
    return methods[0].get("speculative_tokens", SPECULATIVE_TOKENS)


def _vllm(head: Path, config: dict, state: dict, meta: dict, variant: str):
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


def _sglang(head: Path, config: dict, state: dict, meta: dict, variant: str):
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
