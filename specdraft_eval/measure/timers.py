"""Timers: the one clock every timing reads, forward-pass timers and peak memory."""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable

import torch


def clock(device: torch.device) -> float:
    """Seconds, after waiting for the queued work of every GPU (a target spread over several by
    ``parallelize=True`` runs on each; the one clock for every timing)."""
    if device.type == "cuda":
        for index in range(torch.cuda.device_count()):
            torch.cuda.synchronize(index)
    return time.perf_counter()


class ForwardTimer:
    """Seconds spent inside a module's forward, call by call (pre/post forward hooks)."""

    def __init__(self, module: torch.nn.Module | None) -> None:
        self.calls: list[float] = []
        self._handles = []
        if module is not None:
            self._handles = [module.register_forward_pre_hook(self._start),
                             module.register_forward_hook(self._stop)]

    def _start(self, module, args) -> None:
        self._began = clock(module.device)

    def _stop(self, module, args, output) -> None:
        self.calls.append(clock(module.device) - self._began)

    def take(self) -> list[float]:
        calls, self.calls = self.calls, []
        return calls

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def peak_memory_mb(fn: Callable[[], object], device: torch.device, resident_bytes: int) -> float:
    """Peak memory while ``fn`` runs: CUDA's allocator peak, or on the CPU the models' weights
    (``resident_bytes``) plus the growth of resident memory above where it started (sampled every ms)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        return torch.cuda.max_memory_allocated(device) / 2**20
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)  # give back freed buffers so growth is this run's own
    except (OSError, AttributeError):
        pass
    start, peak, running = _rss_bytes(), [0], [True]

    def sample():
        while running[0]:
            peak[0] = max(peak[0], _rss_bytes())
            time.sleep(0.001)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        fn()
    finally:
        running[0] = False
        thread.join()
    peak[0] = max(peak[0], _rss_bytes())
    return (resident_bytes + max(0, peak[0] - start)) / 2**20
