"""Reads from the device to the host, counted: on a GPU each is a synchronisation that stalls the launch queue, so
the loop reads once per step what it needs (accepted paths, next tokens) and the record reports reads per step."""

from __future__ import annotations

import torch

_reads = 0


def read(tensor: torch.Tensor) -> list:
    """``tensor`` as (nested) Python lists, counted as one host read."""
    global _reads
    _reads += 1
    return tensor.tolist()


def reads() -> int:
    """Host reads so far in this process (take differences around what you measure)."""
    return _reads
