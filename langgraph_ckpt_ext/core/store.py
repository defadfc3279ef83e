"""What a backend implements: moving rows, atomically where it matters. Nothing else."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Protocol

from .guard import Guard, LeaseRow
from .retention import LifecycleEvent, ThreadState
from .rows import (
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

BlobKey = tuple[str, str, str]
"""(checkpoint_ns, channel, version)"""

BatchItem = tuple[CheckpointRow, Sequence[BlobRow]] | list[WriteRow]
"""One item of `Store.write_batch`: a (checkpoint row, blobs) tuple, or a list of writes."""

GcPlanner = Callable[[Sequence[CheckpointRow], Sequence[BlobRef]], Collection[BlobKey]]
"""Given a thread's remaining checkpoints and its blobs, the blobs nothing needs any more."""


class Store(Protocol):
    """Row storage behind `StoreCheckpointer`. Every method is async.

    `inline` is True for a store whose coroutines never suspend (in-memory): its sync calls
    then run without any event loop.
    """

    inline: bool
    clock: Callable[[], float]
    """The time (epoch seconds) the store stamps on thread lifecycle rows (`time.time`
    unless the checkpointer was given a clock: tests inject one)."""
    wants_versions: bool
    """True for a store whose checkpoint rows must list the blob versions they read (Redis:
    its read scripts fetch exactly those); the others find them by key."""

    async def write_checkpoint(
        self, row: CheckpointRow, blobs: Sequence[BlobRow], guard: Guard | None = None
    ) -> set[str]:
        """Store a checkpoint and its blobs atomically.

        A blob with `base_version` is written as a delta only if its base row exists; otherwise
        its `full()` value is written. Returns the channels that fell back so.

        With a `guard`, first decide, atomically with the write (in its transaction, under a
        lock every writer of the thread takes, or in its script), `core.guard.put_refusal`
        from what is stored: the namespace's head (newest checkpoint id), whether the thread
        has a tombstone, its lease row (only needed if `guard.checks`) and the store's epoch
        (only if `guard.epoch` is set); a refusal is raised and nothing is stored. Two guarded
        writers of one namespace, in any processes, must never both pass the check against
        the same head.
        """
        ...

    async def write_batch(
        self, items: Sequence[BatchItem], guards: Sequence[Guard | None] | None = None
    ) -> list[set[str]]:
        """Store `items` in their order: a checkpoint with its blobs (as `write_checkpoint`)
        or a list of pending writes (as `write_writes`), in one transaction, pipeline or round
        trip where the backend allows. A delta's base may be a blob written earlier in the
        same batch. Returns, per checkpoint item in order, the channels that fell back to a
        whole value (`write_checkpoint`'s result).

        `guards`, if given, holds one guard (or None) per item, checked as `write_checkpoint`
        / `write_writes` do, each against the store as the items before it left it; a
        refusal of any item stores nothing of the batch and raises it."""
        ...

    async def write_writes(self, rows: Sequence[WriteRow], guard: Guard | None = None) -> None:
        """Store pending writes: a row with idx >= 0 is kept if one exists, idx < 0 replaces.

        With a `guard` (the rows are then of one thread and checkpoint), first decide
        `core.guard.writes_refusal` atomically with the write, as `write_checkpoint` does
        (whether their checkpoint "exists" is only needed for a tombstoned thread: stored, or
        newer than the newest checkpoint id its delete removed, which the tombstone keeps)."""
        ...

    async def read_checkpoint(
        self, thread_id: str, ns: str, checkpoint_id: str | None
    ) -> CheckpointRow | None:
        """One checkpoint, or the newest of the namespace when `checkpoint_id` is None."""
        ...

    async def read_tuple(
        self,
        thread_id: str,
        ns: str,
        checkpoint_id: str | None,
        wanted: Callable[[CheckpointRow], Collection[tuple[str, str]]],
    ) -> tuple[CheckpointRow, dict[tuple[str, str], BlobRow], list[WriteRow]] | None:
        """One checkpoint (the newest when `checkpoint_id` is None) with the blobs that
        `wanted(row)` names (and their bases) and its writes, in one round trip. A store
        that resolves blobs before calling `wanted` returns every blob the row names."""
        ...

    def iter_checkpoints(self, query: ListQuery) -> AsyncIterator[CheckpointRow]:
        """Checkpoints matching `query`, newest first: by checkpoint id, namespace, thread id."""
        ...

    async def thread_ids(self) -> list[str]:
        """Every thread id that has a checkpoint, sorted (a store with expiring threads may
        name one that has just expired)."""
        ...

    async def read_ancestors(
        self, thread_id: str, ns: str, checkpoint_id: str, limit: int
    ) -> list[CheckpointRow]:
        """Up to `limit` rows of the parent chain, starting with `checkpoint_id` itself."""
        ...

    async def read_blobs(
        self, thread_id: str, ns: str, keys: Collection[tuple[str, str]]
    ) -> dict[tuple[str, str], BlobRow]:
        """The rows for `(channel, version)` keys, plus every base row their deltas need."""
        ...

    async def read_writes(
        self,
        thread_id: str,
        ns: str,
        checkpoint_ids: Collection[str],
        channels: Collection[str] | None = None,
    ) -> dict[str, list[WriteRow]]:
        """Pending writes per checkpoint id, each list in `writes_sort_key` order."""
        ...

    async def delete_thread(self, thread_id: str, tombstone: bool = False) -> None:
        """Delete every row of a thread, as one step against its writers (`StoreBusyError`
        as `delete_checkpoints`). `tombstone`: leave the thread's tombstone (stamped
        `clock()`, with the newest checkpoint id deleted), which guarded late writes are
        checked against (see `write_checkpoint`, `write_writes`) until `drop_tombstones`
        removes it; deleting a tombstoned thread again keeps the newest id of both. The
        thread's lease row goes too."""
        ...

    async def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every row of a thread (all namespaces, blobs and writes) under a new id."""
        ...

    async def find_runs(self, run_ids: Collection[str]) -> list[tuple[str, str, str]]:
        """(thread_id, checkpoint_ns, checkpoint_id) of the checkpoints of these runs."""
        ...

    async def delete_checkpoints(
        self, thread_id: str, victims: Collection[tuple[str, str]], gc: GcPlanner
    ) -> None:
        """Atomically delete `(ns, checkpoint_id)` rows with their writes, then the blobs that
        `gc` names given what remains of the thread (or that the store finds so itself).

        Safe against writers of the thread in any process: what remains includes every row
        committed before the deletes, and no row committed after them relies on a blob they
        delete (a delta written then finds its base gone and is written whole). A store that
        cannot get the thread to itself for long enough raises `StoreBusyError`, changing
        nothing."""
        ...

    async def rewrite_checkpoint(
        self,
        row: CheckpointRow,
        blobs: Sequence[BlobRow],
        writes: Sequence[WriteRow] | None,
        entry: MigrationEntry,
    ) -> bool:
        """One state-schema migration of a stored checkpoint, atomically.

        Unless an entry with `entry.key` is logged already (then nothing changes and the result
        is False): replace the stored checkpoint `row` names (same thread, namespace and id) by
        `row`, add `blobs` as `write_checkpoint` does (a delta whose base row is gone is
        written whole), replace all of the checkpoint's pending
        writes by `writes` unless it is None, and log `entry`. False too if the checkpoint is
        gone (nothing is logged then).
        """
        ...

    async def reseal(self, thread_id: str, changes: Sequence[Reseal]) -> int:
        """Rewrite stored values of a thread in place (key rotation; encrypting or compressing
        a store): each change replaces its value(s) by `new` only if the row still holds
        exactly `old` (a row rewritten or deleted since it was read is left alone, as is a
        change naming no row). One transaction or script for all of them. Nothing else
        changes: not the lifecycle row (a rotation is no activity), not the head; no guard.
        How many changes were applied."""
        ...

    async def read_migrations(self, thread_id: str | None = None) -> list[MigrationEntry]:
        """The logged migrations of one thread, or of all, ordered by (migrated_at, thread_id,
        checkpoint_ns, checkpoint_id). Deleting a thread deletes its entries."""
        ...

    async def read_audit_log(self, last: bool = False) -> list[AuditSwitch]:
        """The store's audit switches, oldest first (`last`: only the newest, if any). Empty
        where auditing was never turned on, also for storage older than the log."""
        ...

    async def log_audit_switch(self, switch: AuditSwitch) -> None:
        """Append a switch to the store's audit log (the newest is the store's setting)."""
        ...

    async def sizes(self, thread_id: str) -> list[StoredSize]:
        """What a thread takes in storage: rows and bytes per namespace, kind and channel
        (empty for a thread with nothing stored)."""
        ...

    async def migrate(self) -> int:
        """Create or upgrade the storage (idempotent, safe across processes); its version."""
        ...

    async def storage_version(self) -> int:
        """The storage version in force, creating and changing nothing: 0 where `migrate`
        never ran (no tables, no layout key) and for storage that does not persist."""
        ...

    async def close(self) -> None: ...

    # -- the thread lifecycle (retention, sweeps, erasure) ---------------------------------
    #
    # Each thread has a lifecycle row (`ThreadState`). Every write of a checkpoint or of
    # pending writes (`write_checkpoint`, `write_batch`, `write_writes`), in the same
    # transaction or script, creates it if missing (`created_at` = now), sets `written_at` to
    # now and raises `generation`; `rewrite_checkpoint` and `copy_thread` (the target's row)
    # raise `generation` too. `delete_checkpoints` leaves the row as it is; `delete_thread`
    # deletes it. "Now" is `clock()`. Storage that predates the rows gets one per thread,
    # stamped with the time of that storage migration.

    async def thread_states(
        self, cursor: str | None, limit: int
    ) -> tuple[list[ThreadState], str | None]:
        """Up to `limit` lifecycle rows, in an order of the store's choosing, from `cursor`
        (None: the start); with the cursor of the next page (None: no more). A row whose
        thread expired by a native TTL meanwhile may be left out."""
        ...

    async def thread_state(self, thread_id: str) -> ThreadState | None:
        """One thread's lifecycle row (None: the thread has none)."""
        ...

    async def set_pinned(self, thread_id: str, pinned: bool) -> None:
        """Pin (exempt from every retention rule and TTL) or unpin a thread; creates its row
        (`generation` 0) if it has none, so a thread can be pinned before its first write."""
        ...

    async def set_policy(self, thread_id: str, policy: str | None) -> None:
        """Set (None: drop) a thread's own retention policy (`Retention.to_json`); creates its
        row as `set_pinned` does."""
        ...

    async def touch_thread(self, thread_id: str) -> None:
        """Record a read of the thread (`read_at` = now), if it has a row."""
        ...

    async def expire_thread(self, thread_id: str, generation: int, tombstone: bool = False
                            ) -> bool:
        """Delete the thread as `delete_thread` does (with its `tombstone`), atomically, only
        if its row's `generation` is still `generation`; False (nothing changed) if it was
        written since, or has no row."""
        ...

    async def mark_swept(self, thread_id: str, generation: int) -> None:
        """Record that the sweeper cut the thread's history at `generation` (`swept`)."""
        ...

    def sweep_lock(self) -> AbstractAsyncContextManager[bool]:
        """Hold the store's sweep lock for a pass: yields False at once if another sweeper
        (another process on a shared store) holds it. A killed holder's lock is released."""
        ...

    async def housekeep(self, limit: int | None) -> int:
        """The store's own clean-up for a sweep pass (Redis: index entries of threads gone by
        TTL); how many entries it dropped."""
        ...

    async def log_lifecycle(self, events: Sequence[LifecycleEvent]) -> None:
        """Append deletion records (erasures, expiries, history cuts) to the store's log."""
        ...

    async def read_lifecycle(self, thread: str | None = None) -> list[LifecycleEvent]:
        """The logged deletions, oldest first; of one thread's digest, or all."""
        ...

    async def vacuum(self) -> tuple[int, int]:
        """Give the space of deleted rows back (SQLite: incremental vacuum); the storage's
        size in bytes before and after (0, 0 where the store cannot tell)."""
        ...

    # -- one writer per thread (`core.guard`): tombstones, leases, the epoch ---------------
    #
    # Tombstones and leases are kept apart from the lifecycle rows (a thread's lifecycle row
    # goes with the thread; its tombstone stays). Times are `clock()`'s.

    async def tombstone(self, thread_id: str) -> float | None:
        """When the thread's tombstone was left (None: it has none)."""
        ...

    async def drop_tombstones(self, before: float, limit: int | None) -> int:
        """Remove tombstones left before `before`, and lease rows that expired before it
        (at most `limit` of each, None: all); how many tombstones went."""
        ...

    async def acquire_lease(self, thread_id: str, token: str, ttl: float) -> bool:
        """Lease the thread to `token` until `clock() + ttl`, atomically, unless another
        token's lease is live (then False, nothing changed). Taking it again with the same
        token renews it."""
        ...

    async def renew_lease(self, thread_id: str, token: str, ttl: float) -> bool:
        """Extend `token`'s live lease to `clock() + ttl`; False if it expired or another
        token holds the thread (nothing changed)."""
        ...

    async def release_lease(self, thread_id: str, token: str) -> None:
        """Drop `token`'s lease of the thread (nothing if another token holds it)."""
        ...

    async def read_lease(self, thread_id: str) -> LeaseRow | None:
        """The thread's lease row (token, expires_at), live or not; None: none."""
        ...

    async def read_epoch(self) -> int:
        """The store's writer epoch (0 until raised)."""
        ...

    async def raise_epoch(self, epoch: int) -> int:
        """Make the store's epoch at least `epoch`, atomically; the epoch now in force.
        Guarded writes with an older epoch are refused from then on (`FencedError`)."""
        ...

    def refuses(self, exc: BaseException) -> bool:
        """Whether `exc`, raised by this store, is a request the server answered and refused,
        as it would refuse it again (bad data, a constraint): not an outage to fail over on or
        retry (see `core.failures`)."""
        ...


