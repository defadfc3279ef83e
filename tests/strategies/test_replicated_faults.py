"""`ReplicatedCheckpointer` under real faults, against real servers only.

* A Redis replica (a redis-server of the test's own) is SIGKILLed in the middle of a run of many
  graph turns on a PostgreSQL primary, then restarted empty on the same port: the primary never
  fails a write, `status()` shows the outage, the SQLite replica is not affected, and repair (by
  hand, or the anti-entropy thread) makes the Redis replica equal to the primary again.
* The PostgreSQL primary (a database of the test's own) stops accepting connections: reads are
  served by a replica, writes are refused with `PrimaryUnavailableError` (or, with
  `promote=True`, go to a promoted replica), and once the database is back nothing is lost.
* Quorum writes with one of two replicas killed: refused, then accepted again once it is back.
* Real asyncpg errors: an unreachable database counts as unavailability; a request refused as
  the caller's error (a NUL in a thread id, refused before any I/O) does not (no failover, no
  promotion, nothing queued for a replica).
* The Redis backend's thread index after a restart that lost the data, and a repair.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import psycopg
import pytest
from langgraph.checkpoint.base import copy_checkpoint
from langgraph.checkpoint.base.id import uuid6

from langgraph_ckpt_ext import (
    InvalidConfigError,
    PostgresCheckpointer,
    RedisCheckpointer,
    SQLiteCheckpointer,
)
from langgraph_ckpt_ext.core.errors import PrimaryUnavailableError, QuorumUnavailableError
from langgraph_ckpt_ext.strategies.replication import ReplicatedCheckpointer, ReplicationStatus
from langgraph_ckpt_ext.strategies.replication.failures import foreign_unavailable
from tests.support.common import LoopThread, conf
from tests.support.graphs import chat_graph, human
from tests.support.redis_servers import RedisServer, redis_server
from tests.support.savers import PG_DSN, open_saver, redis_prefix

# -- helpers ----------------------------------------------------------------------------------


def wait_for(check: Callable[[], Any], timeout: float, what: str, interval: float = 0.05) -> Any:
    """Poll `check` until it returns something truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def sigkill(server: RedisServer) -> None:
    """SIGKILL the redis-server this test started (no shutdown, no save), and reap it."""
    proc = server._proc
    assert proc is not None and proc.poll() is None
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    server.stop()  # already gone: only reaps it and forgets it in the harness


def replica(status: ReplicationStatus, name: str) -> Any:
    return next(r for r in status.replicas if r.name == name)


def contents(saver: Any, threads: list[str], api: Api | None = None
             ) -> dict[str, list[dict[str, Any]]]:
    """Per thread, newest first: every checkpoint's id, parent, values, metadata and pending
    writes (those of one task in their order; tasks by id). Read through `api` if given."""
    out: dict[str, list[dict[str, Any]]] = {}
    for thread in threads:
        rows = []
        for tup in (api.list(saver, thread) if api else saver.list(conf(thread))):
            parent = tup.parent_config["configurable"]["checkpoint_id"] if tup.parent_config else None
            rows.append({
                "ns": tup.config["configurable"].get("checkpoint_ns", ""),
                "id": tup.checkpoint["id"],
                "parent": parent,
                "values": tup.checkpoint["channel_values"],
                "metadata": tup.metadata,
                "writes": sorted(tup.pending_writes or [], key=lambda w: w[0]),
            })
        out[thread] = rows
    return out


def differences(want: dict[str, list[dict[str, Any]]], got: dict[str, list[dict[str, Any]]]
                ) -> list[str]:
    """What differs between two `contents()`, compared checkpoint by checkpoint."""
    diffs = []
    for thread in want:
        a, b = want[thread], got.get(thread, [])
        ids_a, ids_b = [(r["ns"], r["id"]) for r in a], [(r["ns"], r["id"]) for r in b]
        if ids_a != ids_b:
            first = next((i for i, (x, y) in enumerate(zip(ids_a, ids_b, strict=False))
                          if x != y), min(len(ids_a), len(ids_b)))
            diffs.append(f"{thread}: checkpoint ids differ: {len(ids_a)} on the primary, "
                         f"{len(ids_b)} here, first mismatch at #{first}")
            continue
        for x, y in zip(a, b, strict=True):
            for key in ("parent", "values", "metadata", "writes"):
                if x[key] != y[key]:
                    diffs.append(f"{thread} checkpoint {x['id']} (step {x['metadata'].get('step')}): "
                                 f"{key} differ: {x[key]!r} != {y[key]!r}"[:600])
    return diffs


