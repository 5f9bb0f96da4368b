"""The KV caches: :class:`BatchCache`, the target's cache for a batch of rows of different lengths, and helpers shared by the engine (target) and model drafts: a growing cache (transformers'
``DynamicCache``) or a static one preallocated to a capacity (``StaticCache``: no tensor changes shape from step
to step, which CUDA graphs need). Both roll back by length."""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import DynamicCache, StaticCache
from transformers.cache_utils import Cache

from specdraft_eval.errors import SpecdecError


def new_cache(config=None, capacity: int | None = None) -> Cache:
    """A growing cache, or with ``capacity`` a static one of that many positions for a model of ``config``."""
    return DynamicCache() if capacity is None else StaticCache(config=config, max_cache_len=capacity)


def is_static(cache: Cache) -> bool:
    return isinstance(cache, StaticCache)


def length(cache: Cache) -> int:
    """Cached positions (a static cache's filled prefix)."""
    return int(cache.get_seq_length())


def rollback(cache: Cache, keep: int) -> None:
    """Drop cached positions past ``keep`` (transformers' ``crop`` takes minus the count to drop; a static cache
    only moves its length, and the next write overwrites what was dropped)."""
    extra = length(cache) - keep
    if extra > 0:
        cache.crop(-extra)


def select_rows(cache: Cache, index: torch.Tensor) -> None:
    """Keep only the batch rows ``index`` (in that order)."""
    for layer in cache.layers:
        if is_static(cache):
            layer.keys, layer.values = layer.keys[index], layer.values[index]
            layer.batch_size = len(index)
        else:
            layer.batch_select_indices(index)


def forward(model, tokens: list[int], cache: Cache, keep_logits: int) -> torch.Tensor:
    """Run ``tokens`` through ``model`` on top of ``cache``; return the last ``keep_logits`` logits rows."""
    ids = torch.tensor([tokens], dtype=torch.long, device=model.device)
    out = model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=keep_logits)
    return out.logits[0]