Cursor = tuple[str, str, str]
"""(checkpoint_id, checkpoint_ns, thread_id) of the last row of a `list` page."""


async def keyset_pages(
    fetch: Callable[[Cursor | None], Awaitable[Sequence[CheckpointRow]]], page: int
) -> AsyncIterator[CheckpointRow]:
    """Rows of `list`, fetched a page at a time after the last row seen (no open cursor)."""
    cursor: Cursor | None = None
    while True:
        rows = await fetch(cursor)
        for row in rows:
            yield row
        if len(rows) < page:
            return
        last = rows[-1]
        cursor = (last.checkpoint_id, last.checkpoint_ns, last.thread_id)


async def write_in_turn(
    store: Store, items: Sequence[BatchItem], guards: Sequence[Guard | None] | None = None
) -> list[set[str]]:
    """`write_batch` as one call per item, for a store with nothing better (and that makes
    the whole sequence atomic itself: the in-memory store's lock)."""
    out: list[set[str]] = []
    for i, item in enumerate(items):
        guard = None if guards is None else guards[i]
        if isinstance(item, tuple):
            out.append(await store.write_checkpoint(item[0], item[1], guard))
        else:
            await store.write_writes(item, guard)
    return out


@contextlib.asynccontextmanager
async def try_lock(lock: threading.Lock) -> AsyncIterator[bool]:
    """A store's sweep lock held within this process: True if it was free (and is held until
    the block ends), False at once if not."""
    held = lock.acquire(blocking=False)
    try:
        yield held
    finally:
        if held:
            lock.release()
