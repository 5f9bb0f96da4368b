"""The KV caches: :class:`BatchCache`, the target's cache for a batch of rows of different lengths (storage apart
from row bookkeeping), and helpers shared by the engine (target) and model drafts: a growing cache (transformers'
``DynamicCache``, its layers appending in place: :class:`GrowingLayer`) or a static one preallocated to a capacity
(``StaticCache``: no tensor changes shape from step to step, which CUDA graphs need). Both roll back by length."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import DynamicCache, StaticCache
from transformers.cache_utils import Cache, DynamicLayer, StaticLayer

from specdraft_eval.engine.attention import grouped_queries
from specdraft_eval.engine.ragged import real_tokens_only
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


SPARE = 0.25
"""A :class:`GrowingLayer` that runs out of room reallocates this share of its positions (and 64) beyond them."""


class GrowingLayer(DynamicLayer):
    """transformers' ``DynamicLayer``, appending in place: ``keys``/``values`` are views of the first n positions of
    tensors with room to spare, so a step writes its new columns where ``DynamicLayer`` copies the whole cache into
    a new tensor (``torch.cat``: at batch 16 × up to 512 prompt tokens, 14 of a plain step's 55 ms in torch's
    profiler on the CPU). Out of room, or after ``keys`` were replaced (a gather), the next update moves them into
    new tensors with :data:`SPARE` room; ``crop`` leaves a view (the next write overwrites what it dropped). States
    that carry gradients (training) are appended as ``DynamicLayer`` does: autograd needs the tensors it saw
    unchanged."""

    room: tuple[torch.Tensor, torch.Tensor] | None = None  # [rows, kv heads, positions with spare, head dim]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if key_states.requires_grad or value_states.requires_grad:  # training: autograd needs every version
            return super().update(key_states, value_states, *args, **kwargs)
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        filled = self.get_seq_length()
        end = filled + key_states.shape[-2]
        if self.room is None or not self._in_room() or end > self.room[0].shape[-2]:
            room = tuple(torch.empty(*new.shape[:2], end + int(SPARE * end) + 64, new.shape[3], dtype=new.dtype,
                                     device=new.device) for new in (key_states, value_states))
            if filled:
                room[0][..., :filled, :].copy_(self.keys)
                room[1][..., :filled, :].copy_(self.values)
            self.room = room
        self.room[0][..., filled:end, :].copy_(key_states)
        self.room[1][..., filled:end, :].copy_(value_states)
        self.keys, self.values = self.room[0][..., :end, :], self.room[1][..., :end, :]
        return self.keys, self.values

    def _in_room(self) -> bool:
        """Whether ``keys``/``values`` are still views of ``room`` from its first position (the last update's, or
        a crop of them)."""
        return all(view.numel() == 0 or (view.data_ptr() == whole.data_ptr() and view.shape[0] == whole.shape[0]
                                         and view.stride() == whole.stride())
                   for view, whole in zip((self.keys, self.values), self.room, strict=True))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep the rows ``indices``, room and all (one copy)."""
        filled = self.get_seq_length()
        if filled and self.room is not None and self._in_room():
            self.room = (self.room[0][indices], self.room[1][indices])
            self.keys, self.values = self.room[0][..., :filled, :], self.room[1][..., :filled, :]
        else:
            super().batch_select_indices(indices)

    def reset(self) -> None:
        self.room = None
        super().reset()


def growing_cache() -> DynamicCache:
    """An empty growing cache whose layers append in place (:class:`GrowingLayer`)."""
    cache = DynamicCache()
    cache.layer_class_to_replicate = GrowingLayer
    return cache


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
    return growing_cache() if capacity is None else static_cache(config, capacity)


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


@dataclass(frozen=True)
class StepLayout:
    """A step's override of what its columns see and where they sit: ``visible`` ``[bucket, width, start]`` bool
    (which of the cache's columns each new column may attend to, within the rows' own real columns) and
    ``positions`` ``[bucket, width]`` (their position ids)."""

    visible: torch.Tensor
    positions: torch.Tensor


