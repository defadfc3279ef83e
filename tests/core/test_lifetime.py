"""A checkpointer dropped without `close()` gives back what it opened once collected, with a
`ResourceWarning`, as files and sockets do: file descriptors, threads, server connections."""

from __future__ import annotations

import asyncio
import gc
import os
import threading
import time
import uuid
import warnings
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import HumanMessage

from langgraph_ckpt_ext import (
    InMemoryCheckpointer,
    ReplicatedCheckpointer,
    SmartCheckpointer,
    SQLiteCheckpointer,
)
from langgraph_ckpt_ext.strategies.policies import Periodic
from tests.support.common import conf
from tests.support.graphs import chat_graph
from tests.support.savers import (
    PG_DSN,
    REDIS_URL,
    drop_pg_schemas,
    drop_redis_prefixes,
    pg_schema,
    redis_prefix,
)

N = 20  # checkpointers opened, used once and dropped, per case
FEW = 10  # where each costs more (a PostgreSQL pool per loop; two or three stores)
SLACK_FDS, SLACK_THREADS = 3, 1


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _use_once(cp: Any, i: int) -> None:
    """One sync and one async turn: the sync one starts the bridge's loop thread, the async one
    opens clients on the caller's loop (closed when `asyncio.run` returns)."""
    graph = chat_graph().compile(checkpointer=cp)
    graph.invoke({"messages": [HumanMessage("hi")]}, conf(f"t{i}"))
    asyncio.run(graph.ainvoke({"messages": [HumanMessage("again")]}, conf(f"t{i}")))


