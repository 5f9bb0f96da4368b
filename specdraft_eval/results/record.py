"""The measurement record: the ``specdec`` block of a results file, read back, merged, and grouped by
configuration.

This module alone owns the record's schema (``SCHEMA_VERSION``), reads results files with a version check
(:func:`read_results`, :func:`scan_results`) and merges records (:meth:`SpecdecRecord.merge`,
:func:`configurations`). Figure conventions (TAR counts the target's own token; per-position counts as vLLM's)
are in :mod:`specdraft_eval.measure.stats`; writing goes through :mod:`specdraft_eval.files`.

Schema history: 1 called tokens emitted per step ``mean_accepted_length`` and wrote ``tar`` for accepted
draft tokens per step; 2 writes ``tar`` for tokens emitted per step (the paper's TAR), adds
``accepted_per_step``, per-position counters and per-task raw counters; 3 (now) counts only the output up to a
stop (a final step's tokens past it are ``overshoot_tokens``), names the acceptance figures as vLLM, SPEED-Bench,
SGLang and Spec-Bench do, and names the CPU's thread count in ``hardware``. Version 1 blocks are converted on read;
records before version 3 are read but are not :attr:`SpecdecRecord.current` (their speedups counted tokens past the
stop), so the leaderboard and ``draft=auto`` leave them out.
"""

from __future__ import annotations

import statistics
import warnings
from dataclasses import dataclass, field, fields, replace
from itertools import zip_longest
from pathlib import Path

from specdraft_eval.errors import SpecdecError
from specdraft_eval.files import RecordError, RecordWarning, check_version, load_json
from specdraft_eval.measure.analytical import Latencies, predicted_from_latencies
from specdraft_eval.measure.environment import ModelFacts, hardware, versions
from specdraft_eval.measure.stats import Divergence, GenerationStats

__all__ = ["SCHEMA_VERSION", "MAX_MISMATCH_DETAILS", "RecordError", "RecordWarning", "Runtime", "RunKey", "Trial",
           "SpecdecRecord", "ResultsFile", "read_results", "each_configuration", "scan_results", "sample_figures",
           "Configuration", "configurations"]

SCHEMA_VERSION = 3
MAX_MISMATCH_DETAILS = 100
"""Baseline mismatches described in a record (all of them are counted)."""
COUNTER_FIELDS = {f.name for f in fields(GenerationStats)}


# --- what a run was ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Runtime:
    """How the target ran, where it changes the timings: its weights' dtype, the CPU linear kernels, the static
    cache, compiled steps, the attention backend, its tensor-parallel degree (processes sharing its layers; a
    loaded model's: :func:`specdraft_eval.models.targets.runtime_of`) and the engine that decoded (``""``: ours;
    ``"vllm 0.32.0"``: ``engine=vllm``, so its rows never merge with ours). ``""``: not recorded (files written
    before it was)."""

    dtype: str = ""
    kernels: str = ""
    static_cache: bool = False
    compile: bool = False
    attention: str = ""
    tensor_parallel: int = 1
    engine: str = ""

    @property
    def engine_name(self) -> str:
        """The engine that decoded, without its version: ``specdec`` (ours) or ``vllm``."""
        return self.engine.split(" ")[0] or "specdec"

    @property
    def complete(self) -> bool:
        """Whether every field was recorded (files from before a field existed leave it ``""``)."""
        return bool(self.dtype and self.kernels and self.attention)

    def __str__(self) -> str:
        steps = " compiled" if self.compile else " static-cache" if self.static_cache else ""
        sharded = f" tp{self.tensor_parallel}" if self.tensor_parallel > 1 else ""
        if self.engine:
            return f"{self.engine} {self.dtype or '?'}{steps}"
        return f"{self.dtype or '?'} {self.kernels or '?'} {self.attention or '?'}{steps}{sharded}"


@dataclass(frozen=True)
class RunKey:
    """What must agree for two runs' figures to merge (records, the leaderboard's rows, ``draft=auto``'s
    candidates): the target, the hardware, the draft (its tree shape is part of its name), γ, dynamic γ, the
    :class:`Runtime` and the batch size (the most requests decoded together)."""

    target: str
    hardware: str
    draft: str
    num_draft_tokens: int
    dynamic_gamma: bool
    runtime: Runtime = Runtime()
    batch_size: int = 1
    kind_versions: tuple[tuple[str, int], ...] = ()  # (kind, implementation version) of each draft kind it used


