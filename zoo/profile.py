"""``zoo profile``: measured latencies on this machine (t_target, t_verify(γ), t_draft) and sweeps."""

from __future__ import annotations

import statistics
from pathlib import Path

import torch

from specdraft_eval.engine.sampling import Sampler
from specdraft_eval.errors import SpecdecError
from specdraft_eval.files import write_json
from specdraft_eval.measure.environment import ModelFacts, default_device, hardware
from specdraft_eval.measure.profiles import (
    Calibration,
    DraftTiming,
    Profile,
    Spread,
    SweepRow,
    default_profile_path,
    read_profile,
    write_calibration,
    write_profile,
)
from specdraft_eval.models.kernels import kernels_of
from specdraft_eval.models.targets import LoadSettings

WARMUP_STEPS = 3


def context_tokens(length: int, vocab: int) -> list[int]:
    return torch.randint(0, vocab, (length,), generator=torch.Generator().manual_seed(0)).tolist()


@torch.inference_mode()
def engine_latency(target, drafters: list, gammas: list[int], prompts: list[list[int]],
                   steps: int) -> tuple[dict[int, Spread], dict[str, DraftTiming]]:
    """Latencies as a generation experiences them, on the engine's own code and clock.

    For each prompt: prefill the target as the engine does, then for ``steps`` steps (after a warm-up) on a
    cache that grows by the target's own next token each step: time each draft's ``propose`` at every γ and
    the target's :func:`~specdraft_eval.engine.loop.verify_step` of k = max(γ)..0 draft tokens, rolling the cache
    back after each, exactly as a speculative step does. Returns spreads of ``t_verify`` per k, and per draft
    its :class:`DraftTiming` (``t_draft`` per drafted token, ``draft_prefill_ms_per_token``: its first read of a
    prompt, per prompt token).
    """
    from specdraft_eval.engine.drafter import Proposal
    from specdraft_eval.engine.loop import prefill
    from specdraft_eval.engine.taps import FeatureTap
    from specdraft_eval.engine.verify import verify_step
    from specdraft_eval.measure.timers import clock

    device, sampler = target.device, Sampler()
    verify: dict[int, list[float]] = {k: [] for k in range(max(gammas, default=0) + 1)}
    per_token = {d.name: [] for d in drafters}
    per_call = {d.name: [] for d in drafters}  # calls that drafted nothing (prompt lookup without a match)
    first_read = {d.name: [] for d in drafters}  # (seconds, prompt tokens) of a draft's first propose
    reading = [d for d in drafters if d.taps]  # heads fed the target's features of every kept position
    if len({d.taps for d in reading}) > 1:
        raise SpecdecError("profile heads that read different hidden states of the target one at a time")
    tap = FeatureTap(target, reading[0].taps) if reading else None
    try:
        for prompt in prompts:
            tokens = list(prompt)
            cache = prefill(target, [tokens])
            prefilled = tap.take() if tap else None  # [1, prompt - 1, features]
            for drafter in drafters:
                drafter.reset()
                if prefilled is not None and drafter.taps:
                    drafter.observe(prefilled[0])
                start = clock(device)
                drafter.propose(tokens, 1, sampler)
                first_read[drafter.name].append((clock(device) - start, len(tokens)))
            for step in range(WARMUP_STEPS + steps):
                timed = step >= WARMUP_STEPS
                for drafter in drafters:
                    for gamma in gammas:
                        start = clock(device)
                        proposal = drafter.propose(tokens, gamma, sampler)
                        seconds = clock(device) - start
                        if timed:
                            k = len(proposal.tokens)
                            (per_token[drafter.name] if k else per_call[drafter.name]).append(seconds / max(k, 1))
                for k in sorted(verify, reverse=True):  # k = 0 last: it leaves the cache one token longer
                    filler = Proposal([tokens[-1]] * k)
                    start = clock(device)
                    [(_, next_token)] = verify_step(target, cache, [tokens], [filler], [sampler])
                    seconds = clock(device) - start
                    features = tap.take() if tap else None
                    if k:
                        cache.rollback(len(tokens) - 1)
                    elif features is not None:
                        for drafter in reading:
                            drafter.observe(features[0, :1])
                    if timed:
                        verify[k].append(seconds)
                tokens.append(next_token)
    finally:
        if tap:
            tap.close()
    drafts = {}
    for drafter in drafters:
        draft = Spread.of_seconds(per_token[drafter.name] or per_call[drafter.name])
        # the first propose reads the prompt in place of one single-token draft forward
        extra = [max(seconds - draft.median / 1000, 0.0) / length for seconds, length in first_read[drafter.name]]
        facts = ModelFacts.of(drafter.model)
        drafts[drafter.name] = DraftTiming(draft, statistics.median(extra) * 1000, facts.parameters_m,
                                           facts.kv_bytes_per_token)
    return {k: Spread.of_seconds(v) for k, v in verify.items()}, drafts


