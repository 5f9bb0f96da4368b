"""``layers:0-3,29``: a depth-pruned view of the target that shares its weights (self-speculative).

The view is a shallow copy of the target whose decoder-layer list holds only the kept layers (the same
parameter tensors, no copy), relabelled 0..k-1 so that they index their own KV cache.
"""

from __future__ import annotations

import copy

import torch

from specdraft_eval.drafts.kind import Candidate, DraftKind
from specdraft_eval.drafts.model import ModelDrafter
from specdraft_eval.errors import SpecdecError
from specdraft_eval.models.structure import KnownShape, ModelShape, decoder_path
from specdraft_eval.models.targets import Target


def parse_layers(spec: str, depth: int | None) -> list[int]:
    """``"0-3,29"`` (or ``"0-3+29"``, which needs no quoting in model_args) -> ``[0, 1, 2, 3, 29]``, each below
    ``depth`` (None: unchecked)."""
    layers: list[int] = []
    for part in spec.replace("+", ",").split(","):
        part = part.strip()
        try:
            if "-" in part:
                lo, hi = (int(x) for x in part.split("-", 1))
                layers.extend(range(lo, hi + 1))
            else:
                layers.append(int(part))
        except ValueError:
            raise SpecdecError(f"bad layer list {spec!r}: use indices and ranges such as layers:0-3,29") from None
    if not layers:
        raise SpecdecError("empty layer list: use e.g. layers:0-3,29")
    if len(set(layers)) != len(layers) or layers != sorted(layers) or layers[0] < 0:
        raise SpecdecError(f"layer list {spec!r} must be increasing without repeats, e.g. layers:0-3,29")
    return in_range(layers, depth)


def in_range(layers: list[int], depth: int | None) -> list[int]:
    """``layers``, or a one-line error naming the first not below ``depth`` (None: any)."""
    bad = [i for i in layers if depth is not None and not 0 <= i < depth]
    if bad:
        raise SpecdecError(f"layer {bad[0]} is out of range: the target has layers 0-{depth - 1}")
    return layers


def _shallow(module: torch.nn.Module) -> torch.nn.Module:
    """A new module object sharing parameters and children but with its own child table and hooks."""
    clone = copy.copy(module)
    clone._modules = dict(module._modules)
    for name, value in vars(module).items():
        if "hooks" in name and isinstance(value, dict):
            setattr(clone, name, type(value)(value))  # a hook put on the view must not fire on the target
    return clone


def layer_view(target: torch.nn.Module, layers: list[int]) -> torch.nn.Module:
    """A model that runs only ``layers`` of ``target`` (then its final norm and head)."""
    depth = target.config.num_hidden_layers
    config = copy.deepcopy(target.config)
    config.num_hidden_layers = len(layers)
    if getattr(config, "layer_types", None):
        config.layer_types = [target.config.layer_types[i] for i in layers]
    path = decoder_path(target, depth)
    root = _shallow(target)
    parent = root
    for attr in path[:-1]:
        child = _shallow(getattr(parent, attr))
        parent._modules[attr] = child
        parent = child
    for module in {root, parent}:
        if hasattr(module, "config"):
            module.config = config
    originals = getattr(parent, path[-1])
    relabelled = []
    for new_idx, old_idx in enumerate(layers):
        layer = _shallow(originals[old_idx])
        for name, child in list(layer._modules.items()):
            if hasattr(child, "layer_idx"):
                child = _shallow(child)
                child.layer_idx = new_idx
                layer._modules[name] = child
        if hasattr(layer, "layer_idx"):
            layer.layer_idx = new_idx
        relabelled.append(layer)
    parent._modules[path[-1]] = torch.nn.ModuleList(relabelled)
    return root


class LayersKind(DraftKind):
    """``layers:SPEC``: the target's own layers SPEC as a draft."""

    name = "layers"
    usage = "layers:SPEC"
    summary = "depth-pruned view of the target sharing its weights, e.g. layers:0-4 or layers:0-3+29"

    def parse(self, arg: str | None) -> tuple[int, ...]:
        if not arg:
            raise SpecdecError("layers needs a list: e.g. draft=layers:0-3,29")
        return tuple(parse_layers(arg, None))

    def build(self, value: tuple[int, ...], target: Target) -> ModelDrafter:
        model = target.model
        layers = in_range(list(value), model.config.num_hidden_layers)
        return ModelDrafter(layer_view(model, layers), f"layers:{','.join(map(str, layers))}", model.config.vocab_size)

    def canonical(self, value: tuple[int, ...], written: str) -> str:
        return f"layers:{','.join(map(str, value))}"

    def shape(self, value: tuple[int, ...], target: ModelShape, name: str) -> KnownShape:
        layers = len(in_range(list(value), target.layers))
        return KnownShape(name, target.with_layers(layers), "target's config", True)

    def candidates(self, target_layers: int) -> tuple[Candidate, ...]:
        return (Candidate(f"layers:0-{min(5, target_layers) - 1}", (1, 2, 4)),)

    def vllm_config(self, value: tuple[int, ...], num_draft_tokens: int, written: str) -> dict:
        keep = written.partition(":")[2]
        raise SpecdecError(f"vLLM cannot run a layer view ({written}): save it as a draft model with "
                           f"`zoo prune TARGET --keep {keep} --out DIR` and serve draft=DIR")


KIND = LayersKind()
