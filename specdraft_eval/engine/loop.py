"""Speculative generation over Hugging Face causal LMs, one prompt or a batch, and its autoregressive twin.

Invariant of the loop: the target's KV cache holds every token of each row but the last one emitted, so a
verification step feeds ``[last, d1..dk]`` per row and reads k+1 next-token distributions at once.
Greedy decoding accepts the longest prefix of the draft that matches the target's argmax; sampling uses
rejection sampling (Leviathan et al. 2023; Chen et al. 2023), so output follows the target's distribution.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import torch
from torch.nn import Module

from specdraft_eval.engine import graphs, host
from specdraft_eval.engine.drafter import BatchDrafter, Drafter, DrafterBase, Proposal
from specdraft_eval.engine.gamma import GammaController
from specdraft_eval.engine.kv_cache import BatchCache
from specdraft_eval.engine.params import DecodeParams, FixedGamma, GammaPolicy, RunSettings, StopCheck, row_positions
from specdraft_eval.engine.sampling import Sampler
from specdraft_eval.engine.taps import FeatureTap
from specdraft_eval.engine.verify import verify_step
from specdraft_eval.errors import SpecdecError
from specdraft_eval.measure.stats import Divergence, GenerationStats
from specdraft_eval.measure.timers import clock


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


def _check_context(target_model: Module, prompt: list[int], max_new_tokens: int) -> list[int]:
    limit = getattr(target_model.config, "max_position_embeddings", None)
    if limit is not None and len(prompt) + max_new_tokens > limit:
        raise SpecdecError(
            f"prompt of {len(prompt)} tokens plus max_new_tokens={max_new_tokens} exceeds the target's context of "
            f"{limit} tokens: shorten the prompt or generate fewer tokens"
        )
    return prompt


def _finish(tokens: list[int], eos: set[int], max_new_tokens: int, stop: StopCheck | None) -> tuple[list[int], bool]:
    """Cut at the first EOS (kept), at the budget and where ``stop`` says a stop sequence completes (kept); say
    whether generation is over."""
    for i, token in enumerate(tokens[:max_new_tokens]):
        if token in eos:
            tokens = tokens[: i + 1]
            break
    tokens = tokens[:max_new_tokens]
    done = len(tokens) >= max_new_tokens or bool(tokens) and tokens[-1] in eos
    end = stop(tokens) if stop is not None else None
    if end is not None:
        if isinstance(end, bool) or not isinstance(end, int) or not 1 <= end <= len(tokens):
            raise SpecdecError(f"a stop check returned {end!r} for {len(tokens)} tokens: it must return how many "
                               "tokens to keep (1..len) or None (see engine.params.StopCheck)")
        return tokens[:end], True
    return tokens, done


def _counted(proposal: Proposal, path: list[int], kept: int) -> tuple[int, int, int, tuple[int, int] | None]:
    """(drafted, accepted, depth, uncut) to count for a step that emitted ``len(path) + 1`` tokens of which the
    first ``kept`` stay (a stop cut the rest): all of it when nothing was cut past the accepted path; otherwise the
    step counts as if its draft had ended at depth ``kept - 1``, as a token budget would have cut it, the token that
    completes the stop being the step's own (its nodes up to that depth drafted, ``kept - 1`` accepted), and
    ``uncut`` keeps its whole (drafted, accepted) for the engines that count before their stop check."""
    if kept > len(path):
        return len(proposal.tokens), len(path), proposal.depth, None
    depth = kept - 1
    return sum(1 for d in proposal.depths if d <= depth), depth, depth, (len(proposal.tokens), len(path))


def prefill(target_model: Module, prompts: list[list[int]], cache: BatchCache | None = None) -> BatchCache:
    """Fill ``cache`` (default: a new growing one) with every prompt but its last token (the first step feeds
    that one); the prefill runs eagerly, whatever ``cache.step`` is."""
    cache = cache or BatchCache(len(prompts))
    if any(len(prompt) > 1 for prompt in prompts):
        cache.forward(target_model, [prompt[:-1] for prompt in prompts], 1)
        cache.keep([list(range(len(prompt) - 1)) for prompt in prompts])
    return cache


class NoDraft(DrafterBase):
    """Proposes nothing: the loop then decodes autoregressively, one target token per step."""

    name = "none"

    def propose(self, tokens: list[int], num_tokens: int, sampler: Sampler) -> Proposal:
        return Proposal([])


@dataclass
class _Row:
    """One request in a batch: what it has produced and how it samples and stops."""

    index: int
    prompt: list[int]
    sampler: Sampler
    stop: StopCheck | None
    new: list[int] = field(default_factory=list)
    stats: GenerationStats = field(default_factory=GenerationStats)
    behind: bool = True  # its draft has not read every token but the last: before its first draft, after γ = 0
    read: int = 0  # tokens of prompt + new when it last drafted (0: never, so catching up is its prompt's prefill,
    # not the cost of returning from γ = 0); the tokens since are what catching up reads


def _steps(target_model: Module, cache: BatchCache, rows: list[_Row], drafters: BatchDrafter, params: DecodeParams,
           controller: GammaController | FixedGamma, tap: FeatureTap | None,
           steps_as_vllm: bool = False) -> tuple[list[_Row], GenerationStats]:
    """Draft every row (one call), verify all rows in one target pass, hand the draft the target's features of what
    each row kept, until every row has finished. Returns the finished rows and the batch's draft, draft prefill (a
    draft catching up: :meth:`Drafter.ingest`) and verification seconds and its verification passes."""
    device, eos, max_new_tokens = target_model.device, params.eos(target_model), params.max_new_tokens
    finished: list[_Row] = []
    clocked = GenerationStats()
    started = clock(device)
    while rows:
        t0 = clock(device)
        tokens = [row.prompt + row.new for row in rows]
        prober = min(range(len(rows)), key=lambda i: len(tokens[i]) - rows[i].read)  # least to catch up on
        planned = zip(rows, controller.next_step(len(rows), prober), strict=True)
        budgets = ([gamma if row.new else 0 for row, gamma in planned] if steps_as_vllm  # (RunSettings.steps_as_vllm)
                   else [min(gamma, max_new_tokens - len(row.new) - 1) for row, gamma in planned])
        behind = [i for i, (row, budget) in enumerate(zip(rows, budgets, strict=True)) if budget > 0 and row.behind]
        catching_up, returning = 0.0, all(rows[i].read for i in behind)  # (not a prompt's prefill)
        if behind:
            start = clock(device)
            for i, read in zip(behind, drafters.ingest(tokens, behind), strict=True):
                rows[i].stats.draft_prefill_tokens += read
            catching_up = clock(device) - start
        for row, budget, row_tokens in zip(rows, budgets, tokens, strict=True):
            row.behind = budget <= 0
            if budget > 0:
                row.read = len(row_tokens)
        proposals = drafters.propose(tokens, budgets, [row.sampler for row in rows])
        t1 = clock(device)
        verdicts = verify_step(target_model, cache, tokens, proposals, [row.sampler for row in rows])
        t2 = clock(device)
        features = tap.take() if tap else None  # [rows, width, features]: the target's, for drafts that read them
        drafting = t1 - t0 - catching_up
        clocked.draft_seconds += drafting
        clocked.draft_prefill_seconds += catching_up
        clocked.verify_seconds += t2 - t1
        clocked.steps += 1
        controller.update([len(p.tokens) for p in proposals], [len(path) for path, _ in verdicts],
                          drafting + (catching_up if returning else 0.0), t2 - t1,  # returning costs its catch-up
                          asked=budgets)
        staying = []
        for position, (row, proposal, (path, next_token)) in enumerate(zip(rows, proposals, verdicts, strict=True)):
            emitted = [*(proposal.tokens[node] for node in path), next_token]
            before, whole = len(row.new), row.new + emitted
            cut, done = _finish(whole, eos, max_new_tokens, row.stop)
            kept = max(len(cut) - before, 1)  # a stop the check finds inside earlier steps' tokens: cut here
            row.new = whole[: before + kept]
            row.stats.overshoot_tokens += len(emitted) - kept
            row.stats.record_step(*_counted(proposal, path, kept))
            row.stats.draft_seconds += drafting / len(rows)  # its share of the batch's drafting
            row.stats.verify_seconds += t2 - t1  # the pass it waited for
            if features is not None:  # the root's and the accepted path's
                drafters.observe(position, features[position, [0, *(1 + node for node in path)]])
            if done:
                row.stats.decode_seconds = t2 - started  # until its last pass: no clock read (a GPU sync) per row
                finished.append(row)
            else:
                staying.append(position)
        if len(staying) < len(rows):
            drafters.see([row.prompt + row.new for row in rows],  # the finished rows' last step
                         [i for i in range(len(rows)) if i not in staying])
            rows = [rows[i] for i in staying]
            if rows:
                cache.select(staying)
                drafters.select(staying)
    return finished, clocked


def repeat_indices(prompts: Sequence[Sequence[int]]) -> list[int]:
    """Each prompt's repeat: how many earlier prompts of the list are the same request (0 for its first copy)."""
    seen: dict[tuple[int, ...], int] = {}
    repeats = []
    for prompt in prompts:
        key = tuple(prompt)
        repeats.append(seen.get(key, 0))
        seen[key] = repeats[-1] + 1
    return repeats


