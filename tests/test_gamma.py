"""The dynamic-γ controller: it climbs while drafting pays and backs off to autoregressive steps when not."""

from __future__ import annotations

import pytest
import torch

from specdraft_eval.engine.gamma import GammaController


def drive(controller: GammaController, steps: int, accept: float, verify_ms, draft_ms: float) -> list[int]:
    """Feed ``steps`` synthetic steps: each drafted token accepted while the running share stays below
    ``accept``; verify costs ``verify_ms(n)`` for n tokens."""
    chosen, accepted_total, drafted_total = [], 0, 0
    for _ in range(steps):
        gamma = controller.next_step(1)[0]
        chosen.append(gamma)
        accepted = 0
        while accepted < gamma and (accepted_total + 1) <= accept * (drafted_total + gamma):
            accepted += 1
            accepted_total += 1
        drafted_total += gamma
        controller.update(gamma, accepted, gamma * draft_ms / 1000, verify_ms(gamma + 1) / 1000)
    return chosen


def test_starts_at_gamma_then_measures_an_autoregressive_step():
    controller = GammaController(start=4, max_num_draft_tokens=16)
    assert controller.next_step(1)[0] == 4
    controller.update(4, 4, 0.001, 0.070)
    assert controller.next_step(1)[0] == 0  # a 1-token step has not been measured yet


def test_a_probe_that_drafted_nothing_measures_no_verification_and_probes_again():
    """The first step's probe asks row 0 of 8 for a token and the draft has none (an EAGLE head before a one-token
    prompt's first pass): its pass is a plain one, so the next step probes again rather than taking that plain cost
    as verifying 1 + 1/8 tokens a row (then a measured plain step of the same cost made verification look free and
    whether the batch ever drafted hung on timing noise). Control: a probe that drafted is measured, and the next
    step is the plain one that completes the shape."""
    controller = GammaController(start=4, max_num_draft_tokens=16)
    assert controller.next_step(8) == [1] + [0] * 7
    controller.update([0] * 8, [0] * 8, 0.001, 0.100, asked=[1] + [0] * 7)
    assert controller.next_step(8) == [1] + [0] * 7
    assert controller.verify_seconds(1, 8) == 0.100
    control = GammaController(start=4, max_num_draft_tokens=16)
    control.update([1] + [0] * 7, [0] * 8, 0.001, 0.100, asked=[1] + [0] * 7)
    assert control.next_step(8) == [0] * 8


def test_climbs_when_verification_is_flat_and_drafts_are_accepted():
    controller = GammaController(start=4, max_num_draft_tokens=16)
    chosen = drive(controller, 40, accept=0.95, verify_ms=lambda n: 60.0, draft_ms=0.05)
    assert chosen[-1] == 16 and max(chosen[-10:]) == 16


def test_backs_off_to_autoregressive_and_probes_when_drafts_fail():
    controller = GammaController(start=4, max_num_draft_tokens=16, probe_every=8)
    chosen = drive(controller, 60, accept=0.0, verify_ms=lambda n: 60.0 + 10.0 * n, draft_ms=20.0)
    tail = chosen[20:]
    assert tail.count(0) >= 0.85 * len(tail)  # mostly autoregressive steps
    assert 1 in tail  # with a γ=1 probe now and then
    assert max(tail) == 1


def test_cheap_verification_of_a_few_tokens_picks_a_moderate_gamma():
    # fp32 on a small CPU: 2-3 tokens cost little more than 1, 4+ much more (measured shape).
    costs = {1: 63.0, 2: 69.0, 3: 75.0, 4: 99.0, 5: 101.0}
    controller = GammaController(start=4, max_num_draft_tokens=16)
    chosen = drive(controller, 60, accept=0.6, verify_ms=lambda n: costs.get(n, 100.0 + 4 * n), draft_ms=0.05)
    assert set(chosen[-20:]) <= {1, 2, 3}


def test_verify_estimates_interpolate_and_extrapolate():
    controller = GammaController(start=2, max_num_draft_tokens=8)
    controller.update(0, 0, 0.0, 0.010)  # 1 token: 10 ms
    controller.update(2, 1, 0.0, 0.030)  # 3 tokens: 30 ms
    assert abs(controller.verify_seconds(2) - 0.020) < 1e-12
    assert abs(controller.verify_seconds(5) - 0.050) < 1e-12


