"""Batch-1 latency model for named accelerators: per-layer fixed cost plus bytes over bandwidth.

    t(model, tokens) = layers × per_layer_ms(gpu, runtime)
                       + max((weight bytes + KV-cache bytes read) / bandwidth, 2 × parameters × tokens / peak)

At batch 1 a decoder step is a chain of small kernels per layer; each layer pays a fixed cost (kernel
launches, synchronisation, framework time) that does not shrink with width, which is why the founding paper
finds latency linear in depth and nearly flat in width. The second term is the roofline (memory-bound at
batch 1). Constants and their sources:

- Bandwidth and dense BF16 peak: the vendors' datasheets (NVIDIA A100, H100 SXM, H200, L4, A10G, RTX 4090).
- Per-layer fixed cost, ``eager`` (PyTorch eager, as this project's engine and Hugging Face ``generate`` run):
  1.0 ms on A100. Source: PyTorch's "Accelerating Generative AI with PyTorch II: GPT, Fast" (2023): Llama-2-7B
  (32 layers, 13.5 GB in bf16) decodes at 25.5 tokens/s in eager mode on an A100-80GB: 39.2 ms per token, of
  which 13.5 GB / 2.04 TB/s = 6.6 ms is the weight read, leaving (39.2 - 6.6) / 32 ≈ 1.0 ms per layer. Eager
  overhead is CPU-bound launch time, so the same figure is used on every GPU.
- ``cuda-graphs`` (torch.compile with CUDA graphs, or any runtime that replays a captured graph): the same
  post reports 107 tokens/s compiled: 9.35 ms, so (9.35 - 6.6) / 32 ≈ 0.085 ms per layer on an A100 (it
  includes the kernels' shortfall from peak bandwidth); scaled by bandwidth for other GPUs (an assumption).
- ``cpu``: fitted on this project's 2-core machine by ``zoo profile --sweep --repeats 5`` (fp32, 4-byte weights):
  0.94 ms per layer and 13.5 GB/s, with a max row error of 40% on that noisy shared machine.

``zoo profile --sweep --calibrate NAME`` fits both constants from a measured depth/width sweep and writes a
calibration that ``zoo rank --gpu NAME`` then uses in place of these defaults.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from specdraft_eval.errors import SpecdecError
from specdraft_eval.profiles import Calibration

RUNTIMES = ("eager", "cuda-graphs")
A100_GRAPH_LAYER_MS = 0.085
A100_BANDWIDTH = 2039


@dataclass(frozen=True)
class Accelerator:
    name: str
    bandwidth_gb_s: float  # memory bandwidth (datasheet)
    bf16_tflops: float  # dense peak (datasheet)
    memory_gb: float
    layer_ms: dict[str, float] = field(default_factory=dict)  # per-layer fixed cost by runtime
    dtype_bytes: int = 2
    source: str = "defaults (see zoo/hardware.py)"

    def per_layer_ms(self, runtime: str) -> float:
        if runtime not in self.layer_ms:
            raise SpecdecError(f"unknown runtime {runtime!r} for {self.name}: use one of {', '.join(self.layer_ms)}")
        return self.layer_ms[runtime]


def _gpu(name: str, bandwidth: float, tflops: float, memory: float) -> Accelerator:
    graphs = A100_GRAPH_LAYER_MS * A100_BANDWIDTH / bandwidth
    return Accelerator(name, bandwidth, tflops, memory, {"eager": 1.0, "cuda-graphs": round(graphs, 4)})


GPUS = {
    a.name: a
    for a in [
        _gpu("a100-40gb", 1555, 312, 40),
        _gpu("a100-80gb", 2039, 312, 80),
        _gpu("h100", 3350, 989, 80),
        _gpu("h200", 4800, 989, 141),
        _gpu("l4", 300, 121, 24),
        _gpu("a10g", 600, 125, 24),
        _gpu("rtx-4090", 1008, 165, 24),
        # this project's CPU machine, from `zoo profile --sweep` (fp32): see the README's fit
        Accelerator("cpu", 13.5, 1.0, 24, {"eager": 0.94, "cuda-graphs": 0.94}, dtype_bytes=4),
    ]
}


def accelerator(name: str, calibration: Calibration | None = None) -> Accelerator:
    """The named accelerator, with a calibration's fitted constants when one is given."""
    key = name.lower().replace("_", "-")
    if key not in GPUS and calibration is None:
        raise SpecdecError(f"unknown GPU {name!r}: use one of {', '.join(GPUS)} or 'this' (measure this machine), "
                           "or calibrate it with `zoo profile --sweep --calibrate NAME`")
    base = GPUS.get(key, Accelerator(key, 1.0, float("inf"), 0.0))  # a calibrated unknown: no compute bound
    if calibration is None:
        return base
    return replace(base, bandwidth_gb_s=calibration.bandwidth_gb_s,
                   layer_ms={**base.layer_ms, calibration.runtime: calibration.per_layer_ms},
                   dtype_bytes=calibration.dtype_bytes,
                   source=f"calibration ({calibration.hardware}, {calibration.runtime})")


