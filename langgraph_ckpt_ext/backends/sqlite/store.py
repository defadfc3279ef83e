"""`SQLiteStore`: the rows of `StoreCheckpointer` in one SQLite file, through aiosqlite."""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import functools
import logging
import os
import sqlite3
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Collection, Iterable, Sequence
from typing import Any

import aiosqlite

from ...core.errors import ConcurrentWriteError, check_storage_version
from ...core.guard import Guard, LeaseRow, put_refusal, writes_refusal
from ...core.retention import LifecycleEvent, ThreadState
from ...core.rows import (
    AuditSwitch,
    BlobRef,
    BlobRow,
    CheckpointRow,
    ListQuery,
    MigrationEntry,
    Reseal,
    StoredSize,
    WriteRow,
    whole,
)
from ...core.store import BatchItem, Cursor, GcPlanner, keyset_pages, try_lock
from . import sql
from .migrations import LATEST, MIGRATIONS
from .worker import Db, GroupCommit

_CHUNK = 400  # keys per statement, well under SQLite's bound-parameter limit
_PAGE = 64  # checkpoint rows per `list` page
_INCREMENTAL = 2  # PRAGMA auto_vacuum: 0 none, 1 full, 2 incremental

_log = logging.getLogger("langgraph_ckpt_ext.sqlite")


def _checkpoint(r: Iterable[Any]) -> CheckpointRow:
    tid, ns, cid, parent, run_id, type_, data, md_type, md = r
    return CheckpointRow(tid, ns, cid, parent, run_id, (type_, data), (md_type, md))


