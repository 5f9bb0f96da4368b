"""``medusa:DIR``: Medusa heads (FasterDecoding/Medusa), drafting a static token tree from the target's own last
hidden state.

Layouts read: FasterDecoding/Medusa's (``medusa/model/medusa_model.py``): ``config.json`` with ``medusa_num_heads``
K and ``medusa_num_layers`` L, and ``medusa_lm_head.pt`` (or ``.safetensors``) holding, per head i,
``i.j.linear.{weight, bias}`` for its ResBlocks (x + SiLU(W·x + b), H -> H; upstream builds them as one block
repeated L times, so one set of weights serves every j) and ``i.L.weight`` its output layer (H -> vocabulary, no
bias); vLLM's (``model_executor/models/medusa.py``, what ``zoo export --to vllm`` writes): ``model_type: medusa``,
``num_heads``, ``num_hidden_layers``, ``medusa_fc_bias``, weights ``blocks.i.layers.j`` and ``lm_heads.i`` (its
blocks must be equal across j: we apply one block L times), with vLLM's two options: a reduced vocabulary
(``truncated_vocab_size`` T below ``vocab_size``, and a ``token_map`` weight of T token ids; the ``lm_heads`` rows are
those tokens', or the whole vocabulary's, which vLLM then indexes by the map; every other token is never drafted) and
``original_lm_head`` (one output layer, ``lm_heads.0`` or ``lm_head``, shared by every head). Head i reads the
target's last hidden state (after the final norm) at position t and predicts the token at t + 2 + i (the target's
own head predicts t + 1).

The tree: path (r_0, ..., r_d) is the r_d-th likeliest token of head d below the path (r_0, ..., r_{d-1}) (heads do
not read the drafted tokens). Its paths: the config's ``medusa_choices`` (Medusa's format) where it has them, else
:func:`~specdraft_eval.engine.drafter.static_tree` at top-4 as deep as the heads; ``medusa:DIR@K``: the static tree
at top-K (``@1``: a chain). γ is the node budget: the first γ paths, parents before children. Deterministic, so it is
lossless under sampling too (residual rule).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from specdraft_eval.drafts.checkpoint import load_into, read_json, read_weights
from specdraft_eval.drafts.kind import DraftKind, split_shape
from specdraft_eval.engine.drafter import FINAL, DrafterBase, Proposal, static_tree, tree_parents
from specdraft_eval.engine.sampling import Sampler
from specdraft_eval.errors import SpecdecError
from specdraft_eval.models.targets import Target

HEAD_FILES = ("medusa_lm_head.safetensors", "medusa_lm_head.pt", "model.safetensors")
WHAT = "Medusa head"
DEFAULT_TOPK = 4


class MedusaHeads(nn.Module):
    """K heads, each a ResBlock (applied L times, one set of weights) and an output layer: [H] -> [K, T], T the
    ``vocab`` or, with a ``token_map`` (T token ids of the ``vocab``), the tokens it names."""

    def __init__(self, heads: int, layers: int, hidden: int, vocab: int, token_map: torch.Tensor | None = None) -> None:
        super().__init__()
        self.layers, self.vocab_size = layers, vocab
        rows = vocab if token_map is None else len(token_map)
        self.blocks = nn.ModuleList([nn.Linear(hidden, hidden) for _ in range(heads)])
        self.out = nn.ModuleList([nn.Linear(hidden, rows, bias=False) for _ in range(heads)])
        self.register_buffer("token_map", token_map)

    def tokens(self, indices: torch.Tensor) -> torch.Tensor:
        """Token ids of output rows ``indices``."""
        return indices if self.token_map is None else self.token_map[indices]

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        rows = []
        for block, out in zip(self.blocks, self.out):
            x = hidden
            for _ in range(self.layers):
                x = x + nn.functional.silu(block(x))
            rows.append(out(x))
        return torch.stack(rows)  # [K, vocab]


class MedusaDrafter(DrafterBase):
    """Drafts Medusa's tree (or chain) from the target's last hidden state of the newest kept position: the first γ
    of ``choices`` (best first, Medusa's format), or with none the best-first top-``topk`` static tree of γ nodes."""

    taps = (FINAL,)

    def __init__(self, heads: MedusaHeads, name: str, choices: list[tuple[int, ...]] | None, topk: int) -> None:
        self.model, self.name, self.choices, self.topk = heads, name, choices, topk
        self.drafts_trees = any(rank for path in choices for rank in path) if choices else topk > 1
        self._trees: dict[int, list[tuple[int, ...]]] = {}
        self.reset()

    def reset(self, capacity: int | None = None) -> None:
        self._last: torch.Tensor | None = None  # [H]: the target's final hidden state at the newest kept position

    def fork(self) -> MedusaDrafter:
        return MedusaDrafter(self.model, self.name, self.choices, self.topk)

    def observe(self, features: torch.Tensor) -> None:
        if len(features):
            self._last = features[-1]

    def paths(self, budget: int) -> list[tuple[int, ...]]:
        """The tree of ``budget`` nodes, parents before children."""
        if budget not in self._trees:
            depth = len(self.model.out)
            self._trees[budget] = (closed(self.choices[:budget]) if self.choices
                                   else static_tree(self.topk, depth, budget))
        return self._trees[budget]

    def propose(self, tokens: list[int], num_tokens: int, sampler: Sampler) -> Proposal:
        if self._last is None or num_tokens < 1:
            return Proposal([])
        paths = self.paths(num_tokens)
        with torch.no_grad():
            logits = self.model(self._last.to(self.model.out[0].weight.dtype))  # [K, vocab]
        ranks = [1 + max(p[-1] for p in paths if len(p) == depth) for depth in range(1, 1 + max(map(len, paths)))]
        top = [self.model.tokens(logits[d].topk(k).indices).tolist() for d, k in enumerate(ranks)]
        drafted = [top[len(path) - 1][path[-1]] for path in paths]
        if all(rank == 0 for path in paths for rank in path):
            return Proposal(drafted)  # a chain
        return Proposal(drafted, parents=tree_parents(paths))


def closed(paths: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """``paths`` (best first) without those missing a prefix among them, sorted parents first."""
    chosen = set(paths)
    kept = [p for p in paths if all(p[:i] in chosen for i in range(1, len(p)))]
    return sorted(kept, key=lambda p: (len(p), p))


def read_heads(directory: Path) -> tuple[MedusaHeads, dict]:
    """Medusa heads read strictly from either layout (every key read, or the heads refused in one line naming the
    key), and their config."""
    if not (directory / "config.json").is_file():
        raise SpecdecError(f"Medusa heads {directory} have no config.json: point at a Medusa head directory")
    config, state = read_json(directory / "config.json", WHAT), read_weights(directory, HEAD_FILES, WHAT)
    vllm = vllm_layout(config)
    try:
        heads = int(config["num_heads" if vllm else "medusa_num_heads"])
        layers = int(config.get("num_hidden_layers" if vllm else "medusa_num_layers", 1))
    except (KeyError, TypeError, ValueError):
        raise SpecdecError(f"Medusa heads {directory}: config.json lacks medusa_num_heads (num_heads in vLLM's "
                           "layout): not a Medusa head directory") from None
    token_map, vocab = None, None
    if vllm:  # vLLM's medusa.py: blocks.i.layers.j (bias with medusa_fc_bias), lm_heads.i; medusa_heads. stripped
        state = {k.removeprefix("medusa_heads."): v for k, v in state.items()}
        token_map, vocab = _token_map(directory, config, state)
        parts = ("weight", "bias") if config.get("medusa_fc_bias") else ("weight",)
        expected = {f"blocks.{i}.layers.{j}.{p}" for i in range(heads) for j in range(layers) for p in parts}
        block, out = "blocks.{i}.layers.{j}.", "lm_heads.{i}.weight"
        if config.get("original_lm_head"):  # one output layer for every head (vLLM reads lm_heads.0 as lm_head)
            out = "lm_head.weight" if "lm_head.weight" in state else "lm_heads.0.weight"
            expected.add(out)
        else:
            expected |= {f"lm_heads.{i}.weight" for i in range(heads)}
    else:  # FasterDecoding/Medusa: i.j.linear for its ResBlock slots, i.L its output layer
        expected = {f"{i}.{j}.linear.{p}" for i in range(heads) for j in range(layers) for p in ("weight", "bias")}
        expected |= {f"{i}.{layers}.weight" for i in range(heads)}
        block, out = "{i}.{j}.linear.", "{i}." + str(layers) + ".weight"
    unknown, missing = sorted(set(state) - expected), sorted(expected - set(state))
    if unknown or missing:
        what = f"has weights its layout does not name: {', '.join(unknown[:3])}" if unknown else \
            f"lacks {', '.join(missing[:3])}"
        raise SpecdecError(f"Medusa heads {directory} {what} (config: {heads} heads, {layers} layers): use heads "
                           "saved by FasterDecoding/Medusa or vLLM's Medusa layout")
    hidden, rows = state[out.format(i=0)].shape[1], state[out.format(i=0)].shape[0]
    vocab = vocab or rows
    if rows not in (vocab, len(token_map) if token_map is not None else vocab):
        raise SpecdecError(f"Medusa heads {directory}: output layers of {rows} rows for a vocabulary of {vocab}"
                           f"{f' reduced to {len(token_map)}' if token_map is not None else ''}: use heads whose "
                           "config matches their weights")
    module, weights = MedusaHeads(heads, layers, hidden, vocab, token_map), {}
    for i in range(heads):
        slots = [block.format(i=i, j=j) for j in range(layers)]
        if any(not torch.equal(state[slot + p], state[slots[0] + p]) for slot in slots for p in ("weight", "bias")
               if slot + p in state):
            raise SpecdecError(f"Medusa heads {directory}: head {i}'s {layers} ResBlocks differ; we read one block "
                               "applied L times (FasterDecoding/Medusa's): use heads trained that way")
        weights[f"blocks.{i}.weight"] = state[slots[0] + "weight"] if layers else torch.zeros(hidden, hidden)
        bias = state.get(slots[0] + "bias", torch.zeros(hidden)) if layers else torch.zeros(hidden)
        weights[f"blocks.{i}.bias"] = bias
        rows_i = state[out.format(i=i)]
        weights[f"out.{i}.weight"] = rows_i[token_map] if token_map is not None and len(rows_i) == vocab else rows_i
    if token_map is not None:
        weights["token_map"] = token_map
    load_into(module, weights, directory, WHAT)
    return module, config


def _token_map(directory: Path, config: dict, state: dict) -> tuple[torch.Tensor | None, int | None]:
    """vLLM's reduced vocabulary: the ``token_map`` (popped from ``state``) where ``truncated_vocab_size`` is below
    ``vocab_size`` (vLLM ignores a map otherwise), and the whole vocabulary's size (None: the config has none)."""
    mapped = state.pop("token_map", None)
    if "vocab_size" not in config:
        return None, None
    vocab = int(config["vocab_size"])
    truncated = int(config.get("truncated_vocab_size") or vocab)
    if truncated >= vocab:
        return None, vocab
    if mapped is None or tuple(mapped.shape) != (truncated,) or mapped.is_floating_point():
        raise SpecdecError(f"Medusa heads {directory}: truncated_vocab_size {truncated} below vocab_size {vocab} "
                           f"needs a token_map of {truncated} token ids in the weights (vLLM's reduced vocabulary): "
                           "add "
                           "it or drop truncated_vocab_size")
    if int(mapped.min()) < 0 or int(mapped.max()) >= vocab:
        raise SpecdecError(f"Medusa heads {directory}: token_map names tokens outside the vocabulary of {vocab}: use "
                           "the map the heads were trained with")
    return mapped.long(), vocab


def load_heads(directory: Path, target) -> tuple[MedusaHeads, dict]:
    """:func:`read_heads`, checked against ``target``'s width and vocabulary, on its device and dtype."""
    module, config = read_heads(directory)
    hidden, vocab = module.out[0].in_features, module.vocab_size
    if (hidden, vocab) != (target.config.hidden_size, target.config.vocab_size):
        raise SpecdecError(f"Medusa heads {directory} are {hidden} wide over {vocab} tokens; the target is "
                           f"{target.config.hidden_size} over {target.config.vocab_size}: use heads trained for it")
    param = next(target.parameters())
    return module.to(param.device, param.dtype).eval().requires_grad_(False), config  # token_map stays integer


def vllm_files(heads: MedusaHeads) -> tuple[dict[str, torch.Tensor], dict]:
    """``heads`` in vLLM's layout: its weights (``blocks.i.layers.j``, the one ResBlock written at each j, with
    ``medusa_fc_bias``; ``lm_heads.i``; a reduced vocabulary's ``token_map``) and its config's fields."""
    state = {f"lm_heads.{i}.weight": out.weight.detach().cpu().contiguous() for i, out in enumerate(heads.out)}
    for i, block in enumerate(heads.blocks):
        for j in range(heads.layers):
            state |= {f"blocks.{i}.layers.{j}.weight": block.weight.detach().cpu().clone(),  # one tensor per name
                      f"blocks.{i}.layers.{j}.bias": block.bias.detach().cpu().clone()}
    if heads.token_map is not None:
        state["token_map"] = heads.token_map.cpu().long()
    config = {"model_type": "medusa", "architectures": ["MedusaModel"], "hidden_size": heads.out[0].in_features,
              "vocab_size": heads.vocab_size, "truncated_vocab_size": heads.out[0].out_features,
              "num_heads": len(heads.out), "num_hidden_layers": heads.layers, "medusa_fc_bias": True}
    return state, config


def vllm_layout(config: dict) -> bool:
    """Whether a Medusa config is vLLM's (``MedusaConfig``, ``model_type: medusa``) rather than FasterDecoding's."""
    return config.get("model_type") == "medusa"


def is_medusa(directory: Path) -> bool:
    """Whether ``directory`` holds Medusa heads (either layout) by its config."""
    config = read_json(directory / "config.json", WHAT) if (directory / "config.json").is_file() else {}
    return "medusa_num_heads" in config or vllm_layout(config)


def save_medusa(directory: Path, heads: MedusaHeads, target_name: str, meta: dict,
                token_ids: list[int] | None = None) -> None:
    """With ``token_ids``: vLLM's layout (:func:`~specdraft_eval.drafts.medusa.vllm_files`) cut to those tokens'
    output rows, their ``token_map`` in ``model.safetensors``. Without: Medusa's layout, ``config.json``
    (``medusa_num_heads``, ``medusa_num_layers``) and ``medusa_lm_head.pt`` (per head i: ``i.j.linear`` for each of
    its L ResBlock slots, one set of weights as upstream shares them, and ``i.L.weight``). Both configs carry
    ``base_model_name_or_path`` and our training record."""
    record = {"base_model_name_or_path": target_name, "specdraft_eval": {k: v for k, v in meta.items()
                                                                          if k != "token_ids"}}
    if token_ids:
        from safetensors.torch import save_file

        if heads.token_map is not None:
            raise SpecdecError("these Medusa heads already have a reduced vocabulary: cut heads over the whole "
                               "vocabulary (--vocab-top 0)")

        token_map = torch.as_tensor(token_ids, dtype=torch.long)
        cut = MedusaHeads(len(heads.out), heads.layers, heads.out[0].in_features, heads.vocab_size, token_map)
        cut.load_state_dict({**heads.state_dict(), **{f"out.{i}.weight": out.weight.detach().cpu()[token_map]
                                                      for i, out in enumerate(heads.out)}, "token_map": token_map})
        state, config = vllm_files(cut)
        save_file(state, str(directory / "model.safetensors"))
        (directory / "config.json").write_text(json.dumps(config | record, indent=1, default=str))
        return
    state = {}
    for i, (block, out) in enumerate(zip(heads.blocks, heads.out)):
        for j in range(heads.layers):
            state[f"{i}.{j}.linear.weight"] = block.weight.detach().cpu().contiguous()
            state[f"{i}.{j}.linear.bias"] = block.bias.detach().cpu().contiguous()
        state[f"{i}.{heads.layers}.weight"] = out.weight.detach().cpu().contiguous()
    torch.save(state, directory / "medusa_lm_head.pt")
    (directory / "config.json").write_text(json.dumps(
        {"medusa_num_heads": len(heads.out), "medusa_num_layers": heads.layers} | record, indent=1, default=str))


class MedusaKind(DraftKind):
    """``medusa:DIR`` (the checkpoint's ``medusa_choices``, else a top-4 static tree) and ``medusa:DIR@K`` (a top-K
    static tree; ``@1``: a chain). The value is (DIR, K or None)."""

    name = "medusa"
    usage = "medusa:DIR[@K]"
    summary = "Medusa heads on the target's last hidden state (`zoo train-head --kind medusa` builds DIR)"
    path_marker = "medusa_lm_head.pt"

    def parse(self, arg: str | None) -> tuple[str, int | None]:
        if not arg:
            raise SpecdecError("medusa needs heads: e.g. draft=medusa:DIR (a FasterDecoding/Medusa head directory)")
        where, shape = split_shape(arg)
        if shape is not None and (not shape.isdigit() or int(shape) < 1):
            raise SpecdecError(f"bad Medusa tree in {arg!r}: use medusa:DIR@K (top-K per head, K >= 1), e.g. "
                               "medusa:DIR@4")
        return where, None if shape is None else int(shape)

    def build(self, value: tuple[str, int | None], target: Target) -> MedusaDrafter:
        where, topk = value
        directory = Path(where).expanduser()
        if not directory.is_dir():
            raise SpecdecError(f"Medusa heads {where!r} not found: give a Medusa head directory")
        heads, config = load_heads(directory, target.model)
        depth = len(heads.out)
        choices = [tuple(p) for p in config.get("medusa_choices") or [] if 0 < len(p) <= depth] if topk is None else []
        name = f"medusa:{where}" + ("" if topk is None else f"@{topk}")
        return MedusaDrafter(heads, name, choices or None, topk or DEFAULT_TOPK)

    def path(self, value: tuple[str, int | None]) -> str:
        return value[0]

    def vllm_config(self, value: tuple[str, int | None], num_draft_tokens: int, written: str) -> dict:
        where, topk = value
        path = Path(where).expanduser()
        if not vllm_layout(read_json(path / "config.json", WHAT) if (path / "config.json").is_file() else {}):
            raise SpecdecError(f"vLLM reads Medusa heads in its own layout ({written}): write them so with `zoo "
                               f"export {where} --to vllm --out DIR` and map medusa:DIR@1")
        if topk != 1:
            raise SpecdecError(f"vLLM's Medusa proposer drafts top-1 chains, not trees ({written}): map "
                               f"medusa:{where}@1")
        return {"method": "medusa", "model": str(path.resolve()), "num_speculative_tokens": num_draft_tokens}


KIND = MedusaKind()
