"""``zoo regenerate``: the target's own answers to held-in prompts, the data a head learns from (as speculators'
``response_regeneration`` and SpecForge's ``regenerate_train_data.py`` regenerate a dataset with the target).

The prompts are :func:`zoo.build.held_in.held_in_prompts`' (the bundled tasks' held-in documents, the standard library's
functions, a user's file: never the documents the evaluations use). The engine answers them in batches, greedily or
at a temperature (``samples`` answers per prompt), with a speculative draft to go faster (lossless: the answers are
the target's). The work is cut into chunks of ``chunk_prompts`` prompts, each written atomically as
``chunk-NNNNN.json.gz`` (every row's source, sample, prompt tail and answer as token ids) and recorded in
``regenerate.json`` (the provenance: target, tokenizer fingerprint, prompts, settings, each chunk's tokens, time and
acceptance); the same command continues where a stopped run ended, and a larger ``--max-prompts`` extends a finished
one. :func:`read_rows` is what ``zoo train-head --data`` reads.
"""

from __future__ import annotations

import gzip
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from specdraft_eval.drafts import load_draft
from specdraft_eval.drafts.ngram import vocab_fingerprint
from specdraft_eval.engine.loop import NoDraft
from specdraft_eval.engine.params import DecodeParams, GammaPolicy, RunSettings
from specdraft_eval.engine.session import Session
from specdraft_eval.errors import SpecdecError
from specdraft_eval.files import atomic_write, write_json
from specdraft_eval.models.targets import LoadSettings
from zoo.build.held_in import HELD_OUT, Prompt, held_in_prompts
from zoo.measure.prompts import check_positive
from zoo.progress import Tick, no_progress

FORMAT = "specdraft-regenerate/1"
PROVENANCE = "regenerate.json"
NO_DRAFT = "none"


@dataclass(frozen=True)
class Regeneration:
    """``zoo regenerate``'s settings (all but ``max_prompts`` and ``minutes`` must match to continue a run)."""

    prompts: str = "default"  # held_in_prompts' sources, comma-separated
    max_prompts: int | None = None
    new_tokens: int = 256
    temperature: float = 0.0  # 0: greedy
    samples: int = 1  # answers per prompt (temperature > 0)
    draft: str = "suffix"  # what speeds the answers up ("none": plain decoding)
    num_draft_tokens: int = 6
    batch_size: int = 16
    context: int = 384  # prompt tokens kept (the tail)
    chunk_prompts: int = 64
    seed: int = 0
    minutes: float | None = None  # start no chunk that would end past this

    def check(self) -> None:
        check_positive(**{name: getattr(self, name) for name in ("new_tokens", "samples", "num_draft_tokens",
                                                                 "batch_size", "context", "chunk_prompts")})
        if self.temperature < 0:
            raise SpecdecError(f"--temperature {self.temperature} must be >= 0 (0: greedy)")
        if self.temperature == 0 and self.samples > 1:
            raise SpecdecError(f"--samples {self.samples} with greedy answers repeats one answer: give --temperature "
                               "(e.g. 0.8) or --samples 1")
        if self.minutes is not None and self.minutes <= 0:
            raise SpecdecError(f"--minutes {self.minutes} must be > 0")

    def key(self) -> dict:
        """The settings a continued run must share."""
        return {k: v for k, v in asdict(self).items() if k not in ("max_prompts", "minutes")}

    def params(self, chunk: int, sample: int) -> DecodeParams:
        """The request of ``sample`` in ``chunk``: its own seed, so a continued run draws what a whole one would."""
        if self.temperature == 0:
            return DecodeParams(self.new_tokens)
        return DecodeParams(self.new_tokens, do_sample=True, temperature=self.temperature,
                            seed=self.seed * 1_000_003 + chunk * 1009 + sample)


@dataclass
class Regenerated:
    """What a run did: the directory, its chunks, rows and tokens in all, and this run's share."""

    path: str
    target: str
    prompts: int
    chunks: int
    rows: int
    prompt_tokens: int
    answer_tokens: int
    new_chunks: int = 0
    seconds: float = 0.0
    tokens_per_second: float | None = None
    tar: float | None = None
    complete: bool = True
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return asdict(self)


def chunk_name(index: int) -> str:
    return f"chunk-{index:05d}.json.gz"


def _provenance(out: Path) -> dict | None:
    path = out / PROVENANCE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SpecdecError(f"{path}: unreadable ({exc}); remove {out} to start over") from None
    if data.get("format") != FORMAT:
        raise SpecdecError(f"{path}: format {data.get('format')!r}, this version reads {FORMAT}: regenerate it")
    return data


