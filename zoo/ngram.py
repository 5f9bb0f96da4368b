"""``zoo ngram``: an n-gram draft built from the target's own greedy continuations (on-policy text).

The target continues held-in prompts (by default the bundled tasks' documents that ``lm_eval --limit``
does not reach: HumanEval[40:] and MMLU-CoT[80:]); the continuations, as token ids, are the draft
(:mod:`specdraft_eval.drafts.ngram`). Generation runs batched with left padding, so the build takes a
few minutes on a CPU.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import zip_longest
from pathlib import Path

import torch

from specdraft_eval.drafts.ngram import save_continuations
from specdraft_eval.errors import SpecdecError
from specdraft_eval.files import atomic_output
from specdraft_eval.integration.offline_data import task_prompts
from specdraft_eval.models.targets import LoadSettings
from zoo.progress import Tick, no_progress
from zoo.prune import HELD_OUT, check_out

DEFAULT_PROMPTS = "default"


def ngram_prompts(spec: str | None, most: int | None = None) -> list[str]:
    """Prompts to continue: the default held-in split (the tasks' held-in documents taken in turn), one bundled
    task's held-in split, or a file of prompts separated by blank lines; the first ``most`` of them."""
    if most is not None and most < 1:
        raise SpecdecError(f"--max-prompts {most} must be >= 1")
    return _prompts(spec)[:most]


def _prompts(spec: str | None) -> list[str]:
    if spec in (None, DEFAULT_PROMPTS):
        splits = [task_prompts(task)[start:] for task, start in HELD_OUT.items()]
        return [p for group in zip_longest(*splits) for p in group if p is not None]
    if spec in HELD_OUT:
        return task_prompts(spec)[HELD_OUT[spec]:]
    try:
        text = Path(spec).read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise SpecdecError(f"cannot read prompts {spec}: {exc.strerror or exc}; give a bundled task "
                           f"({', '.join(HELD_OUT)}) or a text file with prompts separated by blank lines") from None
    prompts = [p.strip() for p in text.split("\n\n") if p.strip()]
    if not prompts:
        raise SpecdecError(f"prompt file {spec} has no prompts: separate prompts by blank lines")
    return prompts


@torch.inference_mode()
def generate_batches(target, tokenizer, prompts: list[str], new_tokens: int, batch_size: int = 16, context: int = 512):
    """Yield, ``batch_size`` prompts at a time, each prompt's token ids (its last ``context`` tokens, which keeps
    prefill short on a CPU) and the target's greedy continuation of it (token ids, up to EOS)."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
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
          on_batch: Callable[[int], None] | None = None) -> dict:
    """Generate the continuations and write the draft directory atomically; return its metadata."""
    if new_tokens < 1:
        raise SpecdecError(f"--new-tokens {new_tokens} must be >= 1")
    sequences = continuations(target, tokenizer, prompts, new_tokens, on_batch=on_batch)
    meta = {"source": target_name, "prompts": len(prompts), "new_tokens": new_tokens,
            "tokens": sum(map(len, sequences))}
    with atomic_output(out, directory=True) as tmp:
        save_continuations(tmp, tokenizer, sequences, meta)
    return meta


def make_draft(model: str, out: Path, prompts: str | None, new_tokens: int, max_prompts: int,
               settings: LoadSettings = LoadSettings(kernels="onednn"), tick: Tick = no_progress) -> dict:
    """``zoo ngram``: continue held-in prompts with ``model`` (loaded with ``settings``) and save the n-gram draft
    at ``out``."""
    check_out(out)
    texts = ngram_prompts(prompts, max_prompts)
    loaded = settings.load(model)
    target, tokenizer = loaded.model, loaded.tokenizer
    tick(0, total=len(texts))
    meta = build(target, tokenizer, model, texts, new_tokens, out, on_batch=tick)
    return {"out": str(out), "draft": f"ngram:{out}", **meta}
