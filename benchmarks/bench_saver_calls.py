"""Benchmark: what a saver's own calls cost per agent turn, without LangGraph around them.

`bench_floor.py` times whole turns, where LangGraph's own work (about 80% of a turn) and its
noise hide a saver's part. This script records the calls LangGraph makes to a saver during
the agent workload of `bench_backends.py` (THREADS threads x TURNS turns, `durability="async"`:
five `aput`, four `aput_writes` and one `aget_tuple` a turn), then replays exactly those calls,
one after another, into a fresh saver of each line, and prints per turn:

- the time inside each kind of call (`aput`, `aput_writes`, `aget_tuple`; awaited one at a
  time, so a server's round trips and a commit's fsync are in it),
- the process's CPU (user and system), and how much of it ran on the calling thread and how
  much on other threads (a store's own threads: SQLite's connection threads),
- with `--split`, the time inside some of this package's functions (the list marks that tell
  what changed, the copies a read hands back, the encoding of new items), for our lines.

The replayed calls are LangGraph's own, with the same objects, ids and versions; each line
gets them in the same order. Lines: official-memory (`InMemorySaver`), ours-memory,
ours-sqlite, ours-sqlite-inline, official-sqlite, ours-postgres, ours-redis, and the bounds of
`floor_bounds.py` (`bound-none-free`, `bound-sqlite`, ...). The garbage collector is held off
during a replay (run before it) so that its passes fall on no line.

Run: `python benchmarks/bench_saver_calls.py [--threads 10] [--turns 30] [--rounds 3]
[--lines official-memory,ours-memory,ours-sqlite] [--split] [--json PATH]`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import resource
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_backends import build_graph, question, thread_config
from bench_floor import BOUNDS, LINES, opened
from langgraph.checkpoint.memory import InMemorySaver
from places import server_options

from langgraph_ckpt_ext.core import codec

KINDS = ("aput", "aput_writes", "aget_tuple")

Call = tuple[str, tuple[Any, ...]]


class _Recorder(InMemorySaver):
    """`InMemorySaver` that keeps every call LangGraph makes, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[Call] = []

    async def aput(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        # The checkpoint's dicts copied: LangGraph may reuse them; the values are its own.
        kept = {**checkpoint, "channel_values": dict(checkpoint["channel_values"]),
                "channel_versions": dict(checkpoint["channel_versions"])}
        self.calls.append(("aput", (config, kept, dict(metadata), dict(new_versions))))
        return await super().aput(config, checkpoint, metadata, new_versions)

    async def aput_writes(self, config: Any, writes: Any, task_id: str,
                          task_path: str = "") -> None:
        self.calls.append(("aput_writes", (config, list(writes), task_id, task_path)))
        await super().aput_writes(config, writes, task_id, task_path)

    async def aget_tuple(self, config: Any) -> Any:
        self.calls.append(("aget_tuple", (config,)))
        return await super().aget_tuple(config)


async def record(threads: int, turns: int) -> list[Call]:
    saver = _Recorder()
    graph = build_graph(saver)
    for i in range(threads):
        for k in range(turns):
            await graph.ainvoke({"messages": [question(f"thread-{i}", k)]},
                                thread_config(f"thread-{i}"), durability="async")
    return saver.calls


SPLIT = (("chunk_mark", codec, "chunk_mark"), ("encode_items", codec, "encode_items"),
         ("encode_blobs", codec, "encode_blobs"), ("ListCopies.read", codec.ListCopies, "read"),
         ("resolve_blobs", codec, "resolve_blobs"), ("encode_writes", codec, "encode_writes"))
"""Functions of ours timed with `--split` (each is called through its module or class)."""


@contextlib.contextmanager
def split_timers(spent: dict[str, float]) -> Any:
    """Time spent in the `SPLIT` functions while inside (added to `spent`)."""
    saved = []
    for label, owner, name in SPLIT:
        fn = getattr(owner, name)
        saved.append((owner, name, fn))

        def timed(*a: Any, _fn: Callable[..., Any] = fn, _label: str = label, **k: Any) -> Any:
            start = time.perf_counter()
            try:
                return _fn(*a, **k)
            finally:
                spent[_label] = spent.get(_label, 0.0) + time.perf_counter() - start

        setattr(owner, name, timed)
    try:
        yield
    finally:
        for owner, name, fn in saved:
            setattr(owner, name, fn)


async def replay(line: str, calls: list[Call], args: argparse.Namespace, tmp: Path,
                 split: bool) -> dict[str, Any]:
    """One replay of `calls` into a fresh saver of `line`: seconds per kind, CPU."""
    inside = dict.fromkeys(KINDS, 0.0)
    spent: dict[str, float] = {}
    async with opened(line, args, tmp) as saver:
        methods = {kind: getattr(saver, kind) for kind in KINDS}
        gc.collect()
        gc.disable()
        try:
            with split_timers(spent) if split else contextlib.nullcontext():
                before = resource.getrusage(resource.RUSAGE_SELF)
                cpu0, own0 = time.process_time(), time.thread_time()
                for kind, call_args in calls:
                    start = time.perf_counter()
                    await methods[kind](*call_args)
                    inside[kind] += time.perf_counter() - start
                cpu, own = time.process_time() - cpu0, time.thread_time() - own0
                after = resource.getrusage(resource.RUSAGE_SELF)
        finally:
            gc.enable()
    return {"inside": inside, "cpu": cpu, "calling_thread": own,
            "user": after.ru_utime - before.ru_utime, "sys": after.ru_stime - before.ru_stime,
            "split": spent}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    calls = await record(args.threads, args.turns)
    turns = args.threads * args.turns
    out: dict[str, Any] = {"calls_per_turn": {k: sum(c[0] == k for c in calls) / turns
                                              for k in KINDS}, "lines": {}}
    runs: dict[str, list[dict[str, Any]]] = {line: [] for line in args.lines}
    with tempfile.TemporaryDirectory(prefix="lgxcalls_") as name:
        for r in range(args.rounds + 1):  # round 0 warms every line up, not counted
            order = args.lines[r % len(args.lines):] + args.lines[:r % len(args.lines)]
            for line in order:
                result = await replay(line, calls, args, Path(name),
                                      args.split and line.startswith("ours-"))
                if r:
                    runs[line].append(result)
    for line, results in runs.items():
        best = min(results, key=lambda x: x["cpu"])  # the least disturbed round
        us = 1e6 / turns
        out["lines"][line] = {
            "inside_us": {k: v * us for k, v in best["inside"].items()},
            "cpu_us": best["cpu"] * us, "calling_thread_us": best["calling_thread"] * us,
            "other_threads_us": (best["cpu"] - best["calling_thread"]) * us,
            "user_us": best["user"] * us, "sys_us": best["sys"] * us,
            "split_us": {k: v * us for k, v in best["split"].items()},
            "cpu_us_rounds": [x["cpu"] * us for x in results]}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    server_options(p)
    p.add_argument("--threads", type=int, default=10)
    p.add_argument("--turns", type=int, default=30)
    p.add_argument("--rounds", type=lambda s: max(1, int(s)), default=3)
    p.add_argument("--lines", type=lambda s: s.split(","),
                   default=["official-memory", "ours-memory", "ours-sqlite", "ours-sqlite-inline",
                            "bound-none-free", "bound-sqlite"])
    p.add_argument("--split", action="store_true",
                   help="time some of this package's functions inside our lines' calls")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    known = tuple(x for x in (*LINES, *BOUNDS) if x != "floor")  # the floor makes no calls
    if unknown := [x for x in args.lines if x not in known]:
        p.error(f"unknown lines {unknown}: choose among {', '.join(known)}")
    out = asyncio.run(run(args))
    per = out["calls_per_turn"]
    print(f"{args.threads} threads x {args.turns} turns recorded, replayed call by call; "
          f"per turn: {per['aput']:.1f} aput, {per['aput_writes']:.1f} aput_writes, "
          f"{per['aget_tuple']:.1f} aget_tuple; the round of least CPU of {args.rounds}")
    print(f"\n{'us per turn':<20} {'aput':>7} {'writes':>7} {'get':>7} {'CPU':>7} "
          f"{'caller':>7} {'others':>7} {'user':>7} {'sys':>7}")
    for line, row in out["lines"].items():
        inside = row["inside_us"]
        print(f"{line:<20} {inside['aput']:>7.0f} {inside['aput_writes']:>7.0f} "
              f"{inside['aget_tuple']:>7.0f} {row['cpu_us']:>7.0f} "
              f"{row['calling_thread_us']:>7.0f} {row['other_threads_us']:>7.0f} "
              f"{row['user_us']:>7.0f} {row['sys_us']:>7.0f}")
    if args.split:
        print("\ninside our calls (us per turn, nested: encode_blobs holds encode_items, which "
              "holds chunk_mark; resolve_blobs holds ListCopies.read):")
        for line, row in out["lines"].items():
            if row["split_us"]:
                print(f"  {line:<20} " + ", ".join(
                    f"{k} {v:.0f}" for k, v in sorted(row["split_us"].items(),
                                                        key=lambda kv: -kv[1])))
    if args.json:
        import jsonout

        jsonout.write(args.json, {**jsonout.header("saver-calls"), "args": {
            k: v for k, v in vars(args).items() if k not in ("json", "dsn", "redis_url")},
            **out})


if __name__ == "__main__":
    main()
