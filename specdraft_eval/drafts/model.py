"""A draft that is a causal LM with its own KV cache: a separate small model or a layer view."""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch

from specdraft_eval.engine import host, kv_cache
from specdraft_eval.engine.drafter import DrafterBase, Proposal
from specdraft_eval.engine.kv_cache import BatchCache
from specdraft_eval.engine.sampling import Sampler
from specdraft_eval.errors import SpecdecError

DRAFT_VOCAB_FILE = "draft_vocab.json"
"""In a draft directory: the token ids its reduced output head covers (``zoo prune --vocab-top K``)."""


def choose(logits: torch.Tensor, samplers: list[Sampler], ids: torch.Tensor | None,
           vocab_size: int, drawing: list[bool] | None = None) -> tuple[list[int], torch.Tensor | None]:
    """Each row's drafted token id (one host read for all rows) and, when sampling, its distribution over the
    target's ``vocab_size`` tokens (``[rows, vocab_size]``); ``logits`` ``[rows, head vocabulary]``, over the reduced
    head's token ``ids`` when given (zero probability elsewhere). Row i samples with ``samplers[i]``'s generator
    where ``drawing[i]`` (default: every row); a row past its own budget takes the argmax and draws nothing, so that
    its stream is what it would be alone."""
    if not samplers[0].do_sample:
        index = logits.argmax(-1)
        return host.read(ids[index] if ids is not None else index), None
    probs = samplers[0].probs(logits)  # [rows, head vocabulary]
    drawing = drawing or [True] * len(samplers)
    index = torch.stack([sampler.sample(probs[i: i + 1])[0] if draws else probs[i].argmax()
                         for i, (sampler, draws) in enumerate(zip(samplers, drawing, strict=True))])
    if ids is None:
        return host.read(index), probs
    full = torch.zeros(len(samplers), vocab_size, dtype=probs.dtype, device=probs.device)
    full[:, ids] = probs
    return host.read(ids[index]), full


def draft_chains(logits: torch.Tensor, budgets: list[int], samplers: list[Sampler], ids: torch.Tensor | None,
                 vocab_size: int, advance: Callable[[list[int]], torch.Tensor]) -> list[Proposal]:
    """Each row's chain of ``budgets[row]`` tokens, drafted autoregressively for all rows at once (as deep as the
    largest budget; a row draws samples for its own budget only, then is cut there): :func:`choose` from ``logits``
    (``[rows, head vocabulary]``), then ``advance(chosen)`` runs the draft one position further and gives the next
    logits (not called after the last)."""
    chains: list[list[int]] = [[] for _ in samplers]
    probs: list[torch.Tensor] = []  # per position: [rows, vocab]
    depth = max(budgets)
    for i in range(depth):
        chosen, distribution = choose(logits, samplers, ids, vocab_size, [i < budget for budget in budgets])
        for chain, token in zip(chains, chosen, strict=True):
            chain.append(token)
        if distribution is not None:
            probs.append(distribution)
        if i + 1 < depth:
            logits = advance(chosen)
    stacked = torch.stack(probs, 1) if probs else None  # [rows, depth, vocab]
    return [Proposal(chain[:budget], None if stacked is None else stacked[j, :budget])
            for j, (chain, budget) in enumerate(zip(chains, budgets, strict=True))]


class ModelDrafter(DrafterBase):
    """Drafts autoregressively with ``model``; keeps its cache across steps and rolls it back.

    ``vocab_size`` is the target's: logits beyond it (padding rows of a larger head) are never drafted.
    ``token_ids`` gives the draft a reduced output head over just those tokens (draft-side only: it
    proposes only them, and its distribution is zero elsewhere, which verification handles exactly).
    """

    def __init__(self, model, name: str, vocab_size: int, token_ids: list[int] | None = None) -> None:
        self.model, self.name, self.vocab_size = model, name, vocab_size
        self._ids = None
        if token_ids is not None:
            if not token_ids or min(token_ids) < 0 or max(token_ids) >= vocab_size:
                raise SpecdecError(f"draft {name!r}: its reduced head's token ids must lie in 0..{vocab_size - 1}")
            self._ids = torch.tensor(sorted(set(token_ids)), dtype=torch.long, device=model.device)
            full = model.get_output_embeddings()
            head = torch.nn.Linear(full.in_features, len(self._ids), bias=full.bias is not None)
            head.weight = torch.nn.Parameter(full.weight.detach()[self._ids].clone(), requires_grad=False)
            if full.bias is not None:
                head.bias = torch.nn.Parameter(full.bias.detach()[self._ids].clone(), requires_grad=False)
            model.lm_head = head.to(full.weight.device, full.weight.dtype)
        self._alone = ModelBatchDrafter(self, 1)

    @property
    def reduced_head(self) -> bool:
        """Whether the draft's output head covers only some token ids (``zoo prune --vocab-top``)."""
        return self._ids is not None

    def reset(self, capacity: int | None = None) -> None:
        self._alone.reset(capacity)

    def fork(self) -> ModelDrafter:
        """The same model, a cache of its own."""
        twin = copy.copy(self)
        twin._alone = ModelBatchDrafter(twin, 1)
        return twin

    def batch_drafter(self, count: int) -> ModelBatchDrafter:
        return ModelBatchDrafter(self, count)

    def ingest(self, tokens: list[int]) -> int:
        return self._alone.ingest([tokens], [0])[0]

    def propose(self, tokens: list[int], num_tokens: int, sampler: Sampler) -> Proposal:
        return self._alone.propose([tokens], [num_tokens], [sampler])[0]


