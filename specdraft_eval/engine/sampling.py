"""Token choice shared by target and draft: greedy, or sampling with temperature/top-k/top-p.

Warping uses transformers' own logits warpers, applied identically on both sides, which is what makes
speculative sampling follow the target's warped distribution exactly.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import (
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from specdraft_eval.errors import SpecdecError


@dataclass(frozen=True)
class Sampler:
    """How to turn logits into a token. ``do_sample=False`` is greedy (argmax)."""

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    generator: torch.Generator | None = None

    def __post_init__(self) -> None:
        if self.do_sample and not self.temperature > 0:
            raise SpecdecError(f"temperature must be > 0 when sampling (got {self.temperature}); use do_sample=False "
                               "for greedy")
        if self.temperature < 0:
            raise SpecdecError(f"temperature must be >= 0 (got {self.temperature})")
        if not 0 < self.top_p <= 1:
            raise SpecdecError(f"top_p must be in (0, 1] (got {self.top_p})")
        if self.top_k < 0:
            raise SpecdecError(f"top_k must be >= 0 (got {self.top_k}); 0 disables it")

    @property
    def _warpers(self) -> LogitsProcessorList:
        warpers = LogitsProcessorList()
        if self.temperature != 1.0:
            warpers.append(TemperatureLogitsWarper(self.temperature))
        if self.top_k:
            warpers.append(TopKLogitsWarper(self.top_k))
        if self.top_p < 1.0:
            warpers.append(TopPLogitsWarper(self.top_p))
        return warpers

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """Warped probabilities for each row of ``logits`` ([n, vocab])."""
        return torch.softmax(self._warpers(None, logits.float()), dim=-1)

    def sample(self, probs: torch.Tensor) -> torch.Tensor:
        """One token id per row of ``probs``."""
        return torch.multinomial(probs, 1, generator=self.generator).squeeze(-1)


def stream_seed(seed: int, prompt: Sequence[int], repeat: int = 0) -> int:
    """The seed of one row's random stream: derived from the run's ``seed``, the request (its prompt's tokens) and
    which ``repeat`` of that request it is (lm-eval's ``repeats``: the second copy of a request draws other samples),
    so that it is the same at any batch size, in any order and on a rerun."""
    digest = hashlib.blake2b(f"{int(seed)}:{int(repeat)}:{','.join(map(str, prompt))}".encode(), digest_size=8)
    return int.from_bytes(digest.digest(), "little") & (2**63 - 1)


def make_generator(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator | None:
    """A seeded generator, or None to use torch's global RNG."""
    if seed is None:
        return None
    gen = torch.Generator(device=device)
    gen.manual_seed(int(seed))
    return gen
