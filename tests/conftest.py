"""Shared fixtures: every test runs on each backend, against real storage."""

from __future__ import annotations

import asyncio
import os
import threading
import uuid
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest

from langgraph_ckpt_ext import InMemoryCheckpointer, SQLiteCheckpointer
from langgraph_ckpt_ext.core.saver import StoreCheckpointer

BACKENDS = ["memory", "sqlite", "sqlite-memory", "postgres", "redis"]
PG_DSN = os.environ.get("LGCKPT_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("LGCKPT_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def redis_prefix() -> str:
    """A key prefix of its own for one test, on the shared server."""
    return f"lgxtest-{uuid.uuid4().hex[:12]}"


def drop_redis_prefixes(*prefixes: str, url: str = REDIS_URL) -> int:
    """Delete every key under these prefixes (tests only: SCAN is fine here); how many."""
    import redis

    client = redis.Redis.from_url(url)
    n = 0
    try:
        for prefix in prefixes:
            batch = list(client.scan_iter(match=f"{prefix}:*", count=1000))
            for i in range(0, len(batch), 500):
                n += client.delete(*batch[i : i + 500])
    finally:
        client.close()
    return n


def pg_schema() -> str:
    """A schema of its own for one test: tests never see each other's rows."""
    return f"lgx_test_{uuid.uuid4().hex[:12]}"


def drop_pg_schemas(*schemas: str) -> None:
    import asyncpg

    async def drop() -> None:
        conn = await asyncpg.connect(PG_DSN)
        try:
            for schema in schemas:
                await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        finally:
            await conn.close()

    asyncio.run(drop())


def make_saver(kind: str, tmp_path: Path, **options: Any) -> StoreCheckpointer:
    if kind == "postgres":
        from langgraph_ckpt_ext import PostgresCheckpointer

        schema = options.pop("schema", None) or pg_schema()
        cp = PostgresCheckpointer(PG_DSN, schema=schema, **options)
        cp.test_schema = schema  # type: ignore[attr-defined]
        return cp
    if kind == "redis":
        from langgraph_ckpt_ext import RedisCheckpointer

        prefix = options.pop("key_prefix", None) or redis_prefix()
        cp = RedisCheckpointer(REDIS_URL, key_prefix=prefix, **options)
        cp.test_prefix = prefix  # type: ignore[attr-defined]
        return cp
    if kind == "memory":
        return InMemoryCheckpointer(**options)
    if kind == "sqlite":
        return SQLiteCheckpointer(tmp_path / "ckpt.db", **options)
    if kind == "sqlite-memory":
        return SQLiteCheckpointer(":memory:", **options)
    raise ValueError(kind)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def saver(backend: str, tmp_path: Path) -> Iterator[StoreCheckpointer]:
    cp = make_saver(backend, tmp_path)
    yield cp
    cp.close()
    cleanup(backend, cp)


def cleanup(backend: str, cp: StoreCheckpointer) -> None:
    """Drop what a test's saver stored on a shared server."""
    if backend == "postgres":
        drop_pg_schemas(cp.test_schema)  # type: ignore[attr-defined]
    elif backend == "redis":
        drop_redis_prefixes(cp.test_prefix)  # type: ignore[attr-defined]


class LoopThread:
    """An event loop in a thread of its own, for driving async graph calls from sync tests."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=120)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.fixture
def loop_thread() -> Iterator[LoopThread]:
    lt = LoopThread()
    yield lt
    lt.stop()


def in_running_loop(fn: Callable[[], Any]) -> Any:
    """Call `fn` (which makes sync calls) from a thread whose event loop is running."""

    async def main() -> Any:
        assert asyncio.get_running_loop().is_running()
        return fn()

    return asyncio.run(main())
