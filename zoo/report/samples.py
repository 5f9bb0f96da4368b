"""``zoo samples``: each request's own figures from lm-eval's ``--log_samples`` output of ``specdec`` runs, grouped
by a document field, by task or by correctness (acceptance by category, length or outcome)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from specdraft_eval.errors import SpecdecError
from specdraft_eval.measure.stats import GenerationStats
from specdraft_eval.results.record import sample_figures

SPECIAL = ("task", "correct")
"""Groupings that are not document fields: the task (from the samples file's name) and the task's metric (> 0)."""


@dataclass(frozen=True)
class SampleGroup:
    """The requests of one group, their counters summed: acceptance as vLLM defines it, TAR, speedup."""

    group: str
    requests: int
    generated_tokens: int
    overshoot_tokens: int
    tar: float | None
    mean_acceptance_length: float | None  # vLLM: 1 + accepted / drafts
    acceptance_rate_per_position: list[float]  # vLLM: accepted at position i / drafts
    speedup: float | None  # tokens/s over plain decoding's, over the group's requests (None without a baseline)

    def to_json(self) -> dict:
        return asdict(self)


def _files(paths: list[Path]) -> list[Path]:
    found: list[Path] = []
    for path in map(Path, paths):
        if path.is_dir():
            found += sorted(path.rglob("samples_*.jsonl"))
        elif path.is_file():
            found.append(path)
        else:
            raise SpecdecError(f"samples path {path} does not exist: give files or folders that lm_eval --log_samples "
                               "wrote")
    if not found:
        raise SpecdecError(f"no samples_*.jsonl under {', '.join(map(str, paths))}: run lm_eval --model specdec ... "
                           "--log_samples --output_path DIR first")
    return found


def _key(sample: dict, task: str, by: str, path: Path) -> str:
    if by == "task":
        return task
    if by == "correct":
        metric = (sample.get("metrics") or [None])[0]
        value = sample.get(metric) if metric else None
        if not isinstance(value, (int, float)):
            raise SpecdecError(f"{path}: a sample has no numeric metric to group by correctness; use --by task")
        return "correct" if value > 0 else "wrong"
    doc = sample.get("doc") if isinstance(sample.get("doc"), dict) else {}
    if by not in doc:
        fields = ", ".join(sorted(k for k, v in doc.items() if isinstance(v, (str, int, bool))))
        raise SpecdecError(f"{path}: documents have no field {by!r}: use --by task, --by correct or one of {fields}")
    return str(doc[by])


def group_samples(paths: list[Path], by: str = "task") -> list[SampleGroup]:
    """Every request's figures in the samples files under ``paths``, their counters summed per group (sorted by
    group) and the figures read off the sums (:class:`GenerationStats`)."""
    groups: dict[str, GenerationStats] = {}
    for path in _files(paths):
        task = path.name.removeprefix("samples_").rsplit("_", 1)[0]
        for number, line in enumerate(path.read_text().splitlines(), 1):
            try:
                sample = json.loads(line)
            except json.JSONDecodeError:
                raise SpecdecError(f"{path}:{number}: not a JSON line: the file is truncated; rerun lm_eval") from None
            figures = sample_figures(sample)
            if figures is None:
                raise SpecdecError(f"{path}:{number}: no specdec figures in the sample: give samples of a "
                                   "--model specdec run written with --log_samples")
            key = _key(sample, task, by, path)
            groups[key] = groups.get(key, GenerationStats()) + GenerationStats.of_request(figures)
    return [SampleGroup(name, s.generations, s.generated_tokens, s.overshoot_tokens, s.tar, s.mean_acceptance_length,
                        s.acceptance_rate_per_position, s.speedup) for name, s in sorted(groups.items())]