def test_probes_that_do_not_pay_back_off_exponentially_and_one_that_pays_resets():
    controller = GammaController(start=4, max_num_draft_tokens=16, probe_every=8, max_probe_every=64)
    chosen = drive(controller, 400, accept=0.0, verify_ms=lambda n: 60.0 + 10.0 * n, draft_ms=20.0)
    probes = [i for i, g in enumerate(chosen) if g == 1 and i > 2]
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    # a γ = 1 probe costs 10 ms verifying and 20 ms drafting, 43% of a 70 ms plain step: at PROBE_SHARE (1%) it waits
    # 43 plain steps, until the wait's doubling (8, 16, 32, 64) passes that
    assert gaps[:2] == [44, 44] and set(gaps[2:]) == {65}
    assert controller.probe_every == 64
    for _ in range(64):
        controller.update(0, 0, 0.0, 0.07)
    assert controller.next_step(1)[0] == 1  # the next probe is due
    controller.update(1, 1, 0.001, 0.071)  # accepted, but one acceptance after many rejections: still no gain
    assert controller.probe_every == 64
    good = GammaController(start=4, max_num_draft_tokens=16, probe_every=8, max_probe_every=64)
    drive(good, 40, accept=0.9, verify_ms=lambda n: 60.0 + 1.0 * n, draft_ms=0.5)  # a draft that pays
    good.probe_every, good._idle[1] = 64, 64  # as if it had backed off
    good.update(1, 1, 0.0005, 0.061)
    assert good.probe_every == 8


def test_one_controller_serves_a_whole_run(monkeypatch):
    """Passed to every generation, the controller starts each request with what it learnt before. The engine's
    clock is a fake one (each reading 10 ms after the last), so the controller sees the same latencies on any
    machine under any load."""
    import itertools

    import torch
    from support import tiny_llama

    from specdraft_eval import speculative_generate
    from specdraft_eval.drafts.model import ModelDrafter
    from specdraft_eval.engine import loop as engine

    ticks = itertools.count()
    monkeypatch.setattr(engine, "clock", lambda device: next(ticks) * 0.010)

    target, draft = tiny_llama(seed=0), ModelDrafter(tiny_llama(seed=1, layers=1), "poor", 64)
    controller = GammaController(start=4, max_num_draft_tokens=16)
    prompt = torch.arange(2, 9)[None]
    first, fresh = speculative_generate(target, draft, prompt, 20, gamma_controller=controller)
    second, learnt = speculative_generate(target, draft, prompt, 20, gamma_controller=controller)
    assert second == first
    assert fresh.accepted_tokens < fresh.draft_tokens  # a poor draft ...
    assert learnt.draft_tokens < fresh.draft_tokens / 2  # ... is not tried at γ=4 again on the next request


# --- a draft's catch-up is its prefill ------------------------------------------------------------------------


class Scripted(GammaController):
    """γ from a script, step by step (then 2): the engine's side of dynamic γ without the controller's choices."""

    def __init__(self, script: list[int]) -> None:
        super().__init__(script[0], 8)
        self.next, self.script = script[0], script[1:]

    def update(self, drafted, accepted, draft_seconds: float, verify_seconds: float, asked=None) -> None:
        self.next = self.script.pop(0) if self.script else 2

    def next_step(self, rows: int, prober: int = 0) -> list[int]:
        return [self.next] * rows