def _chunks(items: Sequence[Any], size: int = _CHUNK) -> Iterable[Sequence[Any]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


# A batch of at most this many items (a step's put and its writes) counts as light; a larger one
# (a smart buffer's flush) runs on the connection's thread even with `inline_commits`, so that
# its statements do not hold up the caller's event loop.
_LIGHT_BATCH = 4
_ROWS = 64  # rows per multi-row INSERT (at most 9 parameters a row: under SQLite's 999)


def _insert(conn: sqlite3.Connection, statement: str, rows: Sequence[Sequence[Any]]) -> None:
    """`rows` by `statement` (an INSERT of one row), up to `_ROWS` to a statement: SQLite
    steps once for them all (one release of the GIL, one hand-off back to the writer's
    thread), where `executemany` steps once per row."""
    for chunk in _chunks(rows, _ROWS):
        conn.execute(sql.many(statement, len(chunk)), [v for row in chunk for v in row])


def _migrate(conn: sqlite3.Connection, clock: Callable[[], float]) -> int:
    conn.execute(sql.CREATE_MIGRATIONS)
    while True:
        conn.execute("BEGIN IMMEDIATE")
        try:
            current = int(conn.execute(sql.SELECT_STORAGE_VERSION).fetchone()[0])
            check_storage_version(current, LATEST)
            if current < LATEST:
                now = clock()
                for statement in MIGRATIONS[current]:
                    # `:now`: the time a step stamps on the rows it backfills.
                    conn.execute(statement, {"now": now})
                applied = dt.datetime.fromtimestamp(now, dt.timezone.utc).isoformat()
                conn.execute(sql.INSERT_MIGRATION, (current + 1, applied))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        if current >= LATEST:
            _incremental_auto_vacuum(conn)
            return current


def _auto_vacuum(conn: sqlite3.Connection) -> int:
    """The file's auto-vacuum mode as stored now. A connection caches the file header, and
    `PRAGMA auto_vacuum` alone reads the cache: a read transaction refreshes it first (another
    process may have switched the file meanwhile)."""
    conn.execute("BEGIN")
    try:
        conn.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
        return int(conn.execute("PRAGMA auto_vacuum").fetchone()[0])
    finally:
        conn.execute("COMMIT")


def _incremental_auto_vacuum(conn: sqlite3.Connection) -> bool:
    """Switch a file made without auto-vacuum (storage before version 5, or a connection given
    by the caller) to incremental auto-vacuum, so that `vacuum` can give space back without
    rewriting the file each time; whether the file is (now) incremental.

    The switch is a VACUUM, which rewrites the whole file once (through the WAL: it needs free
    disk space about the file's size) and cannot run in a transaction, so it is not a step of
    `MIGRATIONS` but runs after them, on every `setup` that finds the file not switched yet:
    idempotent, atomic (a VACUUM commits whole or not at all, even if the process is killed),
    and safe beside other processes (in WAL mode their readers go on; their writers wait for
    it, as for any write). A file another process keeps busy past the busy timeout stays as
    it is, with a warning: it works as before, and the next `setup` or `vacuum` tries again.
    A file set to FULL auto-vacuum by its owner is left so."""
    mode = _auto_vacuum(conn)
    if mode != 0:
        return mode == _INCREMENTAL
    conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
    try:
        conn.execute("VACUUM")
    except sqlite3.OperationalError as exc:  # busy past the timeout, or a read-only file
        _log.warning("could not switch the SQLite file to incremental auto-vacuum (%s); "
                     "it works as before, and the next setup or vacuum tries again", exc)
        return False
    return True


def _file_size(conn: sqlite3.Connection, path: str) -> int:
    """The bytes the database takes: its file and its WAL (pages, for a database in memory)."""
    if not path:
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        return int(pages) * int(conn.execute("PRAGMA page_size").fetchone()[0])
    total = 0
    for name in (path, path + "-wal"):
        with contextlib.suppress(FileNotFoundError):
            total += os.path.getsize(name)
    return total


def _blobs(
    conn: sqlite3.Connection, thread_id: str, ns: str, keys: Collection[tuple[str, str]]
) -> dict[tuple[str, str], BlobRow]:
    out: dict[tuple[str, str], BlobRow] = {}
    for chunk in _chunks(sorted(keys)):
        params = [thread_id, ns, *(x for key in chunk for x in key)]
        for ch, ver, type_, data, base in conn.execute(sql.select_blobs(len(chunk)), params):
            out[(ch, ver)] = BlobRow(ch, ver, type_, data, base)
    return out


def _writes(
    conn: sqlite3.Connection,
    thread_id: str,
    ns: str,
    ids: Sequence[str],
    channels: Collection[str] | None,
) -> dict[str, list[WriteRow]]:
    chans = sorted(channels) if channels is not None else []
    out: dict[str, list[WriteRow]] = {}
    for chunk in _chunks(ids):
        statement = sql.select_writes(len(chunk), len(chans))
        for r in conn.execute(statement, [thread_id, ns, *chunk, *chans]):
            row = WriteRow(*r)
            out.setdefault(row.checkpoint_id, []).append(row)
    return out


def _put_blobs(conn: sqlite3.Connection, tid: str, ns: str, blobs: Sequence[BlobRow]) -> set[str]:
    """Store blob rows; an append-delta whose base row is gone is stored whole. Returns the
    channels that fell back so."""
    fell_back: set[str] = set()
    full = [(b.channel, b.version, b.type, b.data) for b in blobs if b.base_version is None]
    for b in blobs:
        if b.base_version is None:
            continue
        cur = conn.execute(
            sql.INSERT_DELTA_IF_BASE,
            (tid, ns, b.channel, b.version, b.type, b.data, b.base_version),
        )
        if cur.rowcount == 0:  # the base is gone (pruned, or by another process)
            w = whole(b)
            full.append((w.channel, w.version, w.type, w.data))
            fell_back.add(b.channel)
    if full:
        _insert(conn, sql.UPSERT_BLOB, [(tid, ns, *f) for f in full])
    return fell_back


def _put_checkpoint(conn: sqlite3.Connection, row: CheckpointRow, blobs: Sequence[BlobRow]) -> set[str]:
    """`write_checkpoint` on the writer's thread: the blobs, then the row. Returns the channels
    whose append-delta fell back to a whole value."""
    fell_back = _put_blobs(conn, row.thread_id, row.checkpoint_ns, blobs)
    conn.execute(
        sql.UPSERT_CHECKPOINT,
        (row.thread_id, row.checkpoint_ns, row.checkpoint_id, row.parent_checkpoint_id,
         row.run_id, *row.checkpoint, *row.metadata),
    )
    return fell_back


def _put_writes(conn: sqlite3.Connection, rows: Sequence[WriteRow]) -> None:
    """`write_writes` on the writer's thread: idx >= 0 keeps an existing row, idx < 0 replaces
    it (the two never share a key, so their order does not matter)."""
    keep = [_write_params(r) for r in rows if r.idx >= 0]
    replace = [_write_params(r) for r in rows if r.idx < 0]
    if keep:
        _insert(conn, sql.INSERT_WRITE_KEEP, keep)
    if replace:
        _insert(conn, sql.INSERT_WRITE_REPLACE, replace)


def _facts(conn: sqlite3.Connection, tid: str, ns: str, cid: str) -> tuple[Any, ...]:
    """(head, checkpoint stored, checkpoint newer than the tombstone's, tombstoned, lease,
    epoch) of a namespace, as the write's transaction sees them (`sql.SELECT_GUARD_FACTS`).

    On a tombstoned thread, pending writes for a checkpoint newer than every one its delete
    removed are a new run's (`core.guard.writes_refusal`)."""
    head, stored, last, token, until, epoch = conn.execute(
        sql.SELECT_GUARD_FACTS, (tid, ns, cid)).fetchone()
    lease: LeaseRow | None = None if token is None else (str(token), float(until))
    tombstoned = last is not None
    return head, bool(stored), tombstoned and cid > str(last), tombstoned, lease, int(epoch)


def _check_put(conn: sqlite3.Connection, row: CheckpointRow, guard: Guard, now: float) -> None:
    """Raise `core.guard.put_refusal`'s error for this put, if any. Runs in the write's
    transaction (BEGIN IMMEDIATE: every writer of the file, in any process, holds it in
    turn), before anything of the put is written: two writers never pass against one head."""
    head, stored, _, tombstoned, lease, epoch = _facts(
        conn, row.thread_id, row.checkpoint_ns, row.checkpoint_id)
    refused = put_refusal(guard, row.thread_id, row.checkpoint_ns, row.parent_checkpoint_id,
                          head, tombstoned, lease, epoch, now, stored)
    if refused is not None:
        raise refused


def _check_writes(conn: sqlite3.Connection, rows: Sequence[WriteRow], guard: Guard,
                  now: float) -> None:
    """Raise `core.guard.writes_refusal`'s error for these pending writes (of one thread and
    checkpoint), if any; as `_check_put`."""
    first = rows[0]
    _, stored, newer, tombstoned, lease, epoch = _facts(
        conn, first.thread_id, first.checkpoint_ns, first.checkpoint_id)
    exists = stored or newer
    refused: ConcurrentWriteError | None = writes_refusal(
        guard, first.thread_id, first.checkpoint_ns, first.checkpoint_id, exists, tombstoned,
        lease, epoch, now)
    if refused is not None:
        raise refused


def _delete_thread(conn: sqlite3.Connection, thread_id: str, tombstone_at: float | None) -> None:
    """Every row of the thread, its lease with them; its tombstone left if `tombstone_at`."""
    if tombstone_at is not None:  # first: it keeps the newest checkpoint id that goes
        conn.execute(sql.UPSERT_TOMBSTONE, (thread_id, tombstone_at))
    for statement in sql.DELETE_THREAD:
        conn.execute(statement, (thread_id,))


def _open_lock(path: str) -> int | None:
    """A descriptor of the sweep lock file, or None where a file lock cannot be had."""
    if sys.platform == "win32":
        return None
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError:
        return None


def _flock(fd: int) -> bool:
    """Take the exclusive lock of `fd` without waiting; False if another holder has it."""
    if sys.platform == "win32":
        return False
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):
            return False
        raise
    return True


