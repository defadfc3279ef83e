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

BACKENDS = ["memory", "sqlite", "sqlite-memory", "postgres"]
PG_DSN = os.environ.get("LGCKPT_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")


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
    if backend == "postgres":
        drop_pg_schemas(cp.test_schema)  # type: ignore[attr-defined]


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
