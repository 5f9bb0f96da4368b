"""``ngram:DIR``: an n-gram model of the target's own continuations (built by ``zoo ngram``), no neural draft.

Each step extends the sequence by the most frequent token that followed its last n tokens in the target's
on-policy text, longest n first (``max_n`` down to ``min_n``), until no context matches. Drafting costs
dictionary lookups; what it buys is the target's habits (phrases it repeats across documents), which
prompt lookup cannot see because they are not in the prompt.
"""

from __future__ import annotations

import hashlib
import heapq
import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from specdraft_eval.drafts.kind import DraftKind, split_shape
from specdraft_eval.engine.drafter import DrafterBase, Proposal
from specdraft_eval.engine.sampling import Sampler
from specdraft_eval.errors import SpecdecError
from specdraft_eval.models.targets import Target

NGRAM_FILE = "ngram.json"
FORMAT = "specdraft-ngram/1"


def vocab_fingerprint(tokenizer) -> str:
    """A hash of the tokenizer's string -> id map, to refuse an n-gram draft built for another tokenizer."""
    return hashlib.sha256(json.dumps(sorted(tokenizer.get_vocab().items())).encode()).hexdigest()[:16]


def save_continuations(directory: Path, tokenizer, sequences: list[list[int]], meta: dict) -> None:
    """Write ``ngram.json`` into ``directory`` (the caller makes the directory appear atomically)."""
    data = {"format": FORMAT, "vocab": vocab_fingerprint(tokenizer), "meta": meta, "sequences": sequences}
    (directory / NGRAM_FILE).write_text(json.dumps(data, separators=(",", ":")) + "\n")


def load_continuations(directory: Path, tokenizer) -> list[list[int]]:
    """The token sequences of an n-gram draft directory, after checking its format and tokenizer."""
    path = directory / NGRAM_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise SpecdecError(f"{path} not found: build an n-gram draft with `zoo ngram TARGET --out "
                           f"{directory}`") from None
    except (OSError, ValueError) as exc:
        raise SpecdecError(f"cannot read n-gram draft {path} ({exc}): rebuild it with `zoo ngram`") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise SpecdecError(f"{path} is not a {FORMAT} file: rebuild it with `zoo ngram`")
    if data.get("vocab") != vocab_fingerprint(tokenizer):
        raise SpecdecError(f"n-gram draft {directory} was built with another tokenizer than the target's: "
                           "rebuild it for this target with `zoo ngram TARGET`")
    return data["sequences"]


class NGramDrafter(DrafterBase):
    """Greedy chain over n-gram tables (context of ``min_n`` to ``max_n`` tokens -> most frequent next token), or
    with ``branches`` B > 1 a token tree: each node's B most frequent next tokens, grown best-first by the path's
    probability (each step's share of its context's count), γ nodes at most; stateless between generations."""

    def __init__(self, sequences: list[list[int]], max_n: int = 4, min_n: int = 1, name: str = "ngram",
                 branches: int = 1) -> None:
        self.max_n, self.min_n, self.name, self.branches = max_n, min_n, name, branches
        self.drafts_trees = branches > 1
        counts: dict[tuple[int, ...], Counter] = {}
        for seq in sequences:
            for end in range(1, len(seq)):
                for n in range(min_n, min(max_n, end) + 1):
                    counts.setdefault(tuple(seq[end - n : end]), Counter())[seq[end]] += 1
        # per context: its B most frequent next tokens and their shares; ties go to the smaller id, so the table
        # does not depend on insertion order
        self.table = {ctx: [(token, count / c.total()) for token, count in
                            sorted(c.items(), key=lambda kv: (-kv[1], kv[0]))[:branches]] for ctx, c in counts.items()}

    def _next(self, seq: list[int]) -> list[tuple[int, float]]:
        """The longest matching context's next tokens and shares ([] when none matches)."""
        for n in range(min(self.max_n, len(seq)), self.min_n - 1, -1):
            found = self.table.get(tuple(seq[-n:]))
            if found is not None:
                return found
        return []

    def propose(self, tokens: list[int], num_tokens: int, sampler: Sampler) -> Proposal:
        context = list(tokens[-self.max_n :])
        if self.branches == 1:
            drafted: list[int] = []
            while len(drafted) < num_tokens and (found := self._next(context + drafted)):
                drafted.append(found[0][0])
            return Proposal(drafted)
        nodes: list[int] = []
        parents: list[int] = []
        paths: list[list[int]] = []
        heap = [(-share, i, -1, token) for i, (token, share) in enumerate(self._next(context))]
        order = len(heap)
        heapq.heapify(heap)
        while heap and len(nodes) < num_tokens:
            negative, _, parent, token = heapq.heappop(heap)
            paths.append((paths[parent] if parent >= 0 else []) + [token])
            nodes.append(token)
            parents.append(parent)
            for child, share in self._next(context + paths[-1]):
                heapq.heappush(heap, (negative * share, order, len(nodes) - 1, child))
                order += 1
        return Proposal(nodes, parents=parents)


@dataclass(frozen=True)
class TableArg:
    """``ngram:DIR[@B]``: the directory ``zoo ngram`` built and the tree width B (1: a chain)."""

    where: str
    branches: int = 1


class NGramKind(DraftKind):
    """``ngram:DIR`` and ``ngram:DIR@B`` (a token tree of each node's B likeliest next tokens)."""

    name = "ngram"
    usage = "ngram:DIR[@B]"
    summary = "n-gram tables of the target's own continuations (`zoo ngram` builds DIR; no model)"
    path_marker = NGRAM_FILE  # ngram's argument is a directory, recognisable by this file in it

    def parse(self, arg: str | None) -> TableArg:
        if not arg:
            raise SpecdecError("ngram needs a directory: ngram:DIR, built by `zoo ngram TARGET --out DIR`")
        where, branches = split_shape(arg)
        branches = "1" if branches is None else branches
        if not branches.isdigit() or int(branches) < 1:
            raise SpecdecError(f"bad n-gram tree width in {arg!r}: use ngram:DIR@B with B >= 1, e.g. ngram:DIR@3")
        return TableArg(where, int(branches))

    def build(self, value: TableArg, target: Target) -> NGramDrafter:
        name = f"ngram:{value.where}" + (f"@{value.branches}" if value.branches > 1 else "")
        return NGramDrafter(load_continuations(Path(value.where), target.tokenizer), name=name,
                            branches=value.branches)

    def path(self, value: TableArg) -> str:
        return value.where

    def vllm_config(self, value: TableArg, num_draft_tokens: int, written: str) -> dict:
        raise SpecdecError(f"vLLM has no n-gram-table draft ({written}): serve prompt-lookup (vLLM's ngram) instead")


KIND = NGramKind()