def _decode(target_model: Module, draft: Drafter, prompts: list[list[int]], params: DecodeParams, run: RunSettings, *,
            stops: list[StopCheck | None], controller: GammaController | FixedGamma, repeats: list[int]
            ) -> tuple[list[list[int]], GenerationStats]:
    """The loop every generation runs: prefill all rows, then draft every row, verify all rows in one target pass,
    and let rows leave as they finish. Returns each row's new tokens and the batch's stats (counters summed over
    rows, times, verification passes and host reads once for the batch)."""
    device = target_model.device
    longest = row_positions(max(map(len, prompts)), params.max_new_tokens, controller.max_num_draft_tokens)
    start = clock(device)
    static = None
    if run.static_cache:  # one shape for the run: the target's runtime, grown only when a request needs more
        static = graphs.static_caches(target_model, max(longest, run.capacity or 0) + 1, run.compile)
    tap = FeatureTap(target_model, draft.taps) if draft.taps else None
    try:
        cache = prefill(target_model, prompts, static.cache(len(prompts)) if static else None)
        cache.always_masked |= static is not None and draft.drafts_trees  # a tree's path leaves holes: one input form
        prefilled = tap.take() if tap else None  # [rows, longest prompt - 1, features]
        # before any timed step
        warm_up = (static.warm_up(cache, range(1, controller.max_num_draft_tokens + 2), draft.drafts_trees)
                   if static else 0.0)
        if tap:
            tap.take()  # the warm-up's features: nobody's
        cache.step = static.step if static else None
        decode_start = clock(device)
        compiles, reads = graphs.compiled_graphs(), host.reads()
        rows = [_Row(i, prompt, params.sampler(device, prompt, repeat), stop)
                for i, (prompt, stop, repeat) in enumerate(zip(prompts, stops, repeats, strict=True))]
        drafters = draft.batch_drafter(len(rows))
        drafters.reset(longest if run.static_cache else None)
        drafters.see([row.prompt for row in rows], list(range(len(rows))))
        for row in rows:
            row.stats = GenerationStats(generations=1, prompt_tokens=len(row.prompt))
            if prefilled is not None:
                drafters.observe(row.index, prefilled[row.index, : len(row.prompt) - 1])
        finished, clocked = _steps(target_model, cache, rows, drafters, params, controller, tap, run.steps_as_vllm)
    finally:
        if tap:
            tap.close()
    total = GenerationStats()
    for row in sorted(finished, key=lambda r: r.index):
        row.stats.generated_tokens = len(row.new)
        row.stats.end_request()
        total += row.stats
    total.per_request = [row.stats for row in sorted(finished, key=lambda r: r.index)]
    total.prefill_seconds = decode_start - start - warm_up
    total.compile_seconds, total.recompiles = warm_up, graphs.compiled_graphs() - compiles
    total.draft_seconds, total.verify_seconds = clocked.draft_seconds, clocked.verify_seconds
    total.draft_prefill_seconds = clocked.draft_prefill_seconds
    total.verify_passes, total.host_reads = clocked.steps, host.reads() - reads
    total.decode_seconds = clock(device) - decode_start
    return [row.new for row in sorted(finished, key=lambda r: r.index)], total


