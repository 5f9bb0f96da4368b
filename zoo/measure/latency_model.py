"""Batch-1 latency model for named accelerators: a fixed cost per step and per layer, and the roofline.

    fixed(model)    = step_ms(gpu, runtime) + layers × layer_ms(gpu, runtime)
    roofline(model) = max((weight bytes + KV-cache bytes read at the context) / bandwidth, 2 × parameters × tokens /
    peak) t = max(fixed, roofline)   where the runtime is host-bound (PyTorch eager on a GPU: the host launches kernels
                                while the GPU reads weights, so the longer of the two sets the pace)
    t = fixed + roofline       otherwise (CUDA graphs: what is left per layer is GPU time; the CPU: one device)

Why max for eager on a GPU: on one H200 a 4-layer step costs 3.23 ms at width 4096 and 3.32 ms at width 8192,
where it reads 7.5 GB (1.5 ms at 4.8 TB/s): an additive model predicts over 5 ms there. Constants and sources:

- Bandwidth and dense BF16 peak: the vendors' datasheets (NVIDIA A100, H100 SXM, H200, L4, A10G, RTX 4090).
- ``eager`` on a GPU: ``step_ms`` 0.913 and ``layer_ms`` 0.602, fitted (least squares on relative error) to the 11
  batch-1 step times measured on one NVIDIA H200 (torch 2.11, transformers 5.25, bf16, context 128; random-weight
  Llama shapes: 1-32 layers at width 4096, 4 layers at 1024-8192, 24 x 2048 and 5 x 4096), published in
  ``../shared/gpu/README.md`` and kept in :data:`MEASURED` (their in-sample error: :func:`model_error`). Eager
  overhead is the host's launch time, so the same constants are used on every GPU (a rule, not a measurement:
  gpt-fast's 2023 A100 figure, 39.2 ms per Llama-2-7B token, was twice today's on older PyTorch).
- ``cuda-graphs`` (torch.compile with CUDA graphs, or any runtime that replays a captured graph): PyTorch's
  "Accelerating Generative AI with PyTorch II: GPT, Fast" (2023): Llama-2-7B at 107 tokens/s compiled on an
  A100-80GB, 9.35 ms, of which 13.5 GB / 2.04 TB/s = 6.6 ms is the weight read, leaving (9.35 - 6.6) / 32 ≈
  0.085 ms per layer (it includes the kernels' shortfall from peak bandwidth); scaled by bandwidth for other GPUs
  (an assumption); no per-step term.
- ``cpu``: fitted on this project's 2-core machine by ``zoo profile --sweep --repeats 5`` (fp32, 4-byte weights):
  0.94 ms per layer and 13.5 GB/s, with a max row error of 40% on that noisy shared machine.

A target sharded over N GPUs by tensor parallelism (``zoo rank --gpus N``; drafts stay on one): each GPU reads and
computes 1/N of the weights and KV cache, every GPU still runs (and the host still launches) every layer, and each
layer adds two all-reduces of the new tokens' hidden states (after attention and after the MLP, Megatron's
layout, which transformers' ``tp_plan`` follows), each ``ALLREDUCE_US`` + 2 (N - 1) / N × bytes / link bandwidth
(a ring): ``ALLREDUCE_US`` = 10 µs is an assumption (the order of NCCL's small-message all-reduce latency inside
one NVLink node; batch-1 messages are a few kB, so latency dominates); the link bandwidths are the datasheets'
per-direction figures (NVLink 3 on A100: 300 GB/s; NVLink 4 on H100/H200: 450 GB/s; PCIe 4.0 x16 for the others:
32 GB/s). The all-reduces add to the host-launched part on an eager (host-bound) runtime.

``zoo profile --sweep --calibrate NAME`` fits the constants to a measured depth/width sweep and writes a
calibration that ``zoo rank --gpu NAME`` then uses in place of these defaults.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from specdraft_eval.errors import SpecdecError
from specdraft_eval.models.structure import ModelShape, shape_from_config
from specdraft_eval.results.profiles import Calibration, SweepRow

LAUNCH_MODES = ("eager", "cuda-graphs")
ALLREDUCE_US = 10.0  # per all-reduce at batch 1: an assumption, see the module docstring
A100_GRAPH_LAYER_MS = 0.085
A100_BANDWIDTH = 2039
H200_EAGER = (0.913, 0.602)  # step_ms, layer_ms: see the module docstring

MEASURED = {
    "h200": {
        "runtime": "eager", "context": 128,
        "source": "one NVIDIA H200, torch 2.11, transformers 5.25, bf16, batch 1, the engine's verify_step at k=0, "
                  "median of 3 interleaved rounds (../shared/gpu/README.md, Dec 2026)",
        # (layers, hidden_size, intermediate_size, heads, measured ms per step)
        "rows": [(1, 4096, 11008, 32, 1.58), (2, 4096, 11008, 32, 2.16), (4, 4096, 11008, 32, 3.23),
                 (8, 4096, 11008, 32, 5.70), (16, 4096, 11008, 32, 11.34), (32, 4096, 11008, 32, 21.21),
                 (4, 1024, 2752, 8, 3.23), (4, 2048, 5504, 16, 3.11), (4, 8192, 22016, 64, 3.32),
                 (24, 2048, 5504, 16, 14.94), (5, 4096, 11008, 32, 3.91)],
    },
}
"""Step times measured on a GPU, for :func:`model_error` (``zoo rank`` prints it)."""


@dataclass(frozen=True)
class RuntimeCost:
    """The fixed costs of one runtime on one device: per step and per decoder layer (ms), and whether the host's
    launches overlap the device's reads (then the step takes the longer of the two, not their sum)."""

    step_ms: float
    layer_ms: float
    host_bound: bool = False


