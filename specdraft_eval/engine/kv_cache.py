"""The KV caches: :class:`BatchCache`, the target's cache for a batch of rows of different lengths, and helpers shared by the engine (target) and model drafts: a growing cache (transformers'
``DynamicCache``) or a static one preallocated to a capacity (``StaticCache``: no tensor changes shape from step
to step, which CUDA graphs need). Both roll back by length."""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import DynamicCache, StaticCache
from transformers.cache_utils import Cache, StaticLayer

from specdraft_eval.errors import SpecdecError

ATTEND_STEP = 256  # a compiled step over a static cache attends over a multiple of this many positions


class PrefixLayer(StaticLayer):
    """A ``StaticLayer`` whose attention reads only a prefix of its preallocated positions: :func:`attend` makes its
    ``keys``/``values`` views of the first n positions (writes land in the whole tensors), with that length marked
    dynamic, so one compiled graph serves every n. Steps then cost what a growing cache's do, instead of attending
    over the whole capacity (10-50% more per step on the CPU at 1024-2048 positions). One position more than the
    capacity is allocated, so a prefix is always a proper view (one stride pattern for every n)."""

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self.whole = (self.keys, self.values)  # [rows, kv heads, capacity + 1, head dim]
        self.views: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # per compiled reach: the same objects

    def attend(self, positions: int | None) -> None:
        if positions is None:
            self.keys, self.values = self.whole
        elif positions % ATTEND_STEP:  # an eager step's exact prefix: a view for this call only
            self.keys, self.values = (whole[:, :, :positions] for whole in self.whole)
        else:  # a compiled step's reach: the same view objects every time, marked for dynamo and CUDA graphs
            if positions not in self.views:
                views = tuple(whole[:, :, :positions] for whole in self.whole)
                for view in views:
                    torch._dynamo.maybe_mark_dynamic(view, 2)
                    torch._dynamo.mark_static_address(view, guard=False)  # CUDA graphs read it in place, no copy
                self.views[positions] = views
            self.keys, self.values = self.views[positions]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return (self.keys.shape[2] if self.is_initialized else self.max_cache_len), 0


def static_cache(config, capacity: int) -> StaticCache:
    """A static cache of ``capacity`` usable positions for a model of ``config``, its full-attention layers
    :class:`PrefixLayer` (sliding-window layers stay transformers' own)."""
    cache = StaticCache(config=config, max_cache_len=capacity + 1)
    for layer in cache.layers:
        if type(layer) is StaticLayer:
            layer.__class__ = PrefixLayer
    return cache


def attend(cache: Cache, positions: int | None) -> None:
    """Let a static cache's :class:`PrefixLayer` layers attend over their first ``positions`` (None: all of them,
    as before compaction or row moves, which work on the whole tensors)."""
    for layer in cache.layers:
        if isinstance(layer, PrefixLayer) and layer.is_initialized:
            layer.attend(positions)


def new_cache(config=None, capacity: int | None = None) -> Cache:
    """A growing cache, or with ``capacity`` a static one of that many positions for a model of ``config``."""
    return DynamicCache() if capacity is None else static_cache(config, capacity)


def length(cache: Cache) -> int:
    """Cached positions (a static cache's filled prefix)."""
    return int(cache.get_seq_length())


def rollback(cache: Cache, keep: int) -> None:
    """Drop cached positions past ``keep`` (transformers' ``crop`` takes minus the count to drop; a static cache
    only moves its length, and the next write overwrites what was dropped)."""
    extra = length(cache) - keep
    if extra > 0:
        cache.crop(-extra)


def forward(model, tokens: list[int], cache: Cache, keep_logits: int) -> torch.Tensor:
    """Run ``tokens`` through ``model`` on top of ``cache``; return the last ``keep_logits`` logits rows."""
    ids = torch.tensor([tokens], dtype=torch.long, device=model.device)
    attend(cache, length(cache) + len(tokens))  # a draft's steps are eager: over what is filled
    out = model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=keep_logits)
    return out.logits[0]


def _ancestors(trees: list[list[int]], rows: int, width: int, device) -> torch.Tensor:
    """``[rows, width, width]`` bool: column j of a row's block sees column k when k is j or one of its ancestors
    (``trees[row][j]`` is j's parent column, -1 for none); padding columns and dead rows see only themselves."""
    seen = torch.eye(width, dtype=torch.bool).repeat(rows, 1, 1)
    for row, parents in enumerate(trees):
        for column, parent in enumerate(parents):
            if parent >= 0:
                seen[row, column] |= seen[row, parent]
    return seen.to(device)


def additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A bool ``[rows, queries, keys]`` mask as the 4D additive float mask transformers passes on unchanged
    (``[rows, 1, queries, keys]``: 0 to attend, the dtype's minimum not to; a bool 4D mask is wrong under eager
    attention, which adds it to the scores)."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(
        ~allowed, torch.finfo(dtype).min)[:, None]