@torch.inference_mode()
def speculative_generate_batch(target_model: Module, draft: Drafter, prompts: Sequence,
                               params: DecodeParams | int | None = None, *,
                               run: RunSettings | None = None, stops: Sequence[StopCheck | None] | None = None,
                               gamma_controller: GammaController | None = None,
                               repeats: Sequence[int] | None = None,
                               **settings) -> tuple[list[list[int]], GenerationStats]:
    """:func:`speculative_generate` for several prompts at once: one target pass verifies every row's draft, rows
    accept different numbers of tokens and leave when they finish (EOS, budget or their own ``stops`` check).
    Each row drafts with its own copy of ``draft``'s state and samples from its own stream, seeded from
    ``params.seed``, its prompt and its repeat (``repeats``: which copy of its request each row is; default: how
    many earlier rows of this batch have the same prompt), so each row's output is what
    :func:`speculative_generate` gives for it alone (greedy: token for token; seeded sampling: draw for draw).
    Returns each row's new tokens and the batch's stats (counters summed over rows, wall times once).
    ``settings``: the request's fields and the run's (:meth:`RunSettings.of`) as keywords."""
    run = RunSettings.of(run, settings)
    params = DecodeParams.of(params, **settings)
    if not prompts:
        return [], GenerationStats()
    checked = [_check_context(target_model, _prompt_list(prompt), params.max_new_tokens) for prompt in prompts]
    if params.max_new_tokens == 0:
        alone = [GenerationStats(generations=1, prompt_tokens=len(c)) for c in checked]
        return [[] for _ in prompts], sum(alone, GenerationStats(per_request=alone))
    rows_stops = list(stops) if stops is not None else [None] * len(prompts)
    rows_repeats = list(repeats) if repeats is not None else repeat_indices(checked)
    return _decode(target_model, draft, checked, params, run, stops=rows_stops,
                   controller=gamma_controller or run.gamma.controller(), repeats=rows_repeats)


