"""SQLite's light writes committed on the caller's thread (`inline_commits=True`,
`worker.GroupCommit`): taken there
only while nothing is queued for the writer's thread and commits are quick, never blocking the
event loop on a busy file, never reordering writes, and storing exactly what the writer's
thread would have stored.

Every test runs on a real file in WAL mode, with the connections the checkpointer opens."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

from langgraph.checkpoint.base import empty_checkpoint

from langgraph_ckpt_ext import SQLiteCheckpointer
from langgraph_ckpt_ext.backends.sqlite import worker
from langgraph_ckpt_ext.backends.sqlite.worker import GroupCommit
from tests.support.graphs import chat_graph, human
from tests.support.lifecycle import cfg


def _commits(cp: SQLiteCheckpointer) -> GroupCommit:
    """The store's group commit, told to take every commit for quick: on a loaded machine a
    commit's wait includes time the thread was not scheduled, and the rule is tested alone
    (`test_slow_commits_...`)."""
    commits: GroupCommit = cp._store._commits  # type: ignore[attr-defined]
    commits.inline_commit = float("inf")
    return commits


def _where(seen: list[int]) -> Callable[[sqlite3.Connection], int]:
    """An op that notes the thread it runs on and inserts nothing."""
    def op(conn: sqlite3.Connection) -> int:
        seen.append(threading.get_ident())
        return int(conn.execute("SELECT count(*) FROM lgx_checkpoints").fetchone()[0])
    return op


async def _put(cp: SQLiteCheckpointer, thread_id: str, n: int) -> dict[str, Any]:
    config = cfg(thread_id)
    for step in range(n):
        config = await cp.aput(config, empty_checkpoint(), {"source": "loop", "step": step}, {})
    return config


async def test_light_writes_commit_on_the_callers_thread(tmp_path: Path) -> None:
    """Puts and writes on an idle store commit on the event loop's own thread, and what they
    stored is what a fresh process reads."""
    async with SQLiteCheckpointer.from_conn_string(tmp_path / "i.db", inline_commits=True) as cp:
        commits = _commits(cp)
        seen: list[int] = []
        await commits.submit(_where(seen), light=True)
        assert seen == [threading.get_ident()]
        before = commits.inline_batches
        config = await _put(cp, "t", 5)
        await cp.aput_writes(config, [("ch", 1), ("ch", 2)], "task-1")
        assert commits.inline_batches - before == 6
        tup = await cp.aget_tuple(config)
        assert tup is not None and len(tup.pending_writes or []) == 2
    with SQLiteCheckpointer(tmp_path / "i.db") as fresh:
        assert len(list(fresh.list(cfg("t")))) == 5
        assert fresh.get_tuple(config) == tup


async def test_heavy_writes_and_writes_behind_them_go_to_the_writers_thread(
    tmp_path: Path,
) -> None:
    """A write that is not light runs on the writer's thread, and a light write issued while
    it waits there (not begun yet: the thread is busy) goes there too, after it: never
    overtaking it on the caller's thread."""
    async with SQLiteCheckpointer.from_conn_string(tmp_path / "i.db", inline_commits=True) as cp:
        commits = _commits(cp)
        here = threading.get_ident()
        order: list[str] = []
        release = threading.Event()

        def heavy(conn: sqlite3.Connection) -> None:
            order.append("heavy")

        def light(conn: sqlite3.Connection) -> int:
            order.append("light")
            return threading.get_ident()

        cp._store._writer.post(lambda: release.wait(10))  # type: ignore[attr-defined]
        first = asyncio.ensure_future(commits.submit(heavy))
        await asyncio.sleep(0.05)  # its flush posted, behind the busy thread
        second = asyncio.ensure_future(commits.submit(light, light=True))
        await asyncio.sleep(0.05)
        assert order == []  # the light write did not overtake the heavy one
        release.set()
        await first
        assert await second != here
        assert order == ["heavy", "light"]
        seen: list[int] = []
        await commits.submit(_where(seen), light=True)  # the thread idle again: here
        assert seen == [here]


async def test_a_busy_file_goes_to_the_writers_thread_without_blocking_the_loop(
    tmp_path: Path,
) -> None:
    """Another process's write transaction holds the file: the put waits on the writer's
    thread (its busy timeout) while the event loop goes on, then stores."""
    async with SQLiteCheckpointer.from_conn_string(tmp_path / "i.db", inline_commits=True) as cp:
        config = await _put(cp, "t", 1)
        with closing(sqlite3.connect(tmp_path / "i.db", isolation_level=None)) as other:
            other.execute("BEGIN IMMEDIATE")
            ticks = 0

            async def tick() -> None:
                nonlocal ticks
                while True:
                    ticks += 1
                    await asyncio.sleep(0.01)

            ticker = asyncio.ensure_future(tick())
            put = asyncio.ensure_future(
                cp.aput(config, empty_checkpoint(), {"source": "loop", "step": 1}, {}))
            await asyncio.sleep(0.5)
            assert not put.done()
            assert ticks >= 20  # the loop was not blocked while the put waited
            other.execute("COMMIT")
            await put
            ticker.cancel()
        assert len([t async for t in cp.alist(cfg("t"))]) == 2


