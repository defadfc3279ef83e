"""Benchmark: the instructions replication adds to the graph's process, counted, not timed.

`bench_replicated.py` prints the graph process's CPU seconds per turn, with and without
replication. On a small shared machine those seconds move with whatever else runs: the
replicator process and the replica's servers, busy on the other core, slow the graph's own
thread down too (its `bare+neighbour` variant shows a process that only burns CPU doing as
much). This benchmark counts instead: valgrind's callgrind counts the instructions every
thread of the graph's process executes (the replicator process is not followed), the same
whatever the machine is doing, and so what replication costs where cores are free.

The workload is `bench_replicated.py`'s (its agent, a PostgreSQL primary, a Redis and a
SQLite replica, `ainvoke` one turn after another), run twice per variant under callgrind:
once with one thread of `--turns` turns, once with `--threads` such threads. The difference
of the two counts, over the turns between them, is the instructions per turn with start-up,
imports, the final flush and closing taken out. Variants: `bare` (the PostgresCheckpointer
alone), `async-proc` (`ReplicatedCheckpointer(..., "async")` with the replicas given as URLs,
applied by the replicator process) and, with `--variants`, `async` (the replicas as objects,
applied by threads of the graph's process: counted here).

Under callgrind a process runs about 50 times slower, so the wrappers' `linger` (how long a
write waits for others to go down the pipe, or to a replica, with it) is `--linger` (default
0.4 s) instead of 0.01 s: batches as large as in a native run, where a turn takes ~12 ms.

Run: `python benchmarks/bench_replicated_instructions.py [--variants bare async-proc async]
[--turns 10] [--threads 4] [--linger 0.4] [--json PATH] [--dsn URL] [--redis-url URL]`
(needs `valgrind`; about ten minutes for two variants on two cores: the runs go two at a time).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import os
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import callgrind
import jsonout
from bench_backends import build_graph, question
from bench_replicated import CPU_TARGET, open_variant
from places import drop, server_options

from langgraph_ckpt_ext import ReplicatedCheckpointer

CHOICES = ("bare", "async-proc", "async")


async def work(variant: str, threads: int, args: argparse.Namespace) -> None:
    """The workload counted: `threads` threads of `args.turns` turns, on fresh storage (a
    PostgreSQL schema, a Redis key prefix, a temp SQLite file; removed afterwards)."""
    place = f"lgxinstr_{uuid.uuid4().hex[:10]}"
    tmp = tempfile.TemporaryDirectory(prefix="lgxinstr_")
    opened: list[Any] = []
    wrapper: ReplicatedCheckpointer | None = None
    try:
        saver = await open_variant(variant, args, place, Path(tmp.name), opened, readers=False)
        if isinstance(saver, ReplicatedCheckpointer):
            wrapper = saver
        graph = build_graph(saver)
        for t in range(threads):
            for k in range(args.turns):
                human = question(t, k)
                await graph.ainvoke({"messages": [human]},
                                    {"configurable": {"thread_id": f"thread-{t}"}})
        if wrapper is not None:
            if not await wrapper.aflush(timeout=600):
                raise SystemExit(f"[{variant}] the replicas did not catch up within 600 s")
            await wrapper.aclose()
    finally:
        for s in reversed(opened):
            await s.aclose()
        await drop("postgres", place, args)
        await drop("redis", place, args)
        tmp.cleanup()


def count(variant: str, threads: int, args: argparse.Namespace) -> int:
    """Instructions of one run of the workload under callgrind (every thread of the graph's
    process)."""
    return callgrind.instructions(
        [sys.executable, __file__, "--worker", variant, str(threads), "--turns", str(args.turns),
         "--linger", str(args.linger), "--dsn", args.dsn, "--redis-url", args.redis_url],
        f"{variant} x{threads}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    server_options(p)
    p.add_argument("--variants", nargs="+", default=["bare", "async-proc"], choices=CHOICES,
                   help="the variants to count (bare always runs)")
    p.add_argument("--turns", type=int, default=10, help="turns per thread")
    p.add_argument("--threads", type=int, default=4,
                   help="threads of the longer run (the shorter has one)")
    p.add_argument("--linger", type=float, default=0.4)
    p.add_argument("--json", type=Path, help="also write every figure to this JSON file")
    p.add_argument("--worker", nargs=2, metavar=("VARIANT", "THREADS"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        asyncio.run(work(args.worker[0], int(args.worker[1]), args))
        return
    callgrind.require_valgrind()
    if args.threads < 2:
        raise SystemExit("--threads must be at least 2: the per-turn figure is a difference")
    variants = [v for v in CHOICES if v in args.variants or v == "bare"]
    runs = [(v, n) for v in variants for n in (1, args.threads)]
    with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 2) as pool:
        counted = dict(zip(runs, pool.map(lambda r: count(r[0], r[1], args), runs), strict=True))
    turns = (args.threads - 1) * args.turns
    per_turn = {v: (counted[v, args.threads] - counted[v, 1]) / turns for v in variants}
    print(f"\nInstructions per turn of the graph's process (callgrind, every thread of it; the "
          f"replicator process not counted): {args.threads} x {args.turns} turns less "
          f"1 x {args.turns}, linger {args.linger:g} s")
    print(f"{'variant':<11} {'instr/turn':>11} {'x bare':>7}")
    for v in variants:
        x = per_turn[v] / per_turn["bare"]
        verdict = "" if v == "bare" else (
            f"  ({'within' if x <= CPU_TARGET else 'over'} target <= {CPU_TARGET:.2f}x)")
        print(f"{v:<11} {per_turn[v] / 1e6:>9.2f} M {x:>7.3f}{verdict}")
    if args.json:
        jsonout.write(args.json, {
            **jsonout.header("replicated_instructions"),
            "args": {k: v for k, v in vars(args).items()
                     if k not in ("json", "dsn", "redis_url", "worker")},
            "instructions": {f"{v} x{n}": c for (v, n), c in counted.items()},
            "per_turn": per_turn,
            "x_bare": {v: per_turn[v] / per_turn["bare"] for v in variants},
        })


if __name__ == "__main__":
    main()
