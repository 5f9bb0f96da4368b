"""``zoo bench``: our engine against transformers' own decoding, side by side on the same prompts.

Per draft and prompt, interleaved and after a warm-up, greedy: the target's autoregressive
``generate``; transformers' assisted generation with the same draft at a constant γ; our engine at the
same γ and with dynamic γ. All of these run the same kernels (``specdraft_eval.models.kernels``); when those are
the pre-packed ones, transformers' autoregressive and assisted generation also run once more on a plain copy
of the models, which is what a user would otherwise run. Every output must equal the autoregressive one
token for token. Wall time is split into the target's and the draft's forward passes (module hooks) and the
rest (engine overhead).
"""

from __future__ import annotations

import copy
import ctypes
import json
import statistics
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from specdraft_eval.drafts.model import ModelDrafter
from specdraft_eval.drafts.prompt_lookup import PromptLookupDrafter
from specdraft_eval.engine.drafter import Drafter
from specdraft_eval.engine.gamma import GammaController
from specdraft_eval.engine.loop import (
    autoregressive_generate,
    divergence,
    speculative_generate,
)
from specdraft_eval.errors import SpecdecError
from specdraft_eval.measure.stats import GenerationStats
from specdraft_eval.measure.timers import clock
from specdraft_eval.models import kernels
from specdraft_eval.models.targets import LoadSettings
from zoo.progress import Tick, no_progress

SCHEMA_VERSION = 3  # 2: kernels, mismatched_prompts, vs_plain_assisted; 3: mismatch_logit_margins, numerics,
# lossless, compile, the "specdraft plain" row and vs_ours_plain; the in-run "prediction" removed
NEAR_TIE_LOGIT_MARGIN = 0.5
"""In bfloat16/float16, a divergence whose logit margin is at most this is counted as numerics, not a bug."""
AUTOREGRESSIVE, ASSISTED, OURS, OURS_DYNAMIC, OURS_PLAIN = (
    "transformers autoregressive", "transformers assisted", "specdraft", "specdraft dynamic γ", "specdraft plain")


class ForwardTimer:
    """Seconds spent inside a module's forward, call by call (pre/post forward hooks)."""

    def __init__(self, module: torch.nn.Module | None) -> None:
        self.calls: list[float] = []
        self._handles = []
        if module is not None:
            self._handles = [module.register_forward_pre_hook(self._start),
                             module.register_forward_hook(self._stop)]

    def _start(self, module, args) -> None:
        self._began = clock(module.device)

    def _stop(self, module, args, output) -> None:
        self.calls.append(clock(module.device) - self._began)

    def take(self) -> list[float]:
        calls, self.calls = self.calls, []
        return calls

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()


@dataclass
class Run:
    """One generation of one configuration on one prompt."""

    prompt_tokens: int
    tokens: list[int]
    wall: float
    target_calls: list[float]
    draft_calls: list[float]
    stats: GenerationStats | None = None


@dataclass
class Config:
    """A way to decode: ``engine`` is one of the four names above; ``drafter`` None for autoregressive;
    ``target`` the model it runs on (its kernels: ``kernels.kernels_of``)."""

    engine: str
    target: torch.nn.Module
    drafter: Drafter | None = None
    runs: list[list[Run]] = field(default_factory=list)  # [repeat][prompt]
    peak_mb: float | None = None
    controller: GammaController | None = None  # dynamic γ: one per configuration, learning across its runs

    @property
    def kernels(self) -> str:
        return kernels.kernels_of(self.target)

    @property
    def draft_model(self) -> torch.nn.Module | None:
        return self.drafter.model if self.drafter is not None else None

    @property
    def draft(self) -> str | None:
        return self.drafter.name if self.drafter is not None else None


def assisted_kwargs(drafter, gamma: int) -> dict | None:
    """transformers ``generate`` arguments for the same draft at constant γ, or None if it has no equivalent."""
    if isinstance(drafter, PromptLookupDrafter):
        return {"prompt_lookup_num_tokens": gamma, "max_matching_ngram_size": drafter.max_ngram}
    if isinstance(drafter, ModelDrafter) and not drafter.reduced_head:
        return {"assistant_model": drafter.model, **_constant(gamma)}
    return None


def _constant(gamma: int) -> dict:
    """Constant γ: no schedule, and no early stop on the assistant's confidence (default threshold 0.4)."""
    return {"num_assistant_tokens": gamma, "num_assistant_tokens_schedule": "constant",
            "assistant_confidence_threshold": 0.0}


