"""``compile=true``: the target's decode and verification steps through ``torch.compile``.

On a GPU, ``mode="reduce-overhead"`` captures CUDA graphs (one per input shape: each verification width 1..γ+1,
per batch size); on the CPU the default mode compiles C++ kernels. It needs a static KV cache (every tensor
address fixed), which ``DecodeParams.compile`` implies. The prefill stays eager (its length changes with every
prompt). Where compiling fails, one warning line says so and the step runs eagerly: the output is the same.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable

import torch

log = logging.getLogger(__name__)
_COMPILED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
RECOMPILE_LIMIT = 64  # widths 1..γ+1 at dynamic γ's largest γ, times batch sizes


class CompiledStep:
    """``model``'s forward, compiled on first use; eager from the first failure on."""

    def __init__(self, model: torch.nn.Module) -> None:
        from torch._dynamo.exc import TorchDynamoException
        from torch._inductor.exc import InductorError

        self.failures = (TorchDynamoException, InductorError)
        self.model = model
        mode = "reduce-overhead" if model.device.type == "cuda" else None
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, RECOMPILE_LIMIT)
        self.compiled: Callable | None = torch.compile(model.forward, mode=mode, dynamic=False)

    def __call__(self, **inputs):
        if self.compiled is not None:
            try:
                out = self.compiled(**inputs)
                out.logits = out.logits.clone()  # a CUDA graph's output buffer is overwritten by its next replay
                return out
            except self.failures as exc:
                log.warning("compile=true: compiling the step failed (%s: %s); running it eagerly",
                            type(exc).__name__, str(exc).strip().splitlines()[0] if str(exc).strip() else "")
                self.compiled = None
        return self.model(**inputs)


def compiled(model: torch.nn.Module) -> CompiledStep:
    """The compiled step of ``model`` (one per model, kept while the model lives, so graphs are captured once)."""
    step = _COMPILED.get(model)
    if step is None:
        step = _COMPILED[model] = CompiledStep(model)
    return step
