"""Benchmark: a replica's lag over a run in which it is killed (SIGKILL) and restarted.

The agent of `bench_backends.py` runs turns one after another (round robin over THREADS threads)
through `ReplicatedCheckpointer(primary, [sqlite, redis], "async")`: the primary a
`PostgresCheckpointer` (a fresh schema), the replicas a `SQLiteCheckpointer` (a temp file) and a
`RedisCheckpointer` on a throwaway `redis-server` this script starts on a free loopback port
(append-only file, `appendfsync always`: what it acknowledged survives the kill). Timeline:

  0 .. BEFORE s           turns run, both replicas keep up
  BEFORE s                the redis-server is SIGKILLed; turns go on, its queue grows
  BEFORE + DOWN s         it is started again on the same port (from its append-only file)
  .. + AFTER s            turns go on; the replica's worker retries (backoff up to 2 s) and
                          catches up
  then                    turns stop, `aflush()`, `repair()`: every thread is compared on each
                          replica with the primary (checkpoint ids and content hashes)

`status()` is sampled every INTERVAL s (default 0.1) from start to the flush's end: per replica
up, queued ops, the oldest unreplicated op's age (the lag), applied, failures. The run caught up
when the flush emptied every queue and the repair found every replica equal to the primary (it
copies what is missing, so the JSON also says what it had to copy).

Run: `python benchmarks/bench_replica_lag.py [--quick] [--json PATH] [--before S] [--down S]
[--after S] [--threads N] [--dsn URL] [--no-aof]`. `--quick`: 1 + 1.5 + 1.5 s. `--no-aof`: the
redis-server keeps nothing, so it comes back empty; the queue still drains (the replica refuses
the rows of threads whose earlier checkpoints it lost, and marks them for repair), and only the
final `repair()` makes it equal again: "caught_up" is then false, and "repair" says what it
copied.

`--json PATH` writes:

  {"benchmark": "replica_lag", "command", "machine", "versions",
   "replicas": ["sqlite", "redis"], "killed": "redis", "aof": bool, "interval_s": float,
   "kill_s": float, "restart_s": float,    # seconds since the start; restart: it answers PING
   "caught_up_s": float | null,            # first sample after the restart with a lag < 0.1 s
   "turns": int, "flushed": bool, "repair": {replica: {"checkpoints_copied", "writes_copied",
   "threads_rebuilt", "threads_failed", "error"}}, "caught_up": bool,
   "samples": [{"t": float, "turns": int, "replicas": {name: {"up", "queued", "lag_s",
                "applied", "failures", "needs_repair"}}}]}
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import redis
from langchain_core.messages import HumanMessage

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_backends import build_graph, text
from jsonout import header, write
from places import drop

from langgraph_ckpt_ext import (
    PostgresCheckpointer,
    RedisCheckpointer,
    ReplicatedCheckpointer,
    SQLiteCheckpointer,
)

REPLICAS = ("sqlite", "redis")
CAUGHT_UP_LAG = 0.1  # s: a lag under this after the restart counts as caught up


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """A redis-server of our own on a loopback port, its data in `directory`."""

    def __init__(self, directory: Path, port: int, aof: bool = True) -> None:
        self.directory, self.port, self.aof = directory, port, aof
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 20.0) -> None:
        """Start it and return once it answers PING (with its append-only file loaded)."""
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
             "--dir", str(self.directory), "--save", "", "--appendonly", "yes" if self.aof else "no",
             "--appendfsync", "always", "--protected-mode", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        deadline = time.monotonic() + timeout
        try:
            while True:
                if self.process.poll() is not None:
                    raise RuntimeError(f"redis-server on port {self.port} exited "
                                       f"({self.process.returncode})")
                with contextlib.suppress(redis.ConnectionError, redis.BusyLoadingError):
                    if client.ping():
                        return
                if time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server on port {self.port}: no PONG in {timeout} s")
                time.sleep(0.02)  # polling for readiness, not a synchronization
        finally:
            client.close()

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def sample(t: float, turns: int, wrapper: ReplicatedCheckpointer) -> dict[str, Any]:
    return {"t": round(t, 3), "turns": turns, "replicas": {
        r.name: {"up": r.up, "queued": r.queued, "lag_s": round(r.oldest_unreplicated_age, 4),
                 "applied": r.applied, "failures": r.failures, "needs_repair": r.needs_repair}
        for r in wrapper.status().replicas}}


async def lag_run(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    schema = f"lgxlag_{uuid.uuid4().hex[:10]}"
    server = RedisServer(tmp, free_port(), aof=not args.no_aof)
    server.start()
    opened: list[Any] = []
    wrapper: ReplicatedCheckpointer | None = None
    try:
        primary = PostgresCheckpointer(args.dsn, schema=schema, setup=False)
        opened.append(primary)
        await primary.asetup()
        sqlite = SQLiteCheckpointer(tmp / "replica.db")
        opened.append(sqlite)
        await sqlite.asetup()
        replica = RedisCheckpointer(server.url, key_prefix="lag")
        opened.append(replica)
        await replica.asetup()
        wrapper = ReplicatedCheckpointer(primary, [sqlite, replica], "async", names=list(REPLICAS))
        graph = build_graph(wrapper)
        samples: list[dict[str, Any]] = []
        marks: dict[str, float] = {}
        turns = 0
        done = asyncio.Event()
        t0 = time.perf_counter()

        async def drive() -> None:
            nonlocal turns
            end = args.before + args.down + args.after
            while time.perf_counter() - t0 < end:
                tid = f"thread-{turns % args.threads}"
                human = HumanMessage(content=text(f"question {tid}/{turns}"),
                                     id=f"{tid}/{turns}:human")
                await graph.ainvoke({"messages": [human]}, {"configurable": {"thread_id": tid}})
                turns += 1

        async def chaos() -> None:
            await asyncio.sleep(args.before)  # the scenario's clock, not a synchronization
            await asyncio.to_thread(server.kill)
            marks["kill"] = time.perf_counter() - t0
            await asyncio.sleep(args.down)
            await asyncio.to_thread(server.start)
            marks["restart"] = time.perf_counter() - t0

        async def watch() -> None:
            while not done.is_set():
                samples.append(sample(time.perf_counter() - t0, turns, wrapper))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(done.wait(), args.interval)
            samples.append(sample(time.perf_counter() - t0, turns, wrapper))

        watcher = asyncio.create_task(watch())
        await asyncio.gather(drive(), chaos())
        flushed = await wrapper.aflush(timeout=120)
        done.set()
        await watcher
        report = await wrapper.arepair()
        repair = {r.name: {"checkpoints_copied": r.checkpoints_copied,
                           "writes_copied": r.writes_copied,
                           "threads_rebuilt": len(r.threads_rebuilt),
                           "threads_failed": len(r.threads_failed), "error": r.error}
                  for r in report.replicas}
    finally:
        if wrapper is not None:
            with contextlib.suppress(Exception):
                await wrapper.aclose()
        for s in reversed(opened):
            with contextlib.suppress(Exception):
                await s.aclose()
        with contextlib.suppress(Exception):
            await drop("postgres", schema, args)
        server.kill()
    caught_up_s = next((s["t"] for s in samples if s["t"] >= marks["restart"]
                        and s["replicas"]["redis"]["lag_s"] < CAUGHT_UP_LAG), None)
    return {"replicas": list(REPLICAS), "killed": "redis", "aof": not args.no_aof,
            "interval_s": args.interval,
            "kill_s": round(marks["kill"], 3), "restart_s": round(marks["restart"], 3),
            "caught_up_s": caught_up_s, "turns": turns, "flushed": flushed, "repair": repair,
            "caught_up": flushed and report.clean, "samples": samples}


def summary(out: dict[str, Any]) -> str:
    peak = max(s["replicas"]["redis"]["queued"] for s in out["samples"])
    lag = max(s["replicas"]["redis"]["lag_s"] for s in out["samples"])
    after = (f"its lag under {CAUGHT_UP_LAG} s again at {out['caught_up_s']:.1f} s"
             if out["caught_up_s"] is not None else "its lag stayed up until the turns ended")
    copied = {n: r for n, r in out["repair"].items()
              if r["checkpoints_copied"] or r["writes_copied"] or r["threads_rebuilt"]
              or r["threads_failed"] or r["error"]}
    return (f"{out['turns']} turns; redis killed at {out['kill_s']:.1f} s, answering again at "
            f"{out['restart_s']:.1f} s, {after}; peak queue {peak} ops, peak lag {lag:.2f} s; "
            f"flush {'emptied every queue' if out['flushed'] else 'TIMED OUT'}; repair after it: "
            + ("every replica already equal to the primary" if not copied else f"copied {copied}")
            + f"\ncaught up: {'YES' if out['caught_up'] else 'NO'}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--dsn", default=os.environ.get(
        "LGCKPT_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test"))
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--before", type=float, default=4.0, help="s of turns before the kill")
    p.add_argument("--down", type=float, default=5.0, help="s the replica stays down")
    p.add_argument("--after", type=float, default=6.0, help="s of turns after the restart")
    p.add_argument("--interval", type=float, default=0.1, help="s between status() samples")
    p.add_argument("--quick", action="store_true", help="1 + 1.5 + 1.5 s")
    p.add_argument("--json", type=Path, help="also write the timeline to this JSON file")
    p.add_argument("--no-aof", action="store_true",
                   help="no append-only file: the replica comes back empty (repair needed)")
    args = p.parse_args()
    if args.quick:
        args.before, args.down, args.after = 1.0, 1.5, 1.5
    with tempfile.TemporaryDirectory(prefix="lgxlag_") as d:
        out = {**header("replica_lag"), **asyncio.run(lag_run(args, Path(d)))}
    print(summary(out))
    if args.json:
        write(args.json, out)


if __name__ == "__main__":
    main()