async def test_a_write_waiting_on_a_busy_file_is_not_overtaken(tmp_path: Path) -> None:
    """A light write sent to the writer's thread by a busy file is still waiting (its busy
    timeout) when the file is free again: a light write issued after it commits after it,
    though the caller's thread could have taken the file first."""
    async with SQLiteCheckpointer.from_conn_string(tmp_path / "i.db", inline_commits=True) as cp:
        commits = _commits(cp)
        order: list[str] = []

        def noted(name: str) -> Callable[[sqlite3.Connection], None]:
            return lambda conn: order.append(name)

        with closing(sqlite3.connect(tmp_path / "i.db", isolation_level=None)) as other:
            other.execute("BEGIN IMMEDIATE")
            first = asyncio.ensure_future(commits.submit(noted("first"), light=True))
            await asyncio.sleep(0.3)  # on the writer's thread, in SQLite's busy wait
            other.execute("COMMIT")
        await commits.submit(noted("second"), light=True)
        await first
        assert order == ["first", "second"]


async def test_slow_commits_go_to_the_writers_thread_until_they_are_quick(
    tmp_path: Path,
) -> None:
    """Commits whose median wait is over `inline_commit` leave the event loop alone; once the
    median is under it again, light writes come back to the caller's thread. One slow commit
    among quick ones changes nothing."""
    async with SQLiteCheckpointer.from_conn_string(tmp_path / "i.db", inline_commits=True) as cp:
        commits = _commits(cp)
        commits.inline_commit = worker.INLINE_COMMIT
        here = threading.get_ident()
        seen: list[int] = []
        heard = len(commits._waits)
        await commits.submit(_where(seen), light=True)
        assert len(commits._waits) == heard + 1  # every commit's wait is heard
        for _ in range(worker._WAITS):
            commits._timed(0.1)  # as if the disk's fsync took a tenth of a second
        await commits.submit(_where(seen), light=True)
        assert seen[-1] != here
        for _ in range(worker._WAITS // 2 + 1):
            commits._timed(0.0)
        commits._timed(5.0)  # one slow commit among quick ones
        await commits.submit(_where(seen), light=True)
        assert seen[-1] == here


async def test_a_failing_write_fails_alone_on_the_callers_thread(tmp_path: Path) -> None:
    """Three light writes in one batch on the caller's thread, the middle one failing: the
    others are stored, it alone raises, and the connection is ready for the next batch."""
    async with SQLiteCheckpointer.from_conn_string(tmp_path / "i.db", inline_commits=True) as cp:
        commits = _commits(cp)
        await commits.submit(lambda c: c.execute("CREATE TABLE t (x INTEGER PRIMARY KEY)"))
        before = commits.inline_batches

        def insert(n: int) -> Callable[[sqlite3.Connection], int]:
            return lambda c: c.execute("INSERT INTO t VALUES (?)", (n,)).rowcount

        results = await asyncio.gather(
            *(commits.submit(op, light=True) for op in (insert(10), insert(10), insert(11))),
            return_exceptions=True)
        assert results[0] == 1 and results[2] == 1
        assert isinstance(results[1], sqlite3.IntegrityError)
        assert commits.inline_batches == before + 1
        await _put(cp, "after", 1)
        assert commits.inline_batches == before + 2
        rows = await commits.submit(lambda c: c.execute("SELECT x FROM t").fetchall())
        assert sorted(r[0] for r in rows) == [10, 11]


async def test_a_busy_file_after_a_failing_write_sends_the_rest_to_the_thread(
    tmp_path: Path,
) -> None:
    """A failing write rolls its batch back to run it again, write by write; if the file is
    taken meanwhile (the caller's connection does not wait), the batch goes to the writer's
    thread whole: the other writes are stored there, not failed with "database is locked"."""
    async with SQLiteCheckpointer.from_conn_string(tmp_path / "i.db", inline_commits=True) as cp:
        commits = _commits(cp)
        await commits.submit(lambda c: c.execute("CREATE TABLE t (x INTEGER PRIMARY KEY)"))
        real = commits._inline
        assert real is not None

        class TakenOnRetry:  # the second BEGIN finds the file taken by another process
            begins = 0

            def execute(self, statement: str, *args: Any) -> Any:
                if statement == "BEGIN IMMEDIATE":
                    self.begins += 1
                    if self.begins == 2:
                        raise sqlite3.OperationalError("database is locked")
                return real.execute(statement, *args)

            @property
            def in_transaction(self) -> bool:
                return real.in_transaction

        def insert(n: int) -> Callable[[sqlite3.Connection], int]:
            return lambda c: c.execute("INSERT INTO t VALUES (?)", (n,)).rowcount

        def broken(c: sqlite3.Connection) -> None:
            c.execute("INSERT INTO t VALUES (99)")
            raise RuntimeError("this write fails")

        commits._inline = TakenOnRetry()  # type: ignore[assignment]
        try:
            results = await asyncio.gather(
                *(commits.submit(op, light=True) for op in (insert(1), broken, insert(2))),
                return_exceptions=True)
        finally:
            commits._inline = real
        assert results[0] == 1 and results[2] == 1, results
        assert isinstance(results[1], RuntimeError)
        rows = await commits.submit(lambda c: c.execute("SELECT x FROM t").fetchall())
        assert sorted(r[0] for r in rows) == [1, 2]


def test_many_threads_writing_one_store_at_once(tmp_path: Path) -> None:
    """Four threads, each with its own event loop, run graph turns on one checkpointer at
    once: batches meet on the caller-thread connection and on the writer's thread, and every
    thread's history is whole, as a fresh process reads it."""
    cp = SQLiteCheckpointer(tmp_path / "i.db", inline_commits=True)
    graph = chat_graph().compile(checkpointer=cp)
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def run(name: str) -> None:
        try:
            start.wait(30)

            async def turns() -> None:
                for i in range(15):
                    await graph.ainvoke({"messages": [human(f"{name}-{i}")]}, cfg(name))

            asyncio.run(turns())
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)

    workers = [threading.Thread(target=run, args=(f"t{i}",)) for i in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
    assert not errors, errors
    assert _commits(cp).inline_batches > 0
    cp.close()
    with SQLiteCheckpointer(tmp_path / "i.db") as fresh:
        fresh_graph = chat_graph().compile(checkpointer=fresh)
        for i in range(4):
            got = fresh_graph.get_state(cfg(f"t{i}")).values["messages"]
            assert [m.content for m in got[::2]] == [f"t{i}-{k}" for k in range(15)]


async def test_off_by_default_and_a_refused_call_goes_to_the_thread(tmp_path: Path) -> None:
    """Without `inline_commits` every commit is the connection's thread's. With it, a call
    refused on the caller's thread (as LangGraph's dev server refuses blocking calls in its
    event loop) sends the batch to the connection's thread, nothing lost."""
    async with SQLiteCheckpointer.from_conn_string(tmp_path / "off.db") as cp:
        seen: list[int] = []
        await cp._store._commits.submit(_where(seen), light=True)  # type: ignore[attr-defined]
        assert seen[-1] != threading.get_ident()
        assert cp._store._commits.inline_batches == 0  # type: ignore[attr-defined]
    async with SQLiteCheckpointer.from_conn_string(tmp_path / "i.db", inline_commits=True) as cp:
        commits = _commits(cp)

        class Refusing:
            in_transaction = False

            def execute(self, *args: Any) -> Any:
                raise RuntimeError("blocking call refused in the event loop")

        own, commits._inline = commits._inline, Refusing()  # type: ignore[assignment]
        try:
            results = await asyncio.gather(*(commits.submit(_where(seen), light=True)
                                             for _ in range(3)))
            assert len(results) == 3 and seen[-1] != threading.get_ident()
            await _put(cp, "t", 2)
            assert len([t async for t in cp.alist(cfg("t"))]) == 2
        finally:
            commits._inline = own


async def test_closing_waits_for_a_batch_and_sends_later_writes_to_the_thread(
    tmp_path: Path,
) -> None:
    async with SQLiteCheckpointer.from_conn_string(tmp_path / "i.db", inline_commits=True) as cp:
        commits = _commits(cp)
        commits.close_inline()
        seen: list[int] = []
        await commits.submit(_where(seen), light=True)
        assert seen[-1] != threading.get_ident()


async def test_a_large_write_batch_goes_to_the_writers_thread(tmp_path: Path) -> None:
    """A step's put and its writes as one batch commit on the caller's thread; a batch of
    more items (a smart buffer's flush) runs on the writer's thread; both are stored whole."""
    from tests.core.test_write_batch import Encoder

    async with SQLiteCheckpointer.from_conn_string(tmp_path / "i.db", inline_commits=True) as cp:
        commits, store = _commits(cp), cp._store  # type: ignore[attr-defined]
        enc = Encoder(cp, "t")
        small = [enc.checkpoint({"a": 1})]
        small.append(enc.writes([("a", 2)], "task-1"))
        before = commits.inline_batches
        await store.write_batch(small)
        assert commits.inline_batches == before + 1
        large = [enc.checkpoint({"a": i}) for i in range(8)]
        await store.write_batch(large)
        assert commits.inline_batches == before + 1  # not on the caller's thread
    with SQLiteCheckpointer(tmp_path / "i.db") as fresh:
        assert len(list(fresh.list(cfg("t")))) == 9
