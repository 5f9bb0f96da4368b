"""``draft=auto`` in an lm-eval run, task by task (a group of subtasks, such as MMLU's 57, being one task).

Each task decodes with the configuration measured best on it (:func:`~specdraft_eval.integration.recommend.
resolve_auto`: this machine's results, then the published ones, evidence ranked). A task nobody measured here is
tuned on its own first requests (:class:`~specdraft_eval.integration.autotune.RunTuner`, at most a quarter of them)
when it has enough for two contenders, else takes the configuration best across the tasks measured; the reason
says which. ``auto:fixed`` never tunes. Tasks that choose the same configuration share one session; the record
names each task's configuration (:attr:`SpecdecRecord.auto`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass

from specdraft_eval.drafts import load_draft
from specdraft_eval.engine.params import RunSettings
from specdraft_eval.engine.session import Batch, Session
from specdraft_eval.integration.autotune import IN_RUN_SHARE, RunTuner, candidate_set, contenders, most_contenders
from specdraft_eval.integration.recommend import resolve_auto
from specdraft_eval.models.targets import Target
from specdraft_eval.results.record import Runtime, Trial

log = logging.getLogger(__name__)

Configuration = tuple[str, int, bool]
"""(draft, γ, dynamic γ): what a session decodes with."""


@dataclass(frozen=True)
class Choice:
    """How ``draft=auto`` decodes one task, and why."""

    draft: str
    num_draft_tokens: int
    dynamic_gamma: bool
    reason: str

    def to_json(self) -> dict:
        return asdict(self)


class AutoRun:
    """The sessions of a ``draft=auto`` run, one per configuration, and each task's choice: :meth:`start` decides
    a task before its requests, :meth:`session` gives the session that decodes its next batch, :meth:`done` counts
    a tuning batch."""

    def __init__(self, target: Target, runtime: Runtime, run_for: Callable[[int, bool], RunSettings], baseline: bool,
                 fixed: bool) -> None:
        self.target, self.runtime, self.run_for, self.baseline, self.fixed = target, runtime, run_for, baseline, fixed
        self.sessions: dict[Configuration, Session] = {}
        self.tuners: dict[str, RunTuner] = {}
        self.choices: dict[str, Choice] = {}

    def start(self, task: str, requests: int, batch_size: int) -> None:
        """Decide how ``task`` decodes its ``requests`` (``batch_size`` at a time), unless it was decided."""
        if task in self.choices or task in self.tuners:
            return
        found = resolve_auto(self.target, self.runtime, batch_size, task)
        run, reason = self.run_for(found.num_draft_tokens, found.dynamic_gamma), found.reason
        if found.tune and not self.fixed:
            if most_contenders(int(IN_RUN_SHARE * requests) // batch_size) < 2:
                reason += f"; too few {task} requests to tune on ({requests})"
            elif self._tune(task, requests, batch_size, run):
                return
        self._choose(task, Choice(found.draft, run.gamma.num_draft_tokens, run.gamma.dynamic_gamma, reason))

    def _tune(self, task: str, requests: int, batch_size: int, run: RunSettings) -> bool:
        """Start tuning ``task`` on its first requests; False when fewer than two contenders load here."""
        tried, skipped = contenders(self.target, candidate_set(self.target.model.config.num_hidden_layers))
        for line in skipped:
            log.info("draft=auto: not trying %s", line)
        if len(tried) < 2:
            return False
        tuner = RunTuner(self.target.model, tried, run, self.baseline)  # (each contender runs its own γ policy)
        tuner.plan(requests, batch_size)
        if tuner.winner is not None:
            return False
        self.tuners[task] = tuner
        log.warning("draft=auto on %s: nothing measured here on it at batch size %d; tuning on its first requests "
                    "(at most %d%%) among %s", task, batch_size, round(IN_RUN_SHARE * 100),
                    ", ".join(c.drafter.name for c in tuner.contenders))
        return True

    def _choose(self, task: str, choice: Choice) -> None:
        self.choices[task] = choice
        log.warning("draft=auto on %s: %s, γ %d, dynamic γ %s (%s)", task, choice.draft, choice.num_draft_tokens,
                    choice.dynamic_gamma, choice.reason)

    def _session(self, configuration: Configuration) -> Session:
        if configuration not in self.sessions:
            draft, gamma, dynamic = configuration
            self.sessions[configuration] = Session(self.target.model, load_draft(draft, self.target),
                                                   self.run_for(gamma, dynamic), self.baseline)
        return self.sessions[configuration]

    def session(self, task: str) -> Session:
        """The session that decodes ``task``'s next batch (while it tunes: the contender's; a task not started, as
        when the engine is driven without lm-eval's generate_until, is decided as a lone request)."""
        if task not in self.choices and task not in self.tuners:
            self.start(task, 1, 1)
        tuner = self.tuners.get(task)
        if tuner is not None:
            return tuner.session()
        choice = self.choices[task]
        return self._session((choice.draft, choice.num_draft_tokens, choice.dynamic_gamma))

    def done(self, task: str, batch: Batch, rows: int) -> None:
        """Count a batch ``task`` decoded (a tuning contender's, while it tunes)."""
        if task in self.tuners:
            self.tuners[task].done(batch, rows)

    def all_sessions(self) -> list[Session]:
        return [*self.sessions.values(), *(s for tuner in self.tuners.values() for s in tuner.all_sessions())]

    def measured(self) -> list[tuple[Session, list[Trial]]]:
        """Every session that decoded the run's requests, with the tuning trials that chose it (tunings that ended
        with the run are decided now)."""
        found = [(session, []) for session in self.sessions.values()]
        for task, tuner in self.tuners.items():
            winner = tuner.finish()
            if task not in self.choices:
                self._choose(task, Choice(winner.drafter.name, winner.policy.num_draft_tokens, True,
                                          f"tuned on this run's first {sum(c.requests for c in tuner.contenders)} "
                                          f"{task} requests: " + ", ".join(f"{c.drafter.name} {c.score:.2f}"
                                                                           for c in tuner.contenders if c.requests)))
            found.append((tuner.sessions[id(winner)], tuner.trials))
        return [(session, trials) for session, trials in found if session.stats or trials]
