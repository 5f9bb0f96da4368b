"""What the draft builders (``zoo prune``, ``zoo ngram``, ``zoo train-head``) share: the held-in documents (those
``lm_eval --limit`` does not reach), prompts from them or a file, the target's batched greedy continuations, and
the rule that a build never writes into an existing folder."""

from __future__ import annotations

import ast
import random
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from itertools import islice, zip_longest
from pathlib import Path

import torch

from specdraft_eval.errors import SpecdecError
from specdraft_eval.integration.offline_data import task_prompts

HELD_OUT = {"specdec_humaneval": 40, "specdec_mmlu_cot": 80}
"""Per bundled task, how many leading documents the evaluations use: the builders learn from the rest."""
LEADERBOARD = {"specdec_humaneval": 20, "specdec_mmlu_cot": 8}
"""Per bundled task, the leading documents the published leaderboard measures (``leaderboard/reproduce.sh``)."""


def tuning_prompts(task: str) -> list[str]:
    """The documents ``zoo tune`` measures on: held out from every draft's build data (so no contender saw them) and
    past the leaderboard's (which stay for checking the choice): HumanEval 20-39, MMLU-CoT 8-79. Held-in documents
    would favour the drafts built from them: tuning on them chose the n-gram table made from their continuations
    (2.92x there, 1.29x on the leaderboard's documents; benchmarks/auto_tuning)."""
    return task_prompts(task)[LEADERBOARD[task]:HELD_OUT[task]]


def check_out(out: Path) -> None:
    """One line if ``out`` exists: a build writes a new folder, never into an old one."""
    if out.exists():
        raise SpecdecError(f"output directory {out} exists: choose a new --out or remove it")


DEFAULT_PROMPTS = "default"


@dataclass(frozen=True)
class Prompt:
    """A prompt and where it came from: ``TASK#INDEX`` (a bundled task's document), ``python:FILE:LINE`` (a function
    of the standard library) or ``FILE#INDEX`` (a user's file)."""

    source: str
    text: str


def ngram_prompts(spec: str | None, most: int | None = None) -> list[str]:
    """Prompts to continue: the default held-in split (the tasks' held-in documents taken in turn), one bundled
    task's held-in split, or a file of prompts separated by blank lines; the first ``most`` of them."""
    return [p.text for p in held_in_prompts(spec, most)]


def held_in_prompts(spec: str | None, most: int | None = None) -> list[Prompt]:
    """:func:`ngram_prompts` with their sources; ``spec`` may also name ``python`` (the standard library's functions
    with docstrings, HumanEval's form) or join several sources with commas (taken in turn). A user's file that
    holds a document the evaluations use is refused (:func:`check_held_in`)."""
    if most is not None and most < 1:
        raise SpecdecError(f"--max-prompts {most} must be >= 1")
    names = [part.strip() for part in (spec or DEFAULT_PROMPTS).split(",") if part.strip()] or [DEFAULT_PROMPTS]
    sources = [_source(name) for name in names]
    merged = (p for group in zip_longest(*sources) for p in group if p is not None)
    return list(islice(merged, most))


def _source(spec: str) -> Iterator[Prompt]:
    if spec == DEFAULT_PROMPTS:
        return iter([p for group in zip_longest(*(_source(task) for task in HELD_OUT)) for p in group
                     if p is not None])
    if spec in HELD_OUT:
        return iter([Prompt(f"{spec}#{i}", text) for i, text in enumerate(task_prompts(spec)) if i >= HELD_OUT[spec]])
    if spec == PYTHON_PROMPTS:
        return python_prompts()
    try:
        text = Path(spec).read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise SpecdecError(f"cannot read prompts {spec}: {exc.strerror or exc}; give a bundled task "
                           f"({', '.join(HELD_OUT)}), 'python' or a text file with prompts separated by blank "
                           "lines") from None
    prompts = [Prompt(f"{spec}#{i}", p) for i, p in enumerate(p.strip() for p in text.split("\n\n") if p.strip())]
    if not prompts:
        raise SpecdecError(f"prompt file {spec} has no prompts: separate prompts by blank lines")
    check_held_in(text, spec)
    return iter(prompts)


