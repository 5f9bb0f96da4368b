"""Timers: the one clock every timing reads."""

from __future__ import annotations

import time

import torch


def clock(device: torch.device) -> float:
    """Seconds, after waiting for the device's queued work (the one clock for every timing)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()
