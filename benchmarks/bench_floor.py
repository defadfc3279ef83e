"""Benchmark: every backend against LangGraph's own floor, in one run.

The floor of any checkpointer is LangGraph's own work per step: the agent workload of
`bench_backends.py` (agent -> tool -> agent per turn, `ainvoke`) on LangGraph's `InMemorySaver`
with `durability="exit"` (one save per run). Every other line stores every checkpoint
(`durability="async"`, LangGraph's default):

  floor            InMemorySaver, durability="exit"
  official-memory  InMemorySaver
  ours-memory      InMemoryCheckpointer
  ours-sqlite      SQLiteCheckpointer, synchronous=FULL (the durable default)
  ours-sqlite-inline  the same with inline_commits=True (light writes committed on the
                   event loop's thread while the disk is quick)
  official-sqlite  AsyncSqliteSaver (SQLite's default, synchronous=FULL)
  ours-postgres    PostgresCheckpointer over loopback (--dsn)
  ours-redis       RedisCheckpointer (--redis-url)
  bound-sqlite, bound-sqlite-thread, bound-postgres, bound-redis (named in --lines)
                   the least any durable checkpointer can cost on that store
                   (`floor_bounds.py`): InMemorySaver plus one statement with its commit
                   per call, nothing more; not a checkpointer, a line under which none goes
  bound-none-free, bound-sqlite-free, bound-postgres-free, bound-redis-free
                   the same without serialization (references held, only keys stored):
                   LangGraph's calls alone, then with one commit per call

Each round runs every line once, in an order rotated per round, on a fresh store: THREADS
threads x TURNS turns, at concurrency 1 (threads one after another) and 16 (up to 16 turns of
different threads in flight). Printed per line: turns/s and client CPU per turn
(`time.process_time`: every thread of this process, the drivers' included), medians over the
rounds, and their ratios to the floor of the same rounds. Goals (issue 25): durable SQLite at
>= 0.8 of the floor's turns/s and <= 1.3x its CPU per turn; PostgreSQL >= 0.6; Redis >= 0.7;
concurrency 16 scaling at least as the floor does.

Every line's final states are compared with the floor's (`aget_state`): a difference fails the
run. `--profile LINE` then runs that line once more under cProfile and prints where its turns
go (the event loop's thread), by the package each function lives in, and the top functions.

`--instructions` counts instead of timing: valgrind's callgrind counts the instructions every
thread of the process executes (the kernel's work, fsync included, is not counted), for a run
of one thread and one of three threads of 15 turns per line; the difference over the 30 turns
between them is the instructions per turn, start-up and imports taken out. The counts do not
move with the machine's load (about 1% from run to run), so they show small changes that the
timings' noise hides; the CPU seconds add what the kernel does and what caches and thread
switches cost.

Run: `python benchmarks/bench_floor.py [--rounds 5] [--threads 20] [--turns 30]
[--lines floor,ours-sqlite,...] [--profile ours-sqlite] [--instructions] [--json PATH]`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import gc
import pstats
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import callgrind
import floor_bounds
from bench_backends import build_graph, normalize, question, thread_config
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from places import drop, open_saver, server_options

from langgraph_ckpt_ext import InMemoryCheckpointer

LINES = ("floor", "official-memory", "ours-memory", "ours-sqlite", "ours-sqlite-inline",
         "official-sqlite", "ours-postgres", "ours-redis")
BOUNDS = ("bound-none-free", "bound-sqlite-free", "bound-sqlite", "bound-sqlite-thread",
          "bound-postgres-free", "bound-postgres", "bound-redis-free", "bound-redis")
"""Run when named in `--lines` (not by default)."""
GOALS = {"ours-sqlite": 0.8, "ours-postgres": 0.6, "ours-redis": 0.7}
CPU_GOAL = {"ours-sqlite": 1.3}


def goals_of(line: str) -> tuple[float | None, float | None]:
    """(turns/s goal, CPU goal) of `line`, as multiples of the floor; a bound is held to the
    goals of our line on its store (`bound-sqlite-thread` to `ours-sqlite`'s)."""
    if line.startswith("bound-"):
        store = line.removeprefix("bound-").removesuffix("-free").removesuffix("-thread")
        line = f"ours-{store}"
    return GOALS.get(line), CPU_GOAL.get(line)


@contextlib.asynccontextmanager
async def opened(line: str, args: argparse.Namespace, tmp: Path) -> AsyncIterator[Any]:
    """A fresh store for `line`, removed afterwards."""
    place = f"lgxfloor_{uuid.uuid4().hex[:10]}"
    if line in ("floor", "official-memory"):
        yield InMemorySaver()
    elif line == "ours-memory":
        yield InMemoryCheckpointer()
    elif line.startswith("bound-"):
        kind = line.removeprefix("bound-").removesuffix("-free")
        sink = await floor_bounds.open_sink(kind, path=tmp / f"{place}.db", dsn=args.dsn,
                                            redis_url=args.redis_url, place=place)
        try:
            yield floor_bounds.BoundSaver(sink.sink, free=line.endswith("-free"))
        finally:
            await sink.close()
    elif line == "official-sqlite":
        async with AsyncSqliteSaver.from_conn_string(str(tmp / f"{place}.db")) as saver:
            yield saver
    else:
        backend = line.removeprefix("ours-").removesuffix("-inline")
        saver = open_saver(backend, str(tmp / f"{place}.db") if backend == "sqlite" else place,
                           args, **({"inline_commits": True} if line.endswith("-inline") else {}))
        try:
            await saver.asetup()
            yield saver
        finally:
            await saver.aclose()
            if backend in ("postgres", "redis"):
                await drop(backend, place, args)


async def run_line(line: str, args: argparse.Namespace, tmp: Path, concurrency: int,
                   hook: Callable[[], contextlib.AbstractContextManager[Any]] | None = None
                   ) -> tuple[float, float, dict[str, Any]]:
    """(seconds, CPU seconds, final states) of THREADS x TURNS turns on a fresh store."""
    durability = "exit" if line == "floor" else "async"
    tids = [f"thread-{i}" for i in range(args.threads)]
    gc.collect()
    async with opened(line, args, tmp) as saver:
        graph = build_graph(saver)
        gate = asyncio.Semaphore(concurrency)

        async def thread(tid: str) -> None:
            for k in range(args.turns):
                async with gate:
                    await graph.ainvoke({"messages": [question(tid, k)]}, thread_config(tid),
                                        durability=durability)

        with hook() if hook is not None else contextlib.nullcontext():
            t0, c0 = time.perf_counter(), time.process_time()
            if concurrency == 1:
                for tid in tids:
                    await thread(tid)
            else:
                await asyncio.gather(*(thread(t) for t in tids))
            seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
        states = {t: normalize((await graph.aget_state(thread_config(t))).values) for t in tids}
    return seconds, cpu, states


async def run(args: argparse.Namespace) -> dict[str, Any]:
    lines = list(args.lines)
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="lgxfloor_") as name:
        tmp = Path(name)
        for concurrency in args.concurrency:
            per: dict[str, list[tuple[float, float]]] = {line: [] for line in lines}
            for r in range(args.rounds + 1):  # round 0 warms every line up, not counted
                order = lines[r % len(lines):] + lines[:r % len(lines)]
                states: dict[str, dict[str, Any]] = {}
                for line in order:
                    seconds, cpu, states[line] = await run_line(line, args, tmp, concurrency)
                    if r:
                        per[line].append((seconds, cpu))
                for line in lines:
                    if states[line] != states[lines[0]]:
                        raise SystemExit(f"{line}: the states restored differ from "
                                         f"{lines[0]}'s (concurrency {concurrency})")
            turns = args.threads * args.turns
            out[str(concurrency)] = rows = {}
            for line in lines:
                rate = [turns / s for s, _ in per[line]]
                cpu = [1000 * c / turns for _, c in per[line]]
                rate_x = [turns / s / (turns / f) for (s, _), (f, _) in
                          zip(per[line], per[lines[0]], strict=True)]
                cpu_x = [c / f for (_, c), (_, f) in zip(per[line], per[lines[0]], strict=True)]
                rows[line] = {"turns_per_s": statistics.median(rate),
                              "cpu_ms": statistics.median(cpu),
                              "turns_x": statistics.median(rate_x),
                              "cpu_x": statistics.median(cpu_x),
                              "turns_x_range": [min(rate_x), max(rate_x)]}
        if args.profile:
            out["profile"] = await profile(args.profile, args, tmp)
    return out


