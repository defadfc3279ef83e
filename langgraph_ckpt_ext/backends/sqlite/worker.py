"""Whole operations in one round trip to aiosqlite's connection thread, and group commit.

aiosqlite runs each statement as one job on its connection's thread; a put made of five
statements is five round trips, each a thread switch that waits for the GIL. Here a whole
operation is one function run on that thread (`Db.call`), and concurrent writes are committed
together (`GroupCommit`): one `BEGIN IMMEDIATE ... COMMIT` (one fsync) for all the writes that
queued while the previous batch ran; should one fail, the batch runs again with each write
inside a SAVEPOINT of its own, so that the failing write fails alone.

A job answers its caller itself, never through aiosqlite's reply: aiosqlite's thread answers
on the caller's event loop, and dies ("Event loop is closed") if that loop closed meanwhile
(one `asyncio.run` per request ends while its last job still runs), leaving every later call
and `close()` waiting for good. Ours skips a closed loop, so one connection serves any number
of successive event loops.

`Db` reaches private names of aiosqlite (`_tx`, `_conn`, `_running`, `_connection`), the
mechanism behind all its public methods; `Db` checks them when it is made, so a change in
aiosqlite fails loudly at open time, never silently.
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
        if not (
            callable(getattr(getattr(conn, "_tx", None), "put_nowait", None))
            and hasattr(type(conn), "_conn")
            and hasattr(conn, "_running")
            and hasattr(conn, "_connection")
        ):
            raise RuntimeError(
                f"unsupported aiosqlite {getattr(aiosqlite, '__version__', '?')}: "
                "install aiosqlite>=0.20,<0.23"
            )
        self.conn = conn

    async def call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run `fn(sqlite3_connection)` on the connection's thread; one round trip."""
        fut: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self.post(_Job(fn, self.conn, fut))
        return await fut

    def sqlite(self) -> sqlite3.Connection:
        """The sqlite3 connection, for a job on the connection's thread (ValueError if closed)."""
        return self.conn._conn

    def post(self, job: Callable[[], None]) -> None:
        """Queue `job` on the connection's thread, with no reply: it answers whoever waits.

        Raises:
            ValueError: the connection is closed (its thread runs nothing more), as aiosqlite
                itself raises.
        """
        conn = self.conn
        if not conn._running or conn._connection is None:
            raise ValueError("the SQLite connection is closed: open a new checkpointer")
        # Not None: aiosqlite before 0.22 answers whatever stands there.
        conn._tx.put_nowait((_NO_REPLY, job))  # type: ignore[arg-type]


class _NoReply:
    """What aiosqlite's thread answers to after a job of ours: nobody (the job answered)."""

    def get_loop(self) -> _NoReply:
        return self

    def call_soon_threadsafe(self, *args: object) -> None:
        return None


_NO_REPLY = _NoReply()


class _Job:
    """One call, run once, that never raises on aiosqlite's thread. That thread keeps the last
    job it ran until the next one comes: a job that still held its function would keep the
    connection and whatever the function holds (a checkpointer dropped without close())
    alive, and the thread with them."""

    __slots__ = ("conn", "fn", "fut")

    def __init__(
        self,
        fn: Callable[[sqlite3.Connection], Any],
        conn: aiosqlite.Connection,
        fut: asyncio.Future[Any],
    ) -> None:
        self.fn: Callable[[sqlite3.Connection], Any] | None = fn
        self.conn: aiosqlite.Connection | None = conn
        self.fut: asyncio.Future[Any] | None = fut

    def __call__(self) -> None:
        fn, conn, fut = self.fn, self.conn, self.fut
        self.fn = self.conn = self.fut = None
        assert fn is not None and conn is not None and fut is not None, "a job runs once"
        try:
            result = fn(conn._conn)
        except BaseException as exc:
            _answer(fut, None, exc)
        else:
            _answer(fut, result, None)