@dataclass
class Trial:
    """One configuration tried while ``draft=auto`` tuned inside a run: its counters over the requests it decoded
    (with the baseline's when the run had one) and whether it was chosen."""

    draft: str
    num_draft_tokens: int
    dynamic_gamma: bool
    stats: GenerationStats
    requests: int = 0
    rounds: int = 0  # successive-halving rounds it took part in
    chosen: bool = False

    def to_json(self) -> dict:
        s = self.stats
        return {"draft": self.draft, "num_draft_tokens": self.num_draft_tokens, "dynamic_gamma": self.dynamic_gamma,
                "requests": self.requests, "rounds": self.rounds, "chosen": self.chosen, "tar": s.tar,
                "tokens_per_second": s.tokens_per_second, "speedup": s.speedup, "counters": s.as_dict()}

    @classmethod
    def from_json(cls, data: dict) -> Trial:
        return cls(data["draft"], int(data["num_draft_tokens"]), bool(data["dynamic_gamma"]),
                   _task_counters(data), int(data.get("requests", 0)), int(data.get("rounds", 0)),
                   bool(data.get("chosen", False)))


# --- the specdec record ------------------------------------------------------------------------------------


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
    latencies: Latencies | None = None  # separately measured (a profile): what predicted_tokens_per_second uses
    # per mismatch (at most MAX_MISMATCH_DETAILS): task, first differing token index, both tokens, logit margin
    baseline_mismatch_details: list[Divergence] = field(default_factory=list)
    processes: int = 1  # how many processes' counters this record holds (data-parallel ranks, merged runs)
    runtime: Runtime = Runtime()
    use_kernels: bool = False  # whether transformers' hub kernels were asked for
    score: str = "target"  # which model scored the log-likelihood tasks (score=draft: the draft)
    schema_version: int = SCHEMA_VERSION  # of the block it was read from
    batch_size: int = 1  # the most requests decoded together
    tuning: list[Trial] = field(default_factory=list)  # draft=auto tuned inside the run: the configurations tried
    # on its first requests (their counters are here, not in per_task, which holds the chosen one's requests)
    draft_state: dict = field(default_factory=dict)  # the drafter's own report (Drafter.describe), e.g. suffix_cache
    kind_versions: dict[str, int] = field(default_factory=dict)  # each draft kind's implementation version
    # (DraftKind.version; files from before it was recorded: {}, read as version 1 of each kind)
    auto: dict[str, dict] = field(default_factory=dict)  # draft=auto: per task, the configuration it decoded with
    # ({"draft", "num_draft_tokens", "dynamic_gamma", "reason"})
    configurations: list[SpecdecRecord] = field(default_factory=list)  # draft=auto: the run's other configurations
    # (tasks that chose another), each its own record
    engine_counters: dict = field(default_factory=dict)  # engine=vllm: vLLM's own /metrics counters over the run
    # (the difference of snapshots; names as vLLM's without the vllm: prefix), beside ours derived per request

    @property
    def current(self) -> bool:
        """Measured by today's code: this schema version (figures counted up to the stop) and a complete runtime."""
        return self.schema_version == SCHEMA_VERSION and self.runtime.complete

    @classmethod
    def new(cls, target: str, draft: str, num_draft_tokens: int, dynamic_gamma: bool, device,
            per_task: dict[str, GenerationStats], draft_model=None,
            latencies: Latencies | None = None, baseline_mismatch_details: list[Divergence] | None = None, *,
            runtime: Runtime = Runtime(), use_kernels: bool = False, score: str = "target", batch_size: int = 1,
            tuning: list[Trial] | None = None, draft_state: dict | None = None,
            kind_versions: dict[str, int] | None = None, engine_counters: dict | None = None) -> SpecdecRecord:
        """A record of a run on ``device`` now (hardware name and package versions filled in)."""
        facts = ModelFacts.of(draft_model)
        return cls(target, draft, num_draft_tokens, dynamic_gamma, hardware(device), versions(),
                   facts.parameters_m, facts.layers, dict(per_task), latencies,
                   list(baseline_mismatch_details or [])[:MAX_MISMATCH_DETAILS], runtime=runtime,
                   use_kernels=use_kernels, score=score, batch_size=batch_size, tuning=list(tuning or []),
                   draft_state=dict(draft_state or {}), kind_versions=dict(kind_versions or {}),
                   engine_counters=dict(engine_counters or {}))

    @property
    def total(self) -> GenerationStats:
        return sum(self.per_task.values(), GenerationStats())

    @property
    def baseline_mismatches(self) -> int:
        return self.total.baseline_mismatches

    def key(self) -> RunKey:
        """What must agree for two records to merge."""
        return RunKey(self.target, self.hardware, self.draft, self.num_draft_tokens, self.dynamic_gamma, self.runtime,
                      self.batch_size, tuple(sorted(self.kind_versions.items())))

    @property
    def code_version(self) -> str | None:
        """The specdraft-eval version that measured it."""
        return self.versions.get("specdraft-eval")

    @property
    def with_tuning(self) -> GenerationStats:
        """The whole run's counters: the chosen configuration's and every tuning trial's."""
        return sum((t.stats for t in self.tuning), self.total)

    def merge(self, other: SpecdecRecord) -> SpecdecRecord:
        """The record of both runs (or of two data-parallel ranks of one run): counters summed per task, times
        added (so tokens/s is the rate per process and speedup compares like with like), mismatch details
        concatenated, ``processes`` added."""
        if self.key() != other.key():
            raise SpecdecError(f"cannot merge records of different runs: {self.key()} and {other.key()}")
        tasks = sorted(set(self.per_task) | set(other.per_task))
        per_task = {t: self.per_task.get(t, GenerationStats()) + other.per_task.get(t, GenerationStats())
                    for t in tasks}
        details = (self.baseline_mismatch_details + other.baseline_mismatch_details)[:MAX_MISMATCH_DETAILS]
        return replace(self, per_task=per_task, baseline_mismatch_details=details,
                       processes=self.processes + other.processes, tuning=self.tuning + other.tuning,
                       draft_state=_merged_state(self.draft_state, other.draft_state),
                       engine_counters=_merged_state(self.engine_counters, other.engine_counters))

    @classmethod
    def of_configurations(cls, records: list[SpecdecRecord], auto: dict[str, dict]) -> SpecdecRecord:
        """One run's record from its configurations' (``draft=auto`` choosing per task; data-parallel ranks' too):
        records of one configuration merged, the one that decoded the most requests first, the others in
        ``configurations``, ``auto`` naming each task's."""
        merged: dict[RunKey, SpecdecRecord] = {}
        for record in records:
            key = record.key()
            merged[key] = merged[key].merge(record) if key in merged else record
        first, *others = sorted(merged.values(), key=lambda r: -r.total.generations)
        return replace(first, auto=dict(auto), configurations=others)

    def flat(self) -> list[SpecdecRecord]:
        """Each configuration's record on its own (:meth:`of_configurations` undone)."""
        return [replace(self, auto={}, configurations=[]), *self.configurations]

    def predicted(self, stats: GenerationStats) -> float | None:
        """Tokens/s the analytical model predicts for ``stats``' counts from the separately measured latencies."""
        return predicted_from_latencies(stats, self.latencies) if self.latencies else None

    def to_block(self) -> dict:
        """The ``config.specdec`` block of a results file."""
        total, predicted = self.total, self.predicted

        return {
            "schema_version": SCHEMA_VERSION,
            "target": self.target,
            "draft": self.draft,
            "num_draft_tokens": self.num_draft_tokens,
            "dynamic_gamma": self.dynamic_gamma,
            "draft_parameters_m": self.draft_parameters_m,
            "draft_layers": self.draft_layers,
            "hardware": self.hardware,
            "dtype": self.runtime.dtype or None,
            "use_kernels": self.use_kernels,
            "runtime": {"static_cache": self.runtime.static_cache, "compile": self.runtime.compile,
                        "attention": self.runtime.attention or None, "kernels": self.runtime.kernels or None,
                        "score": self.score, **({"engine": self.runtime.engine} if self.runtime.engine else {})},
            "versions": self.versions,
            "generations": total.generations,
            "processes": self.processes,
            "tensor_parallel": self.runtime.tensor_parallel,
            "batch_size": self.batch_size,
            **total.summary(),
            "predicted_tokens_per_second": predicted(total),
            "latencies": self.latencies.to_json() if self.latencies else None,
            "baseline_mismatches": self.baseline_mismatches,
            "baseline_mismatch_details": [d.to_json() for d in self.baseline_mismatch_details],
            "counters": total.as_dict(),
            "per_task": {task: {"generations": s.generations, "baseline_mismatches": s.baseline_mismatches,
                                **s.summary(),
                                "predicted_tokens_per_second": predicted(s), "counters": s.as_dict()}
                         for task, s in sorted(self.per_task.items())},
            **({"tuning": {"requests": sum(t.requests for t in self.tuning),
                           "speedup_with_tuning": self.with_tuning.speedup,
                           "tokens_per_second_with_tuning": self.with_tuning.tokens_per_second,
                           "trials": [t.to_json() for t in self.tuning]}} if self.tuning else {}),
            **({"draft_state": self.draft_state} if self.draft_state else {}),
            **({"kind_versions": self.kind_versions} if self.kind_versions else {}),
            **({"engine_counters": self.engine_counters} if self.engine_counters else {}),
            **({"auto": {"tasks": self.auto, "configurations": [r.to_block() for r in self.configurations]}}
               if self.auto else {}),
        }

    @classmethod
    def from_block(cls, block: dict, path: Path | str = "<block>") -> SpecdecRecord:
        """Read a ``config.specdec`` block of any known schema version (version 1 is converted)."""
        if not isinstance(block, dict):
            raise RecordError(f"{path}: no config.specdec block (not a specdec run); remove it from the input")
        check_version(Path(path), block.get("schema_version"), SCHEMA_VERSION, "specdec record")
        try:
            reader = _task_counters if block["schema_version"] >= 2 else _task_counters_v1
            per_task = {task: reader(figures) for task, figures in block["per_task"].items()}
            details = [Divergence.from_json(d) for d in block.get("baseline_mismatch_details") or []]
            _restore_mismatch_counts(per_task, int(block.get("baseline_mismatches", 0)), details)
            ran = block.get("runtime") or {}
            runtime = Runtime(block.get("dtype") or "", ran.get("kernels") or "", bool(ran.get("static_cache")),
                              bool(ran.get("compile")), ran.get("attention") or "",
                              int(block.get("tensor_parallel", 1)), ran.get("engine") or "")
            return cls(block["target"], block["draft"], int(block["num_draft_tokens"]),
                       bool(block.get("dynamic_gamma", False)), block.get("hardware") or "",
                       block.get("versions") or {}, block.get("draft_parameters_m") or 0.0,
                       block.get("draft_layers") or 0, per_task,
                       Latencies.from_json(block["latencies"]) if block.get("latencies") else None, details,
                       int(block.get("processes", 1)), runtime, bool(block.get("use_kernels", False)),
                       ran.get("score") or "target", int(block["schema_version"]), int(block.get("batch_size", 1)),
                       [Trial.from_json(t) for t in (block.get("tuning") or {}).get("trials", [])],
                       dict(block.get("draft_state") or {}),
                       {str(k): int(v) for k, v in (block.get("kind_versions") or {}).items()},
                       dict((block.get("auto") or {}).get("tasks") or {}),
                       [cls.from_block(b, path) for b in (block.get("auto") or {}).get("configurations") or []],
                       dict(block.get("engine_counters") or {}))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise RecordError(f"{path}: malformed specdec record ({type(exc).__name__}: {exc}); "
                              "regenerate or remove it") from None


