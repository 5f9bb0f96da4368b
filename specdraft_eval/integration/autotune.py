"""Tuning ``draft=auto`` by measuring here: the contenders for a target, and successive halving over them.

Every contender decodes the same output (decoding is lossless), so trying several on a run's first requests costs
speed, never accuracy. The contenders come from the kinds themselves (:meth:`DraftKind.candidates` for the kinds that
need no files, :meth:`DraftKind.found_candidates` for drafts found on disk: the shipped drafts and those given) plus
composites of the best model-free kind with each model-based draft; each runs with dynamic γ, whose controller
chooses γ from the measured acceptance per position and verification cost (the analytical model); tree shapes are
contenders of their own. :class:`Halving` gives every survivor one batch, then the better half (by speedup over plain
decoding where the run has the baseline, else tokens/s) two each, and so on until one is left. ``zoo tune`` runs it
on a task's held-in prompts (:mod:`zoo.measure.tune`); :class:`RunTuner` inside an ``lm_eval`` run, on a bounded share
of its first requests (:data:`IN_RUN_SHARE`), the rest decoded by the winner.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

from specdraft_eval import published
from specdraft_eval.drafts import load_draft
from specdraft_eval.drafts.kind import Candidate, draft_kinds
from specdraft_eval.drafts.spec import MODEL, DraftSpec
from specdraft_eval.engine.drafter import Drafter
from specdraft_eval.engine.params import GammaPolicy, RunSettings
from specdraft_eval.engine.session import Alternation, Batch, Session
from specdraft_eval.errors import SpecdecError, one_line
from specdraft_eval.measure.stats import GenerationStats
from specdraft_eval.models.targets import Target
from specdraft_eval.results.record import Trial

log = logging.getLogger(__name__)

IN_RUN_SHARE = 0.25
"""The most of a run's requests ``draft=auto`` spends trying contenders."""
MODEL_FREE_PARTNER = "prompt-lookup:2-3"
"""The model-free draft composites put first (exact matches of the context, then the model-based draft)."""


@dataclass
class Contender:
    """One configuration being tried: its draft, γ policy, drafter and what it measured so far."""

    candidate: Candidate
    drafter: Drafter
    stats: GenerationStats = field(default_factory=GenerationStats)
    requests: int = 0
    rounds: int = 0

    @property
    def policy(self) -> GammaPolicy:
        return GammaPolicy(self.candidate.gammas[0], dynamic_gamma=True)

    @property
    def score(self) -> float:
        """Speedup over plain decoding of the same requests, else tokens/s (0 before it decoded)."""
        return self.stats.speedup or self.stats.tokens_per_second or 0.0

    def add(self, stats: GenerationStats, requests: int) -> None:
        self.stats = self.stats + stats
        self.requests += requests

    def trial(self, chosen: bool) -> Trial:
        return Trial(self.drafter.name, self.policy.num_draft_tokens, True, self.stats, self.requests, self.rounds,
                     chosen)


