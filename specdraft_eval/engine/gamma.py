"""Dynamic γ: each step, draft the number of tokens the analytical model says is fastest for the batch it runs.

The controller keeps a run's own measurements — the draft's seconds per position asked for and the target's seconds
to verify a batch of B rows asked for n - 1 draft tokens per row on average, per batch size B, and for each draft
position i the chance c_i that its token is accepted once the ones before it were, all exponentially decayed — and
picks, for a batch of B rows,

    γ* = argmax_γ  E[tokens | γ] / (γ · t_draft(B) + t_verify(B, γ + 1)),   E[tokens | γ] = 1 + Σ_{i≤γ} Π_{j≤i} c_j

over 0..max (B cancels: every row is asked for γ). Position-wise rates capture bursty drafts (prompt lookup either
copies a run or misses at once), which a single per-token rate would not; a position never drafted yet takes the
last measured rate. A position asked for that the draft had no token for (prompt lookup without a match) counts as
rejected, and a step's verification is costed by the γ it asked for, whatever the rows supplied (with ragged steps,
:mod:`~specdraft_eval.engine.ragged`, rows that supply less cost less): both sides are what asking for γ yields. A
step where no row had a token to offer is costed as the plain step it was, so a probe of a row the draft cannot
serve yet (an EAGLE head before a one-token prompt's first pass) teaches nothing of verification, and the controller
probes again until a step that drafted is measured.

γ = 0 is a plain step, so where a batch's spare compute is gone (a CPU at batch 8, a GPU at hundreds of tokens per
step) the batch decodes at plain speed. A *probe* drafts to learn: the first step (γ = start; in a batch, 1), and
after ``probe_every`` plain steps one of γ = 1 (later where the probe's wider verification and its drafting cost
more: :data:`PROBE_SHARE`); each probe after which drafting still does not pay doubles the wait (up to
``max_probe_every``). In a batch one row drafts a probe, the one its draft has the least to catch up on
(:meth:`GammaController.next_step`): ragged steps verify its extra tokens alone, its draft catches up alone, and
t_verify(B, 1 + γ / B) extrapolates to every row drafting (linearly in the tokens fed, never below what was
measured), so a hopeless draft costs a batch a fraction of a percent. A draft's time includes its catching up after
plain steps (an EAGLE head reads the features it skipped), which is what switching back to drafting costs. A batch
size met after the first step takes one plain step (its t_verify(B, 1)), then borrows the cost shape t_verify(B', n)
/ t_verify(B', 1) of the nearest batch size that drafted, until its own are measured. One controller serves every
generation of a run (``speculative_generate(..., gamma_controller=...)``): what it learnt carries over, including to
the smaller batches rows leave behind. γ grows by at most 2 beyond the widest measured, so it only climbs while the
measurements say it pays.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

DECAY = 0.9
"""Weight of the past in each running estimate (about the last ten steps count)."""

PROBE_SHARE = 0.01
"""At most this share of plain decoding's time goes to probes: a probe that widens a batch's verification by a
fraction x of a plain step waits at least x / PROBE_SHARE plain steps (a CPU at batch 16: ~70)."""


class GammaController:
    """Chooses γ for the next step from the steps so far (see the module docstring)."""

    def __init__(self, start: int, max_num_draft_tokens: int, probe_every: int = 16,
                 max_probe_every: int = 256) -> None:
        self.start, self.max_num_draft_tokens = start, max_num_draft_tokens
        self.probe_every, self.min_probe_every, self.max_probe_every = probe_every, probe_every, max_probe_every
        self._reached: list[float] = []  # [i]: decayed count of rows that drafted position i+1 after accepting i
        self._kept: list[float] = []  # [i]: ... of those, rows that accepted position i+1 too
        self._draft: dict[int, tuple[float, float]] = {}  # rows -> decayed (seconds drafting, positions drafted)
        self._verify: dict[int, dict[float, float]] = {}  # rows -> tokens per row -> decayed mean seconds of a pass
        self._idle: dict[int, int] = {}  # rows -> plain steps at that batch size since its last drafted one

    @classmethod
    def around(cls, num_draft_tokens: int) -> "GammaController":
        """The controller dynamic γ uses: starts at ``num_draft_tokens``, chooses from 0..4×``num_draft_tokens``."""
        return cls(num_draft_tokens, 4 * num_draft_tokens)

    def next_step(self, rows: int, prober: int = 0) -> list[int]:
        """Each row's γ for the next step of ``rows`` rows: the chosen γ for every row, or, where a batch probes,
        for row ``prober`` alone (the others take a plain step; the loop names the row its draft has the least to
        catch up on)."""
        gamma, probe = self._choice(rows)
        if probe and rows > 1:
            return [gamma if row == prober else 0 for row in range(rows)]
        return [gamma] * rows

    def acceptance(self, position: int) -> float:
        """c_position: the chance that draft token ``position`` (1-based) is accepted given the earlier ones were."""
        index = min(position, len(self._reached)) - 1
        if index < 0:
            return 0.5
        return (self._kept[index] + 0.5) / (self._reached[index] + 1.0)

    def expected_tokens(self, gamma: int) -> float:
        """Tokens one row's step emits on average when drafting ``gamma`` (the target's own token included)."""
        total, chance = 1.0, 1.0
        for position in range(1, gamma + 1):
            chance *= self.acceptance(position)
            total += chance
        return total

    def update(self, drafted: int | Sequence[int], accepted: int | Sequence[int], draft_seconds: float,
               verify_seconds: float, asked: int | Sequence[int] | None = None) -> None:
        """Record one step: each row's drafted and accepted tokens (an int for a batch of one), the batch's drafting
        seconds and its verification pass's. ``asked``: each row's draft budget (default: what it drafted). A step is
        costed by the tokens asked per row on average (one where no row had a token to offer, as a plain step: it
        says nothing of verifying drafted ones), and a position asked for that the draft had no token for (prompt
        lookup without a match) counts as reached and rejected, so the model weighs what asking for γ tokens yields
        and costs."""
        drafted, accepted = _per_row(drafted), _per_row(accepted)
        asked = drafted if asked is None else _per_row(asked)
        rows, widest = len(drafted), max(asked)
        probed = widest > 0 and self._verify and self._idle.get(rows, 0) >= self._probe_wait(rows)
        # tokens asked per row, on average; a step that drafted nothing verified what a plain step does
        widths, n = self._verify.setdefault(rows, {}), 1 + sum(asked) / rows if max(drafted) else 1.0
        widths[n] = verify_seconds if n not in widths else DECAY * widths[n] + (1 - DECAY) * verify_seconds
        if not widest:
            self._idle[rows] = self._idle.get(rows, 0) + 1
            return
        self._reached = [DECAY * count for count in self._reached]  # once a step, however many rows it has
        self._kept = [DECAY * count for count in self._kept]
        for row_asked, row_drafted, row_accepted in zip(asked, drafted, accepted, strict=True):
            reached = min(row_accepted + 1, max(row_asked, row_drafted))  # positions 1..accepted+1 were reached
            while len(self._reached) < max(row_drafted, reached):
                self._reached.append(0.0)
                self._kept.append(0.0)
            for i in range(reached):
                self._reached[i] += 1
                self._kept[i] += i < row_accepted
        seconds, positions = self._draft.get(rows, (0.0, 0.0))
        self._draft[rows] = (DECAY * seconds + draft_seconds, DECAY * positions + widest)
        self._idle[rows] = 0
        if probed:  # a probe after backing off: the wait resets only if drafting now pays at this batch size
            pays = self._best(rows) > 0
            self.probe_every = self.min_probe_every if pays else min(2 * self.probe_every, self.max_probe_every)

    def _widths(self, rows: int) -> dict[float, float]:
        return self._verify.get(rows, {})

    def _shaped(self, rows: int) -> bool:
        """Whether a plain step and a drafted one were measured at ``rows`` rows."""
        widths = self._widths(rows)
        return 1 in widths and len(widths) >= 2

    @staticmethod
    def _nearest(rows: int, sizes) -> int | None:
        """The batch size of ``sizes`` nearest ``rows`` by ratio."""
        return min(sizes, key=lambda size: (abs(math.log(size / rows)), size), default=None)

    def _borrowed(self, rows: int) -> int | None:
        """Where ``rows`` rows have only their plain step measured: the nearest batch size that drafted, whose cost
        shape they borrow (None if none did, or if ``rows`` has its own)."""
        widths = self._widths(rows)
        if len(widths) < 2 and 1 in widths:
            return self._nearest(rows, [size for size in self._verify if self._shaped(size)])
        return None

    def verify_seconds(self, n: float, rows: int = 1) -> float:
        """Measured, interpolated or (optimistically) extrapolated seconds to verify ``n`` tokens in each of ``rows``
        rows; a batch size with only its plain step measured scales the nearest drafting batch size's shape."""
        widths, other = self._widths(rows), self._borrowed(rows)
        if other is not None:
            return widths[1] * _estimate(self._widths(other), n) / self._verify[other][1]
        return _estimate(widths, n)

    def draft_seconds(self, rows: int) -> float:
        """Seconds per drafted position for a batch of ``rows`` (the nearest measured batch size's if unmeasured)."""
        size = rows if rows in self._draft else self._nearest(rows, self._draft)
        if size is None:
            return 0.0
        seconds, positions = self._draft[size]
        return seconds / positions if positions else 0.0

    def _choice(self, rows: int) -> tuple[int, bool]:
        """γ for a step of ``rows`` rows, and whether it is a probe."""
        if not self._verify:  # the first step: a probe
            return self._first_probe(rows), True
        if 1 not in self._widths(rows):
            return 0, False  # measure a plain step of this batch size
        widths = self._widths(rows)
        if len(widths) < 2:
            other = self._borrowed(rows)
            if other is None:
                return self._first_probe(rows), True
            widths = self._widths(other)
        best = self._best(rows, math.ceil(max(widths) - 1))
        if best == 0 and self._idle.get(rows, 0) >= self._probe_wait(rows):
            return 1, True
        return best, False

    def _first_probe(self, rows: int) -> int:
        """γ of a batch size's first probe: ``start`` alone; in a batch, 1 for its one row (each token it adds widens
        the whole batch's step, and one is enough to tell whether every row drafting can pay: the model climbs
        from there by at most 2 a step)."""
        return self.start if rows == 1 else 1

    def _probe_wait(self, rows: int) -> int:
        """Plain steps at ``rows`` rows before a γ = 1 probe (one row's in a batch): ``probe_every``, or more where
        the probe (its wider verification and its drafting, catching up included) costs more than
        :data:`PROBE_SHARE` of that many plain steps (as measured at this batch size: a shape borrowed from another
        is a guess the probe tests)."""
        if not self._shaped(rows):
            return self.probe_every
        plain = self.verify_seconds(1, rows)
        extra = self.verify_seconds(1 + 1 / rows, rows) - plain + self.draft_seconds(rows)
        return max(self.probe_every, math.ceil(extra / plain / PROBE_SHARE))

    def _best(self, rows: int, largest: int | None = None) -> int:
        """The γ the model says is fastest for ``rows`` rows, up to 2 past the ``largest`` measured (default: this
        batch size's)."""
        if largest is None:
            largest = math.ceil(max(self._widths(rows), default=1) - 1)
        t_draft, widths, other = self.draft_seconds(rows), self._widths(rows), self._borrowed(rows)
        scale, shape = (widths[1] / self._verify[other][1], self._widths(other)) if other is not None else (1.0, widths)
        best, best_rate, tokens, chance = 0, 1.0 / self.verify_seconds(1, rows), 1.0, 1.0
        for gamma in range(1, min(self.max_num_draft_tokens, largest + 2) + 1):
            chance *= self.acceptance(gamma)
            tokens += chance  # expected_tokens(gamma)
            rate = tokens / (gamma * t_draft + scale * _estimate(shape, gamma + 1))
            if rate > best_rate:
                best, best_rate = gamma, rate
        return best


def _per_row(counts: int | Sequence[int]) -> list[int]:
    """Per-row counts (an int is a batch of one)."""
    return [counts] if isinstance(counts, int) else list(counts)


def _estimate(measured: dict[float, float], n: float) -> float:
    """Seconds for ``n`` tokens per row from ``measured`` ones: exact, interpolated, or extrapolated (flat below the
    smallest, linearly above the largest, never below it)."""
    if n in measured:
        return measured[n]
    sizes = sorted(measured)
    below, above = [s for s in sizes if s < n], [s for s in sizes if s > n]
    if below and above:
        lo, hi = below[-1], above[0]
        return measured[lo] + (measured[hi] - measured[lo]) * (n - lo) / (hi - lo)
    if above:
        return measured[above[0]]
    if len(sizes) >= 2:
        lo, hi = sizes[0], sizes[-1]
        return measured[hi] + max(measured[hi] - measured[lo], 0.0) / (hi - lo) * (n - hi)
    return measured[sizes[-1]]