def test_a_draft_catches_up_before_its_first_draft_and_after_gamma_zero_as_its_prefill():
    """ingest runs before the first draft and before the first draft after steps at γ = 0, never otherwise;
    the positions it read are the stats' draft prefill, apart from the drafted tokens' time; output unchanged."""
    from support import tiny_llama

    from specdraft_eval import autoregressive_generate, speculative_generate
    from specdraft_eval.drafts.layers import layer_view
    from specdraft_eval.drafts.model import ModelDrafter
    from specdraft_eval.engine.drafter import DrafterBase

    target = tiny_llama(seed=1, layers=4)

    class Recording(DrafterBase):
        name = "recording"

        def __init__(self) -> None:
            self.inner = ModelDrafter(layer_view(target, [0, 1]), "layers:0-1", target.config.vocab_size)
            self.calls: list[tuple[str, int]] = []  # ("ingest", positions read) or ("propose", len(tokens))

        def ingest(self, tokens):
            read = self.inner.ingest(tokens)
            self.calls.append(("ingest", read))
            return read

        def propose(self, tokens, num_tokens, sampler):
            self.calls.append(("propose", len(tokens)))
            return self.inner.propose(tokens, num_tokens, sampler)

    prompt, script = list(range(3, 20)), [2, 2, 0, 0, 0, 3, 1, 0, 2]
    draft = Recording()
    out, stats = speculative_generate(target, draft, prompt, 30, gamma_controller=Scripted(script))
    assert out == autoregressive_generate(target, prompt, 30)[0]
    kinds = [kind for kind, _ in draft.calls]
    # drafted steps: 2, 2, [γ 0 × 3], 3, 1, [γ 0], 2, 2, ...: a catch-up before the 1st, 3rd and 5th drafting step
    starts = [i for i, kind in enumerate(kinds) if kind == "ingest"]
    proposes_before = [kinds[:i].count("propose") for i in starts]
    assert proposes_before == [0, 2, 4], draft.calls
    reads = [n for kind, n in draft.calls if kind == "ingest"]
    assert reads[0] == len(prompt) - 1 and all(n > 0 for n in reads[1:])  # the prompt; what γ 0 emitted
    assert stats.draft_prefill_tokens == sum(reads)
    assert stats.draft_prefill_seconds > 0 and stats.draft_prefill_ms_per_token is not None


def test_a_batch_probes_the_row_its_draft_has_least_to_catch_up_on():
    """The loop names the row that drafts a batch's probe: the one whose draft has the fewest tokens unread (first
    the shortest prompt, then the row that drafted last, a few tokens behind where the others are a whole prompt),
    so a probe's catching up costs least; outputs unchanged. Control: with the prompts reordered, the prober moves
    with the short prompt."""
    from support import tiny_llama

    from specdraft_eval.drafts.layers import layer_view
    from specdraft_eval.drafts.model import ModelDrafter
    from specdraft_eval.engine.loop import autoregressive_generate_batch, speculative_generate_batch

    class Probing(GammaController):
        """Probes every step, γ 2 for the row the loop names."""

        def __init__(self) -> None:
            super().__init__(2, 8)
            self.probers: list[tuple[int, int]] = []  # (rows, prober) per step

        def next_step(self, rows: int, prober: int = 0) -> list[int]:
            self.probers.append((rows, prober))
            return [2 if row == prober else 0 for row in range(rows)]

        def update(self, *measured, asked=None) -> None:
            """Nothing to learn."""

    target = tiny_llama(seed=1, layers=4)
    long, short, middle = list(range(3, 30)), list(range(5, 12)), list(range(4, 20))
    for prompts, expected in (([long, short, middle], 1), ([short, middle, long], 0), ([middle, long, short], 2)):
        controller = Probing()
        draft = ModelDrafter(layer_view(target, [0, 1]), "layers:0-1", target.config.vocab_size)
        out, stats = speculative_generate_batch(target, draft, prompts, 12, gamma_controller=controller)
        assert out == autoregressive_generate_batch(target, prompts, 12)[0]
        assert {prober for rows, prober in controller.probers if rows == 3} == {expected}, controller.probers
        assert stats.draft_tokens > 0


def test_catching_up_changes_no_draft():
    """A draft that caught up on a sequence proposes what one that read it in ``propose`` does; a second catch-up
    reads nothing. A layer view and an EAGLE head (fed the target's features, as the engine does)."""
    from support import tiny_llama

    from specdraft_eval.drafts.eagle import EagleDrafter, new_head
    from specdraft_eval.drafts.layers import layer_view
    from specdraft_eval.drafts.model import ModelDrafter
    from specdraft_eval.engine.sampling import Sampler

    target = tiny_llama(seed=2, layers=4)
    tokens = [5, 9, 2, 7, 7, 3, 11, 4]
    with torch.inference_mode():
        features = target(torch.tensor([tokens]), output_hidden_states=True).hidden_states[-1][0, :-1]

        def fresh(kind: str):
            if kind == "layers":
                return ModelDrafter(layer_view(target, [0, 2]), "layers:0+2", target.config.vocab_size)
            head = EagleDrafter(new_head(target, None, seed=4), target, "eagle:test", None)
            head.observe(features)
            return head

        for kind in ("layers", "eagle"):
            plain = fresh(kind).propose(tokens, 4, Sampler())
            caught = fresh(kind)
            assert caught.ingest(tokens) == len(tokens) - (2 if kind == "eagle" else 1)
            assert caught.ingest(tokens) == 0
            assert caught.propose(tokens, 4, Sampler()).tokens == plain.tokens, kind


