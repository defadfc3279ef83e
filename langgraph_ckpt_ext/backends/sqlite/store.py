"""`SQLiteStore`: the rows of `StoreCheckpointer` in one SQLite file, through aiosqlite."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator, Collection, Iterable, Sequence
from typing import Any

import aiosqlite

from ...core.bridge import AsyncMutex
from ...core.errors import StorageVersionError
from ...core.rows import BlobRef, BlobRow, CheckpointRow, ListQuery, WriteRow
from ...core.store import GcPlanner
from . import sql
from .migrations import LATEST, MIGRATIONS

_CHUNK = 400  # keys per statement, well under SQLite's bound-parameter limit
_PAGE = 64  # checkpoint rows per `list` page


def _checkpoint(r: Iterable[Any]) -> CheckpointRow:
    tid, ns, cid, parent, run_id, type_, data, md_type, md = r
    return CheckpointRow(tid, ns, cid, parent, run_id, (type_, data), (md_type, md))


def _chunks(items: Sequence[Any], size: int = _CHUNK) -> Iterable[Sequence[Any]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


class _NoLock:
    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, *exc: object) -> None:
        return None


class SQLiteStore:
    """Rows in SQLite. Writes go through one connection, one transaction at a time
    (`BEGIN IMMEDIATE`, so processes sharing the file queue on the busy timeout); reads of a
    file database use a second connection, which in WAL mode sees only committed data."""

    inline = False

    def __init__(self, writer: aiosqlite.Connection, reader: aiosqlite.Connection | None) -> None:
        self._writer = writer
        self._reader = reader or writer
        self._write_lock = AsyncMutex()
        # One shared connection (":memory:") must not read inside another call's transaction.
        self._read_lock: AsyncMutex | _NoLock = self._write_lock if reader is None else _NoLock()
        self.owns_connections = True

    # -- set-up -------------------------------------------------------------------------------

    async def migrate(self) -> int:
        """Apply pending storage migrations; returns the storage version now in force."""
        async with self._write_lock:
            await self._writer.execute(sql.CREATE_MIGRATIONS)
            while True:
                await self._writer.execute("BEGIN IMMEDIATE")
                try:
                    async with self._writer.execute(sql.SELECT_STORAGE_VERSION) as cur:
                        row = await cur.fetchone()
                    current = int(row[0]) if row else 0
                    if current > LATEST:
                        raise StorageVersionError(
                            f"this database has storage version {current}, newer than the "
                            f"{LATEST} this langgraph-ckpt-ext knows: upgrade the package"
                        )
                    if current == LATEST:
                        await self._writer.execute("COMMIT")
                        return current
                    for statement in MIGRATIONS[current]:
                        await self._writer.execute(statement)
                    now = dt.datetime.now(dt.timezone.utc).isoformat()
                    await self._writer.execute(sql.INSERT_MIGRATION, (current + 1, now))
                    await self._writer.execute("COMMIT")
                except BaseException:
                    await self._writer.execute("ROLLBACK")
                    raise

    # -- writing ----------------------------------------------------------------------------

    async def _transaction(self, *steps: tuple[str, Sequence[Any]]) -> None:
        async with self._write_lock:
            await self._writer.execute("BEGIN IMMEDIATE")
            try:
                for statement, params in steps:
                    await self._writer.execute(statement, params)
                await self._writer.execute("COMMIT")
            except BaseException:
                await self._writer.execute("ROLLBACK")
                raise

    async def write_checkpoint(self, row: CheckpointRow, blobs: Sequence[BlobRow]) -> set[str]:
        tid, ns = row.thread_id, row.checkpoint_ns
        full = [b for b in blobs if b.base_version is None]
        fell_back: set[str] = set()
        w = self._writer
        async with self._write_lock:
            await w.execute("BEGIN IMMEDIATE")
            try:
                for b in blobs:
                    if b.base_version is None:
                        continue
                    cur = await w.execute(
                        sql.INSERT_DELTA_IF_BASE,
                        (tid, ns, b.channel, b.version, b.type, b.data, b.base_version),
                    )
                    if cur.rowcount == 0:  # the base is gone (pruned, or another process)
                        assert b.full is not None
                        full.append(BlobRow(b.channel, b.version, *b.full()))
                        fell_back.add(b.channel)
                if full:
                    await w.executemany(
                        sql.UPSERT_BLOB,
                        [(tid, ns, b.channel, b.version, b.type, b.data) for b in full],
                    )
                await w.execute(
                    sql.UPSERT_CHECKPOINT,
                    (
                        tid,
                        ns,
                        row.checkpoint_id,
                        row.parent_checkpoint_id,
                        row.run_id,
                        *row.checkpoint,
                        *row.metadata,
                    ),
                )
                await w.execute("COMMIT")
            except BaseException:
                await w.execute("ROLLBACK")
                raise
        return fell_back

    async def write_writes(self, rows: Sequence[WriteRow]) -> None:
        def params(r: WriteRow) -> tuple[Any, ...]:
            return (
                r.thread_id,
                r.checkpoint_ns,
                r.checkpoint_id,
                r.task_id,
                r.idx,
                r.channel,
                r.type,
                r.data,
                r.task_path,
            )

        keep = [params(r) for r in rows if r.idx >= 0]
        replace = [params(r) for r in rows if r.idx < 0]
        async with self._write_lock:
            await self._writer.execute("BEGIN IMMEDIATE")
            try:
                if keep:
                    await self._writer.executemany(sql.INSERT_WRITE_KEEP, keep)
                if replace:
                    await self._writer.executemany(sql.INSERT_WRITE_REPLACE, replace)
                await self._writer.execute("COMMIT")
            except BaseException:
                await self._writer.execute("ROLLBACK")
                raise

    async def delete_thread(self, thread_id: str) -> None:
        await self._transaction(*((s, (thread_id,)) for s in sql.DELETE_THREAD))

    async def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await self._transaction(*((s, (target_thread_id, source_thread_id)) for s in sql.COPY_THREAD))

    async def delete_checkpoints(
        self, thread_id: str, victims: Collection[tuple[str, str]], gc: GcPlanner
    ) -> None:
        w = self._writer
        keys = [(thread_id, ns, cid) for ns, cid in victims]
        async with self._write_lock:
            await w.execute("BEGIN IMMEDIATE")
            try:
                await w.executemany(sql.DELETE_CHECKPOINT, keys)
                await w.executemany(sql.DELETE_CHECKPOINT_WRITES, keys)
                remaining = [
                    _checkpoint(r)
                    for r in await w.execute_fetchall(sql.SELECT_THREAD_CHECKPOINTS, (thread_id,))
                ]
                refs = [
                    BlobRef(*r)
                    for r in await w.execute_fetchall(sql.SELECT_THREAD_BLOB_REFS, (thread_id,))
                ]
                dead = [(thread_id, *k) for k in gc(remaining, refs)]
                if dead:
                    await w.executemany(sql.DELETE_BLOB, dead)
                await w.execute("COMMIT")
            except BaseException:
                await w.execute("ROLLBACK")
                raise

    # -- reading ----------------------------------------------------------------------------

    async def _fetchall(self, statement: str, params: Sequence[Any]) -> Iterable[Any]:
        async with self._read_lock:
            return await self._reader.execute_fetchall(statement, params)

    async def read_checkpoint(
        self, thread_id: str, ns: str, checkpoint_id: str | None
    ) -> CheckpointRow | None:
        if checkpoint_id is None:
            rows = await self._fetchall(sql.SELECT_LATEST_CHECKPOINT, (thread_id, ns))
        else:
            rows = await self._fetchall(sql.SELECT_CHECKPOINT, (thread_id, ns, checkpoint_id))
        for r in rows:
            return _checkpoint(r)
        return None

    async def iter_checkpoints(self, query: ListQuery) -> AsyncIterator[CheckpointRow]:
        base: list[Any] = [
            v
            for v in (query.thread_id, query.checkpoint_ns, query.checkpoint_id, query.before)
            if v is not None
        ]
        cursor: tuple[str, str, str] | None = None
        while True:
            statement = sql.select_checkpoints(
                thread=query.thread_id is not None,
                ns=query.checkpoint_ns is not None,
                checkpoint_id=query.checkpoint_id is not None,
                before=query.before is not None,
                after_cursor=cursor is not None,
            )
            params = [*base, *(cursor or ()), _PAGE]
            page = [_checkpoint(r) for r in await self._fetchall(statement, params)]
            for row in page:
                yield row
            if len(page) < _PAGE:
                return
            last = page[-1]
            cursor = (last.checkpoint_id, last.thread_id, last.checkpoint_ns)

    async def read_ancestors(
        self, thread_id: str, ns: str, checkpoint_id: str, limit: int
    ) -> list[CheckpointRow]:
        rows = await self._fetchall(sql.SELECT_ANCESTORS, (thread_id, ns, checkpoint_id, limit))
        return [_checkpoint(r) for r in rows]

    async def read_blobs(
        self, thread_id: str, ns: str, keys: Collection[tuple[str, str]]
    ) -> dict[tuple[str, str], BlobRow]:
        out: dict[tuple[str, str], BlobRow] = {}
        for chunk in _chunks(sorted(keys)):
            params = [thread_id, ns, *(x for key in chunk for x in key)]
            for ch, ver, type_, data, base in await self._fetchall(sql.select_blobs(len(chunk)), params):
                out[(ch, ver)] = BlobRow(ch, ver, type_, data, base)
        return out

    async def read_writes(
        self,
        thread_id: str,
        ns: str,
        checkpoint_ids: Collection[str],
        channels: Collection[str] | None = None,
    ) -> dict[str, list[WriteRow]]:
        out: dict[str, list[WriteRow]] = {}
        chans = sorted(channels) if channels is not None else []
        if channels is not None and not chans:
            return out
        for chunk in _chunks(list(checkpoint_ids)):
            statement = sql.select_writes(len(chunk), len(chans))
            for r in await self._fetchall(statement, [thread_id, ns, *chunk, *chans]):
                row = WriteRow(*r)
                out.setdefault(row.checkpoint_id, []).append(row)
        return out

    async def find_runs(self, run_ids: Collection[str]) -> list[tuple[str, str, str]]:
        out: list[tuple[str, str, str]] = []
        for chunk in _chunks(list(run_ids)):
            out += [tuple(r) for r in await self._fetchall(sql.select_runs(len(chunk)), chunk)]
        return out

    async def close(self) -> None:
        if not self.owns_connections:
            return
        await self._writer.close()
        if self._reader is not self._writer:
            await self._reader.close()
