"""Roofline latency estimates for named accelerators (batch-1 decoding treated as memory-bound)."""

from __future__ import annotations

from dataclasses import dataclass

from specdraft_eval.errors import SpecdecError


@dataclass(frozen=True)
class Accelerator:
    name: str
    bandwidth_gb_s: float  # memory bandwidth
    bf16_tflops: float  # dense peak
    memory_gb: float


GPUS = {
    a.name: a
    for a in [
        Accelerator("a100-40gb", 1555, 312, 40),
        Accelerator("a100-80gb", 2039, 312, 80),
        Accelerator("h100", 3350, 989, 80),
        Accelerator("h200", 4800, 989, 141),
        Accelerator("l4", 300, 121, 24),
        Accelerator("a10g", 600, 125, 24),
        Accelerator("rtx-4090", 1008, 165, 24),
        Accelerator("cpu", 40, 1.0, 64),  # a typical 2-socket-less server core complex; a rough guide only
    ]
}


def accelerator(name: str) -> Accelerator:
    key = name.lower().replace("_", "-")
    if key not in GPUS:
        raise SpecdecError(f"unknown GPU {name!r}: use one of {', '.join(GPUS)} or 'this' (measure this machine)")
    return GPUS[key]


def forward_seconds(parameters: float, tokens: int, gpu: Accelerator, dtype_bytes: int = 2) -> float:
    """One forward pass over ``tokens`` new tokens: the larger of reading the weights and the matmul work."""
    memory = parameters * dtype_bytes / (gpu.bandwidth_gb_s * 1e9)
    compute = 2 * parameters * tokens / (gpu.bf16_tflops * 1e12)
    return max(memory, compute)
