"""Per-generation counters and timings, and the summary figures derived from them."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from specdraft_eval.analytical import predicted_tokens_per_second


@dataclass
class GenerationStats:
    """What one or more speculative generations did. Add two with ``+`` to aggregate.

    Times are seconds. ``decode_seconds`` excludes the target's prompt prefill (identical work with
    or without a draft); the draft's own prompt processing counts as draft time.
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

    def __add__(self, other: "GenerationStats") -> "GenerationStats":
        return GenerationStats(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})

    def as_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> dict:
        """The figures users read: TAR, acceptance, latencies, throughput, speedup, prediction."""
        steps, drafted = self.steps, self.draft_tokens
        tar = self.accepted_tokens / steps if steps else None
        t_draft = self.draft_seconds / drafted if drafted else 0.0
        t_verify = self.verify_seconds / steps if steps else None
        tps = self.generated_tokens / self.decode_seconds if self.decode_seconds > 0 else None
        base_tps = self.baseline_tokens / self.baseline_seconds if self.baseline_seconds > 0 else None
        predicted = (
            predicted_tokens_per_second(tar, drafted / steps, t_draft, t_verify)
            if steps and t_verify
            else None
        )
        return {
            "steps": steps,
            "draft_tokens": drafted,
            "accepted_tokens": self.accepted_tokens,
            "generated_tokens": self.generated_tokens,
            "tar": tar,
            "mean_accepted_length": tar + 1 if tar is not None else None,
            "acceptance_rate": self.accepted_tokens / drafted if drafted else None,
            "mean_num_draft_tokens": drafted / steps if steps else None,
            "draft_ms_per_token": t_draft * 1000 if drafted else None,
            "verify_ms_per_step": t_verify * 1000 if t_verify is not None else None,
            "tokens_per_second": tps,
            "baseline_tokens_per_second": base_tps,
            "speedup": tps / base_tps if tps and base_tps else None,
            "predicted_tokens_per_second": predicted,
        }
