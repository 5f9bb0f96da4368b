"""Which lm-eval group a run's task belongs to: a group of subtasks the run holds whole (MMLU's 57) is one task for
the record and for ``draft=auto``."""

from __future__ import annotations

from collections import defaultdict
from functools import lru_cache


@lru_cache(maxsize=1)
def _children() -> dict[str, tuple[str, ...]]:
    """Each group and tag of lm-eval's own task index -> what it lists (tasks, tags, groups)."""
    from lm_eval.tasks import TaskManager

    children: dict[str, list[str]] = defaultdict(list)
    for name, entry in TaskManager().task_index.items():
        kind = getattr(entry.kind, "name", "")
        listed = (entry.cfg or {}).get("task") if kind == "GROUP" else None
        for child in listed if isinstance(listed, list) else []:
            child_name = child.get("task") if isinstance(child, dict) else child
            if isinstance(child_name, str) and child_name != name:
                children[name].append(child_name)
        for tag in (getattr(entry, "tags", None) or ()) if kind == "TASK" else ():  # a task's tags list it
            if tag != name:
                children[tag].append(name)
    return {name: tuple(listed) for name, listed in children.items()}


def _leaves(name: str, children: dict[str, tuple[str, ...]], seen: frozenset = frozenset()) -> set[str]:
    if name not in children or name in seen:
        return {name}
    return set().union(*(_leaves(child, children, seen | {name}) for child in children[name]))


def groups_of(tasks: list[str]) -> dict[str, str]:
    """Each of ``tasks`` -> the largest group of lm-eval's index (through tags and nested groups) whose every task
    the run holds, or the task itself (a lone task, one of no such group, or one from an ``--include_path`` the
    index does not hold). A run of one task never reads the index."""
    if len(set(tasks)) < 2:
        return {task: task for task in tasks}
    children, held = _children(), set(tasks)
    parents: dict[str, list[str]] = defaultdict(list)
    for name, listed in children.items():
        for child in listed:
            parents[child].append(name)
    found = {}
    for task in tasks:
        group, climbing = task, True
        while climbing:
            climbing = False
            for parent in parents.get(group, []):
                if _leaves(parent, children) <= held:
                    group, climbing = parent, True
                    break
        found[task] = group
    return found