def assert_equal_to_primary(primary: Any, replicas: dict[str, Any], threads: list[str], *,
                            thread_index: bool = True,
                            want: dict[str, list[dict[str, Any]]] | None = None) -> None:
    """Every replica holds exactly the primary's checkpoints and writes of `threads` (`want`:
    the primary's `contents()`, if already read), and (with `thread_index`) lists the same
    threads."""
    want = want or contents(primary, threads)
    assert all(want.values())
    for name, saver in replicas.items():
        diffs = differences(want, contents(saver, threads))
        assert not diffs, f"{name} differs from the primary:\n" + "\n".join(diffs[:10])
        if thread_index:
            assert sorted(saver.thread_ids()) == sorted(primary.thread_ids()), name


class Api:
    """Graph and checkpointer calls through the sync API (`invoke`), or through the async one
    (`ainvoke`) on an event loop of their own."""

    def __init__(self, graph: Any, api: str, loop: LoopThread) -> None:
        self.graph, self.is_async, self.loop = graph, api == "ainvoke", loop

    def turn(self, thread: str, text: str) -> dict[str, Any]:
        value = {"messages": [human(text)]}
        if self.is_async:
            return self.loop.run(self.graph.ainvoke(value, conf(thread)))
        return self.graph.invoke(value, conf(thread))

    def state(self, thread: str) -> Any:
        if self.is_async:
            return self.loop.run(self.graph.aget_state(conf(thread)))
        return self.graph.get_state(conf(thread))

    def history(self, thread: str) -> list[str]:
        """`get_state_history`: the checkpoint ids, newest first."""
        async def collect() -> list[Any]:
            return [s async for s in self.graph.aget_state_history(conf(thread))]

        states = (self.loop.run(collect()) if self.is_async
                  else list(self.graph.get_state_history(conf(thread))))
        return [s.config["configurable"]["checkpoint_id"] for s in states]

    def get_tuple(self, saver: Any, thread: str) -> Any:
        if self.is_async:
            return self.loop.run(saver.aget_tuple(conf(thread)))
        return saver.get_tuple(conf(thread))

    def list(self, saver: Any, thread: str) -> list[Any]:
        async def collect() -> list[Any]:
            return [t async for t in saver.alist(conf(thread))]

        return self.loop.run(collect()) if self.is_async else list(saver.list(conf(thread)))


# -- 1. a Redis replica killed mid-run --------------------------------------------------------

THREADS, TURNS, KILL_AT, RESTART_AT = 3, 30, 8, 20


@pytest.mark.postgres
@pytest.mark.redis
@pytest.mark.parametrize(("consistency", "api"), [
    ("async", "invoke"), ("async", "ainvoke"),
    ("anti_entropy", "invoke"), ("anti_entropy", "ainvoke"),
])
def test_redis_replica_killed_mid_run(consistency: str, api: str, tmp_path: Path,
                                     loop_thread: LoopThread) -> None:
    anti_entropy = consistency == "anti_entropy"
    primary_h = open_saver("postgres", tmp_path)  # a fresh schema
    primary = primary_h.saver
    sqlite = SQLiteCheckpointer(tmp_path / "replica.db")
    try:
        with redis_server() as server:
            redis = RedisCheckpointer(server.url, key_prefix=redis_prefix())
            # In anti-entropy mode a short queue: it overflows during the outage, so the replica
            # is marked for repair, which the background repair must then do by itself.
            options: dict[str, Any] = (
                {"repair_interval": 1.0, "max_queue": 40} if anti_entropy else {})
            cp = ReplicatedCheckpointer(primary, [redis, sqlite], consistency,  # type: ignore[arg-type]
                                        names=["redis", "sqlite"], **options)
            try:
                calls = Api(chat_graph().compile(checkpointer=cp), api, loop_thread)
                _killed_mid_run(cp, server, primary, redis, sqlite, calls, anti_entropy)
            finally:
                cp.close(timeout=5)
                redis.close()
    finally:
        sqlite.close()
        primary.close()
        primary_h.cleanup()


