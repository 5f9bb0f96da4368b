"""The founding paper's analytical throughput model.

    tokens/s = TAR / (gamma * t_draft + t_verify(gamma))

``TAR`` is the paper's: tokens emitted per verification step, the target's own token included (measured,
not derived from an independent-acceptance assumption); ``t_draft`` is the draft's seconds per drafted
token and ``t_verify`` the target's seconds for one verification step of ``gamma`` draft tokens.
"""

from __future__ import annotations


def predicted_tokens_per_second(tar: float, gamma: float, t_draft: float, t_verify: float) -> float:
    """Predicted decoding throughput in tokens per second."""
    step_seconds = gamma * t_draft + t_verify
    if step_seconds <= 0:
        raise ValueError("gamma * t_draft + t_verify must be positive")
    return tar / step_seconds


def predicted_speedup(tar: float, gamma: float, t_draft: float, t_verify: float, t_target: float) -> float:
    """Predicted speedup over autoregressive decoding at ``t_target`` seconds per token."""
    return predicted_tokens_per_second(tar, gamma, t_draft, t_verify) * t_target
