"""A padded step's linear layers over its real tokens only (cf. vLLM's flattened batches, which hold no padding).

A batch step feeds every row as wide as its widest: a row that drafted nothing beside one that drafted four still
runs five columns through every linear layer, four of them padding that attention masks out. On the CPU the linear
layers are most of a step's time and grow with the tokens fed, so :func:`real_tokens_only` makes each linear layer of
the model (the attention and MLP projections, the output head) take the real tokens alone, gathered into one
``[tokens, in]`` matrix, and put its output back in place, zeros in the padding. Attention, norms and the cache keep
the padded ``[rows, width]`` layout. A real token's arithmetic is unchanged: the same weights, the same kernel, its
own row of the product.
"""

from __future__ import annotations

import weakref
from contextlib import contextmanager

import torch

from specdraft_eval.models.sharding import tensor_parallel

_HOOKED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> its _Gather
MOST_REAL = 0.75
"""Gather only where real tokens are at most this share of the step's columns: below it, the padding saved pays for
the gathers."""


class _Gather:
    """One model's hooks on its linear layers: idle (``index`` None) but while a padded step runs."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.index: torch.Tensor | None = None  # [real tokens]: positions in the step's flattened [rows * width]
        self.padded = 0  # rows * width
        self.lead: torch.Size = torch.Size()  # the gathered input's leading dimensions, for its output
        for module in model.modules():
            if isinstance(module, torch.nn.Linear) or hasattr(module, "packed"):
                module.register_forward_pre_hook(self.gather)
                module.register_forward_hook(self.scatter)

    def gather(self, module, args):
        x = args[0]
        if self.index is None or x.dim() < 2 or x.shape[:-1].numel() != self.padded:
            return None
        self.lead = x.shape[:-1]
        return (x.reshape(self.padded, x.shape[-1]).index_select(0, self.index), *args[1:])

    def scatter(self, module, args, output):
        if self.index is None or output.shape[0] != self.index.shape[0] or output.dim() != 2:
            return None
        whole = output.new_zeros(self.padded, output.shape[-1])
        return whole.index_copy_(0, self.index, output).view(*self.lead, output.shape[-1])


@contextmanager
def real_tokens_only(model, lengths: list[int], width: int, shape: tuple[int, ...]):
    """While the block runs, ``model``'s linear layers see only the real tokens of a step whose rows fed ``lengths``
    tokens each, padded to ``width`` (``shape``: the step's input ids' ``[rows, width]``); their outputs come back in
    that shape, zeros in the padding. Does nothing where padding is a small share (:data:`MOST_REAL`), for a model
    that is not an ``nn.Module`` (a compiled step, a head's callable) or is sharded."""
    rows = shape[0]
    real = sum(lengths)
    if (not isinstance(model, torch.nn.Module) or real > MOST_REAL * rows * width or width == 1
            or tensor_parallel(model) > 1):
        yield
        return
    hooks = _HOOKED.get(model)
    if hooks is None:
        hooks = _HOOKED[model] = _Gather(model)
    hooks.index = torch.tensor([row * width + j for row, n in enumerate(lengths) for j in range(n)],
                               dtype=torch.long, device=model.device)
    hooks.padded = rows * width
    try:
        yield
    finally:
        hooks.index = None
