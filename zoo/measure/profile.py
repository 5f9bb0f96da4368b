"""``zoo profile``: measured latencies on this machine (t_target, t_verify(γ), t_draft) and sweeps."""

from __future__ import annotations

import statistics
from pathlib import Path

import torch

from specdraft_eval.files import write_json
from specdraft_eval.measure.environment import default_device, hardware
from specdraft_eval.models.targets import LoadSettings
from specdraft_eval.results.profiles import (
    Calibration,
    Profile,
    SweepRow,
    write_calibration,
)
from zoo.measure.timing import context_tokens, engine_latency, measure_and_write

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
                      dtype: torch.dtype | None = None, rounds: int = 3) -> list[SweepRow]:
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


def sweep(repeats: int, calibrate: str | None, settings: LoadSettings,
          out: Path | None = None) -> tuple[Calibration, list[Path]]:
    """Run :func:`width_depth_sweep` on ``settings``' device and dtype and fit the latency model to it; with
    ``calibrate``, store the fit under that name for ``zoo rank --gpu NAME``; with ``out``, also write it there
    (the leaderboard's latency figure reads such files). Returns the fit and the paths written."""
    from zoo.measure.latency_model import fit_sweep

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
    from zoo.measure.loading import load_run

    target, drafters = load_run(target_name, drafts, settings)
    return measure_and_write(target.model, target_name, drafters, gammas, context, repeats, out)


def table_rows(profile: Profile) -> tuple[list[dict], list[dict]]:
    """The profile as two text tables: verification by draft length, then the drafts."""
    verify = sorted(profile.t_verify.items())
    return ([{"draft tokens k": k, "t_verify_ms": s.median, "min–max": str(s)} for k, s in verify],
            [{"draft": d, "t_draft_ms": f.t_draft_ms, "min–max": str(f.t_draft),
              "draft_prefill_ms_per_token": f.draft_prefill_ms_per_token, "parameters_m": f.parameters_m,
              "kv_bytes_per_token": f.kv_bytes_per_token} for d, f in profile.drafts.items()])
