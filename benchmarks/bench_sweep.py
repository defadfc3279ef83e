"""Benchmark: one sweep pass over a full store, and what it costs the writers meanwhile.

Per backend (memory, sqlite, postgres, redis):

1. Fill: THREADS threads of 2 or 3 checkpoints each (direct `aput`s, 32 threads in flight),
   the first half written 40 days ago (the store's injected clock), the second half now.
2. Writer alone: a graph (one node appending to a list; 2 checkpoints and the step's writes
   per turn) running turns on 8 threads of its own, in turn, for WINDOW seconds: turns/s.
3. Sweep: one pass of `Retention(idle=30 days)` (strategy delete), timed, the same writer
   running meanwhile: threads examined per second, threads deleted (half the store), and the
   graph's turns/s during the pass. The ratio during/alone is what a pass costs the
   application's writes.

The writer and the sweeper are separate checkpointers over the same storage (separate
application components; the in-memory store has one instance, shared). Each run uses fresh
storage (a temp SQLite file, a PostgreSQL schema, a Redis key prefix) and drops it afterwards.

Run: `python benchmarks/bench_sweep.py [--backends memory,sqlite,postgres,redis]
[--threads 10000 | --quick] [--window 2]`. A backend whose store keeps no lifecycle rows yet is
skipped, and said so.
"""

from __future__ import annotations

import argparse
import asyncio
import operator
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langgraph.checkpoint.base import empty_checkpoint
from langgraph.graph import END, START, StateGraph
from places import drop, open_saver

from langgraph_ckpt_ext import InMemoryCheckpointer, Retention
from langgraph_ckpt_ext.core.saver import StoreCheckpointer

DAY = 86400.0
BACKENDS = ("memory", "sqlite", "postgres", "redis")


def checkpoint(saver: StoreCheckpointer, version: Any, i: int) -> tuple[Any, Any]:
    """A small checkpoint (a growing list) and its new version."""
    version = saver.get_next_version(version, None)
    ckpt = empty_checkpoint()
    ckpt["channel_values"] = {"items": list(range(i + 1))}
    ckpt["channel_versions"] = {"items": version}
    return ckpt, version


async def fill(saver: StoreCheckpointer, first: int, count: int, at: float) -> None:
    """Threads `t{first:06d}`.. (`count` of them), 2 or 3 checkpoints each, written at `at`."""
    saver.clock = lambda: at

    async def thread(t: int) -> None:
        config: Any = {"configurable": {"thread_id": f"t{t:06d}", "checkpoint_ns": ""}}
        version = None
        for i in range(2 + t % 2):
            ckpt, version = checkpoint(saver, version, i)
            config = await saver.aput(config, ckpt, {"step": i, "source": "loop"},
                                      {"items": version})

    sem = asyncio.Semaphore(32)

    async def bounded(t: int) -> None:
        async with sem:
            await thread(t)

    await asyncio.gather(*(bounded(t) for t in range(first, first + count)))


class _Chat(TypedDict):
    messages: Annotated[list[str], operator.add]


def _graph() -> StateGraph:
    def agent(state: _Chat) -> dict[str, Any]:
        return {"messages": [f"echo {len(state['messages'])}"]}

    b = StateGraph(_Chat)
    b.add_node("agent", agent)
    b.add_edge(START, "agent")
    b.add_edge("agent", END)
    return b


class Writer:
    """A thread running graph turns until stopped, stamping each turn's completion."""

    def __init__(self, saver: StoreCheckpointer, tag: str) -> None:
        self.saver = saver
        self.tag = tag
        self.done: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        # a small real graph (one node appending to a message list), 8 threads in turn:
        # each turn stores its input checkpoint, the step's writes and the step's checkpoint
        graph = _graph().compile(checkpointer=self.saver)
        configs = [{"configurable": {"thread_id": f"w-{self.tag}-{k}"}} for k in range(8)]
        i = 0
        while not self._stop.is_set():
            graph.invoke({"messages": [f"m{i}"]}, configs[i % 8])
            self.done.append(time.perf_counter())
            i += 1

    def __enter__(self) -> Writer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def rate(self, start: float, end: float) -> float:
        """Graph turns/s completed between `start` and `end` (perf_counter seconds)."""
        n = sum(1 for t in self.done if start <= t <= end)
        return n / (end - start) if end > start else 0.0


