"""engine.session.Session: a run's batches with the baseline beside them, the greedy check and per-task figures."""

from __future__ import annotations

import pytest
from support import tiny_llama

from specdraft_eval.drafts.prompt_lookup import KIND
from specdraft_eval.engine import session as session_module
from specdraft_eval.engine.loop import autoregressive_generate
from specdraft_eval.engine.params import DecodeParams, GammaPolicy, RunSettings
from specdraft_eval.engine.session import Session

PROMPTS = [[3, 4, 5, 5, 5, 3, 4], [7, 8, 9, 7, 8], [2, 2, 2]]


def test_a_session_runs_batches_with_the_baseline_and_sums_per_task():
    target = tiny_llama()
    session = Session(target, KIND.load("3", None), RunSettings(GammaPolicy(3)), baseline=True)
    first = session.generate(PROMPTS[:2], DecodeParams(16), task="a")
    second = session.generate(PROMPTS[2:], DecodeParams(16), task="b")
    plain = [autoregressive_generate(target, prompt, 16)[0] for prompt in PROMPTS]
    assert first.outputs + second.outputs == plain and not first.divergences + second.divergences
    assert session.stats["a"].generated_tokens == session.stats["a"].baseline_tokens == 32
    assert session.stats["b"].generations == 1 and session.stats["a"].baseline_mismatches == 0
    assert [r.generated_tokens for r in first.per_request] == [r.baseline_tokens for r in first.per_request] == [16, 16]


def test_a_session_counts_a_divergence_with_its_index(monkeypatch):
    """Negative control: a baseline that differs at token 5 is counted, with the index and the logit margin."""
    real = session_module.autoregressive_generate_batch

    def shifted(*args, **kwargs):
        outputs, stats = real(*args, **kwargs)
        return [row[:5] + [(row[5] + 1) % 64] + row[6:] for row in outputs], stats

    monkeypatch.setattr(session_module, "autoregressive_generate_batch", shifted)
    session = Session(tiny_llama(), KIND.load("3", None), RunSettings(GammaPolicy(3)), baseline=True)
    batch = session.generate(PROMPTS[:1], DecodeParams(16), task="t")
    [where] = batch.divergences
    assert where.index == 5 and where.task == "t" and where.logit_margin is not None
    assert session.stats["t"].baseline_mismatches == 1 and session.divergences == [where]


def test_the_sides_alternate_from_the_first_batch_given(monkeypatch):
    """Speculative first in the first batch, then the baseline first, ...; ``baseline_first`` starts the other way
    (a study of one-batch sessions alternates it, so neither side always runs on the colder memory)."""
    order = []
    real_spec, real_plain = session_module.speculative_generate_batch, session_module.autoregressive_generate_batch
    monkeypatch.setattr(session_module, "speculative_generate_batch",
                        lambda *a, **k: (order.append("spec"), real_spec(*a, **k))[1])
    monkeypatch.setattr(session_module, "autoregressive_generate_batch",
                        lambda *a, **k: (order.append("plain"), real_plain(*a, **k))[1])
    target = tiny_llama()
    for first in (False, True):
        order.clear()
        session = Session(target, KIND.load("3", None), baseline=True, baseline_first=first)
        for _ in range(3):
            session.generate(PROMPTS[:1], DecodeParams(4))
        starts = order[::2]
        assert starts == (["plain", "spec", "plain"] if first else ["spec", "plain", "spec"])


def test_speedup_end_to_end_counts_both_sides_prefill():
    """Decode-only speedup leaves the target's prefill out of both clocks; the end-to-end figure times the requests'
    wall time as Spec-Bench does: 100 tokens in 1 s of prefill + 4 s against plain decoding's 1 s + 9 s is 2.0x end to
    end where decoding alone is 2.25x."""
    from specdraft_eval.measure.stats import GenerationStats

    stats = GenerationStats(generated_tokens=100, prefill_seconds=1.0, decode_seconds=4.0, baseline_tokens=100,
                            baseline_prefill_seconds=1.0, baseline_seconds=9.0)
    assert stats.speedup == pytest.approx(2.25) and stats.end_to_end_speedup == pytest.approx(2.0)
    assert GenerationStats(generated_tokens=100, decode_seconds=4.0, baseline_tokens=100,
                           baseline_seconds=9.0).end_to_end_speedup is None  # plain decoding's prefill unknown
    session = Session(tiny_llama(), KIND.load("3", None), baseline=True)
    stats = session.generate([list(range(2, 40))] * 2, DecodeParams(8)).stats
    assert stats.prefill_seconds > 0 and stats.baseline_prefill_seconds > 0
    assert stats.end_to_end_speedup == pytest.approx(
        stats.generated_tokens / (stats.prefill_seconds + stats.decode_seconds)
        / (stats.baseline_tokens / (stats.baseline_prefill_seconds + stats.baseline_seconds)))
    assert stats.summary()["end_to_end_speedup"] == stats.end_to_end_speedup
