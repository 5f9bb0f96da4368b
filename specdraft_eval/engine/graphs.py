"""Static shapes for a whole run, and compiled steps (``static_cache=true`` / ``compile=true``).

A :class:`StaticCaches` is what one target keeps across the requests of a run: one ``StaticCache`` per batch
bucket (rows rounded up to a power of two), allocated once at a capacity that only grows in steps of
:data:`CAPACITY_STEP` positions and reused by every request, so no tensor changes address from request to request.
With ``compile=true`` the target's decode and verification steps go through ``torch.compile`` (on a GPU
``mode="reduce-overhead"``: CUDA graphs) with the step's width and its attention's reach (the filled positions,
rounded up to ``kv_cache.ATTEND_STEP``) dynamic: one graph for width 1 and one for every wider step serve the whole
run per batch bucket (on a GPU, one CUDA graph per width and reach), and a third for token trees (their 4D mask, its
width and reach dynamic too) where the draft drafts them. :meth:`StaticCaches.warm_up` compiles and runs
every width and reach the run can use before the first timed step, and reports the seconds apart. The prefill stays
eager (its length changes with every prompt). Where compiling fails, one warning line says so and the step runs
eagerly from then on: the output is the same.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable

import torch
from transformers import StaticCache

from specdraft_eval.engine.kv_cache import ATTEND_STEP, BatchCache, rollback, static_cache
from specdraft_eval.errors import SpecdecError
from specdraft_eval.measure.timers import clock

log = logging.getLogger(__name__)
CAPACITY_STEP = ATTEND_STEP  # a static cache's positions are a multiple of this (and of every compiled reach)
GRAPH_LIMIT = 64  # dynamo's graphs per code object: batch buckets x capacities x 3


def bucket(rows: int) -> int:
    """The batch bucket that ``rows`` rows run in: the next power of two."""
    return 1 << max(rows - 1, 0).bit_length()


def compiled_graphs() -> int:
    """Graphs ``torch.compile`` has compiled in this process so far (dynamo's own counter)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


class CompiledStep:
    """``model``'s forward through ``torch.compile`` with the step's width dynamic; eager from the first failure on."""

    def __init__(self, model: torch.nn.Module) -> None:
        from torch._dynamo.exc import TorchDynamoException
        from torch._inductor.exc import InductorError

        from specdraft_eval.models.kernels import kernels_of

        if kernels_of(model) != "plain":
            raise SpecdecError("compile=true cannot compile oneDNN pre-packed linear layers: load the target with "
                               "kernels=plain (the compiled step packs its weights itself)")
        self.failures = (TorchDynamoException, InductorError)
        self.model = model
        mode = "reduce-overhead" if model.device.type == "cuda" else None
        # two graphs per batch bucket and capacity, all of one code object: past dynamo's default limit of 8 it
        # would run the step eagerly without a word
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, GRAPH_LIMIT)
        self.compiled: Callable | None = torch.compile(model.forward, mode=mode, dynamic=False)

    def __call__(self, **inputs):
        if self.compiled is not None:
            if inputs["input_ids"].shape[1] > 1:  # one graph for every width above 1, not one per width
                for name in ("input_ids", "position_ids"):
                    if inputs.get(name) is not None:
                        torch._dynamo.maybe_mark_dynamic(inputs[name], 1)
                mask = inputs.get("attention_mask")
                if mask is not None and mask.dim() == 4:  # a token tree's: [rows, 1, width, reach]
                    torch._dynamo.maybe_mark_dynamic(mask, 2)
                    torch._dynamo.maybe_mark_dynamic(mask, 3)
            try:
                out = self.compiled(**inputs)
                out.logits = out.logits.clone()  # a CUDA graph's output buffer is overwritten by its next replay
                return out
            except self.failures as exc:
                log.warning("compile=true: compiling the step failed (%s: %s); running it eagerly",
                            type(exc).__name__, str(exc).strip().splitlines()[0] if str(exc).strip() else "")
                self.compiled = None
        return self.model(**inputs)


class StaticCaches:
    """One target's static caches (one per batch bucket, reused by every request) and, with ``compile``, its
    compiled step, warmed up at every (bucket, width) the run uses before any of them is timed."""

    def __init__(self, model: torch.nn.Module, capacity: int, compile: bool) -> None:
        self.model, self.capacity = model, capacity
        self.step = CompiledStep(model) if compile else None
        self.caches: dict[int, StaticCache] = {}
        self.warm: set[tuple[int, int, bool, bool]] = set()  # (bucket, width, tree, masked chain) warmed up

    def cache(self, rows: int) -> BatchCache:
        """An empty :class:`BatchCache` of ``rows`` rows over this runtime's static cache for their bucket."""
        size = bucket(rows)
        static = self.caches.get(size)
        if static is None:
            static = self.caches[size] = static_cache(self.model.config, self.capacity)
        else:
            rollback(static, 0)
        return BatchCache(rows, static, size)

    def warm_up(self, cache: BatchCache, widths: range, trees: bool = False) -> float:
        """Run each step width not yet run at ``cache``'s bucket and input form (a chain's inputs are masked when the
        cache is ``always_masked``), over every attention prefix the capacity allows
        (on a GPU three times: CUDA-graph warm-up, recording, replay), and with ``trees`` each width above 1 as a
        token tree too (its 4D mask: one more graph), then drop it from the cache; returns the seconds it took
        (compilation, recording): time no figure includes."""
        masked = cache.always_masked  # chains with a 2D mask and position ids: another input form, another graph
        todo = [(w, tree) for w in widths for tree in (False, True)[: 2 if trees and w > 1 else 1]
                if (cache.bucket, w, tree, masked and not tree) not in self.warm]
        if self.step is None or not todo:
            return 0.0
        device = self.model.device
        start, filled = clock(device), cache.columns
        calls = 3 if device.type == "cuda" else 1
        saved, cache.step = cache.step, self.step
        for width, tree in todo:
            shape = [list(range(-1, width - 1))] * len(cache.lengths) if tree else None  # any tree: the mask is data
            for reach in range(ATTEND_STEP, self.capacity + ATTEND_STEP, ATTEND_STEP):
                for _ in range(calls):
                    cache.forward(self.model, [[0] * width] * len(cache.lengths), width, reach, trees=shape)
                    rollback(cache.cache, filled)
            self.warm.add((cache.bucket, width, tree, masked and not tree))
        cache.step = saved
        return clock(device) - start


class StaticCachesByModel:
    """Each model's static runtimes (compiled or not), kept while the model lives: a run's requests share them."""

    def __init__(self) -> None:
        self._kept: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {compile: StaticCaches}

    def get(self, model: torch.nn.Module, positions: int, compile: bool) -> StaticCaches:
        """``model``'s runtime (compiled or not, as asked) for requests of up to ``positions`` cached positions: the
        one it has when that holds them, else a new one of ``positions`` rounded up to :data:`CAPACITY_STEP`, which
        replaces it (so a run's requests share one shape, and its capacity only grows)."""
        kept = self._kept.setdefault(model, {})
        current = kept.get(compile)
        if current is not None and current.capacity >= positions:
            return current
        capacity = -(-positions // CAPACITY_STEP) * CAPACITY_STEP
        kept[compile] = fresh = StaticCaches(model, capacity, compile)
        return fresh


STATIC_CACHES = StaticCachesByModel()


def static_caches(model: torch.nn.Module, positions: int, compile: bool) -> StaticCaches:
    """:meth:`StaticCachesByModel.get` of the process's runtimes."""
    return STATIC_CACHES.get(model, positions, compile)
