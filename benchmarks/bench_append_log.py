"""Benchmark: the append log's memory against its budget (`append_log_bytes`).

Runs `tests/support/appendlog_workload.py` (THREADS threads one after another, TURNS turns each, a
turn appends a ~SIZE-byte human message and a short answer and puts the checkpoint, into a
store that keeps nothing) once per budget, each in a fresh process, and prints what the log
held at most and how much the process's RSS grew. Budget 0 keeps nothing: its RSS growth is
the workload's own. Run: `python benchmarks/bench_append_log.py [--threads 200] [--turns 20]
[--size 10000]` (about 20 s).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

MiB = 1 << 20
BUDGETS = [("0 (off)", 0), ("2 MiB", 2 * MiB), ("16 MiB", 16 * MiB),
           ("64 MiB (default)", 64 * MiB), ("unbounded", 1 << 40)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=200)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--size", type=int, default=10_000)
    args = parser.parse_args()
    root = Path(__file__).resolve().parent.parent
    print(f"{args.threads} threads x {args.turns} turns, ~{args.size} B a message")
    print(f"{'budget':<18} {'held at most':>13} {'RSS growth':>11} {'puts/s':>8}")
    for label, budget in BUDGETS:
        out = subprocess.run(
            [sys.executable, "-m", "tests.support.appendlog_workload", str(budget), str(args.threads),
             str(args.turns), str(args.size)],
            cwd=root, capture_output=True, text=True, check=True,
        )
        got = json.loads(out.stdout)
        print(f"{label:<18} {got['held_max'] / MiB:>9.1f} MiB {got['rss_growth'] / MiB:>7.1f} MiB "
              f"{got['puts'] / got['seconds']:>8.0f}")


if __name__ == "__main__":
    main()
