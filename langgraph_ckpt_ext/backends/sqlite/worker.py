"""Whole operations in one round trip to aiosqlite's connection thread, and group commit.

aiosqlite runs each statement as one job on its connection's thread; a put made of five
statements is five round trips, each a thread switch that waits for the GIL. Here a whole
operation is one function run on that thread (`Db.call`), and concurrent writes are committed
together (`GroupCommit`): one `BEGIN IMMEDIATE ... COMMIT` (one fsync) for all the writes that
queued while the previous batch ran; should one fail, the batch runs again with each write
inside a SAVEPOINT of its own, so that the failing write fails alone.

With `inline_commits` (off by default: an event loop waits for each commit there, which
LangGraph's dev server refuses as a blocking call), a batch of light writes (a put, a step's
writes: a few statements each) runs on the caller's own thread instead, on a connection of
its own, when nothing is queued for the writer's thread and commits wait little for the disk:
the thread hand-offs (a queue, a wake-up through the event loop's self-pipe, the GIL passed
back and forth at every statement) cost more CPU than the SQLite work itself. That connection
never waits: should another connection (ours or another process's) hold the file's write
lock, a call be refused there, or commits (the fsync) wait long enough that blocking the event
loop for them would cost more than a hand-off, the batch goes to the writer's thread, which
waits its busy timeout as before. Which thread commits never changes what is stored or what a
write answers.

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
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

import aiosqlite

from ...core.perloop import running_loop

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


# Commits whose wait (what a COMMIT takes beyond the CPU its thread spends: the fsync) has a
# median above this (seconds) over the last `_WAITS` are left to the writer's thread:
# blocking the event loop for them would cost more than handing them off (about a quarter of
# a millisecond of CPU a batch, measured). A local SSD waits well under that; a network
# volume or a slow disk does not. A median, so that one slow commit now and then (SQLite
# copying its WAL back into the file, a busy machine) does not send the next ones away.
INLINE_COMMIT = 0.0005
_WAITS = 15


class GroupCommit:
    """Queues write operations and commits whatever has queued in one transaction.

    The flush is a job posted to the connection's thread, never a task of a caller's loop: a
    task dies with its loop, and the batch (and every later write) would wait for it forever.
    A batch of light operations may instead run at once on the caller's thread, through
    `inline` (a connection of the same file with no busy timeout; see the module's note).
    """

    def __init__(self, db: Db, inline: sqlite3.Connection | None = None) -> None:
        self._db = db
        self._guard = threading.Lock()
        self._pending: list[tuple[Op, asyncio.Future[Any], bool]] = []
        self._leader: asyncio.AbstractEventLoop | None = None  # whose caller posts the flush
        self._inline = inline
        self._inline_lock = threading.Lock()  # one thread at a time on `inline`
        self._posted = 0  # flushes posted to the writer's thread, not done yet (under _guard)
        self._waits: deque[float] = deque(maxlen=_WAITS)  # the last COMMITs' waits, any thread
        self.commit_seconds = 0.0  # their median
        self.inline_commit = INLINE_COMMIT  # above this median, every batch to the thread
        self.inline_batches = 0  # batches committed on a caller's thread

    async def submit(self, op: Op, *, light: bool = False) -> Any:
        """Run `op(connection)` in the next group commit; what it returns, or raises.

        `light`: a few statements, which may run on the caller's thread (see the class).
        """
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        with self._guard:
            self._pending.append((op, fut, light))
            # A leader whose loop closed before it posted the flush never will: take over.
            lead = self._leader is None or self._leader.is_closed()
            if lead:
                self._leader = loop
        if lead:
            try:
                # One turn of the event loop lets writes issued together (a step's writes and
                # its checkpoint) join this batch: one commit, one fsync, for all of them.
                await asyncio.sleep(0)
            finally:  # cancelled or not, the batch waits on this flush
                if not self._commit_here():
                    self._post_flush()
        return await fut

    def _commit_here(self) -> bool:
        """Commit the pending batch on this thread, if it may (see the class); whether it was
        taken (then it is answered, or handed to the writer's thread if the file is busy)."""
        conn = self._inline
        if conn is None or self.commit_seconds > self.inline_commit:
            return False
        if not self._inline_lock.acquire(blocking=False):
            return False
        try:
            with self._guard:
                if self._posted or not all(light for _, _, light in self._pending):
                    return False  # writes queued before these commit first, on that thread
                batch, self._pending = self._pending, []
                self._leader = None
            outcomes = self._run_here(conn, batch)
        finally:
            self._inline_lock.release()
        if outcomes is None:
            self._post_batch(batch)  # the file is busy: the writer's thread waits its turn
        else:
            self.inline_batches += 1
            _answer_all(outcomes)
        return True

    def _run_here(self, conn: sqlite3.Connection,
                  batch: list[tuple[Op, asyncio.Future[Any], bool]]) -> list[_Outcome] | None:
        """The batch's outcomes; None if it could not begin (the file busy: no busy timeout
        here; or a call refused), nothing of it done."""
        try:
            outcomes = _transaction(conn, batch, self._timer())
        except BaseException:
            outcomes = None
        if conn.in_transaction:  # could not even roll back: this connection is done for
            self._inline = None
            with contextlib.suppress(BaseException):
                conn.close()
        return outcomes

    def close_inline(self) -> None:
        """Close the caller-thread connection (waiting for a batch on it); later batches go
        to the writer's thread."""
        with self._inline_lock:
            conn, self._inline = self._inline, None
        if conn is not None:
            conn.close()

    def _timer(self) -> Callable[[float], None] | None:
        """What hears a commit's wait: nothing while no caller-thread connection is open."""
        return self._timed if self._inline is not None else None

    def _timed(self, seconds: float) -> None:
        self._waits.append(seconds)
        self.commit_seconds = statistics.median(self._waits)

    def _take(self) -> list[tuple[Op, asyncio.Future[Any], bool]]:
        with self._guard:
            batch, self._pending = self._pending, []
            self._leader = None
        return batch

    def _post_flush(self) -> None:
        self._post(self._flush)

    def _post_batch(self, batch: list[tuple[Op, asyncio.Future[Any], bool]]) -> None:
        self._post(lambda: self._commit_batch(batch), batch)

    def _post(self, job: Callable[[], None],
              batch: list[tuple[Op, asyncio.Future[Any], bool]] | None = None) -> None:
        with self._guard:
            self._posted += 1
        try:
            self._db.post(job)
        except BaseException as exc:  # closed: nothing will run the batch
            with self._guard:
                self._posted -= 1
            taken = self._take() if batch is None else batch
            _answer_all([(fut, None, exc) for _, fut, _ in taken])

    def _flush(self) -> None:
        self._commit_batch(self._take())

    def _commit_batch(self, batch: list[tuple[Op, asyncio.Future[Any], bool]]) -> None:
        """On the writer's thread: the batch committed and answered (none: taken earlier)."""
        try:
            outcomes = self._committed(batch)
        finally:  # done before anyone hears: a write they issue next may commit on their thread
            with self._guard:
                self._posted -= 1
        _answer_all(outcomes)

    def _committed(self, batch: list[tuple[Op, asyncio.Future[Any], bool]]) -> list[_Outcome]:
        if not batch:
            return []
        try:
            return _transaction(self._db.sqlite(), batch, self._timer())
        except _NotBegun as exc:  # BEGIN failed past the busy timeout
            return [(fut, None, exc.cause) for _, fut, _ in batch]
        except BaseException as exc:  # closed
            return [(fut, None, exc) for _, fut, _ in batch]


_Outcome = tuple[asyncio.Future[Any], Any, BaseException | None]


def _answer_all(outcomes: list[_Outcome]) -> None:
    """Settle each future on its loop, one wake-up per loop for all of its futures (a batch's
    writes usually share one loop)."""
    by_loop: dict[asyncio.AbstractEventLoop, list[_Outcome]] = {}
    for outcome in outcomes:
        by_loop.setdefault(outcome[0].get_loop(), []).append(outcome)
    here = running_loop()
    for loop, answers in by_loop.items():
        if loop is here:  # committed on this loop's own thread: no wake-up needed
            _settle_all(answers)
            continue
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits
            loop.call_soon_threadsafe(_settle_all, answers)


class _NotBegun(Exception):
    """BEGIN failed (`cause`): nothing of the batch is done, it may run again elsewhere."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


def _begin(conn: sqlite3.Connection) -> None:
    try:
        conn.execute("BEGIN IMMEDIATE")
    except BaseException as exc:
        raise _NotBegun(exc) from exc


def _transaction(conn: sqlite3.Connection, batch: list[tuple[Op, asyncio.Future[Any], bool]],
                 timed: Callable[[float], None] | None) -> list[_Outcome]:
    """The batch in one transaction; raises `_NotBegun` only, if a BEGIN failed (the first, or
    the one after a failing op rolled the batch back): nothing of the batch done then."""
    _begin(conn)
    try:
        return _run(conn, batch, timed)
    except _NotBegun:
        raise
    except BaseException as exc:  # answered, never left waiting
        _abandon(conn)
        return [(fut, None, exc) for _, fut, _ in batch]


def _run(conn: sqlite3.Connection, batch: list[tuple[Op, asyncio.Future[Any], bool]],
         timed: Callable[[float], None] | None) -> list[_Outcome]:
    """Run the batch in the transaction just begun and commit it: one failing op fails alone,
    a failed COMMIT fails them all. The ops run one after another as they are; should one
    fail, the transaction is rolled back and the batch run again with each op in a SAVEPOINT
    of its own, rolled back alone if it fails (an op only runs statements, so running it
    again gives what it would have given then). Two statements an op fewer while nothing
    fails. `timed`, if any, hears how long the COMMIT waited (its time less its thread's CPU).
    """
    try:
        outcomes: list[_Outcome] = [(fut, op(conn), None) for op, fut, _ in batch]
    except BaseException as exc:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        if len(batch) == 1 or not isinstance(exc, Exception):
            return [(fut, None, exc) for _, fut, _ in batch]
        _begin(conn)
        outcomes = [_in_savepoint(conn, op, fut) for op, fut, _ in batch]
    try:
        if timed is None:
            conn.execute("COMMIT")
        else:
            start, cpu = time.perf_counter(), time.thread_time()
            conn.execute("COMMIT")
            timed((time.perf_counter() - start) - (time.thread_time() - cpu))
    except BaseException as exc:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        return [(fut, None, exc) for fut, _, _ in outcomes]
    return outcomes


def _abandon(conn: sqlite3.Connection) -> None:
    """Roll back what a failed batch left open, so that the next batch can begin."""
    with contextlib.suppress(Exception):
        if conn.in_transaction:
            conn.execute("ROLLBACK")


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
