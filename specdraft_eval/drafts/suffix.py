"""``suffix``: suffix decoding as vLLM's ``method: suffix`` runs it, on the same engine: ArcticInference's
``SuffixDecodingCache`` (``arctic_inference.suffix_decoding``, a C++ suffix tree; installed by ``scripts/setup.sh``).

One cache per drafter, shared by every row of every batch (vLLM's proposer keeps one per engine): each request's
prompt goes into a tree of its own (``start_request``), every token it generates goes into that tree and into the
global tree of responses as soon as it is generated (``add_active_response``, as vLLM calls it each step), and each
step drafts ``speculate(context = the last max_tree_depth tokens, max_spec_tokens = γ, max_spec_factor,
max_spec_offset, min_token_prob, use_tree_spec)``: for every match length the continuation with the best score (the
sum of its tokens' estimated probabilities, counts in the tree), at most ``max_spec_factor × match + offset``
tokens, each at least ``min_token_prob`` likely; the request's own tree and the global one compete by score.

``suffix`` drafts a path (what vLLM runs), ``suffix:tree`` Arctic's best-first token tree (``use_tree_spec``);
``suffix:DIR`` (or ``suffix:tree:DIR``) warms the global cache with the target's own continuations a ``zoo ngram``
directory holds, so the first requests find earlier outputs too. ``min_score`` (0: off) makes the draft propose
only where its score reaches it, so that in ``suffix?min_score=2|eagle:DIR`` the head drafts the other steps, as
ArcticInference's hybrid of suffix decoding and a model speculator does. The upstream parameters, at vLLM's
defaults, are
model_args (``max_tree_depth=64,...``) or the draft string's query (``suffix:tree?max_tree_depth=64``), which is
also how the record names any that differ from the defaults. Nothing persists across runs: each run's cache starts
empty (or with DIR only); the record's ``draft_state.suffix_cache`` gives its tokens at the start and the end.
"""

from __future__ import annotations

import os
import weakref
from dataclasses import dataclass, fields, replace
from pathlib import Path

from specdraft_eval.drafts.kind import Candidate, DraftKind
from specdraft_eval.drafts.ngram import load_continuations
from specdraft_eval.engine.drafter import DrafterBase, Proposal
from specdraft_eval.engine.sampling import Sampler
from specdraft_eval.errors import SpecdecError
from specdraft_eval.models.targets import Target

TREE = "tree"
INSTALL = ("pip install nanobind==2.9.2 && CMAKE_ARGS=-DPython_EXECUTABLE=$(which python) "
           "pip install --no-build-isolation --no-deps arctic-inference==0.3.0")


@dataclass(frozen=True)
class SuffixSettings:
    """A ``suffix`` draft: the mode, the warm start, and ArcticInference's parameters at vLLM's defaults
    (``vllm/config/speculative.py``; vLLM passes no ``max_spec_offset``, so 0)."""

    tree: bool = False  # use_tree_spec: Arctic's token tree; False: a path, what vLLM's proposer drafts
    warm_from: str | None = None  # a `zoo ngram` directory whose continuations enter the global cache first
    max_tree_depth: int = 24
    max_spec_factor: float = 1.0
    max_spec_offset: float = 0.0
    min_token_prob: float = 0.1
    max_cached_requests: int = 10000  # FIFO eviction past it; 0: no global cache (the request's own text only)
    min_score: float = 0.0  # draft only when the draft's score reaches it (ArcticInference's hybrid with a model
    # speculator: suffix where its score >= the speculator's tokens, else the model's draft); in A|B, B drafts then

    @property
    def query(self) -> str:
        """The parameters that differ from the defaults, as the draft string's ``?name=value&...``."""
        changed = [f"{name}={getattr(self, name)}" for name in PARAMETERS
                   if getattr(self, name) != getattr(SuffixSettings, name)]
        return "?" + "&".join(changed) if changed else ""

    @property
    def name(self) -> str:
        return "suffix" + (f":{TREE}" if self.tree else "") + (f":{self.warm_from}" if self.warm_from else "") \
            + self.query


PARAMETERS = tuple(f.name for f in fields(SuffixSettings)[2:])


INTEGERS = ("max_tree_depth", "max_cached_requests")


def _number(name: str, text: str) -> int | float:
    """A parameter's value from its text, range-checked, or a one-line error."""
    try:
        value = int(text) if name in INTEGERS else float(text)
    except ValueError:
        raise SpecdecError(f"suffix setting {name}={text!r} is not {'an integer' if name in INTEGERS else 'a number'}"
                           f": use e.g. {name}={getattr(SuffixSettings, name)}") from None
    if (name == "max_tree_depth" and value < 1 or name == "min_token_prob" and not 0 <= value <= 1
            or name in ("max_spec_factor", "max_spec_offset", "min_score") and value < 0):
        raise SpecdecError(f"suffix setting {name}={text} is out of range: max_tree_depth >= 1, 0 <= min_token_prob "
                           "<= 1, max_spec_factor, max_spec_offset and min_score >= 0")
    return value


