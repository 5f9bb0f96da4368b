"""Where a causal LM keeps its decoder layers (layer views and feature taps both need them)."""

from __future__ import annotations

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
