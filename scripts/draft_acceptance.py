"""Greedy acceptance of candidate drafts, exactly and cheaply: one teacher-forced forward pass per document.

In greedy speculative decoding a draft's i-th proposal is conditioned on the previous proposals, and a
proposal only counts if all before it matched the target; so the tokens accepted at a step that starts at
position p equal the run of consecutive positions from p where the draft's argmax, fed the target's own
tokens, equals the target's token (capped at γ). This script decodes the held-out documents once with the
target (greedy, the tasks' stop sequences), runs each draft once over prompt + output, and replays the steps
for each γ: TAR and per-position acceptance as ``lm_eval --model specdec`` would measure them, without timing.
Drafts: layer views (``layers:SPEC``) and draft directories (teacher-forced); prompt lookup, n-gram drafts and
composites (their proposals replayed against the target's output; also exact for greedy).

  .venv/bin/python scripts/draft_acceptance.py --out benchmarks/acceptance/draft_acceptance.json DRAFT ...
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from specdraft_eval.drafts import load_draft
from specdraft_eval.engine.loop import autoregressive_generate
from specdraft_eval.engine.sampling import Sampler
from specdraft_eval.files import atomic_write
from specdraft_eval.integration.offline_data import task_prompts
from specdraft_eval.models.targets import load_target

SAMPLER = Sampler(False, 1.0, 0, 1.0, None)
STOPS = {"specdec_humaneval": ["\nclass", "\ndef", "\n#", "\nif", "\nprint"], "specdec_mmlu_cot": ["\n\nQ:", "\nQ:"]}


def target_outputs(target, tokenizer, task: str, limit: int, max_new_tokens: int) -> list[tuple[list[int], list[int]]]:
    docs = []
    for prompt in task_prompts(task)[:limit]:
        ids = tokenizer(prompt).input_ids

        def stop(generated: list[int]) -> bool:
            return any(s in tokenizer.decode(generated) for s in STOPS[task])

        out, _ = autoregressive_generate(target, ids, max_new_tokens, stop=stop)
        docs.append((ids, out))
    return docs


@torch.inference_mode()
def matches(drafter, prompt: list[int], out: list[int]) -> list[bool]:
    """For each output position, whether the draft's argmax given the target's prefix is the target's token."""
    logits = drafter.model(torch.tensor([prompt + out])).logits[0, len(prompt) - 1 : -1]  # [len(out), head]
    if drafter.reduced_head:  # its head covers only these ids, in this order
        choice = drafter._ids[logits.argmax(-1)]
    else:
        choice = logits[:, : drafter.vocab_size].argmax(-1)
    return (choice == torch.tensor(out)).tolist()


def proposal_hits(drafter, prompt: list[int], out: list[int], gamma: int) -> list[tuple[int, int]]:
    """(drafted, accepted) per step for a draft without a model (prompt lookup, n-gram, composites of them):
    its proposals replayed against the target's output, exact for greedy decoding."""
    steps, p = [], 0
    while p < len(out):
        proposal = drafter.propose(prompt + out[:p], gamma, SAMPLER).tokens
        n = 0
        while n < len(proposal) and p + n < len(out) - 1 and proposal[n] == out[p + n]:
            n += 1
        steps.append((len(proposal), n))
        p += n + 1
    return steps


def summarise(steps: list[tuple[int, int]], gamma: int) -> dict:
    """TAR and acceptance by position from (drafted, accepted) per step."""
    drafted, accepted = [0] * gamma, [0] * gamma
    for k, n in steps:
        for i in range(k):
            drafted[i] += 1
        for i in range(n):
            accepted[i] += 1
    tar = sum(n + 1 for _, n in steps) / len(steps)
    by_position = [round(a / d, 3) if d else None for a, d in zip(accepted, drafted)]
    return {"tar": round(tar, 3), "acceptance_by_position": by_position}


def replay(hits: list[list[bool]], gamma: int) -> dict:
    """Steps of greedy speculation at constant γ over each document's hit list (a model draft always drafts γ)."""
    steps = []
    for doc in hits:
        p = 0
        while p < len(doc):
            n = 0
            while n < gamma and p + n < len(doc) - 1 and doc[p + n]:
                n += 1
            steps.append((min(gamma, len(doc) - p), n))
            p += n + 1
    return summarise(steps, gamma)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("drafts", nargs="+")
    parser.add_argument("--target", default="smollm2-135m-instruct")
    parser.add_argument("--limits", default="specdec_humaneval:20,specdec_mmlu_cot:8")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--gammas", default="1,2,4")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(2)
    loaded = load_target(args.target)
    target, tokenizer = loaded.model, loaded.tokenizer
    gammas = [int(g) for g in args.gammas.split(",")]
    outputs = {}
    for item in args.limits.split(","):
        task, limit = item.split(":")
        outputs[task] = target_outputs(target, tokenizer, task, int(limit), args.max_new_tokens)
        print(f"{task}: {len(outputs[task])} documents, {sum(len(o) for _, o in outputs[task])} target tokens",
              file=sys.stderr)
    report = {"target": args.target, "documents": {t: len(d) for t, d in outputs.items()},
              "target_tokens": {t: sum(len(o) for _, o in d) for t, d in outputs.items()},
              "outputs_at_the_budget": {t: sum(len(o) >= args.max_new_tokens for _, o in d)
                                        for t, d in outputs.items()},
              "drafts": {}}
    for spec in args.drafts:
        drafter = load_draft(spec, loaded)
        report["drafts"][spec] = {}
        for task, docs in outputs.items():
            if hasattr(drafter, "model") and not hasattr(drafter, "parts"):
                hits = [matches(drafter, prompt, out) for prompt, out in docs]
                report["drafts"][spec][task] = {f"gamma_{g}": replay(hits, g) for g in gammas}
                first = sum(map(sum, hits)) / max(1, sum(map(len, hits)))
            else:
                report["drafts"][spec][task] = {
                    f"gamma_{g}": summarise([s for prompt, out in docs
                                             for s in proposal_hits(drafter, prompt, out, g)], g)
                    for g in gammas}
                first = report["drafts"][spec][task]["gamma_1"]["tar"] - 1
            report["drafts"][spec][task]["first_token_acceptance"] = round(first, 3)
            print(f"{spec} {task}: first-token acceptance {first:.3f}, TAR at γ=" + ", ".join(
                f"{g}: {report['drafts'][spec][task][f'gamma_{g}']['tar']:.3f}" for g in gammas), file=sys.stderr)
    text = json.dumps(report, indent=1)
    if args.out:
        atomic_write(args.out, text + "\n")
    else:
        print(text)


if __name__ == "__main__":
    main()
