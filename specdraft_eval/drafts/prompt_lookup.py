"""``prompt-lookup[:N]``: copy what followed the latest earlier occurrence of the last n-gram (no model)."""

from __future__ import annotations

from specdraft_eval.drafts.base import Proposal
from specdraft_eval.errors import SpecdecError
from specdraft_eval.sampling import Sampler


class PromptLookupDrafter:
    """N-gram lookup in the prompt and the text generated so far, longest n-gram first."""

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise SpecdecError(f"prompt-lookup n-gram size must be >= 1 (got {max_ngram}); e.g. prompt-lookup:3")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.name = f"prompt-lookup:{max_ngram}"

    def propose(self, tokens: list[int], num_tokens: int, sampler: Sampler) -> Proposal:
        length = len(tokens)
        for n in range(min(self.max_ngram, length - 1), self.min_ngram - 1, -1):
            pattern = tokens[length - n :]
            for start in range(length - n - 1, -1, -1):  # most recent earlier occurrence
                if tokens[start : start + n] == pattern:
                    follow = tokens[start + n : start + n + num_tokens]
                    if follow:
                        return Proposal(follow)
        return Proposal([])

    def reset(self) -> None:
        """Stateless."""


def build(arg: str | None, target, tokenizer) -> PromptLookupDrafter:
    """Entry point for ``prompt-lookup`` and ``prompt-lookup:N``."""
    if arg in (None, ""):
        return PromptLookupDrafter()
    if not arg.isdigit():
        raise SpecdecError(f"bad prompt-lookup size {arg!r}: use prompt-lookup:N with N >= 1, e.g. prompt-lookup:3")
    return PromptLookupDrafter(int(arg))
