"""``zoo profile``: measured latencies on this machine (t_target, t_verify(γ), t_draft) and sweeps."""

from __future__ import annotations

import re
import statistics
import time
from pathlib import Path

import torch

from specdraft_eval import kv
from specdraft_eval.record import hardware, model_facts, read_profile, write_profile
from specdraft_eval.sampling import Sampler
from specdraft_eval.errors import SpecdecError
from specdraft_eval.targets import cache_root


def _median_ms(fn, repeats: int, warmup: int = 3) -> float:
    for _ in range(warmup):  # first calls at a new shape pay for kernel set-up
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def context_tokens(length: int, vocab: int) -> list[int]:
    return torch.randint(0, vocab, (length,), generator=torch.Generator().manual_seed(0)).tolist()


@torch.inference_mode()
def target_latency(target, gammas: list[int], context: int, repeats: int) -> tuple[float, dict[int, float]]:
    """(ms per autoregressive token, {γ: ms per verification of γ drafts}) at ``context`` tokens."""
    tokens = context_tokens(context, target.config.vocab_size)
    cache = kv.new_cache()
    kv.forward(target, tokens, cache, 1)

    def step(n: int):
        def run():
            kv.forward(target, tokens[:n], cache, n)
            kv.rollback(cache, context)

        return run

    t_target = _median_ms(step(1), repeats)
    return t_target, {g: _median_ms(step(g + 1), repeats) for g in gammas}


@torch.inference_mode()
def draft_latency(drafter, vocab: int, context: int, repeats: int, gamma: int = 4) -> float:
    """ms per drafted token: propose ``gamma`` tokens after one new token, as in a decoding step."""
    tokens = context_tokens(context, vocab)
    sampler = Sampler()
    drafter.reset()
    drafter.propose(tokens, gamma, sampler)
    return _median_ms(lambda: drafter.propose(tokens, gamma, sampler), repeats) / gamma


def default_profile_path(target: str) -> Path:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{hardware('cpu' if not torch.cuda.is_available() else 'cuda')}--{target}")
    return cache_root() / "profiles" / f"{slug}.json"


@torch.inference_mode()
def width_depth_sweep(repeats: int = 7, context: int = 128) -> list[dict]:
    """ms per token of random-weight Llama models: equal parameter count at several depth/width splits,
    then depth at fixed width and width at fixed depth (the paper: latency ~ depth, hardly width)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    def run(layers: int, hidden: int, group: str) -> dict:
        config = LlamaConfig(
            vocab_size=1024, hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
            num_attention_heads=max(hidden // 64, 1), num_key_value_heads=max(hidden // 64, 1),
            max_position_embeddings=context + 16,
        )
        torch.manual_seed(0)
        model = LlamaForCausalLM(config).eval()
        ms, _ = target_latency(model, [], context, repeats)
        params = sum(p.numel() for p in model.model.layers.parameters())
        return {"group": group, "layers": layers, "hidden_size": hidden, "layer_params_m": params / 1e6, "ms_per_token": ms}

    rows = [run(l, h, "equal params") for l, h in [(2, 1024), (8, 512), (32, 256)]]
    rows += [run(l, 512, "depth") for l in (2, 4, 8, 16)]
    rows += [run(4, h, "width") for h in (256, 512, 1024, 2048)]
    return rows


def measure_and_write(target, target_name: str, drafters: list, gammas: list[int], context: int, repeats: int,
                      out: Path | None) -> dict:
    """Measure and write (merging into an existing profile of the same target and context) a hardware profile.

    ``out`` None: the default path in the cache, where an unusable old profile is replaced with a warning; a
    named ``out`` that is unusable is an error.
    """
    if context < 1 or repeats < 1:
        raise SpecdecError("--context and --repeats must be >= 1")
    path = out or default_profile_path(target_name)
    old = read_profile(path, named=out is not None) or {}
    same = old.get("context") == context
    t_target, t_verify = target_latency(target, gammas, context, repeats)
    figures = dict(old["drafts"]) if same else {}
    for drafter in drafters:
        facts = model_facts(getattr(drafter, "model", None))
        figures[drafter.name] = {
            "t_draft_ms": draft_latency(drafter, target.config.vocab_size, context, repeats),
            "parameters_m": facts["parameters_m"],
            "kv_bytes_per_token": facts["kv_bytes_per_token"],
        }
    data = {"hardware": hardware(target.device), "target": target_name, "context": context, "repeats": repeats,
            "t_target_ms": t_target, "t_verify_ms": {**old["t_verify_ms"], **t_verify} if same else t_verify,
            "drafts": figures}
    write_profile(path, data)
    return {**data, "path": str(path)}


def ensure_profile(target, target_name: str, drafters: list, gammas: list[int], context: int, repeats: int) -> dict:
    """The cached profile of this machine, measuring first whatever it lacks (drafts, γ, or the context)."""
    path = default_profile_path(target_name)
    profile = read_profile(path, named=False)
    if profile and profile["context"] == context:
        missing = [d for d in drafters if d.name not in profile["drafts"]]
        if not missing and set(gammas) <= set(profile["t_verify_ms"]):
            return profile
    else:
        missing = drafters
    return measure_and_write(target, target_name, missing, gammas, context, repeats, path)
