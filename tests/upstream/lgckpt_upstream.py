"""LangGraph's own tests on our savers: the `sync_checkpointer` and `async_checkpointer`
fixtures of LangGraph's `tests/conftest.py`, bound instead to the savers named in
`LGCKPT_UPSTREAM_SAVERS` (comma-separated; one test id per saver). `scripts/upstream.sh`
extracts LangGraph's sdist and appends one import of this module to its conftest, so that
these definitions replace LangGraph's there (LangGraph's package is called `tests` too, which
is why this file is imported by its own name and builds savers from our public API alone).

Savers:
- `inmemory` (our InMemoryCheckpointer), `sqlite` (a file), `sqlite-memory`, `postgres`,
  `redis`, `redis-cluster`;
- `smart-<policy>:<backend>`: SmartCheckpointer over a backend, policy `events` (the default),
  `every`, `periodic` (an hour: everything served from the buffer), `hybrid`;
- `replicated-<mode>:<backend>`: ReplicatedCheckpointer over a backend, a SQLite replica, mode
  `async`, `quorum` or `anti_entropy`;
- `langgraph-memory`: LangGraph's own InMemorySaver as its tests use it, the reference (test
  id `memory`, the one LangGraph's stored snapshots are named by).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from langgraph_ckpt_ext import (
    EveryStep,
    Hybrid,
    InMemoryCheckpointer,
    OnEvents,
    Periodic,
    PostgresCheckpointer,
    RedisCheckpointer,
    ReplicatedCheckpointer,
    SmartCheckpointer,
    SQLiteCheckpointer,
)

PG_DSN = os.environ.get("LGCKPT_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("LGCKPT_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
SAVERS = [s.strip() for s in os.environ.get("LGCKPT_UPSTREAM_SAVERS", "sqlite").split(",")
          if s.strip()]
POLICIES = {"events": OnEvents, "every": EveryStep, "periodic": lambda: Periodic(3600),
            "hybrid": lambda: Hybrid(min_interval=0.01, max_interval=0.2)}
REPLICATED = {"async": {}, "quorum": {"quorum": 1},
              "anti_entropy": {"repair_interval": 0.05}}

_HERE = Path(__file__).resolve().parent
PARAMS = [pytest.param(s, id="memory" if s == "langgraph-memory" else s) for s in SAVERS]


class Storage:
    """Where one test's saver keeps its data, and dropping it afterwards. (Names from
    `os.urandom`, never `uuid.uuid4`: LangGraph's tests replace that with a counter.)"""

    def __init__(self) -> None:
        self.schemas: list[str] = []
        self.prefixes: list[tuple[str, str]] = []
        self.directory = Path(tempfile.mkdtemp(prefix="lgckpt-upstream-"))

    def backend(self, kind: str) -> Any:
        """A backend's saver over fresh storage (not yet opened)."""
        if kind == "inmemory":
            return InMemoryCheckpointer()
        if kind == "sqlite":
            return SQLiteCheckpointer(self.directory / f"{os.urandom(4).hex()}.db")
        if kind == "sqlite-memory":
            return SQLiteCheckpointer(":memory:")
        if kind == "postgres":
            schema = f"lgx_up_{os.urandom(6).hex()}"
            self.schemas.append(schema)
            return PostgresCheckpointer(PG_DSN, schema=schema)
        if kind in ("redis", "redis-cluster"):
            url = REDIS_URL if kind == "redis" else _cluster_url()
            prefix = f"lgxup-{os.urandom(6).hex()}"
            self.prefixes.append((url, prefix))
            return RedisCheckpointer(url, key_prefix=prefix)
        raise ValueError(f"unknown backend {kind!r} in LGCKPT_UPSTREAM_SAVERS")

    def saver(self, spec: str) -> tuple[Any, list[Any]]:
        """(the saver a test drives, the backends' savers under it)."""
        wrapper, _, backend = spec.rpartition(":")
        inner = self.backend(backend)
        if not wrapper:
            return inner, [inner]
        kind, _, option = wrapper.partition("-")
        if kind == "smart" and option in POLICIES:
            return SmartCheckpointer(inner, POLICIES[option]()), [inner]
        if kind == "replicated" and option in REPLICATED:
            replica = self.backend("sqlite")
            return (ReplicatedCheckpointer(inner, [replica], consistency=option,
                                           **REPLICATED[option]), [inner, replica])
        raise ValueError(f"unknown saver {spec!r} in LGCKPT_UPSTREAM_SAVERS")

    def drop(self) -> None:
        if self.schemas:
            asyncio.run(_drop_schemas(self.schemas))
        if self.prefixes:
            import redis
            from redis.cluster import RedisCluster

            for url, prefix in self.prefixes:
                client: Any = (RedisCluster.from_url(url) if url != REDIS_URL
                               else redis.Redis.from_url(url))
                with contextlib.closing(client):
                    for key in client.scan_iter(match=f"{prefix}:*", count=1000):
                        client.delete(key)
        for path in sorted(self.directory.rglob("*"), reverse=True):
            path.unlink() if path.is_file() else path.rmdir()
        self.directory.rmdir()


async def _drop_schemas(schemas: list[str]) -> None:
    import asyncpg

    conn = await asyncpg.connect(PG_DSN)
    try:
        for schema in schemas:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()


_cluster: contextlib.ExitStack | None = None
_cluster_address: str | None = None


def _cluster_url() -> str:
    """A Redis Cluster of three masters on loopback ports for this process (our suite's
    helper, loaded by its path), stopped when the process exits."""
    global _cluster, _cluster_address
    if _cluster_address is None:
        spec = importlib.util.spec_from_file_location(
            "lgckpt_redis_servers", _HERE.parent / "support" / "redis_servers.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # its dataclasses look their module up there
        spec.loader.exec_module(module)
        _cluster = contextlib.ExitStack()
        _cluster_address = _cluster.enter_context(module.redis_cluster(3)).url
        import atexit

        atexit.register(_cluster.close)
    return _cluster_address


def _reference() -> Any:
    """LangGraph's InMemorySaver, as LangGraph's tests make it."""
    from tests.conftest_checkpointer import _checkpointer_memory  # LangGraph's conftest

    return _checkpointer_memory()


@pytest.fixture(params=PARAMS)
def sync_checkpointer(request: pytest.FixtureRequest) -> Iterator[Any]:
    if request.param == "langgraph-memory":
        with _reference() as saver:
            yield saver
        return
    storage = Storage()
    try:
        saver, backends = storage.saver(request.param)
        try:
            for b in backends:
                b.setup()
            yield saver
        finally:
            if saver is not backends[0]:
                saver.close()
            for b in backends:
                b.close()
    finally:
        storage.drop()


@pytest.fixture(params=PARAMS)
async def async_checkpointer(request: pytest.FixtureRequest) -> AsyncIterator[Any]:
    if request.param == "langgraph-memory":
        with _reference() as saver:
            yield saver
        return
    storage = Storage()
    try:
        saver, backends = storage.saver(request.param)
        async with contextlib.AsyncExitStack() as stack:
            for b in backends:
                await stack.enter_async_context(b)
            if saver is not backends[0]:
                await stack.enter_async_context(saver)
            yield saver
    finally:
        await asyncio.to_thread(storage.drop)
