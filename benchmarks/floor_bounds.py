"""The least any durable checkpointer can cost: lines `bound-*` of `bench_floor.py`.

`BoundSaver` is LangGraph's own `InMemorySaver` (its serialization of the changed channels,
the checkpoint, the metadata and the writes; its reads from memory) plus the smallest durable
write imaginable after each `aput` and `aput_writes`: the bytes `InMemorySaver` made, joined
into ONE value, stored as ONE row or key in ONE statement committed on its own. No schema
beyond a key and a value, no index, no read from the store, no check of anything, nothing
kept for history, a listing or a migration. It cannot serve a second process: it is not a
checkpointer to use, only the line under which no real one can go on the same machine, since
every real one does at least this work per call (LangGraph's calls, its serialization, one
durable statement with its commit) and usually more.

With the suffix `-free` (`bound-sqlite-free`, `bound-none-free`) serialization is taken away
as well: the saver holds references to LangGraph's own objects (no copy, no bytes) and the
sink stores only the call's key. That is the cost of LangGraph's calls into a saver plus one
commit per call, the least that any store with any serializer could reach, however clever.

Sinks (each stores every call before the call returns, as `durability="async"` expects):

  none           nothing stored (with `-free`: LangGraph's own cost of handing over every
                 checkpoint)

  sqlite         stdlib `sqlite3`, WAL, `synchronous=FULL`, the INSERT and its commit on the
                 event loop's thread (the loop blocked for the fsync, no thread hop)
  sqlite-thread  the same on one dedicated thread (one hop per call, as any non-blocking
                 SQLite saver needs)
  postgres       asyncpg, one INSERT per call in autocommit (synchronous_commit as the
                 server has it), a pool for concurrent calls
  redis          redis-py with hiredis, one SET per call (durability as the server is set up)
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import sqlite3
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import asyncpg
import redis.asyncio as aioredis
from langgraph.checkpoint.memory import InMemorySaver

Sink = Callable[[str, bytes], Awaitable[None]]


def _key(config: Any, *more: str) -> str:
    c = config["configurable"]
    return "\x1f".join((c["thread_id"], c.get("checkpoint_ns", ""), *more))


class _References:
    """A serde that keeps the object itself: serialization at no cost (for `-free`)."""

    def dumps_typed(self, obj: Any) -> tuple[str, Any]:
        return "ref", obj

    def loads_typed(self, data: tuple[str, Any]) -> Any:
        return data[1]


class BoundSaver(InMemorySaver):
    """`InMemorySaver` that also stores each call's bytes durably through `sink`."""

    def __init__(self, sink: Sink, *, free: bool = False) -> None:
        super().__init__()
        self._sink = sink
        self._free = free
        if free:
            self.serde = _References()  # type: ignore[assignment]

    async def aput(self, config: Any, checkpoint: Any, metadata: Any,
                   new_versions: Any) -> Any:
        out = self.put(config, checkpoint, metadata, new_versions)
        c = out["configurable"]
        thread_id, ns, cid = c["thread_id"], c["checkpoint_ns"], c["checkpoint_id"]
        if self._free:
            await self._sink(_key(out, cid), b"")
            return out
        saved, meta, _ = self.storage[thread_id][ns][cid]
        parts = [saved[1], meta[1]]
        parts += [self.blobs[(thread_id, ns, k, v)][1] for k, v in new_versions.items()]
        await self._sink(_key(out, cid), b"".join(parts))
        return out

    async def aput_writes(self, config: Any, writes: Sequence[tuple[str, Any]], task_id: str,
                          task_path: str = "") -> None:
        self.put_writes(config, writes, task_id, task_path)
        c = config["configurable"]
        if self._free:
            await self._sink(_key(config, c["checkpoint_id"], task_id), b"")
            return
        held = self.writes[(c["thread_id"], c.get("checkpoint_ns", ""), c["checkpoint_id"])]
        value = b"".join(w[2][1] for (tid, _), w in held.items() if tid == task_id)
        await self._sink(_key(config, c["checkpoint_id"], task_id), value)


class Opened:
    """A sink and how to close it."""

    def __init__(self, sink: Sink, close: Callable[[], Awaitable[None]]) -> None:
        self.sink, self.close = sink, close


def _sqlite_conn(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE IF NOT EXISTS r (k TEXT, v BLOB)")
    return conn


async def open_sink(kind: str, *, path: Path, dsn: str, redis_url: str, place: str) -> Opened:
    """The sink `kind` on a fresh place (a SQLite file, a PostgreSQL table, a key prefix)."""
    if kind == "none":
        async def nothing(key: str, value: bytes) -> None:
            return None

        async def close_nothing() -> None:
            return None

        return Opened(nothing, close_nothing)
    if kind in ("sqlite", "sqlite-thread"):
        conn = _sqlite_conn(path)

        def store(key: str, value: bytes) -> None:
            conn.execute("BEGIN")
            conn.execute("INSERT INTO r VALUES (?, ?)", (key, value))
            conn.execute("COMMIT")

        if kind == "sqlite":
            async def inline(key: str, value: bytes) -> None:
                store(key, value)

            async def close_inline() -> None:
                conn.close()

            return Opened(inline, close_inline)
        pool = concurrent.futures.ThreadPoolExecutor(1)

        async def hop(key: str, value: bytes) -> None:
            await asyncio.get_running_loop().run_in_executor(pool, store, key, value)

        async def close_thread() -> None:
            pool.shutdown()
            conn.close()

        return Opened(hop, close_thread)
    if kind == "postgres":
        pg = await asyncpg.create_pool(dsn, min_size=1, max_size=16)
        table = f'"{place}"'
        await pg.execute(f"CREATE TABLE {table} (k text, v bytea)")

        async def insert(key: str, value: bytes) -> None:
            await pg.execute(f"INSERT INTO {table} VALUES ($1, $2)", key, value)

        async def close_pg() -> None:
            await pg.execute(f"DROP TABLE IF EXISTS {table}")
            await pg.close()

        return Opened(insert, close_pg)
    if kind == "redis":
        client = aioredis.from_url(redis_url)

        async def put(key: str, value: bytes) -> None:
            await client.set(f"{place}:{key}", value)

        async def close_redis() -> None:
            keys = [k async for k in client.scan_iter(match=f"{place}:*", count=1000)]
            for i in range(0, len(keys), 500):
                await client.unlink(*keys[i : i + 500])
            await client.aclose()

        return Opened(put, close_redis)
    raise ValueError(f"no bound sink {kind!r}")
