"""What the zoo's measuring commands load: the target by name and each named draft for it."""

from __future__ import annotations

from specdraft_eval.drafts import Drafter, load_draft
from specdraft_eval.integration.recommend import resolve_draft
from specdraft_eval.models.targets import LoadSettings, Target


def load_one(target: Target, draft: str) -> Drafter:
    """``draft`` built for ``target`` (``auto`` resolved for it: :func:`resolve_draft`)."""
    return load_draft(resolve_draft(draft, target), target)


def load_drafts(target: Target, drafts: list[str]) -> list[Drafter]:
    """Each of ``drafts`` built for ``target`` (:func:`load_one`)."""
    return [load_one(target, name) for name in drafts]


def load_run(target_name: str, drafts: list[str], settings: LoadSettings) -> tuple[Target, list[Drafter]]:
    """The target loaded with ``settings`` and :func:`load_drafts` for it."""
    target = settings.load(target_name)
    return target, load_drafts(target, drafts)
