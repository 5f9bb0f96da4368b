"""``zoo export DIR --to vllm``: an EAGLE head as vLLM loads it, as it is.

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

The exported head drafts what the original drafts under our loader (tested), except where vLLM itself differs: a
reduced vocabulary is said in ``notes``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from specdraft_eval.drafts.eagle import EAGLE3, eagle3_taps, norm_before_residual, read_checkpoint, variant_of
from specdraft_eval.errors import SpecdecError
from specdraft_eval.files import atomic_output

TARGETS = ("vllm",)
SPECULATIVE_TOKENS = 3
"""The proposal method's draft length written where a speculators config names none (EAGLE-3's training depth)."""


@dataclass
class Export:
    """What ``zoo export`` wrote: where, for which server, the head's method and the speculative_config to serve it
    with, and anything the server will do differently from our loader."""

    path: str
    to: str
    method: str
    speculative_config: dict
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
    """Write ``head`` (an EAGLE head directory) to ``out`` as ``to`` (:data:`TARGETS`) loads it; see the module
    docstring. ``out`` must not exist; nothing is left half-written."""
    if to not in TARGETS:
        raise SpecdecError(f"--to {to!r}: exports go to {', '.join(TARGETS)}")
    if out.exists():
        raise SpecdecError(f"--out {out} exists: give a new directory")
    config, state, meta = read_checkpoint(head)
    variant, notes = variant_of(config, state), []
    if variant == EAGLE3:
        layer = dict(config.get("transformer_layer_config") or {k: v for k, v in config.items()
                                                                if k not in ("draft_vocab_size",)})
        speculators, taps = "speculators_model_type" in config, eagle3_taps(config)
        speculators_config = dict(config.get("speculators_config") or {"algorithm": EAGLE3})
        methods = speculators_config.get("proposal_methods") or [{"proposal_type": "greedy"}]
        methods[0] = {"speculative_tokens": SPECULATIVE_TOKENS, **methods[0]}
        written = {**({k: v for k, v in config.items() if k != "eagle_config"} if speculators else {}),
                   "speculators_model_type": EAGLE3, "architectures": ["Eagle3Speculator"],
                   "transformer_layer_config": layer, "draft_vocab_size": int(len(state["d2t"])) if "d2t" in state
                   else config.get("draft_vocab_size"),
                   "norm_before_residual": norm_before_residual(config),
                   "speculators_config": {**speculators_config, "proposal_methods": methods}}
        if taps:
            written["eagle_aux_hidden_state_layer_ids"] = taps
        speculative_tokens = methods[0]["speculative_tokens"]
    else:
        state = _fold_fc_bias({k: v for k, v in state.items()
                               if k not in ("embed_tokens.weight", "layers.0.input_layernorm.weight")})
        biased = any(k.startswith("layers.") and k.endswith("_proj.bias") for k in state)
        written = {k: v for k, v in config.items() if k not in ("qkv_bias",)}
        written.update(attention_bias=biased, bias=biased, architectures=["LlamaForCausalLM"])
        if meta.get("token_ids"):
            notes.append(f"vLLM drafts over the target's whole vocabulary: this head was trained to choose among "
                         f"{len(meta['token_ids'])} tokens, so vLLM's drafts differ where the whole vocabulary's "
                         "best token is outside them")
        speculative_tokens = SPECULATIVE_TOKENS
    from safetensors.torch import save_file

    with atomic_output(out, directory=True) as tmp:
        save_file({k: v.contiguous() for k, v in state.items()}, str(tmp / "model.safetensors"))
        (tmp / "config.json").write_text(json.dumps(written, indent=1, default=str))
    method = "eagle3" if variant == EAGLE3 else "eagle"
    return Export(str(out.resolve()), to, method,
                  {"method": method, "model": str(out.resolve()), "num_speculative_tokens": speculative_tokens}, notes)
