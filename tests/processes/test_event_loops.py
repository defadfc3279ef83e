"""One checkpointer, many event loops: a script that calls `asyncio.run` per request, a notebook,
a test suite. Each loop may close while the checkpointer still works for it (a write pending);
every later call, sync or async, must still be served, and `close()` must return.

A hang would stop the suite: each scenario runs in a thread of its own, and one that does not
finish in time fails the test (the thread is left behind, a daemon).
"""

from __future__ import annotations

import asyncio
import gc
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import redis.asyncio as aredis
from langgraph.checkpoint.base import empty_checkpoint

from tests.support.common import conf
from tests.support.graphs import chat_graph, human
from tests.support.savers import BACKENDS, PG_DSN, REDIS_URL, open_saver, params

_LIMIT = 60.0  # seconds a scenario may take before it counts as hung (it takes a few)
WRAPPED = ["smart:sqlite", "smart:postgres", "smart:redis",
           "replicated:sqlite", "replicated:postgres", "replicated:redis"]


def within(fn: Callable[[], Any], what: str, limit: float = _LIMIT) -> Any:
    """`fn()` in a daemon thread: its result, its error, or a failure if it hangs."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as exc:  # handed to the test's thread
            out["error"] = exc

    thread = threading.Thread(target=run, name=f"lgx-loops-{what}", daemon=True)
    thread.start()
    thread.join(limit)
    if thread.is_alive():
        pytest.fail(f"hung: {what} did not return within {limit:.0f} s")
    if "error" in out:
        raise out["error"]
    return out.get("value")


@pytest.fixture(params=[*params(BACKENDS), *params(WRAPPED)])
def loop_saver(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """A checkpointer of each backend and wrapper (a replicated one with an in-memory replica).
    The test closes it (under the hang guard); closed again here, which must be harmless."""
    kind = str(request.param)
    wrapper, _, backend = kind.rpartition(":")
    h = open_saver(backend, tmp_path, wrapper=wrapper or None,
                   replicas=["memory"] if wrapper == "replicated" else [])
    cp = h.saver
    yield cp
    within(cp.close, "close() at teardown")
    if cp is not h.inner:
        within(h.inner.close, "the inner checkpointer's close()")
    h.cleanup()


def _put(cp: Any, thread: str, parent: dict[str, Any]) -> Any:
    return cp.aput(parent, {**empty_checkpoint(), "channel_values": {"n": 1}},
                   {"source": "loop", "step": 1}, {})


async def _round(cp: Any, thread: str, parent: dict[str, Any]) -> dict[str, Any]:
    """One request: a put, its writes, a read and a listing."""
    saved = await _put(cp, thread, parent)
    await cp.aput_writes(saved, [("n", 2)], "task-1")
    assert (await cp.aget_tuple(conf(thread))) is not None
    assert [t async for t in cp.alist(conf(thread), limit=2)]
    return saved  # type: ignore[no-any-return]


ROUNDS = 60  # loops, each run and ended: what each one left open would add up


def test_many_loops_of_saver_calls(loop_saver: Any) -> None:
    """A fresh `asyncio.run` per call, sync calls in between, then close()."""

    def scenario() -> int:
        parent = conf("t-loops")
        for i in range(ROUNDS):
            parent = asyncio.run(_round(loop_saver, "t-loops", parent))
            asyncio.run(loop_saver.aget_tuple(conf("t-loops")))
            if i % 10 == 0:
                assert loop_saver.get_tuple(conf("t-loops")) is not None
                assert list(loop_saver.list(conf("t-loops"), limit=1))
        count = len(list(loop_saver.list(conf("t-loops"))))
        loop_saver.close()
        return count

    assert within(scenario, f"{ROUNDS} asyncio.run rounds and close()") == ROUNDS


def test_many_loops_of_graph_runs(loop_saver: Any) -> None:
    """`asyncio.run(graph.ainvoke(...))` per request, now and then a sync `invoke`."""
    graph = chat_graph().compile(checkpointer=loop_saver)
    config = conf("t-graph")

    def scenario() -> int:
        for i in range(40):
            turn = {"messages": [human(f"hi {i}")], "turns": 0}
            if i % 8 == 7:
                graph.invoke(turn, config)
            else:
                asyncio.run(graph.ainvoke(turn, config))
        turns = int(graph.get_state(config).values["turns"])
        loop_saver.close()
        return turns

    assert within(scenario, "40 graph runs, each on a loop of its own, and close()") == 40


async def _fire_and_return(cp: Any, thread: str) -> None:
    """A request that starts writes and returns at once: `asyncio.run` cancels them."""
    started = [asyncio.ensure_future(_put(cp, f"{thread}-{i}", conf(f"{thread}-{i}")))
               for i in range(3)]
    await asyncio.sleep(0)
    del started  # left running


def _abandon(cp: Any, thread: str, turns: int) -> None:
    """A loop closed, never shut down, while a write and a read run for it: stopped after
    `turns` turns."""
    loop = asyncio.new_event_loop()
    tasks = [loop.create_task(_put(cp, thread, conf(thread))),
             loop.create_task(cp.aget_tuple(conf("t-fire-0-0")))]
    for _ in range(turns):
        loop.run_until_complete(asyncio.sleep(0))
    loop.close()
    del tasks  # collected with their loop, wherever they stopped
    # A PostgreSQL connection such a loop left inside a transaction holds its locks until its
    # socket is collected (or the server's idle-in-transaction limit, a minute, ends it); the
    # cleanup's DROP SCHEMA would wait for it.
    gc.collect()


# Abandoning calls on purpose leaves coroutines that never ran and tasks destroyed pending:
# Python warns about them, which is what this scenario is.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.filterwarnings("ignore:coroutine .* was never awaited:RuntimeWarning")
def test_loop_closed_while_a_write_is_pending(loop_saver: Any) -> None:
    """Writes left behind by loops that closed under them leave the checkpointer serving."""

    def scenario() -> list[int]:
        found = []
        for turns in range(5):
            asyncio.run(_fire_and_return(loop_saver, f"t-fire-{turns}"))
            _abandon(loop_saver, f"t-abandoned-{turns}", turns)
            thread = f"t-after-{turns}"
            asyncio.run(_round(loop_saver, thread, conf(thread)))
            loop_saver.put(conf(thread), empty_checkpoint(), {"source": "sync", "step": 2}, {})
            found.append(len(list(loop_saver.list(conf(thread)))))
        loop_saver.close()
        return found

    assert within(scenario, "writes on loops closed under them, then close()") == [2] * 5


# -- per-loop clients: a loop's connections go with it ------------------------------------------


async def _pg_connections(name: str) -> int:
    conn = await asyncpg.connect(PG_DSN)
    try:
        return int(await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", name))
    finally:
        await conn.close()


async def _redis_connections(name: str) -> int:
    client = aredis.Redis.from_url(REDIS_URL)
    try:
        return sum(1 for c in await client.client_list() if c.get("name") == name)
    finally:
        await client.aclose()


@pytest.mark.parametrize("backend", params(["postgres", "redis"]))
def test_a_closed_loop_leaves_no_connection_open(backend: str, tmp_path: Path) -> None:
    """Each `asyncio.run` gets a pool (or client) of its own; it must be closed with its loop,
    not kept until the checkpointer closes (200 requests would hold 200 connections)."""
    name = f"lgx-loops-{uuid.uuid4().hex[:8]}"
    if backend == "postgres":
        h = open_saver(backend, tmp_path, server_settings={"application_name": name})
        count = _pg_connections
    else:
        h = open_saver(backend, tmp_path, client_name=name)
        count = _redis_connections
    cp = h.saver

    def scenario() -> int:
        parent = conf("t-leak")
        for _ in range(30):
            parent = asyncio.run(_round(cp, "t-leak", parent))
        return asyncio.run(count(name))

    try:
        held = within(scenario, "30 asyncio.run rounds")
        assert held <= 2, f"{held} connections still open after 30 closed loops"
    finally:
        within(cp.close, "close()")
        h.cleanup()
