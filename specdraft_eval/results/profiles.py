"""Latency profiles (``zoo profile``) and latency calibrations (``zoo profile --sweep --calibrate``): their
schemas, paths in the cache, and version-checked reads. Both are caches of measurements on one machine."""

from __future__ import annotations

import re
import statistics
import warnings
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path

from specdraft_eval.files import (
    RecordError,
    RecordWarning,
    cache_root,
    check_version,
    load_json,
    write_json,
)
from specdraft_eval.measure.analytical import Latencies
from specdraft_eval.measure.environment import default_device, hardware

PROFILE_SCHEMA_VERSION = 2
"""2: latencies measured as the engine runs (growing cache, the engine's clock), t_verify_ms keyed by the
number of draft tokens k (0: an autoregressive step), with spreads; 1 (timed on a fixed cache) is re-measured."""
PROFILE_KIND = "specdraft_eval.profile"
CALIBRATION_SCHEMA_VERSION = 2
"""2: a per-step term, each constant's standard error, and a bandwidth that may be None (not identified)."""
CALIBRATION_KIND = "specdraft_eval.calibration"


@dataclass(frozen=True)
class Spread:
    """Median, min and max of repeated samples (milliseconds for timings: :meth:`of_seconds`), and how many
    there were."""

    median: float
    min: float
    max: float
    n: int

    @classmethod
    def of(cls, samples: list[float]) -> Spread:
        """The spread of ``samples`` as they are (ratios, tokens/s)."""
        return cls(statistics.median(samples), min(samples), max(samples), len(samples))

    @classmethod
    def of_seconds(cls, samples: list[float]) -> Spread:
        return cls(statistics.median(samples) * 1000, min(samples) * 1000, max(samples) * 1000, len(samples))

    def to_json(self) -> dict:
        return {"median": self.median, "min": self.min, "max": self.max, "n": self.n}

    @classmethod
    def from_json(cls, data: dict) -> Spread:
        return cls(float(data["median"]), float(data["min"]), float(data["max"]), int(data.get("n", 0)))

    def __str__(self) -> str:
        return f"{self.min:.3g}–{self.max:.3g}"


@dataclass(frozen=True)
class DraftTiming:
    """One draft's latencies in a profile, and its size."""

    t_draft: Spread  # per drafted token
    draft_prefill_ms_per_token: float
    parameters_m: float = 0.0
    kv_bytes_per_token: int = 0

    @property
    def t_draft_ms(self) -> float:
        return self.t_draft.median

    def to_json(self) -> dict:
        return {"t_draft_ms": self.t_draft_ms, "t_draft_spread": self.t_draft.to_json(),
                "draft_prefill_ms_per_token": self.draft_prefill_ms_per_token, "parameters_m": self.parameters_m,
                "kv_bytes_per_token": self.kv_bytes_per_token}

    @classmethod
    def from_json(cls, data: dict) -> DraftTiming:
        spread = data.get("t_draft_spread") or {"median": data["t_draft_ms"], "min": data["t_draft_ms"],
                                                "max": data["t_draft_ms"], "n": 0}
        return cls(Spread.from_json(spread), float(data["draft_prefill_ms_per_token"]),
                   float(data.get("parameters_m") or 0.0), int(data.get("kv_bytes_per_token") or 0))


