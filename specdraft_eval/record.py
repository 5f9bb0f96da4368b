"""The measurement record: the ``specdec`` block of a results file, and the files the zoo keeps.

This module alone owns the schema (``SCHEMA_VERSION``), writes files (:func:`atomic_output`,
:func:`atomic_write`), reads them with a version check (:func:`read_results`, :func:`scan_results`,
:func:`read_profile`) and merges records (:meth:`SpecdecRecord.merge`). Figure conventions (TAR counts the
target's own token; per-position counts as vLLM's) are in :mod:`specdraft_eval.stats`.

Schema history: 1 called tokens emitted per step ``mean_accepted_length`` and wrote ``tar`` for accepted
draft tokens per step; 2 (now) writes ``tar`` for tokens emitted per step (the paper's TAR), adds
``accepted_per_step``, per-position counters and per-task raw counters. Version 1 blocks are converted on read.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from specdraft_eval.analytical import predicted_from_latencies
from specdraft_eval.errors import SpecdecError
from specdraft_eval.stats import GenerationStats

SCHEMA_VERSION = 2
MAX_MISMATCH_DETAILS = 100  # baseline mismatches described in a record (all of them are counted)
PROFILE_SCHEMA_VERSION = 2
MAX_MISMATCH_DETAILS = 100  # baseline mismatches described in a record (all of them are counted)
"""2: latencies measured as the engine runs (growing cache, the engine's clock), t_verify_ms keyed by the
number of draft tokens k (0: an autoregressive step), with spreads; 1 (timed on a fixed cache) is re-measured."""
COUNTER_FIELDS = {f.name for f in fields(GenerationStats)}


class RecordError(SpecdecError):
    """A results or profile file that cannot be used; the message names the file and the fix."""


class RecordWarning(UserWarning):
    """An unusable file skipped where a command reads many (the CLIs print it as one line)."""


# --- writing -----------------------------------------------------------------------------------------------


@contextmanager
def atomic_output(path: Path, directory: bool = False) -> Iterator[Path]:
    """Yield a temporary file or folder beside ``path``; on success it replaces ``path`` in one rename, on any
    error or interruption it is removed, so ``path`` is never half-written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if directory:
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=path.parent))
    else:
        fd, name = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
        os.close(fd)
        tmp = Path(name)
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o666 & ~umask)  # mkstemp's 0600 would hide a published page or profile from other users
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True) if tmp.is_dir() else tmp.unlink(missing_ok=True)
        raise


def atomic_write(path: Path, data: str | bytes) -> None:
    """Write text or bytes to ``path`` atomically."""
    with atomic_output(path) as tmp:
        tmp.write_bytes(data.encode() if isinstance(data, str) else data)