def speculative_generate(target_model: Module, draft: Drafter, input_ids, params: DecodeParams | int | None = None, *,
                         run: RunSettings | None = None, stop: StopCheck | None = None,
                         gamma_controller: GammaController | None = None, repeat: int = 0,
                         **settings) -> tuple[list[int], GenerationStats]:
    """Generate up to ``max_new_tokens`` tokens after ``input_ids`` with ``target``, drafting with ``draft``.

    ``params`` is a :class:`DecodeParams`, or the token budget with its other fields as keywords, beside the run's
    :class:`RunSettings` or its fields as keywords (``speculative_generate(target_model, draft, ids, 64,
    num_draft_tokens=4)``). Returns the new token ids (ending at EOS if one was produced) and the run's
    :class:`GenerationStats`. ``dynamic_gamma`` lets :class:`~specdraft_eval.engine.gamma.GammaController` choose γ each
    step (0 to 4×``num_draft_tokens``) from this generation's measured latencies and acceptance; pass the same
    ``gamma_controller`` to every generation of a run to let it learn from all of them (implies dynamic γ).
    With ``seed``, ``repeat`` picks the request's sample stream (0, 1, ...: distinct samples of one prompt).
    """
    outputs, stats = speculative_generate_batch(target_model, draft, [_prompt_list(input_ids)], params, run=run,
                                                 stops=[stop], gamma_controller=gamma_controller, repeats=[repeat],
                                                 **settings)
    return outputs[0], stats


def autoregressive_generate_batch(target_model: Module, prompts: Sequence, params: DecodeParams | int | None = None, *,
                                  run: RunSettings | None = None, stops: Sequence[StopCheck | None] | None = None,
                                  repeats: Sequence[int] | None = None,
                                  **settings) -> tuple[list[list[int]], GenerationStats]:
    """Plain token-by-token decoding of several prompts through the same loop, cache and timing path (the speedup
    baseline): the speculative loop with a draft that proposes nothing. Stats hold baseline tokens and seconds."""
    run = replace(RunSettings.of(run, settings), gamma=GammaPolicy(1))
    params = DecodeParams.of(params, **settings)
    outputs, stats = speculative_generate_batch(target_model, NoDraft(), prompts, params, run=run, stops=stops,
                                                repeats=repeats)
    return outputs, GenerationStats(baseline_tokens=stats.generated_tokens, baseline_seconds=stats.decode_seconds,
                                    baseline_prefill_seconds=stats.prefill_seconds,
                                    compile_seconds=stats.compile_seconds, recompiles=stats.recompiles,
                                    per_request=[GenerationStats(baseline_tokens=r.generated_tokens,
                                                                 baseline_seconds=r.decode_seconds)
                                                 for r in stats.per_request])


def autoregressive_generate(target_model: Module, input_ids, params: DecodeParams | int | None = None, *,
                            run: RunSettings | None = None, stop: StopCheck | None = None, repeat: int = 0,
                            **settings) -> tuple[list[int], GenerationStats]:
    """Plain token-by-token decoding of one prompt (:func:`autoregressive_generate_batch` with one row)."""
    outputs, stats = autoregressive_generate_batch(target_model, [_prompt_list(input_ids)], params, run=run,
                                                   stops=[stop], repeats=[repeat], **settings)
    return outputs[0], stats


@torch.inference_mode()
def divergence(target_model: Module, prompt: list[int], specdec: list[int], baseline: list[int]) -> Divergence | None:
    """Where two greedy decodings of ``prompt`` first differ, and by how much the target's logits there
    (one fresh forward pass over the common prefix) prefer the baseline's token over the speculative one:
    a margin near 0 is a near-tie that reduced precision can flip, a large one points at a bug."""
    index = next((i for i, (a, b) in enumerate(zip(specdec, baseline)) if a != b), min(len(specdec), len(baseline)))
    if index == len(baseline) or index == len(specdec):
        return None if index == len(baseline) else Divergence(index=index, baseline_token=baseline[index])
    ids = torch.tensor([prompt + baseline[:index]], device=target_model.device)
    logits = target_model(ids).logits[0, -1].float()  # [vocab]
    return Divergence(index=index, specdec_token=specdec[index], baseline_token=baseline[index],
                      logit_margin=round(float(logits[baseline[index]] - logits[specdec[index]]), 6))

