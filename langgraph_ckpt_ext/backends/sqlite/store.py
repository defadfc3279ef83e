"""`SQLiteStore`: the rows of `StoreCheckpointer` in one SQLite file, through aiosqlite."""

from __future__ import annotations

import datetime as dt
import sqlite3
from collections.abc import AsyncIterator, Callable, Collection, Iterable, Sequence
from typing import Any

import aiosqlite

from ...core.errors import check_storage_version
from ...core.rows import (
    AuditSwitch,
    BlobRef,
    BlobRow,
    CheckpointRow,
    ListQuery,
    MigrationEntry,
    StoredSize,
    WriteRow,
    whole,
)
from ...core.store import BatchItem, Cursor, GcPlanner, keyset_pages
from . import sql
from .migrations import LATEST, MIGRATIONS
from .worker import Db, GroupCommit

_CHUNK = 400  # keys per statement, well under SQLite's bound-parameter limit
_PAGE = 64  # checkpoint rows per `list` page


def _checkpoint(r: Iterable[Any]) -> CheckpointRow:
    tid, ns, cid, parent, run_id, type_, data, md_type, md = r
    return CheckpointRow(tid, ns, cid, parent, run_id, (type_, data), (md_type, md))


def _chunks(items: Sequence[Any], size: int = _CHUNK) -> Iterable[Sequence[Any]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def _migrate(conn: sqlite3.Connection) -> int:
    conn.execute(sql.CREATE_MIGRATIONS)
    while True:
        conn.execute("BEGIN IMMEDIATE")
        try:
            current = int(conn.execute(sql.SELECT_STORAGE_VERSION).fetchone()[0])
            check_storage_version(current, LATEST)
            if current < LATEST:
                for statement in MIGRATIONS[current]:
                    conn.execute(statement)
                now = dt.datetime.now(dt.timezone.utc).isoformat()
                conn.execute(sql.INSERT_MIGRATION, (current + 1, now))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        if current >= LATEST:
            return current


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
        conn.executemany(sql.UPSERT_BLOB, [(tid, ns, *f) for f in full])
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
        conn.executemany(sql.INSERT_WRITE_KEEP, keep)
    if replace:
        conn.executemany(sql.INSERT_WRITE_REPLACE, replace)


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

    def __init__(self, writer: aiosqlite.Connection, reader: aiosqlite.Connection | None) -> None:
        self._writer = Db(writer)
        self._reader = Db(reader) if reader is not None else self._writer
        self._commits = GroupCommit(self._writer)
        self.owns_connections = True

    async def migrate(self) -> int:
        """Apply pending storage migrations; returns the storage version now in force."""
        return await self._writer.call(_migrate)

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

    async def write_checkpoint(self, row: CheckpointRow, blobs: Sequence[BlobRow]) -> set[str]:
        return await self._commits.submit(  # type: ignore[no-any-return]
            lambda conn: _put_checkpoint(conn, row, blobs)
        )

    async def write_batch(self, items: Sequence[BatchItem]) -> list[set[str]]:
        """The items in order, as one operation of the group commit: one job on the writer's
        thread, in one SAVEPOINT of one transaction (all of the batch or none of it). Each
        item runs the very statements of its single-item method, so a delta sees the rows of
        earlier items (its base may be one of them)."""
        batch = list(items)
        if not batch:
            return []

        def op(conn: sqlite3.Connection) -> list[set[str]]:
            out: list[set[str]] = []
            for item in batch:
                if isinstance(item, tuple):
                    out.append(_put_checkpoint(conn, *item))
                else:
                    _put_writes(conn, item)
            return out

        return await self._commits.submit(op)  # type: ignore[no-any-return]

    async def write_writes(self, rows: Sequence[WriteRow]) -> None:
        await self._commits.submit(lambda conn: _put_writes(conn, rows))

    async def delete_thread(self, thread_id: str) -> None:
        def op(conn: sqlite3.Connection) -> None:
            for statement in sql.DELETE_THREAD:
                conn.execute(statement, (thread_id,))

        await self._commits.submit(op)

    async def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        def op(conn: sqlite3.Connection) -> None:
            for statement in sql.COPY_THREAD:
                conn.execute(statement, (target_thread_id, source_thread_id))

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
                    conn.executemany(sql.INSERT_WRITE_REPLACE, new_writes)
            return True

        # Through the group commit, like every write: `op` runs in its own SAVEPOINT, rolled
        # back whole if it raises, so the rewrite and its log entry land together or not at all.
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
        await self._writer.conn.close()
        if self._reader is not self._writer:
            await self._reader.conn.close()