def _merged_state(first: dict, second: dict) -> dict:
    """Two runs' (or ranks') drafter reports as one: numbers added, nested reports merged, anything else (the same
    for records of one configuration) the first's."""
    merged = dict(first)
    for name, value in second.items():
        if isinstance(value, dict) and isinstance(merged.get(name), dict):
            merged[name] = _merged_state(merged[name], value)
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and name in merged:
            merged[name] = merged[name] + value
        elif isinstance(value, list) and isinstance(merged.get(name), list):  # counts per position
            merged[name] = [a + b for a, b in zip_longest(merged[name], value, fillvalue=0)]
        else:
            merged.setdefault(name, value)
    return merged


def _restore_mismatch_counts(per_task: dict[str, GenerationStats], total: int, details: list[Divergence]) -> None:
    """Files written before mismatches were counted per task hold only the total: give each task the
    mismatches its details name, and any beyond the details (or of no named task) to the first task."""
    if sum(s.baseline_mismatches for s in per_task.values()) >= total or not per_task:
        return
    for where in details:
        if where.task in per_task:
            per_task[where.task].baseline_mismatches += 1
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
    data = load_json(path)
    block = (data.get("config") or {}).get("specdec") if isinstance(data, dict) else None
    if not isinstance(block, dict):
        raise RecordError(f"{path}: no config.specdec block (not a specdec run); remove it from the input")
    return ResultsFile(Path(path), SpecdecRecord.from_block(block, path), data.get("results") or {}, data.get("date"))