def _wrote(conn: sqlite3.Connection, thread_ids: Iterable[str], now: float) -> None:
    """The lifecycle rows of threads just written: created if missing, `written_at` = now,
    `generation` + 1. One statement per thread, in the write's transaction."""
    conn.executemany(sql.UPSERT_THREAD_WRITTEN, [(tid, now) for tid in thread_ids])


def _thread_state(r: Sequence[Any]) -> ThreadState:
    tid, created, written, read, generation, pinned, policy, swept = r
    return ThreadState(str(tid), float(created), float(written),
                       None if read is None else float(read), int(generation), bool(pinned),
                       policy, None if swept is None else int(swept))


def _reseal_params(thread_id: str, ch: Reseal) -> tuple[str, tuple[Any, ...]]:
    """The compare-and-swap UPDATE of one `Reseal` and its parameters: new values, row key,
    old values."""
    key = (thread_id, ch.checkpoint_ns)
    if ch.kind == "checkpoint":
        (ck, md), (new_ck, new_md) = ch.old, ch.new
        return sql.RESEAL_CHECKPOINT, (*new_ck, *new_md, *key, ch.key[0], *ck, *md)
    if ch.kind == "blob":
        return sql.RESEAL_BLOB, (*ch.new[0], *key, ch.key[0], ch.key[1], *ch.old[0])
    if ch.kind == "write":
        cid, task, idx = ch.key
        return sql.RESEAL_WRITE, (*ch.new[0], *key, cid, task, int(idx), *ch.old[0])
    raise ValueError(f"a Reseal's kind is 'checkpoint', 'blob' or 'write', not {ch.kind!r}")


