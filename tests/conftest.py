"""Shared fixtures: every test runs on each backend, against real storage."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import uuid
from collections.abc import Callable, Coroutine, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from langgraph_ckpt_ext import InMemoryCheckpointer, SQLiteCheckpointer
from langgraph_ckpt_ext.core.saver import StoreCheckpointer

BACKENDS = ["memory", "sqlite", "sqlite-memory", "postgres", "redis", "redis-cluster"]
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
            for key in client.scan_iter(match=f"{prefix}:*", count=1000):
                n += client.delete(key)
    finally:
        client.close()
    return n


def redis_client_for(cp: Any) -> Any:
    """A sync client of the server (or cluster) a test's Redis saver uses."""
    import redis
    from redis.cluster import RedisCluster

    if cp.store._cluster:
        return RedisCluster.from_url(cp.test_url)
    return redis.Redis.from_url(cp.test_url)


_cluster: contextlib.ExitStack | None = None
_cluster_url: str | None = None


def redis_cluster_url() -> str:
    """A Redis Cluster of three masters for this test process, started on first use (on free
    loopback ports) and stopped when the session ends."""
    global _cluster, _cluster_url
    if _cluster_url is None:
        from .redis_servers import redis_cluster

        _cluster = contextlib.ExitStack()
        _cluster_url = _cluster.enter_context(redis_cluster(3)).url
    return _cluster_url


@pytest.fixture(scope="session", autouse=True)
def _stop_redis_cluster() -> Iterator[None]:
    global _cluster, _cluster_url
    yield
    if _cluster is not None:
        _cluster.close()
        _cluster = _cluster_url = None


def pg_schema() -> str:
    """A schema of its own for one test: tests never see each other's rows."""
    return f"lgx_test_{uuid.uuid4().hex[:12]}"


_END_HOLDERS = """
SELECT pg_terminate_backend(l.pid) FROM pg_locks l
JOIN pg_class c ON c.oid = l.relation JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND l.granted AND l.pid <> pg_backend_pid()"""


def drop_pg_schemas(*schemas: str) -> None:
    import asyncpg

    async def drop() -> None:
        conn = await asyncpg.connect(PG_DSN, server_settings={"lock_timeout": "5s"})
        try:
            for schema in schemas:
                for _ in range(3):
                    try:
                        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
                        break
                    except asyncpg.LockNotAvailableError:
                        # A session a test left behind on purpose (an event loop closed in
                        # the middle of a query) holds locks in this test's own schema.
                        await conn.execute(_END_HOLDERS, schema)
        finally:
            await conn.close()

    asyncio.run(drop())


PERSISTENT = {"sqlite", "postgres", "redis", "redis-cluster"}
"""Backends whose storage outlives the checkpointer object."""


def conf(thread: str, checkpoint_id: str | None = None) -> dict[str, Any]:
    """The config naming a thread (and a checkpoint of it)."""
    c: dict[str, Any] = {"thread_id": thread}
    if checkpoint_id:
        c["checkpoint_id"] = checkpoint_id
    return {"configurable": c}


def reopen_saver(backend: str, cp: StoreCheckpointer, tmp_path: Path, **options: Any
                 ) -> StoreCheckpointer:
    """A new checkpointer over the storage of `cp` (a persistent backend), given `options`."""
    if backend == "postgres":
        options["schema"] = cp.test_schema  # type: ignore[attr-defined]
    elif backend.startswith("redis"):
        options["key_prefix"] = cp.test_prefix  # type: ignore[attr-defined]
    return make_saver(backend, tmp_path, **options)


def make_saver(kind: str, tmp_path: Path, **options: Any) -> StoreCheckpointer:
    if kind == "postgres":
        from langgraph_ckpt_ext import PostgresCheckpointer

        schema = options.pop("schema", None) or pg_schema()
        cp = PostgresCheckpointer(PG_DSN, schema=schema, **options)
        cp.test_schema = schema  # type: ignore[attr-defined]
        return cp
    if kind in ("redis", "redis-cluster"):
        from langgraph_ckpt_ext import RedisCheckpointer

        prefix = options.pop("key_prefix", None) or redis_prefix()
        url = REDIS_URL if kind == "redis" else redis_cluster_url()
        cp = RedisCheckpointer(url, key_prefix=prefix, **options)
        cp.test_prefix = prefix  # type: ignore[attr-defined]
        cp.test_url = url  # type: ignore[attr-defined]
        return cp
    if kind == "memory":
        return InMemoryCheckpointer(**options)
    if kind == "sqlite":
        return SQLiteCheckpointer(tmp_path / "ckpt.db", **options)
    if kind == "sqlite-memory":
        return SQLiteCheckpointer(":memory:", **options)
    raise ValueError(kind)


def as_url(kind: str, cp: Any) -> Any:
    """A test's store as a replica URL (with options), for the replicator process."""
    if kind == "redis":
        return (REDIS_URL, {"key_prefix": cp.test_prefix})
    if kind == "sqlite":
        return f"sqlite:///{cp.test_path}"
    return (PG_DSN, {"schema": cp.test_schema})


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
    # A test's cluster keys go with the cluster at the end of the session.


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
        if not self.thread.is_alive():
            self.loop.close()


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


def plain_or_smart(kind: str, policies: Mapping[str, Any], tmp_path: Path) -> Iterator[Any]:
    """For a fixture: a backend's saver (`kind` a backend name), or a SmartCheckpointer over
    one (`kind` a key of `policies`, "smart-NAME:BACKEND", with the policy it maps to); closed
    and cleaned up after the test."""
    from langgraph_ckpt_ext import SmartCheckpointer

    inner_kind = kind.partition(":")[2] if kind in policies else kind
    inner = make_saver(inner_kind, tmp_path)
    cp = SmartCheckpointer(inner, policies[kind]) if kind in policies else inner
    yield cp
    cp.close()
    if cp is not inner:
        inner.close()
    cleanup(inner_kind, inner)
