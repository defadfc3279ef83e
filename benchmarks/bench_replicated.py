"""Benchmark: ReplicatedCheckpointer's consistency modes against the bare primary.

The agent of `bench_backends.py` (agent -> tool -> agent per turn, ~500-byte messages, a tool call
each turn, five checkpoints per turn with LangGraph's default durability="async"), THREADS
threads x TURNS turns with `ainvoke` (default 16 x 20, best of 3 rounds), at concurrency 1
(threads one after another) and, with `--concurrency 1 16`, also 16 turns of different threads
in flight. The primary is always a `PostgresCheckpointer`; the replicas a `RedisCheckpointer`
and a `SQLiteCheckpointer` (`synchronous=FULL`). Variants, interleaved round by round, each on
fresh storage (a PostgreSQL schema, a Redis key prefix, a temp SQLite file; all removed after
the variant's run, on error as well):

  bare          the PostgresCheckpointer as the graph's checkpointer
  async         ReplicatedCheckpointer(pg, [redis, sqlite], "async")
  quorum        the same, consistency="quorum", quorum=1 (the faster replica confirms)
  quorum-2      quorum=2 (both replicas confirm every write)
  anti_entropy  "anti_entropy", repair_interval=2 s (a background `repair()` every 2 s;
                `--repair-interval`, 0.5 s with --quick so that one runs in a short run)
  async-proc    "async" with the replicas given as URLs: applied by a replicator process,
                off the graph's GIL (its CPU is printed apart: "replicator process")
  quorum-proc   the same, "quorum", quorum=1
  bare+neighbour  no replication: the bare primary while another process burns CPU 30% of
                the time (about what the replicator process uses): the price of any such
                neighbour on this machine, for reading the others' costs

Per variant (best of `--rounds` by turns/s; cpu, flush and queue columns: mean over rounds):

  turns/s, ckpt/s   turns, and checkpoints stored on the primary, per second of the run (the
                    final flush excluded: what the graph's caller sees)
  p50/p99 ms        per `ainvoke` (one turn)
  cpu ms            process CPU per turn (`time.process_time`: every thread of the process, so
                    the replicas' worker threads and their private event loops too), the final
                    flush included; its part in the kernel is printed below the table
  cpu by thread     (printed below the table) that CPU split by thread: the graph's loop, the
                    replicas' worker threads and their stores' threads (a RedisCheckpointer's
                    private loop, aiosqlite's thread, ...); `--linger S` sets how long a
                    replica gathers writes into one batch
  cpu x             that CPU per turn over bare's: what replication costs the graph's own
                    process (target <= 1.15x); for the -proc variants the replicator
                    process's CPU per turn is printed apart. Below the table, each round's
                    ratio to bare's of the same round too, and their median. On a small
                    machine these seconds grow with whatever runs on the other core (the
                    replicator process, the replicas' servers): against bare+neighbour's,
                    when it ran, that part is taken out; `bench_replicated_instructions.py`
                    counts the instructions instead, which no neighbour changes
  queued            ops still queued for the replicas when the last turn returned (sum)
  flush ms          how long `aflush()` then took: the replication lag left at the end
  repairs           anti_entropy: background repairs that ran during the run, and what they
                    copied or rebuilt (nothing, when replication keeps up)

After the flush (and, for anti_entropy, once a repair still running has finished) the
checkpoints of every thread are counted with `alist` on the primary and on each replica; the
counts are printed and must be equal (OK / MISMATCH). Then, per wrapper mode, its throughput
as a fraction of bare's and the cost in percent, and the graph process's CPU per turn against
bare's (with the replicator process's beside it). `--json PATH` writes every figure: per
concurrency and variant, the best round's turns/s and p50/p99, the means of the cpu, queue and
flush columns, `cpu_x` and `replicator_cpu_x` (over bare's cpu ms), `cpu_x_rounds` (each
round's over bare's of that round), `cpu_threads_ms` (CPU per
turn by thread group), and every round's figures.

Run: `python benchmarks/bench_replicated.py [--quick] [--threads N] [--turns N] [--rounds N]
[--concurrency 1 16] [--variants V ...] [--repair-interval S] [--linger S] [--json PATH] [--dsn URL]
[--redis-url URL]`. `--quick`: 4 threads
x 8 turns, 2 rounds (a smoke run of under a minute). Numbers move with the machine's load (every
thread of the wrapper shares the GIL with the graph's event loop): compare the variants of one
run on a quiet machine, not runs of different days.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import multiprocessing
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import jsonout
from bench_backends import build_graph, question
from places import drop, server_options

from langgraph_ckpt_ext import (
    PostgresCheckpointer,
    RedisCheckpointer,
    ReplicatedCheckpointer,
    SQLiteCheckpointer,
)

REPLICAS = ("redis", "sqlite")

# variant -> (consistency, ReplicatedCheckpointer options); None: the bare primary
VARIANTS: dict[str, tuple[str, dict[str, Any]] | None] = {
    "bare": None,
    "async": ("async", {}),
    "quorum": ("quorum", {"quorum": 1}),
    "quorum-2": ("quorum", {"quorum": 2}),
    "anti_entropy": ("anti_entropy", {}),  # repair_interval: --repair-interval
    # The replicas given as URLs: applied in a replicator process of their own.
    "async-proc": ("async", {"process": True}),
    "quorum-proc": ("quorum", {"quorum": 1, "process": True}),
    # No replication: the bare primary beside a process that only burns CPU 30% of the time
    # (as much as the replicator process uses per turn): what such a neighbour costs on this
    # machine, whatever it does.
    "bare+neighbour": None,
}
NEIGHBOUR_DUTY = 0.3
CPU_TARGET = 1.15  # the graph process's CPU per turn, over bare's


def _burn(duty: float, stop: Any) -> None:  # pragma: no cover - runs in the neighbour process
    busy = 0.003 * duty / (1 - duty)
    while not stop.is_set():
        t = time.perf_counter()
        while time.perf_counter() - t < busy:
            pass
        time.sleep(0.003)


def child_cpu(wrapper: ReplicatedCheckpointer) -> float:
    """CPU seconds the replicator process has used so far (Linux /proc; 0 when none)."""
    replicator = wrapper._replicator
    if replicator is None:
        return 0.0
    fields = Path(f"/proc/{replicator.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_cpu() -> dict[str, float]:
    """CPU seconds each live thread of this process has used, by thread group (a thread's
    name without its number: `asyncio_3` is `asyncio`, the default executor's)."""
    out: dict[str, float] = {}
    for t in threading.enumerate():
        if t.ident is None:
            continue
        try:
            used = time.clock_gettime(time.pthread_getcpuclockid(t.ident))
        except OSError:  # it ended meanwhile
            continue
        group = THREAD_GROUPS.get(t.name.split(" (")[-1].rstrip(")")) or (
            t.name.rstrip("0123456789").rstrip("_-") or t.name)
        out[group] = out.get(group, 0.0) + used
    return out


# Threads by what they do (their function name, for the unnamed ones).
THREAD_GROUPS = {"MainThread": "graph's loop", "_connection_worker_thread": "aiosqlite"}


async def count(saver: Any, tids: list[str]) -> int:
    n = 0
    for tid in tids:
        n += len([c async for c in saver.alist({"configurable": {"thread_id": tid}})])
    return n


def count_repairs(saver: ReplicatedCheckpointer, log: list[tuple[float, Any]]) -> None:
    """Record the background repairs (anti_entropy calls `self._repair()`: an attribute of
    the instance shadows the method)."""
    method = saver._repair

    def repair(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        report = method(*args, **kwargs)
        log.append((time.perf_counter() - t0, report))
        return report

    saver._repair = repair  # type: ignore[method-assign]


async def open_variant(variant: str, args: argparse.Namespace, place: str, directory: Path,
                       opened: list[Any], readers: bool = True) -> Any:
    """The graph's checkpointer of `variant` on fresh storage (`place`: the PG schema and the
    Redis key prefix; the SQLite replica in `directory`): the bare primary, or the wrapper over
    it. The stores opened here go into `opened` (primary, redis, sqlite), for the caller to
    count and close; the wrapper is the caller's to close. `readers=False`: replicas applied
    in the replicator process get no store in this process (none to count them with)."""
    primary = PostgresCheckpointer(args.dsn, schema=place, setup=False)
    opened.append(primary)
    await primary.asetup()
    mode = VARIANTS[variant]
    if mode is None:
        return primary
    consistency, options = mode
    process = bool(options.get("process"))
    options = {k: v for k, v in options.items() if k != "process"}
    if consistency == "anti_entropy":
        options["repair_interval"] = args.repair_interval
    if args.linger is not None:
        options["linger"] = args.linger
    replicas: list[Any] = [(args.redis_url, {"key_prefix": place}),
                           f"sqlite:///{directory / 'replica.db'}"]
    if readers or not process:
        redis = RedisCheckpointer(args.redis_url, key_prefix=place, setup=False)
        sqlite = SQLiteCheckpointer(directory / "replica.db", setup=False)
        for store in (redis, sqlite):
            opened.append(store)
            await store.asetup()
        if not process:
            replicas = [redis, sqlite]
    return ReplicatedCheckpointer(primary, replicas, consistency, names=list(REPLICAS),
                                  **options)


async def run_variant(variant: str, args: argparse.Namespace, concurrency: int
                      ) -> dict[str, Any]:
    place = f"lgxrepl_{uuid.uuid4().hex[:10]}"  # the PG schema and the Redis key prefix
    tmp = tempfile.TemporaryDirectory(prefix="lgxrepl_")
    mode = VARIANTS[variant]
    opened: list[Any] = []
    wrapper: ReplicatedCheckpointer | None = None
    repairs: list[tuple[float, Any]] = []
    tids = [f"thread-{i}" for i in range(args.threads)]
    lat: list[float] = []
    neighbour: Any = None
    stop: Any = None
    try:
        saver = await open_variant(variant, args, place, Path(tmp.name), opened)
        if isinstance(saver, ReplicatedCheckpointer):
            wrapper = saver
            count_repairs(wrapper, repairs)
        graph = build_graph(saver)
        gate = asyncio.Semaphore(concurrency)

        async def run_thread(tid: str) -> None:
            for k in range(args.turns):
                human = question(tid, k)
                async with gate:
                    s = time.perf_counter()
                    await graph.ainvoke({"messages": [human]}, {"configurable": {"thread_id": tid}})
                    lat.append(time.perf_counter() - s)

        if variant == "bare+neighbour":
            stop = multiprocessing.Event()
            neighbour = multiprocessing.Process(target=_burn, args=(NEIGHBOUR_DUTY, stop),
                                                daemon=True)
            neighbour.start()
        gc.collect()
        child0 = child_cpu(wrapper) if wrapper is not None else 0.0
        t0, cpu0, threads0 = time.perf_counter(), time.process_time(), thread_cpu()
        sys0 = os.times().system
        if concurrency == 1:
            for tid in tids:
                await run_thread(tid)
        else:
            await asyncio.gather(*(run_thread(tid) for tid in tids))
        seconds = time.perf_counter() - t0
        queued, flush = 0, 0.0
        if wrapper is not None:
            queued = sum(r.queued for r in wrapper.status().replicas)
            f0 = time.perf_counter()
            flushed = await wrapper.aflush(timeout=120)
            flush = time.perf_counter() - f0
            if not flushed:
                print(f"  [{variant}] aflush timed out after 120 s", file=sys.stderr)
        cpu = time.process_time() - cpu0
        system = os.times().system - sys0
        threads1 = thread_cpu()
        by_thread = {k: v - threads0.get(k, 0.0) for k, v in threads1.items()}
        child = child_cpu(wrapper) - child0 if wrapper is not None else 0.0
        status = None
        if wrapper is not None:
            status = wrapper.status()
            await wrapper.aclose()  # flushes again (nothing left), stops the workers
            if wrapper._repairer is not None:  # let a background repair still running finish
                await asyncio.to_thread(wrapper._repairer.join, 60)
        counts = [await count(s, tids) for s in opened]
    finally:
        if neighbour is not None:
            stop.set()
            neighbour.join(5)
        if wrapper is not None:
            with contextlib.suppress(Exception):
                await wrapper.aclose()
        for s in reversed(opened):
            with contextlib.suppress(Exception):
                await s.aclose()
        with contextlib.suppress(Exception):
            await drop("postgres", place, args)
        if mode is not None:
            with contextlib.suppress(Exception):
                await drop("redis", place, args)
        tmp.cleanup()
    turns = args.threads * args.turns
    lat.sort()
    return {
        "turns_per_s": turns / seconds,
        "turns_per_s_flushed": turns / (seconds + flush),
        "checkpoints_per_s": counts[0] / seconds,
        "p50_ms": 1000 * lat[len(lat) // 2],
        "p99_ms": 1000 * lat[min(len(lat) - 1, int(len(lat) * 0.99))],
        "cpu_ms": 1000 * cpu / turns,
        "sys_ms": 1000 * system / turns,
        "cpu_threads_ms": {k: 1000 * v / turns for k, v in sorted(
            by_thread.items(), key=lambda kv: -kv[1]) if v > 0},
        "child_cpu_ms": 1000 * child / turns,
        "queued": queued,
        "flush_ms": 1000 * flush,
        "counts": counts,
        "repairs": repairs,
        "status": status,
    }


def _repairs_note(rows: list[dict[str, Any]]) -> str:
    runs = [r for row in rows for r in row["repairs"]]
    if not runs:
        return "none ran"
    copied = sum(x.checkpoints_copied + x.writes_copied for _, rep in runs for x in rep.replicas)
    rebuilt = sum(len(x.threads_rebuilt) for _, rep in runs for x in rep.replicas)
    skipped = sum(len(x.threads_skipped) for _, rep in runs for x in rep.replicas)
    errors = [x.error for _, rep in runs for x in rep.replicas if x.error]
    closed = sum(e == "closed" for e in errors)  # a repair stopped by close() at the end
    errors = [e for e in errors if e != "closed"]
    ms = [1000 * s for s, _ in runs]
    return (f"{len(runs)} ran over {len(rows)} round(s), {statistics.fmean(ms):.0f} ms each on "
            f"average (longest {max(ms):.0f} ms); {copied} checkpoints+writes copied, {rebuilt} "
            f"threads rebuilt, {skipped} skipped (busy)"
            + (f", {closed} replica pass(es) stopped by close()" if closed else "")
            + (f"; errors: {errors[:2]}" if errors else ""))


async def run(args: argparse.Namespace, concurrency: int) -> dict[str, Any]:
    """Run the variants interleaved, print the table and the ratios; the figures for --json."""
    chosen = [v for v in VARIANTS if v in args.variants or v == "bare"]
    results: dict[str, list[dict[str, Any]]] = {v: [] for v in chosen}
    for _ in range(args.rounds):
        for variant in chosen:
            results[variant].append(await run_variant(variant, args, concurrency))
    inflight = min(concurrency, args.threads)
    note = "" if inflight == concurrency else f" ({inflight} in flight: one turn per thread)"
    print(f"\n[concurrency {concurrency}{note}] {args.threads} threads x {args.turns} turns, "
          f"primary PostgreSQL, replicas {' + '.join(REPLICAS)}; best of {args.rounds} "
          "interleaved rounds (cpu, queued, flush: mean)")
    print(f"{'variant':<13} {'turns/s':>8} {'ckpt/s':>7} {'p50 ms':>7} {'p99 ms':>7} "
          f"{'cpu ms':>7} {'cpu x':>6} {'queued':>7} {'flush ms':>8}  checkpoints after flush "
          f"(primary/{'/'.join(REPLICAS)})")
    best = {variant: _best(rows) for variant, rows in results.items()}
    base_cpu = best["bare"]["cpu_ms"]
    for variant, rows in results.items():
        b = best[variant]
        b["cpu_x"] = b["cpu_ms"] / base_cpu
        # each round's cpu over bare's of the same round: the machine's drift between rounds
        # cancels out
        b["cpu_x_rounds"] = [r["cpu_ms"] / bare["cpu_ms"]
                             for r, bare in zip(rows, results["bare"], strict=True)]
        b["replicator_cpu_x"] = b["child_cpu_ms"] / base_cpu
        bad = [r["counts"] for r in rows if len(set(r["counts"])) != 1]
        b["counts_equal"] = not bad
        counts = "/".join(map(str, (bad[0] if bad else b["counts"])))
        check = "" if VARIANTS[variant] is None else (
            f" MISMATCH (in {len(bad)} of {len(rows)} rounds)" if bad else " OK")
        wrapper = VARIANTS[variant] is not None
        print(f"{variant:<13} {b['turns_per_s']:>8.1f} {b['checkpoints_per_s']:>7.0f} "
              f"{b['p50_ms']:>7.2f} {b['p99_ms']:>7.2f} {b['cpu_ms']:>7.2f} {b['cpu_x']:>6.2f} "
              + (f"{b['queued']:>7.0f} {b['flush_ms']:>8.1f}" if wrapper else f"{'-':>7} {'-':>8}")
              + f"  {counts}{check}"
              + (f"  (replicator process: {b['child_cpu_ms']:.2f} cpu ms/turn)"
                 if b["child_cpu_ms"] else ""))
        if bad:
            for r in rows:
                if r["status"] is not None and len(set(r["counts"])) != 1:
                    print("    " + str(r["status"]).replace("\n", "\n    "))
    if "anti_entropy" in results:
        print(f"anti_entropy background repairs (every {args.repair_interval:g} s): "
              f"{_repairs_note(results['anti_entropy'])}")
    _print_ratios(best)
    return {variant: {**{k: v for k, v in best[variant].items() if k not in _OBJECTS},
                      "rounds": [{k: v for k, v in r.items() if k not in _OBJECTS}
                                 for r in rows]}
            for variant, rows in results.items()}


_OBJECTS = ("repairs", "status")  # not figures: left out of --json


def _best(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The round with the most turns/s, with the cpu, queue and flush columns' means."""
    b = max(rows, key=lambda r: r["turns_per_s"])
    mean = {k: statistics.fmean(r[k] for r in rows)
            for k in ("cpu_ms", "sys_ms", "child_cpu_ms", "queued", "flush_ms")}
    groups = {k for r in rows for k in r["cpu_threads_ms"]}
    threads = {k: statistics.fmean(r["cpu_threads_ms"].get(k, 0.0) for r in rows)
               for k in groups}
    return {**b, **mean, "cpu_threads_ms": dict(sorted(threads.items(), key=lambda kv: -kv[1]))}


def _print_ratios(best: dict[str, dict[str, Any]]) -> None:
    base = best["bare"]
    for variant, row in best.items():
        if variant == "bare":
            continue
        frac = row["turns_per_s"] / base["turns_per_s"]
        if VARIANTS[variant] is None:  # the neighbour
            print(f"{variant}: the bare primary beside a process that only burns CPU "
                  f"{NEIGHBOUR_DUTY:.0%} of the time runs at {frac:.2f}x its turns/s: such a "
                  f"neighbour alone costs {100 * (1 - frac):.1f}% on this machine")
            continue
        frac_flushed = row["turns_per_s_flushed"] / base["turns_per_s"]
        print(f"{variant} runs at {frac:.2f}x the bare primary's turns/s: it costs "
              f"{100 * (1 - frac):.1f}% of its throughput; "
              f"{100 * (1 - frac_flushed):.1f}% counting the final flush; "
              f"p50 {row['p50_ms'] / base['p50_ms']:.2f}x")
    print(f"CPU per turn of the graph's process, against bare's {base['cpu_ms']:.2f} ms "
          f"(target <= {CPU_TARGET:.2f}x; what a replica costs where cores are free):")
    for variant, row in best.items():
        if variant == "bare" or VARIANTS[variant] is None:
            continue
        verdict = "within" if row["cpu_x"] <= CPU_TARGET else "over"
        child = (f"; replicator process {row['child_cpu_ms']:.2f} ms "
                 f"({row['replicator_cpu_x']:.2f}x), both {row['cpu_x'] + row['replicator_cpu_x']:.2f}x"
                 if row["child_cpu_ms"] else "")
        rounds = " ".join(f"{x:.2f}" for x in row["cpu_x_rounds"])
        print(f"  {variant:<13} {row['cpu_ms']:6.2f} ms  {row['cpu_x']:.2f}x ({verdict} target)"
              + child + f"; round by round {rounds}, median "
              f"{statistics.median(row['cpu_x_rounds']):.2f}x; in the kernel "
              f"{row['sys_ms']:.2f} ms (bare's {base['sys_ms']:.2f})")
    neighbour = best.get("bare+neighbour")
    if neighbour is not None:
        print(f"  bare+neighbour's {neighbour['cpu_ms']:.2f} ms ({neighbour['cpu_x']:.2f}x) is "
              "what a process that only burns CPU beside the graph adds here; against it:")
        for variant, row in best.items():
            if row.get("child_cpu_ms"):
                print(f"  {variant:<13} {row['cpu_ms'] / neighbour['cpu_ms']:.2f}x")
    print("CPU per turn by thread (ms; threads alive at the end of the run):")
    for variant, row in best.items():
        print(f"  {variant:<13} " + ", ".join(
            f"{name} {ms:.2f}" for name, ms in row["cpu_threads_ms"].items() if ms >= 0.005))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    server_options(p)
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS),
                   help="the variants to run (bare always runs)")
    p.add_argument("--threads", type=int, default=16)
    p.add_argument("--turns", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1],
                   help="turns in flight at once; several values run one after another "
                        "(default: 1; e.g. --concurrency 1 16)")
    p.add_argument("--repair-interval", type=float, default=None,
                   help="anti_entropy: seconds between background repairs (default 2; quick 0.5)")
    p.add_argument("--linger", type=float, default=None,
                   help="the wrappers' linger (s): how long a replica waits for more writes to "
                        "apply them as one batch (default: ReplicatedCheckpointer's)")
    p.add_argument("--json", type=Path, help="also write every figure to this JSON file")
    p.add_argument("--quick", action="store_true",
                   help="4 threads x 8 turns, 2 rounds, a repair every 0.5 s")
    args = p.parse_args()
    if args.quick:
        args.threads, args.turns, args.rounds = 4, 8, 2
    if args.repair_interval is None:
        args.repair_interval = 0.5 if args.quick else 2.0
    out = {**jsonout.header("replicated"), "args": {
        k: v for k, v in vars(args).items() if k not in ("json", "dsn", "redis_url")},
        "cpu_target": CPU_TARGET, "concurrency": {}}
    for concurrency in args.concurrency:
        out["concurrency"][str(concurrency)] = asyncio.run(run(args, concurrency))
    if args.json:
        jsonout.write(args.json, out)


if __name__ == "__main__":
    main()
