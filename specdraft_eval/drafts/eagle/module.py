"""An EAGLE head as a module: EAGLE-1's (fc over [embedding ‖ feature], one decoder layer) and EAGLE-3's (fc
over three taps, a decoder layer over [norm(embedding) ‖ norm(hidden)], its own norm and output head), and new heads."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn
from transformers import LlamaConfig
from transformers.masking_utils import create_causal_mask
from transformers.models.llama.modeling_llama import (
    LlamaAttention,
    LlamaDecoderLayer,
    LlamaMLP,
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
)
from transformers.models.qwen3.modeling_qwen3 import Qwen3Attention

from specdraft_eval.engine.drafter import FINAL
from specdraft_eval.models import kernels

EAGLE, EAGLE3 = "eagle", "eagle3"
LAYER_FAMILIES = ("llama", "qwen2", "qwen3")
"""Decoder layers a head may have: Llama's, Qwen2's (Llama's with q/k/v biases, read from the checkpoint) and Qwen3's
(q/k norms)."""


@dataclass
class HeadLayout:
    """What a head reads and how it is built: ``variant`` (:data:`EAGLE` or :data:`EAGLE3`), the target's hidden
    states it reads (``taps``, ascending), its decoder layers' config (``num_hidden_layers`` of them), its output
    vocabulary as target ids (``token_ids``: None for the target's whole vocabulary), where EAGLE-3's first layer
    takes its residual (``norm_before_residual``), an RMS norm over the taps before ``fc`` (``norm_before_fc``),
    whether it brings its own token embedding (``own_embedding``; else it reads the target's) and whether its
    attention normalises queries and keys per head before RoPE (``qk_norm``: Qwen3's layers)."""

    variant: str
    taps: tuple[int, ...]
    config: LlamaConfig
    token_ids: list[int] | None = None
    norm_before_residual: bool = False
    meta: dict = field(default_factory=dict)
    norm_before_fc: bool = False
    own_embedding: bool = False
    qk_norm: bool = False


class Eagle3Layer(nn.Module):
    """EAGLE-3's decoder layer (``speculators``' ``Eagle3DecoderLayer``): attention over [norm(embedding) ‖
    norm(hidden)] (2H wide), the hidden part as the residual."""

    def __init__(self, config: LlamaConfig, norm_before_residual: bool) -> None:
        super().__init__()
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.hidden_size, self.norm_before_residual = hidden, norm_before_residual
        self.input_layernorm, self.hidden_norm = LlamaRMSNorm(hidden, eps), LlamaRMSNorm(hidden, eps)
        self.post_attention_layernorm = LlamaRMSNorm(hidden, eps)
        self.self_attn = LlamaAttention(config, layer_idx=0)
        for name in ("q_proj", "k_proj", "v_proj"):
            proj = getattr(self.self_attn, name)
            setattr(self.self_attn, name, nn.Linear(2 * hidden, proj.out_features, bias=proj.bias is not None))
        self.mlp = LlamaMLP(config)

    def forward(self, x: torch.Tensor, **attention) -> torch.Tensor:
        embeds, hidden = x[..., : self.hidden_size], x[..., self.hidden_size:]  # [B, T, H] each
        if self.norm_before_residual:
            hidden = residual = self.hidden_norm(hidden)
        else:
            residual, hidden = hidden, self.hidden_norm(hidden)
        out, _ = self.self_attn(hidden_states=torch.cat([self.input_layernorm(embeds), hidden], dim=-1), **attention)
        h = residual + out
        return h + self.mlp(self.post_attention_layernorm(h))


class EagleHead(nn.Module):
    """The head's weights under the published key names (``fc``, ``layers.0``, ``norm``, ``lm_head``, ``d2t``).

    :meth:`forward` maps (embeddings of tokens t+1, features of positions t) to the head's hidden states, which
    predict the target's features at t+1; :meth:`logits` reads them with the output head."""

    def __init__(self, layout: HeadLayout, target_hidden: int, fc_bias: bool) -> None:
        super().__init__()
        config, hidden = layout.config, layout.config.hidden_size
        self.variant, self.taps, self.config = layout.variant, layout.taps, config
        self.input_norm = (LlamaRMSNorm(len(layout.taps) * target_hidden, config.rms_norm_eps)
                           if layout.norm_before_fc else None)
        self.embed_tokens = nn.Embedding(config.vocab_size, hidden) if layout.own_embedding else None
        if layout.variant == EAGLE:
            self.fc = nn.Linear(2 * hidden, hidden, bias=fc_bias)
            first = LlamaDecoderLayer(config, layer_idx=0)
            first.input_layernorm = nn.Identity()  # EAGLE skips its first layer's input norm
            self.norm: nn.Module = nn.Identity()
            self.lm_head: nn.Linear | None = None  # the target's (rows of token_ids), set by the drafter
        else:
            self.fc = nn.Linear(len(layout.taps) * target_hidden, hidden, bias=fc_bias)
            first = Eagle3Layer(config, layout.norm_before_residual)
            self.norm = LlamaRMSNorm(hidden, config.rms_norm_eps)
            self.lm_head = nn.Linear(hidden, len(layout.token_ids or []) or config.vocab_size, bias=False)
        rest = [LlamaDecoderLayer(config, layer_idx=i) for i in range(1, config.num_hidden_layers)]
        self.layers = nn.ModuleList([first, *rest])  # later layers: plain decoder layers, as speculators and vLLM
        if layout.qk_norm:  # Qwen3's attention: the same projections, q and k RMS-normed per head before RoPE
            for i, layer in enumerate(self.layers):
                qwen = Qwen3Attention(config, i)
                for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
                    setattr(qwen, name, getattr(layer.self_attn, name))
                layer.self_attn = qwen
        self.rotary_emb = LlamaRotaryEmbedding(config)

    @property
    def device(self) -> torch.device:
        return self.layers[0].post_attention_layernorm.weight.device  # a norm: never pre-packed

    @property
    def dtype(self) -> torch.dtype:
        return self.layers[0].post_attention_layernorm.weight.dtype

    def forward(self, embeds: torch.Tensor, features: torch.Tensor, cache, position_ids: torch.Tensor,
                own: bool = False, mask: torch.Tensor | None = None) -> torch.Tensor:
        """``embeds`` [B, T, H] of tokens t+1, ``features`` [B, T, F] of positions t (the target's, or with ``own``
        the head's previous hidden states) -> the head's hidden states [B, T, H] (before its final norm).
        ``mask``: a 4D additive mask over the cache and the new positions (a tree's) instead of the causal one, or a
        2D ``[B, columns]`` one (0 at holes) under the causal one."""
        if self.variant == EAGLE:
            x = self.fc(torch.cat([embeds, features], dim=-1))  # [B, T, H]
        else:
            if not own:
                features = self.fc(self.input_norm(features) if self.input_norm is not None else features)
            x = torch.cat([embeds, features], dim=-1)  # [B, T, 2H]
        if mask is None or mask.dim() == 2:
            mask = create_causal_mask(config=self.config, inputs_embeds=x, attention_mask=mask, cache=cache,
                                      position_ids=position_ids)
        rotary = self.rotary_emb(x, position_ids)
        for layer in self.layers:
            x = layer(x, attention_mask=mask, position_ids=position_ids, cache=cache, use_cache=cache is not None,
                      position_embeddings=rotary)
        return x

    def use_target_head(self, target, token_ids: list[int] | None) -> None:
        """Read with ``target``'s own output head, as EAGLE does: its rows of ``token_ids`` (all rows when None),
        shared with the target and frozen."""
        weight = kernels.output_weight(target)
        rows = weight[torch.as_tensor(token_ids, device=weight.device)] if token_ids else weight  # [vocab, H]
        self.lm_head = nn.Linear(rows.shape[1], rows.shape[0], bias=False).to(rows.device, rows.dtype)
        self.lm_head.weight = nn.Parameter(rows, requires_grad=False)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., H] -> [..., head vocabulary]."""
        return self.lm_head(self.norm(hidden))


def head_config(target) -> LlamaConfig:
    """One Llama decoder layer of the target's own shape."""
    values = {k: v for k, v in target.config.to_dict().items() if k not in ("architectures", "layer_types")}
    config = LlamaConfig(**{**values, "num_hidden_layers": 1, "tie_word_embeddings": False})
    config._attn_implementation = "sdpa"
    return config


def new_head(target, token_ids: list[int] | None = None, seed: int = 0) -> EagleHead:
    """A freshly initialised EAGLE head for ``target`` (reading its final hidden state; ``token_ids``: its output
    vocabulary, default the target's whole one), with the target's output head rows attached."""
    torch.manual_seed(seed)
    head = EagleHead(HeadLayout(EAGLE, (FINAL,), head_config(target), token_ids), target.config.hidden_size, True)
    head.use_target_head(target, token_ids)
    return head.to(target.device, target.dtype)


def new_eagle3_head(target, token_ids: list[int] | None = None, seed: int = 0) -> EagleHead:
    """A freshly initialised EAGLE-3 head for ``target``: ``fc`` over the inputs of its layers 2, L/2 and L-3
    (upstream's default), one decoder layer of its shape (the residual taken before ``hidden_norm``, as EAGLE's own
    trainer and SGLang build it, and vLLM when the config says ``norm_before_residual: false``), a final norm and
    its own output head over ``token_ids`` (default: the target's whole vocabulary), started from the target's
    rows."""
    torch.manual_seed(seed)
    layout = HeadLayout(EAGLE3, default_taps(target.config.num_hidden_layers), head_config(target), token_ids,
                        norm_before_residual=False)
    head = EagleHead(layout, target.config.hidden_size, fc_bias=False)
    weight = kernels.output_weight(target)
    rows = weight[torch.as_tensor(token_ids, device=weight.device)] if token_ids else weight  # [vocab, H]
    with torch.no_grad():
        head.lm_head.weight.copy_(rows)
    return head.to(target.device, target.dtype)


def default_taps(depth: int) -> tuple[int, ...]:
    """EAGLE-3's default target layers for a target ``depth`` layers deep: the inputs of layers 2, L/2 and L-3
    (upstream's), ascending and distinct (a shallow target has fewer)."""
    return tuple(sorted({min(2, depth - 1), depth // 2, max(depth - 3, 0)}))
