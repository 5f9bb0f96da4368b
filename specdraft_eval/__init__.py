"""specdraft-eval: lossless speculative decoding for lm-evaluation-harness.

Public API (imported lazily so that the ``.pth`` hook costs nothing at start-up)::

    from specdraft_eval import load_target, load_draft, speculative_generate, speculative_generate_batch

The layers below (measure, models, engine, drafts, integration) are described in ARCHITECTURE.md.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.2.0"

_EXPORTS = {
    "load_target": "specdraft_eval.models.targets",
    "load_draft": "specdraft_eval.drafts",
    "Target": "specdraft_eval.models.targets",
    "DecodeParams": "specdraft_eval.engine.params",
    "RunSettings": "specdraft_eval.engine.params",
    "GammaPolicy": "specdraft_eval.engine.params",
    "Session": "specdraft_eval.engine.session",
    "speculative_generate": "specdraft_eval.engine.loop",
    "speculative_generate_batch": "specdraft_eval.engine.loop",
    "autoregressive_generate": "specdraft_eval.engine.loop",
    "autoregressive_generate_batch": "specdraft_eval.engine.loop",
    "GenerationStats": "specdraft_eval.measure.stats",
    "SpecdecError": "specdraft_eval.errors",
}

__all__ = [*_EXPORTS, "__version__"]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'specdraft_eval' has no attribute {name!r}")
