"""A causal LM's structure: where it keeps its decoder layers (layer views and feature taps both need them) and its
shape without weights (:class:`ModelShape`, what the latency model and ``zoo rank`` time)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from specdraft_eval.errors import SpecdecError


def decoder_path(model: torch.nn.Module, depth: int) -> list[str]:
    """Attribute path from ``model`` to its ModuleList of ``depth`` decoder layers."""
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == depth and name:
            return name.split(".")
    raise SpecdecError(f"cannot find the decoder layers of {type(model).__name__}: use a separate draft model instead")


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    """``model``'s decoder layers."""
    module = model
    for attr in decoder_path(model, model.config.num_hidden_layers):
        module = getattr(module, attr)
    return module


@dataclass(frozen=True)
class ModelShape:
    """What the latency model needs of a model: its decoder's shape and size."""

    layers: int
    hidden_size: int
    heads: int
    kv_heads: int
    vocab_size: int
    parameters: float  # all parameters
    embedding_parameters: float = 0.0  # input embeddings: one row is read per token, not the whole table

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.heads

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes

    def with_layers(self, layers: int) -> ModelShape:
        """The same model cut to ``layers`` decoder layers (a layer view or a depth-pruned draft)."""
        per_layer = (self.parameters - self.embedding_parameters - self.vocab_size * self.hidden_size) / self.layers
        return replace(self, layers=layers,
                       parameters=self.parameters - per_layer * (self.layers - layers))


def shape_from_config(config) -> ModelShape:
    """A :class:`ModelShape` from a transformers config (object or dict), counting parameters as Llama-style models
    have them when the config does not say (q, k, v, o projections, a gated MLP, norms, embeddings, head)."""
    def get(key, default=None):
        return config.get(key, default) if isinstance(config, dict) else getattr(config, key, default)
    try:
        layers, hidden = int(get("num_hidden_layers")), int(get("hidden_size"))
        heads = int(get("num_attention_heads"))
        kv_heads = int(get("num_key_value_heads") or heads)
        vocab = int(get("vocab_size"))
    except (TypeError, ValueError):
        raise SpecdecError("the model's config lacks num_hidden_layers, hidden_size, num_attention_heads or "
                           "vocab_size: give a decoder-only transformers config.json") from None
    inter = int(get("intermediate_size") or 4 * hidden)
    head_dim = int(get("head_dim") or hidden // heads)
    attention = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2
    mlp = 3 * hidden * inter
    embeddings = vocab * hidden
    head = 0 if get("tie_word_embeddings", False) else vocab * hidden
    params = layers * (attention + mlp + 2 * hidden) + embeddings + head + hidden
    return ModelShape(layers, hidden, heads, kv_heads, vocab, float(get("parameters") or params), float(embeddings))


@dataclass(frozen=True)
class KnownShape:
    """A model named on the command line (a target or a draft): its canonical name, its :class:`ModelShape` (None:
    model-free), where the shape came from, and whether it runs on the target's own layers (a layer view: sharded
    as the target is)."""

    name: str
    shape: ModelShape | None
    source: str
    shares_target: bool = False
