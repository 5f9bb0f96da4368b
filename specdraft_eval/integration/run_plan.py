"""What decodes an lm-eval run and what it records: the run's sessions (one draft's, ``draft=auto``'s per task, or
vLLM's) from its model_args, the records those sessions' counters make, and the batch size ``auto`` means on a CPU.
:class:`~specdraft_eval.integration.lm_eval_model.SpecDecLM` is the adapter that calls these."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

from specdraft_eval.drafts import load_draft
from specdraft_eval.drafts.model import ModelDrafter
from specdraft_eval.drafts.spec import AUTO, AUTO_FIXED, DraftSpec, kind_versions
from specdraft_eval.engine.session import Session
from specdraft_eval.errors import SpecdecError
from specdraft_eval.integration.auto import AutoRun
from specdraft_eval.integration.model_args import SpecdecArgs
from specdraft_eval.integration.recommend import recommend
from specdraft_eval.integration.vllm_engine import VllmRun, VllmSession, vllm_model_dir
from specdraft_eval.measure.environment import ModelFacts, hardware
from specdraft_eval.models import kernels as kernel_paths
from specdraft_eval.models.targets import Target
from specdraft_eval.results.profiles import default_profile_path, read_profile
from specdraft_eval.results.record import Runtime, SpecdecRecord

log = logging.getLogger(__name__)


@dataclass
class RunPlan:
    """A run's decoding: one ``session`` (a draft's, or vLLM's), or ``auto`` (a session per task's choice)."""

    args: SpecdecArgs
    target: Target
    device: torch.device
    session: Session | VllmSession | None = None
    auto: AutoRun | None = None

    @classmethod
    def of(cls, args: SpecdecArgs, target: Target, device: torch.device, batch_size: Callable[[], int],
           max_length: int) -> RunPlan:
        """The plan ``args`` ask for on ``target`` (on ``device``; ``batch_size()``: requests per lm-eval batch, which
        vLLM's server is started for); refusals are one-line errors."""
        spec, model = DraftSpec.parse(args.draft), target.model
        if args.engine == "vllm":
            draft, gamma = args.draft, args.run().gamma.num_draft_tokens
            if spec.kind == AUTO:  # the configuration measured fastest in vLLM here, across tasks (no tuning)
                choice = recommend(target.name, hardware=hardware(device), batch_size=batch_size(), engine="vllm")
                draft, gamma = choice.draft, args.run(choice.num_draft_tokens).gamma.num_draft_tokens
                log.warning("draft=auto with engine=vllm: draft=%s, num_draft_tokens=%d (%s)", draft, gamma,
                            choice.reason)
            run = VllmRun(vllm_model_dir(target.name), draft, gamma, args.baseline, args.server, batch_size(),
                          max_length)
            return cls(args, target, device, session=VllmSession(run, model))
        if spec.kind == AUTO:
            if args.score == "draft":
                raise SpecdecError("score=draft scores with one draft's own model, and draft=auto chooses per task: "
                                   "name the draft to score with")
            plan = cls(args, target, device)
            plan.auto = AutoRun(target, plan.runtime, args.run, args.baseline, fixed=spec.arg == AUTO_FIXED)
            return plan
        drafter = load_draft(args.draft, target)
        if args.score == "draft" and (not isinstance(drafter, ModelDrafter) or drafter.reduced_head):
            raise SpecdecError(f"score=draft needs a draft that is a language model over the whole vocabulary; "
                               f"{drafter.name!r} is not (prompt lookup, n-grams, composites, EAGLE heads and "
                               "--vocab-top heads score no text on their own): give a layer view or a draft model")
        return cls(args, target, device, session=Session(model, drafter, args.run(), args.baseline))

    @property
    def runtime(self) -> Runtime:
        """What our engine decodes with: the target's dtype, kernels and attention, static cache, compiled steps."""
        return self.args.run().runtime(self.target.model)

    def sessions(self) -> list[Session | VllmSession]:
        return self.auto.all_sessions() if self.auto else [self.session]

    def records(self, batch_size: int) -> list[SpecdecRecord]:
        """This process's record of each configuration that decoded (``draft=auto`` after tuning: the chosen
        configuration's, its trials beside it); ``batch_size``: the largest batch decoded."""
        args, target, model = self.args, self.target, self.target.model
        if isinstance(self.session, VllmSession):
            session = self.session
            return [SpecdecRecord.new(target.name, session.name, session.run.num_draft_tokens, False, self.device,
                                      dict(session.stats), None, None, session.divergences,
                                      runtime=session.runtime, batch_size=batch_size,
                                      kind_versions=kind_versions(session.name),
                                      engine_counters=session.engine_counters())]
        measured = self.auto.measured() if self.auto else [(self.session, [])]
        profile = read_profile(default_profile_path(target.name, str(self.device), kernel_paths.kernels_of(model)),
                               named=False)
        runtime = self.runtime
        return [SpecdecRecord.new(
            target.name, session.drafter.name, session.run.gamma.num_draft_tokens, session.run.gamma.dynamic_gamma,
            self.device, dict(session.stats), session.drafter.model,
            profile.latencies(session.drafter.name) if profile else None, session.divergences, runtime=runtime,
            use_kernels=args.use_kernels, score=args.score, batch_size=batch_size, tuning=trials,
            draft_state=session.drafter.describe(), kind_versions=kind_versions(session.drafter.name))
            for session, trials in measured]

    def choices(self) -> dict[str, dict]:
        """``draft=auto``'s choice per task."""
        return {task: choice.to_json() for task, choice in self.auto.choices.items()} if self.auto else {}

    def record(self, batch_size: int) -> SpecdecRecord:
        """This process's record: each configuration's (:meth:`SpecdecRecord.of_configurations`), ``draft=auto``'s
        choice per task beside them."""
        records = self.records(batch_size)
        if not records:  # draft=auto and nothing decoded
            run = self.args.run()
            gamma = run.gamma
            return SpecdecRecord.new(self.target.name, self.args.draft, gamma.num_draft_tokens, gamma.dynamic_gamma,
                                     self.device, {}, runtime=self.runtime)
        return SpecdecRecord.of_configurations(records, self.choices())


def cpu_batch_size(model: torch.nn.Module, max_length: int, max_batch_size: int | None) -> int:
    """``--batch_size auto`` on a CPU, where running out of memory swaps instead of raising: the largest batch whose
    target KV caches for ``max_length`` tokens fit in half the available memory, at most ``max_batch_size`` (64)."""
    import psutil

    per_row = ModelFacts.of(model).kv_bytes_per_token * max_length
    fits = psutil.virtual_memory().available // 2 // max(per_row, 1)
    return int(max(1, min(max_batch_size or 64, fits)))