def each_configuration(file: ResultsFile) -> list[ResultsFile]:
    """The file once per configuration it measured: its record, then (``draft=auto`` choosing per task) each
    other configuration's record, with the same path, scores and date."""
    return [file] + [ResultsFile(file.path, record, file.results, file.date) for record in file.record.configurations]


def scan_results(paths: list[Path], scoring: bool = False, current: bool = True) -> list[ResultsFile]:
    """Every usable results file under ``paths`` (folders searched for ``results_*.json``) that decoded; with
    ``scoring``, also runs of log-likelihood tasks only (``*_lm`` with ``score=draft``: no generation, no TAR);
    with ``current`` (the default), only records measured by today's code (:attr:`SpecdecRecord.current`), the
    others skipped with one :class:`RecordWarning`.

    A file the user named that is unusable is an error; one found in a folder is skipped with a
    :class:`RecordWarning`.
    """
    found = []
    for root in map(Path, paths):
        if root.is_file():
            found += each_configuration(read_results(root))
        elif root.is_dir():
            for file in sorted(root.rglob("results_*.json")):
                try:
                    found += each_configuration(read_results(file))
                except RecordError as exc:
                    warnings.warn(f"skipping {exc}", RecordWarning, stacklevel=2)
        else:
            raise SpecdecError(f"results path {root} does not exist: give folders written by lm_eval --output_path")
    stale = [file for file in found if not file.record.current]
    if current and stale:
        warnings.warn(f"skipping {len(stale)} results file(s) measured by older code or with runtime fields unknown "
                      f"(e.g. {stale[0].path}, schema {stale[0].record.schema_version}, runtime "
                      f"{stale[0].record.runtime}): rerun those configurations", RecordWarning, stacklevel=2)
        found = [file for file in found if file.record.current]
    return [file for file in found if scoring or file.record.per_task]