@dataclass(frozen=True)
class CacheMark:
    """:meth:`BatchCache.mark`'s record: the columns then, and the rows' mask and lengths."""

    columns: int
    mask: torch.Tensor | None
    lengths: list[int]

    def select(self, rows: list[int]) -> CacheMark:
        """The mark of the live ``rows`` only (after a growing cache's :meth:`BatchCache.select` between the two)."""
        return CacheMark(self.columns, self.mask[rows] if self.mask is not None else None,
                    [self.lengths[row] for row in rows])


class GrowingStorage:
    """A batch's KV tensors in a growing ``DynamicCache``: attention reads every column; a finished row is dropped."""

    capacity: int | None = None  # no preallocated positions

    def __init__(self) -> None:
        self.cache = growing_cache()

    def reach(self, keys: int, compiled: bool, reach: int) -> int:
        """The positions attention reads when ``keys`` are filled: all of them."""
        return keys

    def widen(self, attention: torch.Tensor) -> torch.Tensor:
        """A 2D ``[rows, columns]`` mask as the model takes it: as it is."""
        return attention

    def attend(self, keys: int) -> None:
        """Nothing to narrow: a growing cache holds only what is filled."""

    def select(self, rows: list[int], bucket: int) -> torch.Tensor:
        """Keep only ``rows``; the index that maps the old rows to the new ones."""
        index = torch.tensor(rows, dtype=torch.long, device=self.cache.layers[0].keys.device)
        for layer in self.cache.layers:
            layer.batch_select_indices(index)
        return index

    def gather(self, index: torch.Tensor, columns: int) -> None:
        """Each row's columns ``index[row]`` (``[bucket, longest]``) of the first ``columns``, now its first ones."""
        for layer in self.cache.layers:
            layer.keys, layer.values = _gathered(layer, index, columns)


