"""Compare two lm_eval --log_samples outputs document by document: the generations must be equal.

Usage: python scripts/compare_samples.py DIR_A DIR_B  (folders lm_eval --output_path wrote; prints a JSON summary,
exit code 1 when any generation differs)."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def generations(folder: Path) -> dict[tuple[str, int], list]:
    """(task, doc_id) -> the responses, from every samples_*.jsonl under ``folder``."""
    found = {}
    for path in sorted(Path(folder).rglob("samples_*.jsonl")):
        task = path.name.removeprefix("samples_").rsplit("_", 1)[0]
        for line in path.read_text().splitlines():
            sample = json.loads(line)
            found[(task, sample["doc_id"])] = sample["resps"]
    return found


def main() -> int:
    first, second = (generations(Path(a)) for a in sys.argv[1:3])
    differing = sorted(k for k in first.keys() & second.keys() if first[k] != second[k])
    summary = {"documents": len(first.keys() & second.keys()), "only_in_one": len(first.keys() ^ second.keys()),
               "differing": [f"{task}/{doc}" for task, doc in differing]}
    print(json.dumps(summary, indent=2))
    return 1 if differing or summary["only_in_one"] or not summary["documents"] else 0


if __name__ == "__main__":
    sys.exit(main())
