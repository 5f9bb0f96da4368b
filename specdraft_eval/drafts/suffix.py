"""``suffix``: suffix decoding (ArcticInference's, vLLM's ``method: suffix``), no model.

Where did the text's current suffix occur before, and what followed it there? Each step finds the earlier
occurrences of the longest suffix of the sequence that occurred before (up to :data:`MAX_MATCH` tokens), in the
request's own prompt and output and in the outputs of the run's earlier requests (``suffix``; ``suffix:local``:
the request's own text only; ``suffix:DIR``: also the target's own continuations of held-in prompts that ``zoo
ngram`` saved, the data of the n-gram draft, so that the first requests of a run find earlier outputs too), and
proposes what followed them as a token tree: a node's probability is the share
of the occurrences that continue through it (counts, as in a suffix tree's nodes), the tree grows best-first by
probability down to :data:`MIN_PROB`, at most as deep as the match is long, and at most γ nodes.
"""

from __future__ import annotations

import heapq
import os
from collections import deque
from pathlib import Path

from specdraft_eval.drafts.kind import Candidate, DraftKind
from specdraft_eval.drafts.ngram import load_continuations
from specdraft_eval.engine.drafter import DrafterBase, Proposal
from specdraft_eval.engine.sampling import Sampler
from specdraft_eval.errors import SpecdecError
from specdraft_eval.models.targets import Target

MAX_MATCH = 32  # the longest suffix matched
MIN_PROB = 0.1  # ArcticInference's min_token_prob: no node less likely than this
OCCURRENCES = 64  # the most recent occurrences of a suffix that are read
CORPUS_TOKENS = 200_000  # earlier outputs kept for the whole run (oldest dropped first)


class Text:
    """A growing token sequence with the positions after each of its bigrams (where a match may continue)."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.after: dict[tuple[int, int], list[int]] = {}

    def extend(self, tokens: list[int]) -> None:
        start = len(self.tokens)
        self.tokens += tokens
        for end in range(max(2, start), len(self.tokens)):  # a bigram with a token after it
            self.after.setdefault((self.tokens[end - 2], self.tokens[end - 1]), []).append(end)

    def matches(self, context: list[int]) -> list[tuple[int, int]]:
        """(match length, position after it) for the latest :data:`OCCURRENCES` earlier occurrences of
        ``context``'s last two tokens, each extended backwards as far as it agrees with ``context``."""
        if len(context) < 2:
            return []
        found = []
        for end in self.after.get((context[-2], context[-1]), [])[-OCCURRENCES:]:
            length = 2
            while (length < MAX_MATCH and length < end and length < len(context)
                   and self.tokens[end - length - 1] == context[-length - 1] >= 0):
                length += 1
            found.append((length, end))
        return found


class Corpus:
    """The run's earlier outputs, shared by every row's drafter: a row's output joins it when the next
    generation begins (so no request sees a later or a concurrent one); the oldest go first past
    :data:`CORPUS_TOKENS`."""

    def __init__(self) -> None:
        self.text = Text()
        self.outputs: deque[list[int]] = deque()
        self.running: list[tuple[list[int], int]] = []  # (a row's tokens, its prompt length)

    def begin(self) -> None:
        """A generation begins: add every finished one's output first."""
        for row, prompt in self.running:
            if len(row) > prompt:
                self.add(row[prompt:])
        self.running = [(row, prompt) for row, prompt in self.running if len(row) <= prompt]

    def track(self, tokens: list[int], prompt: int) -> None:
        """Read ``tokens`` (a row's growing sequence, its first ``prompt`` the prompt) when the next generation
        begins."""
        self.running.append((tokens, prompt))

    def add(self, output: list[int]) -> None:
        self.outputs.append(output)
        total = sum(map(len, self.outputs))
        if total > CORPUS_TOKENS:
            while total > CORPUS_TOKENS // 2:
                total -= len(self.outputs.popleft())
            self.text = Text()
            for kept in self.outputs:
                self.text.extend([-1, *kept])
        else:
            self.text.extend([-1, *output])  # -1: no match crosses from one output to the next