async def profile(line: str, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """One run of `line` at concurrency 1 under cProfile: time by package, top functions."""
    prof = cProfile.Profile()

    @contextlib.contextmanager
    def on() -> Any:
        prof.enable()
        try:
            yield
        finally:
            prof.disable()

    await run_line(line, args, tmp, 1)  # warm
    await run_line(line, args, tmp, 1, on)
    stats = pstats.Stats(prof)
    turns = args.threads * args.turns
    by_part: dict[str, float] = {}
    for (file, _, fn), (_, _, own, _, _) in stats.stats.items():  # type: ignore[attr-defined]
        by_part[part(file, fn)] = by_part.get(part(file, fn), 0.0) + own
    top = sorted(((own, f"{part(file, fn)}:{fn}") for (file, _, fn), (_, _, own, _, _)
                  in stats.stats.items() if part(file, fn) != WAITING),
                 reverse=True)[:20]  # type: ignore[attr-defined]
    # Ours by cumulative time (a coroutine's is counted from each resumption: read it as
    # "the time under it", not as calls).
    under = sorted(((cum, f"{Path(file).name}:{fn}") for (file, _, fn), (_, _, _, cum, _)
                    in stats.stats.items() if part(file) == "ours"),
                   reverse=True)[:20]  # type: ignore[attr-defined]
    return {"line": line,
            "by_part_ms": {k: 1000 * v / turns for k, v in
                           sorted(by_part.items(), key=lambda kv: -kv[1])},
            "top_ms": [(name, 1000 * own / turns) for own, name in top],
            "ours_cumulative_ms": [(name, 1000 * cum / turns) for cum, name in under]}


WAITING = "waiting (the loop idle)"


def count_instructions(line: str, threads: int, args: argparse.Namespace) -> int:
    """Instructions of one run (`--work`) under callgrind, every thread of the process."""
    return callgrind.instructions(
        [sys.executable, __file__, "--work", line, str(threads), "--turns",
         str(args.count_turns), "--dsn", args.dsn, "--redis-url", args.redis_url],
        f"{line} x{threads}")


def instructions(args: argparse.Namespace) -> dict[str, float]:
    """Instructions per turn of each line: (3 threads - 1 thread) / their turns between."""
    import concurrent.futures

    callgrind.require_valgrind()
    with concurrent.futures.ThreadPoolExecutor(2) as pool:  # two runs at a time: two cores
        runs = {line: (pool.submit(count_instructions, line, 1, args),
                       pool.submit(count_instructions, line, 3, args)) for line in args.lines}
        return {line: (three.result() - one.result()) / (2 * args.count_turns)
                for line, (one, three) in runs.items()}


async def work(line: str, threads: int, args: argparse.Namespace) -> None:
    """The run `--instructions` counts: `threads` threads of `--turns` turns, one after
    another."""
    args.threads = threads
    with tempfile.TemporaryDirectory(prefix="lgxfloor_") as name:
        await run_line(line, args, Path(name), 1)


def part(file: str, fn: str = "") -> str:
    """Which package a profiled function lives in (waiting for I/O apart)."""
    if "'poll' of 'select" in fn or file.endswith("selectors.py"):
        return WAITING
    if file.startswith("~") or file.startswith("<"):
        return "builtins (C)"
    if "bench_backends" in file:
        return "the graph's nodes"
    for marker, name in (("langgraph_ckpt_ext", "ours"), ("langgraph/checkpoint", "langgraph"
                         ".checkpoint"), ("langgraph", "langgraph"), ("langchain_core",
                         "langchain_core"), ("pydantic", "pydantic"), ("aiosqlite",
                         "aiosqlite"), ("asyncio", "asyncio"), ("ormsgpack", "ormsgpack"),
                         ("threading", "threading"), ("concurrent", "concurrent")):
        if marker in file:
            return name
    return "other"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    server_options(p)
    p.add_argument("--rounds", type=lambda s: max(1, int(s)), default=3)
    p.add_argument("--threads", type=int, default=20)
    p.add_argument("--turns", type=int, default=30)
    p.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")],
                   default=[1, 16])
    p.add_argument("--lines", type=lambda s: s.split(","), default=list(LINES))
    p.add_argument("--profile", choices=LINES + BOUNDS)
    p.add_argument("--instructions", action="store_true",
                   help="count instructions per turn under callgrind instead of timing")
    p.add_argument("--work", nargs=2, metavar=("LINE", "THREADS"), help=argparse.SUPPRESS)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    if unknown := [x for x in args.lines if x not in LINES + BOUNDS]:
        p.error(f"unknown lines {unknown}: choose among {', '.join(LINES + BOUNDS)}")
    args.count_turns = 15
    if args.work:
        asyncio.run(work(args.work[0], int(args.work[1]), args))
        return
    if args.lines[0] != "floor":
        args.lines = ["floor", *[x for x in args.lines if x != "floor"]]
    if args.instructions:
        counted = instructions(args)
        print("instructions per turn (callgrind, every thread of the process; "
              f"{args.count_turns}-turn threads):")
        for line, n in counted.items():
            print(f"  {line:<19} {n / 1e6:7.2f} M  {n / counted['floor']:.3f}x the floor")
        if args.json:
            import jsonout

            jsonout.write(args.json, {**jsonout.header("floor-instructions"),
                                      "instructions_per_turn": counted})
        return
    out = asyncio.run(run(args))
    print(f"{args.threads} threads x {args.turns} turns, {args.rounds} rounds, medians; "
          "ratios to the floor of the same round")
    for c in args.concurrency:
        rows = out[str(c)]
        print(f"\nconcurrency {c}")
        print(f"{'line':<19} {'turns/s':>8} {'x floor':>8} {'(range)':>13} "
              f"{'cpu ms/turn':>11} {'x floor':>8}")
        for line, row in rows.items():
            lo, hi = row["turns_x_range"]
            print(f"{line:<19} {row['turns_per_s']:>8.1f} {row['turns_x']:>8.2f} "
                  f"{lo:>6.2f}-{hi:.2f} {row['cpu_ms']:>11.2f} {row['cpu_x']:>8.2f}")
        for line, row in rows.items():
            goal, cpu_goal = goals_of(line)
            if goal is not None:
                x, cx = row["turns_x"], row["cpu_x"]
                cpu_part = (f"; CPU {cx:.2f}x (goal <= {cpu_goal}: "
                            f"{'met' if cx <= cpu_goal else 'NOT met'})" if cpu_goal else "")
                print(f"  {line}: {x:.2f} of the floor (goal >= {goal}: "
                      f"{'met' if x >= goal else 'NOT met'}){cpu_part}")
    if len(args.concurrency) > 1:
        lo, hi = (str(c) for c in (min(args.concurrency), max(args.concurrency)))
        print(f"\nscaling, turns/s at concurrency {hi} / at {lo}:")
        for line in out[lo]:
            print(f"  {line:<19} {out[hi][line]['turns_per_s'] / out[lo][line]['turns_per_s']:.2f}")
    if "profile" in out:
        prof = out["profile"]
        print(f"\nprofile of {prof['line']} (cProfile, own time in ms per turn, inflated by "
              "the profiler):")
        for name, ms in prof["by_part_ms"].items():
            print(f"  {name:<22} {ms:7.3f}")
        print("  top functions (own time, waiting left out):")
        for name, ms in prof["top_ms"]:
            print(f"    {ms:7.3f}  {name}")
        print("  this package's functions by the time under them:")
        for name, ms in prof["ours_cumulative_ms"]:
            print(f"    {ms:7.3f}  {name}")
    if args.json:
        import jsonout

        jsonout.write(args.json, {**jsonout.header("floor"), "args": {
            k: v for k, v in vars(args).items() if k not in ("json", "dsn", "redis_url")},
            **out})


if __name__ == "__main__":
    main()
