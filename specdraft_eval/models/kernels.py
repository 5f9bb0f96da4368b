"""Faster CPU forward passes: linear layers with weights pre-packed once for oneDNN.

PyTorch's plain ``F.linear`` on the CPU runs a 1-row input as a matrix-vector product but repacks the whole
weight matrix on every call for 2..8 rows, so verifying k draft tokens costs up to twice one decoding step
although both stream the same weights. Packing each weight once (what ``torch.compile``'s freezing does for
CPU linears) keeps a k-token verification close to a step's cost. The swap is in place, so the target's
autoregressive baseline, transformers' ``generate`` on the same model object, layer views and model drafts
all run the same kernels: a speedup never comes from optimising one side only. ``kernels=plain`` keeps
PyTorch's own ``nn.Linear``.
"""

from __future__ import annotations

import logging

import torch

from specdraft_eval.errors import SpecdecError
from specdraft_eval.models.sharding import is_sharded

log = logging.getLogger(__name__)

KERNELS = ("onednn", "plain")
DEFAULT = "onednn"


class PackedLinear(torch.nn.Module):
    """``nn.Linear`` with its weight reordered once into oneDNN's blocked layout (inference only)."""

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        weight = linear.weight.detach()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, None)  # opaque [out, in], blocked
        self.bias = None if linear.bias is None else linear.bias.detach()
        self.nbytes = weight.numel() * weight.element_size()

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [..., in] -> [..., out]
        rows = x.reshape(-1, self.in_features)
        out = torch.ops.mkldnn._linear_pointwise(rows, self.packed, self.bias, "none", [], "")
        return out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, oneDNN pre-packed"


def check(kernels: str) -> str:
    if kernels not in KERNELS:
        raise SpecdecError(f"kernels={kernels!r} is unknown: use kernels=onednn (pre-packed CPU weights) or "
                           "kernels=plain")
    return kernels


def choose(kernels: str | None, compile: bool) -> str:
    """The kernels a run uses: ``kernels`` checked, or by default ``onednn``, and ``plain`` with ``compile``
    (``torch.compile`` cannot lower oneDNN's pre-packed weights; it packs plain weights itself)."""
    if kernels is None:
        if compile:
            log.warning("compile=true runs kernels=plain: oneDNN's pre-packed weights do not compile "
                        "(inductor packs its own)")
        return "plain" if compile else DEFAULT
    if check(kernels) == "onednn" and compile:
        raise SpecdecError("compile=true with kernels=onednn: pre-packed oneDNN weights do not compile; use "
                           "kernels=plain or leave kernels out")
    return kernels


def supported(model: torch.nn.Module) -> bool:
    """oneDNN pre-packing pays on CPU float32/bfloat16 models where PyTorch was built with it (not on a model
    sharded by tensor parallelism: its weights are distributed tensors, which the packing cannot read)."""
    param = next(model.parameters(), None)
    return (param is not None and param.device.type == "cpu" and param.dtype in (torch.float32, torch.bfloat16)
            and not is_sharded(param)
            and torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))


def apply(model: torch.nn.Module, kernels: str = DEFAULT) -> torch.nn.Module:
    """Swap ``model``'s linear layers for :class:`PackedLinear` in place when ``kernels="onednn"`` and the
    model is :func:`supported` (otherwise leave it as it is). Returns ``model``."""
    if check(kernels) == "plain" or not supported(model):
        return model
    with torch.inference_mode():
        for module in list(model.modules()):
            for name, child in list(module._modules.items()):
                if isinstance(child, torch.nn.Linear):
                    module._modules[name] = PackedLinear(child)
    return model


def kernels_of(model: torch.nn.Module) -> str:
    """``"onednn"`` if ``model`` runs pre-packed linears, else ``"plain"`` (a draft follows its target)."""
    return "onednn" if any(isinstance(m, PackedLinear) for m in model.modules()) else "plain"


def output_weight(model) -> torch.Tensor:
    """The weight of ``model``'s output head ([vocab, hidden]), also once pre-packed (a packed head tied to the
    input embeddings reads it from them) or sharded by tensor parallelism (gathered whole, once)."""
    head = model.get_output_embeddings()
    if not isinstance(head, PackedLinear):
        weight = head.weight.detach()
        return weight.full_tensor() if is_sharded(weight) else weight
    embedding = model.get_input_embeddings().weight
    if getattr(model.config, "tie_word_embeddings", False) and embedding.shape == (head.out_features, head.in_features):
        return embedding.detach()
    raise SpecdecError("this target's output head is pre-packed and not tied to its embeddings: run it with "
                       "kernels=plain to draft with a head that reads the target's output head")


def weight_bytes(model: torch.nn.Module) -> dict[int, int]:
    """Bytes of ``model``'s distinct weight tensors, keyed by identity (parameters and packed weights)."""
    seen = {p.data_ptr(): p.numel() * p.element_size() for p in model.parameters()}
    seen.update({id(m.packed): m.nbytes for m in model.modules() if isinstance(m, PackedLinear)})
    return seen


def distinct_weight_bytes(*models: torch.nn.Module | None) -> int:
    """Bytes of the distinct weight tensors of ``models`` (a layer view shares the target's; None: no model)."""
    seen: dict[int, int] = {}
    for model in models:
        if model is not None:
            seen.update(weight_bytes(model))
    return sum(seen.values())