def _answer(fut: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    """Settle `fut` on its loop, from the connection's thread; a closed loop has nobody
    waiting (it raises RuntimeError), and must not take the thread down with it."""
    with contextlib.suppress(RuntimeError):
        fut.get_loop().call_soon_threadsafe(_settle, fut, result, error)


def _settle_all(outcomes: list[_Outcome]) -> None:
    for outcome in outcomes:
        _settle(*outcome)


def _settle(fut: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if fut.done():
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(result)


class GroupCommit:
    """Queues write operations and commits whatever has queued in one transaction.

    The flush is a job posted to the connection's thread, never a task of a caller's loop: a
    task dies with its loop, and the batch (and every later write) would wait for it forever.
    """

    def __init__(self, db: Db) -> None:
        self._db = db
        self._guard = threading.Lock()
        self._pending: list[tuple[Op, asyncio.Future[Any]]] = []
        self._leader: asyncio.AbstractEventLoop | None = None  # whose caller posts the flush

    async def submit(self, op: Op) -> Any:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        with self._guard:
            self._pending.append((op, fut))
            # A leader whose loop closed before it posted the flush never will: take over.
            lead = self._leader is None or self._leader.is_closed()
            if lead:
                self._leader = loop
        if lead:
            try:
                # One turn of the event loop lets writes issued together (a step's writes and
                # its checkpoint) join this batch: one commit, one fsync, for all of them.
                await asyncio.sleep(0)
            finally:  # cancelled or not, the batch waits on this post
                self._post_flush()
        return await fut

    def _take(self) -> list[tuple[Op, asyncio.Future[Any]]]:
        with self._guard:
            batch, self._pending = self._pending, []
            self._leader = None
        return batch

    def _post_flush(self) -> None:
        try:
            self._db.post(self._flush)
        except BaseException as exc:  # closed: nothing will run the batch
            _answer_all([(fut, None, exc) for _, fut in self._take()])

    def _flush(self) -> None:
        batch = self._take()
        if not batch:  # taken by an earlier flush
            return
        try:
            outcomes = _commit(self._db.sqlite(), batch)
        except BaseException as exc:
            outcomes = [(fut, None, exc) for _, fut in batch]
        _answer_all(outcomes)


_Outcome = tuple[asyncio.Future[Any], Any, BaseException | None]


def _answer_all(outcomes: list[_Outcome]) -> None:
    """Settle each future on its loop, one wake-up per loop for all of its futures (a batch's
    writes usually share one loop)."""
    by_loop: dict[asyncio.AbstractEventLoop, list[_Outcome]] = {}
    for outcome in outcomes:
        by_loop.setdefault(outcome[0].get_loop(), []).append(outcome)
    for loop, answers in by_loop.items():
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits
            loop.call_soon_threadsafe(_settle_all, answers)


def _commit(conn: sqlite3.Connection, batch: list[tuple[Op, asyncio.Future[Any]]]) -> list[_Outcome]:
    """Run the batch in one transaction: one failing op fails alone, a failed BEGIN or
    COMMIT fails them all. The ops run one after another as they are; should one fail, the
    transaction is rolled back and the batch run again with each op in a SAVEPOINT of its
    own, rolled back alone if it fails (an op only runs statements, so running it again
    gives what it would have given then). Two statements an op fewer while nothing fails."""
    try:
        conn.execute("BEGIN IMMEDIATE")
    except BaseException as exc:
        return [(fut, None, exc) for _, fut in batch]
    try:
        outcomes: list[_Outcome] = [(fut, op(conn), None) for op, fut in batch]
    except BaseException as exc:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        if len(batch) == 1 or not isinstance(exc, Exception):
            return [(fut, None, exc) for _, fut in batch]
        try:
            conn.execute("BEGIN IMMEDIATE")
        except BaseException as again:
            return [(fut, None, again) for _, fut in batch]
        outcomes = [_in_savepoint(conn, op, fut) for op, fut in batch]
    try:
        conn.execute("COMMIT")
    except BaseException as exc:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        return [(fut, None, exc) for fut, _, _ in outcomes]
    return outcomes


def _in_savepoint(conn: sqlite3.Connection, op: Op, fut: asyncio.Future[Any]) -> _Outcome:
    """One op of a batch, rolled back alone if it fails."""
    conn.execute("SAVEPOINT lgx_op")
    try:
        result = op(conn)
    except BaseException as exc:
        conn.execute("ROLLBACK TO lgx_op")
        conn.execute("RELEASE lgx_op")
        return fut, None, exc
    conn.execute("RELEASE lgx_op")
    return fut, result, None