def lifecycle_rows(saver: StoreCheckpointer) -> bool:
    return callable(getattr(saver._store, "thread_states", None))


def run(backend: str, args: argparse.Namespace) -> dict[str, Any]:
    tmp = tempfile.TemporaryDirectory()
    place = (str(Path(tmp.name) / "sweep.db") if backend == "sqlite"
             else f"lgxsweep_{uuid.uuid4().hex[:8]}")
    savers: list[StoreCheckpointer] = []

    def new() -> StoreCheckpointer:
        if backend == "memory":
            if not savers:
                savers.append(InMemoryCheckpointer())
            return savers[0]
        saver = open_saver(backend, place, args)
        savers.append(saver)
        return saver

    try:
        n, now = args.threads, time.time()

        async def fill_all() -> float | None:
            # the filler: its own checkpointer, async on this loop and closed on it (memory:
            # the one instance)
            filler = new() if backend == "memory" else open_saver(backend, place, args)
            try:
                if not lifecycle_rows(filler):
                    return None
                start = time.perf_counter()
                await fill(filler, 0, n // 2, now - 40 * DAY)
                await fill(filler, n // 2, n - n // 2, now)
                filler.clock = time.time
                return time.perf_counter() - start
            finally:
                if backend != "memory":
                    await filler.aclose()

        fill_s = asyncio.run(fill_all())
        if fill_s is None:
            return {"skipped": f"this branch's {backend} store keeps no lifecycle rows"}

        writer_saver, sweeper = new(), new()
        with Writer(writer_saver, "alone") as alone:
            time.sleep(args.window)
        end = alone.done[-1] if alone.done else time.perf_counter()
        base = alone.rate(alone.done[0], end) if alone.done else 0.0

        sweeper.retention = Retention(idle=30 * DAY)
        with Writer(writer_saver, "during") as during:
            time.sleep(0.2)  # the writer at its pace first
            start = time.perf_counter()
            report = sweeper.sweep()
            sweep_s = time.perf_counter() - start
            during_rate = during.rate(start, start + sweep_s)
        assert not report.locked_out and len(report.deleted) == n // 2, str(report)
        return {"threads": n, "fill_s": fill_s, "fill_rate": (n * 2.5) / fill_s,
                "sweep_s": sweep_s, "examined": report.examined,
                "examined_rate": report.examined / sweep_s, "deleted": len(report.deleted),
                "busy": len(report.busy), "alone": base, "during": during_rate,
                "ratio": during_rate / base if base else float("nan")}
    finally:
        for s in dict.fromkeys(savers):
            s.close()
        if backend in ("postgres", "redis"):
            asyncio.run(drop(backend, place, args))
        tmp.cleanup()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--backends", default=",".join(BACKENDS),
                   help="comma-separated, of: " + ", ".join(BACKENDS))
    p.add_argument("--threads", type=int, default=10_000, help="threads in the store (10000)")
    p.add_argument("--quick", action="store_true", help="1000 threads, a 1 s writer window")
    p.add_argument("--window", type=float, default=2.0,
                   help="seconds the writer runs alone, for its base rate (2)")
    p.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/test")
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    args = p.parse_args()
    if args.quick:
        args.threads, args.window = 1000, 1.0
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = set(backends) - set(BACKENDS)
    if unknown:
        p.error(f"unknown backend(s): {', '.join(sorted(unknown))}")
    print(f"python {sys.version.split()[0]}; {args.threads} threads (half idle 40 days, 2-3 "
          f"checkpoints each); one sweep pass of Retention(idle=30 days); writer: a graph, turns/s")
    head = (f"{'backend':<9}{'fill ckpt/s':>12}{'sweep s':>9}{'threads/s':>11}{'deleted':>9}"
            f"{'busy':>6}{'turns alone/s':>15}{'during/s':>10}{'ratio':>7}")
    print(head, flush=True)
    for backend in backends:
        r = run(backend, args)
        if "skipped" in r:
            print(f"{backend:<9}skipped: {r['skipped']}", flush=True)
            continue
        print(f"{backend:<9}{r['fill_rate']:>12.0f}{r['sweep_s']:>9.2f}"
              f"{r['examined_rate']:>11.0f}{r['deleted']:>9}{r['busy']:>6}"
              f"{r['alone']:>15.0f}{r['during']:>10.0f}{r['ratio']:>7.2f}", flush=True)


if __name__ == "__main__":
    main()
