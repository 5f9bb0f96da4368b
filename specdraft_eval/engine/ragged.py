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

_LINEARS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> its linear layers (found once)
MOST_REAL = 0.75
"""Gather only where real tokens are at most this share of the step's columns: below it, the padding saved pays for
the gathers."""


class _Gather:
    """One padded step's hooks on a linear layer: its input's real rows gathered, its output put back in place."""

    def __init__(self, index: torch.Tensor, padded: int) -> None:
        self.index = index  # [real tokens]: positions in the step's flattened [rows * width]
        self.padded = padded  # rows * width
        self.lead: torch.Size = torch.Size()  # the gathered input's leading dimensions, for its output

    def gather(self, module, args):
        x = args[0]
        if x.dim() < 2 or x.shape[:-1].numel() != self.padded:
            return None
        self.lead = x.shape[:-1]
        return (x.reshape(self.padded, x.shape[-1]).index_select(0, self.index), *args[1:])

    def scatter(self, module, args, output):
        if output.shape[0] != self.index.shape[0] or output.dim() != 2:
            return None
        whole = output.new_zeros(self.padded, output.shape[-1])
        return whole.index_copy_(0, self.index, output).view(*self.lead, output.shape[-1])


@contextmanager
def real_tokens_only(model, lengths: list[int], width: int):
    """While the block runs, ``model``'s linear layers see only the real tokens of a step whose rows (dead ones
    included) fed ``lengths`` tokens each, padded to ``width``; their outputs come back in the padded shape, zeros in
    the padding. The hooks live for the block only (an idle hook would slow every later call of every linear layer:
    about 0.65 ms a forward pass of the 135M target; installing and removing them costs about 0.85 ms a padded
    step). Does nothing where padding is a small share (:data:`MOST_REAL`), for a model that is not an ``nn.Module`` (a
    compiled step, a head's callable) or is sharded."""
    rows = len(lengths)
    if (not isinstance(model, torch.nn.Module) or sum(lengths) > MOST_REAL * rows * width or width == 1
            or tensor_parallel(model) > 1):
        yield
        return
    hooks = _Gather(torch.tensor([row * width + j for row, n in enumerate(lengths) for j in range(n)],
                                 dtype=torch.long, device=model.device), rows * width)
    linears = _LINEARS.get(model)
    if linears is None:
        linears = _LINEARS[model] = [module for module in model.modules()
                                     if isinstance(module, torch.nn.Linear) or hasattr(module, "packed")]
    handles = [handle for module in linears for handle in (module.register_forward_pre_hook(hooks.gather, prepend=True),
                                                           module.register_forward_hook(hooks.scatter, prepend=True))]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
