"""``engine=vllm``: the same requests decoded by vLLM, the engine users deploy, measured into our record.

:class:`VllmSession` is :class:`~specdraft_eval.engine.session.Session`'s counterpart: one batch at a time, the
speculative server and (``baseline``) a plain server of the same target answer the same requests in alternating
order, greedy outputs are compared token for token (a difference: its index and the target's logit margin, from
the target loaded here), and each request's counters come from vLLM's per-request metrics
(:func:`~specdraft_eval.integration.serving.stats_of_requests`). vLLM's own aggregate counters over the run (the
difference of ``/metrics`` snapshots) are kept beside ours in the record (``engine_counters``).

Times are wall-clock around each batch's HTTP requests, as a client of the server sees them (prefill included: vLLM
does not split prefill, draft and verification time, so those stay unknown in the record).
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, replace

from specdraft_eval.engine.loop import divergence
from specdraft_eval.engine.params import DecodeParams
from specdraft_eval.engine.sampling import stream_seed
from specdraft_eval.engine.session import Alternation, Batch
from specdraft_eval.errors import SpecdecError
from specdraft_eval.integration.serving import canonical_name, speculative_config, stats_from_vllm, stats_of_requests
from specdraft_eval.integration.vllm_server import Completion, ServeSettings, VllmServer, counter_difference
from specdraft_eval.measure.stats import Divergence, GenerationStats
from specdraft_eval.models.targets import local_dir, resolve
from specdraft_eval.results.record import Runtime

SPEC_COUNTERS = ("spec_decode_num_drafts", "spec_decode_num_draft_tokens", "spec_decode_num_accepted_tokens",
                 "spec_decode_num_accepted_tokens_per_pos", "generation_tokens", "prompt_tokens", "request_success")
"""vLLM's counters a record keeps (``engine_counters``), without the ``vllm:`` prefix."""


@dataclass(frozen=True)
class VllmRun:
    """How ``engine=vllm`` runs: the target's HF directory, the draft (our draft string, mapped by
    :func:`~specdraft_eval.integration.serving.speculative_config`), γ, the baseline, and either a server the user
    runs (``server``: its URL; it must serve the draft) or servers started here with ``max_num_seqs`` rows."""

    model_dir: str
    draft: str
    num_draft_tokens: int = 4
    baseline: bool = False
    server: str | None = None
    max_num_seqs: int = 16
    max_model_len: int = 2048

    def settings(self, speculative: bool) -> ServeSettings:
        config = speculative_config(self.draft, self.num_draft_tokens) if speculative else None
        return ServeSettings(self.model_dir, config, self.max_model_len, self.max_num_seqs)


def vllm_model_dir(target: str) -> str:
    """What vLLM loads for a target name (alias, directory, .gguf, hub id): its HF directory or hub id (a GGUF: the
    HF directory it was converted into, the weights our engine runs)."""
    return local_dir(resolve(target)).path