class ModelBatchDrafter:
    """:class:`~specdraft_eval.engine.drafter.BatchDrafter` for a draft model: every row's tokens in one batched KV
    cache (holes where rows fed fewer) and one forward per drafted position for every drafting row. A row's drafted
    tokens stay in the cache until the next step shows which the target accepted (its common prefix with the
    sequence); the rest are dropped then."""

    def __init__(self, drafter: ModelDrafter, count: int) -> None:
        self.drafter, self.count = drafter, count
        self.reset()

    def reset(self, capacity: int | None = None) -> None:
        """Forget every row (the draft's cache grows: its passes are not compiled, ``capacity`` is not needed)."""
        self.cache = BatchCache(self.count)
        self.cached: list[list[int]] = [[] for _ in range(self.count)]  # each row's tokens in the cache, in order
        self.mark: kv_cache.CacheMark | None = None  # before the last draft's own tokens, while their fate is open
        self.own = [0] * self.count  # each row's drafted tokens in the cache since the mark

    def select(self, rows: list[int]) -> None:
        if any(self.cached):
            self.cache.select(rows)
        else:  # nothing in the draft's cache yet
            self.cache = BatchCache(len(rows))
        self.mark = self.mark.select(rows) if self.mark is not None else None
        self.count, self.cached, self.own = len(rows), [self.cached[r] for r in rows], [self.own[r] for r in rows]

    def see(self, tokens: list[list[int]], rows: list[int]) -> None:
        """Nothing kept of what the run generates: the cache follows the rows through propose and observe."""

    def observe(self, row: int, features: torch.Tensor) -> None:
        """A model draft reads no features."""

    def _settle(self, tokens: list[list[int]]) -> None:
        """Keep each row's drafted tokens the target accepted (those it has in common with ``tokens``, always
        feeding at least the last token again), drop the rest."""
        prefixes = []
        for row, sequence in enumerate(tokens):
            cached, limit, n = self.cached[row], min(len(self.cached[row]), len(sequence) - 1), 0
            while n < limit and cached[n] == sequence[n]:
                n += 1
            prefixes.append(n)
        if self.mark is not None:
            kept = [min(max(n - length, 0), own) for n, length, own in zip(prefixes, self.mark.lengths, self.own,
                                                                          strict=True)]
            self.cache.restore(self.mark, kept)
            self.mark, self.own = None, [0] * self.count
            self.cached = [cached[:n] for cached, n in zip(self.cached, self.cache.lengths, strict=True)]
        for row, n in enumerate(prefixes):
            if n < len(self.cached[row]):  # the same step again (a probe timing it): a lone row rolls back
                self.cache.rollback(n)
                self.cached[row] = self.cached[row][:n]

    def _feed(self, feeding: list[list[int]]) -> torch.Tensor:
        """Append each row's ``feeding`` tokens (rows that feed nothing: []) and keep them; each row's logits at
        its last one, ``[rows, head vocabulary]``."""
        width = max(map(len, feeding))
        logits = self.cache.forward(self.drafter.model, feeding, width)  # [rows, width, head vocabulary]
        self.cache.keep([list(range(len(row))) for row in feeding])
        for row, tokens in enumerate(feeding):
            self.cached[row] += tokens
        last = logits[torch.arange(self.count), torch.tensor([max(len(row) - 1, 0) for row in feeding])]
        return last if self.drafter._ids is not None else last[:, : self.drafter.vocab_size]

    def ingest(self, tokens: list[list[int]], rows: list[int]) -> list[int]:
        self._settle(tokens)
        feeding = [tokens[row][len(self.cached[row]): -1] if row in rows else [] for row in range(self.count)]
        if any(feeding):
            self._feed(feeding)
        return [len(feeding[row]) for row in rows]

    def propose(self, tokens: list[list[int]], budgets: list[int], samplers: list[Sampler]) -> list[Proposal]:
        self._settle(tokens)
        drafting = [row for row, budget in enumerate(budgets) if budget > 0]
        proposals = [Proposal([]) for _ in tokens]
        if not drafting:
            return proposals
        logits = self._feed([tokens[row][len(self.cached[row]):] if row in drafting else []
                             for row in range(self.count)])[drafting]
        drafter = self.drafter
        self.mark = self.cache.mark()

        def advance(chosen: list[int]) -> torch.Tensor:
            feeding: list[list[int]] = [[] for _ in range(self.count)]
            for j, row in enumerate(drafting):
                feeding[row] = [chosen[j]]
                self.own[row] += 1
            return self._feed(feeding)[drafting]

        drafted = draft_chains(logits, [budgets[row] for row in drafting], [samplers[row] for row in drafting],
                               drafter._ids, drafter.vocab_size, advance)
        for row, proposal in zip(drafting, drafted, strict=True):
            proposals[row] = proposal
        return proposals
