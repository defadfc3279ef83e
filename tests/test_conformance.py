"""LangGraph's own conformance suite, all eight capabilities, on every backend."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import Capability

from langgraph_ckpt_ext import InMemoryCheckpointer, PostgresCheckpointer, SQLiteCheckpointer

from .conftest import PG_DSN, drop_pg_schemas, pg_schema


@pytest.mark.parametrize(
    "kind", ["memory", "sqlite", "sqlite-memory", "sqlite-sync-ctor", "postgres", "postgres-no-cache"]
)
async def test_conformance_all_capabilities(kind: str, tmp_path: Path) -> None:
    counter = iter(range(100))
    schemas: list[str] = []

    @checkpointer_test(name=f"langgraph-ckpt-ext-{kind}")
    async def factory() -> AsyncIterator[object]:
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
        else:  # the plain constructor, then used from this test's event loop
            cp = SQLiteCheckpointer(tmp_path / f"conf-{next(counter)}.db")
            yield cp
            await cp.aclose()

    try:
        report = await validate(factory)
    finally:
        if schemas:
            await asyncio.to_thread(drop_pg_schemas, *schemas)
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