def write_json(path: Path, data: dict) -> None:
    atomic_write(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def _load_json(path: Path) -> object:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise RecordError(f"{path}: not readable JSON ({reason}): the file is corrupt or truncated; "
                          "regenerate or remove it") from None


def _check_version(path: Path, found, current: int, what: str) -> None:
    if not isinstance(found, int) or isinstance(found, bool) or found < 1:
        raise RecordError(f"{path}: not a {what} (schema version {found!r}); remove it from the input")
    if found > current:
        raise RecordError(f"{path}: written by a newer specdraft-eval ({what} schema {found} > {current}); "
                          "upgrade specdraft-eval to read it")


# --- the specdec record ------------------------------------------------------------------------------------


def _version(package: str) -> str | None:
    try:
        return version(package)
    except PackageNotFoundError:
        return None


def hardware(device) -> str:
    """A short name for the device a run used."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return f"CPU: {line.split(':', 1)[1].strip()}"
    except OSError:
        pass
    return f"CPU: {platform.processor() or platform.machine()}"


def model_facts(model) -> dict:
    """Size of a draft or target: parameters (millions), decoder layers, KV-cache bytes per token in bf16.

    ``model`` None (a model-free draft such as prompt lookup) gives zeros.
    """
    if model is None:
        return {"parameters_m": 0.0, "layers": 0, "kv_bytes_per_token": 0}
    c = model.config
    heads = c.num_attention_heads
    kv_heads = getattr(c, "num_key_value_heads", heads)
    return {
        "parameters_m": sum(p.numel() for p in model.parameters()) / 1e6,
        "layers": c.num_hidden_layers,
        "kv_bytes_per_token": 2 * c.num_hidden_layers * kv_heads * (c.hidden_size // heads) * 2,
    }


@dataclass
class SpecdecRecord:
    """One run's speculative-decoding measurements: what ran where, and counters per task.

    Every figure in the block (:meth:`to_block`) is derived from the counters, so records of the same
    configuration merge exactly (:meth:`merge`: counts summed, times added).
    """

    target: str
    draft: str
    num_draft_tokens: int
    dynamic_gamma: bool = False
    hardware: str = ""
    versions: dict = field(default_factory=dict)
    draft_parameters_m: float = 0.0
    draft_layers: int = 0
    per_task: dict[str, GenerationStats] = field(default_factory=dict)
    latencies: dict | None = None  # separately measured (a profile): what predicted_tokens_per_second uses
    # per mismatch (at most MAX_MISMATCH_DETAILS): task, first differing token index, both tokens, logit margin
    baseline_mismatch_details: list[dict] = field(default_factory=list)
    processes: int = 1  # how many processes' counters this record holds (data-parallel ranks, merged runs)

    @classmethod
    def new(cls, target: str, draft: str, num_draft_tokens: int, dynamic_gamma: bool, device,
            per_task: dict[str, GenerationStats], draft_model=None,
            latencies: dict | None = None, baseline_mismatch_details: list[dict] | None = None) -> "SpecdecRecord":
        """A record of a run on ``device`` now (hardware name and package versions filled in)."""
        facts = model_facts(draft_model)
        return cls(target, draft, num_draft_tokens, dynamic_gamma, hardware(device),
                   {p: _version(p) for p in ("specdraft-eval", "lm-eval", "torch", "transformers")},
                   facts["parameters_m"], facts["layers"], dict(per_task), latencies,
                   list(baseline_mismatch_details or [])[:MAX_MISMATCH_DETAILS])

    @property
    def total(self) -> GenerationStats:
        return sum(self.per_task.values(), GenerationStats())

    @property
    def baseline_mismatches(self) -> int:
        return self.total.baseline_mismatches

    def key(self) -> tuple:
        """What must agree for two records to merge."""
        return self.target, self.draft, self.num_draft_tokens, self.dynamic_gamma, self.hardware

    def merge(self, other: "SpecdecRecord") -> "SpecdecRecord":
        """The record of both runs (or of two data-parallel ranks of one run): counters summed per task, times
        added (so tokens/s is the rate per process and speedup compares like with like), mismatch details
        concatenated, ``processes`` added."""
        if self.key() != other.key():
            raise SpecdecError(f"cannot merge records of different runs: {self.key()} and {other.key()}")
        tasks = sorted(set(self.per_task) | set(other.per_task))
        per_task = {t: self.per_task.get(t, GenerationStats()) + other.per_task.get(t, GenerationStats()) for t in tasks}
        details = (self.baseline_mismatch_details + other.baseline_mismatch_details)[:MAX_MISMATCH_DETAILS]
        return replace(self, per_task=per_task, baseline_mismatch_details=details,
                       processes=self.processes + other.processes)

    def to_block(self) -> dict:
        """The ``config.specdec`` block of a results file."""
        total = self.total

        def predicted(stats: GenerationStats) -> float | None:
            return predicted_from_latencies(stats, self.latencies) if self.latencies else None

        return {
            "schema_version": SCHEMA_VERSION,
            "target": self.target,
            "draft": self.draft,
            "num_draft_tokens": self.num_draft_tokens,
            "dynamic_gamma": self.dynamic_gamma,
            "draft_parameters_m": self.draft_parameters_m,
            "draft_layers": self.draft_layers,
            "hardware": self.hardware,
            "versions": self.versions,
            "generations": total.generations,
            "processes": self.processes,
            **total.summary(),
            "predicted_tokens_per_second": predicted(total),
            "latencies": self.latencies,
            "baseline_mismatches": self.baseline_mismatches,
            "baseline_mismatch_details": self.baseline_mismatch_details,
            "counters": total.as_dict(),
            "per_task": {task: {"generations": s.generations, "baseline_mismatches": s.baseline_mismatches, **s.summary(),
                                "predicted_tokens_per_second": predicted(s), "counters": s.as_dict()}
                         for task, s in sorted(self.per_task.items())},
        }

    @classmethod
    def from_block(cls, block: dict, path: Path | str = "<block>") -> "SpecdecRecord":
        """Read a ``config.specdec`` block of any known schema version (version 1 is converted)."""
        if not isinstance(block, dict):
            raise RecordError(f"{path}: no config.specdec block (not a specdec run); remove it from the input")
        _check_version(Path(path), block.get("schema_version"), SCHEMA_VERSION, "specdec record")
        try:
            reader = _task_counters if block["schema_version"] >= 2 else _task_counters_v1
            per_task = {task: reader(figures) for task, figures in block["per_task"].items()}
            details = list(block.get("baseline_mismatch_details") or [])
            _restore_mismatch_counts(per_task, int(block.get("baseline_mismatches", 0)), details)
            return cls(block["target"], block["draft"], int(block["num_draft_tokens"]),
                       bool(block.get("dynamic_gamma", False)), block.get("hardware") or "",
                       block.get("versions") or {}, block.get("draft_parameters_m") or 0.0,
                       block.get("draft_layers") or 0, per_task, block.get("latencies"), details,
                       int(block.get("processes", 1)))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise RecordError(f"{path}: malformed specdec record ({type(exc).__name__}: {exc}); "
                              "regenerate or remove it") from None


def _restore_mismatch_counts(per_task: dict[str, GenerationStats], total: int, details: list[dict]) -> None:
    """Files written before mismatches were counted per task hold only the total: give each task the
    mismatches its details name, and any beyond the details (or of no named task) to the first task."""
    if sum(s.baseline_mismatches for s in per_task.values()) >= total or not per_task:
        return
    for where in details:
        if where.get("task") in per_task:
            per_task[where["task"]].baseline_mismatches += 1
    first = next(iter(per_task.values()))
    first.baseline_mismatches += total - sum(s.baseline_mismatches for s in per_task.values())


def _task_counters(figures: dict) -> GenerationStats:
    return GenerationStats(**{k: v for k, v in figures["counters"].items() if k in COUNTER_FIELDS})


def _task_counters_v1(figures: dict) -> GenerationStats:
    """Counters rebuilt from a version-1 task entry's figures (no per-position counts were kept then)."""
    steps, drafted, generated = figures["steps"], figures["draft_tokens"], figures["generated_tokens"]
    tps, base_tps = figures.get("tokens_per_second"), figures.get("baseline_tokens_per_second")
    return GenerationStats(
        generations=figures.get("generations", 0), steps=steps, draft_tokens=drafted,
        accepted_tokens=figures["accepted_tokens"], generated_tokens=generated,
        draft_seconds=(figures.get("draft_ms_per_token") or 0.0) * drafted / 1000,
        verify_seconds=(figures.get("verify_ms_per_step") or 0.0) * steps / 1000,
        decode_seconds=generated / tps if tps else 0.0,
        baseline_tokens=generated if base_tps else 0, baseline_seconds=generated / base_tps if base_tps else 0.0,
    )


@dataclass
class ResultsFile:
    """A results file's record, with the task scores and date lm-eval wrote beside it."""

    path: Path
    record: SpecdecRecord
    results: dict
    date: object


def read_results(path: Path) -> ResultsFile:
    """Read one lm-eval results file; :class:`RecordError` (one line naming the file) when it is unusable."""
    data = _load_json(path)
    block = (data.get("config") or {}).get("specdec") if isinstance(data, dict) else None
    if not isinstance(block, dict):
        raise RecordError(f"{path}: no config.specdec block (not a specdec run); remove it from the input")
    return ResultsFile(Path(path), SpecdecRecord.from_block(block, path), data.get("results") or {}, data.get("date"))


def scan_results(paths: list[Path]) -> list[ResultsFile]:
    """Every usable results file under ``paths`` (folders searched for ``results_*.json``).

    A file the user named that is unusable is an error; one found in a folder is skipped with a
    :class:`RecordWarning`.
    """
    found = []
    for root in map(Path, paths):
        if root.is_file():
            found.append(read_results(root))
        elif root.is_dir():
            for file in sorted(root.rglob("results_*.json")):
                try:
                    found.append(read_results(file))
                except RecordError as exc:
                    warnings.warn(f"skipping {exc}", RecordWarning, stacklevel=2)
        else:
            raise SpecdecError(f"results path {root} does not exist: give folders written by lm_eval --output_path")
    return found


# --- profiles ----------------------------------------------------------------------------------------------


def default_profile_path(target: str, device: str | None = None, kernels: str = "plain") -> Path:
    """Where this machine's profile of ``target`` is cached (per hardware, target and kernel path: see
    :mod:`specdraft_eval.kernels`; plain-kernel profiles keep the name they had before kernel paths existed)."""
    import re

    import torch

    from specdraft_eval.targets import cache_root

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    suffix = "" if kernels == "plain" else f"--{kernels}"
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{hardware(device)}--{target}{suffix}")
    return cache_root() / "profiles" / f"{slug}.json"


def write_profile(path: Path, data: dict) -> None:
    write_json(path, {**data, "schema_version": PROFILE_SCHEMA_VERSION, "kind": "specdraft_eval.profile"})


def read_profile(path: Path, named: bool) -> dict | None:
    """A profile file, or None when absent or of an older schema (a cache: measured again).

    Unusable: an error if the user ``named`` it, else a warning and None.
    """
    if not Path(path).is_file():
        return None
    try:
        data = _load_json(path)
        if not isinstance(data, dict) or data.get("kind") != "specdraft_eval.profile":
            raise RecordError(f"{path}: not a zoo profile; give another --out or remove it")
        _check_version(Path(path), data.get("schema_version"), PROFILE_SCHEMA_VERSION, "profile")
        if data["schema_version"] < PROFILE_SCHEMA_VERSION:
            return None
        data["t_verify_ms"] = {int(k): float(v) for k, v in data["t_verify_ms"].items()}
        data["t_verify_spread"] = {int(k): v for k, v in data.get("t_verify_spread", {}).items()}
        data["t_target_ms"], data["context"] = float(data["t_target_ms"]), int(data["context"])
        if not isinstance(data.get("drafts"), dict):
            raise TypeError("drafts is not a mapping")
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        if isinstance(exc, RecordError):
            error = exc
        else:
            error = RecordError(f"{path}: malformed profile ({type(exc).__name__}: {exc}); remove it to re-measure")
        if named:
            raise error from None
        warnings.warn(f"ignoring {error}; measuring again", RecordWarning, stacklevel=2)
        return None
    return data


def profile_latencies(profile: dict | None, draft: str) -> dict | None:
    """What a prediction for ``draft`` needs from a profile (None when the profile lacks the draft)."""
    if not profile or draft not in profile["drafts"]:
        return None
    figures = profile["drafts"][draft]
    return {"t_verify_ms": {str(k): v for k, v in sorted(profile["t_verify_ms"].items())},
            "t_draft_ms": figures["t_draft_ms"], "draft_prefill_ms_per_token": figures["draft_prefill_ms_per_token"],
            "source": f"profile on {profile['hardware']} at context {profile['context']}"}


# --- latency calibrations ----------------------------------------------------------------------------------

CALIBRATION_SCHEMA_VERSION = 1


def calibration_path(name: str) -> Path:
    from specdraft_eval.targets import cache_root

    return cache_root() / "calibrations" / f"{name.lower().replace('_', '-')}.json"


def write_calibration(name: str, data: dict) -> Path:
    """Store a fitted latency calibration (``zoo profile --sweep --calibrate NAME``) for ``zoo rank --gpu NAME``."""
    path = calibration_path(name)
    write_json(path, {**data, "name": name, "kind": "specdraft_eval.calibration",
                      "schema_version": CALIBRATION_SCHEMA_VERSION})
    return path


def read_calibration(name: str) -> dict | None:
    """The calibration named ``name``, or None; an unusable one is an error naming the file."""
    path = calibration_path(name)
    if not path.is_file():
        return None
    data = _load_json(path)
    if not isinstance(data, dict) or data.get("kind") != "specdraft_eval.calibration":
        raise RecordError(f"{path}: not a zoo calibration; remove it or calibrate again")
    _check_version(path, data.get("schema_version"), CALIBRATION_SCHEMA_VERSION, "calibration")
    if not all(isinstance(data.get(k), (int, float)) for k in ("per_layer_ms", "bandwidth_gb_s")):
        raise RecordError(f"{path}: malformed calibration; calibrate again with zoo profile --sweep --calibrate {name}")
    return data