def test_gamma_is_chosen_per_batch_size():
    """Verification of a batch of 8 costs in proportion to the tokens fed (no spare compute), of one row next to
    nothing more than a plain step: with the same acceptance, γ is 0 at 8 rows and high at 1, from one controller; a
    batch size met for the first time takes one plain step and then borrows the nearest one's cost shape."""
    controller = GammaController(start=4, max_num_draft_tokens=16)

    def cost(rows: int, fed: int) -> float:
        return 0.060 if rows == 1 else 0.010 * fed

    for step in range(120):
        rows = 1 if step % 2 else 8
        gammas = controller.next_step(rows)
        accepted = [min(gamma, 2) for gamma in gammas]  # 2 of every draft accepted
        controller.update(gammas, accepted, 0.0005 * max(gammas), cost(rows, rows + sum(gammas)), asked=gammas)
    assert controller.next_step(1)[0] >= 3
    assert controller.next_step(8)[0] == 0
    assert controller.next_step(4)[0] == 0  # never measured: one plain step first
    controller.update([0] * 4, [0] * 4, 0.0, 0.040)
    assert controller.next_step(4)[0] == 0  # the shape of 8 (the nearest by ratio that drafted): drafting does not pay
    assert controller.verify_seconds(3, 4) == pytest.approx(0.040 * 3)


def test_the_controller_drafts_at_batch_one_where_a_batch_of_eight_does_not(monkeypatch):
    """End to end: the same prompt decoded alone and as 8 rows, through one controller, on a fake clock where a
    verification pass costs 20 ms + 10 ms per token fed past the first and 50 ms per token past 8 (a machine whose
    spare compute a batch of 8 uses up), drafting with the target itself (every token accepted): the batch of 8
    decodes mostly plain steps, the batch of 1 drafts. Steps are ragged (:mod:`specdraft_eval.engine.ragged`): a
    pass costs by the tokens the rows fed."""
    from support import tiny_llama

    from specdraft_eval import autoregressive_generate_batch, speculative_generate_batch
    from specdraft_eval.drafts.model import ModelDrafter
    from specdraft_eval.engine import loop as engine

    now = [0.0]

    def fake_clock(device):
        return now[0]

    real_verify = engine.verify_step

    def costed(target, cache, tokens, proposals, samplers):
        fed = sum(1 + len(p.tokens) for p in proposals)
        now[0] += 0.020 + 0.010 * (fed - 1) + 0.050 * max(fed - 8, 0)
        return real_verify(target, cache, tokens, proposals, samplers)

    monkeypatch.setattr(engine, "clock", fake_clock)
    monkeypatch.setattr(engine, "verify_step", costed)
    target = tiny_llama(seed=0)
    prompt = [3, 4, 5, 6, 7]
    itself = ModelDrafter(tiny_llama(seed=0), "itself", target.config.vocab_size)
    controller = GammaController.around(4)
    plain, _ = autoregressive_generate_batch(target, [prompt], 24)
    for _ in range(3):
        alone, one = speculative_generate_batch(target, itself, [prompt], 24,
                                                gamma_controller=controller)
        eight, many = speculative_generate_batch(target, itself, [prompt] * 8, 24,
                                                 gamma_controller=controller)
    assert alone == plain[0:1] and eight == plain * 8
    assert one.draft_tokens / one.steps > 1  # drafts at batch 1
    assert many.draft_tokens / many.steps < 0.2  # mostly plain steps at batch 8


