"""Speculative generation over Hugging Face causal LMs, one prompt or a batch, and its autoregressive twin.

Invariant of the loop: the target's KV cache holds every token of each row but the last one emitted, so a
verification step feeds ``[last, d1..dk]`` per row and reads k+1 next-token distributions at once.
Greedy decoding accepts the longest prefix of the draft that matches the target's argmax; sampling uses
rejection sampling (Leviathan et al. 2023; Chen et al. 2023), so output follows the target's distribution.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import torch

from specdraft_eval import graphs, kv
from specdraft_eval.drafts.base import Drafter, NoFeedback, Proposal
from specdraft_eval.errors import SpecdecError
from specdraft_eval.gamma import GammaController
from specdraft_eval.sampling import Sampler, make_generator
from specdraft_eval.stats import GenerationStats
from specdraft_eval.taps import FeatureTap

StopCheck = Callable[[list[int]], bool]
"""Called with the tokens generated so far; True ends generation (lm-eval's stop sequences)."""


def clock(device: torch.device) -> float:
    """Seconds, after waiting for the device's queued work (the one clock for every timing)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def _prompt_list(input_ids) -> list[int]:
    if isinstance(input_ids, torch.Tensor):
        if input_ids.dim() == 2:
            if input_ids.shape[0] != 1:
                raise SpecdecError(f"input_ids has batch size {input_ids.shape[0]}: call once per row")
            input_ids = input_ids[0]
        input_ids = input_ids.tolist()
    prompt = [int(t) for t in input_ids]
    if not prompt:
        raise SpecdecError("empty prompt: give at least one input token (e.g. the BOS token)")
    return prompt


def _check_context(target, prompt: list[int], max_new_tokens: int) -> list[int]:
    limit = getattr(target.config, "max_position_embeddings", None)
    if limit is not None and len(prompt) + max_new_tokens > limit:
        raise SpecdecError(
            f"prompt of {len(prompt)} tokens plus max_new_tokens={max_new_tokens} exceeds the target's context of "
            f"{limit} tokens: shorten the prompt or generate fewer tokens"
        )
    return prompt


@dataclass(frozen=True)
class DecodeParams:
    """One generation request's settings, as transformers' ``GenerationConfig`` or vLLM's ``SamplingParams``:
    the token budget, γ (or dynamic γ), sampling, the seed and EOS. Every engine entry point takes it after
    ``(target, draft, prompts)``; per-row stop checks and a shared γ controller are keyword arguments beside it."""

    max_new_tokens: int
    num_draft_tokens: int = 4
    dynamic_gamma: bool = False
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    eos_token_id: int | Sequence[int] | None = None
    static_cache: bool = False  # the target's and model drafts' KV caches preallocated to the request's budget
    compile: bool = False  # the target's decode and verification steps compiled (CUDA graphs on a GPU); implies
    # static_cache, which __post_init__ sets

    def __post_init__(self) -> None:
        if self.compile:
            object.__setattr__(self, "static_cache", True)  # compiled steps need fixed tensor addresses
        gamma = self.num_draft_tokens
        if not isinstance(gamma, int) or isinstance(gamma, bool) or gamma < 1:
            raise SpecdecError(f"num_draft_tokens must be an integer >= 1 (got {gamma!r})")
        if self.max_new_tokens < 0:
            raise SpecdecError(f"max_new_tokens must be >= 0 (got {self.max_new_tokens})")
        Sampler(self.do_sample, self.temperature, self.top_k, self.top_p)  # one-line errors for bad sampling

    @classmethod
    def of(cls, params: DecodeParams | int | None, **settings) -> DecodeParams:
        """``params`` itself (with ``settings`` replaced), or the request that the token budget and ``settings``
        (fields as keywords, ``max_new_tokens`` among them when no budget is given) name."""
        if isinstance(params, DecodeParams):
            return replace(params, **settings) if settings else params
        return cls(**settings) if params is None else cls(params, **settings)

    def sampler(self, device: torch.device) -> Sampler:
        """A sampler with a generator of its own, seeded with ``seed`` (each row of a batch gets one)."""
        return Sampler(self.do_sample, self.temperature, self.top_k, self.top_p, make_generator(self.seed, device))

    def eos(self, target) -> set[int]:
        """EOS ids: ``eos_token_id``, else the target's generation config's."""
        eos = self.eos_token_id
        if eos is None:
            eos = getattr(target.generation_config, "eos_token_id", None)
        if eos is None:
            return set()
        return {int(eos)} if isinstance(eos, int) else {int(t) for t in eos}


def _verify(logits: torch.Tensor, proposal: Proposal, sampler: Sampler) -> tuple[int, int]:
    """Return (accepted draft tokens, the target's next token after them)."""
    drafted = proposal.tokens
    if not sampler.do_sample:
        choice = logits.argmax(-1).tolist()
        n = 0
        while n < len(drafted) and drafted[n] == choice[n]:
            n += 1
        return n, choice[n]
    p = sampler.probs(logits)
    for i, token in enumerate(drafted):
        q_token = float(proposal.probs[i, token]) if proposal.probs is not None else 1.0
        if sampler.uniform(p.device) * q_token < float(p[i, token]):
            continue  # accepted with probability min(1, p/q)
        residual = p[i].clone()
        if proposal.probs is None:
            residual[token] = 0.0
        else:
            q = proposal.probs[i].to(residual.dtype)
            q = torch.nn.functional.pad(q, (0, residual.shape[-1] - q.shape[-1]))
            residual = (residual - q).clamp_min_(0.0)
        total = residual.sum()
        residual = residual / total if total > 0 else p[i]
        return i, int(sampler.sample(residual[None]))
    return len(drafted), int(sampler.sample(p[len(drafted)][None]))


class BatchCache:
    """The target's KV cache for a batch of rows of different lengths: one transformers cache over all rows,
    growing (``DynamicCache``) or, given a ``capacity``, static (``StaticCache``: preallocated, so no tensor
    changes shape from step to step; rollback moves its length).

    A row may hold *holes*: columns of padding, or of draft tokens its verification rejected while another row's
    were accepted, that stay in the cache but are masked out of attention. ``lengths`` keeps each row's true
    length (its real columns), which gives the position ids of what it feeds next; ``mask`` is None while no row
    has a hole, so a batch of one runs exactly as an unpadded, unmasked forward pass. Holes are squeezed out
    (:meth:`compact`) once they are half the cache. ``step``, when set, runs the forward passes after the prefill
    (a compiled forward: :mod:`specdraft_eval.graphs`).
    """

    def __init__(self, rows: int, config=None, capacity: int | None = None) -> None:
        self.cache = kv.new_cache(config, capacity)
        self.capacity = capacity
        self.mask: torch.Tensor | None = None  # [rows, columns] bool: True where a column holds a real token
        self.lengths = [0] * rows  # real columns per row
        self.step: Callable | None = None
        self._appended: list[int] = []  # tokens each row fed in the last forward pass

    @property
    def columns(self) -> int:
        return kv.length(self.cache)

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
        kv.rollback(self.cache, self.columns - max(self._appended) + most)
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
        kv.rollback(self.cache, length)
        self.lengths = [min(self.lengths[0], length)]

    def select(self, rows: list[int]) -> None:
        """Keep only ``rows`` (the others have finished)."""
        index = torch.tensor(rows, dtype=torch.long, device=self.cache.layers[0].keys.device)
        kv.select_rows(self.cache, index)
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
        kv.rollback(self.cache, longest)
        if bool(self.mask.all()):
            self.mask = None


def verify_step(target, cache: BatchCache, tokens: list[list[int]], proposals: list[Proposal],
                samplers: list[Sampler]) -> list[tuple[int, int]]:
    """One verification of every row: run ``[last, *drafted]`` through the target on top of ``cache`` (which holds
    all of each row's ``tokens`` but the last), accept, and drop the rejected columns. Returns, per row, (accepted
    draft tokens, the target's next token). ``zoo profile`` times exactly this call."""
    width = 1 + max(len(p.tokens) for p in proposals)
    logits = cache.forward(target, [[row[-1], *p.tokens] for row, p in zip(tokens, proposals, strict=True)],
                           width)  # [rows, width, vocab]
    verdicts = [_verify(logits[i, : len(p.tokens) + 1], p, sampler)
                for i, (p, sampler) in enumerate(zip(proposals, samplers, strict=True))]
    cache.keep([accepted + 1 for accepted, _ in verdicts])
    return verdicts


def _finish(tokens: list[int], eos: set[int], max_new_tokens: int) -> tuple[list[int], bool]:
    """Cut at the first EOS (kept) and at the budget; say whether generation is over."""
    for i, token in enumerate(tokens[:max_new_tokens]):
        if token in eos:
            return tokens[: i + 1], True
    return tokens[:max_new_tokens], len(tokens) >= max_new_tokens


def prefill(target, prompts: list[list[int]], capacity: int | None = None) -> BatchCache:
    """The target's cache over every prompt but its last token (the first step feeds that one); static with
    ``capacity`` positions when given."""
    cache = BatchCache(len(prompts), target.config, capacity)
    if any(len(prompt) > 1 for prompt in prompts):
        cache.forward(target, [prompt[:-1] for prompt in prompts], 1)
        cache.keep([len(prompt) - 1 for prompt in prompts])
    return cache


class _NoDraft(NoFeedback):
    """Proposes nothing: the loop then decodes autoregressively, one target token per step."""

    name = "none"
    model = None

    def propose(self, tokens: list[int], num_tokens: int, sampler: Sampler) -> Proposal:
        return Proposal([])

    def reset(self, capacity: int | None = None) -> None:
        pass

    def fork(self) -> _NoDraft:
        return self


@dataclass
class _Row:
    """One request in a batch: what it has produced and how it drafts, samples and stops."""

    index: int
    prompt: list[int]
    drafter: Drafter
    sampler: Sampler
    stop: StopCheck | None
    new: list[int] = field(default_factory=list)
    stats: GenerationStats = field(default_factory=GenerationStats)


def _steps(target, cache: BatchCache, rows: list[_Row], params: DecodeParams, controller: GammaController | None,
           tap: FeatureTap | None) -> tuple[list[_Row], float, float]:
    """Draft per row, verify all rows in one target pass, hand each row's draft the target's features of what it
    kept, until every row has finished. Returns the finished rows and the draft and verification seconds."""
    device, eos, max_new_tokens = target.device, params.eos(target), params.max_new_tokens
    finished: list[_Row] = []
    draft_seconds = verify_seconds = 0.0
    while rows:
        t0 = clock(device)
        gamma = controller.gamma if controller else params.num_draft_tokens
        proposals = []
        for row in rows:
            budget = min(gamma, max_new_tokens - len(row.new) - 1)
            tokens = row.prompt + row.new
            proposals.append(row.drafter.propose(tokens, budget, row.sampler) if budget > 0 else Proposal([]))
        t1 = clock(device)
        verdicts = verify_step(target, cache, [row.prompt + row.new for row in rows], proposals,
                               [row.sampler for row in rows])
        t2 = clock(device)
        features = tap.take() if tap else None  # [rows, width, features]: the target's, for drafts that read them
        draft_seconds += t1 - t0
        verify_seconds += t2 - t1
        staying = []
        for position, (row, proposal, (accepted, next_token)) in enumerate(zip(rows, proposals, verdicts, strict=True)):
            row.stats.record_step(len(proposal.tokens), accepted)
            row.new, done = _finish(row.new + [*proposal.tokens[:accepted], next_token], eos, max_new_tokens)
            if features is not None:
                row.drafter.observe(features[position, : accepted + 1])
            if controller:
                controller.update(len(proposal.tokens), accepted, (t1 - t0) / len(rows), (t2 - t1) / len(rows))
            if done or (row.stop is not None and row.stop(row.new)):
                finished.append(row)
            else:
                staying.append(position)
        if len(staying) < len(rows):
            rows = [rows[i] for i in staying]
            if rows:
                cache.select(staying)
    return finished, draft_seconds, verify_seconds


def _decode(target, draft: Drafter, prompts: list[list[int]], params: DecodeParams, *, stops: list[StopCheck | None],
            controller: GammaController | None) -> tuple[list[list[int]], GenerationStats]:
    """The loop every generation runs: prefill all rows, then draft per row, verify all rows in one target pass,
    and let rows leave as they finish. Returns each row's new tokens and the batch's stats (counters summed over
    rows, times once for the batch)."""
    device, max_new_tokens = target.device, params.max_new_tokens
    largest_gamma = controller.max_gamma if controller else params.num_draft_tokens
    longest = max(map(len, prompts)) + max_new_tokens + largest_gamma  # the most positions a row can hold
    start = clock(device)
    # a static cache holds the longest row, and in a batch its holes until compaction (at twice the longest + 16)
    capacity = (longest if len(prompts) == 1 else 2 * longest + 16) if params.static_cache else None
    tap = FeatureTap(target, draft.taps) if draft.taps else None
    try:
        cache = prefill(target, prompts, capacity)
        prefilled = tap.take() if tap else None  # [rows, longest prompt - 1, features]
        if params.compile:
            cache.step = graphs.compiled(target)
        decode_start = clock(device)
        rows = [_Row(i, prompt, draft.fork() if len(prompts) > 1 else draft, params.sampler(device), stop)
                for i, (prompt, stop) in enumerate(zip(prompts, stops, strict=True))]
        for row in rows:
            row.drafter.reset(longest if params.static_cache else None)
            row.stats = GenerationStats(generations=1, prompt_tokens=len(row.prompt))
            if prefilled is not None:
                row.drafter.observe(prefilled[row.index, : len(row.prompt) - 1])
        finished, draft_seconds, verify_seconds = _steps(target, cache, rows, params, controller, tap)
    finally:
        if tap:
            tap.close()
    total = GenerationStats()
    for row in sorted(finished, key=lambda r: r.index):
        row.stats.generated_tokens = len(row.new)
        row.stats.end_request()
        total += row.stats
    total.prefill_seconds = decode_start - start
    total.draft_seconds, total.verify_seconds = draft_seconds, verify_seconds
    total.decode_seconds = clock(device) - decode_start
    return [row.new for row in sorted(finished, key=lambda r: r.index)], total


@torch.inference_mode()
def speculative_generate_batch(target, draft: Drafter, prompts: Sequence, params: DecodeParams | int | None = None, *,
                               stops: Sequence[StopCheck | None] | None = None,
                               gamma_controller: GammaController | None = None,
                               **settings) -> tuple[list[list[int]], GenerationStats]:
    """:func:`speculative_generate` for several prompts at once: one target pass verifies every row's draft, rows
    accept different numbers of tokens and leave when they finish (EOS, budget or their own ``stops`` check).
    Each row drafts with its own copy of ``draft``'s state and samples with its own generator seeded with
    ``params.seed``, so each row's output is what :func:`speculative_generate` gives for it alone (greedy: token
    for token). Returns each row's new tokens and the batch's stats (counters summed over rows, wall times once)."""
    params = DecodeParams.of(params, **settings)
    if not prompts:
        return [], GenerationStats()
    checked = [_check_context(target, _prompt_list(prompt), params.max_new_tokens) for prompt in prompts]
    if params.max_new_tokens == 0:
        return [[] for _ in prompts], GenerationStats(generations=len(prompts),
                                                       prompt_tokens=sum(len(c) for c in checked))
    controller = gamma_controller or (GammaController.around(params.num_draft_tokens) if params.dynamic_gamma else None)
    return _decode(target, draft, checked, params, stops=list(stops) if stops is not None else [None] * len(prompts),
                   controller=controller)


def speculative_generate(target, draft: Drafter, input_ids, params: DecodeParams | int | None = None, *,
                         stop: StopCheck | None = None, gamma_controller: GammaController | None = None,
                         **settings) -> tuple[list[int], GenerationStats]:
    """Generate up to ``max_new_tokens`` tokens after ``input_ids`` with ``target``, drafting with ``draft``.

    ``params`` is a :class:`DecodeParams`, or the token budget with its other fields as keywords
    (``speculative_generate(target, draft, ids, 64, num_draft_tokens=4)``). Returns the new token ids (ending at
    EOS if one was produced) and the run's :class:`GenerationStats`. ``dynamic_gamma`` lets
    :class:`~specdraft_eval.gamma.GammaController` choose γ each step (0 to 4×``num_draft_tokens``) from this
    generation's measured latencies and acceptance; pass the same ``gamma_controller`` to every generation of a
    run to let it learn from all of them (implies dynamic γ).
    """
    outputs, stats = speculative_generate_batch(target, draft, [_prompt_list(input_ids)], params, stops=[stop],
                                                 gamma_controller=gamma_controller, **settings)
    return outputs[0], stats


def autoregressive_generate_batch(target, prompts: Sequence, params: DecodeParams | int | None = None, *,
                                  stops: Sequence[StopCheck | None] | None = None,
                                  **settings) -> tuple[list[list[int]], GenerationStats]:
    """Plain token-by-token decoding of several prompts through the same loop, cache and timing path (the speedup
    baseline): the speculative loop with a draft that proposes nothing. Stats hold baseline tokens and seconds."""
    params = replace(DecodeParams.of(params, **settings), num_draft_tokens=1, dynamic_gamma=False)
    outputs, stats = speculative_generate_batch(target, _NoDraft(), prompts, params, stops=stops)
    return outputs, GenerationStats(baseline_tokens=stats.generated_tokens, baseline_seconds=stats.decode_seconds)


def autoregressive_generate(target, input_ids, params: DecodeParams | int | None = None, *,
                            stop: StopCheck | None = None, **settings) -> tuple[list[int], GenerationStats]:
    """Plain token-by-token decoding of one prompt (:func:`autoregressive_generate_batch` with one row)."""
    outputs, stats = autoregressive_generate_batch(target, [_prompt_list(input_ids)], params, stops=[stop], **settings)
    return outputs[0], stats


@torch.inference_mode()
def divergence(target, prompt: list[int], specdec: list[int], baseline: list[int]) -> dict | None:
    """Where two greedy decodings of ``prompt`` first differ, and by how much the target's logits there
    (one fresh forward pass over the common prefix) prefer the baseline's token over the speculative one:
    a margin near 0 is a near-tie that reduced precision can flip, a large one points at a bug."""
    index = next((i for i, (a, b) in enumerate(zip(specdec, baseline)) if a != b), min(len(specdec), len(baseline)))
    if index == len(baseline) or index == len(specdec):
        return None if index == len(baseline) else {"index": index, "specdec_token": None,
                                                     "baseline_token": baseline[index], "logit_margin": None}
    ids = torch.tensor([prompt + baseline[:index]], device=target.device)
    logits = target(ids).logits[0, -1].float()  # [vocab]
    return {"index": index, "specdec_token": specdec[index], "baseline_token": baseline[index],
            "logit_margin": round(float(logits[baseline[index]] - logits[specdec[index]]), 6)}

