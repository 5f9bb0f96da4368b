"""Old against new leaderboard figures for the configurations both boards hold (one hardware section of each):
`python scripts/board_changes.py OLD_REV [--hardware TEXT]` reads leaderboard/leaderboard.csv at OLD_REV (git) and
in the working tree. Prints a markdown table: speedup, TAR and tokens counted, old and new."""

from __future__ import annotations

import argparse
import csv
import io
import subprocess
from pathlib import Path

KEY = ("draft", "task", "gamma", "dynamic_gamma")


def rows(text: str, hardware: str) -> dict[tuple, dict]:
    return {tuple(r[k] for k in KEY): r for r in csv.DictReader(io.StringIO(text)) if hardware in r["hardware"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("old_rev")
    parser.add_argument("--hardware", default="Intel(R) Xeon(R) Processor")
    args = parser.parse_args()
    old_text = subprocess.run(["git", "show", f"{args.old_rev}:leaderboard/leaderboard.csv"], check=True,
                              capture_output=True, text=True).stdout
    old, new = rows(old_text, args.hardware), rows(Path("leaderboard/leaderboard.csv").read_text(), args.hardware)
    print("| draft | task | γ | dynamic γ | speedup old → new | TAR old → new | tokens/s old → new |")
    print("|---|---|---|---|---|---|---|")
    for key in sorted(set(old) & set(new)):
        o, n = old[key], new[key]
        print(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {float(o['speedup']):.3f} → {float(n['speedup']):.3f} "
              f"| {float(o['tar']):.2f} → {float(n['tar']):.2f} | {float(o['tokens_per_second']):.1f} → "
              f"{float(n['tokens_per_second']):.1f} |")
    print(f"\nonly old: {len(set(old) - set(new))} rows; only new: {len(set(new) - set(old))} rows")


if __name__ == "__main__":
    main()
