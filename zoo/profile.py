"""``zoo profile``: measured latencies on this machine (t_target, t_verify(γ), t_draft) and sweeps."""

from __future__ import annotations

import statistics
from pathlib import Path

import torch

from specdraft_eval.errors import SpecdecError
from specdraft_eval.kernels import kernels_of
from specdraft_eval.environment import ModelFacts, default_device, hardware
from specdraft_eval.profiles import (
    Calibration,
    DraftTiming,
    Profile,
    Spread,
    default_profile_path,
    read_profile,
    write_calibration,
    write_profile,
)
from specdraft_eval.sampling import Sampler
from specdraft_eval.targets import LoadSettings


WARMUP_STEPS = 3


def context_tokens(length: int, vocab: int) -> list[int]:
    return torch.randint(0, vocab, (length,), generator=torch.Generator().manual_seed(0)).tolist()


@torch.inference_mode()
def engine_latency(target, drafters: list, gammas: list[int], prompts: list[list[int]],
                   steps: int) -> tuple[dict[int, Spread], dict[str, DraftTiming]]:
    """Latencies as a generation experiences them, on the engine's own code and clock.

    For each prompt: prefill the target as the engine does, then for ``steps`` steps (after a warm-up) on a
    cache that grows by the target's own next token each step: time each draft's ``propose`` at every γ and
    the target's :func:`~specdraft_eval.engine.verify_step` of k = max(γ)..0 draft tokens, rolling the cache
    back after each, exactly as a speculative step does. Returns spreads of ``t_verify`` per k, and per draft
    its :class:`DraftTiming` (``t_draft`` per drafted token, ``draft_prefill_ms_per_token``: its first read of a
    prompt, per prompt token).
    """
    from specdraft_eval.drafts.base import Proposal
    from specdraft_eval.engine import clock, prefill, verify_step

    device, sampler = target.device, Sampler()
    verify: dict[int, list[float]] = {k: [] for k in range(max(gammas, default=0) + 1)}
    per_token = {d.name: [] for d in drafters}
    per_call = {d.name: [] for d in drafters}  # calls that drafted nothing (prompt lookup without a match)
    first_read = {d.name: [] for d in drafters}  # (seconds, prompt tokens) of a draft's first propose
    for prompt in prompts:
        tokens = list(prompt)
        cache = prefill(target, [tokens])
        for drafter in drafters:
            drafter.reset()
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
                if k:
                    cache.rollback(len(tokens) - 1)
                if timed:
                    verify[k].append(seconds)
            tokens.append(next_token)
    drafts = {}
    for drafter in drafters:
        draft = Spread.of_seconds(per_token[drafter.name] or per_call[drafter.name])
        # the first propose reads the prompt in place of one single-token draft forward
        extra = [max(seconds - draft.median / 1000, 0.0) / length for seconds, length in first_read[drafter.name]]
        facts = ModelFacts.of(drafter.model)
        drafts[drafter.name] = DraftTiming(draft, statistics.median(extra) * 1000, facts.parameters_m,
                                           facts.kv_bytes_per_token)
    return {k: Spread.of_seconds(v) for k, v in verify.items()}, drafts


@torch.inference_mode()
def width_depth_sweep(repeats: int = 7, context: int = 128, device: str | None = None,
                      dtype: torch.dtype | None = None) -> list[dict]:
    """ms per token of random-weight Llama models: equal parameter count at several depth/width splits,
    then depth at fixed width and width at fixed depth (the paper: latency ~ depth, hardly width). On a GPU
    the models run there in bfloat16; each row says the bytes of weights one step reads."""
    from transformers import LlamaConfig, LlamaForCausalLM

    device = device or default_device()
    dtype = dtype or (torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32)

    def run(layers: int, hidden: int, group: str) -> dict:
        config = LlamaConfig(
            vocab_size=1024, hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
            num_attention_heads=max(hidden // 64, 1), num_key_value_heads=max(hidden // 64, 1),
            max_position_embeddings=context + 64,
        )
        torch.manual_seed(0)
        model = LlamaForCausalLM(config).to(device, dtype).eval()
        ms = engine_latency(model, [], [], [context_tokens(context, 1024)], repeats)[0][0].median
        params = sum(p.numel() for p in model.model.layers.parameters())
        streamed = sum(p.numel() for p in model.parameters()) - model.get_input_embeddings().weight.numel()
        return {"group": group, "layers": layers, "hidden_size": hidden, "layer_params_m": params / 1e6,
                "weight_bytes": streamed * torch.finfo(dtype).bits // 8, "ms_per_token": ms}

    rows = [run(l, h, "equal params") for l, h in [(2, 1024), (8, 512), (32, 256)]]
    rows += [run(l, 512, "depth") for l in (2, 4, 8, 16)]
    rows += [run(4, h, "width") for h in (256, 512, 1024, 2048)]
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


def sweep(repeats: int, calibrate: str | None, settings: LoadSettings) -> tuple[Calibration, Path | None]:
    """Run :func:`width_depth_sweep` on ``settings``' device and dtype and fit the latency model to it; with
    ``calibrate``, store the fit under that name for ``zoo rank --gpu NAME`` (its path is returned)."""
    from zoo.hardware import fit_sweep

    dtype = getattr(torch, settings.dtype)
    rows = width_depth_sweep(repeats, device=settings.device, dtype=dtype)
    fit = fit_sweep(rows, calibrate or hardware(settings.device), hardware(settings.device),
                    dtype_bytes=torch.finfo(dtype).bits // 8)
    return fit, write_calibration(fit) if calibrate else None


def profile_target(target_name: str, drafts: list[str], gammas: list[int], context: int, repeats: int,
                   out: Path | None, settings: LoadSettings) -> tuple[Profile, Path]:
    """``zoo profile``: load the target and drafts with ``settings`` and :func:`measure_and_write`."""
    from specdraft_eval.drafts import load_draft

    model, tokenizer = settings.load(target_name)
    drafters = [load_draft(name, model, tokenizer) for name in drafts]
    return measure_and_write(model, target_name, drafters, gammas, context, repeats, out)


def table_rows(profile: Profile) -> tuple[list[dict], list[dict]]:
    """The profile as two text tables: verification by draft length, then the drafts."""
    return ([{"draft tokens k": k, "t_verify_ms": s.median, "min–max": str(s)} for k, s in sorted(profile.t_verify.items())],
            [{"draft": d, "t_draft_ms": f.t_draft_ms, "min–max": str(f.t_draft),
              "draft_prefill_ms_per_token": f.draft_prefill_ms_per_token, "parameters_m": f.parameters_m,
              "kv_bytes_per_token": f.kv_bytes_per_token} for d, f in profile.drafts.items()])
