"""The analytical model against hand-worked numbers."""

import pytest

from specdraft_eval.measure.analytical import (
    predicted_speedup,
    predicted_tokens_per_second,
)
from specdraft_eval.measure.stats import GenerationStats


def test_hand_worked_throughput():
    # TAR 2.5: 1.5 accepted per step + the target's own token = 2.5 tokens per (4 x 10 ms + 50 ms) = 90 ms
    # -> 27.78 tokens/s
    assert predicted_tokens_per_second(2.5, 4, 0.010, 0.050) == pytest.approx(2.5 / 0.090)
    # against 40 ms per autoregressive token (25 tokens/s): 27.78 / 25 = 1.111
    assert predicted_speedup(2.5, 4, 0.010, 0.050, 0.040) == pytest.approx(1.1111, rel=1e-4)
    # no draft cost and full acceptance: TAR = γ + 1 tokens per verification
    assert predicted_tokens_per_second(5, 4, 0.0, 0.1) == pytest.approx(50.0)


def test_rejects_zero_step_time():
    with pytest.raises(ValueError):
        predicted_tokens_per_second(1.0, 4, 0.0, 0.0)


def test_stats_summary_figures():
    stats = GenerationStats(generations=1, steps=10, draft_tokens=40, accepted_tokens=15, generated_tokens=25,
                            draft_seconds=0.4, verify_seconds=0.5, decode_seconds=1.0, baseline_tokens=25,
                            baseline_seconds=1.0)
    s = stats.summary()
    assert s["tar"] == 2.5 and s["accepted_per_step"] == 1.5 and s["acceptance_rate"] == 0.375
    assert s["draft_ms_per_token"] == pytest.approx(10.0) and s["verify_ms_per_step"] == pytest.approx(50.0)
    assert s["loop_overhead"] == pytest.approx(0.1)  # 0.1 s of 1.0 s outside the draft and verify passes
    assert s["tokens_per_second"] == pytest.approx(25.0)
    assert s["speedup"] == pytest.approx(1.0)
    assert (stats + stats).summary()["tar"] == 2.5
