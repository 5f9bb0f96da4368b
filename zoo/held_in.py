"""What the draft builders (``zoo prune``, ``zoo ngram``, ``zoo train-head``) share: the held-in documents (those
``lm_eval --limit`` does not reach), prompts from them or a file, the target's batched greedy continuations, and
the rule that a build never writes into an existing folder."""

from __future__ import annotations

from itertools import zip_longest
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
    (2.92x there, 1.29x on the leaderboard's documents; docs/auto52)."""
    return task_prompts(task)[LEADERBOARD[task]:HELD_OUT[task]]


def check_out(out: Path) -> None:
    """One line if ``out`` exists: a build writes a new folder, never into an old one."""
    if out.exists():
        raise SpecdecError(f"output directory {out} exists: choose a new --out or remove it")


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