def _killed_mid_run(cp: ReplicatedCheckpointer, server: RedisServer, primary: Any, redis: Any,
                    sqlite: Any, api: Api, anti_entropy: bool) -> None:
    threads = [f"t{i}-{uuid.uuid4().hex[:8]}" for i in range(THREADS)]
    downs: list[ReplicationStatus] = []  # status() while the Redis replica was down
    for turn in range(TURNS):
        if turn == RESTART_AT:
            # The worker has met the dead server by now (it had ops to apply): status says so.
            def down() -> ReplicationStatus | None:
                status = cp.status()
                return None if replica(status, "redis").up else status

            downs.append(wait_for(down, 15, "status() to show the Redis replica down"))
            server.start()  # same port, empty: persistence is off
        for n, thread in enumerate(threads):
            if turn == KILL_AT and n == 1:
                sigkill(server)  # mid-run, the worker likely applying the last turn's writes
            out = api.turn(thread, f"{thread} turn {turn}")  # never raises: the primary is fine
            assert out["turns"] == turn + 1
            assert out["messages"][-1].content == f"echo: {thread} turn {turn}"
        status = cp.status()
        assert status.primary_up
        assert replica(status, "sqlite").up, status
        if KILL_AT <= turn < RESTART_AT and not replica(status, "redis").up:
            downs.append(status)

    # While the Redis replica was down: queued operations waiting, an age, the error.
    assert downs
    for status in downs:
        down = replica(status, "redis")
        assert not down.up and down.queued > 0, status
        assert down.oldest_unreplicated_age > 0, status
        assert down.last_error and "Redis unreachable" in down.last_error, status
        assert replica(status, "sqlite").up, status
    if anti_entropy:  # the short queue overflowed while the replica was down
        assert any(replica(s, "redis").needs_repair for s in downs), downs[-1]

    # Every turn reached the primary.
    for thread in threads:
        latest = primary.get_tuple(conf(thread))
        assert latest.checkpoint["channel_values"]["turns"] == TURNS
        assert len(latest.checkpoint["channel_values"]["messages"]) == 2 * TURNS

    # The worker sees the restarted server on its own (it retries its queue with backoff).
    wait_for(lambda: replica(cp.status(), "redis").up, 15, "the Redis replica to be up again")
    assert cp.flush(timeout=30), cp.status()

    want = contents(primary, threads)  # the primary's, final
    if anti_entropy:
        # No repair() here: the background repair makes the replica equal. Polled cheaply
        # first (status, and each thread's oldest and newest checkpoint), then compared whole.
        ends = {t: (rows[-1]["id"], rows[0]["id"]) for t, rows in want.items()}

        def caught_up() -> bool:
            if any(r.needs_repair or r.queued or not r.up for r in cp.status().replicas):
                return False
            for thread, (oldest, newest) in ends.items():
                latest = redis.get_tuple(conf(thread))
                if latest is None or latest.checkpoint["id"] != newest:
                    return False
                if redis.get_tuple(conf(thread, oldest)) is None:
                    return False
            return True

        wait_for(caught_up, 40, "the anti-entropy repair to catch the Redis replica up",
                 interval=0.2)
        wait_for(lambda: not differences(want, contents(redis, threads)), 20,
                 "the anti-entropy repair to make the Redis replica equal", interval=0.5)
    else:
        # The queue was replayed on an empty server: the replica lacks the older checkpoints
        # (and values the replayed ones refer to) until repair(). Back from an outage, it says
        # so (and a failover read prefers a replica that does not).
        back = next(r for r in cp.status().replicas if r.name == "redis")
        assert back.up and back.needs_repair, back
        report = cp.repair()
        redis_report = next(r for r in report.replicas if r.name == "redis")
        assert redis_report.error is None, report.summary()
        assert redis_report.threads_checked == THREADS, report.summary()
        assert redis_report.checkpoints_copied > 0, report.summary()
        sqlite_report = next(r for r in report.replicas if r.name == "sqlite")
        assert sqlite_report.threads_equal == THREADS, report.summary()

    assert_equal_to_primary(primary, {"sqlite": sqlite}, threads, want=want)
    assert_equal_to_primary(primary, {"redis": redis}, threads, want=want)
    again = cp.repair()
    assert again.clean, again.summary()
    status = cp.status()
    assert all(r.up and not r.needs_repair and r.queued == 0 for r in status.replicas), status
    assert replica(status, "sqlite").failures == 0 and replica(status, "sqlite").last_error is None
    assert replica(status, "redis").failures > 0


# -- 2. the PostgreSQL primary unreachable ----------------------------------------------------


def _admin(*statements: str) -> None:
    """Run statements on the maintenance database (`test`), outside any transaction."""
    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)  # type: ignore[arg-type]


