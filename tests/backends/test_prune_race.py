"""Prune racing with writers (issue 16): graphs keep running on their threads while another
checkpointer prunes them in a loop, PostgreSQL and Redis behind a proxy that adds 1-10 ms to
every chunk. Afterwards every checkpoint left must read back whole."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from urllib.parse import urlsplit

import asyncpg
import pytest
from langgraph.checkpoint.base import empty_checkpoint

from langgraph_ckpt_ext import (
    InMemoryCheckpointer,
    PostgresCheckpointer,
    RedisCheckpointer,
    SQLiteCheckpointer,
    StoreBusyError,
)
from langgraph_ckpt_ext.backends.postgres import sql as pg_sql
from langgraph_ckpt_ext.core.saver import StoreCheckpointer
from tests.support.common import conf
from tests.support.forked import run_lgckpt
from tests.support.graphs import chat_graph, human
from tests.support.latency_proxy import latency_proxy
from tests.support.savers import (
    PG_DSN,
    REDIS_URL,
    drop_pg_schemas,
    drop_redis_prefixes,
    params,
    pg_schema,
    redis_prefix,
)

ROOT = Path(__file__).resolve().parents[2]
WRITERS = 3
SECONDS = 2.5


def _via(url: str, port: int) -> str:
    """`url` with its host and port replaced by the proxy's."""
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)
    netloc[-1] = f"127.0.0.1:{port}"
    return parts._replace(netloc="@".join(netloc)).geturl()


@contextlib.asynccontextmanager
async def _savers(backend: str, tmp_path: Path
                  ) -> AsyncIterator[Callable[[bool], StoreCheckpointer]]:
    """A factory of checkpointers over one storage, as separate processes would open them
    (each with its own connections and append log; one shared object in memory). A server's
    is reached through the latency proxy when asked (`slow`), else directly."""
    opened: list[StoreCheckpointer] = []

    def keep(cp: StoreCheckpointer) -> StoreCheckpointer:
        opened.append(cp)
        return cp

    if backend == "memory":
        shared = InMemoryCheckpointer()
        yield lambda slow: shared
        return
    if backend == "sqlite":
        path = tmp_path / "race.db"
        try:
            yield lambda slow: keep(SQLiteCheckpointer(path))
        finally:
            for cp in opened:
                await cp.aclose()
        return
    upstream = PG_DSN if backend == "postgres" else REDIS_URL
    host, port = urlsplit(upstream).hostname, urlsplit(upstream).port
    name = pg_schema() if backend == "postgres" else redis_prefix()

    def make(url: str) -> StoreCheckpointer:
        if backend == "postgres":
            return keep(PostgresCheckpointer(url, schema=name, setup=False))
        return keep(RedisCheckpointer(url, key_prefix=name, setup=False))

    async with latency_proxy(host or "127.0.0.1", port or 0) as proxy:
        try:
            yield lambda slow: make(_via(upstream, proxy) if slow else upstream)
        finally:
            for cp in opened:
                await cp.aclose()
            drop = drop_pg_schemas if backend == "postgres" else drop_redis_prefixes
            await asyncio.to_thread(drop, name)


def _said(thread: str, turns: int) -> list[str]:
    """The messages of a thread after `turns` chat turns."""
    return [text for i in range(turns) for text in (f"{thread} {i}", f"echo: {thread} {i}")]


async def _write(cp: StoreCheckpointer, thread: str, until: float) -> int:
    """Chat turns on `thread` until `until`, each seeing every message before; how many."""
    graph = chat_graph().compile(checkpointer=cp)
    turns = 0
    while time.monotonic() < until:
        out = await graph.ainvoke({"messages": [human(f"{thread} {turns}")]}, conf(thread))
        turns += 1
        assert [m.content for m in out["messages"]] == _said(thread, turns)
    return turns


async def _prune(cp: StoreCheckpointer, threads: list[str], done: asyncio.Event) -> int:
    """Prune threads (keep_latest) until `done`; how many prunes went through."""
    pruned = 0
    while not done.is_set():
        try:
            await cp.aprune(threads, strategy="keep_latest")
            pruned += 1
        except StoreBusyError:  # allowed: "busy, retry"
            pass
        await asyncio.sleep(0.005)
    return pruned


async def _check(cp: StoreCheckpointer, thread: str, turns: int) -> None:
    """Every checkpoint left on `thread` reads back, with the messages of its turns."""
    expected = _said(thread, turns)
    listed = [t async for t in cp.alist(conf(thread))]
    assert listed, thread
    for t in listed:
        again = await cp.aget_tuple(t.config)
        assert again is not None, t.config
        values = again.checkpoint["channel_values"]
        messages = [m.content for m in values.get("messages", [])]
        done = values.get("turns", 0)
        assert len(messages) in (2 * done, 2 * done + 1), (t.config, len(messages), done)
        assert messages == expected[: len(messages)], t.config
    latest = listed[0].checkpoint["channel_values"]
    assert [m.content for m in latest["messages"]] == expected
    history = [s async for s in chat_graph().compile(checkpointer=cp).aget_state_history(
        conf(thread))]
    assert [s.config["configurable"]["checkpoint_id"] for s in history] == [
        t.config["configurable"]["checkpoint_id"] for t in listed]