def found_drafts(extra: list[str] = ()) -> list[str]:
    """Draft strings for drafts on disk: ``extra`` and those in the shipped drafts' folder (a directory a kind
    recognises by its marker file; a whole model, tokenizer included, as a draft model, such as ``zoo prune``
    writes; else a head in upstream's EAGLE layouts: one with a ``config.json``; other folders, such as the heads'
    training data, are no drafts)."""
    folder = published.base() / "leaderboard" / "drafts"
    shipped = sorted(p for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []
    written = list(extra)
    for path in shipped:
        spec = DraftSpec.parse(str(path))
        if spec.kind != MODEL or (path / "tokenizer_config.json").is_file():
            written.append(str(path))
        elif (path / "config.json").is_file():
            written.append(f"eagle:{path}")
    return written


def candidate_set(target_layers: int, extra: list[str] = ()) -> list[Candidate]:
    """The configurations worth trying, in the order tried when not all can be: composites of the best model-free
    draft with each draft found on disk (every found draft's first configuration, its tree for a head, before any
    draft's second: a run that can try four tries four drafts, not one head's variants), the found drafts alone (in
    the same order), then every kind's file-free candidates."""
    kinds = draft_kinds()
    variants = []
    for written in found_drafts(extra):
        spec = DraftSpec.parse(written, kinds)
        kind = kinds.get(spec.kind)
        variants.append(kind.found_candidates(written) if kind else (Candidate(written, (4,)),))
    diverse = [found[i] for i in range(max(map(len, variants), default=0)) for found in variants if i < len(found)]
    composites = [Candidate(f"{MODEL_FREE_PARTNER}|{c.draft}", c.gammas) for c in diverse]
    free = [c for kind in kinds.values() for c in kind.candidates(target_layers)]
    return composites + diverse + free


def contenders(target: Target, candidates: list[Candidate], most: int | None = None) -> tuple[list[Contender],
                                                                                              list[str]]:
    """The first ``most`` of ``candidates`` that load for ``target``, and one line per candidate that did not."""
    loaded, skipped = [], []
    for candidate in candidates:
        if most is not None and len(loaded) >= most:
            break
        try:
            loaded.append(Contender(candidate, load_draft(candidate.draft, target)))
        except (SpecdecError, OSError, ValueError, RuntimeError, KeyError) as exc:
            skipped.append(f"{candidate.draft}: {one_line(exc)}")
    return loaded, skipped


def halving_schedule(count: int, first: int = 1) -> list[tuple[int, int]]:
    """Per round of :class:`Halving` over ``count`` contenders: (survivors, batches each), ``first`` batches each in
    the first round, twice as many each round after."""
    rounds, per = [], first
    while count > 1:
        rounds.append((count, per))
        count, per = math.ceil(count / 2), per * 2
    return rounds


def halving_cost(count: int, first: int = 1) -> int:
    """Batches :class:`Halving` decodes for ``count`` contenders, ``first`` batches each in its first round."""
    return sum(survivors * per for survivors, per in halving_schedule(count, first))


def most_contenders(budget: int, first: int = 1) -> int:
    """The most contenders whose halving fits in ``budget`` batches (at least 1)."""
    count = 1
    while halving_cost(count + 1, first) <= budget:
        count += 1
    return count


def best(contenders: list[Contender]) -> Contender:
    """The contender with the best score among those that decoded (the first when none did)."""
    return max(contenders, key=lambda c: (c.requests > 0, c.score))


class Halving:
    """Successive halving: :meth:`rounds` yields each round's survivors (the caller has each decode ``first``
    batches in the first round, twice as many each round after), then keeps the better half by
    :attr:`Contender.score`, until one is left; :attr:`winner` is the best survivor so far."""

    def __init__(self, contenders: list[Contender]) -> None:
        self.alive = list(contenders)

    def rounds(self) -> Iterator[list[Contender]]:
        while len(self.alive) > 1:
            yield self.alive
            for contender in self.alive:
                contender.rounds += 1
            self.alive = sorted(self.alive, key=lambda c: c.score, reverse=True)[: math.ceil(len(self.alive) / 2)]

    @property
    def winner(self) -> Contender:
        return best(self.alive)


class RunTuner:
    """``draft=auto`` tuning inside a run: a :class:`Session` per contender; :meth:`session` says which decodes the
    next batch (successive halving over the run's first batches, a batch at a time), then always the winner's, whose
    counters restart at the decision (the record keeps the tuning apart: :attr:`trials`)."""

    def __init__(self, target_model, contenders: list[Contender], run: RunSettings, baseline: bool) -> None:
        self.contenders, self.baseline = contenders, baseline
        order = Alternation()  # plain decoding first every other tuning batch, whichever contender decodes it
        # while tuning, every contender's batches are decoded plainly too: each is scored by its speedup on its own
        # requests (tokens/s of different documents would rank the documents), whatever ``baseline`` says
        self.sessions = {id(c): Session(target_model, c.drafter, replace(run, gamma=c.policy), True, order=order)
                         for c in contenders}
        self._halving = Halving(contenders)
        self._order: Iterator[Contender] | None = None
        self._current: Contender = contenders[0]
        self._advance = True  # the current contender's batch was counted: the next call moves on
        self.winner: Contender | None = contenders[0] if len(contenders) == 1 else None

    def plan(self, requests: int, batch_size: int) -> None:
        """Spend at most :data:`IN_RUN_SHARE` of ``requests`` (in batches of ``batch_size``) on tuning: as many
        contenders as successive halving over that many batches allows."""
        if self.winner is not None or self._order is not None:
            return
        budget = int(IN_RUN_SHARE * requests) // max(batch_size, 1)
        count = min(most_contenders(budget), len(self.contenders))
        if batch_size > 1:  # model-free drafts first: their cost does not grow with the rows (issue 51's batch study:
            # the prompt-lookup|n-gram composite 1.09x at batch 4 and 0.98x at 16, the EAGLE head 1.00x and 0.86x)
            self.contenders.sort(key=lambda c: c.drafter.model is not None)
        self.contenders = self.contenders[:count]
        if count == 1:
            self.winner = self.contenders[0]
            return
        self._halving = Halving(self.contenders)
        self._order = (c for alive in self._halving.rounds() for _ in range(2 ** alive[0].rounds) for c in alive)

    def session(self) -> Session:
        """The session that decodes the next batch."""
        if self.winner is None and self._advance:
            following = next(self._order, None) if self._order is not None else None
            if following is None:
                self._decide()
            else:
                self._current, self._advance = following, False
        return self.sessions[id(self.winner or self._current)]

    def done(self, batch: Batch, rows: int) -> None:
        """Count a batch the current contender decoded while tuning."""
        if self.winner is None:
            self._current.add(batch.stats, rows)
            self._advance = True

    def _decide(self) -> None:
        self.winner = self._halving.winner
        session = self.sessions[id(self.winner)]
        session.stats.clear()  # from here on, the chosen configuration's own requests
        session.baseline = self.baseline  # and plain decoding only if the run asked for it
        log.warning("draft=auto tuned on this run's first %d requests: %s (%s)", sum(c.requests for c in
                    self.contenders), self.winner.drafter.name,
                    ", ".join(f"{c.drafter.name} {c.score:.2f}" for c in self.contenders))

    def finish(self) -> Contender:
        """The winner (decided now if the run ended while tuning)."""
        if self.winner is None:
            self._decide()
        return self.winner

    @property
    def trials(self) -> list[Trial]:
        return [c.trial(c is self.winner) for c in self.contenders if c.requests]

    def all_sessions(self) -> list[Session]:
        return list(self.sessions.values())

