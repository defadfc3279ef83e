"""Where a benchmark puts a fresh store per run, and how it removes it afterwards (a temp SQLite
file, a PostgreSQL schema, a Redis key prefix: never FLUSHDB, the server may be shared)."""

from __future__ import annotations

import argparse
import os
from typing import Any

import asyncpg
import redis.asyncio as aioredis

from langgraph_ckpt_ext import connect
from langgraph_ckpt_ext.core.saver import StoreCheckpointer


def server_options(p: argparse.ArgumentParser) -> None:
    """`--dsn` and `--redis-url`: the servers a run's stores go on (the test suite's, by
    default)."""
    p.add_argument("--dsn", default=os.environ.get(
        "LGCKPT_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test"))
    p.add_argument("--redis-url", default=os.environ.get(
        "LGCKPT_TEST_REDIS_URL", "redis://127.0.0.1:6379/0"))


def open_saver(backend: str, place: str, args: argparse.Namespace, **options: Any) -> StoreCheckpointer:
    """Our checkpointer on `place`: a SQLite path, a PostgreSQL schema or a Redis key prefix."""
    if backend == "sqlite":
        return connect(f"sqlite:///{place}", **options)
    if backend == "postgres":
        return connect(args.dsn, schema=place, **options)
    return connect(args.redis_url, key_prefix=place, **options)


async def drop(backend: str, place: str, args: argparse.Namespace) -> None:
    """Remove what a run stored on a server (a SQLite file goes with its temp directory)."""
    if backend == "postgres":
        conn = await asyncpg.connect(args.dsn)
        try:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{place}" CASCADE')
        finally:
            await conn.close()
    elif backend == "redis":
        client = aioredis.from_url(args.redis_url)
        try:
            keys = [k async for k in client.scan_iter(match=f"{place}:*", count=1000)]
            for i in range(0, len(keys), 500):
                await client.unlink(*keys[i : i + 500])
        finally:
            await client.aclose()