@contextmanager
def _assistant_settings(kwargs: dict):
    """transformers reads the assistant's schedule from the assistant's own generation config, not from
    ``generate``'s arguments: give it a copy holding the constant-γ settings while the run lasts."""
    assistant = kwargs.get("assistant_model")
    if assistant is None:
        yield
        return
    saved = assistant.generation_config
    assistant.generation_config = copy.deepcopy(saved)
    assistant.generation_config.update(**_constant(kwargs["num_assistant_tokens"]))
    try:
        yield
    finally:
        assistant.generation_config = saved


def configurations(target, drafters: list, gamma: int, plain: tuple | None = None) -> list[Config]:
    """The autoregressive reference first; per draft assisted (where transformers has it), ours, ours
    dynamic; then, given ``plain`` = (plain-kernel target, its drafters), transformers' runs on those."""
    configs = [Config(AUTOREGRESSIVE, target), Config(OURS_PLAIN, target)]
    for drafter in drafters:
        if assisted_kwargs(drafter, gamma) is not None:
            configs.append(Config(ASSISTED, target, drafter))
        configs += [Config(OURS, target, drafter), Config(OURS_DYNAMIC, target, drafter)]
    if plain is not None:
        plain_target, plain_drafters = plain
        configs.append(Config(AUTOREGRESSIVE, plain_target))
        configs += [Config(ASSISTED, plain_target, d) for d in plain_drafters if assisted_kwargs(d, gamma) is not None]
    return configs