def test_probes_in_a_batch_draft_one_row_cost_a_fraction_and_back_off_even_when_accepted():
    """A batch of 16 whose verification has no spare compute (every token fed costs 6.25 ms, a plain step 100 ms):
    probes are accepted (the draft is good) but drafting still costs more than it gives. Only the first row drafts
    a probe, the first step's included, so all probes together cost under PROBE_SHARE of the run, every row drafting
    never happens, and the wait doubles all the same (issue 51: probes of every row every 16 steps at batch 16, and
    a first step that verified all 16 rows' drafts)."""
    from specdraft_eval.engine.gamma import PROBE_SHARE

    controller = GammaController(start=2, max_num_draft_tokens=8, probe_every=4, max_probe_every=256)
    seconds, extra, probes = 0.0, 0.0, []
    for step in range(400):
        gammas = controller.next_step(16, prober=step % 16)
        cost, drafting = 0.00625 * (16 + sum(gammas)), 0.030 * max(gammas)  # a head catching up and drafting
        seconds, extra = seconds + cost + drafting, extra + cost - 0.100 + drafting
        if any(gammas):
            probes.append((step, gammas, cost - 0.100 + drafting))
        controller.update(gammas, gammas, drafting, cost, asked=gammas)  # all accepted
    assert probes and all(gammas[step % 16] and sum(map(bool, gammas)) == 1 for step, gammas, _ in probes)
    assert probes[0][1][0] == 1  # the first step: γ 1 (not start: in a batch), one row (the row the loop names)
    assert extra <= PROBE_SHARE * seconds and controller.probe_every > 4
    # every probe waited plain steps enough to cost under PROBE_SHARE of them: its drafting counts too (with
    # verification alone, the second probe came after 8 steps, 4.5%)
    for (before, _, _), (step, _, spent) in zip(probes, probes[1:]):
        assert spent <= PROBE_SHARE * 0.100 * (step - before - 1), probes


def _sometimes_drafting(cost, steps: int = 200) -> list[int]:
    """A batch of 4 whose draft has tokens for one row a step (prompt lookup finding a match in one prompt of four),
    every one of them accepted; verification costs ``cost(tokens fed)``. Returns each step's γ."""
    controller = GammaController(start=4, max_num_draft_tokens=16)
    chosen = []
    for step in range(steps):
        asked = controller.next_step(4)
        chosen.append(max(asked))
        drafted = [gamma if row == step % 4 else 0 for row, gamma in enumerate(asked)]
        controller.update(drafted, drafted, 0.002 * max(asked), cost(4 + sum(drafted)), asked=asked)
    return chosen


def test_a_steps_acceptance_weighs_the_same_whichever_row_drafted():
    """Acceptance decays once a step: a probe's tokens drafted and accepted in row 0 of 16 count as they do in row
    15 or in a batch of one. (Decayed once a row, the 15 plain rows after row 0 left 0.9^15 of its evidence, so
    which row probed changed the γ chosen.)"""
    seen = []
    for rows, prober in ((1, 0), (16, 0), (16, 15)):
        controller = GammaController(start=4, max_num_draft_tokens=16)
        for accepted in (4, 1, 3):
            drafted = [4 if row == prober else 0 for row in range(rows)]
            kept = [accepted if row == prober else 0 for row in range(rows)]
            controller.update(drafted, kept, 0.001, 0.050, asked=drafted)
        seen.append([round(controller.acceptance(position), 12) for position in (1, 2, 3, 4)])
    assert seen[0] == seen[1] == seen[2], seen
    assert seen[0][0] > seen[0][3]  # and the evidence is there: position 4 was accepted once in three


def test_rows_the_draft_had_nothing_for_count_as_misses():
    """Verification costs 10 ms a token fed and drafting 2 ms a position: a drafted token costs more than the plain
    step that would emit it, so drafting loses even though every drafted token is accepted, because three rows of
    four have nothing to draft. Counted only over the rows that drafted, acceptance would be 1 and the controller
    would draft every step; it must decode mostly plain. The control: where verification is nearly flat, the same
    draft pays and it drafts."""
    losing = _sometimes_drafting(lambda fed: 0.010 * fed)
    assert sum(1 for gamma in losing[20:] if gamma) <= 0.1 * len(losing[20:])
    paying = _sometimes_drafting(lambda fed: 0.040 + 0.0002 * fed)
    assert sum(1 for gamma in paying[20:] if gamma) >= 0.9 * len(paying[20:])
