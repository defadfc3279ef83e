"""LangGraph's own conformance suite, all eight capabilities, on every backend."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aredis
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import Capability

from langgraph_ckpt_ext import (
    InMemoryCheckpointer,
    Periodic,
    PostgresCheckpointer,
    RedisCheckpointer,
    ReplicatedCheckpointer,
    SmartCheckpointer,
    SQLiteCheckpointer,
)

from .conftest import (
    PG_DSN,
    REDIS_URL,
    drop_pg_schemas,
    drop_redis_prefixes,
    pg_schema,
    redis_cluster_url,
    redis_prefix,
)


@pytest.mark.parametrize(
    "kind",
    [
        "memory", "sqlite", "sqlite-memory", "sqlite-sync-ctor", "postgres", "postgres-no-cache",
        "redis", "redis-client", "redis-ttl", "redis-cluster",
        # SmartCheckpointer around each backend: its default policy (events), and one that
        # keeps everything buffered until the test ends (reads served from the buffer)
        "smart:memory", "smart:sqlite", "smart:postgres", "smart:redis",
        "smart-buffered:memory", "smart-buffered:sqlite", "smart-buffered:postgres",
        "smart-buffered:redis",
        # ReplicatedCheckpointer: a PostgreSQL primary, a Redis and a SQLite replica, in each
        # consistency mode
        "replicated-async", "replicated-quorum", "replicated-anti_entropy",
    ],
)
async def test_conformance_all_capabilities(kind: str, tmp_path: Path) -> None:
    counter = iter(range(100))
    schemas: list[str] = []
    prefixes: list[str] = []

    @checkpointer_test(name=f"langgraph-ckpt-ext-{kind}")
    async def factory() -> AsyncIterator[object]:
        if kind.startswith("smart"):
            wrapper, _, inner_kind = kind.partition(":")
            policy = Periodic(3600) if wrapper == "smart-buffered" else None
            async for inner in backend_factory(inner_kind):
                async with SmartCheckpointer(inner, policy) as cp:
                    yield cp
        elif kind.startswith("replicated"):
            async for cp in replicated_factory(kind.partition("-")[2]):
                yield cp
        else:
            async for cp in backend_factory(kind):
                yield cp

    async def replicated_factory(mode: str) -> AsyncIterator[object]:
        options = {"quorum": 2} if mode == "quorum" else (
            {"repair_interval": 0.2} if mode == "anti_entropy" else {})
        async for primary in backend_factory("postgres"):
            async for redis_replica in backend_factory("redis"):
                async for sqlite_replica in backend_factory("sqlite"):
                    async with ReplicatedCheckpointer(
                        primary, [redis_replica, sqlite_replica], mode, **options  # type: ignore[arg-type]
                    ) as cp:
                        yield cp
                        # every test's checkpoints and writes reached both replicas
                        assert await cp.aflush(30)
                        report = await cp.arepair()
                        assert report.clean, report.summary()

    async def backend_factory(kind: str) -> AsyncIterator[object]:
        if kind == "memory":
            yield InMemoryCheckpointer()
        elif kind == "sqlite":
            path = tmp_path / f"conf-{next(counter)}.db"
            async with SQLiteCheckpointer.from_conn_string(path) as cp:
                yield cp
        elif kind == "sqlite-memory":
            async with SQLiteCheckpointer.from_conn_string(":memory:") as cp:
                yield cp
        elif kind.startswith("postgres"):
            schema = pg_schema()
            schemas.append(schema)
            options = {"statement_cache_size": 0} if kind == "postgres-no-cache" else {}
            async with PostgresCheckpointer.from_conn_string(PG_DSN, schema=schema, **options) as cp:
                yield cp
        elif kind in ("redis", "redis-ttl", "redis-cluster"):
            prefixes.append(redis_prefix())
            ttl = 600 if kind == "redis-ttl" else None
            url = redis_cluster_url() if kind == "redis-cluster" else REDIS_URL
            async with RedisCheckpointer.from_conn_string(
                url, key_prefix=prefixes[-1], ttl=ttl
            ) as cp:
                yield cp
        elif kind == "redis-client":  # a client the caller owns
            prefixes.append(redis_prefix())
            client = aredis.Redis.from_url(REDIS_URL)
            cp = RedisCheckpointer(client, key_prefix=prefixes[-1])
            await cp.asetup()
            yield cp
            await cp.aclose()
            await client.aclose()
        else:  # the plain constructor, then used from this test's event loop
            cp = SQLiteCheckpointer(tmp_path / f"conf-{next(counter)}.db")
            yield cp
            await cp.aclose()

    try:
        report = await validate(factory)
    finally:
        if schemas:
            await asyncio.to_thread(drop_pg_schemas, *schemas)
        if prefixes and kind != "redis-cluster":
            await asyncio.to_thread(drop_redis_prefixes, *prefixes)
    counts = {
        cap: (res.tests_passed, res.tests_failed) for cap, res in report.results.items()
    }
    print(f"conformance {kind}: {counts}")
    assert set(report.results) == {c.value for c in Capability}
    for cap, res in report.results.items():
        assert res.detected, f"{cap} not detected"
        assert res.passed, f"{cap} failed: {res.failures}"
        assert res.tests_failed == 0 and res.tests_passed > 0
    assert sum(p for p, _ in counts.values()) == 81
