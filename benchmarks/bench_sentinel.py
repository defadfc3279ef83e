"""What `wait_replicas` costs a put, and how long a failover stops writes, on a throwaway Redis
Sentinel setup (a master, two replicas, three sentinels on loopback ports; see
`tests/support/redis_sentinel.py`). Prints numbers; checks nothing.

    python -m benchmarks.bench_sentinel [--puts 500] [--failovers 3]

1. Put latency: `--puts` checkpoints on one thread through `redis+sentinel://`, without and with
   `wait_replicas=1`, interleaved in rounds; the median and p95 of each.
2. Failover: the master SIGKILLed while a loop puts checkpoints; the seconds from the kill to
   the first put that succeeds on the new master (each failed put retried at once).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

from langgraph.checkpoint.base import empty_checkpoint

from langgraph_ckpt_ext import RedisCheckpointer, StoreUnavailableError
from tests.support.redis_sentinel import redis_sentinel


def config(thread: str, parent: str | None = None) -> dict[str, Any]:
    c: dict[str, Any] = {"thread_id": thread, "checkpoint_ns": ""}
    if parent is not None:
        c["checkpoint_id"] = parent
    return {"configurable": c}


async def put(cp: RedisCheckpointer, thread: str, parent: str | None, n: int) -> str:
    ckpt = empty_checkpoint()
    ckpt["channel_values"] = {"n": n}
    ckpt["channel_versions"] = {"n": n + 1}
    done = await cp.aput(config(thread, parent), ckpt, {"step": n}, {"n": n + 1})
    return str(done["configurable"]["checkpoint_id"])


async def latencies(url: str, puts: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"no wait": [], "wait_replicas=1": []}
    async with RedisCheckpointer.from_conn_string(url, key_prefix="b0") as plain, \
            RedisCheckpointer.from_conn_string(url, key_prefix="b1", wait_replicas=1) as waits:
        heads: dict[str, str | None] = {"no wait": None, "wait_replicas=1": None}
        for n in range(puts):
            for label, cp in (("no wait", plain), ("wait_replicas=1", waits)):
                t = time.perf_counter()
                heads[label] = await put(cp, "t", heads[label], n)
                out[label].append((time.perf_counter() - t) * 1000)
    return out


async def failover(setup: Any) -> float:
    async with RedisCheckpointer.from_conn_string(setup.url, key_prefix="f") as cp:
        head = None
        for n in range(20):
            head = await put(cp, "t", head, n)
        setup.kill_master()
        killed = time.monotonic()
        while True:
            try:
                await put(cp, "t", None, 0)
                return time.monotonic() - killed
            except StoreUnavailableError:
                pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--puts", type=int, default=500)
    ap.add_argument("--failovers", type=int, default=3)
    args = ap.parse_args()
    with redis_sentinel(replicas=2) as setup:
        found = asyncio.run(latencies(setup.url, args.puts))
    for label, ms in found.items():
        ms.sort()
        print(f"put, {label:16} median {statistics.median(ms):.3f} ms, "
              f"p95 {ms[int(len(ms) * 0.95)]:.3f} ms ({len(ms)} puts)")
    for i in range(args.failovers):
        with redis_sentinel(replicas=1) as setup:
            print(f"failover {i + 1}: writes back {asyncio.run(failover(setup)):.2f} s "
                  "after the master was killed")


if __name__ == "__main__":
    main()
