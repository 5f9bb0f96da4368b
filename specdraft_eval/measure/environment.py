"""Where a run ran: the device's name, package versions, and the size of the models it ran."""

from __future__ import annotations

import platform
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version

PACKAGES = ("specdraft-eval", "lm-eval", "torch", "transformers")


def dtype_name(dtype) -> str:
    """A torch dtype as every record and result spells it: ``float32``, ``bfloat16``, ``float16``."""
    return str(dtype).removeprefix("torch.")


def hardware(device) -> str:
    """A short name for the device a run used: the GPU's name, or ``CPU: ``, the processor's and the threads
    PyTorch runs on (a 2-core VM and a 64-core server of one CPU family are not one machine)."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            name = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), name)
    except OSError:
        pass
    return f"CPU: {name} ({torch.get_num_threads()} threads)"


def default_device() -> str:
    """``cuda`` where a GPU is visible, else ``cpu``."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def versions() -> dict[str, str | None]:
    """Installed versions of the packages a record names."""

    def one(package: str) -> str | None:
        try:
            return version(package)
        except PackageNotFoundError:
            return None

    return {p: one(p) for p in PACKAGES}


def parameter_count(model) -> int:
    """``model``'s parameters, its pre-packed linear layers' weights and biases included (``models.kernels``'
    ``PackedLinear`` keeps them outside ``parameters()``: an opaque ``packed`` weight with its in/out features)."""
    packed = [m for m in model.modules() if hasattr(m, "packed")]
    return (sum(p.numel() for p in model.parameters())
            + sum(m.in_features * m.out_features + (m.bias.numel() if m.bias is not None else 0) for m in packed))


@dataclass(frozen=True)
class ModelFacts:
    """Size of a draft or target: parameters (millions), decoder layers, KV-cache bytes per token at the
    model's own dtype. All zero for a model-free draft."""

    parameters_m: float = 0.0
    layers: int = 0
    kv_bytes_per_token: int = 0

    @classmethod
    def of(cls, model) -> ModelFacts:
        if model is None:
            return cls()
        c, count = getattr(model, "config", None), parameter_count(model) / 1e6
        if c is None:  # no attention, so no KV cache (Medusa's heads)
            return cls(count)
        heads = c.num_attention_heads
        kv_heads = getattr(c, "num_key_value_heads", None) or heads
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // heads
        return cls(count, c.num_hidden_layers, 2 * c.num_hidden_layers * kv_heads * head_dim * model.dtype.itemsize)
