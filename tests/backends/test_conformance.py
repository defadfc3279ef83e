"""LangGraph's own conformance suite, all eight capabilities, on every backend."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import Capability

from langgraph_ckpt_ext import Periodic
from tests.support.savers import asaver, param, params

# kind -> the backend, how its saver is made and its options (see `asaver`)
BACKEND_KINDS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "memory": ("memory", "from_conn_string", {}),
    "sqlite": ("sqlite", "from_conn_string", {}),
    "sqlite-memory": ("sqlite-memory", "from_conn_string", {}),
    # the plain constructor, then used from this test's event loop
    "sqlite-sync-ctor": ("sqlite", "init", {}),
    "postgres": ("postgres", "from_conn_string", {}),
    "postgres-no-cache": ("postgres", "from_conn_string", {"statement_cache_size": 0}),
    "redis": ("redis", "from_conn_string", {"ttl": None}),
    "redis-client": ("redis", "client", {}),  # a client the caller owns
    "redis-ttl": ("redis", "from_conn_string", {"ttl": 600}),
    "redis-cluster": ("redis-cluster", "from_conn_string", {"ttl": None}),
}
REPLICAS = ["redis", "sqlite"]  # a PostgreSQL primary's, in each consistency mode


@pytest.mark.parametrize(
    "kind",
    [
        *params(list(BACKEND_KINDS)),
        # SmartCheckpointer around each backend: its default policy (events), and one that
        # keeps everything buffered until the test ends (reads served from the buffer)
        *params(["smart:memory", "smart:sqlite", "smart:postgres", "smart:redis",
                 "smart-buffered:memory", "smart-buffered:sqlite", "smart-buffered:postgres",
                 "smart-buffered:redis"]),
        # ReplicatedCheckpointer: a PostgreSQL primary, a Redis and a SQLite replica, in each
        # consistency mode
        *(param(f"replicated-{mode}", "postgres", *REPLICAS)
          for mode in ("async", "quorum", "anti_entropy")),
    ],
)
async def test_conformance_all_capabilities(kind: str, tmp_path: Path) -> None:
    counter = itertools.count()

    @checkpointer_test(name=f"langgraph-ckpt-ext-{kind}")
    async def factory() -> AsyncIterator[object]:
        directory = tmp_path / f"conf-{next(counter)}"  # a SQLite file of its own each time
        if kind.startswith("smart"):
            wrapper, _, inner_kind = kind.partition(":")
            policy = Periodic(3600) if wrapper == "smart-buffered" else None
            async with asaver(inner_kind, directory, wrapper="smart", policy=policy) as h:
                yield h.saver
        elif kind.startswith("replicated"):
            mode = kind.partition("-")[2]
            options = {"quorum": 2} if mode == "quorum" else (
                {"repair_interval": 0.2} if mode == "anti_entropy" else {})
            async with asaver("postgres", directory, wrapper="replicated", replicas=REPLICAS,
                              wrapper_options={"consistency": mode, **options}) as h:
                cp = h.saver
                yield cp
                # every test's checkpoints and writes reached both replicas
                assert await cp.aflush(30)
                report = await cp.arepair()
                assert report.clean, report.summary()
        else:
            backend, construct, options = BACKEND_KINDS[kind]
            async with asaver(backend, directory, construct=construct, **options) as h:
                yield h.saver

    report = await validate(factory)
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