class BatchCache:
    """The target's KV cache for a batch of rows of different lengths: one transformers cache over all rows,
    growing (``DynamicCache``) or, given a ``capacity``, static (``StaticCache``: preallocated, so no tensor
    changes shape from step to step; rollback moves its length).

    A row may hold *holes*: columns of padding, or of draft tokens its verification rejected while another row's
    were accepted, that stay in the cache but are masked out of attention. ``lengths`` keeps each row's true
    length (its real columns), which gives the position ids of what it feeds next; ``mask`` is None while no row
    has a hole, so a batch of one runs exactly as an unpadded, unmasked forward pass. Holes are squeezed out
    (:meth:`compact`) once they are half the cache. ``step``, when set, runs the forward passes after the prefill
    (a compiled forward: :mod:`specdraft_eval.engine.graphs`).
    """

    def __init__(self, rows: int, config=None, capacity: int | None = None) -> None:
        self.cache = new_cache(config, capacity)
        self.capacity = capacity
        self.mask: torch.Tensor | None = None  # [rows, columns] bool: True where a column holds a real token
        self.lengths = [0] * rows  # real columns per row
        self.step: Callable | None = None
        self._appended: list[int] = []  # tokens each row fed in the last forward pass

    @property
    def columns(self) -> int:
        return length(self.cache)

    def forward(self, model, tokens: list[list[int]], keep_logits: int) -> torch.Tensor:
        """Append each row's ``tokens`` (rows may differ in length: shorter ones are right-padded with masked
        columns) and return the last ``keep_logits`` logits of each row's block, ``[rows, keep_logits, vocab]``.
        Follow with :meth:`keep`."""
        width, start = max(len(row) for row in tokens), self.columns
        if self.capacity is not None and start + width > self.capacity:
            raise SpecdecError(f"static KV cache of {self.capacity} positions is full: a bug, please report it")
        device = model.device
        ids = torch.tensor([row + [0] * (width - len(row)) for row in tokens], dtype=torch.long, device=device)
        real = torch.tensor([[j < len(row) for j in range(width)] for row in tokens], device=device)  # [rows, width]
        attention = position_ids = None
        if self.mask is not None or not bool(real.all()):
            past = self.mask if self.mask is not None else torch.ones(len(tokens), start, dtype=torch.bool,
                                                                      device=device)
            attention = torch.cat([past, real], dim=1).long()  # [rows, columns + width]
            if self.capacity is not None:  # a static shape: every position, the unwritten ones masked
                attention = torch.nn.functional.pad(attention, (0, self.capacity - attention.shape[1]))
            position_ids = (torch.tensor(self.lengths, device=device)[:, None]
                            + torch.arange(width, device=device)[None, :])  # [rows, width]
        logits = (self.step or model)(input_ids=ids, attention_mask=attention, position_ids=position_ids,
                                      cache=self.cache, use_cache=True,
                                      logits_to_keep=keep_logits).logits  # [rows, keep_logits, vocab]
        if not all(tokens):  # a row with nothing real attended to nothing: its padded columns may hold NaN
            for layer in self.cache.layers:
                layer.keys[..., start:start + width, :].nan_to_num_(0.0)
                layer.values[..., start:start + width, :].nan_to_num_(0.0)
        self._appended = [len(row) for row in tokens]
        return logits

    def keep(self, counts: list[int]) -> None:
        """After :meth:`forward`: keep the first ``counts[i]`` appended columns of row i; the rest become holes
        (or are cropped, where no row kept them)."""
        most = max(counts)
        rollback(self.cache, self.columns - max(self._appended) + most)
        device = self.mask.device if self.mask is not None else self.cache.layers[0].keys.device
        kept = torch.arange(most, device=device)[None, :] < torch.tensor(counts, device=device)[:, None]  # [rows, most]
        if self.mask is not None or not bool(kept.all()):
            past = self.mask if self.mask is not None else torch.ones(len(counts), self.columns - most,
                                                                      dtype=torch.bool, device=device)
            self.mask = torch.cat([past, kept], dim=1)  # [rows, columns]
        self.lengths = [length + count for length, count in zip(self.lengths, counts, strict=True)]
        self.compact()

    def rollback(self, length: int) -> None:
        """A batch of one without holes: drop cached positions past ``length``."""
        if self.mask is not None or len(self.lengths) != 1:
            raise ValueError("rollback is for a batch of one row without holes")
        rollback(self.cache, length)
        self.lengths = [min(self.lengths[0], length)]

    def select(self, rows: list[int]) -> None:
        """Keep only ``rows`` (the others have finished)."""
        index = torch.tensor(rows, dtype=torch.long, device=self.cache.layers[0].keys.device)
        select_rows(self.cache, index)
        self.mask = self.mask[index] if self.mask is not None else None
        self.lengths = [self.lengths[i] for i in rows]
        self.compact()

    def compact(self) -> None:
        """Squeeze out holes once they fill half the cache: each row's real columns, in order, right-aligned."""
        if self.mask is None or self.columns < 2 * max(self.lengths) + 16:
            return
        longest, columns = max(self.lengths), self.columns
        order = torch.sort(self.mask.int(), dim=1, stable=True).indices  # [rows, columns]: holes first
        index = order[:, -longest:]  # [rows, longest]
        self.mask = torch.gather(self.mask, 1, index)
        for layer in self.cache.layers:
            heads, dim = layer.keys.shape[1], layer.keys.shape[3]
            spread = index[:, None, :, None].expand(-1, heads, -1, dim)  # [rows, heads, longest, head_dim]
            keys, values = layer.keys[:, :, :columns].gather(2, spread), layer.values[:, :, :columns].gather(2, spread)
            if self.capacity is None:
                layer.keys, layer.values = keys, values
            else:  # in place: a static cache keeps its tensors
                layer.keys[:, :, :longest].copy_(keys)
                layer.values[:, :, :longest].copy_(values)
        rollback(self.cache, longest)
        if bool(self.mask.all()):
            self.mask = None