def _until(done: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Whether `done()` holds within `timeout` s (a release finishes on threads of its own)."""
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            return False
        gc.collect()
        time.sleep(0.05)
    return True


def _close_all(cp: Any) -> None:
    """Close a checkpointer and those a wrapper holds (which stay the caller's)."""
    cp.close()
    for inner in [getattr(cp, "inner", None), getattr(cp, "primary", None),
                  *getattr(cp, "replicas", [])]:
        if inner is not None:
            inner.close()


@contextmanager
def _recorded() -> Iterator[list[warnings.WarningMessage]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        yield caught


def _ours(caught: list[warnings.WarningMessage], name: str) -> int:
    return sum(issubclass(w.category, ResourceWarning) and str(w.message).startswith(
        f"unclosed {name}:") for w in caught)


Outcome = tuple[int, int, int, int, list[warnings.WarningMessage]]


def _drop_many(make: Callable[[int], Any], extra: Callable[[], int] | None = None,
               n: int = N) -> Outcome:
    """Open `n` checkpointers, use each once, drop them. Returns how many are still alive,
    the fds, threads and `extra()` (server connections) above what there was before, and the
    warnings."""
    _close_all(make(-1))  # drivers imported, lazy pools warm: not counted
    gc.collect()
    fds, threads = _fds(), threading.active_count()
    base = extra() if extra else 0
    with _recorded() as caught:
        refs = []
        for i in range(n):
            cp = make(i)
            _use_once(cp, i)
            refs.append(weakref.ref(cp))
            del cp
        _until(lambda: all(r() is None for r in refs)
               and _fds() <= fds + SLACK_FDS
               and threading.active_count() <= threads + SLACK_THREADS
               and (extra is None or extra() <= base))
    alive = sum(r() is not None for r in refs)
    more = extra() - base if extra else 0
    print(f"\n{n} dropped: {alive} alive, fds {_fds() - fds:+d}, "
          f"threads {threading.active_count() - threads:+d}, connections {more:+d}")
    return alive, _fds() - fds, threading.active_count() - threads, more, caught


def _assert_released(result: Outcome, name: str, n: int = N) -> None:
    alive, fds, threads, connections, caught = result
    assert alive == 0, f"{alive} of {n} dropped checkpointers are still alive"
    assert fds <= SLACK_FDS, f"{fds} file descriptors more than before"
    assert threads <= SLACK_THREADS, f"{threads} threads more than before"
    assert connections <= 0, f"{connections} server connections more than before"
    assert _ours(caught, name) >= n


def test_dropped_sqlite_checkpointers_release_files_and_threads(tmp_path: Path) -> None:
    result = _drop_many(lambda i: SQLiteCheckpointer(tmp_path / f"{i}.db"))
    _assert_released(result, "SQLiteCheckpointer")


@pytest.mark.postgres
def test_dropped_postgres_checkpointers_release_their_connections() -> None:
    from langgraph_ckpt_ext import PostgresCheckpointer

    schema, app = pg_schema(), f"lgx-lifetime-{uuid.uuid4().hex[:8]}"

    def make(i: int) -> Any:
        return PostgresCheckpointer(PG_DSN, schema=schema,
                                    server_settings={"application_name": app})

    def connections() -> int:
        return asyncio.run(_pg_connections(app))

    try:
        _assert_released(_drop_many(make, connections, FEW), "PostgresCheckpointer", FEW)
    finally:
        drop_pg_schemas(schema)


async def _pg_connections(app: str) -> int:
    import asyncpg

    conn = await asyncpg.connect(PG_DSN)
    try:
        return int(await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", app))
    finally:
        await conn.close()


@pytest.mark.redis
def test_dropped_redis_checkpointers_release_their_connections() -> None:
    import redis

    from langgraph_ckpt_ext import RedisCheckpointer

    prefix, name = redis_prefix(), f"lgx-lifetime-{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(REDIS_URL)

    def make(i: int) -> Any:
        return RedisCheckpointer(REDIS_URL, key_prefix=prefix, client_name=name)

    def connections() -> int:
        return sum(c.get("name") == name for c in client.client_list())

    try:
        _assert_released(_drop_many(make, connections), "RedisCheckpointer")
    finally:
        client.close()
        drop_redis_prefixes(prefix)


def test_dropped_memory_checkpointers_are_collected_and_hold_nothing() -> None:
    alive, fds, threads, _, caught = _drop_many(lambda i: InMemoryCheckpointer())
    assert (alive, fds <= SLACK_FDS, threads <= SLACK_THREADS) == (0, True, True)
    assert _ours(caught, "InMemoryCheckpointer") == 0  # nothing to release, nothing to say


def test_dropped_smart_checkpointers_stop_their_timers(tmp_path: Path) -> None:
    def make(i: int) -> Any:  # a timer that runs: the first step waits for the end of the run
        return SmartCheckpointer(SQLiteCheckpointer(tmp_path / f"{i}.db"))

    result = _drop_many(make, n=FEW)
    _assert_released(result, "SmartCheckpointer", FEW)
    assert _ours(result[4], "SQLiteCheckpointer") >= FEW  # and the inner ones, dropped with it


@pytest.mark.parametrize("consistency", ["async", "anti_entropy"])
def test_dropped_replicated_checkpointers_stop_their_workers(
    tmp_path: Path, consistency: Any
) -> None:
    def make(i: int) -> Any:
        return ReplicatedCheckpointer(
            SQLiteCheckpointer(tmp_path / f"{i}.db"), [SQLiteCheckpointer(tmp_path / f"{i}r.db")],
            consistency, repair_interval=0.05)

    _assert_released(_drop_many(make, n=FEW), "ReplicatedCheckpointer", FEW)


def test_a_closed_checkpointer_says_nothing_when_collected(tmp_path: Path) -> None:
    with _recorded() as caught:
        for cp in (SQLiteCheckpointer(tmp_path / "a.db"),
                   SmartCheckpointer(InMemoryCheckpointer())):
            _use_once(cp, 0)
            cp.close()
        del cp
        gc.collect()
    assert [str(w.message) for w in caught if "unclosed" in str(w.message)] == []


def test_a_copy_the_graph_keeps_keeps_the_store_open(tmp_path: Path) -> None:
    """LangGraph's `compile` may keep a `with_allowlist` copy and drop the original: the copy
    shares the store, which stays open until the last of them goes."""
    cp = SQLiteCheckpointer(tmp_path / "c.db")
    copy = cp.with_allowlist([("tests.support.graphs", "Extra")])
    assert copy is not cp
    del cp
    gc.collect()
    graph = chat_graph().compile(checkpointer=copy)
    out = graph.invoke({"messages": [HumanMessage("hi")]}, conf("t"))
    assert out["turns"] == 1
    copy.close()


def test_a_dropped_smart_checkpointer_still_writes_what_it_buffered() -> None:
    """Dropped with checkpoints waiting for their interval: its timer keeps it until they
    are written, then lets it go."""
    inner = InMemoryCheckpointer()
    smart = SmartCheckpointer(inner, Periodic(0.2))
    chat_graph().compile(checkpointer=smart).invoke(
        {"messages": [HumanMessage("hi")]}, conf("t"), durability="exit")
    assert smart.metrics.buffered > 0 and inner.get_tuple(conf("t")) is None
    ref = weakref.ref(smart)
    with _recorded() as caught:
        del smart
        assert _until(lambda: ref() is None)
    assert inner.get_tuple(conf("t")) is not None
    assert _ours(caught, "SmartCheckpointer") == 1


def test_dropped_replicated_checkpointers_end_their_replicator_process(tmp_path: Path) -> None:
    def make(i: int) -> Any:  # the replica applied by a child process (a URL)
        return ReplicatedCheckpointer(SQLiteCheckpointer(tmp_path / f"{i}.db"),
                                      [f"sqlite:///{tmp_path / f'{i}r.db'}"])

    before = _children()
    _assert_released(_drop_many(make, n=3), "ReplicatedCheckpointer", 3)
    assert _until(lambda: _children() <= before), "a replicator process is still running"


def _children() -> set[str]:
    """This process's child processes (their pids)."""
    tasks = Path("/proc/self/task")
    return {pid for t in tasks.iterdir() for pid in (t / "children").read_text().split()}
