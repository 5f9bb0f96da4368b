"""The EAGLE head file formats, read and written in one place: the EAGLE repository's layout (what ``zoo train-head``
writes, with ``eagle.json``), speculators' EAGLE-3 and the EAGLE repository's EAGLE-3; a head directory or hub id."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from torch import nn
from transformers import LlamaConfig

from specdraft_eval.drafts.checkpoint import load_into, read_json, read_weights
from specdraft_eval.drafts.eagle.module import EAGLE, EAGLE3, LAYER_FAMILIES, EagleHead, HeadLayout, default_taps
from specdraft_eval.engine.drafter import FINAL
from specdraft_eval.errors import SpecdecError
from specdraft_eval.files import write_json

HEAD_FILE = "eagle.json"
"""Beside the weights of a head ``zoo train-head`` built: its format, target, taps and reduced vocabulary."""
HEAD_FORMAT = "specdraft-eagle/1"
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
WHAT = "EAGLE head"


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


def describe(where: str) -> tuple[str, int | None]:
    """The head at ``where``'s (a directory or hub id) variant (vLLM's ``method``: ``eagle`` or ``eagle3``) and
    output vocabulary size
    (None: the target's), from its config files alone."""
    directory = _directory(where)
    config = read_json(directory / "config.json", WHAT)
    variant = variant_of(config)
    if variant == EAGLE3:
        return variant, config.get("draft_vocab_size")
    meta = read_json(directory / HEAD_FILE, WHAT) if (directory / HEAD_FILE).is_file() else {}
    return variant, len(meta["token_ids"]) if meta.get("token_ids") else None


def has_qk_norm(keys) -> bool:
    return any(".q_norm." in k or ".k_norm." in k for k in keys)


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
    qk_norm = has_qk_norm(weights)
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
        raise SpecdecError(f"EAGLE head {directory} holds decoder layers {sorted(found)}: not 0..N-1; download it "
                           "again")
    stated = config.get("num_hidden_layers")
    if stated is not None and stated != count:
        raise SpecdecError(f"EAGLE head {directory}: its config says {stated} decoder layers, its weights hold "
                           f"{count}; "
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
    ids = layout.token_ids
    if ids is not None and (min(ids) < 0 or max(ids) >= target.config.vocab_size):
        raise SpecdecError(f"EAGLE head {directory}: its vocabulary maps outside the target's "
                           f"{target.config.vocab_size} tokens; use a head trained for this target")
    return head.to(target.device, target.dtype).eval().requires_grad_(False), layout


def _stored(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Weights as a head is saved: float32 as float16 (half the size; loaded at the target's dtype), others as
    they are."""
    return {k: v.detach().cpu().to(torch.float16 if v.dtype == torch.float32 else v.dtype).contiguous()
            for k, v in state.items()}


def save_head(directory: Path, head: EagleHead, meta: dict) -> None:
    """The EAGLE repository's layout (``config.json``, ``model.safetensors``: fc, layers.0; float32 weights stored as
    float16, half the size, loaded at the target's dtype) plus ``eagle.json`` (format, tokenizer fingerprint, output
    vocabulary, how it was trained)."""
    from safetensors.torch import save_file

    state = _stored({k: v for k, v in head.state_dict().items() if not k.startswith(("lm_head.", "rotary_emb."))})
    save_file(state, str(directory / "model.safetensors"))
    config = head.config.to_dict()
    config.update(architectures=["LlamaForCausalLM"], bias=head.fc.bias is not None)
    (directory / "config.json").write_text(json.dumps(config, indent=1, default=str))
    write_json(directory / HEAD_FILE, {"format": HEAD_FORMAT, **meta})


def save_eagle3(directory: Path, head: EagleHead, target_name: str, meta: dict) -> None:
    """speculators' EAGLE-3 layout, as vLLM loads it as it is: ``model.safetensors`` (``fc``, ``layers.0``, ``norm``,
    ``lm_head`` over the draft vocabulary in float16, ``d2t`` offsets and ``t2d``) and a speculators config (the layer
    config, the taps, ``norm_before_residual``, a greedy proposal method of the unrolled depth, our training record)."""
    from safetensors.torch import save_file

    state = _stored({k: v for k, v in head.state_dict().items() if not k.startswith("rotary_emb.")})
    token_ids = meta["token_ids"] or list(range(head.lm_head.out_features))
    state["d2t"] = torch.tensor(token_ids) - torch.arange(len(token_ids))
    state["t2d"] = torch.isin(torch.arange(head.config.vocab_size), torch.tensor(token_ids))
    save_file(state, str(directory / "model.safetensors"))
    layer = {**head.config.to_dict(), "model_type": "llama"}
    config = {"speculators_model_type": "eagle3", "architectures": ["Eagle3Speculator"],
              "transformer_layer_config": layer,
              "draft_vocab_size": len(token_ids), "norm_before_residual": head.layers[0].norm_before_residual,
              "eagle_aux_hidden_state_layer_ids": list(head.taps),
              "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                                     "proposal_methods": [{"proposal_type": "greedy",
                                                           "speculative_tokens": meta["training"]["unroll"]}],
                                     "verifier": {"name_or_path": target_name}},
              "specdraft_eval": {k: v for k, v in meta.items() if k != "token_ids"}}  # d2t holds the vocabulary
    (directory / "config.json").write_text(json.dumps(config, indent=1, default=str))
