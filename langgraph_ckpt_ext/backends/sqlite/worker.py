"""Whole operations in one round trip to aiosqlite's connection thread, and group commit.

aiosqlite runs each statement as one job on its connection's thread; a put made of five
statements is five round trips, each a thread switch that waits for the GIL. Here a whole
operation is one function run on that thread (`Db.call`), and concurrent writes are committed
together (`GroupCommit`): one `BEGIN IMMEDIATE ... COMMIT` (one fsync) for all the writes that
queued while the previous batch ran, each inside its own SAVEPOINT so that one failing write
fails alone.

`Db` reaches two private names of aiosqlite (`_execute`, `_conn`), the mechanism behind all
its public methods; `Db` checks them when it is made, so a change in aiosqlite fails loudly at
open time, never silently.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import aiosqlite

T = TypeVar("T")
Op = Callable[[sqlite3.Connection], Any]


class Db:
    """One aiosqlite connection whose thread runs whole operations."""

    def __init__(self, conn: aiosqlite.Connection) -> None:
        if not (callable(getattr(conn, "_execute", None)) and hasattr(type(conn), "_conn")):
            raise RuntimeError(
                f"unsupported aiosqlite {getattr(aiosqlite, '__version__', '?')}: "
                "install aiosqlite>=0.20,<0.23"
            )
        self.conn = conn

    async def call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run `fn(sqlite3_connection)` on the connection's thread; one round trip."""
        return await self.conn._execute(_Job(fn, self.conn))  # type: ignore[no-any-return,no-untyped-call]


class _Job:
    """One call, run once. aiosqlite's thread keeps the last job it ran until the next one
    comes: a job that still held its function would keep the connection and whatever the
    function holds (a checkpointer dropped without close()) alive, and the thread with them."""

    __slots__ = ("conn", "fn")

    def __init__(self, fn: Callable[[sqlite3.Connection], Any], conn: aiosqlite.Connection) -> None:
        self.fn: Callable[[sqlite3.Connection], Any] | None = fn
        self.conn: aiosqlite.Connection | None = conn

    def __call__(self) -> Any:
        fn, conn = self.fn, self.conn
        self.fn = self.conn = None
        assert fn is not None and conn is not None, "a job runs once"
        return fn(conn._conn)


def _settle(fut: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if fut.done():
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(result)


class GroupCommit:
    """Queues write operations and commits whatever has queued in one transaction."""

    def __init__(self, db: Db) -> None:
        self._db = db
        self._guard = threading.Lock()
        self._pending: list[tuple[Op, asyncio.Future[Any]]] = []
        self._scheduled = False
        self._flushes: set[asyncio.Task[None]] = set()  # strong references while they run

    async def submit(self, op: Op) -> Any:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        with self._guard:
            self._pending.append((op, fut))
            lead = not self._scheduled
            self._scheduled = True
        if lead:
            # The flush runs as a task of its own, so that a caller cancelled meanwhile cannot
            # leave the batch (and every later write) waiting for a flush that never comes.
            task = asyncio.ensure_future(self._lead())
            self._flushes.add(task)
            task.add_done_callback(self._flushes.discard)
        return await fut

    async def _lead(self) -> None:
        # One turn of the event loop lets writes issued together (a step's writes and its
        # checkpoint) join this batch: one commit, one fsync, for all of them.
        await asyncio.sleep(0)
        await self._db.call(self._flush)

    def _flush(self, conn: sqlite3.Connection) -> None:
        with self._guard:
            batch, self._pending = self._pending, []
            self._scheduled = False
        outcomes: list[tuple[asyncio.Future[Any], Any, BaseException | None]] = []
        try:
            conn.execute("BEGIN IMMEDIATE")
        except BaseException as exc:
            outcomes = [(fut, None, exc) for _, fut in batch]
        else:
            for op, fut in batch:
                conn.execute("SAVEPOINT lgx_op")
                try:
                    result = op(conn)
                except BaseException as exc:
                    conn.execute("ROLLBACK TO lgx_op")
                    conn.execute("RELEASE lgx_op")
                    outcomes.append((fut, None, exc))
                else:
                    conn.execute("RELEASE lgx_op")
                    outcomes.append((fut, result, None))
            try:
                conn.execute("COMMIT")
            except BaseException as exc:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                outcomes = [(fut, None, exc) for fut, _, _ in outcomes]
        for fut, result, error in outcomes:
            # A closed caller's loop raises RuntimeError: nobody waits for that result.
            with contextlib.suppress(RuntimeError):
                fut.get_loop().call_soon_threadsafe(_settle, fut, result, error)
