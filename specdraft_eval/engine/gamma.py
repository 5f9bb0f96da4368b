"""Dynamic γ: each step, draft the number of tokens the analytical model says is fastest right now.

The controller keeps this generation's own measurements — the draft's seconds per token, the target's
seconds to verify n tokens, and for each draft position i the chance c_i that its token is accepted once
the ones before it were, all exponentially decayed — and picks

    γ* = argmax_γ  E[tokens | γ] / (γ · t_draft + t_verify(γ + 1)),   E[tokens | γ] = 1 + Σ_{i≤γ} Π_{j≤i} c_j

over 0..max. Position-wise rates capture bursty drafts (prompt lookup either copies a run or misses at once),
which a single per-token rate would not; a position never drafted yet takes the last measured rate.
γ = 0 is a plain autoregressive step, so a draft that does not pay is backed off; after ``probe_every`` such
steps one γ = 1 step re-measures α, and each probe that is rejected doubles the wait (up to
``max_probe_every``), so a hopeless draft costs a fraction of a percent. One controller may serve every
generation of a run (``speculative_generate(..., gamma_controller=...)``): what it learnt about the draft
carries over instead of being paid for again at the start of each request. Unmeasured verify sizes are
estimated from the measured ones (optimistically, so larger γ gets tried), and γ grows by at most 2 beyond the largest
size measured, so it only climbs while the measurements say it pays.
"""

from __future__ import annotations

DECAY = 0.9
"""Weight of the past in each running estimate (about the last ten steps count)."""


class GammaController:
    """Chooses γ for the next step from the steps so far (see the module docstring)."""

    def __init__(self, start: int, max_gamma: int, probe_every: int = 16, max_probe_every: int = 256) -> None:
        self.start, self.max_gamma = start, max_gamma
        self.probe_every, self.min_probe_every, self.max_probe_every = probe_every, probe_every, max_probe_every
        self._reached: list[float] = []  # [i]: decayed count of steps that drafted position i+1 after accepting i
        self._kept: list[float] = []  # [i]: ... of those, steps that accepted position i+1 too
        self._draft_seconds, self._drafted = 0.0, 0.0
        self._verify: dict[int, float] = {}  # tokens verified -> decayed mean seconds
        self._idle = 0  # autoregressive steps since the last drafted one
        self.gamma = start

    @classmethod
    def around(cls, num_draft_tokens: int) -> "GammaController":
        """The controller dynamic γ uses: starts at ``num_draft_tokens``, chooses from 0..4×``num_draft_tokens``."""
        return cls(num_draft_tokens, 4 * num_draft_tokens)

    def acceptance(self, position: int) -> float:
        """c_position: the chance that draft token ``position`` (1-based) is accepted given the earlier ones were."""
        index = min(position, len(self._reached)) - 1
        if index < 0:
            return 0.5
        return (self._kept[index] + 0.5) / (self._reached[index] + 1.0)

    def expected_tokens(self, gamma: int) -> float:
        """Tokens one step emits on average when drafting ``gamma`` (the target's own token included)."""
        total, chance = 1.0, 1.0
        for position in range(1, gamma + 1):
            chance *= self.acceptance(position)
            total += chance
        return total

    def update(self, drafted: int, accepted: int, draft_seconds: float, verify_seconds: float) -> None:
        """Record a step that verified ``drafted`` draft tokens, ``accepted`` of them accepted."""
        n = drafted + 1
        old = self._verify.get(n)
        self._verify[n] = verify_seconds if old is None else DECAY * old + (1 - DECAY) * verify_seconds
        if drafted:
            while len(self._reached) < drafted:
                self._reached.append(0.0)
                self._kept.append(0.0)
            for i in range(len(self._reached)):
                self._reached[i] *= DECAY
                self._kept[i] *= DECAY
            for i in range(min(accepted + 1, drafted)):  # positions 1..accepted+1 were reached
                self._reached[i] += 1
                self._kept[i] += i < accepted
            self._draft_seconds = DECAY * self._draft_seconds + draft_seconds
            self._drafted = DECAY * self._drafted + drafted
            if self._idle >= self.probe_every:  # this step was a probe after backing off
                self.probe_every = (self.min_probe_every if accepted
                                    else min(2 * self.probe_every, self.max_probe_every))
            self._idle = 0
        else:
            self._idle += 1
        self.gamma = self._choose()

    def verify_seconds(self, n: int) -> float:
        """Measured, interpolated or (optimistically) extrapolated seconds to verify ``n`` tokens."""
        if n in self._verify:
            return self._verify[n]
        sizes = sorted(self._verify)
        below, above = [s for s in sizes if s < n], [s for s in sizes if s > n]
        if below and above:
            lo, hi = below[-1], above[0]
            return self._verify[lo] + (self._verify[hi] - self._verify[lo]) * (n - lo) / (hi - lo)
        if above:
            return self._verify[above[0]]
        if len(sizes) >= 2:
            lo, hi = sizes[0], sizes[-1]
            return self._verify[hi] + (self._verify[hi] - self._verify[lo]) / (hi - lo) * (n - hi)
        return self._verify[sizes[-1]]

    def _choose(self) -> int:
        if 1 not in self._verify:
            return 0  # measure an autoregressive step first
        largest = max(self._verify) - 1
        if largest < 1:
            return self.start
        t_draft = self._draft_seconds / self._drafted if self._drafted else 0.0
        best, best_rate = 0, 1.0 / self.verify_seconds(1)
        for gamma in range(1, min(self.max_gamma, largest + 2) + 1):
            rate = self.expected_tokens(gamma) / (gamma * t_draft + self.verify_seconds(gamma + 1))
            if rate > best_rate:
                best, best_rate = gamma, rate
        if best == 0 and self._idle >= self.probe_every:
            return 1
        return best