@dataclass
class Profile:
    """Latencies of a target on one machine: verification of k draft tokens (k = 0: a plain step) and each
    draft's time per drafted token, at a context length."""

    hardware: str
    target: str
    context: int
    repeats: int
    t_verify: dict[int, Spread]
    drafts: dict[str, DraftTiming] = field(default_factory=dict)

    @property
    def t_target_ms(self) -> float:
        return self.t_verify[0].median

    @property
    def t_verify_ms(self) -> dict[int, float]:
        return {k: s.median for k, s in sorted(self.t_verify.items())}

    def latencies(self, draft: str) -> Latencies | None:
        """What a prediction for ``draft`` needs (None when the profile lacks the draft)."""
        timing = self.drafts.get(draft)
        if timing is None:
            return None
        return Latencies(self.t_verify_ms, timing.t_draft_ms, timing.draft_prefill_ms_per_token,
                         f"profile on {self.hardware} at context {self.context}")

    def to_json(self) -> dict:
        return {"hardware": self.hardware, "target": self.target, "context": self.context, "repeats": self.repeats,
                "t_target_ms": self.t_target_ms, "t_verify_ms": {str(k): v for k, v in self.t_verify_ms.items()},
                "t_verify_spread": {str(k): s.to_json() for k, s in sorted(self.t_verify.items())},
                "drafts": {name: t.to_json() for name, t in self.drafts.items()},
                "schema_version": PROFILE_SCHEMA_VERSION, "kind": PROFILE_KIND}

    @classmethod
    def from_json(cls, data: dict) -> Profile:
        spreads = data.get("t_verify_spread") or {}
        t_verify = {int(k): Spread.from_json(spreads.get(k) or spreads.get(str(k)) or
                                             {"median": v, "min": v, "max": v, "n": 0})
                    for k, v in data["t_verify_ms"].items()}
        if not isinstance(data.get("drafts"), dict):
            raise TypeError("drafts is not a mapping")
        return cls(data["hardware"], data["target"], int(data["context"]), int(data.get("repeats", 0)), t_verify,
                   {name: DraftTiming.from_json(t) for name, t in data["drafts"].items()})


def default_profile_path(target: str, device: str | None = None, kernels: str = "plain") -> Path:
    """Where this machine's profile of ``target`` is cached (per hardware, target and kernel path: see
    :mod:`specdraft_eval.models.kernels`; plain-kernel profiles keep the name they had before kernel paths existed)."""
    suffix = "" if kernels == "plain" else f"--{kernels}"
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{hardware(device or default_device())}--{target}{suffix}")
    return cache_root() / "profiles" / f"{slug}.json"


def write_profile(path: Path, profile: Profile) -> None:
    write_json(path, profile.to_json())


def read_profile(path: Path, named: bool) -> Profile | None:
    """A profile file, or None when absent or of an older schema (a cache: measured again).

    Unusable: an error if the user ``named`` it, else a warning and None.
    """
    if not Path(path).is_file():
        return None
    try:
        data = load_json(path)
        if not isinstance(data, dict) or data.get("kind") != PROFILE_KIND:
            raise RecordError(f"{path}: not a zoo profile; give another --out or remove it")
        check_version(Path(path), data.get("schema_version"), PROFILE_SCHEMA_VERSION, "profile")
        if data["schema_version"] < PROFILE_SCHEMA_VERSION:
            return None
        return Profile.from_json(data)
    except (RecordError, KeyError, TypeError, ValueError, AttributeError) as exc:
        error = exc if isinstance(exc, RecordError) else RecordError(
            f"{path}: malformed profile ({type(exc).__name__}: {exc}); remove it to re-measure")
        if named:
            raise error from None
        warnings.warn(f"ignoring {error}; measuring again", RecordWarning, stacklevel=2)
        return None


