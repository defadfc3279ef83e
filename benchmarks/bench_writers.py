"""Benchmark: what one writer per thread costs, and that it works.

Two variants of our checkpointer, per backend (memory, sqlite, postgres, redis), in one run:
each round opens both, each on fresh storage (a temp SQLite file, a PostgreSQL schema, a Redis
key prefix; dropped after the round, on error as well), and runs every workload on one variant
right after the other (the order flips every round):

  on    `writers="single"`, tombstones on (the defaults): every put checks the namespace's
        head atomically with the write (`core.guard`)
  off   `writers="last_wins"`, `tombstone_ttl=None`: no check (LangGraph's savers' behaviour)

Workloads, per variant and round:

1. Graph turns: a compiled graph `agent -> tool -> END` (one short string appended per node,
   four checkpoints a turn: input, start, agent, tool), THREADS threads x TURNS turns with
   `ainvoke`, at concurrency 1 (threads one after another) and 16 (16 tasks, each running
   its own thread id). Checkpoints/s: checkpoints stored (counted with `alist` afterwards) /
   wall time; and CPU µs per checkpoint (this process's CPU time, every thread of it, not a
   server's: less moved by other jobs on the machine than wall time).
2. Direct puts: THREADS chains of PUTS `aput`s (each put's parent the one before, no graph,
   no read), at concurrency 1 and 16 as above: puts/s and CPU µs per put. The check's cost
   per put, without a graph's own work around it.
3. Reads: `aget_tuple` of a checkpoint by id (the middle of a chain of PUTS), READS times, and
   of the latest one: mean µs. With the check on, a read by id also reads the head, to stamp
   it into the config it returns; a read of the latest finds the head as it reads.
4. One thread, 16 runs at once (RACE rounds): 16 `ainvoke`s of the same thread id at once,
   after one turn that created it. A run that another overtook between its read and its put
   is refused (`ConcurrentWriteError`) with the check on: the line gives runs completed and
   refused, and whether the thread's history is still one chain (every checkpoint an ancestor
   of the head). With it off every run completes and the history forks: the line gives how
   many checkpoints are off the head's chain.

Figures are medians over rounds; on/off is the median of each round's ratio (its two runs
side by side). Exit code 1 if a check fails (a history forked with the check on, a workload's
checkpoint count wrong) or a backend failed to run (its line says why); 0 otherwise.

Run: `python benchmarks/bench_writers.py [--backends memory,sqlite,postgres,redis] [--quick]
[--threads 16] [--turns 20] [--puts 50] [--reads 500] [--race 10] [--rounds 3]
[--dsn URL] [--redis-url URL]`. `--quick`: 16 threads x 4 turns, 10 puts, 100 reads, 3 race
rounds, 2 rounds (seconds per backend). Timings on a shared VM are noisy: compare on and off
within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import operator
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langgraph.checkpoint.base import empty_checkpoint
from langgraph.graph import END, START, StateGraph
from places import drop, open_saver

from langgraph_ckpt_ext import ConcurrentWriteError, InMemoryCheckpointer
from langgraph_ckpt_ext.core.saver import StoreCheckpointer

BACKENDS = ("memory", "sqlite", "postgres", "redis")
VARIANTS: dict[str, dict[str, Any]] = {
    "on": {"writers": "single"},
    "off": {"writers": "last_wins", "tombstone_ttl": None},
}
CONCURRENCY = (1, 16)
RACERS = 16


class _Log(TypedDict):
    log: Annotated[list[str], operator.add]


def build_graph(saver: StoreCheckpointer) -> Any:
    def agent(state: _Log) -> dict[str, Any]:
        return {"log": [f"agent {len(state['log'])}"]}

    def tool(state: _Log) -> dict[str, Any]:
        return {"log": [f"tool {len(state['log'])}"]}

    b = StateGraph(_Log)
    b.add_node("agent", agent)
    b.add_node("tool", tool)
    b.add_edge(START, "agent")
    b.add_edge("agent", "tool")
    b.add_edge("tool", END)
    return b.compile(checkpointer=saver)


def config(thread_id: str, checkpoint_id: str | None = None) -> Any:
    conf = {"thread_id": thread_id, "checkpoint_ns": ""}
    if checkpoint_id is not None:
        conf["checkpoint_id"] = checkpoint_id
    return {"configurable": conf}


async def in_flight(jobs: Iterable[Callable[[], Awaitable[None]]],
                    concurrency: int) -> tuple[float, float]:
    """Run the jobs, `concurrency` at a time; seconds taken, and CPU seconds of this process
    (every thread of it: a backend's driver thread too; not a server's)."""
    sem = asyncio.Semaphore(concurrency)
    gc.collect()  # the previous variant's garbage is not this one's cost

    async def bounded(job: Callable[[], Awaitable[None]]) -> None:
        async with sem:
            await job()

    start, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(bounded(j) for j in jobs))
    return time.perf_counter() - start, time.process_time() - cpu


async def count(saver: StoreCheckpointer, thread_ids: Iterable[str]) -> int:
    n = 0
    for t in thread_ids:
        n += len([c async for c in saver.alist(config(t))])
    return n


# -- the workloads --------------------------------------------------------------------------


async def graph_turns(saver: StoreCheckpointer, args: argparse.Namespace,
                      conc: int) -> tuple[float, float]:
    """Checkpoints/s and CPU µs per checkpoint."""
    graph = build_graph(saver)
    tids = [f"g{conc}-{k}" for k in range(args.threads)]

    def thread(tid: str) -> Callable[[], Awaitable[None]]:
        async def run() -> None:
            for i in range(args.turns):
                await graph.ainvoke({"log": [f"turn {i}"]}, {"configurable": {"thread_id": tid}})
        return run

    seconds, cpu = await in_flight([thread(t) for t in tids], conc)
    stored = await count(saver, tids)
    expected = 4 * args.threads * args.turns
    if stored != expected:
        raise CheckFailed(f"graph turns at concurrency {conc}: {stored} checkpoints stored, "
                          f"{expected} expected")
    return stored / seconds, 1e6 * cpu / stored


def small_checkpoint(i: int) -> tuple[Any, Any]:
    ckpt = empty_checkpoint()
    version = f"{i + 1:032}.0"
    ckpt["channel_values"] = {"n": i, "note": "x" * 200}
    ckpt["channel_versions"] = {"n": version, "note": version}
    return ckpt, {"n": version, "note": version}


async def direct_puts(saver: StoreCheckpointer, args: argparse.Namespace,
                      conc: int) -> tuple[float, float]:
    """Puts/s and CPU µs per put."""
    tids = [f"p{conc}-{k}" for k in range(args.threads)]

    def chain(tid: str) -> Callable[[], Awaitable[None]]:
        async def run() -> None:
            conf = config(tid)
            for i in range(args.puts):
                ckpt, versions = small_checkpoint(i)
                conf = await saver.aput(conf, ckpt, {"source": "loop", "step": i}, versions)
        return run

    seconds, cpu = await in_flight([chain(t) for t in tids], conc)
    n = args.threads * args.puts
    return n / seconds, 1e6 * cpu / n


async def mean_us(call: Callable[[], Awaitable[Any]], n: int) -> float:
    await call()  # warm
    gc.collect()
    start = time.perf_counter()
    for _ in range(n):
        await call()
    return 1e6 * (time.perf_counter() - start) / n


async def reads(saver: StoreCheckpointer, args: argparse.Namespace) -> tuple[float, float]:
    """Mean µs of `aget_tuple` by id (the middle of a chain written by `direct_puts`) and of
    the latest checkpoint."""
    tid = "p1-0"
    ids = [c.config["configurable"]["checkpoint_id"] async for c in saver.alist(config(tid))]
    by_id = await mean_us(lambda: saver.aget_tuple(config(tid, ids[len(ids) // 2])), args.reads)
    latest = await mean_us(lambda: saver.aget_tuple(config(tid)), args.reads)
    return by_id, latest


async def race(saver: StoreCheckpointer, args: argparse.Namespace) -> dict[str, int]:
    """RACE rounds of 16 runs on one thread id at once: completed, refused, off the chain."""
    graph = build_graph(saver)
    conf = {"configurable": {"thread_id": "race"}}
    await graph.ainvoke({"log": ["start"]}, conf)
    done = refused = 0
    for r in range(args.race):
        results = await asyncio.gather(
            *(graph.ainvoke({"log": [f"race {r}/{k}"]}, conf) for k in range(RACERS)),
            return_exceptions=True)
        for res in results:
            if isinstance(res, ConcurrentWriteError):
                refused += 1
            elif isinstance(res, BaseException):
                raise res
            else:
                done += 1
    return {"completed": done, "refused": refused, "off_chain": await off_chain(saver, "race")}


async def off_chain(saver: StoreCheckpointer, thread_id: str) -> int:
    """Checkpoints of the thread that are not ancestors of its head (0: one chain)."""
    parents: dict[str, str | None] = {}
    head = None
    async for c in saver.alist(config(thread_id)):
        cid = c.config["configurable"]["checkpoint_id"]
        head = head or cid
        parents[cid] = c.parent_config["configurable"]["checkpoint_id"] if c.parent_config else None
    seen = set()
    while head is not None and head not in seen:
        seen.add(head)
        head = parents.get(head)
    return len(parents) - len(seen)


class CheckFailed(Exception):
    pass


# -- one variant's run, on fresh storage ------------------------------------------------------


async def workload(step: str, saver: StoreCheckpointer,
                   args: argparse.Namespace) -> dict[str, Any]:
    if step.startswith("graph") or step.startswith("puts"):
        name, conc = step.split()
        run_it = graph_turns if name == "graph" else direct_puts
        rate, cpu = await run_it(saver, args, int(conc))
        return {step: rate, f"{step} cpu": cpu}
    if step == "reads":
        by_id, latest = await reads(saver, args)
        return {"by id": by_id, "latest": latest}
    return {"race": await race(saver, args)}


STEPS = (*(f"graph {c}" for c in CONCURRENCY), *(f"puts {c}" for c in CONCURRENCY),
         "reads", "race")


async def run_round(backend: str, args: argparse.Namespace, tmp: Path,
                    order: list[str]) -> dict[str, dict[str, Any]]:
    """One round: both variants on fresh storage of their own, each workload run by one
    variant right after the other (`order`), so that a change in the machine's load
    between workloads falls on both."""
    places = {v: (str(tmp / f"{uuid.uuid4().hex}.db") if backend == "sqlite"
                  else f"lgxwriters_{uuid.uuid4().hex[:8]}") for v in order}
    savers: dict[str, StoreCheckpointer] = {}
    out: dict[str, dict[str, Any]] = {v: {} for v in order}
    try:
        for v in order:
            savers[v] = (InMemoryCheckpointer(**VARIANTS[v]) if backend == "memory"
                         else open_saver(backend, places[v], args, **VARIANTS[v]))
        for step in STEPS:
            for v in order:
                out[v].update(await workload(step, savers[v], args))
    finally:
        for saver in savers.values():
            await saver.aclose()
        if backend in ("postgres", "redis"):
            for place in places.values():
                await drop(backend, place, args)
    return out


async def run(backend: str, args: argparse.Namespace) -> bool:
    """The backend's rounds and its table; False if a check failed."""
    rounds: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    with tempfile.TemporaryDirectory() as d:
        for r in range(args.rounds):
            order = list(VARIANTS) if r % 2 == 0 else list(reversed(VARIANTS))
            for variant, figures in (await run_round(backend, args, Path(d), order)).items():
                rounds[variant].append(figures)
    return report(backend, args, rounds)