SWEEP_SHAPES = {
    # group: [(layers, hidden)] -- on a GPU, shapes whose weight reads (up to ~7 GB) separate bandwidth from the
    # per-layer and per-step costs; on the CPU, shapes small enough for a 2-core machine
    "cuda": {"depth": [(n, 4096) for n in (1, 2, 4, 8, 16, 32)], "width": [(4, h) for h in (2048, 8192)],
             "equal params": [(24, 2048), (5, 4096)]},
    "cpu": {"equal params": [(2, 1024), (8, 512), (32, 256)], "depth": [(n, 512) for n in (2, 4, 8, 16)],
            "width": [(4, h) for h in (256, 1024, 2048)]},
}


@torch.inference_mode()
def width_depth_sweep(repeats: int = 7, context: int = 128, device: str | None = None,
                      dtype: torch.dtype | None = None, rounds: int = 3) -> list[dict]:
    """ms per token of random-weight Llama models by depth and width (:data:`SWEEP_SHAPES`; the paper: latency
    ~ depth, hardly width): every shape built and warmed up first, then measured in ``rounds`` interleaved rounds
    (so a slow drift of the machine hits every shape alike); the median over rounds. On a GPU the models run in
    bfloat16 with a 32000-token vocabulary; each row says the bytes of weights one step reads."""
    from transformers import LlamaConfig, LlamaForCausalLM

    device = device or default_device()
    kind = torch.device(device).type
    dtype = dtype or (torch.bfloat16 if kind == "cuda" else torch.float32)
    vocab = 32000 if kind == "cuda" else 1024
    shapes = [(group, layers, hidden) for group, sizes in SWEEP_SHAPES[kind].items() for layers, hidden in sizes]
    models = []
    for _, layers, hidden in shapes:
        config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=int(hidden * 2.6875),
                             num_hidden_layers=layers, num_attention_heads=max(hidden // 128, 1),
                             num_key_value_heads=max(hidden // 128, 1), max_position_embeddings=context + 64)
        torch.manual_seed(0)
        with torch.device(device):
            models.append(LlamaForCausalLM(config).to(dtype).eval())
    prompt = context_tokens(context, vocab)
    for model in models:  # warm-up per shape: its first use is not measured
        engine_latency(model, [], [], [prompt], 1)
    samples: list[list[float]] = [[] for _ in shapes]
    for _ in range(rounds):
        for i, model in enumerate(models):
            samples[i].append(engine_latency(model, [], [], [prompt], repeats)[0][0].median)
    rows = []
    for (group, layers, hidden), model, times in zip(shapes, models, samples, strict=True):
        params = sum(p.numel() for p in model.model.layers.parameters())
        streamed = sum(p.numel() for p in model.parameters()) - model.get_input_embeddings().weight.numel()
        rows.append(SweepRow(group, layers, hidden, streamed * torch.finfo(dtype).bits // 8, statistics.median(times),
                             min(times), max(times), layer_params_m=params / 1e6))
    return rows


def measure_and_write(target, target_name: str, drafters: list, gammas: list[int], context: int, repeats: int,
                      out: Path | None, prompts: list[list[int]] | None = None) -> tuple[Profile, Path]:
    """Measure (:func:`engine_latency`) and write a hardware profile, merging into an existing one of the same
    target and context. ``prompts`` default: one random prompt of ``context`` tokens. Returns it and its path.

    ``out`` None: the default path in the cache, where an unusable old profile is replaced with a warning; a
    named ``out`` that is unusable is an error.
    """
    if context < 1 or repeats < 1:
        raise SpecdecError("--context and --repeats must be >= 1")
    path = out or default_profile_path(target_name, str(target.device), kernels_of(target))
    old = read_profile(path, named=out is not None)
    same = old is not None and old.context == context
    verify, drafts = engine_latency(target, drafters, gammas,
                                    prompts or [context_tokens(context, target.config.vocab_size)], repeats)
    profile = Profile(hardware(target.device), target_name, context, repeats,
                      {**(old.t_verify if same else {}), **verify}, {**(old.drafts if same else {}), **drafts})
    write_profile(path, profile)
    return profile, path


def ensure_profile(target, target_name: str, drafters: list, gammas: list[int], context: int, repeats: int) -> Profile:
    """The cached profile of this machine, measuring first whatever it lacks (drafts, γ, or the context)."""
    path = default_profile_path(target_name, str(target.device), kernels_of(target))
    profile = read_profile(path, named=False)
    if profile and profile.context == context:
        missing = [d for d in drafters if d.name not in profile.drafts]
        if not missing and set(range(max(gammas) + 1)) <= set(profile.t_verify):
            return profile
    else:
        missing = drafters
    return measure_and_write(target, target_name, missing, gammas, context, repeats, path)[0]


def sweep(repeats: int, calibrate: str | None, settings: LoadSettings,
          out: Path | None = None) -> tuple[Calibration, list[Path]]:
    """Run :func:`width_depth_sweep` on ``settings``' device and dtype and fit the latency model to it; with
    ``calibrate``, store the fit under that name for ``zoo rank --gpu NAME``; with ``out``, also write it there
    (the leaderboard's latency figure reads such files). Returns the fit and the paths written."""
    from zoo.latency_model import fit_sweep

    dtype = getattr(torch, settings.dtype)
    rows = width_depth_sweep(repeats, device=settings.device, dtype=dtype)
    fit = fit_sweep(rows, calibrate or hardware(settings.device), hardware(settings.device),
                    dtype_bytes=torch.finfo(dtype).bits // 8)
    paths = [write_calibration(fit)] if calibrate else []
    if out is not None:
        write_json(out, fit.to_json())
        paths.append(out)
    return fit, paths


def profile_target(target_name: str, drafts: list[str], gammas: list[int], context: int, repeats: int,
                   out: Path | None, settings: LoadSettings) -> tuple[Profile, Path]:
    """``zoo profile``: load the target and drafts with ``settings`` and :func:`measure_and_write`."""
    from zoo.loading import load_run

    target, drafters = load_run(target_name, drafts, settings)
    return measure_and_write(target.model, target_name, drafters, gammas, context, repeats, out)


def table_rows(profile: Profile) -> tuple[list[dict], list[dict]]:
    """The profile as two text tables: verification by draft length, then the drafts."""
    return ([{"draft tokens k": k, "t_verify_ms": s.median, "min–max": str(s)} for k, s in sorted(profile.t_verify.items())],
            [{"draft": d, "t_draft_ms": f.t_draft_ms, "min–max": str(f.t_draft),
              "draft_prefill_ms_per_token": f.draft_prefill_ms_per_token, "parameters_m": f.parameters_m,
              "kv_bytes_per_token": f.kv_bytes_per_token} for d, f in profile.drafts.items()])