class StaticStorage:
    """A batch's KV tensors in a preallocated ``StaticCache`` of ``bucket`` rows: no tensor changes shape from step to
    step (CUDA graphs need that); rollback moves its length; a finished row stays in place, dead; attention reads
    the filled prefix (:class:`PrefixLayer`), a compiled step's rounded up to ``ATTEND_STEP``."""

    def __init__(self, cache: Cache) -> None:
        self.cache = cache
        self.capacity = cache.layers[0].max_cache_len - 1  # usable positions

    def reach(self, keys: int, compiled: bool, reach: int) -> int:
        """The positions attention reads when ``keys`` are filled: a compiled step's rounded up to ``ATTEND_STEP``
        (one CUDA graph per step of it), or ``reach`` if more (the warm-up visits each)."""
        return min(self.capacity, max(reach, -(-keys // ATTEND_STEP) * ATTEND_STEP)) if compiled else keys

    def widen(self, attention: torch.Tensor) -> torch.Tensor:
        """A 2D mask over every allocated position (a static shape), the unwritten ones masked."""
        return torch.nn.functional.pad(attention, (0, self.capacity + 1 - attention.shape[1]))

    def attend(self, keys: int) -> None:
        attend(self.cache, keys)

    def select(self, rows: list[int], bucket: int) -> torch.Tensor:
        """Move ``rows`` first, in place (the others after them: dead); the index of the new order."""
        order = rows + [i for i in range(bucket) if i not in rows]
        index = torch.tensor(order, dtype=torch.long, device=self.cache.layers[0].keys.device)
        for layer in self.cache.layers:
            layer.keys.copy_(layer.keys[index])
            layer.values.copy_(layer.values[index])
        return index

    def gather(self, index: torch.Tensor, columns: int) -> None:
        for layer in self.cache.layers:  # in place: a static cache keeps its tensors
            keys, values = _gathered(layer, index, columns)
            layer.keys[:, :, : index.shape[1]].copy_(keys)
            layer.values[:, :, : index.shape[1]].copy_(values)


def _gathered(layer, index: torch.Tensor, columns: int) -> tuple[torch.Tensor, torch.Tensor]:
    heads, dim = layer.keys.shape[1], layer.keys.shape[3]
    spread = index[:, None, :, None].expand(-1, heads, -1, dim)  # [bucket, heads, longest, head_dim]
    return layer.keys[:, :, :columns].gather(2, spread), layer.values[:, :, :columns].gather(2, spread)


class RowLayout:
    """Which cache columns hold each row's real tokens, apart from where the tensors live.

    A row may hold *holes*: columns of padding, or of draft tokens its verification rejected while another row's
    were accepted, that stay in the cache but are masked out of attention. ``lengths`` keeps each live row's true
    length (its real columns), which gives the position ids of what it feeds next; ``mask`` (``[bucket, columns]``
    bool, True where a column holds a real token) is None while no row has a hole, so a batch of one runs exactly as
    an unpadded, unmasked forward pass. Rows past the live ones are *dead* (a static batch bucket): fed nothing and
    attending to their first column only. With ``always_masked`` the mask and position ids are passed every step, so
    each step's inputs keep one form."""

    def __init__(self, rows: int, bucket: int, always_masked: bool) -> None:
        self.bucket = bucket  # rows in the cache, live and dead
        self.lengths = [0] * rows  # real columns per live row
        self.mask: torch.Tensor | None = None
        self.always_masked = always_masked

    def inputs(self, tokens: list[list[int]], start: int, keys: int, model, trees: list[list[int]] | None,
               widen: Callable[[torch.Tensor], torch.Tensor], layout: StepLayout | None = None
               ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """One step's ``tokens`` (every row of the bucket's, dead ones empty) as the model's input ids, attention mask
        and position ids (None, None where no row needs them): shorter rows right-padded with masked columns;
        ``trees`` (per row, each new column's parent column, -1 for the first) attend to the row's past and their own
        ancestors only, at position length + depth, as a 4D mask over ``keys`` positions; ``layout`` narrows what
        each new column sees of the past and sets its positions (a draft's tree grown over several passes)."""
        device, width = model.device, max(len(row) for row in tokens)
        ids = torch.tensor([row + [0] * (width - len(row)) for row in tokens], dtype=torch.long, device=device)
        real = torch.tensor([[j < len(row) for j in range(width)] for row in tokens], device=device)  # [bucket, width]
        if layout is not None and trees is None:
            trees = [[-1] * width] * self.bucket  # the 4D form: columns see their past as steered, and themselves
        whole = all(len(row) == width for row in tokens)  # from the host's lists: no device read
        if self.mask is None and whole and trees is None and not self.always_masked:
            return ids, None, None
        past = self.mask if self.mask is not None else torch.ones(self.bucket, start, dtype=torch.bool, device=device)
        offsets = torch.arange(width, device=device)[None, :].expand(self.bucket, -1)  # [bucket, width]
        if trees is not None:
            attention_kind = str(getattr(model.config, "_attn_implementation", None) or "")
            if attention_kind.startswith("flash"):
                raise SpecdecError(f"token trees need a 4D attention mask, which {attention_kind} does not take: "
                                   "load the target with sdpa or eager attention, or draft a chain")
            ancestors = _ancestors(trees, self.bucket, width, device)  # [bucket, width, width]
            offsets = ancestors.sum(-1) - 1  # each column's depth
            seen = past[:, None, :].expand(-1, width, -1)  # [bucket, width, start]
            if layout is not None:
                seen = seen & layout.visible
            attention = torch.cat([seen, ancestors & real[:, None, :]], dim=2)
            attention = torch.nn.functional.pad(attention, (0, keys - start - width))  # a compiled reach
            attention = additive(attention, model.dtype)  # [bucket, 1, width, keys]
        else:
            attention = widen(torch.cat([past, real], dim=1).long())  # [bucket, columns + width (or capacity + 1)]
        lengths = self.lengths + [0] * (self.bucket - len(self.lengths))
        position_ids = torch.tensor(lengths, device=device)[:, None] + offsets  # [bucket, width]
        return ids, attention, layout.positions if layout is not None else position_ids

    def keep(self, kept: list[list[int]], columns: int, device) -> None:
        """Live row i kept its appended columns ``kept[i]`` of the last step (the cache now ends at the last column
        any row kept, ``columns`` in all); the rest are holes."""
        live = len(kept)
        kept = kept + [[]] * (self.bucket - live)
        most = max((chosen[-1] + 1 for chosen in kept if chosen), default=0)
        chosen = torch.zeros(self.bucket, most, dtype=torch.bool, device=device)  # [bucket, most]
        for row, picked in enumerate(kept):
            chosen[row, picked] = True
        if self.mask is not None or any(picked != list(range(most)) for picked in kept):  # host lists: no read
            past = self.mask if self.mask is not None else torch.ones(self.bucket, columns - most, dtype=torch.bool,
                                                                      device=device)
            self.mask = torch.cat([past, chosen], dim=1)  # [bucket, columns]
            self.mask[live:, 0] = True  # a dead row attends to its first column: never to nothing
        self.lengths = [length + len(picked) for length, picked in zip(self.lengths, kept[:live], strict=True)]

    def select(self, rows: list[int], index: torch.Tensor, columns: int, drops_rows: bool) -> None:
        """Only the live ``rows`` stay, reordered by ``index`` (the storage's): dropped, or kept dead after them."""
        self.lengths = [self.lengths[i] for i in rows]
        if drops_rows:
            self.mask = self.mask[index] if self.mask is not None else None
            self.bucket = len(rows)
            return
        mask = self.mask if self.mask is not None else torch.ones(self.bucket, columns, dtype=torch.bool,
                                                                 device=index.device)
        self.mask = mask[index]
        self.mask[len(rows):] = False
        self.mask[len(rows):, 0] = True

    def compaction(self, columns: int, full: bool) -> torch.Tensor | None:
        """Where holes fill half the cache (or, ``full``, any): each row's real columns, in order, right-aligned
        (``[bucket, longest]``: the columns to gather); the mask becomes theirs. None: nothing to squeeze."""
        if self.mask is None or (not full and columns < 2 * max(self.lengths) + 16):
            return None
        order = torch.sort(self.mask.int(), dim=1, stable=True).indices  # [bucket, columns]: holes first
        index = order[:, -max(self.lengths):]  # [bucket, longest]
        self.mask = torch.gather(self.mask, 1, index)
        if bool(self.mask.all()):
            self.mask = None
        return index


class BatchCache:
    """The target's KV cache for a batch of rows of different lengths: where the tensors live (:class:`GrowingStorage`,
    or :class:`StaticStorage` over a ``StaticCache`` handed in) and which columns hold each row's tokens
    (:class:`RowLayout`). Holes are squeezed out (:meth:`compact`) once they are half the cache, or a static cache
    is full. A static cache has ``bucket`` rows (a power of two, so that batches of similar size share compiled
    steps), and with more than one row (or ``always_masked``: a draft of trees, whose paths leave holes) it always
    passes the mask and position ids. ``step``, when set, runs the forward passes after the prefill (a compiled
    forward: :mod:`specdraft_eval.engine.graphs`).
    """

    def __init__(self, rows: int, static: Cache | None = None, bucket: int | None = None) -> None:
        self.storage = GrowingStorage() if static is None else StaticStorage(static)
        bucket = rows if static is None else (bucket or rows)
        self.rows = RowLayout(rows, bucket, always_masked=static is not None and bucket > 1)
        self.step: Callable | None = None
        self._appended: list[int] = []  # tokens each row fed in the last forward pass
        self._held = False  # between mark and restore: no compaction (the mark's columns stay where they are)

    @property
    def cache(self) -> Cache:
        return self.storage.cache

    @property
    def capacity(self) -> int | None:
        """Usable positions of a static cache; None: a growing one."""
        return self.storage.capacity

    @property
    def columns(self) -> int:
        return length(self.cache)

    @property
    def lengths(self) -> list[int]:
        return self.rows.lengths

    @property
    def bucket(self) -> int:
        return self.rows.bucket

    @property
    def mask(self) -> torch.Tensor | None:
        return self.rows.mask

    @property
    def always_masked(self) -> bool:
        return self.rows.always_masked

    @always_masked.setter
    def always_masked(self, value: bool) -> None:
        self.rows.always_masked = value

    def forward(self, model, tokens: list[list[int]], keep_logits: int, reach: int = 0,
                trees: list[list[int]] | None = None, layout: StepLayout | None = None) -> torch.Tensor:
        """Append each live row's ``tokens`` (rows may differ in length) and return the last ``keep_logits`` logits of
        each row's block, ``[rows, keep_logits, vocab]``. ``trees``: per row, a token tree's parent columns;
        ``layout``: what the new columns see of the past and their positions (:meth:`RowLayout.inputs`). Follow with
        :meth:`keep`. A compiled step attends over ``reach`` positions at least (:meth:`StaticStorage.reach`); a
        tree's mask spans the same."""
        live, width = len(tokens), max(len(row) for row in tokens)
        tokens = tokens + [[]] * (self.rows.bucket - live)  # dead rows feed nothing
        if self.capacity is not None and self.columns + width > self.capacity:
            self.compact(full=True)
            if self.columns + width > self.capacity:
                raise SpecdecError(f"static KV cache of {self.capacity} positions is full: a bug, please report it")
        start = self.columns
        keys = self.storage.reach(start + width, self.step is not None, reach)  # what attention reads
        ids, attention, position_ids = self.rows.inputs(tokens, start, keys, model, trees, self.storage.widen, layout)
        self.storage.attend(keys)
        with real_tokens_only(self.step or model, [len(row) for row in tokens], width), \
                grouped_queries(width, attention is not None and self.step is None):  # (compiled: as traced)
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
        most = max((columns[-1] + 1 for columns in kept if columns), default=0)
        rollback(self.cache, self.columns - max(self._appended) + most)
        device = self.rows.mask.device if self.rows.mask is not None else self.cache.layers[0].keys.device
        self.rows.keep(kept, self.columns, device)
        self.compact()

    def mark(self) -> CacheMark:
        """Where the cache stands, to :meth:`restore` after a draft's own passes (no compaction in between)."""
        mask = self.rows.mask.clone() if self.rows.mask is not None else None
        self._held = True
        return CacheMark(self.columns, mask, list(self.rows.lengths))

    def restore(self, mark: CacheMark, kept: list[int] | None = None) -> None:
        """Drop the columns appended since ``mark`` (of the same live rows: :meth:`CacheMark.select` follows rows that
        left), but live row i's first ``kept[i]`` (a draft's chain: every column appended since is each drafting
        row's own, one per pass)."""
        most = max(kept, default=0) if kept else 0
        rollback(self.cache, mark.columns + most)
        if most:
            mask, device = self.rows.mask, self.cache.layers[0].keys.device
            region = (mask[:, mark.columns: mark.columns + most].clone() if mask is not None
                      else torch.ones(self.rows.bucket, most, dtype=torch.bool, device=device))
            for row, count in enumerate(kept):
                region[row, count:] = False
            past = mark.mask if mark.mask is not None else torch.ones(self.rows.bucket, mark.columns, dtype=torch.bool,
                                                                      device=region.device)
            self.rows.mask = torch.cat([past, region], dim=1)
            self.rows.lengths = [length + count for length, count in zip(mark.lengths, kept, strict=True)]
        else:
            self.rows.mask, self.rows.lengths = mark.mask, list(mark.lengths)
        self._held = False

    def rollback(self, length: int) -> None:
        """A batch of one without holes: drop cached positions past ``length``."""
        if self.rows.mask is not None or self.rows.bucket != 1:
            raise ValueError("rollback is for a batch of one row without holes")
        rollback(self.cache, length)
        self.rows.lengths = [min(self.rows.lengths[0], length)]

    def select(self, rows: list[int]) -> None:
        """Keep only the live ``rows`` (the others have finished): a growing cache drops the others, a static one
        moves the kept rows first, in place, and the others become dead."""
        attend(self.cache, None)
        index = self.storage.select(rows, self.rows.bucket)
        self.rows.select(rows, index, self.columns, drops_rows=self.capacity is None)
        self.compact()

    def compact(self, full: bool = False) -> None:
        """Squeeze out holes once they fill half the cache (or, ``full``, now); never between mark and restore."""
        if self._held:
            return
        columns = self.columns
        index = self.rows.compaction(columns, full)
        if index is None:
            return
        attend(self.cache, None)
        self.storage.gather(index, columns)
        rollback(self.cache, index.shape[1])