class Bench:
    """Runs configurations on prompts and keeps every run."""

    def __init__(self, configs: list[Config], gamma: int, max_new_tokens: int, compile: bool = False) -> None:
        from transformers import GenerationConfig

        self.gamma, self.max_new_tokens, self.compile = gamma, max_new_tokens, compile
        eos = configs[0].target.generation_config.eos_token_id
        self.generation_config = GenerationConfig(
            max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos,
            pad_token_id=eos if isinstance(eos, int) else (eos[0] if eos else 0))
        self.timers = {id(c.target): ForwardTimer(c.target) for c in configs}

    def generate(self, config: Config, ids: torch.Tensor, max_new_tokens: int | None = None) -> Callable[[], tuple]:
        """A function running ``config`` once on ``ids``, returning (new tokens, stats or None)."""
        budget = max_new_tokens or self.max_new_tokens
        if config.engine == OURS_DYNAMIC and config.controller is None:
            config.controller = GammaController.around(self.gamma)
        if config.engine == OURS_PLAIN:
            return lambda: autoregressive_generate(config.target, ids, budget, compile=self.compile)
        if config.engine in (OURS, OURS_DYNAMIC):
            return lambda: speculative_generate(config.target, config.drafter, ids, budget, num_draft_tokens=self.gamma,
                                                compile=self.compile, gamma_controller=config.controller)
        kwargs = assisted_kwargs(config.drafter, self.gamma) if config.engine == ASSISTED else {}
        generation_config = self.generation_config.__class__(**{**self.generation_config.to_diff_dict(),
                                                                 "max_new_tokens": budget})

        def run():
            with torch.inference_mode(), _assistant_settings(kwargs):
                out = config.target.generate(ids, attention_mask=torch.ones_like(ids),
                                           generation_config=generation_config, **kwargs)
            return out[0, ids.shape[1]:].tolist(), None

        return run

    def run(self, config: Config, ids: torch.Tensor) -> Run:
        draft_timer = ForwardTimer(config.draft_model)
        target_timer = self.timers[id(config.target)]
        fn = self.generate(config, ids)
        target_timer.take()
        start = clock(config.target.device)
        tokens, stats = fn()
        wall = clock(config.target.device) - start
        run = Run(ids.shape[1], tokens, wall, target_timer.take(), draft_timer.take(), stats)
        draft_timer.close()
        return run

    def close(self) -> None:
        for timer in self.timers.values():
            timer.close()


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def peak_memory_mb(fn: Callable[[], object], device: torch.device, resident_bytes: int) -> float:
    """Peak memory while ``fn`` runs: CUDA's allocator peak, or on the CPU the models' weights
    (``resident_bytes``) plus the growth of resident memory above where it started (sampled every ms)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        return torch.cuda.max_memory_allocated(device) / 2**20
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)  # give back freed buffers so growth is this run's own
    except (OSError, AttributeError):
        pass
    start, peak, running = _rss_bytes(), [0], [True]

    def sample():
        while running[0]:
            peak[0] = max(peak[0], _rss_bytes())
            time.sleep(0.001)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        fn()
    finally:
        running[0] = False
        thread.join()
    peak[0] = max(peak[0], _rss_bytes())
    return (resident_bytes + max(0, peak[0] - start)) / 2**20


def weight_bytes(*models) -> int:
    """Bytes of the distinct weight tensors of ``models`` (a layer view shares the target's)."""
    seen: dict[int, int] = {}
    for model in models:
        if model is not None:
            seen.update(kernels.weight_bytes(model))
    return sum(seen.values())


def load_prompts(task: str | None, prompts_file: Path | None, limit: int) -> list[str]:
    """``limit`` prompts from a bundled task or a file (a JSON list of strings, or JSON lines of strings
    or ``{"prompt": ...}`` objects)."""
    from specdraft_eval.integration.offline_data import task_prompts

    if task and prompts_file:
        raise SpecdecError("give --task or --prompts, not both")
    if limit < 1:
        raise SpecdecError(f"--limit {limit} must be >= 1")
    if prompts_file is None:
        return task_prompts(task or "specdec_humaneval")[:limit]
    try:
        text = prompts_file.read_text()
    except OSError as exc:
        raise SpecdecError(f"cannot read --prompts {prompts_file}: {exc.strerror}; give a JSON or JSONL file") from None
    try:
        items = json.loads(text) if text.lstrip().startswith("[") else [json.loads(l) for l in text.splitlines() if l.strip()]
    except ValueError as exc:
        raise SpecdecError(f"--prompts {prompts_file} is not JSON/JSONL ({exc}); use a list of strings or "
                           'lines such as {"prompt": "..."}') from None
    prompts = [item["prompt"] if isinstance(item, dict) and "prompt" in item else item for item in items]
    if not prompts or not all(isinstance(p, str) and p for p in prompts):
        raise SpecdecError(f"--prompts {prompts_file} must hold non-empty strings (or objects with a \"prompt\")")
    return prompts[:limit]


def check_options(gamma: int, repeats: int, max_new_tokens: int) -> None:
    for name, value in (("--gamma", gamma), ("--repeats", repeats), ("--max-new-tokens", max_new_tokens)):
        if value < 1:
            raise SpecdecError(f"{name} {value} must be >= 1")


def run_bench(target, target_name: str, tokenizer, drafters: list, prompts: list[str], gamma: int, repeats: int,
              max_new_tokens: int, on_run: Callable[[], None] = lambda: None, plain: tuple | None = None,
              compile: bool = False) -> dict:
    """Warm up, run every configuration (:func:`configurations`) ``repeats`` times on every prompt
    (interleaved), measure peak memory in one extra run each, and return the summary (see :func:`summarise`).
    Raises :class:`SpecdecError` naming the prompt where an output differs from the autoregressive one."""
    check_options(gamma, repeats, max_new_tokens)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # assisted generation warns about its own defaults on every call
    configs = configurations(target, drafters, gamma, plain)
    bench = Bench(configs, gamma, max_new_tokens, compile)
    ids = [tokenizer(p, return_tensors="pt").input_ids.to(target.device) for p in prompts]
    for config in configs:  # warm-up: first calls at new shapes pay for kernel and allocator set-up
        bench.generate(config, ids[0], min(16, max_new_tokens))()
    for _ in range(repeats):
        runs = {id(c): [] for c in configs}
        for prompt in ids:
            for config in configs:
                runs[id(config)].append(bench.run(config, prompt))
                on_run()
        for config in configs:
            config.runs.append(runs[id(config)])
    longest = max(ids, key=lambda t: t.shape[1])
    for config in configs:
        resident = weight_bytes(config.target, config.draft_model)
        config.peak_mb = peak_memory_mb(bench.generate(config, longest), target.device, resident)
    bench.close()
    return summarise(configs, target, target_name, gamma, max_new_tokens, prompts, repeats,
                     [row[0].tolist() for row in ids], compile)


def spread(values: list[float]) -> dict:
    """Median, min and max of repeated measurements (bench and batch-study rows)."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def _tps(runs: list[Run]) -> float:
    return sum(len(r.tokens) for r in runs) / sum(r.wall for r in runs)


def summarise(configs: list[Config], target, target_name: str, gamma: int, max_new_tokens: int, prompts: list[str],
              repeats: int, prompt_ids: list[list[int]], compile: bool = False) -> dict:
    from specdraft_eval.measure.environment import hardware

    reference = configs[0]
    assisted = {(c.draft, c.kernels): c for c in configs if c.engine == ASSISTED}
    ours_plain = next(c for c in configs if c.engine == OURS_PLAIN)
    rows = []
    for config in configs:
        rates = [_tps(runs) for runs in config.runs]
        flat = [r for runs in config.runs for r in runs]
        wall = sum(r.wall for r in flat)
        target_s, draft_s = sum(sum(r.target_calls) for r in flat), sum(sum(r.draft_calls) for r in flat)
        draft_only = weight_bytes(target, config.draft_model) - weight_bytes(target)
        mismatched = sorted({i for runs, ref_runs in zip(config.runs, reference.runs)
                             for i, (r, ref) in enumerate(zip(runs, ref_runs)) if r.tokens != ref.tokens})
        margins = [(divergence(target, prompt_ids[i], config.runs[0][i].tokens, reference.runs[0][i].tokens) or {})
                   .get("logit_margin") for i in mismatched]
        row = {
            "engine": config.engine, "kernels": config.kernels, "draft": config.draft,
            "gamma": gamma if config.drafter else None, "dynamic_gamma": config.engine == OURS_DYNAMIC,
            "identical": not mismatched, "mismatched_prompts": mismatched, "mismatch_logit_margins": margins,
            "numerics": sum(near_tie(m, target.dtype) for m in margins),
            "generated_tokens": sum(len(r.tokens) for r in flat),
            "tokens_per_second": spread(rates),
            "vs_autoregressive": spread([a / b for a, b in zip(rates, [_tps(r) for r in reference.runs])]),
            "vs_ours_plain": spread([a / b for a, b in zip(rates, [_tps(r) for r in ours_plain.runs])]),
            "vs_assisted": None, "vs_plain_assisted": None,
            "overhead": 1 - (target_s + draft_s) / wall,
            "peak_mb": config.peak_mb,
            "draft_weights_mb": draft_only / 2**20,
        }
        for key, other in (("vs_assisted", assisted.get((config.draft, config.kernels))),
                           ("vs_plain_assisted", assisted.get((config.draft, "plain")))):
            if config.engine in (OURS, OURS_DYNAMIC) and other is not None:
                row[key] = spread([a / b for a, b in zip(rates, [_tps(r) for r in other.runs])])
        row.update(_step_figures(config, flat, target_s, draft_s))
        rows.append(row)
    ar_peak = reference.peak_mb
    for row in rows:
        row["memory_ok"] = (row["peak_mb"] <= (ar_peak + row["draft_weights_mb"]) * 1.10) if ar_peak else None
    return {"schema_version": SCHEMA_VERSION, "target": target_name, "dtype": str(target.dtype).removeprefix("torch."),
            "compile": compile,
            "hardware": hardware(target.device), "gamma": gamma, "max_new_tokens": max_new_tokens,
            "prompts": len(prompts), "repeats": repeats, "configs": rows}


def near_tie(margin: float | None, dtype: torch.dtype) -> bool:
    """Whether a divergence is reduced precision's doing: in bfloat16/float16, the target's two candidate tokens
    within ``NEAR_TIE_LOGIT_MARGIN`` of each other (one fresh forward pass); in float32, never."""
    return margin is not None and dtype in (torch.bfloat16, torch.float16) and abs(margin) <= NEAR_TIE_LOGIT_MARGIN


def check_lossless(result: dict, prompts: list[str]) -> str:
    """Raise naming the first prompt on which a configuration's output differs from the autoregressive one, unless
    every such difference is a reduced-precision near-tie (``numerics``); say what was found."""
    numerics = 0
    for row in result["configs"]:
        for i, margin in zip(row["mismatched_prompts"], row["mismatch_logit_margins"], strict=True):
            if not near_tie(margin, getattr(torch, result["dtype"])):
                where = "" if margin is None else f" with a logit margin of {margin:.3g}"
                raise SpecdecError(
                    f"{row['engine']} ({row['draft']}, {row['kernels']} kernels) differs from the target's greedy "
                    f"generate on prompt {i} ({prompts[i][:40]!r}...){where}: this is a losslessness bug, please "
                    "report it")
        numerics += row["numerics"]
    return (f"{numerics} divergence(s), each a {result['dtype']} near-tie (|logit margin| <= {NEAR_TIE_LOGIT_MARGIN})"
            if numerics else "every output identical to the target's greedy generate")


def _step_figures(config: Config, flat: list[Run], target_s: float, draft_s: float) -> dict:
    """TAR, draft ms per token, verify ms per step (a prediction from these same seconds would only measure the loop
    overhead, which the ``overhead`` column gives; ``zoo validate`` predicts from a separate profile)."""
    draft_calls = sum(len(r.draft_calls) for r in flat)
    if config.engine not in (OURS, OURS_DYNAMIC):  # one target call per step (our plain decoding: and a prefill)
        steps = sum(len(r.target_calls) for r in flat)
        return {"tar": sum(len(r.tokens) for r in flat) / steps if steps else None,
                "draft_ms_per_token": draft_s / draft_calls * 1000 if draft_calls else None,
                "verify_ms_per_step": target_s / steps * 1000 if steps else None,
                "mean_gamma": None}
    stats = sum((r.stats for r in flat), GenerationStats())
    prefill = sum(r.target_calls[0] for r in flat if r.prompt_tokens > 1 and r.target_calls)  # the prefill (engine.loop.prefill)
    verify = (target_s - prefill) / stats.steps if stats.steps else None
    drafted = stats.draft_tokens
    draft_time = draft_s if draft_calls else stats.draft_seconds  # a model-free draft's latency is its lookup
    t_draft = draft_time / drafted if drafted else 0.0
    return {"tar": stats.tar, "draft_ms_per_token": t_draft * 1000 if drafted else None,
            "verify_ms_per_step": verify * 1000 if verify else None,
            "mean_gamma": drafted / stats.steps if stats.steps else None}


def table_rows(result: dict) -> list[dict]:
    """The summary as flat rows for a text table."""

    def spread(s: dict | None, fmt: str) -> str | None:
        return None if s is None else f"{s['median']:{fmt}} [{s['min']:{fmt}}–{s['max']:{fmt}}]"

    def pct(x: float | None) -> str | None:
        return None if x is None else f"{100 * x:+.1f}%"

    return [{
        "engine": r["engine"], "draft": r["draft"], "tok/s": spread(r["tokens_per_second"], ".2f"),
        "kernels": r["kernels"], "×AR": spread(r["vs_autoregressive"], ".2f"),
        "×ours plain": spread(r["vs_ours_plain"], ".2f"),
        "×assisted": spread(r["vs_assisted"], ".2f"), "×plain assisted": spread(r["vs_plain_assisted"], ".2f"),
        "TAR": r["tar"], "mean γ": r["mean_gamma"], "draft ms/tok": r["draft_ms_per_token"],
        "verify ms/step": r["verify_ms_per_step"], "overhead": pct(r["overhead"]),
        "peak MB": r["peak_mb"], "same tokens": r["identical"], "numerics": r["numerics"],
    } for r in result["configs"]]


def bench(target_name: str, drafts: list[str], prompts: list[str], gamma: int, repeats: int, max_new_tokens: int,
          settings: LoadSettings, compile: bool = False, tick: Tick = no_progress) -> dict:
    """``zoo bench``: load the target with ``settings`` (and, where ours runs other kernels, a plain copy for
    transformers as users run it), time every configuration (:func:`run_bench`) and refuse a result whose tokens
    differ beyond reduced precision's near-ties (:func:`check_lossless`)."""
    from zoo.loading import load_run

    check_options(gamma, repeats, max_new_tokens)
    target, drafters = load_run(target_name, drafts, settings)
    model, tokenizer = target.model, target.tokenizer
    plain = None
    if settings.kernels != "plain":  # transformers as users run it, too
        plain_target, plain_drafters = load_run(target_name, drafts, replace(settings, kernels="plain"))
        plain = plain_target.model, plain_drafters
    tick(0, total=repeats * len(prompts) * len(configurations(model, drafters, gamma, plain)))
    result = run_bench(model, target_name, tokenizer, drafters, prompts, gamma, repeats, max_new_tokens,
                       on_run=tick, plain=plain, compile=compile)
    result["lossless"] = check_lossless(result, prompts)
    return result