def _terminate(db: str) -> str:
    return (f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            f"WHERE datname = '{db}' AND pid <> pg_backend_pid()")


def _backends(db: str) -> int:
    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (db,)).fetchone()
    return int(row[0]) if row else 0


def take_down(db: str) -> None:
    """The primary's database refuses new connections, and its open ones are terminated."""
    _admin(f'ALTER DATABASE "{db}" ALLOW_CONNECTIONS false', _terminate(db))
    wait_for(lambda: _backends(db) == 0, 10, f"the backends of {db} to exit")


def bring_back(db: str) -> None:
    _admin(f'ALTER DATABASE "{db}" ALLOW_CONNECTIONS true')


@pytest.fixture
def fault_db() -> Iterator[tuple[str, str]]:
    """A database of this test's own (name, DSN), dropped at the end even on failure."""
    name = f"lgx_fault_{uuid.uuid4().hex[:12]}"
    _admin(f'CREATE DATABASE "{name}"')
    parts = urlsplit(PG_DSN)
    try:
        yield name, urlunsplit(parts._replace(path=f"/{name}"))
    finally:
        _admin(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true', _terminate(name),
               f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def outage_setup(fault_db: tuple[str, str], tmp_path: Path, loop_thread: LoopThread
                 ) -> Iterator[dict[str, Any]]:
    """A PostgreSQL primary on a database of its own, a Redis and a SQLite replica; closed
    before the event loop of async calls stops, and before the database is dropped."""
    db, dsn = fault_db
    primary = PostgresCheckpointer(dsn)
    redis_h = open_saver("redis", tmp_path)  # the shared server, a key prefix of its own
    redis = redis_h.saver
    sqlite = SQLiteCheckpointer(tmp_path / "replica.db")
    try:
        yield {"db": db, "primary": primary, "redis": redis, "sqlite": sqlite,
               "loop": loop_thread}
    finally:
        for saver in (sqlite, redis, primary):
            saver.close()
        redis_h.cleanup()


OUTAGE_APIS = pytest.mark.parametrize("api", ["invoke", "ainvoke"])


def _written(calls: Any, cp: ReplicatedCheckpointer, prefix: str, turns: int) -> list[str]:
    """Two new threads of `turns` turns each, replicated (the flush done)."""
    threads = [f"{prefix}{i}-{uuid.uuid4().hex[:8]}" for i in range(2)]
    for turn in range(turns):
        for thread in threads:
            calls.turn(thread, f"{thread} {turn}")
    assert cp.flush(timeout=30)
    return threads


@pytest.mark.postgres
@pytest.mark.redis
@OUTAGE_APIS
def test_primary_unreachable_reads_fail_over_writes_refused(outage_setup: dict[str, Any],
                                                            api: str) -> None:
    db, primary, redis, sqlite = (outage_setup[k] for k in ("db", "primary", "redis", "sqlite"))
    cp = ReplicatedCheckpointer(primary, [redis, sqlite], "async", retry_primary_after=2.0,
                                names=["redis", "sqlite"])
    try:
        calls = Api(chat_graph().compile(checkpointer=cp), api, outage_setup["loop"])
        threads = _written(calls, cp, "p", 5)
        before = contents(primary, threads)
        states = {t: calls.state(t) for t in threads}
        histories = {t: calls.history(t) for t in threads}

        take_down(db)

        # The first read meets the unreachable primary: a replica answers, and for the next
        # `retry_primary_after` seconds the primary is reported down (and not tried).
        assert calls.state(threads[0]).values == states[threads[0]].values
        status = cp.status()
        assert not status.primary_up, status
        assert status.primary_error and (
            "not currently accepting connections" in status.primary_error
            or "connection lost" in status.primary_error), status

        # Reads (graph API and checkpointer API): answered by a replica, with the same data.
        for thread in threads:
            state = calls.state(thread)
            assert state.values == states[thread].values
            assert state.config == states[thread].config
            assert calls.history(thread) == histories[thread]
            tup = calls.get_tuple(cp, thread)
            assert tup is not None and tup.checkpoint["id"] == before[thread][0]["id"]
            assert tup.checkpoint["channel_values"] == before[thread][0]["values"]
        assert not differences(before, contents(cp, threads, calls))

        # Writes: refused, clearly, and nothing reaches the replicas.
        with pytest.raises(PrimaryUnavailableError) as refused:
            calls.turn(threads[0], "during the outage")
        message = str(refused.value)
        assert "primary is unreachable" in message and "writes are refused" in message, message
        assert "promote=True" in message, message
        assert cp.flush(timeout=10)
        assert not differences(before, contents(redis, threads))
        assert not differences(before, contents(sqlite, threads))

        bring_back(db)
        time.sleep(cp.retry_primary_after)
        for turn in range(5, 8):
            for thread in threads:
                assert calls.turn(thread, f"{thread} {turn}")["turns"] == turn + 1
        assert cp.status().primary_up
        assert cp.flush(timeout=30)
        report = cp.repair()
        assert all(r.error is None for r in report.replicas), report.summary()
        assert_equal_to_primary(primary, {"redis": redis, "sqlite": sqlite}, threads)
        assert cp.repair().clean

        # Nothing written before the outage is lost, and the refused write left no trace.
        after = contents(primary, threads)
        for thread in threads:
            assert after[thread][-len(before[thread]):] == before[thread]
            assert all("during the outage" not in repr(r["values"]) for r in after[thread])
    finally:
        cp.close(timeout=5)


@pytest.mark.postgres
@pytest.mark.redis
@OUTAGE_APIS
def test_primary_unreachable_promote(outage_setup: dict[str, Any], api: str) -> None:
    db, primary, redis, sqlite = (outage_setup[k] for k in ("db", "primary", "redis", "sqlite"))
    cp = ReplicatedCheckpointer(primary, [redis, sqlite], "async", promote=True,
                                retry_primary_after=1.0, names=["redis", "sqlite"])
    try:
        calls = Api(chat_graph().compile(checkpointer=cp), api, outage_setup["loop"])
        threads = _written(calls, cp, "q", 4)
        before = contents(primary, threads)

        take_down(db)
        for turn in range(4, 8):  # written to the promoted replica
            for thread in threads:
                assert calls.turn(thread, f"{thread} {turn}")["turns"] == turn + 1
        # One promotion (LangGraph writes from several tasks at once: they all fail over to
        # the same replica), the old primary a replica under the promoted one's name.
        new_primary = cp.primary
        assert new_primary is redis, "the first replica (up, no queue, no repair) is promoted"
        assert cp.replicas == [primary, sqlite]
        status = cp.status()
        demoted, other = status.replicas
        assert demoted.name == "redis" and not demoted.up and demoted.needs_repair, status
        assert other.name == "sqlite" and other.up, status
        assert status.primary_up, status

        bring_back(db)
        # The old primary's worker probes it (and applies its queue) until it answers.
        wait_for(lambda: replica(cp.status(), "redis").up, 20, "the demoted primary to be up")
        assert cp.flush(timeout=30)
        report = cp.repair()
        assert all(r.error is None for r in report.replicas), report.summary()
        assert_equal_to_primary(new_primary, {"old primary": primary, "sqlite": sqlite}, threads)
        assert cp.repair().clean
        assert not any(r.needs_repair for r in cp.status().replicas), cp.status()

        # Nothing lost: the turns before the outage, and those during it, are on both.
        for saver in (new_primary, primary):
            now = contents(saver, threads)
            for thread in threads:
                assert now[thread][-len(before[thread]):] == before[thread]
                assert now[thread][0]["values"]["turns"] == 8
    finally:
        cp.close(timeout=5)


@pytest.mark.postgres
def test_driver_errors_classified(fault_db: tuple[str, str], tmp_path: Path) -> None:
    """What asyncpg raises for an unreachable database counts as unavailability (fail over,
    retry); what it raises for a request the server refuses does not (raised as it is)."""
    db, dsn = fault_db
    missing = urlunsplit(urlsplit(dsn)._replace(path=f"/{db}_missing"))

    async def collect() -> dict[str, BaseException]:
        errors: dict[str, BaseException] = {}

        async def catch(name: str, call: Any) -> None:
            try:
                await call
            except Exception as exc:
                errors[name] = exc

        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute("CREATE TEMP TABLE once (k int PRIMARY KEY); "
                               "INSERT INTO once VALUES (1)")
            await catch("bad argument", conn.fetchval("SELECT $1::int", "one"))
            await catch("NUL byte", conn.fetchval("SELECT $1::text", "a\x00b"))
            await catch("duplicate key", conn.execute("INSERT INTO once VALUES (1)"))
            await asyncio.to_thread(take_down, db)
            await catch("terminated", conn.fetchval("SELECT 1"))
            await catch("not accepting connections", asyncpg.connect(dsn))
            await catch("no such database", asyncpg.connect(missing))
        finally:
            conn.terminate()
        return errors

    saver = PostgresCheckpointer(dsn)  # its pool opened, then the database goes away
    try:
        errors = asyncio.run(collect())
        with pytest.raises(Exception) as through_saver:
            saver.get_tuple(conf("any"))
        errors["through PostgresCheckpointer"] = through_saver.value
    finally:
        bring_back(db)
        saver.close()
    refused = {"bad argument", "NUL byte", "duplicate key"}
    assert len(errors) == 7, errors
    for name, exc in errors.items():  # as PostgresCheckpointer reads them, and as read
        # for a saver that does not classify its own errors (LangGraph's)
        assert saver.is_unavailable(exc) is (name not in refused), f"{name}: {exc!r}"
        assert foreign_unavailable(exc) is (name not in refused), f"{name}: {exc!r}"


@pytest.mark.postgres
def test_refused_request_is_not_an_outage(tmp_path: Path) -> None:
    """A request refused as the caller's error (a NUL in a thread id, refused by the id rule
    before any I/O on every backend) raises `InvalidConfigError`: no failover, no promotion,
    and nothing queued for the replicas, whichever backend is the primary."""
    pg_h = open_saver("postgres", tmp_path)
    pg = pg_h.saver
    (tmp_path / "a").mkdir()
    sqlite = SQLiteCheckpointer(tmp_path / "a" / "replica.db")
    bad, good = "nul\x00thread", f"good-{uuid.uuid4().hex[:8]}"
    try:
        cp = ReplicatedCheckpointer(pg, [sqlite], "async", promote=True, names=["sqlite"])
        try:
            graph = chat_graph().compile(checkpointer=cp)
            with pytest.raises(InvalidConfigError, match="NUL"):
                graph.invoke({"messages": [human("hi")]}, conf(bad))
            assert cp.primary is pg and cp.status().primary_up, cp.status()
            assert graph.invoke({"messages": [human("hi")]}, conf(good))["turns"] == 1
            assert cp.flush(timeout=10) and replica(cp.status(), "sqlite").failures == 0
        finally:
            cp.close(timeout=5)

        # The other way round: a SQLite primary refuses it too, and the replica gets nothing.
        (tmp_path / "b").mkdir()
        primary = SQLiteCheckpointer(tmp_path / "b" / "primary.db")
        cp = ReplicatedCheckpointer(primary, [pg], "async", names=["postgres"])
        try:
            graph = chat_graph().compile(checkpointer=cp)
            other = f"other-{uuid.uuid4().hex[:8]}"
            with pytest.raises(InvalidConfigError, match="NUL"):
                graph.invoke({"messages": [human("hi")]}, conf(bad))
            graph.invoke({"messages": [human("hi")]}, conf(other))
            assert cp.flush(timeout=10), cp.status()
            status = replica(cp.status(), "postgres")
            assert status.up and status.queued == 0 and not status.needs_repair, status
            assert primary.thread_ids() == [other]
            assert_equal_to_primary(primary, {"postgres": pg}, [other], thread_index=False)
        finally:
            cp.close(timeout=5)
            primary.close()
    finally:
        sqlite.close()
        pg.close()
        pg_h.cleanup()


# -- 3. quorum writes with a replica killed ---------------------------------------------------


@pytest.mark.postgres
@pytest.mark.redis
def test_quorum_refuses_writes_while_a_replica_is_dead(tmp_path: Path) -> None:
    primary_h = open_saver("postgres", tmp_path)
    primary = primary_h.saver
    sqlite = SQLiteCheckpointer(tmp_path / "replica.db")
    try:
        with redis_server() as server:
            redis = RedisCheckpointer(server.url, key_prefix=redis_prefix())
            cp = ReplicatedCheckpointer(primary, [redis, sqlite], "quorum", quorum=2,
                                        quorum_timeout=20, names=["redis", "sqlite"])
            try:
                _quorum(cp, server, primary)
            finally:
                cp.close(timeout=5)
                redis.close()
    finally:
        sqlite.close()
        primary.close()
        primary_h.cleanup()


def _quorum(cp: ReplicatedCheckpointer, server: RedisServer, primary: Any) -> None:
    graph = chat_graph().compile(checkpointer=cp)
    thread = f"quorum-{uuid.uuid4().hex[:8]}"

    def say(text: str) -> dict[str, Any]:
        return graph.invoke({"messages": [human(text)]}, conf(thread))

    for turn in range(3):
        assert say(f"turn {turn}")["turns"] == turn + 1

    before_kill = primary.get_tuple(conf(thread)).checkpoint["id"]
    state = graph.get_state(conf(thread))
    sigkill(server)
    # The first write after the kill: the worker only learns of the dead server by applying
    # it. It fails its quorum, so it is not stored: the primary, and the graph, still show
    # the thread as it was, and the SQLite replica that took it had it taken away.
    with pytest.raises(QuorumUnavailableError) as first:
        say("after the kill")
    message = str(first.value)
    assert "only 1 of the 2 replica(s)" in message and "redis" in message, message
    assert "not written to the primary" in message, message
    latest = primary.get_tuple(conf(thread))
    assert latest.checkpoint["id"] == before_kill
    assert graph.get_state(conf(thread)).values == state.values
    assert graph.get_state(conf(thread)).config == state.config
    assert "after the kill" not in repr(cp.replicas[1].get_tuple(conf(thread)))
    assert not replica(cp.status(), "sqlite").needs_repair, cp.status()
    assert not replica(cp.status(), "redis").up, cp.status()

    # Then: refused before the primary (or any replica) is touched.
    applied = replica(cp.status(), "sqlite").applied
    for attempt in range(3):
        with pytest.raises(QuorumUnavailableError) as refused:
            say(f"refused {attempt}")
        message = str(refused.value)
        assert "Nothing was written" in message and "2 replica(s) up, 1 are" in message, message
        assert "redis (" in message, message  # names the replica that is down, and why
        assert primary.get_tuple(conf(thread)).checkpoint["id"] == latest.checkpoint["id"]
    assert cp.flush(timeout=10)
    assert replica(cp.status(), "sqlite").applied == applied
    latest_id = latest.checkpoint["id"]

    server.start()  # same port, empty
    wait_for(lambda: replica(cp.status(), "redis").up, 15, "the Redis replica to be up again")
    out = say("back")
    assert out["messages"][-1].content == "echo: back"
    assert "after the kill" not in repr(out["messages"])  # the failed turn left nothing
    assert primary.get_tuple(conf(thread)).checkpoint["id"] != latest_id
    assert cp.flush(timeout=30)
    report = cp.repair()
    assert all(r.error is None for r in report.replicas), report.summary()
    assert_equal_to_primary(primary, {"sqlite": cp.replicas[1]}, [thread])
    assert_equal_to_primary(primary, {"redis": cp.replicas[0]}, [thread])


@pytest.mark.postgres
@pytest.mark.redis
def test_quorum_write_the_primary_fails_after_the_replicas_took_it(
        outage_setup: dict[str, Any]) -> None:
    """Both replicas confirm a quorum write, then the primary cannot be reached: the caller
    gets `PrimaryUnavailableError`, the primary (and the graph) never show the write, and the
    replicas that took it are marked for repair, which takes it away once the primary is
    back. Then the same write, retried, is stored everywhere."""
    db, primary, redis, sqlite = (outage_setup[k] for k in ("db", "primary", "redis", "sqlite"))
    cp = ReplicatedCheckpointer(primary, [redis, sqlite], "quorum", quorum=2,
                                names=["redis", "sqlite"])
    try:
        graph = chat_graph().compile(checkpointer=cp)
        thread = f"q-{uuid.uuid4().hex[:8]}"
        graph.invoke({"messages": [human("one")]}, conf(thread))
        state = graph.get_state(conf(thread))
        parent = primary.get_tuple(conf(thread))
        checkpoint = copy_checkpoint(parent.checkpoint)
        checkpoint["id"] = str(uuid6(clock_seq=-1))
        version = cp.get_next_version(checkpoint["channel_versions"]["turns"], None)
        checkpoint["channel_versions"]["turns"] = version
        checkpoint["channel_values"]["turns"] = 99
        args = (parent.config, checkpoint, {"source": "update", "step": 99}, {"turns": version})

        take_down(db)
        with pytest.raises(PrimaryUnavailableError, match="primary is unreachable"):
            cp.put(*args)
        for name in ("redis", "sqlite"):  # they took it: marked, to be taken away
            assert replica(cp.status(), name).needs_repair, cp.status()
        with pytest.raises(PrimaryUnavailableError):  # known down: no replica is touched
            cp.put(*args)

        bring_back(db)
        time.sleep(cp.retry_primary_after)
        assert primary.get_tuple(conf(thread)).checkpoint["id"] == parent.checkpoint["id"]
        assert graph.get_state(conf(thread)).values == state.values
        report = cp.repair()
        assert all(r.error is None for r in report.replicas), report.summary()
        assert_equal_to_primary(primary, {"redis": redis, "sqlite": sqlite}, [thread])
        assert not any(r.needs_repair for r in cp.status().replicas)
        cp.put(*args)  # retried: the thread takes it as if nothing had happened
        assert graph.get_state(conf(thread)).values["turns"] == 99
        assert_equal_to_primary(primary, {"redis": redis, "sqlite": sqlite}, [thread])
    finally:
        cp.close(timeout=5)


_KILLED = """
import os, signal, sys
from langgraph_ckpt_ext import ReplicatedCheckpointer, SQLiteCheckpointer
from tests.support.graphs import chat_graph, human

class Dies(SQLiteCheckpointer):
    dying = False
    def put(self, *args):
        if self.dying:  # the replicas confirmed the write; the process dies before this
            os.kill(os.getpid(), signal.SIGKILL)
        return super().put(*args)

primary, replica = Dies(sys.argv[1]), SQLiteCheckpointer(sys.argv[2])
cp = ReplicatedCheckpointer(primary, [replica], "quorum")
graph = chat_graph().compile(checkpointer=cp)
config = {"configurable": {"thread_id": "t"}}
graph.invoke({"messages": [human("one")]}, config, durability="sync")
primary.dying = True
graph.invoke({"messages": [human("killed")]}, config, durability="sync")
"""


def test_quorum_write_with_the_process_killed_before_the_primary(tmp_path: Path) -> None:
    """The process dies after the replica confirmed a quorum write, before the primary got
    it: the primary (where the graph reads) never shows it; the replica holds it until a
    repair (what anti-entropy or `repair()` after a restart does) takes it away."""
    paths = [tmp_path / "primary.db", tmp_path / "replica.db"]
    done = subprocess.run([sys.executable, "-c", _KILLED, *map(str, paths)],
                          cwd=Path(__file__).parents[2], capture_output=True, timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()[-2000:]
    with SQLiteCheckpointer(paths[0]) as primary, SQLiteCheckpointer(paths[1]) as replica:
        assert "killed" not in repr(primary.get_tuple(conf("t")).checkpoint)
        assert "killed" in repr(replica.get_tuple(conf("t")).checkpoint)  # taken, unconfirmed
        with ReplicatedCheckpointer(primary, [replica], "quorum") as cp:
            graph = chat_graph().compile(checkpointer=cp)
            values = graph.get_state(conf("t")).values
            assert [m.content for m in values["messages"]] == ["one", "echo: one"]
            assert not cp.repair().clean
            assert_equal_to_primary(primary, {"replica": replica}, ["t"])
            out = graph.invoke({"messages": [human("again")]}, conf("t"))
            assert [m.content for m in out["messages"]][-2:] == ["again", "echo: again"]
            assert_equal_to_primary(primary, {"replica": replica}, ["t"])


# -- a known defect of the Redis backend ------------------------------------------------------


@pytest.mark.postgres
@pytest.mark.redis
def test_redis_thread_index_after_restart_and_repair(tmp_path: Path) -> None:
    primary_h = open_saver("postgres", tmp_path)
    primary = primary_h.saver
    try:
        with redis_server() as server:
            redis = RedisCheckpointer(server.url, key_prefix=redis_prefix())
            cp = ReplicatedCheckpointer(primary, [redis], "async", names=["redis"])
            try:
                graph = chat_graph().compile(checkpointer=cp)
                thread = f"index-{uuid.uuid4().hex[:8]}"
                for turn in range(2):
                    graph.invoke({"messages": [human(f"turn {turn}")]}, conf(thread))
                assert cp.flush(timeout=30)
                sigkill(server)
                server.start()  # empty; the worker had nothing queued, so it never saw it down
                report = cp.repair()
                assert report.replicas[0].checkpoints_copied > 0, report.summary()
                assert_equal_to_primary(primary, {"redis": redis}, [thread])
                assert redis.thread_ids() == [thread]
            finally:
                cp.close(timeout=5)
                redis.close()
    finally:
        primary.close()
        primary_h.cleanup()