def parse_settings(arg: str | None) -> SuffixSettings:
    """``[tree][:DIR][?name=value&...]`` (each part optional) as :class:`SuffixSettings`, or a one-line error."""
    head, _, query = (arg or "").partition("?")
    mode, _, rest = head.partition(":")
    tree = mode == TREE
    where = (rest if tree else head) or None
    given: dict = {}
    for item in filter(None, query.split("&")):
        name, equals, value = item.partition("=")
        if name not in PARAMETERS or not equals:
            raise SpecdecError(f"bad suffix setting {item!r}: use {', '.join(n + '=...' for n in PARAMETERS)}")
        given[name] = _number(name, value)
    settings = SuffixSettings(tree, where, **given)
    if where is not None and settings.max_cached_requests == 0:
        raise SpecdecError(f"draft {settings.name}: max_cached_requests=0 keeps no global cache, so {where} would "
                           "warm nothing: leave one out")
    return settings


def with_parameters(settings: SuffixSettings, given: dict) -> SuffixSettings:
    """``settings`` with model_args' values (strings or numbers) for the named parameters."""
    return replace(settings, **{name: _number(name, str(value)) for name, value in given.items()})


class SuffixCache:
    """One run's ``SuffixDecodingCache``, shared by every row's drafter, and the response tokens it holds."""

    def __init__(self, settings: SuffixSettings, warm: list[list[int]]) -> None:
        try:
            from arctic_inference.suffix_decoding import SuffixDecodingCache
        except ImportError:
            raise SpecdecError("draft=suffix runs ArcticInference's suffix tree (vLLM's), which is not installed: "
                               f"run scripts/setup.sh, or {INSTALL}") from None
        self.settings, self.warm = settings, warm
        self.cache = SuffixDecodingCache(settings.max_tree_depth, settings.max_cached_requests)
        self.sizes: dict[int, int] = {}  # request id -> response tokens added (evicted ones are not counted)
        self.owners: dict[int, weakref.ref] = {}  # active request -> its drafter
        self.next_id = 0
        for sequence in warm:  # earlier responses, as vLLM's cache would hold them
            request = self.start([], None)
            self.add(request, sequence)
            self.stop(request)
        self.tokens_at_start = self.tokens

    @property
    def tokens(self) -> int:
        """Response tokens in the global cache now."""
        return sum(self.sizes.get(request, 0) for request in self.cache.cached_requests)

    def start(self, prompt: list[int], owner: SuffixDrafter | None) -> int:
        """A new request with ``prompt``; requests whose drafter is gone (a finished row's) stop first."""
        for request, ref in list(self.owners.items()):
            drafter = ref()
            if drafter is None or drafter.request != request:
                self.stop(request)
        request, self.next_id = self.next_id, self.next_id + 1
        self.cache.start_request(request, prompt)
        if owner is not None:
            self.owners[request] = weakref.ref(owner)
        return request

    def add(self, request: int, tokens: list[int]) -> None:
        if tokens:
            self.cache.add_active_response(request, tokens)
            self.sizes[request] = self.sizes.get(request, 0) + len(tokens)

    def stop(self, request: int) -> None:
        self.owners.pop(request, None)
        if request in self.cache.active_requests:
            self.cache.stop_request(request)

    def state(self) -> dict:
        """What the record reports of the corpus: tokens at the run's start and now, whether it started warm."""
        return {"tokens_at_start": self.tokens_at_start, "tokens_at_end": self.tokens,
                "requests_cached": len(self.cache.cached_requests), "warm": self.tokens_at_start > 0,
                "warmed_from": self.settings.warm_from, "persisted_across_runs": False}