class VllmSession:
    """Runs requests through vLLM servers, with the baseline and its check; figures per task as ours."""

    def __init__(self, run: VllmRun, target=None) -> None:
        if run.server and run.baseline:
            raise SpecdecError("baseline=true with server=URL: a running server decodes only its own configuration; "
                               "leave server out (specdec starts a speculative and a plain server) or baseline out")
        self.run, self.target = run, target  # target: the loaded model, for a divergence's logit margin
        self.config = speculative_config(run.draft, run.num_draft_tokens)  # one-line refusals before any start
        self.name = canonical_name(run.draft)
        self.servers: list[VllmServer] = []
        try:
            self.speculative = (VllmServer.attach(run.server) if run.server
                                else self._launch(run.settings(speculative=True)))
            self.plain = self._launch(run.settings(speculative=False)) if run.baseline else None
            for server in self.servers:  # (started together: they load in parallel)
                server.ready()
        except BaseException:
            self.close()
            raise
        self.version = self.speculative.version
        self.stats: dict[str, GenerationStats] = defaultdict(GenerationStats)
        self.divergences: list[Divergence] = []
        self.order = Alternation()
        self._before = self.speculative.counters()

    def renew(self) -> None:
        """A new speculative server, its draft state empty (vLLM's suffix cache keeps every request it saw, and no
        endpoint empties it): a measurement that must start fresh starts one (its counters since then)."""
        if self.run.server:
            raise SpecdecError("a server you run cannot be restarted with an empty draft state: leave server out")
        self.servers.remove(self.speculative)
        self.speculative.close()
        self.speculative = self._launch(self.run.settings(speculative=True)).ready()
        self._before = self.speculative.counters()

    def _launch(self, settings: ServeSettings) -> VllmServer:
        server = VllmServer.launch(settings)
        self.servers.append(server)
        return server

    @property
    def runtime(self) -> Runtime:
        return Runtime(dtype="float32", kernels="vllm", attention="vllm", engine=f"vllm {self.version}")

    def engine_counters(self) -> dict:
        """vLLM's own counters since this session began (the speculative server's)."""
        difference = counter_difference(self.speculative.counters(), self._before)
        return {name: difference.get(f"vllm:{name}") for name in SPEC_COUNTERS if f"vllm:{name}" in difference}

    def close(self) -> None:
        """Stop the servers started here (an attached one keeps running)."""
        for server in self.servers:
            server.close()

    def generate(self, prompts: list[list[int]], params: DecodeParams, stop: list[str] | None = None,
                 task: str = "default", repeats: list[int] | None = None) -> Batch:
        """Generate every prompt of one batch on both servers (the baseline first every other batch)."""
        seeds = ([stream_seed(params.seed, p, r) for p, r in zip(prompts, repeats or [0] * len(prompts))]
                 if params.seed is not None else [None] * len(prompts))

        def on(server: VllmServer) -> tuple[list[Completion], float]:
            start = time.perf_counter()
            done = server.complete_batch(prompts, seeds, max_tokens=params.max_new_tokens, stop=stop,
                                         temperature=params.temperature if params.do_sample else 0.0,
                                         top_p=params.top_p, top_k=params.top_k)
            return done, time.perf_counter() - start

        before = self.speculative.counters()
        if self.plain is not None and self.order.next():
            (references, base_seconds), (answers, seconds) = on(self.plain), on(self.speculative)
        else:
            answers, seconds = on(self.speculative)
            references, base_seconds = on(self.plain) if self.plain is not None else (None, 0.0)
        if all(answer.spec is not None for answer in answers):
            per_request = [self._request(answer, prompt) for answer, prompt in zip(answers, prompts, strict=True)]
            stats = replace(sum(per_request, GenerationStats()), decode_seconds=seconds)
        else:  # a stop string ended some request: vLLM sends no per-request metrics then; the batch's counters
            stats, per_request = self._from_counters(before, answers, prompts, seconds)
        found = []
        if references is not None:
            for alone, reference in zip(per_request, references, strict=True):
                alone.baseline_tokens, alone.baseline_seconds = len(reference.token_ids), reference.seconds
            stats.baseline_tokens = sum(len(r.token_ids) for r in references)
            stats.baseline_seconds = base_seconds
            for prompt, answer, reference in zip(prompts, answers, references, strict=True):
                if not params.do_sample and answer.token_ids != reference.token_ids:
                    stats.baseline_mismatches += 1
                    where = (divergence(self.target, prompt, answer.token_ids, reference.token_ids)
                             if self.target is not None else None)
                    found.append(replace(where or Divergence(), task=task))
        self.divergences += found
        self.stats[task] += stats
        outputs = [answer.token_ids for answer in answers]
        return Batch(outputs, stats, per_request, found)

    @staticmethod
    def _request(answer: Completion, prompt: list[int]) -> GenerationStats:
        stats = stats_of_requests([(answer.spec, len(answer.token_ids))], answer.seconds)
        stats.prompt_tokens = len(prompt)
        return stats

    def _from_counters(self, before: dict, answers: list[Completion], prompts: list[list[int]],
                       seconds: float) -> tuple[GenerationStats, list[GenerationStats]]:
        """The batch's counters from the difference of the speculative server's ``/metrics`` around it (this
        session's batches run alone on it), the tokens kept being those returned; each request's own figures are
        then its tokens and time only. vLLM attaches per-request metrics only to requests its scheduler finished
        (the token budget, EOS), not to those a stop string ended."""
        if self.run.server:
            raise SpecdecError("a stop string ended a request, and vLLM then sends no per-request metrics; a server "
                               "others may use cannot be measured by its counters: leave server out")
        kept = sum(len(answer.token_ids) for answer in answers)
        difference = counter_difference(self.speculative.settled_counters(before, len(answers)), before)
        stats = stats_from_vllm(difference, self.run.num_draft_tokens, seconds, kept)
        stats.prompt_tokens = sum(len(p) for p in prompts)
        alone = [GenerationStats(generations=1, generated_tokens=len(a.token_ids), prompt_tokens=len(p),
                                 decode_seconds=a.seconds) for a, p in zip(answers, prompts, strict=True)]
        return stats, alone