def report(backend: str, args: argparse.Namespace,
           rounds: dict[str, list[dict[str, Any]]]) -> bool:
    def med(variant: str, key: str) -> float:
        return float(statistics.median(r[key] for r in rounds[variant]))

    def ratio(key: str) -> float:  # per round (its two runs side by side), then the median
        pairs = zip(rounds["on"], rounds["off"], strict=True)
        return float(statistics.median(on[key] / off[key] for on, off in pairs))

    print(f"\n[{backend}] median of {args.rounds} interleaved rounds; {args.threads} threads x "
          f"{args.turns} turns (4 checkpoints a turn), {args.threads} x {args.puts} puts, "
          f"{args.reads} reads")
    print(f"{'workload':<24}{'conc':>5}{'on':>11}{'off':>11}{'on/off':>8}")
    for name, label in (("graph", "graph turns, ckpt/s"), ("graph", "  cpu µs/checkpoint"),
                        ("puts", "direct puts, puts/s"), ("puts", "  cpu µs/put")):
        for conc in CONCURRENCY:
            key = f"{name} {conc}" + (" cpu" if "cpu" in label else "")
            on, off = med("on", key), med("off", key)
            print(f"{label:<24}{conc:>5}{on:>11.0f}{off:>11.0f}{ratio(key):>8.2f}")
    for key, label in (("by id", "get_tuple by id, µs"), ("latest", "get_tuple latest, µs")):
        on, off = med("on", key), med("off", key)
        print(f"{label:<24}{'':>5}{on:>11.1f}{off:>11.1f}{ratio(key):>8.2f}")
    ok = True
    for variant in VARIANTS:
        runs = [r["race"] for r in rounds[variant]]
        done, refused = sum(x["completed"] for x in runs), sum(x["refused"] for x in runs)
        forked = sum(x["off_chain"] for x in runs)
        if variant == "on":
            ok = ok and forked == 0
            verdict = "one chain: OK" if forked == 0 else f"FORKED ({forked} off the chain)"
        else:
            verdict = f"{forked} checkpoints off the head's chain"
        print(f"one thread, {RACERS} runs at once x {args.race} ({variant}): {done + refused} "
              f"runs, {done} completed, {refused} refused; {verdict}")
    return ok


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--backends", default=",".join(BACKENDS),
                   help="comma-separated, of: " + ", ".join(BACKENDS))
    p.add_argument("--threads", type=int, default=16)
    p.add_argument("--turns", type=int, default=20, help="graph turns per thread (20)")
    p.add_argument("--puts", type=int, default=50, help="direct puts per thread (50)")
    p.add_argument("--reads", type=int, default=500, help="get_tuple calls timed (500)")
    p.add_argument("--race", type=int, default=10, help="rounds of 16 runs on one thread (10)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--quick", action="store_true",
                   help="4 turns, 10 puts, 100 reads, 3 race rounds, 2 rounds")
    p.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/test")
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    args = p.parse_args()
    if args.quick:
        args.turns, args.puts, args.reads, args.race, args.rounds = 4, 10, 100, 3, 2
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = set(backends) - set(BACKENDS)
    if unknown:
        p.error(f"unknown backend(s): {', '.join(sorted(unknown))}")
    print(f"python {sys.version.split()[0]}; on: writers='single', tombstones on; "
          "off: writers='last_wins', tombstone_ttl=None")
    ok = True
    for backend in backends:
        try:
            ok = asyncio.run(run(backend, args)) and ok
        except Exception as exc:  # the other backends still run; the exit code says it
            print(f"\n[{backend}] failed: {type(exc).__name__}: {exc}", flush=True)
            ok = False
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
