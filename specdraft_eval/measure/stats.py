"""Per-generation counters and timings, and the summary figures derived from them.

Conventions (stated once; docs/lm_eval.md repeats them):

- ``tar`` is the founding paper's TAR: tokens emitted per verification step, the target's own (bonus or
  recovered) token included, so ``tar == accepted_per_step + 1``. Spec-Bench's and EAGLE's mean accepted tokens
  and SGLang's accept length equal it here; vLLM's mean acceptance length differs where steps drafted nothing.
  ``acceptance_figures`` gives each under its engine's name (docs/acceptance.md has the table).
- Only output counts: a final step's tokens past a stop (EOS or a stop sequence) are cut before counting
  (``overshoot_tokens`` counts them), and that step counts as if its draft had ended where the stop completed.
- ``accepted_per_step`` is draft tokens accepted per step (the bonus token excluded).
- Both are per-step means over all steps of all requests; ``per_request_mean_accepted_length`` gives p10,
  p50 and p90 over requests of each request's own TAR, so that a few long completions cannot hide what most
  requests see.
- Per position i (0-based), as vLLM counts ``num_accepted_tokens_per_pos``: ``drafted_per_position[i]`` steps
  drafted a token at position i, ``accepted_per_position[i]`` steps had draft token i accepted;
  ``acceptance_length_histogram[n]`` counts steps that accepted exactly n draft tokens, ``drafted_histogram[n]``
  steps that drafted exactly n.
- ``reached_per_position[i]``: steps that drafted position i with every earlier position accepted (SPEED-Bench's
  denominator for its conditional rate at i; a draft that ended before i did not reach it).
- What a stop cut from a final step's counts (``cut_drafts``: drafting steps counted as drafting none,
  ``cut_draft_tokens``, ``cut_accepted_per_position``) is kept apart: vLLM counts a step's drafted and accepted
  tokens before its stop check, so its figures (``vllm_*``) add them back.
- Token trees: a step drafts a tree's nodes (all verified in one target pass: ``mean_num_draft_tokens`` is nodes
  per step) and accepts one root-to-leaf path; positions are depths (``drafted_per_position[i]``: steps whose tree
  reached depth i + 1) and a draft is one tree.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace

POSITION_FIELDS = ("drafted_per_position", "accepted_per_position", "acceptance_length_histogram",
                   "drafted_histogram", "reached_per_position", "cut_accepted_per_position")


def _add_lists(a: list[int], b: list[int]) -> list[int]:
    """Element-wise sum of two count lists of possibly different lengths."""
    return [x + y for x, y in zip(a + [0] * (len(b) - len(a)), b + [0] * (len(a) - len(b)))]


def _percentile(values: list[float], q: float) -> float:
    """Linear-interpolation percentile (numpy's default) of a non-empty list."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * q
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass
class GenerationStats:
    """What one or more speculative generations did. Add two with ``+`` to aggregate.

    Times are seconds. ``decode_seconds`` excludes the target's prompt prefill (``prefill_seconds``; identical work
    with or without a draft: :attr:`speedup` is decode only, :attr:`end_to_end_speedup` the requests' wall time with
    it, as Spec-Bench times the whole generation) and ``compile_seconds`` (compiling and warming up the steps,
    before the clock starts); the draft's own reading of the prompt, and of what it skipped while dynamic γ was 0,
    is its prefill (``draft_prefill_tokens``, ``draft_prefill_seconds``), apart from ``draft_seconds``.
    ``request_tars`` holds each request's own TAR (tokens emitted per step), in the order the requests ran;
    ``prompt_tokens`` the speculative requests' prompt lengths, summed.
    """

    generations: int = 0
    steps: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    generated_tokens: int = 0
    prefill_seconds: float = 0.0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    decode_seconds: float = 0.0
    baseline_tokens: int = 0
    baseline_seconds: float = 0.0
    drafted_per_position: list[int] = field(default_factory=list)
    accepted_per_position: list[int] = field(default_factory=list)
    acceptance_length_histogram: list[int] = field(default_factory=list)
    drafted_histogram: list[int] = field(default_factory=list)
    request_tars: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    baseline_mismatches: int = 0  # greedy requests whose output differed from plain decoding's
    compile_seconds: float = 0.0  # compiling and warming up the steps (compile=true): outside every other time
    recompiles: int = 0  # graphs compiled during timed steps: 0 when the warm-up covered every shape
    draft_prefill_tokens: int = 0  # positions the draft read before drafting (prompt, catch-up after γ = 0)
    draft_prefill_seconds: float = 0.0
    overshoot_tokens: int = 0  # emitted by a final step past the stop (EOS or a stop sequence) and discarded
    verify_passes: int = 0  # target passes that verified a batch (steps counts rows' steps)
    host_reads: int = 0  # device-to-host reads while decoding (each a GPU synchronisation)
    reached_per_position: list[int] = field(default_factory=list)  # drafted at i, all before i accepted
    cut_drafts: int = 0  # final steps that drafted but, cut at a stop, count as drafting nothing
    cut_draft_tokens: int = 0  # draft tokens of final steps past the stop (not in draft_tokens)
    cut_accepted_per_position: list[int] = field(default_factory=list)  # accepted past the stop, per position
    baseline_prefill_seconds: float = 0.0  # plain decoding's prompt prefill (end-to-end speedup)
    # each request's own, in order
    per_request: list[GenerationStats] = field(default_factory=list, repr=False, compare=False)
    # (the engine fills it; adding concatenates; never written to a record: see request_figures)

    def __add__(self, other: GenerationStats) -> GenerationStats:
        merged = {}
        for f in fields(self):
            a, b = getattr(self, f.name), getattr(other, f.name)
            merged[f.name] = _add_lists(a, b) if f.name in POSITION_FIELDS else a + b  # request_tars: concatenated
        return GenerationStats(**merged)

    def record_step(self, drafted: int, accepted: int, depth: int | None = None,
                    uncut: tuple[int, int] | None = None) -> None:
        """Count one verification step that checked ``drafted`` draft tokens (a tree's nodes, ``depth`` deep; a
        chain: as deep as long) and accepted ``accepted``; per-position counters are per depth. ``uncut``: the
        step's (drafted, accepted) before a stop cut it to these."""
        depth = drafted if depth is None else depth
        if uncut is not None:
            self.cut_drafts += int(uncut[0] > 0 and drafted == 0)
            self.cut_draft_tokens += uncut[0] - drafted
            self.cut_accepted_per_position = _add_lists(self.cut_accepted_per_position,
                                                        [0] * accepted + [1] * (uncut[1] - accepted))
        self.reached_per_position = _add_lists(self.reached_per_position, [1] * min(depth, accepted + 1))
        self.steps += 1
        self.draft_tokens += drafted
        self.accepted_tokens += accepted
        self.drafted_per_position = _add_lists(self.drafted_per_position, [1] * depth)
        self.accepted_per_position = _add_lists(self.accepted_per_position, [1] * accepted)
        self.acceptance_length_histogram = _add_lists(self.acceptance_length_histogram, [0] * accepted + [1])
        self.drafted_histogram = _add_lists(self.drafted_histogram, [0] * drafted + [1])

    def end_request(self) -> None:
        """Close a single request's counters: remember its own TAR for the per-request percentiles."""
        if self.steps:
            self.request_tars.append((self.accepted_tokens + self.steps) / self.steps)

    def as_dict(self) -> dict:
        """The counters (``per_request`` left out: a record keeps run-wide counters)."""
        return {k: v for k, v in asdict(replace(self, per_request=[])).items() if k != "per_request"}

    def request_figures(self) -> dict:
        """One request's figures, as a sample of ``--log_samples`` carries them: its counters, acceptance as each
        engine defines it, and its milliseconds (draft: its share of each batch's drafting; verify: the target
        passes it took part in; decode: until it finished), with its baseline's tokens and seconds if timed."""
        return {
            "generated_tokens": self.generated_tokens, "overshoot_tokens": self.overshoot_tokens,
            "steps": self.steps, "drafts": self.drafts, "draft_tokens": self.draft_tokens,
            "accepted_tokens": self.accepted_tokens, "drafted_per_position": list(self.drafted_per_position),
            "accepted_per_position": list(self.accepted_per_position),
            "drafted_histogram": list(self.drafted_histogram), "reached_per_position": list(self.reached_per_position),
            "cut_drafts": self.cut_drafts, "cut_draft_tokens": self.cut_draft_tokens,
            "cut_accepted_per_position": list(self.cut_accepted_per_position), "tar": self.tar,
            **self.acceptance_figures,
            "draft_ms": self.draft_seconds * 1000, "verify_ms": self.verify_seconds * 1000,
            "decode_ms": self.decode_seconds * 1000,
            "baseline_tokens": self.baseline_tokens if self.baseline_seconds else None,
            "baseline_ms": self.baseline_seconds * 1000 if self.baseline_seconds else None,
            "speedup": self.speedup,
        }

    @classmethod
    def of_request(cls, figures: dict) -> GenerationStats:
        """The counters back from :meth:`request_figures` (to be summed over requests, the figures read off the sum)."""
        return cls(generations=1, steps=figures["steps"], draft_tokens=figures["draft_tokens"],
                   accepted_tokens=figures["accepted_tokens"], generated_tokens=figures["generated_tokens"],
                   overshoot_tokens=figures["overshoot_tokens"], decode_seconds=figures["decode_ms"] / 1000,
                   drafted_per_position=list(figures["drafted_per_position"]),
                   accepted_per_position=list(figures["accepted_per_position"]),
                   drafted_histogram=list(figures.get("drafted_histogram") or []),
                   reached_per_position=list(figures.get("reached_per_position") or []),
                   cut_drafts=figures.get("cut_drafts") or 0, cut_draft_tokens=figures.get("cut_draft_tokens") or 0,
                   cut_accepted_per_position=list(figures.get("cut_accepted_per_position") or []),
                   baseline_tokens=figures.get("baseline_tokens") or 0,
                   baseline_seconds=(figures.get("baseline_ms") or 0.0) / 1000)

    @property
    def trees(self) -> bool:
        """Whether some step drafted a token tree (more nodes than depth)."""
        return bool(self.drafted_per_position) and sum(self.drafted_per_position) < self.draft_tokens

    def tar_at(self, gamma: int) -> float | None:
        """Estimated TAR had every step drafted at most ``gamma`` tokens: a step that accepted n tokens would
        have accepted min(n, gamma). An estimate: step boundaries shift when γ changes. None for trees (a
        smaller node budget grows another tree)."""
        if not self.steps or not self.acceptance_length_histogram or self.trees:
            return None
        accepted = sum(count * min(n, gamma) for n, count in enumerate(self.acceptance_length_histogram))
        return (accepted + self.steps) / self.steps

    @property
    def tar(self) -> float | None:
        """Tokens emitted per verification step, the target's own included (the paper's TAR)."""
        return (self.accepted_tokens + self.steps) / self.steps if self.steps else None

    @property
    def accepted_per_step(self) -> float | None:
        """Draft tokens accepted per verification step (the target's own excluded)."""
        return self.accepted_tokens / self.steps if self.steps else None

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted over drafted tokens."""
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else None

    @property
    def drafts(self) -> int:
        """Verification steps that drafted at least one token (vLLM's ``num_drafts``; a tree counts once)."""
        return self.steps - (self.drafted_histogram[0] if self.drafted_histogram else 0)

    @property
    def vllm_counters(self) -> dict[str, int | list[int]] | None:
        """vLLM's ``spec_decode`` counters as its scheduler counts them for the same steps: drafted and accepted
        tokens before the stop check, so a final step's tokens past the stop count (``num_drafts``,
        ``num_draft_tokens``, ``num_accepted_tokens``, ``num_accepted_tokens_per_pos`` over the drafted
        positions). None for counters from before the cut was kept: every token past a stop is an accepted draft
        token the cut removed, so ``overshoot_tokens`` equals the cut's accepted tokens whenever they were kept."""
        if sum(self.cut_accepted_per_position) != self.overshoot_tokens:
            return None
        accepted = _add_lists(self.accepted_per_position, self.cut_accepted_per_position)
        positions = max(len(self.drafted_per_position), len(accepted))  # (vLLM's aggregate counters: no drafted)
        return {"num_drafts": self.drafts + self.cut_drafts,
                "num_draft_tokens": self.draft_tokens + self.cut_draft_tokens,
                "num_accepted_tokens": sum(accepted),
                "num_accepted_tokens_per_pos": (accepted + [0] * positions)[:positions]}

    @property
    def mean_acceptance_length(self) -> float | None:
        """vLLM's mean acceptance length: 1 + accepted draft tokens per draft, as its counters have them
        (:attr:`vllm_counters`: a final step's tokens past the stop included; steps that drafted nothing, as at
        γ = 0, are not drafts)."""
        counters = self.vllm_counters
        return 1 + counters["num_accepted_tokens"] / counters["num_drafts"] if counters and counters["num_drafts"] \
            else None

    @property
    def acceptance_rate_per_position(self) -> list[float]:
        """vLLM's per-position acceptance rate, unconditional: steps whose draft token (a tree: depth) i was
        accepted, over all drafts (a position after a rejection, or not drafted, counts as not accepted), from
        :attr:`vllm_counters`."""
        counters = self.vllm_counters
        drafts = counters["num_drafts"] if counters else 0
        return [a / drafts for a in counters["num_accepted_tokens_per_pos"]] if drafts else []

    @property
    def conditional_acceptance_per_position(self) -> list[float | None]:
        """SPEED-Bench's conditional per-position rate: steps that accepted position i over steps that drafted
        position i after accepting i - 1 (``reached_per_position``); None where no step reached i (and for
        counters from before ``reached_per_position`` was kept)."""
        positions = len(self.drafted_per_position)
        accepted = (self.accepted_per_position + [0] * positions)[:positions]
        reached = (self.reached_per_position + [0] * positions)[:positions]
        return [a / r if r else None for a, r in zip(accepted, reached)]

    @property
    def accept_length(self) -> float | None:
        """SGLang's accept length: completion tokens per verification step (SGLang emits a request's first token
        in its prefill, which it does not count as a step; our prefill emits none, so our first step is one)."""
        return self.generated_tokens / self.steps if self.steps else None

    @property
    def mean_accepted_tokens(self) -> float | None:
        """Spec-Bench's and EAGLE's mean accepted tokens: tokens emitted per target forward, the bonus included."""
        return self.tar

    @property
    def acceptance_figures(self) -> dict[str, float | list | None]:
        """The five acceptance figures by the name each engine or benchmark gives it (docs/acceptance.md)."""
        return {"mean_acceptance_length": self.mean_acceptance_length,
                "acceptance_rate_per_position": self.acceptance_rate_per_position,
                "conditional_acceptance_per_position": self.conditional_acceptance_per_position,
                "accept_length": self.accept_length, "mean_accepted_tokens": self.mean_accepted_tokens}

    @property
    def request_tar_percentiles(self) -> dict[str, float] | None:
        """p10, p50 and p90 over requests of each request's own TAR (None before any request ended)."""
        return {f"p{q}": _percentile(self.request_tars, q / 100) for q in (10, 50, 90)} if self.request_tars else None

    @property
    def _time_split(self) -> bool:
        return self.verify_seconds > 0  # False for a serving engine's counters: its time is not split

    @property
    def draft_ms_per_token(self) -> float | None:
        """The draft's milliseconds per drafted token (None where time is not split)."""
        return self.draft_seconds / self.draft_tokens * 1000 if self.draft_tokens and self._time_split else None

    @property
    def draft_prefill_ms_per_token(self) -> float | None:
        """The draft's milliseconds per position read before drafting (None where it read none)."""
        return self.draft_prefill_seconds / self.draft_prefill_tokens * 1000 if self.draft_prefill_tokens else None

    @property
    def verify_ms_per_step(self) -> float | None:
        """The target's milliseconds per verification step (None where time is not split)."""
        return self.verify_seconds / self.steps * 1000 if self.steps and self._time_split else None

    @property
    def tokens_per_second(self) -> float | None:
        return self.generated_tokens / self.decode_seconds if self.decode_seconds > 0 else None

    @property
    def baseline_tokens_per_second(self) -> float | None:
        return self.baseline_tokens / self.baseline_seconds if self.baseline_seconds > 0 else None

    @property
    def speedup(self) -> float | None:
        """Tokens/s over plain decoding's through the same path (None without a baseline)."""
        tps, base = self.tokens_per_second, self.baseline_tokens_per_second
        return tps / base if tps and base else None

    @property
    def end_to_end_tokens_per_second(self) -> float | None:
        """Tokens per second of the requests' wall time: the target's prefill and the decoding."""
        seconds = self.prefill_seconds + self.decode_seconds
        return self.generated_tokens / seconds if self.decode_seconds > 0 else None

    @property
    def end_to_end_speedup(self) -> float | None:
        """:attr:`end_to_end_tokens_per_second` over plain decoding's, its prefill included (None without a
        baseline, or one timed before its prefill was kept)."""
        tps = self.end_to_end_tokens_per_second
        if not tps or not self.baseline_prefill_seconds or not self.baseline_seconds:
            return None
        return tps / (self.baseline_tokens / (self.baseline_prefill_seconds + self.baseline_seconds))

    @property
    def loop_overhead(self) -> float | None:
        """Share of decode time outside the draft's and the target's passes (None where time is not split)."""
        if self.decode_seconds > 0 and self.steps and self.verify_seconds > 0:
            return 1 - (self.draft_seconds + self.draft_prefill_seconds + self.verify_seconds) / self.decode_seconds
        return None

    def summary(self) -> dict:
        """The figures users read, as the record's JSON writes them: TAR, acceptance (overall and per position),
        latencies, throughput, speedup. Other modules read the properties above, not these keys.

        The prediction of throughput needs separately measured latencies
        (:func:`analytical.predicted_from_latencies`).
        """
        steps, drafted = self.steps, self.draft_tokens
        return {
            "steps": steps,
            "draft_tokens": drafted,
            "accepted_tokens": self.accepted_tokens,
            "generated_tokens": self.generated_tokens,
            "tar": self.tar,
            "accepted_per_step": self.accepted_per_step,
            "acceptance_rate": self.acceptance_rate,
            **self.acceptance_figures,
            "drafted_per_position": list(self.drafted_per_position),
            "accepted_per_position": list(self.accepted_per_position),
            "acceptance_length_histogram": list(self.acceptance_length_histogram),
            "drafted_histogram": list(self.drafted_histogram),
            "per_request_mean_accepted_length": self.request_tar_percentiles,
            "mean_num_draft_tokens": drafted / steps if steps else None,
            "draft_ms_per_token": self.draft_ms_per_token,
            "draft_prefill_ms_per_token": self.draft_prefill_ms_per_token,
            "verify_ms_per_step": self.verify_ms_per_step,
            "tokens_per_second": self.tokens_per_second,
            "baseline_tokens": self.baseline_tokens,
            "overshoot_tokens": self.overshoot_tokens,
            "baseline_tokens_per_second": self.baseline_tokens_per_second,
            "speedup": self.speedup,
            "end_to_end_tokens_per_second": self.end_to_end_tokens_per_second,
            "end_to_end_speedup": self.end_to_end_speedup,
            "loop_overhead": self.loop_overhead,
            "compile_seconds": self.compile_seconds,
            "recompiles": self.recompiles,
            "verify_passes": self.verify_passes,
            "host_reads_per_pass": self.host_reads / self.verify_passes if self.verify_passes else None,
        }


@dataclass(frozen=True)
class Divergence:
    """Where a greedy speculative output first differs from plain decoding's: the token index, both tokens, the
    target's logit margin there (baseline's over the speculative token: near 0 is a near-tie reduced precision can
    flip, a large one points at a bug) and the task; fields None where unknown (the output only ran longer)."""

    task: str | None = None
    index: int | None = None
    specdec_token: int | None = None
    baseline_token: int | None = None
    logit_margin: float | None = None

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> Divergence:
        return cls(**{f.name: data.get(f.name) for f in fields(cls)})
