"""The thread lifecycle on PostgreSQL: lifecycle rows kept by every write path, in the write's
own statement; storage from before them backfilled; the sweep lock shared by processes (and
released by a killed one); `expire_thread` against writers on other connections; `vacuum`.

Time is an injected clock: no test sleeps for a TTL.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
from collections.abc import Iterator
from typing import Any

import asyncpg
import pytest
from langgraph.checkpoint.base import empty_checkpoint

from langgraph_ckpt_ext import PostgresCheckpointer, Retention
from langgraph_ckpt_ext.backends.postgres import sql
from langgraph_ckpt_ext.backends.postgres.migrations import LATEST
from langgraph_ckpt_ext.core.retention import LifecycleEvent
from langgraph_ckpt_ext.core.rows import CheckpointRow, MigrationEntry, WriteRow
from tests.support.forked import Forked, start
from tests.support.lifecycle import DAY, T0, cfg, put_chain
from tests.support.savers import PG_DSN, drop_pg_schemas, pg_schema

pytestmark = pytest.mark.postgres



@pytest.fixture
def schema() -> Iterator[str]:
    name = pg_schema()
    yield name
    drop_pg_schemas(name)


def saver(schema: str, now: float = T0, **options: Any) -> PostgresCheckpointer:
    cp = PostgresCheckpointer(PG_DSN, schema=schema, **options)
    cp.clock = lambda: now
    return cp


put = put_chain  # `n` checkpoints of a growing list (append-deltas), as the sweep worker's


async def sql_rows(schema: str, statement: str, *args: Any) -> list[Any]:
    conn = await asyncpg.connect(PG_DSN, server_settings={"search_path": schema})
    try:
        return list(await conn.fetch(statement, *args))
    finally:
        await conn.close()


async def arows_of(schema: str, thread_id: str) -> dict[str, int]:
    """How many rows of each table the thread has."""
    out = {}
    for table in ("checkpoints", "blobs", "writes", "schema_log", "threads"):
        found = await sql_rows(
            schema, f"SELECT count(*) FROM lgx_{table} WHERE thread_id = $1", thread_id)
        out[table] = int(found[0][0])
    return out


def rows_of(schema: str, thread_id: str) -> dict[str, int]:
    return asyncio.run(arows_of(schema, thread_id))


def whole_or_gone(cp: PostgresCheckpointer, schema: str, thread_id: str, n: int) -> str:
    """"whole" (every checkpoint there, each reading back its values, its row there) or "gone"
    (not one row of it left); anything else fails."""
    counts = rows_of(schema, thread_id)
    if not any(counts.values()):
        return "gone"
    tuples = list(cp.list(cfg(thread_id)))
    assert len(tuples) == n, (thread_id, counts)
    for tup in tuples:
        step = tup.metadata["step"]
        assert tup.checkpoint["channel_values"]["items"] == list(range(step + 1))
    assert counts["threads"] == 1
    return "whole"


# -- every write path keeps the thread's row ---------------------------------------------------


def test_every_write_path_keeps_the_row(schema: str) -> None:
    now = [T0]
    cp = saver(schema)
    cp.clock = lambda: now[0]
    store = cp.store
    try:
        config = put(cp, "a", 2)
        state = cp.thread_state("a")
        assert state is not None
        assert (state.created_at, state.written_at, state.generation) == (T0, T0, 2)
        now[0] += 10
        cp.put_writes(config, [("items", [9])], "task-1")
        state = cp.thread_state("a")
        assert state is not None and (state.written_at, state.generation) == (T0 + 10, 3)
        # pending writes alone make a row
        cp.run_sync(store.write_writes([WriteRow("w", "", "c1", "t", 0, "ch", "json", b"1")]))
        assert cp.thread_state("w") is not None
        # a batch: each thread once, whatever the number of its items
        now[0] += 10
        row = CheckpointRow("b", "", "c1", None, None, ("json", b"{}"), ("json", b"{}"))
        cp.run_sync(store.write_batch([
            (row, []), [WriteRow("b", "", "c1", "t", 0, "ch", "json", b"1")],
            [WriteRow("a", "", "c9", "t", 0, "ch", "json", b"1")],
        ]))
        a, b = cp.thread_state("a"), cp.thread_state("b")
        assert a is not None and (a.written_at, a.generation) == (T0 + 20, 4)
        assert b is not None and (b.created_at, b.generation) == (T0 + 20, 1)
        # a schema rewrite raises the generation only
        now[0] += 10
        latest = cp.run_sync(store.read_checkpoint("a", "", None))
        assert latest is not None
        done = cp.run_sync(store.rewrite_checkpoint(
            latest, [], None, MigrationEntry("a", "", latest.checkpoint_id, 1, 2, now[0])))
        a = cp.thread_state("a")
        assert done and a is not None and (a.written_at, a.generation) == (T0 + 20, 5)
        # a copy: the target's row, as a write makes it
        cp.copy_thread("a", "a-copy")
        copy = cp.thread_state("a-copy")
        assert copy is not None and (copy.created_at, copy.generation) == (T0 + 30, 1)
        # a history cut leaves the row; deleting the thread deletes it
        cp.prune(["a"])
        a = cp.thread_state("a")
        assert a is not None and a.generation == 5
        cp.delete_thread("a")
        assert cp.thread_state("a") is None and not any(rows_of(schema, "a").values())
        assert cp.thread_state("a-copy") is not None
    finally:
        cp.close()


def test_a_failed_write_leaves_the_row_as_it_was(schema: str) -> None:
    cp = saver(schema)
    try:
        config = put(cp, "t", 1)
        before = cp.thread_state("t")
        # text with a NUL byte: the server refuses the statement, the row bump with it
        bad = [WriteRow("t", "", config["configurable"]["checkpoint_id"], "task", 0, "c\x00",
                        "json", b"1")]
        with pytest.raises(asyncpg.exceptions.DataError):
            cp.run_sync(cp.store.write_writes(bad))
        with pytest.raises(asyncpg.exceptions.DataError):
            cp.run_sync(cp.store.write_batch([bad]))
        assert cp.thread_state("t") == before
        assert cp.thread_state("x") is None
    finally:
        cp.close()


@pytest.mark.parametrize("channel", ["items", "x"])  # an append-delta, a whole value
def test_a_write_waiting_for_a_prune_raises_the_generation_once(schema: str, channel: str
                                                                ) -> None:
    """A put that finds the thread's lock taken (a prune) writes nothing, waits, then writes:
    the row moves once, with the write."""
    cp, app = app_saver(schema)
    key = cp.store.thread_lock_key("t")

    async def main() -> None:
        config = put(cp, "t", 1)
        before = await cp.athread_state("t")
        latest = await cp.aget_tuple(config)
        assert latest is not None
        version = cp.get_next_version(latest.checkpoint["channel_versions"]["items"], None)
        prune = await asyncpg.connect(PG_DSN, server_settings={"search_path": schema})
        try:
            tx = prune.transaction()
            await tx.start()
            await prune.execute(f"SELECT pg_advisory_xact_lock({sql.THREAD_LOCK}, $1::int)", key)
            ckpt = empty_checkpoint()
            ckpt["channel_values"] = {channel: [0, 1] if channel == "items" else 5}
            ckpt["channel_versions"] = {channel: version}
            task = asyncio.ensure_future(
                cp.aput(config, ckpt, {"step": 1}, {channel: version}))
            await wait_for_lock_waiters(prune, app)
            assert (await cp.athread_state("t")) == before  # nothing written yet
            await tx.commit()
            await task
        finally:
            await prune.close()
        after = await cp.athread_state("t")
        assert before is not None and after is not None
        assert after.generation == before.generation + 1
        stored = await cp.aget_tuple(cfg("t"))
        assert stored is not None and stored.checkpoint["channel_values"][channel] == (
            [0, 1] if channel == "items" else 5)

    try:
        asyncio.run(main())
    finally:
        cp.close()


async def wait_for_lock_waiters(conn: asyncpg.Connection, app: str) -> None:
    """Until a session of application `app` waits for a lock (polling the server for that
    wait, never sleeping for time to pass)."""
    for _ in range(1000):
        if await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 "
            "AND wait_event_type = 'Lock'", app,
        ):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"no session of {app} waited for a lock")


def app_saver(schema: str) -> tuple[PostgresCheckpointer, str]:
    """A checkpointer whose sessions are named, so that a test can see them wait."""
    app = f"lgx-{schema}"
    return saver(schema, server_settings={"application_name": app}), app


# -- storage from before the lifecycle rows ----------------------------------------------------


def test_storage_from_before_the_rows_is_backfilled_and_swept(schema: str) -> None:
    cp = saver(schema)
    try:
        put(cp, "old", 3)
        put(cp, "older", 2)
        cp.run_sync(cp.store.write_writes(
            [WriteRow("writes-only", "", "c1", "t", 0, "ch", "json", b"1")]))
    finally:
        cp.close()

    async def downgrade() -> None:  # the tables as storage version 3 had them
        conn = await asyncpg.connect(PG_DSN, server_settings={"search_path": schema})
        try:
            await conn.execute("DROP TABLE lgx_threads, lgx_lifecycle_log, lgx_tombstones, "
                               "lgx_leases, lgx_epoch")
            await conn.execute("DROP FUNCTION lgx_guard_facts, lgx_guard_expect")
            await conn.execute("DELETE FROM lgx_migrations WHERE version > 3")
        finally:
            await conn.close()

    asyncio.run(downgrade())
    migrated_at = T0 + 5 * DAY
    cp = saver(schema, migrated_at, setup=False)
    try:
        assert cp.run_sync(cp.store.storage_version()) == 3
        cp.setup()
        assert cp.run_sync(cp.store.storage_version()) == LATEST
        states = cp.run_sync(cp.store.thread_states(None, 10))[0]
        assert [s.thread_id for s in states] == ["old", "older", "writes-only"]
        assert all(s.created_at == s.written_at == migrated_at for s in states)
        assert all(s.generation == 1 and not s.pinned and s.read_at is None for s in states)
        cp.retention = Retention(idle=DAY)
        assert cp.sweep().deleted == []  # a day since the migration has not passed
        put(cp, "new", 1, cfg("new"))
        cp.clock = lambda: migrated_at + DAY + 1
        cp.pin("older")
        report = cp.sweep()
        assert report.deleted == ["new", "old", "writes-only"] and report.pinned == 1
        assert cp.thread_ids() == ["older"]
        assert not any(rows_of(schema, "writes-only").values())
    finally:
        cp.close()


def test_thread_state_pages_and_lifecycle_log(schema: str) -> None:
    cp = saver(schema)
    store = cp.store
    try:
        for i in range(7):
            cp.pin(f"p{i}")  # a pin before any write makes a row, generation 0
        cp.set_thread_retention("p3", Retention(idle=5))
        seen, cursor, pages = [], None, 0
        while True:
            states, cursor = cp.run_sync(store.thread_states(cursor, 3))
            seen += states
            pages += 1
            if cursor is None:
                break
        assert [s.thread_id for s in seen] == [f"p{i}" for i in range(7)] and pages == 3
        assert all(s.pinned and s.generation == 0 for s in seen)
        assert Retention.from_json(seen[3].policy or "") == Retention(idle=5)
        cp.unpin("p0")
        cp.run_sync(store.touch_thread("p0"))
        cp.run_sync(store.mark_swept("p0", 7))
        state = cp.thread_state("p0")
        assert state is not None and (state.pinned, state.read_at, state.swept) == (False, T0, 7)
        cp.run_sync(store.touch_thread("nobody"))  # no row: nothing made
        assert cp.thread_state("nobody") is None
        events = [LifecycleEvent(T0, "erase", "d1", 3, "why"), LifecycleEvent(T0 + 1, "trim", "d2", 1)]
        cp.run_sync(store.log_lifecycle(events))
        cp.run_sync(store.log_lifecycle([LifecycleEvent(T0 + 2, "expire", "d1", 0, "retention")]))
        assert cp.run_sync(store.read_lifecycle()) == [*events, LifecycleEvent(
            T0 + 2, "expire", "d1", 0, "retention")]
        assert [e.action for e in cp.run_sync(store.read_lifecycle("d1"))] == ["erase", "expire"]
    finally:
        cp.close()


# -- expire_thread against writers on other connections ----------------------------------------


def test_expire_thread_waits_for_a_write_in_flight_and_refuses_after_it(schema: str) -> None:
    cp, app = app_saver(schema)

    async def main(commit: bool) -> None:
        config = put(cp, "t", 2)
        state = await cp.athread_state("t")
        assert state is not None
        writer = await asyncpg.connect(PG_DSN, server_settings={"search_path": schema})
        try:
            # A writer on another connection, half-way: the thread's row is raised (as every
            # write's statement does first), its pending write not yet committed.
            tx = writer.transaction()
            await tx.start()
            await writer.execute(sql.WRITE_WRITES, *[[] for _ in range(18)], ["t"], T0)
            await writer.execute(
                "INSERT INTO lgx_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, idx, "
                "channel, type, data) VALUES ('t', '', $1, 'task', 0, 'items', 'json', '[]')",
                config["configurable"]["checkpoint_id"])
            expire = asyncio.ensure_future(cp.store.expire_thread("t", state.generation))
            await wait_for_lock_waiters(writer, app)
            assert not expire.done()
            await (tx.commit() if commit else tx.rollback())
            expired = await expire
        finally:
            await writer.close()
        if commit:  # written since the sweep read it: kept, with the write
            assert expired is False
            assert (await arows_of(schema, "t"))["writes"] == 1
            assert len([t async for t in cp.alist(cfg("t"))]) == 2
        else:  # the write never happened: the thread went, all of it
            assert expired is True and not any((await arows_of(schema, "t")).values())

    try:
        asyncio.run(main(True))
        cp.delete_thread("t")
        asyncio.run(main(False))
    finally:
        cp.close()


def test_writes_racing_expire_thread_never_leave_half_a_thread(schema: str) -> None:
    """Puts on one connection, expiries on another, at once, many times: each thread ends
    whole (its checkpoints reading back; the expiry refused) or holds only what was written
    after the expiry (then the expiry said it deleted the thread)."""
    cp = saver(schema)

    async def race(i: int) -> None:
        tid = f"r{i}"
        config = put(cp, tid, 2)
        state = await cp.athread_state(tid)
        assert state is not None
        latest = await cp.aget_tuple(config)
        assert latest is not None
        ckpt = empty_checkpoint()
        version = cp.get_next_version(latest.checkpoint["channel_versions"]["items"], None)
        ckpt["channel_values"] = {"items": [0, 1, 2]}
        ckpt["channel_versions"] = {"items": version}
        put_task = cp.aput(config, ckpt, {"step": 2}, {"items": version})
        expire_task = cp.store.expire_thread(tid, state.generation)
        if i % 2:  # either one started first
            expired, _ = await asyncio.gather(expire_task, put_task)
        else:
            _, expired = await asyncio.gather(put_task, expire_task)
        outcomes.append(expired)
        tuples = [t async for t in cp.alist(cfg(tid))]
        steps = sorted(t.metadata["step"] for t in tuples)
        for tup in tuples:
            assert tup.checkpoint["channel_values"]["items"] == list(range(tup.metadata["step"] + 1))
        row = await cp.athread_state(tid)
        assert row is not None  # the put came last, or was there before
        if expired:
            assert steps == [2] and row.generation == 1  # only the write after the expiry
        else:
            assert steps == [0, 1, 2] and row.generation == state.generation + 1

    async def main() -> None:
        for i in range(30):
            await race(i)

    outcomes: list[bool] = []
    try:
        asyncio.run(main())
    finally:
        cp.close()
    assert len(outcomes) == 30  # both ways happen (here about a third expired first)


# -- the sweep lock, across processes ----------------------------------------------------------


def worker(target: str, *args: Any) -> Forked:
    return start("tests.support.sweep_worker", target, *map(str, args))


def events(proc: Forked) -> Iterator[dict[str, Any]]:
    assert proc.stdout is not None
    for line in proc.stdout:
        yield json.loads(line)


def finish(proc: Forked) -> list[dict[str, Any]]:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    return [json.loads(line) for line in out.splitlines()]


THREADS, PER_THREAD = 12, 3


def fill(target: str) -> None:
    lines = finish(worker(target, "fill", THREADS, PER_THREAD, T0))
    assert lines[-1] == {"event": "filled", "threads": THREADS}


def test_two_processes_sweeping_one_schema(schema: str) -> None:
    target = f"postgres:{schema}"
    fill(target)
    first = worker(target, "sweep", T0 + DAY + 1, DAY, "-", "step")
    try:
        seen = events(first)
        lines = [next(seen), next(seen)]
        assert [e["event"] for e in lines] == ["start", "expired"]  # under way, holding the lock
        # Held still (between two threads, until its stdin ends) while the second process
        # sweeps, however long that one takes.
        second = finish(worker(target, "sweep", T0 + DAY + 1, DAY))
        first.stdin.close()
        lines += list(seen)
    finally:
        first.kill()
        first.wait(30)
    assert second[-1]["locked_out"] is True and second[-1]["deleted"] == 0
    assert [e["event"] for e in second] == ["start", "done"]  # nothing looked at, no error
    assert lines[-1] == {"event": "done", "deleted": THREADS, "locked_out": False, "busy": 0,
                         "examined": THREADS}
    names = [e["thread"] for e in lines if e["event"] == "expired" and e["done"]]
    assert sorted(names) == [f"t{i:05d}" for i in range(THREADS)]  # each once, all of them
    again = finish(worker(target, "sweep", T0 + DAY + 1, DAY))
    assert again[-1] == {"event": "done", "deleted": 0, "locked_out": False, "busy": 0,
                         "examined": 0}


def test_a_sweeper_killed_mid_pass(schema: str) -> None:
    target = f"postgres:{schema}"
    fill(target)
    proc = worker(target, "sweep", T0 + DAY + 1, DAY, "-", 0.5)
    try:
        expired = 0
        for event in events(proc):
            expired += event["event"] == "expired"
            if expired == 3:
                proc.send_signal(signal.SIGKILL)
                break
    finally:
        proc.wait(30)
    assert proc.returncode == -signal.SIGKILL
    cp = saver(schema, T0 + DAY + 1)
    try:
        states = [whole_or_gone(cp, schema, f"t{i:05d}", PER_THREAD) for i in range(THREADS)]
        assert states.count("gone") == 3
        # the killed session's lock went with it: a new pass runs, and finishes the job
        cp.retention = Retention(idle=DAY)
        report = cp.sweep()
        assert not report.locked_out and len(report.deleted) == THREADS - 3
        assert cp.thread_ids() == [] and cp.run_sync(cp.store.thread_states(None, 10))[0] == []
    finally:
        cp.close()


def test_sweep_lock_is_per_schema_and_released(schema: str) -> None:
    other = pg_schema()
    cp, cp2, neighbour = saver(schema), saver(schema), saver(other)

    async def main() -> None:
        async with cp.store.sweep_lock() as held:
            assert held
            async with cp2.store.sweep_lock() as held2:
                assert not held2  # another checkpointer of the schema: locked out at once
            async with neighbour.store.sweep_lock() as held3:
                assert held3  # another schema sweeps on its own
        async with cp2.store.sweep_lock() as held2:
            assert held2  # released when the pass ended

    try:
        asyncio.run(main())
        assert cp.sweep().locked_out is False
    finally:
        for c in (cp, cp2, neighbour):
            c.close()
        drop_pg_schemas(other)


def test_an_unlock_finding_no_lock_is_reported(
    schema: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """What a pooler in transaction mode does (the lock on another server session) shows as a
    warning, not as silence."""
    cp = saver(schema)
    monkeypatch.setattr(sql, "SWEEP_UNLOCK", "SELECT pg_advisory_unlock($1::bigint + 1)")
    try:
        with caplog.at_level(logging.WARNING, logger="langgraph_ckpt_ext.postgres"):
            assert cp.sweep().locked_out is False
        assert "pooler in transaction mode" in caplog.text
    finally:
        cp.close()


def test_a_pool_of_one_connection_cannot_sweep(schema: str) -> None:
    cp = saver(schema, max_size=1, min_size=1)
    try:
        with pytest.raises(Exception, match="2 connections"):
            cp.sweep()
    finally:
        cp.close()


# -- space -------------------------------------------------------------------------------------


def test_vacuum_reports_the_size_of_our_tables(schema: str) -> None:
    cp = saver(schema, retention={"idle": 60})
    try:
        for i in range(20):
            put(cp, f"t{i}", 3)
        cp.clock = lambda: T0 + 61
        assert len(cp.sweep().deleted) == 20
        before, after = cp.vacuum()
        assert before > 0 and after > 0
        sizes = asyncio.run(sql_rows(
            schema, "SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c JOIN "
            "pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relkind = 'r'",
            schema))
        assert after == sizes[0][0]  # every table of ours, heap, TOAST and indexes
        found = asyncio.run(sql_rows(
            schema, "SELECT last_vacuum IS NOT NULL, last_analyze IS NOT NULL "
            "FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = 'lgx_blobs'", schema))
        assert tuple(found[0]) == (True, True)
    finally:
        cp.close()
