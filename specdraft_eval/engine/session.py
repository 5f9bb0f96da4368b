"""A run of many requests: one target, one drafter, one :class:`~specdraft_eval.engine.params.RunSettings`.

:class:`Session` is what the lm-eval wrapper and ``zoo bench --batch-size`` drive instead of the loop's entry points:
it runs each batch speculatively and, with ``baseline``, plainly too (the baseline first every other batch, so
neither side always runs on the warmer machine), checks greedy outputs against the baseline's token for token
(where they differ: the index and the target's logit margin), keeps each request's own figures, and sums the
statistics per task. Dynamic γ's controller belongs to the session: it learns over every request of the run.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from torch.nn import Module

from specdraft_eval.engine.drafter import Drafter
from specdraft_eval.engine.loop import autoregressive_generate_batch, divergence, speculative_generate_batch
from specdraft_eval.engine.params import DecodeParams, RunSettings, StopCheck
from specdraft_eval.measure.stats import Divergence, GenerationStats


@dataclass
class Batch:
    """One batch's result: each row's new tokens, the batch's statistics (the baseline's summed in), each row's own
    (speculative and baseline counters summed: :meth:`GenerationStats.request_figures` reads both) and the rows whose
    greedy output differs from the baseline's."""

    outputs: list[list[int]]
    stats: GenerationStats
    per_request: list[GenerationStats]
    divergences: list[Divergence] = field(default_factory=list)


class Alternation:
    """Which side of a speedup runs first, alternating batch by batch (neither always runs on the warmer machine);
    sessions sharing one alternate together (``draft=auto``'s contenders, each decoding a batch in turn)."""

    def __init__(self, plain_first: bool = False) -> None:
        self.plain_first = plain_first  # the next batch's order

    def next(self) -> bool:
        """Whether the next batch decodes plainly first (and flip for the one after)."""
        first, self.plain_first = self.plain_first, not self.plain_first
        return first


class Session:
    """Runs requests for one target and drafter under one run's settings, with the baseline and its check."""

    def __init__(self, target_model: Module, drafter: Drafter, run: RunSettings = RunSettings(), baseline: bool = False,
                 baseline_first: bool = False, order: Alternation | None = None) -> None:
        self.target_model, self.drafter, self.run, self.baseline = target_model, drafter, run, baseline
        self.controller = run.gamma.controller()  # learns about the draft over the whole run
        self.stats: dict[str, GenerationStats] = defaultdict(GenerationStats)
        self.divergences: list[Divergence] = []
        self.batches = 0
        # the order of the sides, alternating from the first batch's (``baseline_first``), or shared with other
        # sessions (``order``): a caller running many one-batch sessions alternates it across them
        self.order = order or Alternation(baseline_first)

    def generate(self, prompts: list[list[int]], params: DecodeParams,
                 stops: Callable[[], list[StopCheck | None]] | None = None, task: str = "default",
                 repeats: list[int] | None = None) -> Batch:
        """Generate every prompt of one batch. ``stops`` makes each row's stop checks (called once per side: a check
        serves one generation); ``repeats``: which copy of its request each row is (its sample stream, the same on
        both sides; default: the engine's count within the batch)."""
        def speculate():
            return speculative_generate_batch(self.target_model, self.drafter, prompts, params, run=self.run,
                                              stops=stops() if stops else None, gamma_controller=self.controller,
                                              repeats=repeats)

        def plain():
            return autoregressive_generate_batch(self.target_model, prompts, params, run=self.run,
                                                 stops=stops() if stops else None, repeats=repeats)

        self.batches += 1
        if self.baseline and self.order.next():
            (references, base), (outputs, stats) = plain(), speculate()
        else:
            outputs, stats = speculate()
            references, base = plain() if self.baseline else (None, None)
        per_request = list(stats.per_request)
        stats = replace(stats, per_request=[])
        found = []
        if self.baseline:
            per_request = [alone + mine for alone, mine in zip(per_request, base.per_request, strict=True)]
            stats = stats + replace(base, per_request=[])
            for prompt, new, reference in zip(prompts, outputs, references, strict=True):
                if not params.do_sample and new != reference:  # both are cut where the stop sequence completes
                    stats.baseline_mismatches += 1
                    where = divergence(self.target_model, prompt, new, reference) or Divergence()
                    found.append(replace(where, task=task))
        self.divergences += found
        self.stats[task] += stats
        return Batch(outputs, stats, per_request, found)