@pytest.mark.parametrize("backend", params(["memory", "sqlite", "postgres", "redis"]))
async def test_prune_while_graphs_write(backend: str, tmp_path: Path) -> None:
    async with _savers(backend, tmp_path) as make:
        await make(False).asetup()
        threads = [f"busy-{i}" for i in range(WRITERS)]
        until = time.monotonic() + SECONDS
        done = asyncio.Event()
        pruners = [asyncio.create_task(_prune(make(True), [t], done)) for t in threads]
        writers = [asyncio.create_task(_write(make(False), t, until)) for t in threads]
        try:
            turns = await asyncio.gather(*writers)
        finally:  # nothing left running on the savers once they close
            done.set()
            for task in writers:
                task.cancel()
            pruned = await asyncio.gather(*pruners, return_exceptions=True)
        for outcome in pruned:
            if isinstance(outcome, BaseException):
                raise outcome
        assert sum(pruned) > 0 and min(turns) > 0
        reader = make(False)
        for thread, n in zip(threads, turns, strict=True):
            await _check(reader, thread, n)
        # The thread goes on: one more turn, then a last prune leaves one checkpoint.
        t0, n = threads[0], turns[0]
        await chat_graph().compile(checkpointer=make(False)).ainvoke(
            {"messages": [human(f"{t0} {n}")]}, conf(t0))
        await reader.aprune([t0])
        assert len([t async for t in reader.alist(conf(t0))]) == 1
        await _check(reader, t0, n + 1)


@pytest.mark.postgres
async def test_prune_of_a_held_thread_says_busy() -> None:
    """A PostgreSQL prune waits for the thread's writers at most lock_timeout, then raises
    StoreBusyError, changing nothing; `lgckpt prune` exits 7 (busy, retry)."""
    schema = pg_schema()
    cp = PostgresCheckpointer(PG_DSN, schema=schema, setup=False)
    impatient = PostgresCheckpointer(PG_DSN, schema=schema, setup=False,
                                     server_settings={"lock_timeout": "200ms"})
    conn = await asyncpg.connect(PG_DSN)
    try:
        await cp.asetup()
        await _write(cp, "held", time.monotonic() + 0.3)
        before = [t async for t in cp.alist(conf("held"))]
        async with conn.transaction():  # as a writer waiting out a prune holds it
            await conn.execute(pg_sql.LOCK_THREADS_SHARED, [cp.store.thread_lock_key("held")])
            with pytest.raises(StoreBusyError, match="retry"):
                await impatient.aprune(["held"])
            url = f"{PG_DSN}?schema={schema}&lock_timeout=200ms"
            code, out, err = await asyncio.to_thread(
                run_lgckpt, ["prune", "held", "--url", url], env=dict(os.environ), cwd=ROOT)
            assert code == 7, (code, out, err)
            assert "retry" in err and out == "", (out, err)
        assert [t async for t in cp.alist(conf("held"))] == before
        await impatient.aprune(["held"])  # the writer is done: the prune goes through
        assert len([t async for t in cp.alist(conf("held"))]) == 1
    finally:
        await conn.close()
        await cp.aclose()
        await impatient.aclose()
        await asyncio.to_thread(drop_pg_schemas, schema)


@pytest.mark.postgres
async def test_writers_wait_for_a_prune_holding_the_thread() -> None:
    """On PostgreSQL a put and a batch that find their thread held by a prune write nothing,
    wait for it, then write (the slow path of `write_checkpoint` and `write_batch`)."""
    schema = pg_schema()
    cp = PostgresCheckpointer(PG_DSN, schema=schema, setup=False)
    conn = await asyncpg.connect(PG_DSN)
    try:
        await cp.asetup()
        turns = await _write(cp, "put", time.monotonic() + 0.2)
        ck = empty_checkpoint()
        ck["channel_values"] = {"log": ["x"]}
        ck["channel_versions"] = {"log": cp.get_next_version(None)}
        at = {"configurable": {"thread_id": "batch", "checkpoint_ns": "", "checkpoint_id": ck["id"]}}
        ops = [("put", conf("batch"), ck, {"source": "input", "step": -1}, ck["channel_versions"]),
               ("writes", at, [("log", ["y"])], "task-1", "")]
        async with conn.transaction():  # as a prune holds them
            for thread in ("put", "batch"):
                await conn.execute(f"SELECT pg_advisory_xact_lock({pg_sql.THREAD_LOCK}, $1)",
                                   cp.store.thread_lock_key(thread))
            turn = chat_graph().compile(checkpointer=cp).ainvoke(
                {"messages": [human(f"put {turns}")]}, conf("put"))
            writers = [asyncio.create_task(turn), asyncio.create_task(cp.aput_batch(ops))]
            await asyncio.sleep(0.5)
            assert not any(w.done() for w in writers)
        out, _ = await asyncio.gather(*writers)
        assert [m.content for m in out["messages"]] == _said("put", turns + 1)
        await _check(cp, "put", turns + 1)
        stored = await cp.aget_tuple(at)
        assert stored is not None and stored.checkpoint["channel_values"] == {"log": ["x"]}
        assert [w[1:] for w in stored.pending_writes or []] == [("log", ["y"])]
    finally:
        await conn.close()
        await cp.aclose()
        await asyncio.to_thread(drop_pg_schemas, schema)