def regenerate(model: str, out: Path, settings: Regeneration = Regeneration(),
               load: LoadSettings = LoadSettings(), tick: Tick = no_progress) -> Regenerated:
    """``zoo regenerate``: answer the prompts with ``model`` chunk by chunk into ``out`` (continuing what is there)."""
    settings.check()
    prompts = held_in_prompts(settings.prompts, settings.max_prompts)
    old = _provenance(out)
    if out.exists() and old is None:
        raise SpecdecError(f"{out} exists and holds no {PROVENANCE}: choose a new --out")
    loaded = load.load(model)
    target, tokenizer = loaded.model, loaded.tokenizer
    key = {"target": model, "vocab": vocab_fingerprint(tokenizer), **settings.key()}
    if old is not None and old["settings"] != key:
        changed = sorted(k for k in key if old["settings"].get(k) != key[k])
        raise SpecdecError(f"{out} was regenerated with other settings ({', '.join(changed)}): rerun with them, or "
                           "choose a new --out")
    chunks: dict[str, dict] = {c["file"]: c for c in (old or {}).get("chunks", [])}
    drafter = NoDraft() if settings.draft == NO_DRAFT else load_draft(settings.draft, loaded)
    session = Session(target, drafter, RunSettings(GammaPolicy(settings.num_draft_tokens)))
    spans = [(start, min(start + settings.chunk_prompts, len(prompts)))
             for start in range(0, len(prompts), settings.chunk_prompts)]
    todo = [i for i, span in enumerate(spans)
            if chunks.get(chunk_name(i), {}).get("prompts") != list(span) or not (out / chunk_name(i)).is_file()]
    tick(0, total=sum((spans[i][1] - spans[i][0]) * settings.samples for i in todo))
    out.mkdir(parents=True, exist_ok=True)
    started, done, complete, last = time.perf_counter(), 0, True, 0.0
    for index in todo:
        if settings.minutes is not None and time.perf_counter() - started + last > settings.minutes * 60:
            complete = False  # the next chunk (as long as the last) would overrun
            break
        rows, stats, seconds = _answer(session, tokenizer, prompts[slice(*spans[index])], settings, index, tick)
        name = chunk_name(index)
        atomic_write(out / name, gzip.compress(json.dumps({"format": FORMAT, "rows": rows}).encode(), mtime=0))
        chunks[name] = {"file": name, "prompts": list(spans[index]), "rows": len(rows),
                        "prompt_tokens": sum(len(r["prompt"]) for r in rows),
                        "answer_tokens": sum(len(r["answer"]) for r in rows), "seconds": round(seconds, 1),
                        "tar": None if stats.tar is None else round(stats.tar, 3)}
        _write(out, key, settings, prompts, chunks)
        done, last = done + 1, seconds
    kept = [chunks[chunk_name(i)] for i in range(len(spans)) if chunk_name(i) in chunks]
    new = [chunks[chunk_name(i)] for i in todo[:done]]
    seconds = sum(c["seconds"] for c in new)
    new_tokens = sum(c["answer_tokens"] for c in new)
    return Regenerated(str(out), model, len(prompts), len(kept), sum(c["rows"] for c in kept),
                       sum(c["prompt_tokens"] for c in kept), sum(c["answer_tokens"] for c in kept), done,
                       round(seconds, 1), round(new_tokens / seconds, 1) if seconds else None,
                       _mean_tar(new), complete and len(kept) == len(spans),
                       [] if complete else [f"stopped within {settings.minutes} minutes: rerun the same command "
                                            "to go on"])


def _mean_tar(chunks: list[dict]) -> float | None:
    measured = [(c["tar"], c["answer_tokens"]) for c in chunks if c["tar"] is not None]
    weight = sum(w for _, w in measured)
    return round(sum(t * w for t, w in measured) / weight, 3) if weight else None


def _answer(session: Session, tokenizer, prompts: list[Prompt], settings: Regeneration, chunk: int, tick: Tick):
    """Every sample of every prompt of one chunk, ``batch_size`` rows at a time: the rows, the chunk's statistics
    and its seconds."""
    rows, total, started = [], None, time.perf_counter()
    ids = [tokenizer(p.text).input_ids[-settings.context:] for p in prompts]
    for sample in range(settings.samples):
        params = settings.params(chunk, sample)
        for start in range(0, len(prompts), settings.batch_size):
            batch = ids[start:start + settings.batch_size]
            result = session.generate(batch, params)
            total = result.stats if total is None else total + result.stats
            for prompt, prompt_ids, answer in zip(prompts[start:], batch, result.outputs, strict=False):
                rows.append({"source": prompt.source, "sample": sample, "prompt": prompt_ids, "answer": answer})
            tick(len(batch))
    return rows, total, time.perf_counter() - started


def _write(out: Path, key: dict, settings: Regeneration, prompts: list[Prompt], chunks: dict[str, dict]) -> None:
    ordered = sorted(chunks.values(), key=lambda c: c["file"])
    write_json(out / PROVENANCE, {
        "format": FORMAT, "settings": key, "held_out": HELD_OUT,
        "prompts": {"spec": settings.prompts, "count": len(prompts)},
        "rows": sum(c["rows"] for c in ordered), "prompt_tokens": sum(c["prompt_tokens"] for c in ordered),
        "answer_tokens": sum(c["answer_tokens"] for c in ordered),
        "seconds": round(sum(c["seconds"] for c in ordered), 1),
        "chunks": ordered})


@dataclass(frozen=True)
class Row:
    """One regenerated answer: its prompt's source, the sample, the prompt tail and the answer (token ids)."""

    source: str
    sample: int
    prompt: list[int]
    answer: list[int]


def read_rows(path: Path, target: str | None = None, vocab: str | None = None) -> tuple[list[Row], dict]:
    """Every row of a regenerated directory, in chunk order, and its provenance; one line if it is not one, or was
    made by another target or tokenizer than ``target``/``vocab`` (when given)."""
    path = Path(path)
    provenance = _provenance(path)
    if provenance is None:
        raise SpecdecError(f"--data {path}: no {PROVENANCE} there; make it with `zoo regenerate TARGET --out {path}`")
    made = provenance["settings"]
    if vocab is not None and made["vocab"] != vocab:
        raise SpecdecError(f"--data {path} was regenerated by {made['target']} with another tokenizer: regenerate "
                           f"it with {target}")
    rows = []
    for chunk in provenance["chunks"]:
        try:
            data = json.loads(gzip.decompress((path / chunk["file"]).read_bytes()))
        except (OSError, ValueError, EOFError) as exc:
            raise SpecdecError(f"--data {path}: {chunk['file']} unreadable ({exc}); rerun zoo regenerate on it") \
                from None
        rows += [Row(r["source"], r["sample"], r["prompt"], r["answer"]) for r in data["rows"]]
    return rows, provenance
