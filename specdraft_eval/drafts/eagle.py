"""``eagle:DIR``: a feature-level draft head (EAGLE, EAGLE-2, EAGLE-3) that reads the target's own hidden states.

One decoder layer as wide as the target drafts from the target's features of the tokens so far and the next
token's embedding, then from its own predicted features for the rest of the γ tokens; the engine hands it the
target's hidden states of every position the target keeps (:meth:`EagleDrafter.observe`), so no second target
pass is needed. Layouts read (all ``config.json`` + ``model.safetensors`` or ``pytorch_model.bin``):

- **EAGLE / EAGLE-2** (the EAGLE repository; also what ``zoo train-head`` writes, with ``eagle.json`` beside it):
  ``fc`` over [embedding ‖ feature] (2H -> H), ``layers.0`` a Llama decoder layer whose input norm is skipped,
  no final norm, the target's own output head (ours: the rows of its reduced vocabulary, ``token_ids``). The
  feature is the target's last hidden state after its final norm.
- **EAGLE-3** (vLLM ``speculators``: ``speculators_model_type: eagle3``, or the EAGLE repository's ``midlayer``
  keys): ``fc`` over three of the target's layer inputs (3H -> H; layers 2, L/2, L-3 unless
  ``eagle_aux_hidden_state_layer_ids`` says otherwise), a decoder layer over [norm(embedding) ‖ norm(hidden)] (2H
  attention input), a final ``norm`` and its own ``lm_head`` over a draft vocabulary mapped to the target's by
  ``d2t`` (target id = draft id + d2t[draft id]).
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field
from pathlib import Path

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

from specdraft_eval.drafts.checkpoint import load_into, read_json, read_weights, weight_names
from specdraft_eval.drafts.model import choose
from specdraft_eval.drafts.spec import split_shape
from specdraft_eval.engine import kv_cache
from specdraft_eval.engine.drafter import FINAL, DrafterBase, Proposal
from specdraft_eval.engine.sampling import Sampler
from specdraft_eval.errors import SpecdecError
from specdraft_eval.models import kernels
from specdraft_eval.models.targets import Target

EAGLE, EAGLE3 = "eagle", "eagle3"
LAYER_FAMILIES = ("llama", "qwen2", "qwen3")
"""Decoder layers a head may have: Llama's, Qwen2's (Llama's with q/k/v biases, read from the checkpoint) and Qwen3's
(q/k norms)."""
HEAD_FILE = "eagle.json"
"""Beside the weights of a head ``zoo train-head`` built: its format, target, taps and reduced vocabulary."""
HEAD_FORMAT = "specdraft-eagle/1"
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
WHAT = "EAGLE head"


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
        ``mask``: a 4D additive mask over the cache and the new positions (a tree's), instead of the causal one."""
        if self.variant == EAGLE:
            x = self.fc(torch.cat([embeds, features], dim=-1))  # [B, T, H]
        else:
            if not own:
                features = self.fc(self.input_norm(features) if self.input_norm is not None else features)
            x = torch.cat([embeds, features], dim=-1)  # [B, T, 2H]
        if mask is None:
            mask = create_causal_mask(config=self.config, inputs_embeds=x, attention_mask=None, cache=cache,
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


@dataclass(frozen=True)
class TreeShape:
    """EAGLE-2's dynamic tree: each step expands the ``topk`` best-scoring frontier nodes by their ``topk`` best
    children (score: the sum of the head's log-probabilities along the path), ``depth`` nodes deep at most; the
    step's node budget (γ) keeps the best-scoring nodes. EAGLE's ``top_k``; its ``depth`` is ours minus one."""

    topk: int
    depth: int

    DEFAULT_DEPTH = 6

    @classmethod
    def parse(cls, text: str, arg: str) -> TreeShape:
        """``K`` or ``KxD`` (``D`` default :data:`DEFAULT_DEPTH`)."""
        topk, _, depth = text.partition("x")
        if not topk.isdigit() or int(topk) < 1 or (depth and (not depth.isdigit() or int(depth) < 1)):
            raise SpecdecError(f"bad eagle tree in {arg!r}: use eagle:DIR@K or eagle:DIR@KxD (top-k K >= 1 per "
                               "step, D >= 1 deep), e.g. eagle:DIR@4x6")
        return cls(int(topk), int(depth) if depth else cls.DEFAULT_DEPTH)


class EagleDrafter(DrafterBase):
    """Drafts with an :class:`EagleHead`, a chain or (``tree``) EAGLE-2's dynamic tree. State per row: the target's
    features not yet fed to the head and the head's KV cache over (feature t, token t+1) pairs, kept for the
    target's features and rolled back for its own."""

    def __init__(self, head: EagleHead, target, name: str, token_ids: list[int] | None,
                 tree: TreeShape | None = None) -> None:
        self.model, self.name, self.taps, self.tree = head, name, head.taps, tree
        self.drafts_trees = tree is not None
        self.vocab_size = target.config.vocab_size
        self._embed = head.embed_tokens if head.embed_tokens is not None else target.get_input_embeddings()
        self._ids = torch.tensor(token_ids, dtype=torch.long, device=target.device) if token_ids else None
        if head.lm_head is None:
            head.use_target_head(target, token_ids)
        kernels.apply(head, kernels.kernels_of(target))  # the head runs the target's kernels
        self.reset()

    def reset(self, capacity: int | None = None) -> None:
        room = (self.tree.depth - 1) * self.tree.topk if self.tree else 0  # a tree's frontiers, fed then dropped
        self._cache = kv_cache.new_cache(self.model.config, None if capacity is None else capacity + room)
        self._pending: list[torch.Tensor] = []  # the target's features not yet fed to the head
        self._seen = 0  # positions whose target features have arrived
        self._fed = 0  # (feature, next token) pairs in the head's cache computed from the target's features

    def fork(self) -> EagleDrafter:
        twin = copy.copy(self)
        twin.reset()
        return twin

    def observe(self, features: torch.Tensor) -> None:
        if len(features):
            self._pending.append(features)
            self._seen += len(features)

    def _feed(self, tokens: list[int], upto: int) -> int:
        """Feed the head the (feature, next token) pairs of positions ``_fed``..``upto`` - 1 (after rolling its cache
        back to them); the last one fed leaves ``_last``, its prediction of the next position's features."""
        kv_cache.rollback(self._cache, self._fed)
        count = upto - self._fed
        if count <= 0:
            return 0
        device = self._embed.weight.device
        pending = torch.cat(self._pending)  # [seen - fed, F]
        features = pending[:count][None].to(self._embed.weight.dtype)  # [1, count, F]
        ids = torch.tensor([tokens[self._fed + 1: upto + 1]], device=device)  # the token after each position
        positions = torch.arange(self._fed, upto, device=device)[None]
        self._last = self.model(self._embed(ids), features, self._cache, positions)[:, -1:]  # [1, 1, H]
        self._pending, self._fed = [pending[count:]] if count < len(pending) else [], upto
        return count

    def catch_up(self, tokens: list[int]) -> int:
        return self._feed(tokens, self._seen - 1)

    def propose(self, tokens: list[int], num_tokens: int, sampler: Sampler) -> Proposal:
        if self._seen != len(tokens) - 1:
            raise SpecdecError(f"draft {self.name}: has the target's features of {self._seen} positions for "
                               f"{len(tokens)} tokens; an EAGLE head needs an engine that calls observe(): a bug")
        if self._seen == 0 or num_tokens < 1:
            return Proposal([])
        head, device = self.model, self._embed.weight.device
        self._feed(tokens, self._seen)
        if self.tree is not None:
            return self._grow(num_tokens)
        hidden = self._last
        drafted: list[int] = []
        rows: list[torch.Tensor] = []
        for i in range(num_tokens):
            token, probs = choose(head.logits(hidden[0, -1]).float(), sampler, self._ids, self.vocab_size)
            drafted.append(token)
            if probs is not None:
                rows.append(probs)
            if i + 1 < num_tokens:
                position = torch.tensor([[self._seen + i]], device=device)
                hidden = head(self._embed(torch.tensor([[token]], device=device)), hidden, self._cache, position,
                              own=True)
        return Proposal(drafted, torch.stack(rows) if rows else None)

    def _grow(self, budget: int) -> Proposal:
        """EAGLE-2's dynamic tree (``topK_genrate``): the top-k children of the root, then per depth one head pass
        over the frontier (each node attending to the committed prefix and its own ancestors), every child scored
        by its path's summed log-probability and the best k kept as the next frontier; the ``budget`` best nodes
        of all scored ones form the tree. Deterministic (no draws): lossless under sampling too."""
        head, device, k = self.model, self._embed.weight.device, self.tree.topk
        tokens: list[int] = []
        parents: list[int] = []
        scores: list[float] = []

        def expand(hidden: torch.Tensor, frontier: list[int]) -> list[int]:
            """Score the top-k children of each frontier node (-1: the root) from ``hidden`` [n, H]; return the
            new nodes."""
            logp = torch.log_softmax(head.logits(hidden).float(), dim=-1)  # [n, head vocabulary]
            top = logp.topk(min(k, logp.shape[-1]), dim=-1)
            ids = self._ids[top.indices] if self._ids is not None else top.indices  # [n, k] target ids
            new = []
            for row, parent in enumerate(frontier):
                base = scores[parent] if parent >= 0 else 0.0
                for token, value in zip(ids[row].tolist(), top.values[row].tolist(), strict=True):
                    new.append(len(tokens))
                    tokens.append(token)
                    parents.append(parent)
                    scores.append(base + value)
            return new

        frontier = [-1]
        hidden = self._last[0]  # [1, H]
        fed: list[int] = []  # tree nodes in the head's cache past the committed prefix, in order
        fed_hidden = self._last[0, :0]  # [len(fed), H]: their outputs (the inputs of their children)
        for depth in range(self.tree.depth):
            children = expand(hidden, frontier)
            if depth + 1 == self.tree.depth:
                break
            cut = sorted(scores, reverse=True)[budget - 1] if len(scores) >= budget else float("-inf")
            frontier = sorted(children, key=lambda n: -scores[n])[:k]
            if scores[frontier[0]] < cut:  # no descendant can make the budget's cut
                break
            inputs = (self._last[0].expand(len(frontier), -1) if depth == 0  # each node's parent's output
                      else fed_hidden[[fed.index(parents[n]) for n in frontier]])
            hidden = head(self._embed(torch.tensor([[tokens[n] for n in frontier]], device=device)), inputs[None],
                          self._cache, torch.full((1, len(frontier)), self._seen + depth, device=device), own=True,
                          mask=self._tree_mask(fed, frontier, parents))[0]  # [k, H]
            fed_hidden = torch.cat([fed_hidden, hidden])
            fed += frontier
        keep = sorted(sorted(range(len(tokens)), key=lambda n: (-scores[n], n))[:budget])  # parents before children
        where = {node: i for i, node in enumerate(keep)}
        return Proposal([tokens[n] for n in keep], parents=[where[parents[n]] if parents[n] >= 0 else -1 for n in keep])

    def _tree_mask(self, fed: list[int], frontier: list[int], parents: list[int]) -> torch.Tensor:
        """``[1, 1, len(frontier), keys]`` additive: each frontier node sees the committed prefix, its ancestors
        among the ``fed`` nodes and itself."""
        committed = self._fed
        keys = self._cache.get_mask_sizes(len(frontier), 0)[0]  # a static cache: its whole allocation
        allowed = torch.zeros(len(frontier), keys, dtype=torch.bool)
        allowed[:, :committed] = True
        slot = {node: i for i, node in enumerate(fed + frontier)}
        for row, node in enumerate(frontier):
            while node >= 0:
                allowed[row, committed + slot[node]] = True
                node = parents[node]
        return kv_cache.additive(allowed[None].to(self._embed.weight.device), self.model.dtype)


def _directory(arg: str) -> Path:
    """A local head directory, or a hub id's snapshot (downloaded, or from the HF cache when offline)."""
    path = Path(os.path.expanduser(arg))
    if path.is_dir():
        return path
    from specdraft_eval import published

    if not path.is_absolute() and (published.base() / path).is_dir():  # a shipped head named as in the results
        return published.base() / path
    if arg.count("/") != 1 or arg.startswith((".", "/", "~")):
        raise SpecdecError(f"EAGLE head {arg!r} not found: give a directory (e.g. one `zoo train-head` wrote) or a "
                           "hub id org/name")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        return Path(snapshot_download(arg, allow_patterns=["*.json", *WEIGHT_FILES]))
    except LocalEntryNotFoundError:
        raise SpecdecError(f"EAGLE head {arg} is not in the Hugging Face cache and the hub is offline: run "
                           f"`zoo pull {arg}` where the hub is reachable, or unset HF_HUB_OFFLINE") from None
    except (HfHubHTTPError, OSError) as exc:
        raise SpecdecError(f"cannot download EAGLE head {arg}: {str(exc).splitlines()[0]}; check the id") from None


def variant_of(config: dict, keys=()) -> str:
    """:data:`EAGLE3` for a speculators eagle3 config or the EAGLE repository's EAGLE-3 (a draft vocabulary, or
    ``midlayer`` keys), else :data:`EAGLE`; other speculators types are errors."""
    kind = config.get("speculators_model_type")
    if kind is not None and kind != EAGLE3:
        raise SpecdecError(f"speculators_model_type {kind!r} is not supported (only eagle3): use an EAGLE-3 head or "
                           "a head in the EAGLE repository's layout")
    if kind == EAGLE3 or "draft_vocab_size" in config or any(k.startswith("midlayer.") for k in keys):
        return EAGLE3
    return EAGLE


def split(arg: str) -> tuple[str, TreeShape | None]:
    """``DIR``, ``DIR@K`` or ``DIR@KxD`` -> the head (a directory or hub id) and its tree shape (None: a chain)."""
    where, shape = split_shape(arg)
    return where, None if shape is None else TreeShape.parse(shape, arg)


def describe(arg: str) -> tuple[str, int | None]:
    """The head ``eagle:ARG``'s variant (vLLM's ``method``: ``eagle`` or ``eagle3``) and output vocabulary size
    (None: the target's), from its config files alone."""
    directory = _directory(split(arg)[0])
    config = read_json(directory / "config.json", WHAT)
    variant = variant_of(config)
    if variant == EAGLE3:
        return variant, config.get("draft_vocab_size")
    meta = read_json(directory / HEAD_FILE, WHAT) if (directory / HEAD_FILE).is_file() else {}
    return variant, len(meta["token_ids"]) if meta.get("token_ids") else None


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
        return found + (["q/k norms (Qwen3 layers), which its Llama layers lack"] if _qk_norm(keys) else [])
    found = ["an fc bias its eagle reader drops"] if "fc.bias" in keys else []
    if meta.get("token_ids"):
        found.append(f"a {len(meta['token_ids'])}-token vocabulary it ignores")
    return found


def _qk_norm(keys) -> bool:
    return any(".q_norm." in k or ".k_norm." in k for k in keys)


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
                         and not (k.startswith("midlayer.") and not k.endswith("_proj.bias") and not _qk_norm({k})))
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


def read_layout(directory: Path, config: dict, weights: dict[str, torch.Tensor], meta: dict, target) -> HeadLayout:
    """The head's layout from its config, its (renamed, :func:`_rename`) weights' key names and our ``eagle.json``
    (``meta``): the variant, taps
    (under the config's ``eagle_aux_hidden_state_layer_ids``, its layer config's or ``eagle_config``'s; ascending,
    as the target produces them), layers, norms, vocabulary and embedding. Missing fields take vLLM's defaults
    (a speculators config without ``norm_before_residual``: True; the EAGLE repository's EAGLE-3: False)."""
    depth = target.config.num_hidden_layers
    try:
        variant = variant_of(config, weights)
    except SpecdecError as exc:
        raise SpecdecError(f"EAGLE head {directory}: {exc}") from None
    layer_config = config.get("transformer_layer_config", config) if variant == EAGLE3 else config
    kind = layer_config.get("model_type") or "llama"
    qk_norm = _qk_norm(weights)
    if kind not in LAYER_FAMILIES or qk_norm != (kind == "qwen3"):
        raise SpecdecError(f"EAGLE head {directory} has {kind} decoder layers{' with' if qk_norm else ' without'} q/k "
                           f"norms: heads of {', '.join(LAYER_FAMILIES)} layers (q/k norms for qwen3 only) load; use "
                           "one of those")
    layers = _layer_count(directory, layer_config, weights)
    hidden = layer_config.get("hidden_size", target.config.hidden_size)
    embed = weights.get("embed_tokens.weight")
    own_embedding = embed is not None and tuple(embed.shape) == (target.config.vocab_size, hidden)
    if embed is not None and not own_embedding:
        raise SpecdecError(f"EAGLE head {directory} has an embed_tokens of {list(embed.shape)}, not the target's "
                           f"vocabulary by the head's width ({target.config.vocab_size} x {hidden}): use a head "
                           "trained for this target")
    if embed is None and hidden != target.config.hidden_size:
        raise SpecdecError(f"EAGLE head {directory} is {hidden} wide, the target {target.config.hidden_size}, and it "
                           "has no embed_tokens of its own: use a head trained for this target")
    if variant == EAGLE3:
        listed = eagle3_taps(config)
        taps = tuple(listed) if listed else default_taps(depth)
        if any(not 0 <= t < depth for t in taps):
            raise SpecdecError(f"EAGLE head {directory} reads layers {list(taps)}, but the target has {depth} layers: "
                               "use a head trained for this target")
        d2t = weights.get("d2t")
        token_ids = (torch.arange(len(d2t)) + d2t).tolist() if d2t is not None else None
        return HeadLayout(EAGLE3, taps, _llama_config(layer_config, layers), token_ids, norm_before_residual(config),
                          norm_before_fc=bool(config.get("norm_before_fc", False)), own_embedding=own_embedding,
                          qk_norm=qk_norm)
    if meta and meta.get("format") != HEAD_FORMAT:
        raise SpecdecError(f"{directory / HEAD_FILE} has format {meta.get('format')!r}, not {HEAD_FORMAT}: "
                           "rebuild the head with zoo train-head")
    return HeadLayout(EAGLE, (FINAL,), _llama_config(config, layers), meta.get("token_ids"), meta=meta,
                      own_embedding=own_embedding, qk_norm=qk_norm)


def default_taps(depth: int) -> tuple[int, ...]:
    """EAGLE-3's default target layers for a target ``depth`` layers deep: the inputs of layers 2, L/2 and L-3
    (upstream's), ascending and distinct (a shallow target has fewer)."""
    return tuple(sorted({min(2, depth - 1), depth // 2, max(depth - 3, 0)}))


def eagle3_taps(config: dict) -> list[int] | None:
    """The target layers an EAGLE-3 config names (under the config, its ``transformer_layer_config`` or its
    ``eagle_config``, as vLLM reads them), ascending as the target produces them; None where it names none."""
    layer_config = config.get("transformer_layer_config") or {}
    listed = (config.get("eagle_aux_hidden_state_layer_ids") or layer_config.get("eagle_aux_hidden_state_layer_ids")
              or (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids"))
    return sorted(listed) if listed else None


def norm_before_residual(config: dict) -> bool:
    """EAGLE-3's first layer takes its residual after ``hidden_norm``: the config's say, else vLLM's defaults (true
    for a speculators config, false for the EAGLE repository's)."""
    return bool(config.get("norm_before_residual", "speculators_model_type" in config))


def _layer_count(directory: Path, config: dict, weights: dict[str, torch.Tensor]) -> int:
    """How many decoder layers the weights hold (``layers.0`` .. ``layers.N-1``), checked against the config's
    ``num_hidden_layers`` where it has one."""
    found = {int(k.split(".")[1]) for k in weights if k.startswith("layers.") and k.split(".")[1].isdigit()}
    count = max(found, default=0) + 1
    if found != set(range(count)):
        raise SpecdecError(f"EAGLE head {directory} holds decoder layers {sorted(found)}: not 0..N-1; download it again")
    stated = config.get("num_hidden_layers")
    if stated is not None and stated != count:
        raise SpecdecError(f"EAGLE head {directory}: its config says {stated} decoder layers, its weights hold {count}; "
                           "fix the config's num_hidden_layers or download the head again")
    return count


def _llama_config(values: dict, layers: int) -> LlamaConfig:
    known = {k: v for k, v in values.items() if not k.startswith(("architectures", "auto_map", "speculators"))}
    config = LlamaConfig(**{**known, "num_hidden_layers": layers})
    config._attn_implementation = "sdpa"
    return config


def _rename(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Published key names -> :class:`EagleHead`'s (the EAGLE repository's EAGLE-3 ``midlayer`` is layer 0)."""
    out = {}
    for key, value in weights.items():
        key = key.removeprefix("model.")
        out["layers.0." + key.removeprefix("midlayer.") if key.startswith("midlayer.") else key] = value
    return out


IGNORED = {
    "t2d": "the target-to-draft map: d2t's inverse",
    "verifier_norm.weight": "a training copy of the target's final norm",
    "verifier_lm_head.weight": "a training copy of the target's output head",
}
"""Keys a head may carry that drafting never reads (upstream loaders skip them too), and why."""


def _unread(head: EagleHead, layout: HeadLayout, state: dict[str, torch.Tensor]) -> list[str]:
    """The checkpoint's keys the head does not read: none may remain but :data:`IGNORED` and EAGLE's skipped first
    input norm (``d2t`` is read into the layout's vocabulary)."""
    expected = set(head.state_dict())
    skipped = set(IGNORED) | {"d2t"}
    if layout.variant == EAGLE:
        skipped.add("layers.0.input_layernorm.weight")  # EAGLE-1 skips it (cnets1.py, vLLM's llama_eagle)
    return sorted(k for k in state if k not in expected and k not in skipped)


def _match_biases(head: EagleHead, state: dict[str, torch.Tensor]) -> None:
    """Give each linear layer of the head the bias the checkpoint has for it (qkv_bias, attention_bias and mlp
    bias variants alike), so that every bias is read and none invented."""
    modules = dict(head.named_modules())
    for key in state:
        module = modules.get(key.removesuffix(".bias")) if key.endswith(".bias") else None
        if isinstance(module, nn.Linear) and module.bias is None:
            module.bias = nn.Parameter(torch.zeros(module.out_features))


def read_checkpoint(directory: Path) -> tuple[dict, dict[str, torch.Tensor], dict]:
    """A head directory's config, its weights under our key names and our ``eagle.json`` (empty where absent)."""
    if not (directory / "config.json").is_file():
        raise SpecdecError(f"EAGLE head {directory} has no config.json: point at a head directory")
    meta = read_json(directory / HEAD_FILE, WHAT) if (directory / HEAD_FILE).is_file() else {}
    return read_json(directory / "config.json", WHAT), _rename(read_weights(directory, WEIGHT_FILES, WHAT)), meta


def load_head(directory: Path, target, tokenizer=None) -> tuple[EagleHead, HeadLayout]:
    """Read a head in any supported layout and check it against ``target`` (and the tokenizer our own heads were
    trained with), strictly: every key of the checkpoint is read, or skipped for a reason upstream loaders share
    (:data:`IGNORED`), or the head is refused in one line naming it; missing keys likewise. The embedding is the
    head's own where it has one, as vLLM reads it, else the target's."""
    config, state, meta = read_checkpoint(directory)
    layout = read_layout(directory, config, state, meta, target)
    meta_vocab = layout.meta.get("vocab")
    if meta_vocab:
        from specdraft_eval.drafts.ngram import vocab_fingerprint

        if tokenizer is not None and vocab_fingerprint(tokenizer) != meta_vocab:
            raise SpecdecError(f"EAGLE head {directory} was trained for another tokenizer: train one for this "
                               "target with zoo train-head")
    if "fc.weight" not in state:
        raise SpecdecError(f"EAGLE head {directory} lacks fc.weight: not an EAGLE or EAGLE-3 head")
    target_hidden = target.config.hidden_size
    hidden = layout.config.hidden_size
    if layout.variant == EAGLE and hidden != target_hidden:
        raise SpecdecError(f"EAGLE head {directory} is {hidden} wide, the target {target_hidden}: use a head trained "
                           "for this target")
    head = EagleHead(layout, target_hidden, fc_bias="fc.bias" in state)
    _match_biases(head, state)
    expected = {k for k in head.state_dict() if not k.startswith("rotary_emb.")}
    if layout.variant == EAGLE:
        expected.discard("layers.0.input_layernorm.weight")
    missing = sorted(expected - set(state))
    if missing:
        raise SpecdecError(f"EAGLE head {directory} lacks {', '.join(missing[:3])}"
                           f"{' and more' if len(missing) > 3 else ''}: not a {layout.variant} head of a supported "
                           "layout (EAGLE repository, speculators eagle3)")
    unread = _unread(head, layout, state)
    if unread:
        raise SpecdecError(f"EAGLE head {directory} has weights this loader does not model: {', '.join(unread[:3])}"
                           f"{f' and {len(unread) - 3} more' if len(unread) > 3 else ''}; drafting without them "
                           "would draft wrong tokens: use a head of a supported layout")
    load_into(head, {k: v for k, v in state.items() if k in expected}, directory, WHAT, strict=False)
    if layout.token_ids is not None and (min(layout.token_ids) < 0 or max(layout.token_ids) >= target.config.vocab_size):
        raise SpecdecError(f"EAGLE head {directory}: its vocabulary maps outside the target's "
                           f"{target.config.vocab_size} tokens; use a head trained for this target")
    return head.to(target.device, target.dtype).eval().requires_grad_(False), layout


def build(arg: str | None, target: Target) -> EagleDrafter:
    """Entry point for ``eagle:DIR`` (a directory or a hub id; drafts a chain) and ``eagle:DIR@K`` /
    ``eagle:DIR@KxD`` (EAGLE-2's dynamic tree: top-k K per step, D deep; γ is its node budget)."""
    if not arg:
        raise SpecdecError("eagle needs a head: e.g. draft=eagle:DIR (built by `zoo train-head TARGET --out DIR`)")
    where, tree = split(arg)
    head, layout = load_head(_directory(where), target.model, target.tokenizer)
    return EagleDrafter(head, target.model, f"eagle:{arg}", layout.token_ids, tree)


build.path_marker = HEAD_FILE