@dataclass(frozen=True)
class Accelerator:
    name: str
    bandwidth_gb_s: float  # memory bandwidth (datasheet)
    bf16_tflops: float  # dense peak (datasheet)
    memory_gb: float
    runtimes: dict[str, RuntimeCost] = field(default_factory=dict)
    dtype_bytes: int = 2
    source: str = "defaults (see zoo/measure/latency_model.py)"
    link_gb_s: float = 32.0  # GPU-to-GPU, per direction (datasheet): NVLink, else PCIe 4.0 x16

    def cost(self, runtime: str) -> RuntimeCost:
        if runtime not in self.runtimes:
            raise SpecdecError(f"unknown runtime {runtime!r} for {self.name}: use one of {', '.join(self.runtimes)}")
        return self.runtimes[runtime]


def _gpu(name: str, bandwidth: float, tflops: float, memory: float, link: float = 32.0) -> Accelerator:
    graphs = RuntimeCost(0.0, round(A100_GRAPH_LAYER_MS * A100_BANDWIDTH / bandwidth, 4))
    return Accelerator(name, bandwidth, tflops, memory, {"eager": RuntimeCost(*H200_EAGER, host_bound=True),
                                                         "cuda-graphs": graphs}, link_gb_s=link)


GPUS = {
    a.name: a
    for a in [
        _gpu("a100-40gb", 1555, 312, 40, 300),
        _gpu("a100-80gb", 2039, 312, 80, 300),
        _gpu("h100", 3350, 989, 80, 450),
        _gpu("h200", 4800, 989, 141, 450),
        _gpu("l4", 300, 121, 24),
        _gpu("a10g", 600, 125, 24),
        _gpu("rtx-4090", 1008, 165, 24),
        # this project's CPU machine, from `zoo profile --sweep` (fp32): see docs/development.md's fit
        Accelerator("cpu", 13.5, 1.0, 24, {r: RuntimeCost(0.0, 0.94) for r in LAUNCH_MODES}, dtype_bytes=4),
    ]
}


GPU_ALIASES = {"a100": "a100-80gb"}  # the founding paper's A100s were the 80 GB ones


def accelerator(name: str, calibration: Calibration | None = None) -> Accelerator:
    """The named accelerator (or :data:`GPU_ALIASES`), with a calibration's fitted constants when one is given."""
    key = name.lower().replace("_", "-")
    key = GPU_ALIASES.get(key, key)
    if key not in GPUS and calibration is None:
        raise SpecdecError(f"unknown GPU {name!r}: use one of {', '.join(GPUS)} or 'this' (measure this machine), "
                           "or calibrate it with `zoo profile --sweep --calibrate NAME`")
    base = GPUS.get(key, Accelerator(key, 1.0, float("inf"), 0.0))  # a calibrated unknown: no compute bound
    if calibration is None:
        return base
    cost = RuntimeCost(calibration.step_ms, calibration.per_layer_ms, host_bound=calibration.bandwidth_gb_s is None)
    return replace(base, bandwidth_gb_s=calibration.bandwidth_gb_s or base.bandwidth_gb_s,
                   runtimes={**base.runtimes, calibration.runtime: cost}, dtype_bytes=calibration.dtype_bytes,
                   source=f"calibration ({calibration.hardware}, {calibration.runtime})")


def forward_seconds(shape: ModelShape, tokens: int, gpu: Accelerator, runtime: str = "eager", context: int = 0,
                    gpus: int = 1) -> float:
    """One batch-1 forward pass over ``tokens`` new tokens on top of ``context`` cached ones, the model sharded over
    ``gpus`` GPUs by tensor parallelism (see the module docstring for the model)."""
    streamed = (shape.parameters - shape.embedding_parameters) * gpu.dtype_bytes
    streamed += shape.kv_bytes_per_token(gpu.dtype_bytes) * context
    roofline = max(streamed / (gpu.bandwidth_gb_s * 1e9), 2 * shape.parameters * tokens / (gpu.bf16_tflops * 1e12))
    cost = gpu.cost(runtime)
    fixed = (cost.step_ms + shape.layers * cost.layer_ms) / 1000 + allreduce_seconds(shape, tokens, gpu, gpus)
    roofline /= gpus
    return max(fixed, roofline) if cost.host_bound else fixed + roofline


