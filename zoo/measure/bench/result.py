"""``zoo bench``'s result: one :class:`BenchRow` per configuration, the run's settings around them
(:class:`BenchResult`, JSON at the edge), and the losslessness rule every row is held to."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from specdraft_eval.errors import SpecdecError
from specdraft_eval.results.profiles import Spread

SCHEMA_VERSION = 5  # 2: kernels, mismatched_prompts, vs_plain_assisted; 3: mismatch_logit_margins, numerics,
# lossless, compile, the "specdraft plain" row and vs_ours_plain; the in-run "prediction" removed; 4: spreads carry n;
# 5: compiled rows beside the eager ones (compiled, warm_up_seconds, timed_compiles)
NEAR_TIE_LOGIT_MARGIN = 0.5
"""In bfloat16/float16, a divergence whose logit margin is at most this is counted as numerics, not a bug."""
AUTOREGRESSIVE, ASSISTED, OURS, OURS_DYNAMIC, OURS_PLAIN = (
    "transformers autoregressive", "transformers assisted", "specdraft", "specdraft dynamic γ", "specdraft plain")


@dataclass(frozen=True)
class BenchPlan:
    """How ``zoo bench`` times each configuration: γ, repeats, tokens per generation, and whether compiled
    configurations run beside the eager ones."""

    gamma: int
    repeats: int
    max_new_tokens: int
    compile: bool = False


@dataclass(frozen=True)
class StepFigures:
    """Per-step figures of a configuration: TAR, draft ms per drafted token, verification ms per step, mean γ, and
    (our engine's rows) acceptance as vLLM, SPEED-Bench, SGLang and Spec-Bench define it
    (:attr:`GenerationStats.acceptance_figures`)."""

    tar: float | None
    draft_ms_per_token: float | None
    verify_ms_per_step: float | None
    mean_gamma: float | None
    acceptance: dict | None = None
    tar_by_repeat: list[float | None] | None = None  # our engine's rows: each repeat's own (a fresh draft each)


@dataclass
class BenchRow:
    """One configuration's figures: throughput and ratios (median with min and max over the repeats), whether its
    outputs equal the autoregressive reference's (and the logit margins where they do not), memory, step figures."""

    engine: str
    kernels: str
    draft: str | None
    gamma: int | None
    dynamic_gamma: bool
    mismatched_prompts: list[int]
    mismatch_logit_margins: list[float | None]
    numerics: int
    generated_tokens: int
    tokens_per_second: Spread
    vs_autoregressive: Spread
    vs_ours_plain: Spread
    overhead: float
    peak_mb: float | None
    draft_weights_mb: float
    steps: StepFigures
    vs_assisted: Spread | None = None
    vs_plain_assisted: Spread | None = None
    memory_ok: bool | None = None
    compiled: bool = False
    warm_up_seconds: float = 0.0  # the first call, compilation included, outside the timed runs
    timed_compiles: int = 0  # graphs compiled during the timed runs (0: the warm-up covered every shape)

    @property
    def identical(self) -> bool:
        return not self.mismatched_prompts

    def to_json(self) -> dict:
        spreads = {k: getattr(self, k).to_json() if getattr(self, k) else None for k in
                   ("tokens_per_second", "vs_autoregressive", "vs_ours_plain", "vs_assisted", "vs_plain_assisted")}
        return {"engine": self.engine, "kernels": self.kernels, "draft": self.draft, "gamma": self.gamma,
                "dynamic_gamma": self.dynamic_gamma, "identical": self.identical,
                "mismatched_prompts": self.mismatched_prompts, "mismatch_logit_margins": self.mismatch_logit_margins,
                "numerics": self.numerics, "generated_tokens": self.generated_tokens, **spreads,
                "overhead": self.overhead, "peak_mb": self.peak_mb, "draft_weights_mb": self.draft_weights_mb,
                **asdict(self.steps), "memory_ok": self.memory_ok, "compiled": self.compiled,
                "warm_up_seconds": self.warm_up_seconds, "timed_compiles": self.timed_compiles}


@dataclass
class BenchResult:
    """A ``zoo bench`` run: what was measured where, and its rows (the autoregressive reference first)."""

    target: str
    dtype: str
    compile: bool
    hardware: str
    gamma: int
    max_new_tokens: int
    prompts: int
    repeats: int
    configs: list[BenchRow] = field(default_factory=list)
    lossless: str | None = None
    task: str | None = None

    def to_json(self) -> dict:
        return {"schema_version": SCHEMA_VERSION, "target": self.target, "dtype": self.dtype, "compile": self.compile,
                "hardware": self.hardware, "gamma": self.gamma, "max_new_tokens": self.max_new_tokens,
                "prompts": self.prompts, "repeats": self.repeats, "configs": [r.to_json() for r in self.configs],
                "lossless": self.lossless, "task": self.task}


def near_tie(margin: float | None, dtype: str) -> bool:
    """Whether a divergence is reduced precision's doing: in bfloat16/float16, the target's two candidate tokens
    within ``NEAR_TIE_LOGIT_MARGIN`` of each other (one fresh forward pass); in float32, never."""
    return margin is not None and dtype in ("bfloat16", "float16") and abs(margin) <= NEAR_TIE_LOGIT_MARGIN


def check_lossless(result: BenchResult, prompts: list[str]) -> str:
    """Raise naming the first prompt on which a configuration's output differs from the autoregressive one, unless
    every such difference is a reduced-precision near-tie (``numerics``); say what was found."""
    numerics = 0
    for row in result.configs:
        for i, margin in zip(row.mismatched_prompts, row.mismatch_logit_margins, strict=True):
            if not near_tie(margin, result.dtype):
                where = "" if margin is None else f" with a logit margin of {margin:.3g}"
                raise SpecdecError(
                    f"{row.engine} ({row.draft}, {row.kernels} kernels{', compiled' if row.compiled else ''}) "
                    "differs from the target's greedy "
                    f"generate on prompt {i} ({prompts[i][:40]!r}...){where}: this is a losslessness bug, please "
                    "report it")
        numerics += row.numerics
    return (f"{numerics} divergence(s), each a {result.dtype} near-tie (|logit margin| <= {NEAR_TIE_LOGIT_MARGIN})"
            if numerics else "every output identical to the target's greedy generate")