def _write_params(r: WriteRow) -> tuple[Any, ...]:
    return (r.thread_id, r.checkpoint_ns, r.checkpoint_id, r.task_id, r.idx,
            r.channel, r.type, r.data, r.task_path)


class SQLiteStore:
    """Rows in SQLite. Writes go through one connection and commit in groups (`BEGIN
    IMMEDIATE`, so processes sharing the file queue on the busy timeout); reads of a file
    database use a second connection, which in WAL mode sees only committed data. Each
    operation is one round trip to its connection's thread, so it is atomic with respect to
    every other operation of this process."""

    inline = False
    wants_versions = False

    def __init__(self, writer: aiosqlite.Connection, reader: aiosqlite.Connection | None,
                 inline: sqlite3.Connection | None = None) -> None:
        self._writer = Db(writer)
        self._reader = Db(reader) if reader is not None else self._writer
        self._commits = GroupCommit(self._writer, inline)
        self.owns_connections = True
        self.clock: Callable[[], float] = time.time
        self._path: str | None = None  # the database file ("": none), once asked
        self._sweeping = threading.Lock()  # the sweep lock of a database without a file

    async def migrate(self) -> int:
        """Apply pending storage migrations; returns the storage version now in force."""
        return await self._writer.call(functools.partial(_migrate, clock=self.clock))

    async def storage_version(self) -> int:
        def op(conn: sqlite3.Connection) -> int:
            if conn.execute(sql.MIGRATIONS_TABLE_EXISTS).fetchone() is None:
                return 0
            return int(conn.execute(sql.SELECT_STORAGE_VERSION).fetchone()[0])

        return await self._reader.call(op)

    async def read_audit_log(self, last: bool = False) -> list[AuditSwitch]:
        def op(conn: sqlite3.Connection) -> list[AuditSwitch]:
            try:
                rows = conn.execute(sql.SELECT_AUDIT_LAST if last else sql.SELECT_AUDIT_LOG)
                return [AuditSwitch(bool(on), float(at), str(why)) for on, at, why in rows]
            except sqlite3.OperationalError:  # storage older than the log: never switched
                if conn.execute(sql.AUDIT_LOG_EXISTS).fetchone() is not None:
                    raise
                return []

        return await self._reader.call(op)

    async def log_audit_switch(self, switch: AuditSwitch) -> None:
        row = (int(switch.enabled), float(switch.at), switch.reason)

        def op(conn: sqlite3.Connection) -> None:
            conn.execute(sql.INSERT_AUDIT_SWITCH, row)

        await self._commits.submit(op)

    # -- writing ----------------------------------------------------------------------------

    async def write_checkpoint(
        self, row: CheckpointRow, blobs: Sequence[BlobRow], guard: Guard | None = None
    ) -> set[str]:
        now = self.clock()

        if guard is None:
            def op(conn: sqlite3.Connection) -> set[str]:
                fell_back = _put_checkpoint(conn, row, blobs)
                conn.execute(sql.UPSERT_THREAD_WRITTEN, (row.thread_id, now))
                return fell_back
        else:
            # The check and the write are one job of the group commit, in its own SAVEPOINT:
            # a refusal fails this put alone, the other jobs of its group commit.
            def op(conn: sqlite3.Connection) -> set[str]:
                _check_put(conn, row, guard, now)
                fell_back = _put_checkpoint(conn, row, blobs)
                conn.execute(sql.UPSERT_THREAD_WRITTEN, (row.thread_id, now))
                return fell_back

        return await self._commits.submit(op, light=True)  # type: ignore[no-any-return]

    async def write_batch(
        self, items: Sequence[BatchItem], guards: Sequence[Guard | None] | None = None
    ) -> list[set[str]]:
        """The items in order, as one operation of the group commit: one job on the writer's
        thread, in one SAVEPOINT of one transaction (all of the batch or none of it). Each
        item runs the very statements of its single-item method, so a delta sees the rows of
        earlier items (its base may be one of them), and each item's guard is checked just
        before it is written, against the rows of the items before it: a refusal rolls the
        job's SAVEPOINT back, leaving nothing of the batch."""
        batch = list(items)
        if not batch:
            return []
        checks = [None] * len(batch) if guards is None else list(guards)
        if len(checks) != len(batch):
            raise ValueError(f"{len(checks)} guards for {len(batch)} batch items")
        now = self.clock()
        threads: dict[str, None] = {}  # each thread's lifecycle row once per batch
        for item in batch:
            if isinstance(item, tuple):
                threads[item[0].thread_id] = None
            else:
                threads.update(dict.fromkeys(w.thread_id for w in item))

        def op(conn: sqlite3.Connection) -> list[set[str]]:
            out: list[set[str]] = []
            for item, guard in zip(batch, checks, strict=True):
                if isinstance(item, tuple):
                    if guard is not None:
                        _check_put(conn, item[0], guard, now)
                    out.append(_put_checkpoint(conn, *item))
                else:
                    if guard is not None and item:
                        _check_writes(conn, item, guard, now)
                    _put_writes(conn, item)
            _wrote(conn, threads, now)
            return out

        return await self._commits.submit(  # type: ignore[no-any-return]
            op, light=len(batch) <= _LIGHT_BATCH)

    async def write_writes(self, rows: Sequence[WriteRow], guard: Guard | None = None) -> None:
        if not rows:
            return
        now = self.clock()
        threads = dict.fromkeys(r.thread_id for r in rows)

        def op(conn: sqlite3.Connection) -> None:
            if guard is not None:
                _check_writes(conn, rows, guard, now)
            _put_writes(conn, rows)
            _wrote(conn, threads, now)

        await self._commits.submit(op, light=True)

    async def delete_thread(self, thread_id: str, tombstone: bool = False) -> None:
        at = self.clock() if tombstone else None

        def op(conn: sqlite3.Connection) -> None:
            _delete_thread(conn, thread_id, at)

        await self._commits.submit(op)

    async def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        now = self.clock()

        def op(conn: sqlite3.Connection) -> None:
            for statement in sql.COPY_THREAD:
                conn.execute(statement, (target_thread_id, source_thread_id))
            conn.execute(sql.UPSERT_THREAD_COPIED, (target_thread_id, now, source_thread_id))

        await self._commits.submit(op)

    async def delete_checkpoints(
        self, thread_id: str, victims: Collection[tuple[str, str]], gc: GcPlanner
    ) -> None:
        keys = [(thread_id, ns, cid) for ns, cid in victims]

        # Safe against writers without more: this runs in the write transaction (BEGIN
        # IMMEDIATE), which every writer of the file, in any process, takes in turn.
        def op(conn: sqlite3.Connection) -> None:
            conn.executemany(sql.DELETE_CHECKPOINT, keys)
            conn.executemany(sql.DELETE_CHECKPOINT_WRITES, keys)
            remaining = [_checkpoint(r) for r in
                         conn.execute(sql.SELECT_THREAD_CHECKPOINTS, (thread_id,))]
            refs = [BlobRef(*r) for r in conn.execute(sql.SELECT_THREAD_BLOB_REFS, (thread_id,))]
            dead = [(thread_id, *k) for k in gc(remaining, refs)]
            if dead:
                conn.executemany(sql.DELETE_BLOB, dead)

        await self._commits.submit(op)

    async def rewrite_checkpoint(
        self,
        row: CheckpointRow,
        blobs: Sequence[BlobRow],
        writes: Sequence[WriteRow] | None,
        entry: MigrationEntry,
    ) -> bool:
        tid, ns, cid = row.thread_id, row.checkpoint_ns, row.checkpoint_id
        new_writes = None if writes is None else [
            (tid, ns, cid, w.task_id, w.idx, w.channel, w.type, w.data, w.task_path)
            for w in writes
        ]
        log = (entry.thread_id, entry.checkpoint_ns, entry.checkpoint_id,
               int(entry.from_version), int(entry.to_version), float(entry.migrated_at))
        now = self.clock()

        def op(conn: sqlite3.Connection) -> bool:
            # Both checks come before any change, so a False leaves the savepoint untouched.
            if conn.execute(sql.CHECKPOINT_EXISTS, (tid, ns, cid)).fetchone() is None:
                return False
            if conn.execute(sql.INSERT_SCHEMA_LOG, log).rowcount == 0:
                return False  # this migration of this checkpoint is logged already
            conn.execute(
                sql.UPDATE_CHECKPOINT,
                (row.parent_checkpoint_id, row.run_id, *row.checkpoint, *row.metadata,
                 tid, ns, cid),
            )
            _put_blobs(conn, tid, ns, blobs)
            if new_writes is not None:
                conn.execute(sql.DELETE_CHECKPOINT_WRITES, (tid, ns, cid))
                if new_writes:
                    _insert(conn, sql.INSERT_WRITE_REPLACE, new_writes)
            conn.execute(sql.UPSERT_THREAD_CHANGED, (tid, now))
            return True

        # Through the group commit, like every write: `op` runs in its own SAVEPOINT, rolled
        # back whole if it raises, so the rewrite and its log entry land together or not at all.
        return await self._commits.submit(op)  # type: ignore[no-any-return]

    async def reseal(self, thread_id: str, changes: Sequence[Reseal]) -> int:
        """Each change an UPDATE that matches only while the row holds its old values, all
        in one job of the group commit (one transaction); how many rows changed. The
        lifecycle row is left alone: a rotation is neither activity nor a change of state."""
        statements = [_reseal_params(thread_id, ch) for ch in changes]
        if not statements:
            return 0

        def op(conn: sqlite3.Connection) -> int:
            return sum(int(conn.execute(st, params).rowcount) for st, params in statements)

        return await self._commits.submit(op)  # type: ignore[no-any-return]

    # -- the thread lifecycle ---------------------------------------------------------------

    async def thread_states(
        self, cursor: str | None, limit: int
    ) -> tuple[list[ThreadState], str | None]:
        if cursor is None:
            rows = await self._fetchall(sql.SELECT_THREAD_STATES, (limit,))
        else:
            rows = await self._fetchall(sql.SELECT_THREAD_STATES_AFTER, (cursor, limit))
        states = [_thread_state(r) for r in rows]
        return states, (states[-1].thread_id if len(states) == limit else None)

    async def thread_state(self, thread_id: str) -> ThreadState | None:
        rows = await self._fetchall(sql.SELECT_THREAD_STATE, (thread_id,))
        return _thread_state(rows[0]) if rows else None

    async def _lifecycle_write(self, statement: str, params: Sequence[Any]) -> None:
        def op(conn: sqlite3.Connection) -> None:
            conn.execute(statement, params)

        await self._commits.submit(op, light=True)

    async def set_pinned(self, thread_id: str, pinned: bool) -> None:
        await self._lifecycle_write(sql.UPSERT_THREAD_PINNED,
                                    (thread_id, self.clock(), int(pinned)))

    async def set_policy(self, thread_id: str, policy: str | None) -> None:
        await self._lifecycle_write(sql.UPSERT_THREAD_POLICY, (thread_id, self.clock(), policy))

    async def touch_thread(self, thread_id: str) -> None:
        await self._lifecycle_write(sql.TOUCH_THREAD, (self.clock(), thread_id))

    async def mark_swept(self, thread_id: str, generation: int) -> None:
        await self._lifecycle_write(sql.MARK_SWEPT, (int(generation), thread_id))

    async def expire_thread(self, thread_id: str, generation: int, tombstone: bool = False
                            ) -> bool:
        at = self.clock() if tombstone else None

        # In the write transaction (BEGIN IMMEDIATE) every writer of the file, in any process,
        # takes in turn: no write of the thread can come between the check and the deletes.
        def op(conn: sqlite3.Connection) -> bool:
            found = conn.execute(sql.SELECT_GENERATION, (thread_id,)).fetchone()
            if found is None or int(found[0]) != generation:
                return False
            _delete_thread(conn, thread_id, at)
            return True

        return await self._commits.submit(op)  # type: ignore[no-any-return]

    async def _file(self) -> str:
        """The database's file ("" for a database in memory or a temporary one)."""
        if self._path is None:
            rows = await self._writer.call(
                lambda conn: conn.execute("PRAGMA database_list").fetchall())
            self._path = next((str(file or "") for _, name, file in rows if name == "main"), "")
        return self._path

    @contextlib.asynccontextmanager
    async def sweep_lock(self) -> AsyncIterator[bool]:
        """An exclusive `flock` of `<database file>-sweep.lock` (created beside the file, and
        left there, as SQLite leaves `-wal` and `-shm`): one sweeper per file across
        processes, and across checkpointers of one process too. The operating system drops
        it when its holder closes the file or dies, SIGKILL included. A database without a
        file (`":memory:"`), a lock file that cannot be made (a read-only directory) and
        Windows take a lock of this store's instead."""
        path = await self._file()
        fd = _open_lock(path + "-sweep.lock") if path else None
        if fd is None:
            async with try_lock(self._sweeping) as held:
                yield held
            return
        try:
            yield _flock(fd)
        finally:
            os.close(fd)  # releases the lock

    async def housekeep(self, limit: int | None) -> int:
        return 0  # nothing expires on its own here: every row is the sweeper's to delete

    async def log_lifecycle(self, events: Sequence[LifecycleEvent]) -> None:
        rows = [(float(e.at), e.action, e.thread, int(e.checkpoints), e.reason) for e in events]

        def op(conn: sqlite3.Connection) -> None:
            conn.executemany(sql.INSERT_LIFECYCLE, rows)

        if rows:
            await self._commits.submit(op)

    async def read_lifecycle(self, thread: str | None = None) -> list[LifecycleEvent]:
        if thread is None:
            rows = await self._fetchall(sql.SELECT_LIFECYCLE, ())
        else:
            rows = await self._fetchall(sql.SELECT_THREAD_LIFECYCLE, (thread,))
        return [LifecycleEvent(float(at), action, thread_, int(n), reason)
                for at, action, thread_, n, reason in rows]

    async def vacuum(self) -> tuple[int, int]:
        """Give the pages of deleted rows back to the file system: `PRAGMA incremental_vacuum`
        (a file not switched to incremental auto-vacuum yet is switched, by one VACUUM), then
        a checkpoint that truncates the WAL. Returns the bytes of the file and its WAL before
        and after (a WAL that readers of other processes still use stays until they finish).

        Nothing vacuums on its own after a sweep or an erasure: SQLite reuses the pages of
        deleted rows for the next writes, so a file under retention stops growing without it;
        `vacuum` is for giving the space to the file system, when wanted (it moves pages and
        holds the write lock meanwhile, so it is not run inside a writer's transaction)."""
        path = await self._file()

        def op(conn: sqlite3.Connection) -> tuple[int, int]:
            before = _file_size(conn, path)
            if _incremental_auto_vacuum(conn):
                # Not `execute`: it steps the pragma once, which frees a single page.
                conn.executescript("PRAGMA incremental_vacuum;")
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
            return before, _file_size(conn, path)

        return await self._writer.call(op)

    # -- one writer per thread: tombstones, leases, the epoch --------------------------------
    #
    # Changes go through the group commit (the write transaction every writer of the file
    # takes in turn), so a lease taken here and a guarded write elsewhere never interleave.

    async def _change(self, statement: str, params: Sequence[Any]) -> int:
        """Run one statement in the write transaction; the rows it changed."""
        def op(conn: sqlite3.Connection) -> int:
            return int(conn.execute(statement, params).rowcount)

        return await self._commits.submit(op, light=True)  # type: ignore[no-any-return]

    async def tombstone(self, thread_id: str) -> float | None:
        rows = await self._fetchall(sql.SELECT_TOMBSTONE, (thread_id,))
        return float(rows[0][0]) if rows else None

    async def drop_tombstones(self, before: float, limit: int | None) -> int:
        bound = -1 if limit is None else int(limit)

        def op(conn: sqlite3.Connection) -> int:
            conn.execute(sql.DELETE_DEAD_LEASES, (before, bound))
            return int(conn.execute(sql.DELETE_OLD_TOMBSTONES, (before, bound)).rowcount)

        return await self._commits.submit(op)  # type: ignore[no-any-return]

    async def acquire_lease(self, thread_id: str, token: str, ttl: float) -> bool:
        now = self.clock()
        return await self._change(sql.ACQUIRE_LEASE, (thread_id, token, now + ttl, now)) == 1

    async def renew_lease(self, thread_id: str, token: str, ttl: float) -> bool:
        now = self.clock()
        return await self._change(sql.RENEW_LEASE, (thread_id, token, now + ttl, now)) == 1

    async def release_lease(self, thread_id: str, token: str) -> None:
        await self._change(sql.RELEASE_LEASE, (thread_id, token))

    async def read_lease(self, thread_id: str) -> LeaseRow | None:
        rows = await self._fetchall(sql.SELECT_LEASE, (thread_id,))
        return (str(rows[0][0]), float(rows[0][1])) if rows else None

    async def read_epoch(self) -> int:
        rows = await self._fetchall(sql.SELECT_EPOCH, ())
        return int(rows[0][0]) if rows else 0

    async def raise_epoch(self, epoch: int) -> int:
        def op(conn: sqlite3.Connection) -> int:
            conn.execute(sql.RAISE_EPOCH, (int(epoch),))
            return int(conn.execute(sql.SELECT_EPOCH).fetchone()[0])

        return await self._commits.submit(op)  # type: ignore[no-any-return]

    # -- reading ----------------------------------------------------------------------------

    async def _fetchall(self, statement: str, params: Sequence[Any]) -> list[Any]:
        return await self._reader.call(lambda conn: conn.execute(statement, params).fetchall())

    async def read_checkpoint(
        self, thread_id: str, ns: str, checkpoint_id: str | None
    ) -> CheckpointRow | None:
        if checkpoint_id is None:
            rows = await self._fetchall(sql.SELECT_LATEST_CHECKPOINT, (thread_id, ns))
        else:
            rows = await self._fetchall(sql.SELECT_CHECKPOINT, (thread_id, ns, checkpoint_id))
        return _checkpoint(rows[0]) if rows else None

    def iter_checkpoints(self, query: ListQuery) -> AsyncIterator[CheckpointRow]:
        async def page(cursor: Cursor | None) -> list[CheckpointRow]:
            statement = sql.select_checkpoints(
                thread=query.thread_id is not None,
                ns=query.checkpoint_ns is not None,
                checkpoint_id=query.checkpoint_id is not None,
                before=query.before is not None,
                after_cursor=cursor is not None,
            )
            params = [*query.params, *(cursor or ()), _PAGE]
            return [_checkpoint(r) for r in await self._fetchall(statement, params)]

        return keyset_pages(page, _PAGE)

    async def read_ancestors(
        self, thread_id: str, ns: str, checkpoint_id: str, limit: int
    ) -> list[CheckpointRow]:
        rows = await self._fetchall(sql.SELECT_ANCESTORS, (thread_id, ns, checkpoint_id, limit))
        return [_checkpoint(r) for r in rows]

    async def read_tuple(
        self,
        thread_id: str,
        ns: str,
        checkpoint_id: str | None,
        wanted: Callable[[CheckpointRow], Collection[tuple[str, str]]],
    ) -> tuple[CheckpointRow, dict[tuple[str, str], BlobRow], list[WriteRow]] | None:
        def op(conn: sqlite3.Connection) -> Any:
            if checkpoint_id is None:
                found = conn.execute(sql.SELECT_LATEST_CHECKPOINT, (thread_id, ns)).fetchone()
            else:
                found = conn.execute(
                    sql.SELECT_CHECKPOINT, (thread_id, ns, checkpoint_id)
                ).fetchone()
            if found is None:
                return None
            row = _checkpoint(found)
            blobs = _blobs(conn, thread_id, ns, wanted(row))
            writes = _writes(conn, thread_id, ns, [row.checkpoint_id], None)
            return row, blobs, writes.get(row.checkpoint_id, [])

        return await self._reader.call(op)

    async def read_blobs(
        self, thread_id: str, ns: str, keys: Collection[tuple[str, str]]
    ) -> dict[tuple[str, str], BlobRow]:
        return await self._reader.call(lambda conn: _blobs(conn, thread_id, ns, keys))

    async def read_writes(
        self,
        thread_id: str,
        ns: str,
        checkpoint_ids: Collection[str],
        channels: Collection[str] | None = None,
    ) -> dict[str, list[WriteRow]]:
        if channels is not None and not channels:
            return {}
        ids = list(checkpoint_ids)
        return await self._reader.call(lambda conn: _writes(conn, thread_id, ns, ids, channels))

    async def read_migrations(self, thread_id: str | None = None) -> list[MigrationEntry]:
        if thread_id is None:
            rows = await self._fetchall(sql.SELECT_SCHEMA_LOG, ())
        else:
            rows = await self._fetchall(sql.SELECT_THREAD_SCHEMA_LOG, (thread_id,))
        return [
            MigrationEntry(tid, ns, cid, int(old), int(new), float(at))
            for tid, ns, cid, old, new, at in rows
        ]

    async def thread_ids(self) -> list[str]:
        return [r[0] for r in await self._fetchall(sql.SELECT_THREAD_IDS, ())]

    async def sizes(self, thread_id: str) -> list[StoredSize]:
        rows = await self._fetchall(sql.SELECT_THREAD_SIZES, (thread_id,))
        return sorted(StoredSize(ns, kind, ch, int(n), int(size or 0))
                      for ns, kind, ch, n, size in rows)

    async def find_runs(self, run_ids: Collection[str]) -> list[tuple[str, str, str]]:
        out: list[tuple[str, str, str]] = []
        for chunk in _chunks(list(run_ids)):
            out += [tuple(r) for r in await self._fetchall(sql.select_runs(len(chunk)), chunk)]
        return out

    def refuses(self, exc: BaseException) -> bool:
        """None of sqlite3's errors is taken for a refusal: every error that is not a caller
        error counts as an outage (an `IntegrityError` too)."""
        return False

    async def close(self) -> None:
        if not self.owns_connections:
            return
        self._commits.close_inline()
        await self._writer.conn.close()
        if self._reader is not self._writer:
            await self._reader.conn.close()