class BatchCache:
    """The target's KV cache for a batch of rows of different lengths: one transformers cache over all rows,
    growing (``DynamicCache``) or static (a ``StaticCache`` handed in, preallocated: no tensor changes shape from
    step to step; rollback moves its length).

    A row may hold *holes*: columns of padding, or of draft tokens its verification rejected while another row's
    were accepted, that stay in the cache but are masked out of attention. ``lengths`` keeps each row's true
    length (its real columns), which gives the position ids of what it feeds next; ``mask`` is None while no row
    has a hole, so a batch of one runs exactly as an unpadded, unmasked forward pass. Holes are squeezed out
    (:meth:`compact`) once they are half the cache, or a static cache is full. A static cache has ``bucket`` rows
    (a power of two, so that batches of similar size share compiled steps): rows past the live ones are *dead*,
    fed nothing and attending to their first column only, and rows that finish become dead in place; with more
    than one row (or ``always_masked``: a draft of trees, whose paths leave holes) it always passes the mask and
    position ids, so each step's inputs keep one form. ``step``, when
    set, runs the forward passes after the prefill (a compiled forward: :mod:`specdraft_eval.engine.graphs`).
    """

    def __init__(self, rows: int, static: Cache | None = None, bucket: int | None = None) -> None:
        self.cache = DynamicCache() if static is None else static
        self.capacity = None if static is None else static.layers[0].max_cache_len - 1  # usable positions
        self.bucket = rows if static is None else (bucket or rows)  # rows in the cache, live and dead
        self.mask: torch.Tensor | None = None  # [bucket, columns] bool: True where a column holds a real token
        self.lengths = [0] * rows  # real columns per live row
        self.step: Callable | None = None
        self.always_masked = static is not None and self.bucket > 1  # pass the mask and position ids every step
        self._appended: list[int] = []  # tokens each row fed in the last forward pass

    @property
    def columns(self) -> int:
        return length(self.cache)

    def forward(self, model, tokens: list[list[int]], keep_logits: int, reach: int = 0,
                trees: list[list[int]] | None = None) -> torch.Tensor:
        """Append each live row's ``tokens`` (rows may differ in length: shorter ones are right-padded with masked
        columns) and return the last ``keep_logits`` logits of each row's block, ``[rows, keep_logits, vocab]``.
        ``trees``, per row, each new column's parent column in the block (-1 for the first): a column then attends
        to the row's past and its own ancestors only, at position length + depth (a token tree). Follow with
        :meth:`keep`. A static cache's compiled step attends over the filled positions rounded up to
        ``ATTEND_STEP`` (one CUDA graph per step of it), or ``reach`` if more (the warm-up visits each); a tree's
        mask spans the same positions."""
        live, width = len(tokens), max(len(row) for row in tokens)
        tokens = tokens + [[]] * (self.bucket - live)  # dead rows feed nothing
        if self.capacity is not None and self.columns + width > self.capacity:
            self.compact(full=True)
            if self.columns + width > self.capacity:
                raise SpecdecError(f"static KV cache of {self.capacity} positions is full: a bug, please report it")
        start, device = self.columns, model.device
        keys = start + width  # what attention reads: the filled positions, a compiled step's rounded up
        if self.capacity is not None and self.step is not None:
            keys = min(self.capacity, max(reach, -(-keys // ATTEND_STEP) * ATTEND_STEP))
        ids = torch.tensor([row + [0] * (width - len(row)) for row in tokens], dtype=torch.long, device=device)
        real = torch.tensor([[j < len(row) for j in range(width)] for row in tokens], device=device)  # [bucket, width]
        attention = position_ids = None
        if self.mask is not None or not bool(real.all()) or trees is not None or self.always_masked:
            past = self.mask if self.mask is not None else torch.ones(self.bucket, start, dtype=torch.bool,
                                                                      device=device)
            offsets = torch.arange(width, device=device)[None, :].expand(self.bucket, -1)  # [bucket, width]
            if trees is not None:
                attention_kind = str(getattr(model.config, "_attn_implementation", None) or "")
                if attention_kind.startswith("flash"):
                    raise SpecdecError(f"token trees need a 4D attention mask, which {attention_kind} does not take: "
                                       "load the target with sdpa or eager attention, or draft a chain")
                ancestors = _ancestors(trees, self.bucket, width, device)  # [bucket, width, width]
                offsets = ancestors.sum(-1) - 1  # each column's depth
                attention = torch.cat([past[:, None, :].expand(-1, width, -1), ancestors & real[:, None, :]], dim=2)
                attention = torch.nn.functional.pad(attention, (0, keys - start - width))  # a compiled reach
                attention = additive(attention, model.dtype)  # [bucket, 1, width, keys]
            else:
                attention = torch.cat([past, real], dim=1).long()  # [bucket, columns + width]
                if self.capacity is not None:  # a static shape: every allocated position, the unwritten ones masked
                    attention = torch.nn.functional.pad(attention, (0, self.capacity + 1 - attention.shape[1]))
            lengths = self.lengths + [0] * (self.bucket - live)
            position_ids = torch.tensor(lengths, device=device)[:, None] + offsets  # [bucket, width]
        if self.capacity is not None:  # what is filled; compiled, rounded up (bounded recompiles and CUDA graphs)
            attend(self.cache, keys)
        logits = (self.step or model)(input_ids=ids, attention_mask=attention, position_ids=position_ids,
                                 cache=self.cache, use_cache=True,
                                 logits_to_keep=0 if keep_logits == width else keep_logits
                                 ).logits  # [bucket, keep_logits, vocab]
        if not all(tokens if start == 0 else tokens[:live]):
            # a row with nothing real attended to nothing: its padded columns may hold NaN
            for layer in self.cache.layers:
                layer.keys[..., start:start + width, :].nan_to_num_(0.0)
                layer.values[..., start:start + width, :].nan_to_num_(0.0)
        self._appended = [len(row) for row in tokens]
        return logits[:live]

    def keep(self, kept: list[list[int]]) -> None:
        """After :meth:`forward`: keep live row i's appended columns ``kept[i]`` (ascending: a chain's first n, a
        tree's accepted path); the rest become holes (or are cropped, where no row kept them)."""
        live = len(kept)
        kept = kept + [[]] * (self.bucket - live)
        most = max((columns[-1] + 1 for columns in kept if columns), default=0)
        rollback(self.cache, self.columns - max(self._appended) + most)
        device = self.mask.device if self.mask is not None else self.cache.layers[0].keys.device
        chosen = torch.zeros(self.bucket, most, dtype=torch.bool, device=device)  # [bucket, most]
        for row, columns in enumerate(kept):
            chosen[row, columns] = True
        if self.mask is not None or not bool(chosen.all()):
            past = self.mask if self.mask is not None else torch.ones(self.bucket, self.columns - most,
                                                                      dtype=torch.bool, device=device)
            self.mask = torch.cat([past, chosen], dim=1)  # [bucket, columns]
            self.mask[live:, 0] = True  # a dead row attends to its first column: never to nothing
        self.lengths = [length + len(columns) for length, columns in zip(self.lengths, kept[:live], strict=True)]
        self.compact()

    def rollback(self, length: int) -> None:
        """A batch of one without holes: drop cached positions past ``length``."""
        if self.mask is not None or self.bucket != 1:
            raise ValueError("rollback is for a batch of one row without holes")
        rollback(self.cache, length)
        self.lengths = [min(self.lengths[0], length)]

    def select(self, rows: list[int]) -> None:
        """Keep only the live ``rows`` (the others have finished): a growing cache drops the others, a static one
        moves the kept rows first, in place, and the others become dead."""
        attend(self.cache, None)
        device = self.cache.layers[0].keys.device
        self.lengths = [self.lengths[i] for i in rows]
        if self.capacity is None:
            index = torch.tensor(rows, dtype=torch.long, device=device)
            for layer in self.cache.layers:
                layer.batch_select_indices(index)
            self.mask = self.mask[index] if self.mask is not None else None
            self.bucket = len(rows)
        else:
            order = rows + [i for i in range(self.bucket) if i not in rows]
            index = torch.tensor(order, dtype=torch.long, device=device)
            for layer in self.cache.layers:
                layer.keys.copy_(layer.keys[index])
                layer.values.copy_(layer.values[index])
            mask = self.mask if self.mask is not None else torch.ones(self.bucket, self.columns, dtype=torch.bool,
                                                                     device=device)
            self.mask = mask[index]
            self.mask[len(rows):] = False
            self.mask[len(rows):, 0] = True
        self.compact()

    def compact(self, full: bool = False) -> None:
        """Squeeze out holes once they fill half the cache (or, ``full``, now): each row's real columns, in order,
        right-aligned."""
        if self.mask is None or (not full and self.columns < 2 * max(self.lengths) + 16):
            return
        attend(self.cache, None)
        longest, columns = max(self.lengths), self.columns
        order = torch.sort(self.mask.int(), dim=1, stable=True).indices  # [bucket, columns]: holes first
        index = order[:, -longest:]  # [bucket, longest]
        self.mask = torch.gather(self.mask, 1, index)
        for layer in self.cache.layers:
            heads, dim = layer.keys.shape[1], layer.keys.shape[3]
            spread = index[:, None, :, None].expand(-1, heads, -1, dim)  # [bucket, heads, longest, head_dim]
            keys, values = layer.keys[:, :, :columns].gather(2, spread), layer.values[:, :, :columns].gather(2, spread)
            if self.capacity is None:
                layer.keys, layer.values = keys, values
            else:  # in place: a static cache keeps its tensors
                layer.keys[:, :, :longest].copy_(keys)
                layer.values[:, :, :longest].copy_(values)
        rollback(self.cache, longest)
        if bool(self.mask.all()):
            self.mask = None