def allreduce_seconds(shape: ModelShape, tokens: int, gpu: Accelerator, gpus: int) -> float:
    """The all-reduces of a forward pass sharded over ``gpus`` GPUs: two per layer of ``tokens`` hidden states."""
    if gpus == 1:
        return 0.0
    message = tokens * shape.hidden_size * gpu.dtype_bytes
    one = ALLREDUCE_US / 1e6 + 2 * (gpus - 1) / gpus * message / (gpu.link_gb_s * 1e9)
    return 2 * shape.layers * one


def model_error(gpu: str, runtime: str = "eager") -> str | None:
    """How far the model is from the step times measured on ``gpu`` (:data:`MEASURED`): median and max |error|
    over the rows, or None where nothing was measured for that runtime."""
    import statistics

    measured = MEASURED.get(gpu)
    if measured is None or measured["runtime"] != runtime:
        return None
    errors = []
    for layers, hidden, inter, heads, ms in measured["rows"]:
        shape = shape_from_config({"num_hidden_layers": layers, "hidden_size": hidden, "intermediate_size": inter,
                                   "num_attention_heads": heads, "vocab_size": 32000})
        errors.append(abs(forward_seconds(shape, 1, GPUS[gpu], runtime, measured["context"]) * 1000 / ms - 1))
    return (f"median {statistics.median(errors):.1%}, max {max(errors):.1%} over {len(errors)} {runtime} steps "
            f"measured on {gpu} (in-sample: the constants were fitted to them)")


def fit_sweep(rows: list[SweepRow], name: str, hardware: str, dtype_bytes: int) -> Calibration:
    """Least-squares fit of ms per token = step + a × layers + b × weight bytes to a depth/width sweep (rows with
    ``layers``, ``weight_bytes`` and ``ms_per_token``), each constant with its standard error. A bandwidth whose
    term is not at least twice its standard error cannot be told from noise (a host-bound step): it is not
    stored, the fit is redone without it, and the calibration says the step is host-bound. The rows come back
    with their fitted value (``fitted_ms``)."""
    import numpy as np

    y = np.array([r.ms_per_token for r in rows], dtype=float)
    full = np.array([[1.0, r.layers, r.weight_bytes / 1e9] for r in rows], dtype=float)  # GB: well conditioned
    if len(rows) < 4:
        raise SpecdecError("the sweep has fewer than 4 rows: too few to fit 3 constants; rerun zoo profile --sweep")
    (c, a, b), errors = _lstsq(full, y)
    bandwidth, reason = None, None
    if b > 2 * errors[2]:
        bandwidth = float(1000 / b)  # b: ms per GB
        uncertainty = {"step_ms": errors[0], "per_layer_ms": errors[1],
                       "bandwidth_gb_s": bandwidth * errors[2] / b}  # relative error of 1/b is that of b
        x, coefficients = full, np.array([c, a, b])
    else:
        reason = (f"bandwidth not identified (its term {b:.3g} ± {errors[2]:.3g} ms/GB is within twice its "
                  "uncertainty): the step is host-bound; rank keeps the datasheet bandwidth for the roofline")
        x = full[:, :2]
        (c, a), errors = _lstsq(x, y)
        uncertainty, coefficients = {"step_ms": errors[0], "per_layer_ms": errors[1]}, np.array([c, a])
    if a <= 0:
        raise SpecdecError("the sweep does not fit a positive per-layer cost: rerun it with more --repeats on a "
                           "quieter machine")
    fitted = x @ coefficients
    rows = [replace(row, fitted_ms=float(v)) for row, v in zip(rows, fitted, strict=True)]
    return Calibration(name, float(a), bandwidth, hardware, "eager", dtype_bytes,
                       float(np.max(np.abs(fitted - y) / y)), rows, step_ms=float(c),
                       uncertainty={k: float(v) for k, v in uncertainty.items()}, note=reason)


def _lstsq(x, y):
    """Coefficients and their standard errors (from the residual variance)."""
    import numpy as np

    coefficients, *_ = np.linalg.lstsq(x, y, rcond=None)
    dof = max(len(y) - x.shape[1], 1)
    variance = float(np.sum((y - x @ coefficients) ** 2)) / dof
    covariance = variance * np.linalg.pinv(x.T @ x)
    return coefficients, np.sqrt(np.clip(np.diag(covariance), 0.0, None))
