"""The founding paper's published latency figures beside the latency model's predictions (``zoo rank``).

"Decoding Speculative Decoding" (Yan, Agarwal, Venkataraman, NAACL 2025) ran its targets on four 80 GB A100s and
its drafts on one. The figures here are those its text states as numbers, as the summary this project works from
(``../shared/seed/``) quotes them with their section; each is predicted from the catalog's shapes with the GPU,
runtime, context and target sharding ``zoo rank`` was given, and the deviation printed. The per-step milliseconds
of its Table 11 are not among them: the summary names the table without its numbers (:data:`NOT_AVAILABLE`).
"""

from __future__ import annotations

from dataclasses import dataclass

from specdraft_eval.models.structure import ModelShape
from zoo.measure import latency_model, shapes
from zoo.measure.latency_model import Accelerator

TARGETS = ("llama-65b", "llama-2-70b", "opt-66b", "vicuna-33b")
"""Catalog names of the paper's large targets: ``zoo rank`` prints the comparison for them."""

NOT_AVAILABLE = ("the paper's Table 11 (each draft's autoregressive step time, ms) is not in the sources this "
                 "package was built from; the figures above are the ones its text states")


@dataclass(frozen=True)
class Figure:
    """One published figure: what it says, where, its value, and the catalog drafts it compares.

    ``kind``: ``reduction`` (1 - t(first) / t(second)), ``ratio`` (t(first) / t(second)) or ``target_share``
    (the target's share of a decoding cycle with the first draft: t_verify / (γ t_draft + t_verify), at least
    ``value``)."""

    claim: str
    source: str
    kind: str
    value: float
    drafts: tuple[str, ...]


FIGURES = (
    Figure("latency of the wide 1.3B draft (5 layers) against the deep one (Sheared-LLaMA-1.3B, 24 layers): 49% lower",
           "§4.1, Table 3", "reduction", 0.49, ("wide-sheared-llama-1.3b", "sheared-llama-1.3b")),
    Figure("TinyLlama-1.1B (22 layers) against NoFT-Wide-796M (5 layers): 4x the latency",
           "§4.2, Table 8", "ratio", 4.0, ("tinyllama-1.1b-chat", "wide-sheared-llama-796m")),
    Figure("with a five-layer draft the target takes over 80% of each decoding cycle",
           "§4.1", "target_share", 0.80, ("wide-sheared-llama-796m",)),
)


@dataclass(frozen=True)
class Comparison:
    """A published figure and the prediction for it, as ``zoo rank`` prints them."""

    claim: str
    source: str
    published: str
    predicted: str
    deviation: str


def compare(target: ModelShape, gpu: Accelerator, runtime: str, context: int, gpus: int,
            gammas: list[int]) -> list[Comparison]:
    """Every :data:`FIGURES` entry predicted for ``target`` (sharded over ``gpus``) and drafts on one ``gpu``; a
    target-share figure at each of ``gammas``."""

    def ms(shape: ModelShape, tokens: int = 1, devices: int = 1) -> float:
        return latency_model.forward_seconds(shape, tokens, gpu, runtime, context, devices) * 1000

    rows = []
    for figure in FIGURES:
        t = [ms(shapes.model_shape(name).shape) for name in figure.drafts]
        if figure.kind == "target_share":
            verify = {g: ms(target, g + 1, gpus) for g in gammas}
            share = {g: v / (g * t[0] + v) for g, v in verify.items()}
            holds = [g for g, s in share.items() if s > figure.value]  # shares fall as γ grows
            predicted = "  ".join(f"γ{g}: {s:.0%}" for g, s in share.items())
            deviation = ("does not hold at any γ ranked" if not holds else "holds at every γ ranked"
                         if len(holds) == len(share) else f"holds at γ ≤ {max(holds)}")
            rows.append(Comparison(figure.claim, figure.source, f"> {figure.value:.0%}", predicted, deviation))
            continue
        value = 1 - t[0] / t[1] if figure.kind == "reduction" else t[0] / t[1]
        shown = (lambda v: f"{v:.0%}") if figure.kind == "reduction" else (lambda v: f"{v:.2f}x")
        rows.append(Comparison(figure.claim, figure.source, shown(figure.value),
                               f"{shown(value)} ({t[0]:.2f} / {t[1]:.2f} ms)", f"{value / figure.value - 1:+.0%}"))
    return rows
