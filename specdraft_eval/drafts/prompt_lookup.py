"""``prompt-lookup[:N]``: copy what followed the first earlier occurrence of the last n-gram (no model).

Same proposals as transformers' ``PromptLookupCandidateGenerator`` (earliest match, longest n-gram first),
so ``zoo bench`` compares the two engines on identical drafts. On HumanEval the earliest match also
accepted more than the most recent one (TAR 1.24 against 1.02 at γ=4). ``prompt-lookup:NxB`` proposes a token
tree instead: what followed each of up to B occurrences (earliest first, longest n-gram first), merged
(:func:`~specdraft_eval.engine.drafter.merge`), γ being the tree's node budget.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from specdraft_eval.drafts.kind import Candidate, DraftKind
from specdraft_eval.engine.drafter import DrafterBase, Proposal, merge
from specdraft_eval.engine.sampling import Sampler
from specdraft_eval.errors import SpecdecError
from specdraft_eval.models.targets import Target


class PromptLookupDrafter(DrafterBase):
    """N-gram lookup in the prompt and the text generated so far, longest n-gram first (stateless)."""

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, branches: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram or branches < 1:
            raise SpecdecError(f"prompt-lookup n-gram sizes must satisfy 1 <= MIN <= N and branches B >= 1 (got "
                               f"{min_ngram}-{max_ngram}x{branches}); e.g. prompt-lookup:3, prompt-lookup:2-3 or "
                               "prompt-lookup:3x4")
        self.max_ngram, self.min_ngram, self.branches = max_ngram, min_ngram, branches
        self.drafts_trees = branches > 1
        sizes = f"{max_ngram}" if min_ngram == 1 else f"{min_ngram}-{max_ngram}"
        self.name = f"prompt-lookup:{sizes}" + (f"x{branches}" if branches > 1 else "")

    def propose(self, tokens: list[int], num_tokens: int, sampler: Sampler) -> Proposal:
        length, found = len(tokens), []
        for n in range(min(self.max_ngram, length - 1), self.min_ngram - 1, -1):
            pattern, start = tokens[length - n :], -1
            while len(found) < self.branches:  # earliest occurrences with at least one token after them
                try:
                    start = tokens.index(pattern[0], start + 1, length - n)
                except ValueError:
                    break
                if tokens[start : start + n] == pattern:
                    found.append(tokens[start + n : start + n + num_tokens])
            if found:
                break
        return merge(found, num_tokens)


@dataclass(frozen=True)
class LookupSizes:
    """``prompt-lookup[:[MIN-]N][xB]``: n-grams N..MIN, a tree over up to B matches."""

    max_ngram: int = 3
    min_ngram: int = 1
    branches: int = 1


class PromptLookupKind(DraftKind):
    """``prompt-lookup``, ``prompt-lookup:N`` (n-grams N..1), ``prompt-lookup:MIN-N`` (n-grams N..MIN: no match
    shorter than MIN, which leaves such steps to the next part of a composite), and either with ``xB``: a tree over
    up to B matches."""

    name = "prompt-lookup"
    usage = "prompt-lookup[:[MIN-]N][xB]"
    summary = "n-gram lookup in the prompt and output (no model; prompt-lookup:N for the longest n-gram)"

    def parse(self, arg: str | None) -> LookupSizes:
        if arg in (None, ""):
            return LookupSizes()
        sizes, _, branches = arg.partition("x")
        low, _, high = sizes.rpartition("-")
        if not high.isdigit() or not (low.isdigit() or low == "") or not (branches.isdigit() or branches == ""):
            raise SpecdecError(f"bad prompt-lookup size {arg!r}: use prompt-lookup:N or prompt-lookup:MIN-N with "
                               "1 <= MIN <= N, e.g. prompt-lookup:3 or prompt-lookup:2-3, and xB for a tree over up "
                               "to B matches, e.g. prompt-lookup:3x4")
        value = LookupSizes(int(high), int(low or 1), int(branches or 1))
        PromptLookupDrafter(value.max_ngram, value.min_ngram, value.branches)  # the ranges' one-line error
        return value

    def build(self, value: LookupSizes, target: Target | None) -> PromptLookupDrafter:
        return PromptLookupDrafter(value.max_ngram, value.min_ngram, value.branches)

    def canonical(self, value: LookupSizes, written: str) -> str:
        return self.build(value, None).name

    def candidates(self, target_layers: int) -> tuple[Candidate, ...]:
        return (Candidate("prompt-lookup", (2, 4, 8)),)

    def vllm_config(self, value: LookupSizes, num_draft_tokens: int, written: str) -> dict:
        if value.branches > 1:
            raise SpecdecError(f"vLLM's n-gram lookup drafts chains, not lookup trees ({written}): serve "
                               f"{self.canonical(replace(value, branches=1), written)}")
        return {"method": "ngram", "num_speculative_tokens": num_draft_tokens,
                "prompt_lookup_max": value.max_ngram, "prompt_lookup_min": value.min_ngram}


KIND = PromptLookupKind()
