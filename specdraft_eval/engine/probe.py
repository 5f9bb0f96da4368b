"""One request's steps taken apart for timing: what ``zoo profile`` (:func:`zoo.measure.timing.engine_latency`) and
``scripts/gpu_check.py`` measure, on the engine's own prefill, cache, verification, feature taps and clock.

A :class:`StepProbe` prefills the target (on a growing cache, or a static runtime's, warmed up and compiled as a run
would be), feeds every drafter what the engine feeds it (``reset``, the prefill's features, ``ingest``), and then
times what a speculative step is made of: a drafter's ``propose``, the verification of a proposal (rolled back
after, as a rejected draft is), and the target's plain step that grows the sequence by its own token (whose
features the drafters that read them ``observe``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.nn import Module

from specdraft_eval.engine.drafter import Drafter, Proposal
from specdraft_eval.engine.graphs import StaticCaches
from specdraft_eval.engine.loop import prefill
from specdraft_eval.engine.sampling import Sampler
from specdraft_eval.engine.taps import FeatureTap
from specdraft_eval.engine.verify import verify_step
from specdraft_eval.errors import SpecdecError
from specdraft_eval.measure.timers import clock


class StepProbe:
    """One prompt's steps for ``target`` with ``drafters`` fed as the engine feeds them; ``runtime``: a static
    runtime's cache and compiled step, warmed up at ``widths`` first (``warm_up_seconds``). Close it (or use it as a
    context manager) to remove the feature taps."""

    @torch.inference_mode()
    def __init__(self, target_model: Module, prompt: Sequence[int], drafters: Sequence[Drafter] = (),
                 runtime: StaticCaches | None = None, widths: range = range(1, 2)) -> None:
        self.target_model, self.tokens, self.sampler = target_model, list(prompt), Sampler()
        self.drafters = list(drafters)
        self.reading = [d for d in self.drafters if d.taps]  # heads fed the target's features of every kept position
        if len({d.taps for d in self.reading}) > 1:
            raise SpecdecError("profile heads that read different hidden states of the target one at a time")
        self.tap = FeatureTap(target_model, self.reading[0].taps) if self.reading else None
        self.cache = prefill(target_model, [self.tokens], runtime.cache(1) if runtime else None)
        prefilled = self.tap.take() if self.tap else None  # [1, prompt - 1, features]
        self.warm_up_seconds = runtime.warm_up(self.cache, widths) if runtime else 0.0
        if self.tap:
            self.tap.take()  # the warm-up's features: nobody's
        self.cache.step = runtime.step if runtime else None
        for drafter in self.drafters:
            drafter.reset()
            if prefilled is not None and drafter.taps:
                drafter.observe(prefilled[0])

    def __enter__(self) -> StepProbe:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self.tap:
            self.tap.close()

    @torch.inference_mode()
    def ingest(self, drafter: Drafter) -> float | None:
        """Seconds per position of ``drafter``'s catch-up on the prompt (its prefill, as the engine times it), None
        where it read nothing."""
        start = clock(self.target_model.device)
        read = drafter.ingest(self.tokens)
        return (clock(self.target_model.device) - start) / read if read else None

    @torch.inference_mode()
    def propose(self, drafter: Drafter, gamma: int) -> tuple[float, int]:
        """Seconds ``drafter`` takes to propose up to ``gamma`` tokens here, and how many it proposed."""
        start = clock(self.target_model.device)
        proposal = drafter.propose(self.tokens, gamma, self.sampler)
        return clock(self.target_model.device) - start, len(proposal.tokens)

    @torch.inference_mode()
    def verify(self, proposal: Proposal) -> float:
        """Seconds of one verification of ``proposal`` (at least one token), the cache rolled back after it."""
        start = clock(self.target_model.device)
        verify_step(self.target_model, self.cache, [self.tokens], [proposal], [self.sampler])
        seconds = clock(self.target_model.device) - start
        if self.tap:
            self.tap.take()  # a rolled-back step's features: nobody's
        self.cache.rollback(len(self.tokens) - 1)
        return seconds

    @torch.inference_mode()
    def advance(self) -> float:
        """Seconds of the target's plain step, which appends its own next token (the drafters that read features
        observe it)."""
        start = clock(self.target_model.device)
        [(_, token)] = verify_step(self.target_model, self.cache, [self.tokens], [Proposal([])], [self.sampler])
        seconds = clock(self.target_model.device) - start
        features = self.tap.take() if self.tap else None
        for drafter in self.reading:
            drafter.observe(features[0, :1])
        self.tokens.append(token)
        return seconds
