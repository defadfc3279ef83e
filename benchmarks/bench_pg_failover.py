"""Benchmark: acknowledged checkpoints lost when a PostgreSQL primary crashes and its streaming
standby is promoted, with asynchronous replication and with `synchronous_commit=remote_apply`.

Per round: a fresh primary and standby (`tests.support.pg_cluster`, fsync on, default
settings but the one compared), WRITERS coroutines putting checkpoints on threads of their own
as fast as they can through one `PostgresCheckpointer` (a multi-host DSN), the primary killed
(`pg_ctl stop -m immediate`) after LOAD seconds of that load, the standby promoted. A put
that returned is acknowledged; the count of acknowledged checkpoints missing on the promoted
standby is the loss. Also printed: the puts per second before the crash, and the seconds from
the kill until the first put succeeds on the new primary. With `--hold S`, the standby
streams through a `tests.support.tcp_link.HeldLink`, held for the last S seconds before the
kill (a lagging standby: on loopback it otherwise keeps up). Run: `python
benchmarks/bench_pg_failover.py [--rounds 3] [--writers 16] [--load 1.0] [--hold 0.5]` (about
15 s a round).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from langgraph.checkpoint.base import empty_checkpoint

from langgraph_ckpt_ext import PostgresCheckpointer
from langgraph_ckpt_ext.core.errors import StoreUnavailableError
from tests.support.pg_cluster import HOST, USER, pg_cluster
from tests.support.tcp_link import HeldLink

MODES = {
    "async replication (synchronous_commit=on)": {},
    "synchronous_commit=remote_apply": {"synchronous_commit": "remote_apply",
                                        "synchronous_standby_names": "*"},
}


async def round_(settings: dict[str, str], writers: int, load: float, hold: float
                 ) -> dict[str, Any]:
    with pg_cluster(fsync=True) as cluster:
        primary = cluster.start_primary(**settings)
        link = HeldLink(primary.port)
        standby = cluster.start_standby(synchronous_standby_names="",
                                        upstream_port=link.port if hold else None)
        await asyncio.to_thread(cluster.wait_streaming)
        hosts = f"{HOST}:{primary.port},{HOST}:{standby.port}"
        url = f"postgresql://{USER}@{hosts}/postgres?target_session_attrs=read-write"
        acked: list[tuple[str, str]] = []
        killed_at: list[float] = []
        back_at: list[float] = []
        async with PostgresCheckpointer.from_conn_string(url, writers="last_wins") as cp:

            async def writer(i: int) -> None:
                config: Any = {"configurable": {"thread_id": f"w{i}", "checkpoint_ns": ""}}
                while not back_at or time.monotonic() < back_at[0] + 0.5:
                    ckpt = empty_checkpoint()
                    try:
                        config = await cp.aput(config, ckpt, {"step": len(acked)}, {})
                    except StoreUnavailableError:
                        await asyncio.sleep(0.05)  # the standby is being promoted
                        continue
                    acked.append((f"w{i}", ckpt["id"]))
                    if killed_at and not back_at:
                        back_at.append(time.monotonic())

            tasks = [asyncio.create_task(writer(i)) for i in range(writers)]
            await asyncio.sleep(load)
            before = len(acked)
            if hold:
                link.hold()
                await asyncio.sleep(hold)
            await asyncio.to_thread(primary.stop, "immediate")
            link.cut()
            killed_at.append(time.monotonic())
            crash_acked = set(acked)
            await asyncio.to_thread(standby.promote)
            await asyncio.gather(*tasks)
        rows = set(tuple(r.split("|")) for r in standby.psql(
            "SELECT thread_id || '|' || checkpoint_id FROM lgx_checkpoints").splitlines())
        lost = [a for a in crash_acked if a not in rows]
        return {"acked_before_kill": len(crash_acked), "acked_during_hold": len(
            crash_acked) - before, "lost": len(lost),
                "puts_per_s": round(before / load), "recovery_s": round(
                    back_at[0] - killed_at[0], 2) if back_at else None}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--writers", type=int, default=16)
    parser.add_argument("--load", type=float, default=1.0)
    parser.add_argument("--hold", type=float, default=0.0)
    args = parser.parse_args()
    out = {}
    for mode, settings in MODES.items():
        out[mode] = [await round_(settings, args.writers, args.load, args.hold)
                     for _ in range(args.rounds)]
        print(mode, json.dumps(out[mode]), flush=True)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    asyncio.run(main())