def sample_figures(sample: dict) -> dict | None:
    """A request's own figures from one line of lm-eval's ``--log_samples`` output of a ``specdec`` run (the wrapper
    appends ``{"specdec": GenerationStats.request_figures()}`` to the request's arguments; lm-eval writes them as a
    list or as ``{"gen_args_0": {"arg_2": ...}}``); None for a sample without them."""
    arguments = sample.get("arguments") if isinstance(sample, dict) else None
    if isinstance(arguments, dict):
        arguments = [list(a.values()) if isinstance(a, dict) else a for a in arguments.values()]
    for args in arguments or []:
        for arg in args if isinstance(args, list) else []:
            if isinstance(arg, dict) and isinstance(arg.get("specdec"), dict):
                return arg["specdec"]
    return None


# --- configurations across files ---------------------------------------------------------------------------


@dataclass
class Configuration:
    """Every record of one configuration (its :class:`RunKey`) across results files: counters summed per task,
    and each file's speedup per task kept, so a rerun adds a measurement instead of replacing one."""

    key: RunKey
    files: list[ResultsFile] = field(default_factory=list)
    per_task: dict[str, GenerationStats] = field(default_factory=dict)
    speedups: dict[str, list[float]] = field(default_factory=dict)  # per task, one per file that measured it

    def speedup(self, task: str) -> float | None:
        """The median over files of the task's measured speedup."""
        runs = self.speedups.get(task)
        return statistics.median(runs) if runs else None

    def speedup_spread(self, task: str) -> tuple[float, float] | None:
        runs = self.speedups.get(task)
        return (min(runs), max(runs)) if runs else None

    def add(self, file: ResultsFile) -> None:
        self.files.append(file)
        for task, stats in file.record.per_task.items():
            self.per_task[task] = self.per_task.get(task, GenerationStats()) + stats
            if stats.speedup:
                self.speedups.setdefault(task, []).append(stats.speedup)


def configurations(files: list[ResultsFile], target: str | None = None) -> list[Configuration]:
    """Group results files by configuration (optionally only ``target``'s), in the order first seen."""
    grouped: dict[RunKey, Configuration] = {}
    for file in files:
        key = file.record.key()
        if target is None or key.target == target:
            grouped.setdefault(key, Configuration(key)).add(file)
    return list(grouped.values())
