"""A target sharded across processes by transformers' tensor-parallel plan (``tp_plan="auto"`` under ``torchrun``):
its degree, and the check that every rank generated the same tokens (each rank runs the same engine loop and the
same drafter on the same, all-reduced, logits; a rank that drafted or accepted otherwise would desynchronise the
collectives or write other text)."""

from __future__ import annotations

import zlib

import torch

from specdraft_eval.errors import SpecdecError


def is_sharded(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is a distributed tensor (a tensor-parallel shard of a weight)."""
    if not torch.distributed.is_available():  # a PyTorch built without it has none
        return False
    from torch.distributed.tensor import DTensor

    return isinstance(tensor, DTensor)


def tensor_parallel(model) -> int:
    """How many processes share ``model``'s layers by transformers' tensor-parallel plan (1: not sharded)."""
    return int(getattr(model, "_tp_size", None) or 1)


def ranks_agree(model, outputs: list[list[int]], what: str) -> None:
    """On a tensor-parallel ``model``, compare a digest of every rank's ``outputs``; one line if they differ."""
    if tensor_parallel(model) == 1 or not torch.distributed.is_initialized():
        return
    digests: list[int | None] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(digests, zlib.crc32(repr(outputs).encode()))
    if len(set(digests)) > 1:
        raise SpecdecError(f"tensor-parallel ranks generated different tokens for {what} (digests by rank: "
                           f"{digests}): every rank must run the same draft, seed and settings; rerun with one set")