class SuffixDrafter(DrafterBase):
    """One row's requests on the shared :class:`SuffixCache`: a request starts at a generation's first draft,
    its new tokens join the cache at every later one, and it stops when the row resets."""

    def __init__(self, cache: SuffixCache) -> None:
        self.cache, self.settings = cache, cache.settings
        self.name = self.settings.name
        self.drafts_trees = self.settings.tree
        self.request: int | None = None
        self.known: list[int] = []  # the tokens the cache has of this request (its last one checked)

    def reset(self, capacity: int | None = None) -> None:
        if self.request is not None:
            self.cache.stop(self.request)
        self.request, self.known = None, []

    def fork(self) -> SuffixDrafter:
        return SuffixDrafter(self.cache)

    def fresh(self) -> SuffixDrafter:
        """A new cache holding only the warm start (``suffix:DIR``'s continuations), none of the responses."""
        return SuffixDrafter(SuffixCache(self.settings, self.cache.warm))

    def see(self, tokens: list[int]) -> None:
        """As vLLM's proposer after every step: a new generation starts a request with its prompt (the first
        sequence seen), and every token generated since joins the cache, the last step's included."""
        known = len(self.known)
        if self.request is not None and (len(tokens) < known or tokens[known - 1] != self.known[-1]):
            self.reset()  # another generation's tokens: this one ended
        if self.request is None:
            self.request = self.cache.start(tokens, self)
        else:
            self.cache.add(self.request, tokens[known:])
        self.known = tokens

    def propose(self, tokens: list[int], num_tokens: int, sampler: Sampler) -> Proposal:
        self.see(tokens)  # (the engine has shown them already; a caller without the engine has not)
        if num_tokens < 1:
            return Proposal([])
        s = self.settings
        draft = self.cache.cache.speculate(self.request, tokens[-s.max_tree_depth:], max_spec_tokens=num_tokens,
                                           max_spec_factor=s.max_spec_factor, max_spec_offset=s.max_spec_offset,
                                           min_token_prob=s.min_token_prob, use_tree_spec=s.tree)
        if draft.score < s.min_score:
            return Proposal([])
        chain = all(parent == i - 1 for i, parent in enumerate(draft.parents))
        return Proposal(list(draft.token_ids), parents=None if chain else list(draft.parents))

    def describe(self) -> dict:
        return {"suffix_cache": self.cache.state()}


class SuffixKind(DraftKind):
    """``suffix[:tree][:DIR][?name=value&...]``; the value is its :class:`SuffixSettings`."""

    name = "suffix"
    version = 2  # 2: every step's tokens join the cache (a request starts with its prompt however late it first
    # drafts; a finished row's last step joins too), as vLLM's proposer adds them
    usage = "suffix[:tree][:DIR]"
    summary = "ArcticInference's suffix tree over the request and earlier outputs, as vLLM runs it (no model)"
    parameters = PARAMETERS

    def parse(self, arg: str | None) -> SuffixSettings:
        return parse_settings(arg)

    def canonical(self, value: SuffixSettings, written: str) -> str:
        return value.name

    def with_parameters(self, value: SuffixSettings, given: dict) -> str:
        return with_parameters(value, given).name

    def build(self, value: SuffixSettings, target: Target) -> SuffixDrafter:
        warm = []
        if value.warm_from is not None:
            where = Path(os.path.expanduser(value.warm_from))
            if not where.is_dir():
                raise SpecdecError(f"bad suffix option {value.warm_from!r}: use draft=suffix (a path, what vLLM "
                                   "drafts), draft=suffix:tree (ArcticInference's token tree) or "
                                   "draft=suffix[:tree]:DIR (a directory `zoo ngram` built: its continuations warm "
                                   "the cache)")
            warm = load_continuations(where, target.tokenizer)
        return SuffixDrafter(SuffixCache(value, warm))

    def path(self, value: SuffixSettings) -> str | None:
        return value.warm_from

    def with_path(self, value: SuffixSettings, arg: str, path: Path) -> str:
        return replace(value, warm_from=str(path)).name

    def candidates(self, target_layers: int) -> tuple[Candidate, ...]:
        return (Candidate("suffix", (16,)), Candidate("suffix:tree", (16,)))

    def vllm_config(self, value: SuffixSettings, num_draft_tokens: int, written: str) -> dict:
        """Exactly the configuration measured, or a one-line refusal naming what vLLM cannot run."""
        differs = ("a token tree (vLLM's suffix proposer drafts a path)" if value.tree else
                   f"a cache warmed from {value.warm_from} (vLLM's starts empty)" if value.warm_from else
                   f"max_spec_offset={value.max_spec_offset:g} (vLLM passes 0)" if value.max_spec_offset else
                   f"min_score={value.min_score:g} (vLLM drafts at any score)" if value.min_score else None)
        if differs:
            path = replace(value, tree=False, warm_from=None, max_spec_offset=0.0, min_score=0.0).name
            raise SpecdecError(f"draft {written} measures {differs}, which vLLM's method: suffix does not run: "
                               f"measure and serve draft={path}")
        return {"method": "suffix", "num_speculative_tokens": num_draft_tokens,
                "suffix_decoding_max_tree_depth": value.max_tree_depth,
                "suffix_decoding_max_cached_requests": value.max_cached_requests,
                "suffix_decoding_max_spec_factor": value.max_spec_factor,
                "suffix_decoding_min_token_prob": value.min_token_prob}


KIND = SuffixKind()
