"""``zoo ngram``: an n-gram draft built from the target's own greedy continuations (on-policy text).

The target continues held-in prompts (by default the bundled tasks' documents that ``lm_eval --limit``
does not reach: HumanEval[40:] and MMLU-CoT[80:]); the continuations, as token ids, are the draft
(:mod:`specdraft_eval.drafts.ngram`). Generation runs batched with left padding, so the build takes a
few minutes on a CPU.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from specdraft_eval.drafts.ngram import save_continuations
from specdraft_eval.errors import SpecdecError
from specdraft_eval.files import atomic_output
from specdraft_eval.models.targets import LoadSettings
from zoo.build.built import Built
from zoo.build.held_in import DEFAULT_PROMPTS, HELD_OUT, check_out, generate_batches, ngram_prompts
from zoo.progress import Tick, no_progress


def continuations(target, tokenizer, prompts: list[str], new_tokens: int, batch_size: int = 16,
                  on_batch: Callable[[int], None] | None = None) -> list[list[int]]:
    """The target's greedy continuation of each prompt (:func:`generate_batches`)."""
    out: list[list[int]] = []
    for rows, generated in generate_batches(target, tokenizer, prompts, new_tokens, batch_size):
        out.extend(generated)
        if on_batch:
            on_batch(len(rows))
    return out


def build(target, tokenizer, target_name: str, prompts: list[str], new_tokens: int, out: Path,
          on_batch: Callable[[int], None] | None = None, spec: str | None = None) -> dict:
    """Generate the continuations and write the draft directory atomically; return its metadata (``data``: what
    it was built from, ``spec`` naming the prompts)."""
    if new_tokens < 1:
        raise SpecdecError(f"--new-tokens {new_tokens} must be >= 1")
    sequences = continuations(target, tokenizer, prompts, new_tokens, on_batch=on_batch)
    tokens = sum(map(len, sequences))
    meta = {"source": target_name, "prompts": len(prompts), "new_tokens": new_tokens, "tokens": tokens,
            "data": [{"prompts": {"spec": spec or DEFAULT_PROMPTS, "count": len(prompts)}, "temperature": 0.0,
                      "answer_tokens": tokens, "held_out": HELD_OUT}]}
    with atomic_output(out, directory=True) as tmp:
        save_continuations(tmp, tokenizer, sequences, meta)
    return meta


def make_draft(model: str, out: Path, prompts: str | None, new_tokens: int, max_prompts: int,
               settings: LoadSettings = LoadSettings(kernels="onednn"), tick: Tick = no_progress) -> Built:
    """``zoo ngram``: continue held-in prompts with ``model`` (loaded with ``settings``) and save the n-gram draft
    at ``out``."""
    check_out(out)
    texts = ngram_prompts(prompts, max_prompts)
    loaded = settings.load(model)
    target, tokenizer = loaded.model, loaded.tokenizer
    tick(0, total=len(texts))
    meta = build(target, tokenizer, model, texts, new_tokens, out, on_batch=tick, spec=prompts)
    return Built(str(out), f"ngram:{out}", meta)