@dataclass(frozen=True)
class Shape:
    """What the latency model needs of a model: its decoder's shape and size."""

    layers: int
    hidden_size: int
    heads: int
    kv_heads: int
    vocab_size: int
    parameters: float  # all parameters
    embedding_parameters: float = 0.0  # input embeddings: one row is read per token, not the whole table

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.heads

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes

    def with_layers(self, layers: int) -> "Shape":
        """The same model cut to ``layers`` decoder layers (a layer view or a depth-pruned draft)."""
        per_layer = (self.parameters - self.embedding_parameters - self.vocab_size * self.hidden_size) / self.layers
        return replace(self, layers=layers,
                       parameters=self.parameters - per_layer * (self.layers - layers))


def shape_from_config(config) -> Shape:
    """A :class:`Shape` from a transformers config (object or dict), counting parameters as Llama-style models
    have them when the config does not say (q, k, v, o projections, a gated MLP, norms, embeddings, head)."""
    get = (lambda k, d=None: config.get(k, d)) if isinstance(config, dict) else (lambda k, d=None: getattr(config, k, d))
    try:
        layers, hidden = int(get("num_hidden_layers")), int(get("hidden_size"))
        heads = int(get("num_attention_heads"))
        kv_heads = int(get("num_key_value_heads") or heads)
        vocab = int(get("vocab_size"))
    except (TypeError, ValueError):
        raise SpecdecError("the model's config lacks num_hidden_layers, hidden_size, num_attention_heads or "
                           "vocab_size: give a decoder-only transformers config.json") from None
    inter = int(get("intermediate_size") or 4 * hidden)
    head_dim = int(get("head_dim") or hidden // heads)
    attention = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2
    mlp = 3 * hidden * inter
    embeddings = vocab * hidden
    head = 0 if get("tie_word_embeddings", False) else vocab * hidden
    params = layers * (attention + mlp + 2 * hidden) + embeddings + head + hidden
    return Shape(layers, hidden, heads, kv_heads, vocab, float(get("parameters") or params), float(embeddings))


def forward_seconds(shape: Shape, tokens: int, gpu: Accelerator, runtime: str = "eager", context: int = 0) -> float:
    """One batch-1 forward pass over ``tokens`` new tokens on top of ``context`` cached ones."""
    streamed = (shape.parameters - shape.embedding_parameters) * gpu.dtype_bytes
    streamed += shape.kv_bytes_per_token(gpu.dtype_bytes) * context
    memory = streamed / (gpu.bandwidth_gb_s * 1e9)
    compute = 2 * shape.parameters * tokens / (gpu.bf16_tflops * 1e12)
    return shape.layers * gpu.per_layer_ms(runtime) / 1000 + max(memory, compute)


def fit_sweep(rows: list[dict], name: str, hardware: str, dtype_bytes: int) -> Calibration:
    """Least-squares fit of ms per token = a × layers + b × weight bytes to a depth/width sweep (rows with
    ``layers``, ``weight_bytes`` and ``ms_per_token``): the per-layer cost (ms) and the bandwidth (GB/s), with
    the rows, each given its fitted value (``fitted_ms``)."""
    import numpy as np

    x = np.array([[r["layers"], r["weight_bytes"]] for r in rows], dtype=float)
    y = np.array([r["ms_per_token"] for r in rows], dtype=float)
    (a, b), *_ = np.linalg.lstsq(x, y, rcond=None)
    if a <= 0 or b <= 0:
        raise SpecdecError("the sweep does not fit a positive per-layer cost and bandwidth: rerun it with more "
                           "--repeats on a quieter machine")
    fitted = x @ np.array([a, b])
    rows = [{**row, "fitted_ms": float(v)} for row, v in zip(rows, fitted, strict=True)]
    return Calibration(name, float(a), float(1 / b / 1e6), hardware, "eager", dtype_bytes,
                       float(np.max(np.abs(fitted - y) / y)), rows)
