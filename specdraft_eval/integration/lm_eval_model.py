"""``lm_eval --model specdec``: lm-eval's HF model with generation through speculative decoding.

Everything but generation (tokenisation, chat templates, batching, truncation, loglikelihood) is lm-eval's own
``HFLM``; only ``_model_generate`` is replaced: each batch lm-eval forms (``--batch_size N`` or ``auto``) is one
batch of an engine :class:`~specdraft_eval.engine.session.Session` (speculative, the baseline, the divergence check,
figures per task). model_args are parsed once (:mod:`~specdraft_eval.integration.model_args`).
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from collections import Counter, defaultdict
from dataclasses import replace
from functools import partial

import torch
from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM

from specdraft_eval.engine.params import DecodeParams, row_positions, text_stop
from specdraft_eval.engine.session import Session
from specdraft_eval.errors import SpecdecError, one_line, raise_terminated
from specdraft_eval.integration.model_args import SpecdecArgs, hf_arguments
from specdraft_eval.integration.run_plan import RunPlan, cpu_batch_size
from specdraft_eval.integration.task_groups import groups_of
from specdraft_eval.integration.vllm_engine import VllmSession
from specdraft_eval.models import kernels as kernel_paths
from specdraft_eval.models.sharding import ranks_agree
from specdraft_eval.models.targets import DEFAULT_TARGET, LoadSettings, Target
from specdraft_eval.results import store
from specdraft_eval.results.record import SpecdecRecord
from specdraft_eval.results.report import table

log = logging.getLogger(__name__)
GENERATION_KEYS = {"do_sample", "temperature", "top_k", "top_p"}


def _excepthook(exc_type, exc, tb, previous=sys.__excepthook__) -> None:
    """Uncaught SpecdecError: one line on stderr, exit code 1, no traceback; Ctrl-C or SIGTERM: one line too
    (lm-eval writes its results file only at the end, so an interrupted run leaves none)."""
    if issubclass(exc_type, SpecdecError):
        print(one_line(exc), file=sys.stderr)
    elif issubclass(exc_type, KeyboardInterrupt):
        print("specdec: interrupted; no results file was written: rerun the command", file=sys.stderr)
    else:
        previous(exc_type, exc, tb)


def _install_handlers() -> None:
    """When a specdec model is made (never at import): one-line errors, and SIGTERM unwinding like Ctrl-C."""
    if getattr(sys.excepthook, "func", None) is not _excepthook:
        sys.excepthook = partial(_excepthook, previous=sys.excepthook)
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, raise_terminated)  # unwind like Ctrl-C, through every finally


@register_model("specdec")
class SpecDecLM(HFLM):
    """HFLM whose ``generate_until`` runs speculative decoding with ``draft``.

    model_args: ``pretrained`` (alias, directory, .gguf, hub id), ``draft`` (``prompt-lookup[:N]``,
    ``layers:SPEC``, a draft model, ``A|B``, or ``auto``: per task, :class:`~specdraft_eval.integration.auto.AutoRun`,
    whose γ and dynamic γ apply unless given), ``num_draft_tokens`` (γ, default 4), ``dynamic_gamma``,
    ``baseline`` (also time plain decoding of every request, for speedup), ``seed``, ``kernels`` (``onednn``:
    pre-packed CPU linears, the default; ``plain``: PyTorch's own, the default with ``compile``), ``static_cache``
    (one preallocated KV cache shape for the whole run), ``compile`` (compiled steps over it, warmed up before
    the clock starts; the compile time is reported apart), ``score`` (``target``, the default, or
    ``draft``: log-likelihood requests are scored by the draft's own model, for its language-modelling quality),
    plus what ``hf`` takes.
    """

    def __init__(self, pretrained: str = DEFAULT_TARGET, device: str | None = None, **model_args) -> None:
        _install_handlers()
        self.args = args = SpecdecArgs.take(model_args)
        self.target_name, pretrained, model_args = hf_arguments(pretrained, model_args)
        try:
            super().__init__(pretrained=pretrained, device=device or ("cuda" if torch.cuda.is_available() else "cpu"),
                             use_kernels=args.use_kernels, **model_args)
        except TypeError as exc:  # a model_arg neither we, lm-eval's hf model nor from_pretrained take
            if "unexpected keyword argument" not in str(exc):
                raise
            raise SpecdecError(f"model_args: {str(exc).split(': ', 1)[-1].strip()}: specdec takes draft, "
                               "num_draft_tokens, dynamic_gamma, baseline, seed, kernels, use_kernels, static_cache, "
                               "compile, score, engine, server and what --model hf takes") from None
        accelerator = getattr(self, "accelerator", None)
        if accelerator is not None and accelerator.num_processes > 1 and self._world_size == 1:
            # `accelerate launch` on CPUs: lm-eval's hf model splits documents only across GPUs it counts, so each
            # process would run every document; split them across the processes instead
            self._rank, self._world_size = accelerator.process_index, accelerator.num_processes
        kernel_paths.apply(self.model, args.kernels)  # before the draft, so that a layer view shares packed layers
        target = Target(self.model, self.tokenizer, self.target_name,
                        LoadSettings.of_model(self.model, args.use_kernels))
        self._detected_batch: int | None = None
        self.plan = RunPlan.of(args, target, self.device, lambda: max(self._requests_per_batch, 1), self.max_length)
        self._largest_batch = 0
        self._stored: dict = {}  # this run's files in the results store, by configuration
        self._merged: SpecdecRecord | None = None
        self._capacity: int | None = None  # static_cache: the run's longest row
        self._task = "default"  # the task generate_until is answering (a group of subtasks: the group)
        self._contexts: list[str] = []  # the texts of the batch HFLM is encoding (tok_batch_encode)
        self._request_figures: dict[str, list[dict]] = defaultdict(list)  # context -> its requests' figures
        self._repeats: Counter = Counter()  # (task, context, request settings) -> copies decoded so far

    @property
    def _requests_per_batch(self) -> int:
        """lm-eval's ``--batch_size``; with ``auto``, the batch size its detection finds."""
        return self.batch_size if isinstance(self.batch_size, int) else self._detect_batch_size()

    @property
    def session(self) -> Session | VllmSession:
        """The session that decodes the next batch (``draft=auto``: the current task's, or its tuning contender's)."""
        session = self.plan.auto.session(self._task) if self.plan.auto else self.plan.session
        if self._capacity is not None and isinstance(session, Session) and session.run.capacity != self._capacity:
            session.run = replace(session.run, capacity=self._capacity)
        return session

    # --- generation ------------------------------------------------------------------------------

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """HFLM's generate_until, run per task (a group of subtasks whose every task the run holds, such as MMLU's
        57, as one) so that figures are kept, and ``draft=auto`` chooses, per task. Under data parallelism, the
        copies lm-eval appends to even out the ranks' shares are answered without generating (they would count
        twice), and the ranks' records are merged on rank 0."""
        seen: Counter = Counter()
        originals: dict[int, int] = {}  # position of a padding copy -> position of its request's first copy
        by_task: dict[str, list[int]] = defaultdict(list)
        groups = groups_of([request.task_name or "default" for request in requests])
        for i, request in enumerate(requests):
            seen[id(request)] += 1
            if seen[id(request)] > max(getattr(request, "repeats", 1), 1):
                originals[i] = next(j for j, r in enumerate(requests) if r is request)
            else:
                by_task[groups[request.task_name or "default"]].append(i)
        results: list[str] = [""] * len(requests)
        if self.args.static_cache and by_task:  # one cache shape for every request of the run
            self._capacity = max(self._positions(requests[i]) for indices in by_task.values() for i in indices)
        for task, indices in by_task.items():
            self._task = task
            if self.plan.auto is not None:
                self.plan.auto.start(task, len(indices), self._requests_per_batch)
            outputs = super().generate_until([requests[i] for i in indices], disable_tqdm)
            for i, output in zip(indices, outputs, strict=True):
                results[i] = output
                figures = self._request_figures.get(requests[i].args[0])
                if figures:  # --log_samples writes a request's arguments: its own figures travel there
                    requests[i].arguments = (*requests[i].args, {"specdec": figures.pop(0)})
        for i, original in originals.items():
            results[i] = results[original]
        if self.world_size > 1:
            gathered = self.gather_object(self.plan.records(self._batch_size), dst=0)
            self._merged = (SpecdecRecord.of_configurations([r for rank in gathered for r in rank], self.plan.choices())
                            if self.rank == 0 else None)
        if self.rank == 0 and by_task:
            record = self._merged or self.plan.record(self._batch_size)
            for part in record.flat():  # (draft=auto logged each task's choice when it made it)
                print(table(part), flush=True)
            if self.args.baseline:  # speedups measured on this machine: draft=auto reads them first
                for part in record.flat():
                    self._stored[part.key()] = store.save(part, "lm_eval", replacing=self._stored.get(part.key()))
        return results

    def _positions(self, request) -> int:
        """The most KV cache positions ``request`` can fill, its context as HFLM truncates it."""
        context, gen_kwargs = request.args[0], request.args[1]
        budget = int(gen_kwargs.get("max_gen_toks", self.max_gen_toks))
        prompt = min(len(self.tok_encode(context)), self.max_length - budget)
        widest = max([s.run.gamma.max_num_draft_tokens for s in self.plan.sessions()],
                     default=4 * self.args.run().gamma.max_num_draft_tokens)
        return row_positions(prompt, budget, widest)  # (auto: before its sessions exist, dynamic γ's widest)

    def _model_generate(self, context, max_length: int, stop: list[str], **generation_kwargs) -> torch.Tensor:
        attention_mask = generation_kwargs.pop("attention_mask", None)
        unknown = set(generation_kwargs) - GENERATION_KEYS
        if unknown:
            raise SpecdecError(f"generation kwargs {sorted(unknown)} are not supported by specdec: it supports "
                               f"{sorted(GENERATION_KEYS)}, until and max_gen_toks")
        temperature = float(generation_kwargs.get("temperature", 0.0) or 0.0)
        do_sample = bool(generation_kwargs.get("do_sample", False)) and temperature > 0
        params = DecodeParams(max_length - context.shape[1], do_sample, temperature if do_sample else 1.0,
                              int(generation_kwargs.get("top_k", 0) or 0),
                              float(generation_kwargs.get("top_p", 1.0) or 1.0), self.args.seed)
        prompts = [(context[row] if attention_mask is None else context[row][attention_mask[row].bool()]).tolist()
                   for row in range(context.shape[0])]
        self._largest_batch = max(self._largest_batch, len(prompts))
        texts = self._contexts if len(self._contexts) == len(prompts) else None  # HFLM's generate_until's batch
        repeats = None
        if texts is not None:  # lm-eval's `repeats` copies of a request: the k-th copy samples stream k
            repeats = []
            for text in texts:
                key = (self._task, text, repr(params))
                repeats.append(self._repeats[key])
                self._repeats[key] += 1
        session = self.session
        batch = (session.generate(prompts, params, stop, self._task, repeats) if isinstance(session, VllmSession)
                 else session.generate(prompts, params, lambda: [text_stop(self.tokenizer, stop) for _ in prompts],
                                       self._task, repeats))
        if self.plan.auto is not None:
            self.plan.auto.done(self._task, batch, len(prompts))
        ranks_agree(self.model, batch.outputs, f"a {self._task} request")
        for where in batch.divergences:
            log.error("specdec output differs from plain greedy decoding on a %s request: %s", self._task, where)
        if texts is not None:  # called by HFLM's generate_until, which encoded these texts
            for text, alone in zip(texts, batch.per_request, strict=True):
                self._request_figures[text].append(alone.request_figures())
        rows = [context[row].tolist() + new for row, new in enumerate(batch.outputs)]
        width = max(len(r) for r in rows)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        return torch.tensor([r + [pad] * (width - len(r)) for r in rows], device=context.device)

    def tok_batch_encode(self, strings: list[str], *args, **kwargs):
        """HFLM's, remembering the batch's texts: ``_model_generate`` files each row's figures under its text."""
        self._contexts = list(strings)
        return super().tok_batch_encode(strings, *args, **kwargs)

    def _model_call(self, inps: torch.Tensor, attn_mask: torch.Tensor | None = None,
                    labels: torch.Tensor | None = None) -> torch.Tensor:
        """Logits for log-likelihood requests: the target's (HFLM's own call), or with ``score=draft`` the
        draft's own model's, over the target's vocabulary."""
        if self.args.score == "target":
            return super()._model_call(inps, attn_mask, labels)
        drafter = self.session.drafter
        with torch.no_grad():
            return drafter.model(inps).logits[..., : drafter.vocab_size]

    def _detect_batch_size(self, requests=None, pos: int = 0) -> int:
        """``--batch_size auto``: on a GPU, lm-eval's own search (the largest batch that does not run out of
        memory); on the CPU, where running out of memory swaps instead of raising, the largest batch whose target
        KV caches for ``max_length`` tokens fit in half the available memory, at most ``max_batch_size``. Found once
        for generation (``draft=auto`` plans with it, then HFLM's generate_until decodes with it)."""
        if requests is None and self._detected_batch is not None:
            return self._detected_batch
        if self.device.type == "cuda":
            found = super()._detect_batch_size(requests, pos)
        else:
            found = cpu_batch_size(self.model, self.max_length, self.max_batch_size)
        if requests is None:
            self._detected_batch = found
        return found

    # --- reporting -------------------------------------------------------------------------------

    @property
    def _batch_size(self) -> int:
        """The largest batch decoded (1 before any)."""
        return max(self._largest_batch, 1)

    def specdec_info(self) -> dict:
        """The ``specdec`` block for the results file (on rank 0 of a data-parallel run: every rank's, merged)."""
        return (self._merged or self.plan.record(self._batch_size)).to_block()

    def get_model_info(self) -> dict:
        return {**super().get_model_info(), "specdec": self.specdec_info()}
