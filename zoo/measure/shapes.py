"""Model shapes without weights: the catalog, a ``config.json`` (a directory, a file or the HF cache), a
``layers:`` view of the target, or a results record; what ``zoo rank --gpu NAME`` needs to rank offline."""

from __future__ import annotations

import json
import os
from pathlib import Path

from specdraft_eval.drafts.spec import AUTO, COMPOSITE, MODEL, DraftSpec, draft_kinds
from specdraft_eval.errors import SpecdecError
from specdraft_eval.models.structure import KnownShape, ModelShape, shape_from_config
from zoo.build import catalog


def _config_file(name: str) -> Path | None:
    path = Path(os.path.expanduser(name))
    if path.is_dir() and (path / "config.json").is_file():
        return path / "config.json"
    if path.is_file() and path.suffix == ".json":
        return path
    if name.count("/") == 1 and not name.startswith((".", "/")):
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(name, "config.json")
        if isinstance(cached, str):
            return Path(cached)
    return None


def model_shape(name: str) -> KnownShape:
    """The shape of a target or draft model named by catalog name, hub id or config path."""
    entry = catalog.find(name)
    if entry is not None:
        vocab = catalog.vocab_size(entry.family)
        config = {"num_hidden_layers": entry.layers, "hidden_size": entry.hidden_size,
                  "num_attention_heads": entry.heads, "num_key_value_heads": entry.kv_heads,
                  "vocab_size": vocab, "intermediate_size": entry.intermediate_size,
                  "parameters": entry.parameters_m * 1e6}
        return KnownShape(name, shape_from_config(config), "catalog")
    file = _config_file(name)
    if file is None:
        raise SpecdecError(f"no shape known for {name!r} offline: give a catalog name (`zoo list`), a directory "
                           f"or file holding its config.json, or `zoo pull {name}` first")
    try:
        config = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise SpecdecError(f"cannot read {file}: {exc}; give a valid config.json") from None
    return KnownShape(name, shape_from_config(config), f"config ({file})")


def draft_shape(name: str, target: ModelShape, record=None) -> KnownShape:
    """A draft's shape: a kind's (:meth:`~specdraft_eval.drafts.kind.DraftKind.shape`), models, composites (the shape of
    their first part with a model, as :class:`~specdraft_eval.drafts.composite.CompositeDrafter` reports); or,
    for a draft known only from a results ``record``, its recorded size at the target's width."""
    kinds = draft_kinds()
    spec = DraftSpec.parse(name, kinds)
    if spec.kind == AUTO:
        raise SpecdecError("rank the drafts auto chooses among, not auto itself: `zoo recommend` names it")
    if spec.kind == COMPOSITE:
        parts = [draft_shape(part.name, target) for part in spec.parts]
        shaped = next((p for p in parts if p.shape is not None), None)
        canonical = "|".join(p.name for p in parts)
        return KnownShape(canonical, shaped.shape if shaped else None,
                        f"composite: {shaped.source} of {shaped.name}" if shaped else "model-free",
                        shaped.shares_target if shaped else False)
    if spec.kind != MODEL:  # the kind's shape and canonical name
        kind = kinds[spec.kind]
        return kind.shape(spec.value, target, kind.canonical(spec.value, spec.name))
    try:
        return model_shape(name)
    except SpecdecError:
        if record is None or not record.draft_layers:
            raise
    shape = ModelShape(record.draft_layers, target.hidden_size, target.heads, target.kv_heads, target.vocab_size,
                       record.draft_parameters_m * 1e6, target.vocab_size * target.hidden_size)
    return KnownShape(name, shape, "results record (size)")
