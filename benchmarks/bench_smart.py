"""Benchmark: SmartCheckpointer's policies against the bare backend, on the agent workload.

The agent of `bench_backends.py` (agent -> tool -> agent per turn, ~500-byte messages, a tool call
each turn), THREADS threads x TURNS turns at concurrency 1, on SQLite and on PostgreSQL.
Variants, interleaved round by round, each on a fresh database (file or schema):

  bare        the backend as the graph's checkpointer (LangGraph's durability="async")
  every       SmartCheckpointer(backend, EveryStep())
  events      SmartCheckpointer(backend, OnEvents())      (the default)
  periodic    SmartCheckpointer(backend, Periodic(1.0))
  hybrid      SmartCheckpointer(backend, Hybrid(0.5, 5))

Per turn: store calls that write (a batch counts one) and all store calls (reads too): each is
one database round trip (a native `write_batch`: one transaction, pipelined). Then checkpoints/s,
turns/s and p50/p99 per turn. Run: `python benchmarks/bench_smart.py [--backend sqlite|postgres|all]
[--quick] [--json PATH]`.

`--json PATH` also writes the numbers (`figures.py` draws the store round trips from them):

  {"benchmark": "smart", "command": str, "machine": {...}, "versions": {...},
   "policies": {variant: "SmartCheckpointer(..., EveryStep())", ...},
   "backends": {"sqlite" | "postgres": {
       "threads": int, "turns": int, "rounds": int, "latency_ms": float,
       "variants": {variant: {"writes_per_turn", "calls_per_turn", "cpu_ms": mean over rounds;
                              "turns_per_s", "checkpoints_per_s", "p50_ms", "p99_ms",
                              "checkpoints": of the round with the most turns/s}}}}}

Variants keep the order above; "writes_per_turn" counts the store calls that write,
"calls_per_turn" all of them (each one round trip).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_backends import build_graph, question
from jsonout import header, write
from places import drop

from langgraph_ckpt_ext import (
    EveryStep,
    Hybrid,
    OnEvents,
    Periodic,
    PostgresCheckpointer,
    SmartCheckpointer,
    SQLiteCheckpointer,
)
from langgraph_ckpt_ext.core.saver import StoreCheckpointer

_WRITES = {"write_checkpoint", "write_writes", "write_batch"}


class Counting:
    """Forwards to a store, counting its calls."""

    def __init__(self, store: Any) -> None:
        self._inner = store
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if not callable(attr) or name.startswith("_"):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            return attr(*args, **kwargs)

        return call


class LatencyProxy:
    """A loopback TCP proxy that delays every chunk by `delay` seconds each way: a database
    one network hop away (`--latency`), without leaving this machine. It runs in a process of
    its own (`start`), so its work takes no time from the event loop being measured."""

    def __init__(self, host: str, port: int, delay: float) -> None:
        self.target, self.delay = (host, port), delay
        self.process: subprocess.Popen[str] | None = None

    def start(self) -> int:
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--serve-proxy",
             f"{self.target[0]}:{self.target[1]}:{self.delay}"],
            stdout=subprocess.PIPE, text=True,
        )
        assert self.process.stdout is not None
        return int(self.process.stdout.readline())

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait()

    async def serve(self) -> None:
        server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        print(server.sockets[0].getsockname()[1], flush=True)
        await server.serve_forever()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # Chunks keep their order and each leaves `delay` after it came (a link's latency,
        # not a stop-and-wait): a reader task stamps them, a writer task releases them.
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        loop = asyncio.get_running_loop()

        async def release() -> None:
            while True:
                at, data = await queue.get()
                if not data:
                    break
                await asyncio.sleep(max(0.0, at - loop.time()))
                writer.write(data)
                await writer.drain()

        sender = asyncio.create_task(release())
        try:
            while data := await reader.read(65536):
                queue.put_nowait((loop.time() + self.delay, data))
        except ConnectionError:
            pass
        finally:
            queue.put_nowait((0.0, b""))
            with contextlib.suppress(ConnectionError):
                await sender
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))


# (policy, SmartCheckpointer options); "events-ro": the same events, told that the agent's one
# tool ("search") has no side effects, so its calls need not be saved before it runs.
VARIANTS: dict[str, tuple[Any, dict[str, Any]]] = {
    "bare": (None, {}),
    "every": (EveryStep(), {}),
    "events": (OnEvents(), {}),
    "events-ro": (OnEvents(), {"side_effect_tools": ["send_email"]}),
    "periodic": (Periodic(1.0), {}),
    "hybrid": (Hybrid(min_interval=0.5, max_interval=5.0), {}),
}
POLICIES = {
    "bare": "the backend alone",
    "every": "EveryStep()",
    "events": "OnEvents()",
    "events-ro": "OnEvents(), side_effect_tools=[send_email]",
    "periodic": "Periodic(1.0)",
    "hybrid": "Hybrid(0.5, 5.0)",
}


async def run_variant(
    backend: str, variant: str, args: argparse.Namespace, tmp: Path
) -> dict[str, float]:
    schema = f"lgxsmart_{uuid.uuid4().hex[:8]}"
    if backend == "sqlite":
        inner: StoreCheckpointer = SQLiteCheckpointer(tmp / f"{uuid.uuid4().hex}.db")
    else:
        inner = PostgresCheckpointer(args.dsn, schema=schema, setup=False)
        await inner.asetup()
    counting = Counting(inner._store)
    inner._store = counting  # type: ignore[assignment]
    policy, options = VARIANTS[variant]
    saver: Any = inner if policy is None else SmartCheckpointer(inner, policy, **options)
    graph = build_graph(saver)
    lat: list[float] = []
    t0, cpu0 = time.perf_counter(), time.process_time()
    try:
        for t in range(args.threads):
            tid = f"thread-{t}"
            for k in range(args.turns):
                human = question(tid, k)
                s = time.perf_counter()
                await graph.ainvoke({"messages": [human]}, {"configurable": {"thread_id": tid}})
                lat.append(time.perf_counter() - s)
        if policy is not None:
            await saver.aflush()
        seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        calls = Counter(counting.calls)  # before the count below reads the threads back
        checkpoints = 0
        for t in range(args.threads):
            config = {"configurable": {"thread_id": f"thread-{t}"}}
            checkpoints += len([c async for c in inner.alist(config)])  # type: ignore[arg-type]
    finally:
        if policy is not None:
            await saver.aclose()
        await inner.aclose()
        if backend == "postgres":
            await drop(backend, schema, args)
    turns = args.threads * args.turns
    writes = sum(n for name, n in calls.items() if name in _WRITES)
    lat.sort()
    return {
        "writes_per_turn": writes / turns,
        "calls_per_turn": sum(calls.values()) / turns,
        "turns_per_s": turns / seconds,
        "cpu_ms": 1000 * cpu / turns,
        "checkpoints_per_s": checkpoints / seconds,
        "checkpoints": checkpoints,
        "p50_ms": 1000 * lat[len(lat) // 2],
        "p99_ms": 1000 * lat[min(len(lat) - 1, int(len(lat) * 0.99))],
    }


async def round_trip(dsn: str) -> float:
    """Milliseconds of one `SELECT 1` round trip to `dsn` (p50 of 30)."""
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        times = []
        for _ in range(30):
            t = time.perf_counter()
            await conn.fetchval("SELECT 1")
            times.append(1000 * (time.perf_counter() - t))
    finally:
        await conn.close()
    return statistics.median(times)


async def run(backend: str, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Print the table of one backend; return its row per variant (as `--json` writes it)."""
    results: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
    proxy = None
    where = ""
    if backend == "postgres" and args.latency > 0:
        from urllib.parse import urlsplit, urlunsplit

        url = urlsplit(args.dsn)
        proxy = LatencyProxy(url.hostname or "127.0.0.1", url.port or 5432, args.latency / 1000)
        port = proxy.start()
        netloc = f"{url.username}@127.0.0.1:{port}" if url.username else f"127.0.0.1:{port}"
        args = argparse.Namespace(**{**vars(args), "dsn": urlunsplit(url._replace(netloc=netloc))})
        rtt = await round_trip(args.dsn)
        # asyncio sleeps in whole milliseconds (epoll), so the delay is at least ~1 ms a way:
        # the measured round trip says what the run got.
        where = (f", through a proxy adding {args.latency} ms each way "
                 f"(SELECT 1 round trip: {rtt:.2f} ms p50)")
    try:
        with tempfile.TemporaryDirectory() as d:
            for _ in range(args.rounds):
                for variant in VARIANTS:
                    results[variant].append(await run_variant(backend, variant, args, Path(d)))
    finally:
        if proxy is not None:
            proxy.stop()
    print(f"\n[{backend}{where}] {args.threads} threads x {args.turns} turns, best of "
          f"{args.rounds} interleaved rounds (store calls: mean)")
    head = (f"{'variant':<9} {'writes/turn':>11} {'calls/turn':>10} "
            f"{'turns/s':>8} {'ckpt/s':>7} {'p50 ms':>7} {'p99 ms':>7} {'cpu ms':>7} {'ckpts':>6}")
    print(head)
    best: dict[str, dict[str, float]] = {}
    for variant, rows in results.items():
        b = max(rows, key=lambda r: r["turns_per_s"])
        mean = {k: statistics.fmean(r[k] for r in rows)
                for k in ("writes_per_turn", "calls_per_turn", "cpu_ms")}
        best[variant] = {**b, **mean}
        print(f"{variant:<9} {mean['writes_per_turn']:>11.2f} {mean['calls_per_turn']:>10.2f} "
              f"{b['turns_per_s']:>8.1f} "
              f"{b['checkpoints_per_s']:>7.0f} {b['p50_ms']:>7.2f} {b['p99_ms']:>7.2f} "
              f"{mean['cpu_ms']:>7.2f} "
              f"{int(b['checkpoints']):>6}")
    for name in ("events", "events-ro"):
        ev = best[name]
        for ref in ("bare", "every"):
            base = best[ref]
            print(f"{name} vs {ref}: store calls per turn "
                  f"{base['calls_per_turn'] / ev['calls_per_turn']:.2f}x fewer, writes "
                  f"{base['writes_per_turn'] / ev['writes_per_turn']:.2f}x fewer, turns/s "
                  f"{ev['turns_per_s'] / base['turns_per_s']:.2f}x")
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--backend", default="all", choices=["sqlite", "postgres", "all"])
    p.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/test")
    p.add_argument("--threads", type=int, default=10)
    p.add_argument("--turns", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--latency", type=float, default=0.0,
                   help="PostgreSQL only: ms added each way by a loopback proxy (a remote DB)")
    p.add_argument("--quick", action="store_true", help="4 threads x 8 turns, 2 rounds")
    p.add_argument("--json", type=Path, help="also write the numbers to this JSON file")
    p.add_argument("--serve-proxy", help=argparse.SUPPRESS)  # HOST:PORT:DELAY, for --latency
    args = p.parse_args()
    if args.serve_proxy:
        host, port, delay = args.serve_proxy.rsplit(":", 2)
        asyncio.run(LatencyProxy(host, int(port), float(delay)).serve())
        return
    if args.quick:
        args.threads, args.turns, args.rounds = 4, 8, 2
    out: dict[str, Any] = {**header("smart"), "policies": POLICIES, "backends": {}}
    for backend in (["sqlite", "postgres"] if args.backend == "all" else [args.backend]):
        best = asyncio.run(run(backend, args))
        out["backends"][backend] = {
            "threads": args.threads, "turns": args.turns, "rounds": args.rounds,
            "latency_ms": args.latency if backend == "postgres" else 0.0, "variants": best}
    if args.json:
        write(args.json, out)


if __name__ == "__main__":
    main()