PYTHON_PROMPTS = "python"
PYTHON_CONTEXT_LINES = 40


def python_prompts(seed: int = 0) -> Iterator[Prompt]:
    """The standard library's functions with a docstring as prompts in HumanEval's form: up to
    ``PYTHON_CONTEXT_LINES`` lines of the file before the ``def``, the signature and the docstring; the target writes
    the body. Files in a seeded shuffled order, functions in file order; files that do not parse are skipped."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(f for f in root.rglob("*.py") if "site-packages" not in f.parts and "test" not in f.parts)
    random.Random(seed).shuffle(files)
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
            tree = ast.parse(text)
        except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
            continue
        lines = text.splitlines()
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or ast.get_docstring(node) is None:
                continue
            docstring = node.body[0]
            if len(node.body) < 2 or docstring.end_lineno is None:
                continue  # nothing but a docstring: no body to write
            start = max(0, node.lineno - 1 - PYTHON_CONTEXT_LINES)
            yield Prompt(f"python:{path.relative_to(root)}:{node.lineno}",
                         "\n".join(lines[start:docstring.end_lineno]) + "\n")


HELD_OUT_WORDS = 16
"""Consecutive words (whitespace aside) of a held-out document that identify it in a user's text: any such window
of it that no held-in document shares (the MMLU-CoT prompts share their worked examples)."""


@lru_cache(maxsize=1)
def held_out_windows() -> dict[tuple[str, ...], str]:
    """Every window of :data:`HELD_OUT_WORDS` words of a document the evaluations use (the first :data:`HELD_OUT` of
    each bundled task) that is in no held-in document, with the document's name (``TASK#INDEX``)."""
    def windows(text: str) -> set[tuple[str, ...]]:
        words = text.split()
        return {tuple(words[i: i + HELD_OUT_WORDS]) for i in range(len(words) - HELD_OUT_WORDS + 1)}

    shared = set().union(*(windows(doc) for task, held in HELD_OUT.items() for doc in task_prompts(task)[held:]))
    return {window: f"{task}#{i}" for task, held in HELD_OUT.items()
            for i, doc in enumerate(task_prompts(task)[:held]) for window in windows(doc) - shared}


def check_held_in(text: str, spec: str, what: str = "prompt file") -> None:
    """One line if ``text`` (a user's prompts, calibration text or training text) holds any part of a document the
    evaluations use: :data:`HELD_OUT_WORDS` consecutive words of it that no held-in document shares, wherever they
    are and however the text is cut or spaced. Nothing is built from them."""
    known, words = held_out_windows(), text.split()
    for i in range(len(words) - HELD_OUT_WORDS + 1):
        name = known.get(tuple(words[i: i + HELD_OUT_WORDS]))
        if name is not None:
            raise SpecdecError(f"{what} {spec} holds part of {name}, a document the evaluations use: remove it "
                               "(drafts learn only from held-in text)")


def pad_id(tokenizer) -> int:
    """The id that pads the builders' batches: the tokenizer's pad token, else its EOS."""
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


@torch.inference_mode()
def generate_batches(target, tokenizer, prompts: list[str], new_tokens: int, batch_size: int = 16, context: int = 512):
    """Yield, ``batch_size`` prompts at a time, each prompt's token ids (its last ``context`` tokens, which keeps
    prefill short on a CPU) and the target's greedy continuation of it (token ids, up to EOS)."""
    pad = pad_id(tokenizer)
    eos = target.generation_config.eos_token_id
    eos = {eos} if isinstance(eos, int) else set(eos or [])
    for start in range(0, len(prompts), batch_size):
        rows = [tokenizer(p).input_ids[-context:] for p in prompts[start : start + batch_size]]
        width = max(map(len, rows))
        ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], device=target.device)
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=target.device)
        generated = target.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False,
                                    pad_token_id=pad)[:, width:].tolist()
        yield rows, [row[: next((i + 1 for i, t in enumerate(row) if t in eos), len(row))] for row in generated]
