"""``--model specdec``'s model_args, parsed once: :class:`SpecdecArgs` (ours, typed) apart from what lm-eval's ``hf``
model takes (:func:`hf_arguments`: the target resolved to files, tensor and data parallelism checked)."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, fields

import torch

from specdraft_eval.drafts.kind import draft_kinds
from specdraft_eval.drafts.spec import DraftSpec
from specdraft_eval.engine.params import GammaPolicy, RunSettings
from specdraft_eval.errors import SpecdecError
from specdraft_eval.models import kernels as kernel_paths
from specdraft_eval.models.targets import ALIASES, local_dir, resolve

log = logging.getLogger(__name__)
SCORED = ("target", "draft")
"""Which model scores log-likelihood requests (``score=``)."""
ENGINES = ("specdec", "vllm")
"""Who decodes (``engine=``): our engine, or vLLM's servers (:mod:`~specdraft_eval.integration.vllm_engine`)."""
DEFAULT_GAMMA = 4


def as_bool(name: str, value) -> bool:
    if isinstance(value, bool):
        return value
    if str(value).lower() in {"true", "1", "yes"}:
        return True
    if str(value).lower() in {"false", "0", "no"}:
        return False
    raise SpecdecError(f"model_args {name}={value!r} is not a boolean: use {name}=true or {name}=false")


def as_positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) and not str(value).isdigit():
        raise SpecdecError(f"model_args {name}={value!r} is not an integer: use e.g. {name}=4")
    if int(value) < 1:
        raise SpecdecError(f"model_args {name}={value} must be >= 1")
    return int(value)


@dataclass(frozen=True)
class SpecdecArgs:
    """Our model_args: ``draft`` (a draft string or ``auto``), ``num_draft_tokens`` (γ) and ``dynamic_gamma`` (None:
    the default, or what ``auto`` says), ``baseline`` (also time plain decoding of every request, for the speedup),
    ``seed``, ``kernels`` (CPU linears: ``onednn`` pre-packed, the default; ``plain`` PyTorch's, the default with
    ``compile``), ``use_kernels`` (transformers' hub kernels), ``static_cache``, ``compile`` (implies
    ``static_cache``), ``score`` (``target`` or ``draft``: who scores log-likelihood requests), ``engine``
    (``specdec``, ours, or ``vllm``) and ``server`` (``engine=vllm``: the URL of a vLLM server already running)."""

    draft: str = "prompt-lookup"
    num_draft_tokens: int | None = None
    dynamic_gamma: bool | None = None
    baseline: bool = False
    seed: int | None = None
    kernels: str | None = None
    use_kernels: bool = False
    static_cache: bool = False
    compile: bool = False
    score: str = "target"
    engine: str = "specdec"
    server: str | None = None

    @classmethod
    def take(cls, model_args: dict) -> SpecdecArgs:
        """Ours taken out of ``model_args`` (the rest is the hf model's) and checked, each with a one-line error."""
        given = {f.name: model_args.pop(f.name) for f in fields(cls) if f.name in model_args}
        parameters = {name for kind in draft_kinds().values() for name in kind.parameters}
        taken = {name: model_args.pop(name) for name in sorted(parameters) if name in model_args}
        if taken:  # a kind's settings: into the draft string, which alone names the configuration
            given["draft"] = DraftSpec.parse(given.get("draft", cls.draft)).with_parameters(taken)
        for name in ("baseline", "use_kernels", "static_cache", "compile", "dynamic_gamma"):
            if given.get(name) is not None:
                given[name] = as_bool(name, given[name])
        if given.get("num_draft_tokens") is not None:
            given["num_draft_tokens"] = as_positive_int("num_draft_tokens", given["num_draft_tokens"])
        if given.get("seed") is not None:
            given["seed"] = int(given["seed"])
        if given.get("score", "target") not in SCORED:
            raise SpecdecError(f"model_args score={given['score']!r}: use score=target or score=draft")
        if given.get("engine", "specdec") not in ENGINES:
            raise SpecdecError(f"model_args engine={given['engine']!r}: use engine=specdec (ours) or engine=vllm")
        if given.get("engine") == "vllm":
            ours = [name for name in ("dynamic_gamma", "static_cache", "compile", "kernels", "use_kernels")
                    if given.get(name)] + (["score=draft"] if given.get("score") == "draft" else [])
            if ours:
                raise SpecdecError(f"model_args {', '.join(ours)}: our engine's settings, which engine=vllm does not "
                                   "run; leave them out, or drop engine=vllm")
        elif given.get("server"):
            raise SpecdecError("model_args server=URL names a vLLM server: add engine=vllm")
        compiled = given.get("compile", False)  # compiled steps need a static cache and plain kernels by default
        given |= {"kernels": kernel_paths.choose(given.get("kernels"), compiled),
                  "static_cache": given.get("static_cache", False) or compiled}
        return cls(**given)

    def run(self, gamma: int = DEFAULT_GAMMA, dynamic_gamma: bool = False) -> RunSettings:
        """The run's engine settings: γ and dynamic γ as given, else ``gamma`` and ``dynamic_gamma`` (``auto``'s)."""
        policy = GammaPolicy(gamma if self.num_draft_tokens is None else self.num_draft_tokens,
                             dynamic_gamma if self.dynamic_gamma is None else self.dynamic_gamma)
        return RunSettings(policy, self.static_cache, self.compile)


def hf_arguments(pretrained, kwargs: dict) -> tuple[str, object, dict]:
    """(the target's name, what HFLM loads, HFLM's keyword arguments): an alias, directory, ``.gguf`` or hub id
    resolved to files; tensor parallelism across all processes only; ``parallelize`` only where GPUs are."""
    name = pretrained if isinstance(pretrained, str) else type(pretrained).__name__
    kwargs = dict(kwargs)
    if isinstance(pretrained, str) and "gguf_file" not in kwargs:
        source = resolve(pretrained)
        source = local_dir(source) if pretrained in ALIASES else source
        pretrained = source.path
        if source.gguf_file:
            kwargs["gguf_file"] = source.gguf_file
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if kwargs.get("tp_plan") and int(kwargs.get("tp_size") or world) != world:
        raise SpecdecError(f"tp_size={kwargs['tp_size']} with {world} processes: data parallel across groups of "
                           "tensor-parallel processes is not supported (lm-eval's tensor-parallel mode runs every "
                           f"document on every process); start tp_size processes (torchrun --nproc_per_node "
                           f"{kwargs['tp_size']}) or leave tp_size out")
    if as_bool("parallelize", kwargs.get("parallelize", False)) and not torch.cuda.is_available():
        log.warning("parallelize=true spreads the target over GPUs (accelerate's device_map); none is visible, "
                    "so it runs on the CPU")
        kwargs["parallelize"] = False
    if world > 1 and not torch.cuda.is_available():
        os.environ.setdefault("ACCELERATE_USE_CPU", "1")  # several processes on CPUs: accelerate's gloo group
    return name, pretrained, kwargs
