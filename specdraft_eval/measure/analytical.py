"""The founding paper's analytical throughput model.

    tokens/s = TAR / (gamma * t_draft + t_verify(gamma))

``TAR`` is the paper's: tokens emitted per verification step, the target's own token included (measured,
not derived from an independent-acceptance assumption); ``t_draft`` is the draft's seconds per drafted
token and ``t_verify`` the target's seconds for one verification step of ``gamma`` draft tokens.
"""

from __future__ import annotations

from dataclasses import dataclass


def predicted_tokens_per_second(tar: float, gamma: float, t_draft: float, t_verify: float) -> float:
    """Predicted decoding throughput in tokens per second."""
    step_seconds = gamma * t_draft + t_verify
    if step_seconds <= 0:
        raise ValueError("gamma * t_draft + t_verify must be positive")
    return tar / step_seconds


def predicted_speedup(tar: float, gamma: float, t_draft: float, t_verify: float, t_target: float) -> float:
    """Predicted speedup over autoregressive decoding at ``t_target`` seconds per token."""
    return predicted_tokens_per_second(tar, gamma, t_draft, t_verify) * t_target


def break_even_tar(gamma: float, t_draft: float, t_verify: float, t_target: float) -> float:
    """The TAR at which :func:`predicted_speedup` is 1: below it the draft slows decoding down."""
    return (gamma * t_draft + t_verify) / t_target


def steps_by_draft_length(drafted_per_position: list[int], steps: int) -> dict[int, int]:
    """How many steps drafted exactly k tokens, from per-position counts: ``drafted_per_position[i]`` steps
    drafted at least i + 1 tokens."""
    at_least = [steps, *drafted_per_position, 0]
    return {k: at_least[k] - at_least[k + 1] for k in range(len(at_least) - 1) if at_least[k] - at_least[k + 1]}


@dataclass(frozen=True)
class Latencies:
    """Separately measured latencies (a profile's) a prediction needs for one draft: ms to verify k draft
    tokens (k = 0: a plain step), ms per drafted token, the draft's own prompt processing per token, and the
    loop's own ms per step outside the draft's and the target's passes (bookkeeping, stop checks; 0: not
    measured)."""

    t_verify_ms: dict[int, float]
    t_draft_ms: float
    draft_prefill_ms_per_token: float = 0.0
    source: str = ""
    loop_ms_per_step: float = 0.0

    def to_json(self) -> dict:
        return {"t_verify_ms": {str(k): v for k, v in sorted(self.t_verify_ms.items())}, "t_draft_ms": self.t_draft_ms,
                "draft_prefill_ms_per_token": self.draft_prefill_ms_per_token, "source": self.source,
                "loop_ms_per_step": self.loop_ms_per_step}

    @classmethod
    def from_json(cls, data: dict) -> Latencies:
        return cls({int(k): float(v) for k, v in data["t_verify_ms"].items()}, float(data["t_draft_ms"]),
                   float(data.get("draft_prefill_ms_per_token", 0.0)), data.get("source", ""),
                   float(data.get("loop_ms_per_step", 0.0)))


def predicted_from_latencies(stats, latencies: Latencies) -> float | None:
    """Tokens/s a run's counts predict with *separately measured* latencies (a profile), never its own seconds.

    Each step that drafted k tokens (a tree's nodes) costs k·t_draft + t_verify(k) + the loop's own time (the mix
    of k from the drafted histogram; in records older than it, from the per-position counts of chains; with none,
    every step at the mean γ); the draft's prefill (each prompt, and its catch-up after dynamic γ drafted nothing) costs
    ``draft_prefill_ms_per_token`` per position read. None when a needed latency is missing.
    """
    if not stats.steps or not stats.generated_tokens:
        return None
    verify = {k: v / 1000 for k, v in latencies.t_verify_ms.items()}
    t_draft = latencies.t_draft_ms / 1000
    if stats.drafted_histogram:
        mix = {k: n for k, n in enumerate(stats.drafted_histogram) if n}
    elif stats.drafted_per_position or not stats.draft_tokens:
        mix = steps_by_draft_length(stats.drafted_per_position, stats.steps)
    else:  # no per-position counts (a schema-1 record): every step at the nearest measured γ
        mix = {round(stats.draft_tokens / stats.steps): stats.steps}
    if any(k not in verify for k in mix):
        return None
    seconds = sum(n * (k * t_draft + verify[k] + latencies.loop_ms_per_step / 1000) for k, n in mix.items())
    read = stats.draft_prefill_tokens or stats.prompt_tokens  # records before catch-up was counted: the prompts
    seconds += read * latencies.draft_prefill_ms_per_token / 1000
    return stats.generated_tokens / seconds
