"""`PostgresStore`: the rows of `StoreCheckpointer` in PostgreSQL, through asyncpg pools."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import asyncpg

from ...core.errors import (
    ConcurrentWriteError,
    InvalidConfigError,
    StoreBusyError,
    StoreUnavailableError,
    check_storage_version,
)
from ...core.guard import Guard, LeaseRow, put_refusal, writes_refusal
from ...core.perloop import PerLoop, running_loop
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
)
from ...core.rows import (
    whole as whole_row,
)
from ...core.store import BatchItem, Cursor, GcPlanner, keyset_pages
from ...core.telemetry import count
from ...core.urls import redact
from .. import sqlstate
from . import sql
from .guarding import Facts, Seen, missed
from .migrations import LATEST, MIGRATIONS

T = TypeVar("T")
_log = logging.getLogger("langgraph_ckpt_ext.postgres")
_PAGE = 64
_ATTEMPTS = 3

# What a server restart or a terminated backend looks like to a client.
_CONNECTION_LOST = (
    asyncpg.exceptions.ConnectionDoesNotExistError,
    asyncpg.exceptions.CannotConnectNowError,
    asyncpg.exceptions.AdminShutdownError,
    asyncpg.exceptions.ConnectionFailureError,
    asyncpg.exceptions.InterfaceError,
    asyncpg.exceptions.InternalClientError,
    ConnectionError,
    OSError,
)


class _Lost(Exception):
    """An error raised by a connection that the server closed under it."""


REPLICA_RETRY = 5.0
"""Seconds a read replica that failed is left out before it is tried again."""
_REPLAY_POLL = 0.02
_UNKNOWN_LSN = (1 << 63) - 1  # a write whose position was not read: no replica has it


@dataclass
class _Replica:
    """A read replica: its pools (one per event loop), when it may be tried again, and the
    last WAL position it was seen to have replayed."""

    dsn: str
    pools: PerLoop[asyncpg.Pool]
    down_until: float = 0.0
    replayed: int = -1


async def _keep(conn: asyncpg.Connection) -> None:
    return None


def _checkpoint(r: Any) -> CheckpointRow:
    return CheckpointRow(r[0], r[1], r[2], r[3], r[4], (r[5], r[6]), (r[7], r[8]))


def _state(r: Any) -> ThreadState:
    return ThreadState(r[0], float(r[1]), float(r[2]), None if r[3] is None else float(r[3]),
                       int(r[4]), bool(r[5]), r[6], None if r[7] is None else int(r[7]))


IDLE_IN_TRANSACTION = "60s"
"""Default server limit on a session idle inside a transaction (`server_settings` overrides)."""


class PostgresStore:
    """Rows in PostgreSQL. Each operation takes a connection of the pool of the caller's event
    loop (asyncpg pools belong to one loop; the store opens one per loop from its DSN), so
    requests run on many connections at once. A write is one transaction; every write is
    idempotent, so one that met a lost connection is retried, as reads are."""

    inline = False
    wants_versions = False

    def __init__(
        self,
        *,
        dsn: str | None = None,
        pool: asyncpg.Pool | None = None,
        pool_options: dict[str, Any] | None = None,
        schema: str | None = None,
        read_replicas: Sequence[str] = (),
        replica_wait: float = 0.5,
    ) -> None:
        if dsn is None and pool is None:
            raise InvalidConfigError("PostgresStore needs a DSN or a pool")
        self._dsn = dsn
        self.clock: Callable[[], float] = time.time
        self._seen = Seen()  # facts of guarded writes that rarely change (`guarding`)
        self._schema = schema  # validated by the checkpointer; created by `migrate`
        # A pool per event loop: start each small, let it grow under load. Our operations leave
        # no session state (locks are transaction-scoped, settings come with the connection), so
        # a released connection needs no reset query: one round trip less per operation.
        self._options = {"min_size": 1, "max_size": 10, "reset": _keep, **(pool_options or {})}
        # No transaction of ours waits on anything but the server; one left open by a caller's
        # event loop closed mid-write (its socket unclosed until garbage-collected) would hold
        # its locks, and block prune or DDL, for as long: the server ends it after a minute.
        settings = dict(self._options.get("server_settings") or {})
        settings.setdefault("idle_in_transaction_session_timeout", IDLE_IN_TRANSACTION)
        self._options["server_settings"] = settings
        self._pools: PerLoop[asyncpg.Pool] = PerLoop(
            lambda: asyncpg.create_pool(self._dsn, **self._options),
            lambda pool: pool.close(),
            lambda pool: pool.terminate(),
        )
        if pool is not None:
            self._pools.give(running_loop(), pool)
        # A replica that does not answer is left out quickly: reads go to the primary.
        replica_options = {**self._options, "timeout": min(
            float(self._options.get("timeout", 5.0)), 5.0)}
        self._replicas = [
            _Replica(r, PerLoop(
                lambda r=r: asyncpg.create_pool(r, **replica_options),  # type: ignore[misc]
                lambda pool: pool.close(), lambda pool: pool.terminate()))
            for r in read_replicas]
        self._replica_wait = replica_wait
        self._turn = 0
        self._written = 0  # WAL position of this store's last committed write (0: none)
        self._lost_positions = 0

    async def _pool(self) -> asyncpg.Pool:
        if self._dsn is not None:
            return await self._pools.open()
        loop = asyncio.get_running_loop()
        # Without a DSN, only the given pool: a pool given outside any loop serves them all.
        pool = self._pools.lookup(loop) or self._pools.lookup(None)
        if pool is None:
            raise InvalidConfigError(
                "this checkpointer was given an asyncpg pool of another event loop: "
                "use its async methods on that loop, or pass dsn= so that it can open "
                "a pool for this one (sync calls run on a loop of their own)"
            )
        return pool

    async def _run(self, fn: Callable[[asyncpg.Connection], Awaitable[T]], *, tx: bool,
                   write: bool = True) -> T:
        """`fn` on a primary connection (in a transaction if `tx`), retried on a lost
        connection. After a `write`, with read replicas, the WAL position it committed at is
        noted (one more round trip): reads that must see it wait for a replica to reach it."""
        for attempt in range(_ATTEMPTS):
            try:
                pool = await self._pool()
                async with pool.acquire() as conn:
                    try:
                        if not tx:
                            result = await fn(conn)
                        else:
                            async with conn.transaction():
                                result = await fn(conn)
                        if write and self._replicas:
                            await self._note_position(conn)
                        return result
                    except Exception as exc:
                        # A terminated backend surfaces as many error types; a closed
                        # connection says what happened.
                        if conn.is_closed() and not isinstance(exc, _CONNECTION_LOST):
                            raise _Lost(exc) from exc
                        raise
            except (*_CONNECTION_LOST, _Lost) as exc:
                cause = exc.__cause__ if isinstance(exc, _Lost) else exc
                if attempt == _ATTEMPTS - 1:
                    raise StoreUnavailableError(
                        f"PostgreSQL connection lost ({type(cause).__name__}: {cause}); tried "
                        f"{_ATTEMPTS} times. Nothing was half-written; the pool reconnects, so "
                        "retry the call once the server is back"
                    ) from cause
                count(retries=1)  # on the operation's span, if it is traced
                await asyncio.sleep(0.2 * (attempt + 1))
        raise AssertionError("unreachable")

    async def _note_position(self, conn: asyncpg.Connection) -> None:
        lost = self._lost_positions
        try:
            at = int(await conn.fetchval(sql.CURRENT_LSN))
        except Exception:  # committed all the same: no replica is trusted with it until
            self._lost_positions += 1  # a position read after this one covers it
            self._written = _UNKNOWN_LSN
            return
        if self._written == _UNKNOWN_LSN and lost == self._lost_positions:
            self._written = at  # read after every position lost so far
        else:
            self._written = max(self._written, at)

    async def _read(self, fn: Callable[[asyncpg.Connection], Awaitable[T]], *,
                    fresh: bool) -> T:
        """`fn` on a read replica when one may serve it, else on the primary. `fresh`: the
        read must see this store's own writes, so a replica serves it only once it has
        replayed the last (waiting up to `replica_wait` seconds). A replica that fails is left
        out for `REPLICA_RETRY` seconds, the read done on the primary."""
        replica = await self._replica(fresh) if self._replicas else None
        if replica is not None:
            try:
                pool = await replica.pools.open()
                async with pool.acquire() as conn:
                    return await fn(conn)
            except (*_CONNECTION_LOST, asyncpg.PostgresError) as exc:
                # Down, or a query cancelled by replay (a recovery conflict): the primary
                # answers (a real error of the query raises there too).
                self._left_out(replica, exc)
        return await self._run(fn, tx=False, write=False)

    def _left_out(self, replica: _Replica, exc: BaseException) -> None:
        if replica.down_until == 0.0 or isinstance(exc, asyncpg.PostgresError):
            _log.warning("read replica %s failed (%s: %s): reading from the primary",
                         redact(replica.dsn), type(exc).__name__, exc)
        replica.down_until = time.monotonic() + REPLICA_RETRY

    async def _replica(self, fresh: bool) -> _Replica | None:
        """The next replica in turn that is up and (for a `fresh` read) has replayed this
        store's last write, or None: read from the primary."""
        now = time.monotonic()
        live = [r for r in self._replicas if r.down_until <= now]
        if not live:
            return None
        replica = live[self._turn % len(live)]
        self._turn += 1
        target = self._written if fresh else 0
        if replica.replayed >= target:
            return replica
        deadline = now + self._replica_wait
        while True:
            try:
                pool = await replica.pools.open()
                replica.replayed = int(await pool.fetchval(sql.REPLAYED_LSN))
            except (*_CONNECTION_LOST, asyncpg.PostgresError) as exc:
                self._left_out(replica, exc)
                return None
            if replica.replayed >= target:
                return replica
            if time.monotonic() >= deadline:
                return None
            await asyncio.sleep(_REPLAY_POLL)

    # -- set-up -------------------------------------------------------------------------------

    async def migrate(self) -> int:
        """Create the schema (if named) and apply pending migrations under an advisory lock."""

        async def step(conn: asyncpg.Connection) -> tuple[int, bool]:
            await conn.execute(sql.LOCK_MIGRATIONS, sql.MIGRATION_LOCK)
            if self._schema is not None:
                await conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{self._schema}"')
            await conn.execute(sql.CREATE_MIGRATIONS)
            current = int(await conn.fetchval(sql.SELECT_STORAGE_VERSION))
            check_storage_version(current, LATEST)
            if current == LATEST:
                return current, True
            for statement in MIGRATIONS[current]:
                # `$1`: the time a step stamps on the rows it backfills.
                await conn.execute(statement, *((self.clock(),) if "$1" in statement else ()))
            await conn.execute(sql.INSERT_MIGRATION, current + 1)
            return current + 1, current + 1 == LATEST

        while True:
            version, done = await self._run(step, tx=True)
            if done:
                return version

    async def storage_version(self) -> int:
        async def op(conn: asyncpg.Connection) -> int:
            if not await conn.fetchval(sql.MIGRATIONS_TABLE_EXISTS):
                return 0
            return int(await conn.fetchval(sql.SELECT_STORAGE_VERSION))

        return await self._run(op, tx=False)

    async def read_audit_log(self, last: bool = False) -> list[AuditSwitch]:
        async def op(conn: asyncpg.Connection) -> list[AuditSwitch]:
            try:
                rows = await conn.fetch(sql.SELECT_AUDIT_LAST if last else sql.SELECT_AUDIT_LOG)
            except asyncpg.exceptions.UndefinedTableError:
                return []  # storage older than the log: never switched
            return [AuditSwitch(bool(r[0]), float(r[1]), str(r[2])) for r in rows]

        return await self._run(op, tx=False)

    async def log_audit_switch(self, switch: AuditSwitch) -> None:
        async def op(conn: asyncpg.Connection) -> None:
            await conn.execute(sql.INSERT_AUDIT_SWITCH, switch.enabled, switch.at, switch.reason)

        await self._run(op, tx=True)

    # -- the threads' locks (see `sql.THREAD_LOCK`) -------------------------------------------

    def thread_lock_key(self, thread_id: str) -> int:
        """The key of a thread's advisory lock (class `sql.THREAD_LOCK`): a hash, so two
        threads may share one (then one waits for the other's prune, nothing worse)."""
        return zlib.crc32(f"{self._schema or ''}\0{thread_id}".encode()) - (1 << 31)

    async def _alone(self, thread_id: str, fn: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
        """Run `fn` in a transaction that holds the thread's lock alone: once the writers
        holding it are done, and before any other starts. `StoreBusyError` if they hold it
        longer than lock_timeout (nothing is changed then)."""

        async def op(conn: asyncpg.Connection) -> T:
            await conn.execute(sql.LOCK_THREAD, self.thread_lock_key(thread_id))
            return await fn(conn)

        try:
            return await self._run(op, tx=True)
        except asyncpg.exceptions.LockNotAvailableError as exc:
            raise StoreBusyError(
                f"thread {thread_id!r} is busy: it was being written for longer than "
                "lock_timeout (the session's, else 5 s); nothing was changed, retry"
            ) from exc

    # -- writing ----------------------------------------------------------------------------

    async def write_checkpoint(
        self, row: CheckpointRow, blobs: Sequence[BlobRow], guard: Guard | None = None
    ) -> set[str]:
        """One statement, one round trip, also with a `guard` when the thread is as this
        process expects it (the put chains onto the head; see `guarding`); otherwise, and
        when a prune holds the thread or a delta's base is gone, a transaction holding the
        thread: its facts read under its locks, the decision (`core.guard.put_refusal`), the
        write."""
        key, now = self.thread_lock_key(row.thread_id), self.clock()
        params = _put_params(row, blobs, key, now)
        if guard is None:
            found = await self._run(
                lambda conn: conn.fetchrow(sql.PUT_CHECKPOINT, *params), tx=False)
        else:
            found = await self._put_guarded(row, guard, params, now)
        if found is not None and found["stored"]:
            return set()

        async def op(conn: asyncpg.Connection) -> set[str]:
            if guard is not None:
                facts = await self._facts(
                    conn, [key], [(row.thread_id, row.checkpoint_ns, row.checkpoint_id)],
                    guard.epoch is not None, now)
                refused = _put_refusal(row, guard, facts[0], facts[0].head, now)
                if refused is not None:
                    raise refused
            return await _put_holding(conn, row, blobs, key, now)

        # A prune holds the thread, a delta's base is gone (pruned, or deleted by another
        # process), or the thread is not as expected, and nothing was written: again, holding
        # the thread's lock, in a transaction.
        return await self._run(op, tx=True)

    async def _put_guarded(
        self, row: CheckpointRow, guard: Guard, params: Sequence[Any], now: float
    ) -> Any:
        """`PUT_GUARDED` on the facts expected (None: none worth a try, or not as expected,
        nothing written)."""
        expected = self._seen.expect_put(row, guard)
        if put_refusal(guard, row.thread_id, row.checkpoint_ns, row.parent_checkpoint_id,
                       *expected.put_facts(now)) is not None:
            return None  # refused if the guess were right: decide on the facts as they are
        args = (*params, guard.epoch is not None, *expected.params(), expected.head)
        try:
            return await self._run(lambda conn: conn.fetchrow(sql.PUT_GUARDED, *args), tx=False)
        except asyncpg.PostgresError as exc:
            if missed(exc):
                return None
            raise

    async def _facts(
        self, conn: asyncpg.Connection, keys: Sequence[int],
        targets: Sequence[tuple[str, str, str | None]], lock_epoch: bool, now: float,
    ) -> list[Facts]:
        """The guard facts of each (thread, ns, checkpoint id or None), read holding the
        threads' locks and rows until the transaction ends (`GUARD_FACTS`)."""
        threads = sorted({t for t, _, _ in targets})
        rows = await conn.fetch(
            sql.GUARD_FACTS, sorted(set(keys)), threads, now,
            [t for t, _, _ in targets], [n for _, n, _ in targets], [c for _, _, c in targets],
            lock_epoch)
        facts = [Facts(r["f_head"], r["f_tombstoned"], r["f_token"], r["f_expires"],
                       int(r["f_epoch"]), r["f_exists"], r["f_newer"]) for r in rows]
        for (tid, _, _), f in zip(targets, facts, strict=True):
            self._seen.saw(tid, f)
        return facts

    async def write_batch(
        self, items: Sequence[BatchItem], guards: Sequence[Guard | None] | None = None
    ) -> list[set[str]]:
        """The whole batch in one statement (`WRITE_BATCH`): one round trip, atomic on its
        own, so no BEGIN/COMMIT round trips. Only when a delta's base is missing from storage
        does it take a second statement (that one writes nothing), the delta's value then
        being written whole. Every row is an upsert, so a retry after a lost connection is
        harmless. With `guards`, a transaction: the facts of every guarded item read holding
        the threads' locks and rows, each item decided in order (`core.guard`), then the
        batch, or nothing of it."""
        batch = list(items)
        if not batch:
            return []

        threads = sorted({t for item in batch for t in _threads_of(item)})
        keys = sorted({self.thread_lock_key(t) for t in threads})
        now = self.clock()

        async def op(conn: asyncpg.Connection, hold: bool) -> list[set[str]] | None:
            if hold:
                await conn.execute(sql.LOCK_THREADS_SHARED, keys)
            gone: set[_BlobKey] = set()
            while True:
                fell_back, params = _batch_params(batch, gone)
                found = await conn.fetch(sql.WRITE_BATCH, *params, keys, threads, now)
                if not found[0]["locked"]:
                    return None  # a prune holds a thread: nothing was written
                missing = [r for r in found if r["tid"] is not None]
                if not missing:
                    return fell_back
                # Bases gone from storage (pruned, or by another process): each attempt makes
                # at least one more delta whole, so this ends.
                gone.update((r["tid"], r["ns"], r["ch"], r["ver"]) for r in missing)

        if guards is not None and any(g is not None for g in guards):
            checked = list(zip(batch, guards, strict=True))

            async def guarded(conn: asyncpg.Connection) -> list[set[str]] | None:
                await self._check_batch(conn, checked, keys, now)
                return await op(conn, True)

            done = await self._run(guarded, tx=True)
        else:
            done = await self._run(lambda conn: op(conn, False), tx=False)
        if done is None:  # again, once the prune is done, holding the threads' locks
            done = await self._run(lambda conn: op(conn, True), tx=True)
        assert done is not None
        return done

    async def _check_batch(
        self, conn: asyncpg.Connection, checked: Sequence[tuple[BatchItem, Guard | None]],
        keys: Sequence[int], now: float,
    ) -> None:
        """Raise the refusal of the first guarded item refused, each decided on the facts as
        the items before it leave them (read holding the threads, `_facts`)."""
        targets: dict[tuple[str, str, str | None], None] = {}
        for item, guard in checked:  # every put moves a head a later item is checked against
            if isinstance(item, tuple) or (guard is not None and item):
                targets[_target(item)] = None
        facts = dict(zip(targets, await self._facts(
            conn, keys, list(targets), any(g is not None and g.epoch is not None
                                           for _, g in checked), now), strict=True))
        heads: dict[tuple[str, str], str | None] = {}
        written: set[tuple[str, str, str]] = set()
        for item, guard in checked:
            if isinstance(item, tuple):
                row = item[0]
                ns_key = (row.thread_id, row.checkpoint_ns)
                found = facts[_target(item)]
                head = heads.get(ns_key, found.head)
                if guard is not None:
                    refused = _put_refusal(row, guard, found, head, now)
                    if refused is not None:
                        raise refused
                    heads[ns_key] = max(head or "", row.checkpoint_id)
                written.add((*ns_key, row.checkpoint_id))
            elif guard is not None and item:
                found = facts[_target(item)]
                first = item[0]
                exists = found.exists or found.newer or (
                    (first.thread_id, first.checkpoint_ns, first.checkpoint_id) in written)
                refused = _writes_refusal(item, guard, found, exists, now)
                if refused is not None:
                    raise refused

    async def write_writes(self, rows: Sequence[WriteRow], guard: Guard | None = None) -> None:
        kept: dict[_WriteKey, WriteRow] = {}
        replacing: dict[_WriteKey, WriteRow] = {}
        _add_writes(rows, kept, replacing)
        keep, replace = list(kept.values()), list(replacing.values())
        if not keep and not replace:
            return
        # One statement (so one round trip, atomic): the threads' rows, then the writes.
        now = self.clock()
        params = (*_write_columns(keep), *_write_columns(replace),
                  sorted({w.thread_id for w in rows}), now)
        if guard is None:
            await self._run(lambda conn: conn.execute(sql.WRITE_WRITES, *params), tx=False)
        elif not await self._writes_guarded(rows, guard, params, now):
            first = rows[0]
            key = self.thread_lock_key(first.thread_id)

            async def op(conn: asyncpg.Connection) -> None:
                target = (first.thread_id, first.checkpoint_ns, first.checkpoint_id)
                facts = (await self._facts(conn, [key], [target], guard.epoch is not None,
                                           now))[0]
                refused = _writes_refusal(rows, guard, facts, facts.exists or facts.newer, now)
                if refused is not None:
                    raise refused
                await conn.execute(sql.WRITE_WRITES, *params)

            await self._run(op, tx=True)

    async def _writes_guarded(
        self, rows: Sequence[WriteRow], guard: Guard, params: Sequence[Any], now: float
    ) -> bool:
        """`WRITE_WRITES_GUARDED` on the facts expected; False: nothing written (a guess
        refused, or not as expected, or the thread held by a prune or a lease change)."""
        first = rows[0]
        expected = self._seen.expect_writes(first.thread_id, guard)
        if writes_refusal(guard, first.thread_id, first.checkpoint_ns, first.checkpoint_id,
                          *expected.writes_facts(now)) is not None:
            return False
        args = (*params, self.thread_lock_key(first.thread_id), first.checkpoint_ns,
                first.checkpoint_id, guard.epoch is not None, *expected.params(),
                expected.exists)
        try:
            return bool(await self._run(
                lambda conn: conn.fetchval(sql.WRITE_WRITES_GUARDED, *args), tx=False))
        except asyncpg.PostgresError as exc:
            if missed(exc):
                return False
            raise

    async def delete_thread(self, thread_id: str, tombstone: bool = False) -> None:
        now = self.clock()
        await self._alone(thread_id, lambda conn: conn.execute(
            sql.DELETE_THREAD, thread_id, tombstone, now))

    async def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        # Both threads held (in share mode, as writers hold them): no prune of the source
        # between the statements, so the rows copied are one consistent set.
        keys = sorted({self.thread_lock_key(source_thread_id), self.thread_lock_key(target_thread_id)})

        now = self.clock()

        async def op(conn: asyncpg.Connection) -> None:
            await conn.execute(sql.LOCK_THREADS_SHARED, keys)
            await conn.execute(sql.COPY_THREAD, target_thread_id, source_thread_id, now)

        await self._run(op, tx=True)

    async def delete_checkpoints(
        self, thread_id: str, victims: Collection[tuple[str, str]], gc: GcPlanner
    ) -> None:
        nss = [ns for ns, _ in victims]
        ids = [cid for _, cid in victims]

        # Alone on the thread: every checkpoint committed is seen, and none is committed before
        # this transaction is, so no blob deleted here is one that a row needs.
        async def op(conn: asyncpg.Connection) -> None:
            remaining: list[CheckpointRow] = []
            refs: list[BlobRef] = []
            for r in await conn.fetch(sql.PRUNE_CHECKPOINTS, thread_id, nss, ids):
                if r[0] == "c":
                    remaining.append(_checkpoint((thread_id, *r[1:])))
                else:
                    refs.append(BlobRef(r[1], r[2], r[3], r[4]))
            dead = list(gc(remaining, refs))
            if dead:
                cols = [list(col) for col in zip(*dead, strict=True)]
                await conn.execute(sql.DELETE_BLOBS, thread_id, *cols)

        await self._alone(thread_id, op)

    async def rewrite_checkpoint(
        self,
        row: CheckpointRow,
        blobs: Sequence[BlobRow],
        writes: Sequence[WriteRow] | None,
        entry: MigrationEntry,
    ) -> bool:
        tid, ns, cid = row.thread_id, row.checkpoint_ns, row.checkpoint_id
        deltas = [b for b in blobs if b.base_version is not None]
        # One row per key, the last given winning (one statement cannot insert a key twice).
        kept = list({
            (w.thread_id, w.checkpoint_ns, w.checkpoint_id, w.task_id, w.idx): w
            for w in writes or ()
        }.values())
        now = self.clock()

        async def op(conn: asyncpg.Connection) -> bool:
            # Held as writers hold it: no prune deletes a base between its check and the write.
            await conn.execute(sql.LOCK_THREADS_SHARED, [self.thread_lock_key(tid)])
            # The log row is what makes this idempotent: a retry after a lost connection (or
            # a second process) finds the entry logged and changes nothing.
            logged = await conn.fetchval(
                sql.REWRITE_CHECKPOINT,
                tid, ns, cid, entry.from_version, entry.to_version, entry.migrated_at,
                *row.checkpoint, *row.metadata, now,
            )
            if not logged:
                return False
            present: set[tuple[str, str]] = set()
            if deltas:
                present = {(r[0], r[1]) for r in await conn.fetch(
                    sql.SELECT_BLOB_BASES, tid, ns,
                    [b.channel for b in deltas], [b.base_version for b in deltas],
                )}
            # A delta whose base is gone is written whole, as write_checkpoint does.
            rows = [
                b if b.base_version is None or (b.channel, b.base_version) in present
                else BlobRow(b.channel, b.version, *b.full())  # type: ignore[misc]
                for b in blobs
            ]
            if rows:
                await conn.execute(
                    sql.UPSERT_BLOB_ROWS, tid, ns, [b.channel for b in rows],
                    [b.version for b in rows], [b.type for b in rows], [b.data for b in rows],
                    [b.base_version for b in rows],
                )
            if writes is not None:
                await conn.execute(sql.DELETE_CHECKPOINT_WRITES, tid, ns, cid)
                if kept:
                    await conn.execute(sql.INSERT_WRITES_KEEP, *_write_columns(kept))
            return True

        return await self._run(op, tx=True)

    async def reseal(self, thread_id: str, changes: Sequence[Reseal]) -> int:
        """One statement (`sql.RESEAL`), so one round trip and atomic on its own; a change
        naming a row twice (the second comparing with what the first wrote) takes one more
        statement per repeat, all in one transaction. A retry after a lost connection whose
        first try had committed finds the new values and counts those changes as not
        applied (nothing is written twice)."""
        rounds = _reseal_rounds(changes)
        if not rounds:
            return 0
        key = self.thread_lock_key(thread_id)

        async def op(conn: asyncpg.Connection) -> int:
            done = 0
            for part in rounds:
                done += int(await conn.fetchval(sql.RESEAL, thread_id, key,
                                                *_reseal_params(part)))
            return done

        return await self._run(op, tx=len(rounds) > 1)

    # -- reading ----------------------------------------------------------------------------

    async def _fetch(self, statement: str, *params: Any) -> list[Any]:
        return await self._run(lambda conn: conn.fetch(statement, *params), tx=False,
                               write=False)

    async def _fetch_replica(self, statement: str, *params: Any) -> list[Any]:
        """A history read: on a replica if there is one (as far as it has replayed)."""
        return await self._read(lambda conn: conn.fetch(statement, *params), fresh=False)

    async def read_checkpoint(
        self, thread_id: str, ns: str, checkpoint_id: str | None
    ) -> CheckpointRow | None:
        if checkpoint_id is None:
            rows = await self._fetch(sql.SELECT_LATEST_CHECKPOINT, thread_id, ns)
        else:
            rows = await self._fetch(sql.SELECT_CHECKPOINT, thread_id, ns, checkpoint_id)
        return _checkpoint(rows[0]) if rows else None

    async def read_tuple(
        self,
        thread_id: str,
        ns: str,
        checkpoint_id: str | None,
        wanted: Callable[[CheckpointRow], Collection[tuple[str, str]]],
    ) -> tuple[CheckpointRow, dict[tuple[str, str], BlobRow], list[WriteRow]] | None:
        async def op(conn: asyncpg.Connection) -> Any:
            # The row and its writes in one round trip, the values it names in a second.
            if checkpoint_id is None:
                found = await conn.fetchrow(sql.SELECT_LATEST_TUPLE, thread_id, ns)
            else:
                found = await conn.fetchrow(sql.SELECT_TUPLE, thread_id, ns, checkpoint_id)
            if found is None:
                return None
            row = _checkpoint(found)
            writes = [
                WriteRow(thread_id, ns, row.checkpoint_id, *w)
                for w in zip(*(found[k] or () for k in (
                    "w_task", "w_idx", "w_channel", "w_type", "w_data", "w_path")), strict=True)
            ]
            keys = wanted(row)
            blobs = await _blobs(conn, thread_id, ns, keys) if keys else {}
            return row, blobs, writes

        # What a graph run starts from: on a replica only once it has this store's writes.
        return await self._read(op, fresh=True)

    def iter_checkpoints(self, query: ListQuery) -> AsyncIterator[CheckpointRow]:
        async def page(cursor: Cursor | None) -> list[CheckpointRow]:
            statement = sql.select_checkpoints(
                thread=query.thread_id is not None,
                ns=query.checkpoint_ns is not None,
                checkpoint_id=query.checkpoint_id is not None,
                before=query.before is not None,
                after_cursor=cursor is not None,
            )
            fetch = self._fetch_replica if query.replica else self._fetch
            rows = await fetch(statement, *query.params, *(cursor or ()), _PAGE)
            return [_checkpoint(r) for r in rows]

        return keyset_pages(page, _PAGE)

    async def read_ancestors(
        self, thread_id: str, ns: str, checkpoint_id: str, limit: int
    ) -> list[CheckpointRow]:
        rows = await self._fetch_replica(sql.SELECT_ANCESTORS, thread_id, ns, checkpoint_id,
                                         limit)
        return [_checkpoint(r) for r in rows]

    async def read_blobs(
        self, thread_id: str, ns: str, keys: Collection[tuple[str, str]]
    ) -> dict[tuple[str, str], BlobRow]:
        # As `read_tuple`: on a replica once it has replayed this store's writes.
        return await self._read(lambda conn: _blobs(conn, thread_id, ns, keys), fresh=True)

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
        return await self._read(lambda conn: _writes(conn, thread_id, ns, ids, channels),
                                fresh=True)

    async def read_migrations(self, thread_id: str | None = None) -> list[MigrationEntry]:
        if thread_id is None:
            rows = await self._fetch(sql.SELECT_MIGRATIONS)
        else:
            rows = await self._fetch(sql.SELECT_THREAD_MIGRATIONS, thread_id)
        return [MigrationEntry(r[0], r[1], r[2], int(r[3]), int(r[4]), float(r[5])) for r in rows]

    async def thread_ids(self) -> list[str]:
        return [r[0] for r in await self._fetch(sql.SELECT_THREAD_IDS)]

    async def sizes(self, thread_id: str) -> list[StoredSize]:
        rows = await self._fetch(sql.SELECT_THREAD_SIZES, thread_id)
        return sorted(StoredSize(r[0], r[1], r[2], int(r[3]), int(r[4] or 0)) for r in rows)

    async def find_runs(self, run_ids: Collection[str]) -> list[tuple[str, str, str]]:
        return [tuple(r) for r in await self._fetch(sql.SELECT_RUNS, list(run_ids))]

    # -- the thread lifecycle (`lgx_threads`; every write keeps its row, see `sql._wrote`) ----

    async def thread_states(
        self, cursor: str | None, limit: int
    ) -> tuple[list[ThreadState], str | None]:
        if cursor is None:
            rows = await self._fetch(sql.SELECT_THREAD_STATES, limit)
        else:
            rows = await self._fetch(sql.SELECT_THREAD_STATES_AFTER, limit, cursor)
        states = [_state(r) for r in rows]
        return states, (states[-1].thread_id if len(states) == limit else None)

    async def thread_state(self, thread_id: str) -> ThreadState | None:
        rows = await self._fetch(sql.SELECT_THREAD_STATE, thread_id)
        return _state(rows[0]) if rows else None

    async def _execute(self, statement: str, *params: Any) -> None:
        await self._run(lambda conn: conn.execute(statement, *params), tx=False)

    async def set_pinned(self, thread_id: str, pinned: bool) -> None:
        await self._execute(sql.SET_PINNED, thread_id, self.clock(), pinned)

    async def set_policy(self, thread_id: str, policy: str | None) -> None:
        await self._execute(sql.SET_POLICY, thread_id, self.clock(), policy)

    async def touch_thread(self, thread_id: str) -> None:
        await self._execute(sql.TOUCH_THREAD, thread_id, self.clock())

    async def mark_swept(self, thread_id: str, generation: int) -> None:
        await self._execute(sql.MARK_SWEPT, thread_id, generation)

    async def expire_thread(self, thread_id: str, generation: int, tombstone: bool = False
                            ) -> bool:
        """`delete_thread` if the thread's row still has `generation`: alone on the thread (its
        lock, as `delete_thread` takes it), the row locked, compared, and every row deleted, in
        one transaction. False if it was written since, has no row, or stayed busy for longer
        than lock_timeout (nothing changed: the next pass looks again)."""

        async def op(conn: asyncpg.Connection) -> bool:
            return bool(await conn.fetchval(sql.EXPIRE_THREAD, thread_id, generation,
                                            tombstone, now))

        now = self.clock()

        try:
            return await self._alone(thread_id, op)
        except StoreBusyError:
            return False

    @contextlib.asynccontextmanager
    async def sweep_lock(self) -> AsyncIterator[bool]:
        """The schema's sweep lock (`sql.TRY_SWEEP_LOCK`), held by a session: one connection
        of the pool, kept out of it for the pass (the pass's own requests take others, so
        the pool needs two connections at least), unlocked before it goes back. A process
        killed mid-pass closes its session, which releases the lock."""
        pool = await self._pool()
        if pool.get_max_size() < 2:
            raise InvalidConfigError(
                "sweeping PostgreSQL needs a pool of 2 connections at least (max_size): one "
                "holds the sweep lock for the pass")
        async with pool.acquire() as conn:
            key, held = await conn.fetchrow(sql.TRY_SWEEP_LOCK)
            try:
                yield bool(held)
            finally:
                if held:
                    try:
                        if not await conn.fetchval(sql.SWEEP_UNLOCK, key):
                            # Not this session's: a pooler in transaction mode gave the lock
                            # to another server session, which keeps it (see the docs).
                            _log.warning("the sweep lock was not held by its session: is a "
                                         "pooler in transaction mode in between?")
                    except BaseException:
                        # The session may hold the lock still: end it rather than pool it.
                        conn.terminate()
                        raise

    async def housekeep(self, limit: int | None) -> int:
        return 0  # no index to clean up: a thread's row goes with the thread

    async def log_lifecycle(self, events: Sequence[LifecycleEvent]) -> None:
        if not events:
            return
        cols = _columns(((e.at, e.action, e.thread, e.checkpoints, e.reason) for e in events), 5)
        await self._execute(sql.INSERT_LIFECYCLE, *cols)

    async def read_lifecycle(self, thread: str | None = None) -> list[LifecycleEvent]:
        if thread is None:
            rows = await self._fetch(sql.SELECT_LIFECYCLE)
        else:
            rows = await self._fetch(sql.SELECT_THREAD_LIFECYCLE, thread)
        return [LifecycleEvent(float(r[0]), r[1], r[2], int(r[3]), r[4]) for r in rows]

    async def vacuum(self) -> tuple[int, int]:
        """`VACUUM (ANALYZE)` of our tables (outside any transaction: VACUUM refuses one). It
        makes the space of deleted rows reusable and gives back only the empty pages at the
        end of a table, so the size after is often the size before: see docs/storage.md
        ("PostgreSQL: space after deletes") for VACUUM FULL and pg_repack."""
        tables = list(sql.TABLES)

        async def op(conn: asyncpg.Connection) -> tuple[int, int]:
            before = int(await conn.fetchval(sql.STORAGE_SIZE, tables))
            await conn.execute(sql.VACUUM)
            return before, int(await conn.fetchval(sql.STORAGE_SIZE, tables))

        return await self._run(op, tx=False)

    # -- one writer per thread: tombstones, leases, the epoch (`core.guard`) ------------------

    async def tombstone(self, thread_id: str) -> float | None:
        found = await self._run(lambda conn: conn.fetchval(sql.SELECT_TOMBSTONE, thread_id),
                                tx=False)
        return None if found is None else float(found)

    async def drop_tombstones(self, before: float, limit: int | None) -> int:
        return int(await self._run(
            lambda conn: conn.fetchval(sql.DROP_TOMBSTONES, before, limit), tx=False))

    async def acquire_lease(self, thread_id: str, token: str, ttl: float) -> bool:
        """Taken holding the thread alone (`_alone`): a guarded write decided without the
        lease is committed before, or waits and finds it."""
        now = self.clock()

        async def op(conn: asyncpg.Connection) -> bool:
            return bool(await conn.fetchval(sql.ACQUIRE_LEASE, thread_id, token, now + ttl, now))

        return await self._alone(thread_id, op)

    async def renew_lease(self, thread_id: str, token: str, ttl: float) -> bool:
        now = self.clock()
        return bool(await self._run(lambda conn: conn.fetchval(
            sql.RENEW_LEASE, thread_id, token, now + ttl, now), tx=False))

    async def release_lease(self, thread_id: str, token: str) -> None:
        await self._execute(sql.RELEASE_LEASE, thread_id, token)

    async def read_lease(self, thread_id: str) -> LeaseRow | None:
        rows = await self._fetch(sql.SELECT_LEASE, thread_id)
        return (rows[0][0], float(rows[0][1])) if rows else None

    async def read_epoch(self) -> int:
        return int(await self._run(lambda conn: conn.fetchval(sql.SELECT_EPOCH), tx=False))

    async def raise_epoch(self, epoch: int) -> int:
        """Waits for the guarded writes holding the epoch row (`lgx_guard_facts`) to commit:
        none of them lands after the raise."""
        return int(await self._run(lambda conn: conn.fetchval(sql.RAISE_EPOCH, epoch), tx=False))

    def refuses(self, exc: BaseException) -> bool:
        """A SQLSTATE of a refused request (bad data, a constraint, a limit)."""
        return sqlstate.refused(exc)

    async def close(self) -> None:
        """Close the pools this store opened (a pool passed in stays the caller's)."""
        await self._pools.close()
        for replica in self._replicas:
            await replica.pools.close()


_BlobKey = tuple[str, str, str, str]  # thread_id, checkpoint_ns, channel, version
_WriteKey = tuple[str, str, str, str, int]  # thread_id, checkpoint_ns, checkpoint_id, task_id, idx


def _put_params(
    row: CheckpointRow, blobs: Sequence[BlobRow], key: int, now: float
) -> tuple[Any, ...]:
    """The parameters of `PUT_CHECKPOINT` (`key`: the thread's lock; `now`: the write's time)."""
    full = [b for b in blobs if b.base_version is None]
    deltas = [b for b in blobs if b.base_version is not None]
    return (
        row.thread_id, row.checkpoint_ns,
        [b.channel for b in full], [b.version for b in full],
        [b.type for b in full], [b.data for b in full],
        [b.channel for b in deltas], [b.version for b in deltas],
        [b.type for b in deltas], [b.data for b in deltas],
        [b.base_version for b in deltas],
        row.checkpoint_id, row.parent_checkpoint_id, row.run_id, *row.checkpoint, *row.metadata,
        key, now,
    )


async def _put_holding(
    conn: asyncpg.Connection, row: CheckpointRow, blobs: Sequence[BlobRow], key: int, now: float
) -> set[str]:
    """`PUT_CHECKPOINT` in a transaction holding the thread's lock (waiting for a prune); if a
    delta's base is gone, again with those deltas written whole (the other bases, found, stay
    locked until this commits). Returns those deltas' channels."""
    await conn.execute(sql.LOCK_THREADS_SHARED, [key])
    found = await conn.fetchrow(sql.PUT_CHECKPOINT, *_put_params(row, blobs, key, now))
    if found["stored"]:
        return set()
    landed = set(found["landed"] or ())
    whole = {b.channel for b in blobs if b.base_version is not None and b.channel not in landed}
    blobs = [whole_row(b) if b.base_version is not None and b.channel in whole else b
             for b in blobs]
    found = await conn.fetchrow(sql.PUT_CHECKPOINT, *_put_params(row, blobs, key, now))
    if not found["stored"]:
        raise AssertionError("a put holding its thread's lock stored nothing")
    return whole


def _put_refusal(row: CheckpointRow, guard: Guard, facts: Facts, head: str | None,
                 now: float) -> ConcurrentWriteError | None:
    """`put_refusal` of `row` on its thread's facts, the namespace's head being `head`."""
    return put_refusal(guard, row.thread_id, row.checkpoint_ns, row.parent_checkpoint_id,
                       head, facts.tombstoned, facts.lease, facts.epoch, now, facts.exists)


def _writes_refusal(rows: Sequence[WriteRow], guard: Guard, facts: Facts, exists: bool,
                    now: float) -> ConcurrentWriteError | None:
    first = rows[0]
    return writes_refusal(guard, first.thread_id, first.checkpoint_ns, first.checkpoint_id,
                          exists, facts.tombstoned, facts.lease, facts.epoch, now)


def _target(item: BatchItem) -> tuple[str, str, str | None]:
    """The (thread, ns, checkpoint id or None) whose facts decide a guarded batch item."""
    if isinstance(item, tuple):  # a put: is it stored already (a retry)?
        return item[0].thread_id, item[0].checkpoint_ns, item[0].checkpoint_id
    return item[0].thread_id, item[0].checkpoint_ns, item[0].checkpoint_id


def _threads_of(item: BatchItem) -> set[str]:
    if isinstance(item, tuple):
        return {item[0].thread_id}
    return {w.thread_id for w in item}


def _batch_params(
    items: Sequence[BatchItem], gone: Collection[_BlobKey]
) -> tuple[list[set[str]], list[Any]]:
    """What `write_batch` stores, as the parameters of `WRITE_BATCH`, and per checkpoint item
    the channels whose delta is written whole: the items in order, as the single-item methods
    would leave them, reduced to one row per key (the last written, or for a write kept if
    present, the first).

    A delta whose base an earlier item writes lands; one whose base is in `gone` (found
    missing) is written whole; any other needs its base in storage, which the statement checks.
    """
    fell_back: list[set[str]] = []
    written: set[_BlobKey] = set()
    needed: dict[_BlobKey, None] = {}
    blobs: dict[_BlobKey, BlobRow] = {}
    checkpoints: dict[tuple[str, str, str], CheckpointRow] = {}
    keep: dict[_WriteKey, WriteRow] = {}
    replace: dict[_WriteKey, WriteRow] = {}
    for item in items:
        if not isinstance(item, tuple):
            _add_writes(item, keep, replace)
            continue
        row, item_blobs = item
        tid, ns = row.thread_id, row.checkpoint_ns
        whole: set[str] = set()
        # Deltas before whole values, as SQLite's `write_checkpoint` stores them: a delta finds
        # its base among earlier items or in storage, never among its own item's blobs.
        for b in sorted(item_blobs, key=lambda b: b.base_version is None):
            if b.base_version is not None:
                base = (tid, ns, b.channel, b.base_version)
                if base in gone and base not in written:
                    b = whole_row(b)
                    whole.add(b.channel)
                elif base not in written:
                    needed[base] = None
            blobs[(tid, ns, b.channel, b.version)] = b
        written.update((tid, ns, b.channel, b.version) for b in item_blobs)
        checkpoints[(tid, ns, row.checkpoint_id)] = row
        fell_back.append(whole)
    params = [
        *_columns(needed, 4),
        *_columns([(*k, b.type, b.data, b.base_version) for k, b in blobs.items()], 7),
        *_columns([(r.thread_id, r.checkpoint_ns, r.checkpoint_id, r.parent_checkpoint_id,
                    r.run_id, *r.checkpoint, *r.metadata) for r in checkpoints.values()], 9),
        *_columns([_write_values(w) for w in keep.values()], 9),
        *_columns([_write_values(w) for w in replace.values()], 9),
    ]
    return fell_back, params


def _add_writes(
    rows: Iterable[WriteRow], keep: dict[_WriteKey, WriteRow], replace: dict[_WriteKey, WriteRow]
) -> None:
    """Sort writes, in order, into those kept if present (idx >= 0; of one key, the first
    given wins) and those that replace (idx < 0; the last given wins): one row per key, as one
    statement can upsert a key only once. The two never share a key (the sign of idx)."""
    for w in rows:
        key = (w.thread_id, w.checkpoint_ns, w.checkpoint_id, w.task_id, w.idx)
        if w.idx >= 0:
            keep.setdefault(key, w)
        else:
            replace[key] = w


def _reseal_rounds(changes: Sequence[Reseal]) -> list[list[Reseal]]:
    """`changes` in order, in as few parts as leave each row named once per part (one
    statement updates a row once)."""
    rounds: list[list[Reseal]] = []
    seen: list[set[tuple[str, str, tuple[str, ...]]]] = []
    for ch in changes:
        if ch.kind not in ("checkpoint", "blob", "write"):
            raise ValueError(f"unknown kind of reseal: {ch.kind!r}")
        row = (ch.kind, ch.checkpoint_ns, ch.key)
        # After the last part naming this row, so that changes of one row apply in order.
        i = next((i + 1 for i in range(len(seen) - 1, -1, -1) if row in seen[i]), 0)
        if i == len(rounds):
            rounds.append([])
            seen.append(set())
        rounds[i].append(ch)
        seen[i].add(row)
    return rounds


def _reseal_params(changes: Sequence[Reseal]) -> list[list[Any]]:
    """The column arrays of `sql.RESEAL` ($3 on): checkpoints, blobs, writes."""
    by_kind: dict[str, list[Reseal]] = {"checkpoint": [], "blob": [], "write": []}
    for ch in changes:
        by_kind[ch.kind].append(ch)
    return [
        *_columns([(c.checkpoint_ns, c.key[0], *c.old[0], *c.old[1], *c.new[0], *c.new[1])
                   for c in by_kind["checkpoint"]], 10),
        *_columns([(c.checkpoint_ns, c.key[0], c.key[1], *c.old[0], *c.new[0])
                   for c in by_kind["blob"]], 7),
        *_columns([(c.checkpoint_ns, c.key[0], c.key[1], int(c.key[2]), *c.old[0], *c.new[0])
                   for c in by_kind["write"]], 8),
    ]


def _columns(rows: Iterable[Sequence[Any]], width: int) -> list[list[Any]]:
    """Rows as `width` column lists (`unnest`'s arrays), empty ones included."""
    cols: list[list[Any]] = [[] for _ in range(width)]
    for r in rows:
        for col, value in zip(cols, r, strict=True):
            col.append(value)
    return cols


def _write_values(r: WriteRow) -> tuple[Any, ...]:
    return (r.thread_id, r.checkpoint_ns, r.checkpoint_id, r.task_id, r.idx,
            r.channel, r.type, r.data, r.task_path)


def _write_columns(rows: Sequence[WriteRow]) -> list[list[Any]]:
    """Write rows as the column arrays `INSERT_WRITES_*` unnest."""
    return _columns(map(_write_values, rows), 9)


async def _blobs(
    conn: asyncpg.Connection, thread_id: str, ns: str, keys: Collection[tuple[str, str]]
) -> dict[tuple[str, str], BlobRow]:
    if not keys:
        return {}
    chs, vers = (list(col) for col in zip(*keys, strict=True))
    rows = await conn.fetch(sql.SELECT_BLOBS, thread_id, ns, chs, vers)
    return {(r[0], r[1]): BlobRow(r[0], r[1], r[2], r[3], r[4]) for r in rows}


async def _writes(
    conn: asyncpg.Connection,
    thread_id: str,
    ns: str,
    ids: Sequence[str],
    channels: Collection[str] | None,
) -> dict[str, list[WriteRow]]:
    chans = None if channels is None else list(channels)
    out: dict[str, list[WriteRow]] = {}
    for r in await conn.fetch(sql.SELECT_WRITES, thread_id, ns, list(ids), chans):
        row = WriteRow(*r)
        out.setdefault(row.checkpoint_id, []).append(row)
    return out
