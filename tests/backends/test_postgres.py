"""PostgreSQL specifics: lost connections, caller-owned pools, PgBouncer-style settings."""

from __future__ import annotations

import asyncio
import threading
import time

import asyncpg
import pytest

from langgraph_ckpt_ext import InvalidConfigError, PostgresCheckpointer
from langgraph_ckpt_ext.backends.postgres import StoreUnavailableError
from langgraph_ckpt_ext.backends.postgres.migrations import LATEST
from tests.support.graphs import chat_graph, human
from tests.support.savers import PG_DSN, drop_pg_schemas, pg_schema

pytestmark = pytest.mark.postgres


def _terminate(application_name: str) -> int:
    async def kill() -> int:
        conn = await asyncpg.connect(PG_DSN)
        try:
            return int(await conn.fetchval(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE application_name = $1",
                application_name,
            ))
        finally:
            await conn.close()

    return asyncio.run(kill())


def test_terminated_connections_mid_run() -> None:
    """The server drops every connection of the checkpointer, again and again, during a run of
    many turns: the run goes on (or fails with StoreUnavailableError), every checkpoint
    committed is intact, and the thread resumes without a new checkpointer."""
    schema = pg_schema()
    app = f"lgx-{schema}"
    saver = PostgresCheckpointer(
        PG_DSN, schema=schema, server_settings={"application_name": app}, max_size=4
    )
    graph = chat_graph().compile(checkpointer=saver)
    config = {"configurable": {"thread_id": "unlucky"}}
    failures: list[BaseException] = []

    def run() -> None:
        for i in range(60):
            try:
                graph.invoke({"messages": [human(f"turn {i}")]}, config)
            except StoreUnavailableError as exc:  # a clear error is acceptable; a hang is not
                failures.append(exc)

    try:
        worker = threading.Thread(target=run)
        worker.start()
        killed = 0
        while worker.is_alive() and killed < 12:
            time.sleep(0.1)
            killed += _terminate(app)
        worker.join(120)
        assert not worker.is_alive()
        assert killed >= 3  # the faults really happened
        history = list(graph.get_state_history(config))
        assert history
        for snap in history:  # every stored checkpoint reads back whole and consistent
            turns = snap.values.get("turns", 0)
            # a turn whose run failed after its input checkpoint committed leaves its question
            # unanswered: one more message per such failure, never fewer than two per turn
            assert 2 * turns <= len(snap.values.get("messages", [])) <= (
                2 * turns + 1 + len(failures))
        out = graph.invoke({"messages": [human("after the storm")]}, config)
        assert out["messages"][-1].content == "echo: after the storm"
        # A failed call may still have committed: the connection can drop after the server
        # committed and before the client heard it. Never more than every turn, though.
        assert 61 - len(failures) <= out["turns"] <= 61
    finally:
        saver.close()
        drop_pg_schemas(schema)


async def test_caller_owned_pool_and_statement_cache_off() -> None:
    schema = pg_schema()
    pool = await asyncpg.create_pool(
        PG_DSN, statement_cache_size=0, server_settings={"search_path": schema}
    )
    try:
        saver = PostgresCheckpointer(pool, schema=schema)
        async with pool.acquire() as busy, busy.transaction():  # the caller is mid-transaction
            await busy.execute("SELECT 1")
            await saver.asetup()  # runs on a connection of its own
        graph = chat_graph().compile(checkpointer=saver)
        config = {"configurable": {"thread_id": "owned"}}
        await graph.ainvoke({"messages": [human("hi")]}, config)
        assert len((await graph.aget_state(config)).values["messages"]) == 2
        # Sync calls run on the checkpointer's own loop: a pool of this loop cannot serve them.
        with pytest.raises(InvalidConfigError, match="dsn="):
            await asyncio.to_thread(graph.get_state, config)
        await saver.aclose()
        assert await pool.fetchval("SELECT count(*) FROM lgx_checkpoints") == 3  # pool still open
    finally:
        await pool.close()
        await asyncio.to_thread(drop_pg_schemas, schema)


def test_setup_is_idempotent_and_concurrent() -> None:
    schema = pg_schema()
    try:
        savers: list[PostgresCheckpointer] = []
        errors: list[BaseException] = []

        def open_one() -> None:
            try:
                savers.append(PostgresCheckpointer(PG_DSN, schema=schema))
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=open_one) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors and len(savers) == 4
        assert {s.setup() for s in savers} == {LATEST}
        for s in savers:
            s.close()
    finally:
        drop_pg_schemas(schema)


def test_invalid_schema_name_is_refused() -> None:
    with pytest.raises(InvalidConfigError, match="schema"):
        PostgresCheckpointer(PG_DSN, schema='x"; DROP TABLE t; --', setup=False)


def test_a_transaction_left_open_is_ended_by_the_server() -> None:
    """A pool we open asks the server to end a session idle inside a transaction (one a closed
    event loop left mid-write would otherwise hold its locks until garbage-collected); a
    caller's `server_settings` decides."""
    schema = pg_schema()
    ours = PostgresCheckpointer(PG_DSN, schema=schema)
    theirs = PostgresCheckpointer(
        PG_DSN, schema=schema, server_settings={"idle_in_transaction_session_timeout": "5s"})

    async def settings(cp: PostgresCheckpointer) -> tuple[str, str]:
        pool = await cp.store._pool()
        async with pool.acquire() as conn:
            return (await conn.fetchval("SHOW idle_in_transaction_session_timeout"),
                    await conn.fetchval("SHOW search_path"))

    try:
        assert asyncio.run(settings(ours)) == ("1min", schema)
        assert asyncio.run(settings(theirs)) == ("5s", schema)
    finally:
        ours.close()
        theirs.close()
        drop_pg_schemas(schema)
