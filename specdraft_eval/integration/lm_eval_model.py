"""``lm_eval --model specdec``: lm-eval's HF model with generation through speculative decoding.

Everything but generation (tokenisation, chat templates, batching, truncation, loglikelihood) is
lm-eval's own ``HFLM``; only ``_model_generate`` is replaced: each batch lm-eval forms (``--batch_size N`` or
``auto``) is one batched speculative generation in the engine.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections import Counter, defaultdict
from dataclasses import replace
from functools import reduce

import torch
from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM

from specdraft_eval.drafts import load_draft
from specdraft_eval.drafts.model import ModelDrafter
from specdraft_eval.drafts.spec import AUTO, DraftSpec
from specdraft_eval.engine.gamma import GammaController
from specdraft_eval.engine.loop import (
    autoregressive_generate_batch,
    divergence,
    speculative_generate_batch,
)
from specdraft_eval.engine.params import DecodeParams, StopCheck, first_stop
from specdraft_eval.errors import SpecdecError, one_line, raise_terminated
from specdraft_eval.integration.recommend import resolve_auto
from specdraft_eval.measure.environment import ModelFacts
from specdraft_eval.measure.profiles import default_profile_path, read_profile
from specdraft_eval.measure.record import SpecdecRecord
from specdraft_eval.measure.report import table
from specdraft_eval.measure.stats import Divergence, GenerationStats
from specdraft_eval.models import kernels as kernel_paths
from specdraft_eval.models.sharding import ranks_agree
from specdraft_eval.models.targets import (
    ALIASES,
    DEFAULT_TARGET,
    LoadSettings,
    Target,
    local_dir,
    resolve,
    runtime_of,
)

log = logging.getLogger(__name__)
GENERATION_KEYS = {"do_sample", "temperature", "top_k", "top_p"}
SCORED = ("target", "draft")
"""Which model scores log-likelihood requests (``score=``)."""


def _excepthook(exc_type, exc, tb, _previous=sys.excepthook) -> None:
    """Uncaught SpecdecError: one line on stderr, exit code 1, no traceback; Ctrl-C or SIGTERM: one line too
    (lm-eval writes its results file only at the end, so an interrupted run leaves none)."""
    if issubclass(exc_type, SpecdecError):
        print(one_line(exc), file=sys.stderr)
    elif issubclass(exc_type, KeyboardInterrupt):
        print("specdec: interrupted; no results file was written: rerun the command", file=sys.stderr)
    else:
        _previous(exc_type, exc, tb)


sys.excepthook = _excepthook


def _as_bool(name: str, value) -> bool:
    if isinstance(value, bool):
        return value
    if str(value).lower() in {"true", "1", "yes"}:
        return True
    if str(value).lower() in {"false", "0", "no"}:
        return False
    raise SpecdecError(f"model_args {name}={value!r} is not a boolean: use {name}=true or {name}=false")


def _as_positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) and not str(value).isdigit():
        raise SpecdecError(f"model_args {name}={value!r} is not an integer: use e.g. {name}=4")
    if int(value) < 1:
        raise SpecdecError(f"model_args {name}={value} must be >= 1")
    return int(value)


@register_model("specdec")
class SpecDecLM(HFLM):
    """HFLM whose ``generate_until`` runs speculative decoding with ``draft``.

    model_args: ``pretrained`` (alias, directory, .gguf, hub id), ``draft`` (``prompt-lookup[:N]``,
    ``layers:SPEC``, a draft model, ``A|B``, or ``auto``: :func:`~specdraft_eval.integration.recommend.resolve_auto`, whose
    γ and dynamic γ apply unless given), ``num_draft_tokens`` (γ, default 4), ``dynamic_gamma``,
    ``baseline`` (also time plain decoding of every request, for speedup), ``seed``, ``kernels`` (``onednn``:
    pre-packed CPU linears, the default; ``plain``: PyTorch's own, the default with ``compile``), ``static_cache``
    (one preallocated KV cache shape for the whole run), ``compile`` (compiled steps over it, warmed up before
    the clock starts; the compile time is reported apart), ``score`` (``target``, the default, or
    ``draft``: log-likelihood requests are scored by the draft's own model, for its language-modelling quality),
    plus what ``hf`` takes.
    """

    def __init__(
        self,
        pretrained: str = DEFAULT_TARGET,
        draft: str = "prompt-lookup",
        num_draft_tokens: int | None = None,
        dynamic_gamma: bool | None = None,
        baseline: bool = False,
        seed: int | None = None,
        device: str | None = None,
        kernels: str | None = None,
        use_kernels: bool = False,
        static_cache: bool = False,
        compile: bool = False,
        score: str = "target",
        **kwargs,
    ) -> None:
        if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
            signal.signal(signal.SIGTERM, raise_terminated)  # unwind like Ctrl-C, through every finally
        self.baseline = _as_bool("baseline", baseline)
        self.use_kernels = _as_bool("use_kernels", use_kernels)  # transformers' hub kernels: off, so offline works
        self.compile = _as_bool("compile", compile)  # CUDA graphs / compiled steps, over a static cache
        self.static_cache = _as_bool("static_cache", static_cache) or self.compile
        self.seed = None if seed is None else int(seed)
        if score not in SCORED:
            raise SpecdecError(f"model_args score={score!r}: use score=target or score=draft")
        self.score = score
        kernels = kernel_paths.choose(kernels, self.compile)
        self.target_name = pretrained if isinstance(pretrained, str) else type(pretrained).__name__
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        # checked before the model loads; None: the default, or what draft=auto resolves to
        num_draft_tokens = None if num_draft_tokens is None else _as_positive_int("num_draft_tokens", num_draft_tokens)
        dynamic_gamma = None if dynamic_gamma is None else _as_bool("dynamic_gamma", dynamic_gamma)
        if isinstance(pretrained, str) and "gguf_file" not in kwargs:
            source = resolve(pretrained)
            if pretrained in ALIASES:
                source = local_dir(source)
            pretrained = source.path
            if source.gguf_file:
                kwargs["gguf_file"] = source.gguf_file
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if kwargs.get("tp_plan") and int(kwargs.get("tp_size") or world) != world:
            raise SpecdecError(f"tp_size={kwargs['tp_size']} with {world} processes: data parallel across groups of "
                               "tensor-parallel processes is not supported (lm-eval's tensor-parallel mode runs every "
                               f"document on every process); start tp_size processes (torchrun --nproc_per_node "
                               f"{kwargs['tp_size']}) or leave tp_size out")
        if _as_bool("parallelize", kwargs.get("parallelize", False)) and not torch.cuda.is_available():
            log.warning("parallelize=true spreads the target over GPUs (accelerate's device_map); none is visible, "
                        "so it runs on the CPU")
            kwargs["parallelize"] = False
        if world > 1 and not torch.cuda.is_available():
            os.environ.setdefault("ACCELERATE_USE_CPU", "1")  # several processes on CPUs: accelerate's gloo group
        try:
            super().__init__(pretrained=pretrained, device=device, use_kernels=self.use_kernels, **kwargs)
        except TypeError as exc:  # a model_arg neither we, lm-eval's hf model nor from_pretrained take
            if "unexpected keyword argument" not in str(exc):
                raise
            raise SpecdecError(f"model_args: {str(exc).split(': ', 1)[-1].strip()}: specdec takes draft, num_draft_tokens, "
                               "dynamic_gamma, baseline, seed, kernels, use_kernels, static_cache, compile, score and "
                               "what --model hf takes") from None
        accelerator = getattr(self, "accelerator", None)
        if accelerator is not None and accelerator.num_processes > 1 and self._world_size == 1:
            # `accelerate launch` on CPUs: lm-eval's hf model splits documents only across GPUs it counts, so each
            # process would run every document; split them across the processes instead
            self._rank, self._world_size = accelerator.process_index, accelerator.num_processes
        kernel_paths.apply(self.model, kernels)  # before the draft, so that a layer view shares the packed layers
        target = Target(self.model, self.tokenizer, self.target_name,
                        LoadSettings.of_model(self.model, self.use_kernels))
        gamma, dynamic = 4, False
        if DraftSpec.parse(draft).kind == AUTO:
            recommendation = resolve_auto(target, runtime_of(self.model, self.static_cache, self.compile))
            draft, gamma, dynamic = (recommendation.draft, recommendation.num_draft_tokens,
                                     recommendation.dynamic_gamma)
            log.warning("draft=auto for %s: %s, γ %d, dynamic γ %s (%s)", self.target_name, draft, gamma, dynamic,
                        recommendation.reason)
        self.num_draft_tokens = gamma if num_draft_tokens is None else num_draft_tokens
        self.dynamic_gamma = dynamic if dynamic_gamma is None else dynamic_gamma
        self.draft_name = draft
        self._drafter = load_draft(draft, target)
        if self.score == "draft" and (not isinstance(self._drafter, ModelDrafter) or self._drafter.reduced_head):
            raise SpecdecError(f"score=draft needs a draft that is a language model over the whole vocabulary; "
                               f"{self._drafter.name!r} is not (prompt lookup, n-grams, composites, EAGLE heads and "
                               "--vocab-top heads score no text on their own): give a layer view or a draft model")
        self._stats: dict[str, GenerationStats] = defaultdict(GenerationStats)
        # dynamic γ learns about the draft over the whole run, not again for every request
        self._gamma_controller = (GammaController.around(self.num_draft_tokens)
                                  if self.dynamic_gamma else None)
        self._mismatch_details: list[Divergence] = []
        self._task = "default"
        self._merged: SpecdecRecord | None = None
        self._capacity: int | None = None  # static cache positions for the run (generate_until sets it)
        self._batches = 0  # generation batches so far: with baseline=true, odd ones time the baseline first
        self._contexts: list[str] = []  # the texts of the batch HFLM is encoding (tok_batch_encode)
        self._request_figures: dict[str, list[dict]] = defaultdict(list)  # context -> its requests' figures

    # --- generation ------------------------------------------------------------------------------

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """HFLM's generate_until, run per task so that figures are kept per task. Under data parallelism, the
        copies lm-eval appends to even out the ranks' shares are answered without generating (they would count
        twice), and the ranks' records are merged on rank 0."""
        seen: Counter = Counter()
        originals: dict[int, int] = {}  # position of a padding copy -> position of its request's first copy
        by_task: dict[str, list[int]] = defaultdict(list)
        for i, request in enumerate(requests):
            seen[id(request)] += 1
            if seen[id(request)] > max(getattr(request, "repeats", 1), 1):
                originals[i] = next(j for j, r in enumerate(requests) if r is request)
            else:
                by_task[request.task_name or "default"].append(i)
        results: list[str] = [""] * len(requests)
        if self.static_cache and by_task:  # one cache shape for every request of the run
            self._capacity = max(self._positions(requests[i]) for indices in by_task.values() for i in indices)
        for task, indices in by_task.items():
            self._task = task
            outputs = super().generate_until([requests[i] for i in indices], disable_tqdm)
            for i, output in zip(indices, outputs, strict=True):
                results[i] = output
                figures = self._request_figures.get(requests[i].args[0])
                if figures:  # --log_samples writes a request's arguments: its own figures travel there
                    requests[i].arguments = (*requests[i].args, {"specdec": figures.pop(0)})
        for i, original in originals.items():
            results[i] = results[original]
        if self.world_size > 1:
            records = self.gather_object(self._record(), dst=0)
            self._merged = reduce(SpecdecRecord.merge, records) if self.rank == 0 else None
        if self.rank == 0 and by_task:
            print(table(self._merged or self._record()), flush=True)
        return results

    def _positions(self, request) -> int:
        """The most KV cache positions ``request`` can fill: its context as HFLM truncates it, its token budget, and
        one verification's draft tokens."""
        context, gen_kwargs = request.args[0], request.args[1]
        budget = int(gen_kwargs.get("max_gen_toks", self.max_gen_toks))
        largest = self._gamma_controller.max_gamma if self._gamma_controller else self.num_draft_tokens
        return min(len(self.tok_encode(context)), self.max_length - budget) + budget + largest + 1

    def _model_generate(self, context, max_length: int, stop: list[str], **generation_kwargs) -> torch.Tensor:
        attention_mask = generation_kwargs.pop("attention_mask", None)
        unknown = set(generation_kwargs) - GENERATION_KEYS
        if unknown:
            raise SpecdecError(
                f"generation kwargs {sorted(unknown)} are not supported by specdec: it supports "
                f"{sorted(GENERATION_KEYS)}, until and max_gen_toks"
            )
        temperature = float(generation_kwargs.get("temperature", 0.0) or 0.0)
        do_sample = bool(generation_kwargs.get("do_sample", False)) and temperature > 0
        params = DecodeParams(
            max_length - context.shape[1], self.num_draft_tokens, do_sample=do_sample,
            temperature=temperature if do_sample else 1.0, top_k=int(generation_kwargs.get("top_k", 0) or 0),
            top_p=float(generation_kwargs.get("top_p", 1.0) or 1.0), seed=self.seed, static_cache=self.static_cache,
            compile=self.compile, capacity=self._capacity)
        prompts = [(context[row] if attention_mask is None else context[row][attention_mask[row].bool()]).tolist()
                   for row in range(context.shape[0])]
        def speculate():
            return speculative_generate_batch(self.model, self._drafter, prompts, params,
                                              stops=[self._stop_check(stop) for _ in prompts],
                                              gamma_controller=self._gamma_controller)

        def plain():
            return autoregressive_generate_batch(self.model, prompts, params,
                                                 stops=[self._stop_check(stop) for _ in prompts])

        self._batches += 1
        if self.baseline and self._batches % 2 == 0:  # the baseline first every other batch: neither side always
            (references, base_stats), (outputs, stats) = plain(), speculate()  # runs on a warmer machine
        else:
            (outputs, stats) = speculate()
            references, base_stats = plain() if self.baseline else (None, None)
        ranks_agree(self.model, outputs, f"a {self._task} request")
        if len(self._contexts) == len(prompts):  # called by HFLM's generate_until, which encoded these texts
            bases = base_stats.per_request if self.baseline else [GenerationStats()] * len(prompts)
            for text, alone, base in zip(self._contexts, stats.per_request, bases, strict=True):
                self._request_figures[text].append((alone + base).request_figures())
        stats = replace(stats, per_request=[])
        if self.baseline:
            stats = stats + replace(base_stats, per_request=[])
            for prompt, new, reference in zip(prompts, outputs, references, strict=True):
                if not do_sample and new != reference:  # both are cut where the stop sequence completes
                    stats.baseline_mismatches += 1
                    where = replace(divergence(self.model, prompt, new, reference) or Divergence(), task=self._task)
                    self._mismatch_details.append(where)
                    log.error("specdec output differs from plain greedy decoding on a %s request: %s", self._task, where)
        self._stats[self._task] += stats
        rows = [context[row].tolist() + new for row, new in enumerate(outputs)]
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
        if self.score == "target":
            return super()._model_call(inps, attn_mask, labels)
        with torch.no_grad():
            return self._drafter.model(inps).logits[..., : self._drafter.vocab_size]

    def _detect_batch_size(self, requests=None, pos: int = 0) -> int:
        """``--batch_size auto``: on a GPU, lm-eval's own search (the largest batch that does not run out of
        memory); on the CPU, where running out of memory swaps instead of raising, the largest batch whose target
        KV caches for ``max_length`` tokens fit in half the available memory, at most ``max_batch_size``."""
        if self.device.type == "cuda":
            return super()._detect_batch_size(requests, pos)
        import psutil

        per_row = ModelFacts.of(self.model).kv_bytes_per_token * self.max_length
        fits = psutil.virtual_memory().available // 2 // max(per_row, 1)
        return int(max(1, min(self.max_batch_size or 64, fits)))

    def _stop_check(self, stop: list[str]) -> StopCheck | None:
        """A :data:`~specdraft_eval.engine.params.StopCheck`: how many tokens to keep, the one that completes a stop
        sequence last (as plain decoding stops on it). It decodes only the tokens that can hold a new match: those
        since the last call, plus a margin of one token per character of the longest stop sequence. One check
        serves one generation."""
        stops = [s for s in stop or [] if s]
        if not stops:
            return None
        margin = max(len(s) for s in stops) + 1
        checked = [0]  # tokens seen by earlier calls

        def check(new: list[int]) -> int | None:
            start, seen = max(0, checked[0] - margin), checked[0]
            checked[0] = len(new)

            def hit(end: int) -> bool:
                text = self.tokenizer.decode(new[start:end], skip_special_tokens=False)
                return any(s in text for s in stops)

            return first_stop(new, seen, hit)

        return check

    # --- reporting -------------------------------------------------------------------------------

    def _record(self) -> SpecdecRecord:
        """This process's record."""
        profile = read_profile(default_profile_path(self.target_name, str(self.device),
                                                    kernel_paths.kernels_of(self.model)), named=False)
        return SpecdecRecord.new(
            self.target_name,
            self._drafter.name,
            self.num_draft_tokens,
            self.dynamic_gamma,
            self.device,
            dict(self._stats),
            self._drafter.model,
            profile.latencies(self._drafter.name) if profile else None,
            self._mismatch_details,
            runtime=runtime_of(self.model, self.static_cache, self.compile),
            use_kernels=self.use_kernels,
            score=self.score,
        )

    def specdec_info(self) -> dict:
        """The ``specdec`` block for the results file (on rank 0 of a data-parallel run: every rank's, merged)."""
        return (self._merged or self._record()).to_block()

    def get_model_info(self) -> dict:
        return {**super().get_model_info(), "specdec": self.specdec_info()}