class SuffixDrafter(DrafterBase):
    """Suffix decoding over the request's text and (``corpus``) the run's earlier outputs."""

    drafts_trees = True

    def __init__(self, corpus: Corpus | None, name: str) -> None:
        self.corpus, self.name = corpus, name
        self.reset()

    def reset(self, capacity: int | None = None) -> None:
        self.text = Text()  # this generation's sequence (the corpus reads its tokens once the next one begins)
        if self.corpus is not None:
            self.corpus.begin()

    def fork(self) -> SuffixDrafter:
        return SuffixDrafter(self.corpus, self.name)

    def propose(self, tokens: list[int], num_tokens: int, sampler: Sampler) -> Proposal:
        known = self.text.tokens
        if known and (len(tokens) < len(known) or tokens[len(known) - 1] != known[-1]):  # not this generation's
            self.reset()
        if not self.text.tokens and self.corpus is not None:
            self.corpus.track(self.text.tokens, len(tokens))
        self.text.extend(tokens[len(self.text.tokens):])
        sources = [self.text] + ([self.corpus.text] if self.corpus is not None else [])
        found = [(length, text, end) for text in sources for length, end in text.matches(tokens)
                 if end < len(text.tokens)]
        if not found or num_tokens < 1:
            return Proposal([])
        longest = max(length for length, _, _ in found)
        depth = min(num_tokens, longest)  # ArcticInference: speculate at most as far as the match is long
        continuations = [text.tokens[end:end + depth] for length, text, end in found if length == longest]
        return _best_first([[t for t in c[:next((i for i, t in enumerate(c) if t < 0), len(c))]]
                            for c in continuations], num_tokens)


def _best_first(continuations: list[list[int]], budget: int) -> Proposal:
    """The continuations as a count-weighted trie, grown best-first by each node's share of them (its path's
    probability), nodes at least :data:`MIN_PROB` likely, at most ``budget``."""
    total = len(continuations)
    tokens: list[int] = []
    parents: list[int] = []
    heap = [(-1.0, 0, -1, -1, tuple(range(total)))]  # (-probability, order, parent node, token, continuations)
    order = 1
    while heap and len(tokens) < budget:
        negative, _, parent, token, members = heapq.heappop(heap)
        node = -1
        if token >= 0:
            node = len(tokens)
            tokens.append(token)
            parents.append(parent)
        depth = 0 if node < 0 else _depth(parents, node)
        children: dict[int, list[int]] = {}
        for i in members:
            if depth < len(continuations[i]):
                children.setdefault(continuations[i][depth], []).append(i)
        for child, group in children.items():
            probability = len(group) / total
            if probability >= MIN_PROB:
                heapq.heappush(heap, (-probability, order, node, child, tuple(group)))
                order += 1
    if all(p == i - 1 for i, p in enumerate(parents)):
        return Proposal(tokens)
    return Proposal(tokens, parents=parents)


def _depth(parents: list[int], node: int) -> int:
    depth = 0
    while node >= 0:
        node, depth = parents[node], depth + 1
    return depth


class SuffixKind(DraftKind):
    """``suffix`` (the request's text and the run's earlier outputs), ``suffix:local`` (the request's text only) and
    ``suffix:DIR`` (also the target's own continuations an n-gram draft directory of ``zoo ngram`` holds, as
    earlier outputs from the start). The value is None, ``"local"`` or DIR."""

    name = "suffix"
    usage = "suffix[:local|:DIR]"
    summary = "suffix-tree lookup in the request and earlier outputs, a token tree (no model)"

    def parse(self, arg: str | None) -> str | None:
        return arg or None

    def build(self, value: str | None, target: Target) -> SuffixDrafter:
        if value in (None, "local"):
            return SuffixDrafter(None if value == "local" else Corpus(), "suffix" + (":local" if value else ""))
        if not Path(os.path.expanduser(value)).is_dir():
            raise SpecdecError(f"bad suffix option {value!r}: use draft=suffix (the request's text and the run's "
                               "earlier outputs), draft=suffix:local (the request's text only) or draft=suffix:DIR "
                               "(a directory `zoo ngram` built: its continuations as earlier outputs)")
        corpus = Corpus()
        for sequence in load_continuations(Path(os.path.expanduser(value)), target.tokenizer):
            corpus.add(sequence)
        return SuffixDrafter(corpus, f"suffix:{value}")

    def path(self, value: str | None) -> str | None:
        return None if value in (None, "local") else value  # suffix:DIR reads a directory

    def candidates(self, target_layers: int) -> tuple[Candidate, ...]:
        return (Candidate("suffix", (8, 16)),)

    def vllm_config(self, value: str | None, num_draft_tokens: int, written: str) -> dict:
        config = {"method": "suffix", "num_speculative_tokens": num_draft_tokens,
                  "suffix_decoding_max_tree_depth": MAX_MATCH, "suffix_decoding_max_spec_factor": 1.0,
                  "suffix_decoding_min_token_prob": MIN_PROB}
        return config | ({"suffix_decoding_max_cached_requests": 0} if value == "local" else {})


KIND = SuffixKind()
