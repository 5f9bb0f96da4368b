"""A draft's checkpoint directory as heads ship (EAGLE, Medusa): its JSON files and its weights (safetensors or a
torch pickle, loaded without code), each unreadable file one line naming it and the fix."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from specdraft_eval.errors import SpecdecError


def read_json(path: Path, what: str) -> dict:
    """A JSON object from ``path`` of a ``what`` directory (e.g. "EAGLE head")."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SpecdecError(f"cannot read {path} ({exc}): point at a {what} directory") from None
    if not isinstance(data, dict):
        raise SpecdecError(f"{path} is not a JSON object: point at a {what} directory")
    return data


def read_weights(directory: Path, names: tuple[str, ...], what: str) -> dict[str, torch.Tensor]:
    """The first of ``names`` found in ``directory``, read (``.safetensors`` or ``weights_only`` torch)."""
    def read(path: Path) -> dict[str, torch.Tensor]:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(path))
        return torch.load(path, map_location="cpu", weights_only=True)

    return _open(directory, names, what, read)


def weight_names(directory: Path, names: tuple[str, ...], what: str) -> set[str]:
    """The weight names in the first of ``names`` found in ``directory``, as stored (a safetensors header alone, or
    a torch pickle memory-mapped)."""
    def read(path: Path) -> set[str]:
        if path.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(path), framework="pt") as f:
                return set(f.keys())
        return set(torch.load(path, map_location="cpu", weights_only=True, mmap=True))

    return _open(directory, names, what, read)


def _open(directory: Path, names: tuple[str, ...], what: str, read):
    """``read(path)`` of the first of ``names`` in ``directory``; a missing or unreadable file is one line."""
    for name in names:
        path = directory / name
        if path.is_file():
            try:
                return read(path)
            except Exception as exc:  # noqa: BLE001 - any unreadable file is the same user error
                raise SpecdecError(f"{what} {directory}: cannot read {name} ({exc}); download it again") from None
    raise SpecdecError(f"{what} {directory} has no weights ({' or '.join(names)}): point at a {what} directory")


def load_into(module: torch.nn.Module, weights: dict[str, torch.Tensor], directory: Path, what: str,
              strict: bool = True) -> None:
    """``module.load_state_dict(weights)``; a shape that does not fit is one line naming the first mismatch."""
    try:
        module.load_state_dict(weights, strict=strict)
    except RuntimeError as exc:
        line = next((ln.strip() for ln in str(exc).splitlines() if "size mismatch" in ln), str(exc).splitlines()[0])
        raise SpecdecError(f"{what} {directory} does not fit this target ({line}): use one trained for it") from None