@dataclass
class SweepRow:
    """One shape of a depth/width sweep: ms per batch-1 step (the median over rounds, with min and max where
    measured), the shape (``group``: depth, width, equal params or named; ``shape``: a named shape's name) and,
    after a fit, the latency model's value (``fitted_ms``)."""

    group: str
    layers: int
    hidden_size: int
    weight_bytes: int
    ms_per_token: float
    ms_min: float | None = None
    ms_max: float | None = None
    shape: str | None = None
    layer_params_m: float | None = None
    fitted_ms: float | None = None

    @property
    def low(self) -> float:
        return self.ms_per_token if self.ms_min is None else self.ms_min

    @property
    def high(self) -> float:
        return self.ms_per_token if self.ms_max is None else self.ms_max

    def to_json(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_json(cls, data, path: Path, index: int) -> SweepRow:
        """A row read from ``path``; a missing or mistyped field is a one-line error naming the file and field."""
        if not isinstance(data, dict):
            raise RecordError(f"{path}: sweep row {index} is not an object; rerun zoo profile --sweep --out")
        values = {}
        for f in fields(cls):
            value = data.get(f.name)
            kinds = {"group": str, "shape": str, "layers": int, "hidden_size": int, "weight_bytes": int}
            kind = kinds.get(f.name, float)
            required = f.default is MISSING
            if value is None and not required:
                continue
            if not isinstance(value, (int, float) if kind is float else kind) or isinstance(value, bool):
                raise RecordError(f"{path}: sweep row {index} has {'no' if value is None else 'a bad'} {f.name!r} "
                                  f"({value!r}); rerun zoo profile --sweep --out")
            values[f.name] = float(value) if kind is float else value
        return cls(**values)


@dataclass
class Calibration:
    """A latency-model fit to a depth/width sweep on one device, stored under a name for ``zoo rank --gpu NAME``:
    ms per step = ``step_ms`` + ``per_layer_ms`` × layers + weight bytes / ``bandwidth_gb_s``, each constant with
    its standard error (``uncertainty``). ``bandwidth_gb_s`` None: the sweep could not identify it (a host-bound
    step; ``note`` says why), and the model takes the longer of the fixed cost and the datasheet roofline."""

    name: str
    per_layer_ms: float
    bandwidth_gb_s: float | None
    hardware: str = ""
    runtime: str = "eager"
    dtype_bytes: int = 2
    max_relative_error: float | None = None
    rows: list[SweepRow] = field(default_factory=list)
    step_ms: float = 0.0
    uncertainty: dict[str, float] = field(default_factory=dict)
    note: str | None = None

    def __str__(self) -> str:
        def pm(key: str, value: float) -> str:
            return f"{value:.3g}" + (f" ± {self.uncertainty[key]:.2g}" if key in self.uncertainty else "")

        memory = (f" + weight bytes / {pm('bandwidth_gb_s', self.bandwidth_gb_s)} GB/s" if self.bandwidth_gb_s
                  else " (host-bound: the roofline overlaps it)")
        return (f"fit: ms/token = {pm('step_ms', self.step_ms)} ms + {pm('per_layer_ms', self.per_layer_ms)} ms × "
                f"layers{memory} (max error {self.max_relative_error:.1%})" + (f"; {self.note}" if self.note else ""))

    def to_json(self) -> dict:
        return {"name": self.name, "step_ms": self.step_ms, "per_layer_ms": self.per_layer_ms,
                "bandwidth_gb_s": self.bandwidth_gb_s, "uncertainty": self.uncertainty, "note": self.note,
                "hardware": self.hardware, "runtime": self.runtime, "dtype_bytes": self.dtype_bytes,
                "max_relative_error": self.max_relative_error, "rows": [row.to_json() for row in self.rows],
                "kind": CALIBRATION_KIND, "schema_version": CALIBRATION_SCHEMA_VERSION}


def calibration_path(name: str) -> Path:
    return cache_root() / "calibrations" / f"{name.lower().replace('_', '-')}.json"


def write_calibration(calibration: Calibration) -> Path:
    """Store a fitted latency calibration for ``zoo rank --gpu NAME``."""
    path = calibration_path(calibration.name)
    write_json(path, calibration.to_json())
    return path


def read_calibration(name: str) -> Calibration | None:
    """The calibration named ``name``, or None; an unusable one is an error naming the file."""
    path = calibration_path(name)
    return read_calibration_file(path, name) if path.is_file() else None


def read_calibration_file(path: Path, name: str = "NAME") -> Calibration:
    """A calibration (or a sweep saved with ``zoo profile --sweep --out``) from ``path``; an unusable one is an
    error naming the file."""
    data = load_json(path)
    if not isinstance(data, dict) or data.get("kind") != CALIBRATION_KIND:
        raise RecordError(f"{path}: not a zoo calibration; remove it or calibrate again")
    check_version(path, data.get("schema_version"), CALIBRATION_SCHEMA_VERSION, "calibration")
    bandwidth = data.get("bandwidth_gb_s")
    if not isinstance(data.get("per_layer_ms"), (int, float)) or not isinstance(bandwidth, (int, float, type(None))):
        raise RecordError(f"{path}: malformed calibration; calibrate again with zoo profile --sweep --calibrate {name}")
    rows = data.get("rows") or []
    if not isinstance(rows, list):
        raise RecordError(f"{path}: 'rows' is not a list; calibrate again with zoo profile --sweep --calibrate {name}")
    return Calibration(data.get("name", name), float(data["per_layer_ms"]),
                       float(bandwidth) if bandwidth is not None else None, data.get("hardware", ""),
                       data.get("runtime", "eager"), int(data.get("dtype_bytes", 2)), data.get("max_relative_error"),
                       [SweepRow.from_json(row, path, i) for i, row in enumerate(rows)],
                       float(data.get("step_ms", 0.0)), data.get("uncertainty") or {}, data.get("note"))
