"""`InMemoryCheckpointer`: rows in dicts, for tests, notebooks and development."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Collection, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import replace
from typing import Any, TypeVar, cast

from langgraph.checkpoint.serde.base import SerializerProtocol

from ..core.appendlog import DEFAULT_MAX_BYTES
from ..core.codec import writes_order
from ..core.errors import ConcurrentWriteError
from ..core.guard import Guard, LeaseRow, put_refusal, writes_refusal
from ..core.keys import KeyProvider
from ..core.opening import Opening
from ..core.retention import LifecycleEvent, Retention, ThreadState
from ..core.rows import (
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
from ..core.saver import DEFAULT_TOMBSTONE_TTL
from ..core.sealing import Compression, Encryption
from ..core.store import BatchItem, GcPlanner, try_lock, write_in_turn
from ..core.telemetry import Telemetry
from ..core.urls import parse_url
from ..migrations import SchemaChain
from .checkpointer import Checkpointer

_NsKey = tuple[str, str]  # (thread_id, checkpoint_ns)


_K = TypeVar("_K", bound=tuple[Any, ...])
_V = TypeVar("_V")


class _ByThread(dict[_K, _V]):
    """A dict keyed by tuples that start with a thread id, indexing its keys by thread, so
    that a thread's keys are found without a scan of the whole store (a sweep deleting
    thousands of threads stays linear). A missing key reads as a new empty dict."""

    def __init__(self) -> None:
        super().__init__()
        self.of: dict[str, set[_K]] = defaultdict(set)

    def __missing__(self, key: _K) -> _V:
        value = cast(_V, {})
        self[key] = value
        return value

    def __setitem__(self, key: _K, value: _V) -> None:
        self.of[key[0]].add(key)
        super().__setitem__(key, value)

    def keys_of(self, thread_id: str) -> list[_K]:
        """The keys of one thread present now."""
        return [k for k in self.of.get(thread_id, ()) if k in self]

    def drop(self, thread_id: str) -> None:
        for key in self.of.pop(thread_id, ()):
            self.pop(key, None)


class MemoryStore:
    """Dict storage of serialized rows. Its coroutines never suspend (`inline`), and one
    re-entrant lock makes each operation atomic across threads."""

    inline = True
    wants_versions = False

    def __init__(self) -> None:
        self.checkpoints: _ByThread[_NsKey, dict[str, CheckpointRow]] = _ByThread()
        self.blobs: _ByThread[_NsKey, dict[tuple[str, str], BlobRow]] = _ByThread()
        self.writes: _ByThread[tuple[str, str, str], dict[tuple[str, int], WriteRow]] = _ByThread()
        self.latest: dict[_NsKey, str] = {}  # newest checkpoint id per namespace
        self.migrations: _ByThread[tuple[str, str, str, int], MigrationEntry] = _ByThread()
        self.audit_log: list[AuditSwitch] = []
        self.threads: dict[str, ThreadState] = {}  # lifecycle rows
        self.lifecycle: list[LifecycleEvent] = []
        # thread_id -> (deleted at, the newest checkpoint id the delete removed)
        self.tombstones: dict[str, tuple[float, str]] = {}
        self.leases: dict[str, LeaseRow] = {}
        self.epoch = 0
        self.clock: Callable[[], float] = time.time
        self._lock = threading.RLock()
        self._sweeping = threading.Lock()

    def _wrote(self, thread_id: str, *, activity: bool = True) -> None:
        """A write to the thread: its lifecycle row's generation (and, for `activity`, its
        last write time) moves on."""
        now = self.clock()
        state = self.threads.get(thread_id)
        if state is None:
            state = ThreadState(thread_id, now, now)
        self.threads[thread_id] = state.written(now, activity)

    def _put_blobs(self, thread_id: str, ns: str, blobs: Sequence[BlobRow]) -> set[str]:
        fell_back: set[str] = set()
        stored = self.blobs[(thread_id, ns)]
        for blob in blobs:
            if blob.base_version is not None and (blob.channel, blob.base_version) not in stored:
                blob = whole(blob)
                fell_back.add(blob.channel)
            # Keep only the bytes: `full` holds the whole value it was made from.
            stored[(blob.channel, blob.version)] = blob.portable()
        return fell_back

    def _put_refusal(self, row: CheckpointRow, guard: Guard, head: str | None,
                     batched: bool = False) -> ConcurrentWriteError | None:
        tid = row.thread_id
        exists = batched or row.checkpoint_id in self.checkpoints.get(
            (tid, row.checkpoint_ns), {})
        return put_refusal(guard, tid, row.checkpoint_ns, row.parent_checkpoint_id, head,
                           tid in self.tombstones, self.leases.get(tid), self.epoch,
                           self.clock(), exists)

    def _writes_refusal(self, rows: Sequence[WriteRow], guard: Guard
                        ) -> ConcurrentWriteError | None:
        first = rows[0]
        key = (first.thread_id, first.checkpoint_ns)
        tomb = self.tombstones.get(first.thread_id)
        exists = first.checkpoint_id in self.checkpoints.get(key, {}) or (
            tomb is not None and first.checkpoint_id > tomb[1])
        return writes_refusal(guard, first.thread_id, first.checkpoint_ns, first.checkpoint_id,
                              exists, first.thread_id in self.tombstones,
                              self.leases.get(first.thread_id), self.epoch, self.clock())

    async def write_checkpoint(
        self, row: CheckpointRow, blobs: Sequence[BlobRow], guard: Guard | None = None
    ) -> set[str]:
        with self._lock:
            if guard is not None:
                refused = self._put_refusal(
                    row, guard, self.latest.get((row.thread_id, row.checkpoint_ns)))
                if refused is not None:
                    raise refused
            fell_back = self._put_blobs(row.thread_id, row.checkpoint_ns, blobs)
            key = (row.thread_id, row.checkpoint_ns)
            self.checkpoints[key][row.checkpoint_id] = row
            if self.latest.get(key, "") < row.checkpoint_id:
                self.latest[key] = row.checkpoint_id
            self._wrote(row.thread_id)
        return fell_back

    async def write_batch(
        self, items: Sequence[BatchItem], guards: Sequence[Guard | None] | None = None
    ) -> list[set[str]]:
        with self._lock:  # the lock is re-entrant: no reader sees half a batch
            if guards is not None:  # every item checked (heads as the items before leave
                heads: dict[_NsKey, str | None] = {}  # them) before any is written
                written: set[tuple[str, str, str]] = set()
                for item, guard in zip(items, guards, strict=True):
                    if isinstance(item, tuple):
                        row = item[0]
                        key = (row.thread_id, row.checkpoint_ns)
                        head = heads[key] if key in heads else self.latest.get(key)
                        mine = (*key, row.checkpoint_id)
                        refused = None if guard is None else self._put_refusal(
                            row, guard, head, mine in written)
                        heads[key] = max(head or "", row.checkpoint_id)
                        written.add(mine)
                    else:
                        refused = (None if guard is None or not item
                                   else self._writes_refusal(item, guard))
                    if refused is not None:
                        raise refused
            return await write_in_turn(self, items)

    async def write_writes(self, rows: Sequence[WriteRow], guard: Guard | None = None) -> None:
        with self._lock:
            if guard is not None and rows:
                refused = self._writes_refusal(rows, guard)
                if refused is not None:
                    raise refused
            for row in rows:
                bucket = self.writes[(row.thread_id, row.checkpoint_ns, row.checkpoint_id)]
                key = (row.task_id, row.idx)
                if row.idx >= 0 and key in bucket:
                    continue
                bucket[key] = row
            for thread_id in {row.thread_id for row in rows}:
                self._wrote(thread_id)

    async def read_checkpoint(
        self, thread_id: str, ns: str, checkpoint_id: str | None
    ) -> CheckpointRow | None:
        with self._lock:
            rows = self.checkpoints.get((thread_id, ns))
            if not rows:
                return None
            if checkpoint_id is None:
                return rows[self.latest[(thread_id, ns)]]
            return rows.get(checkpoint_id)

    async def read_tuple(
        self,
        thread_id: str,
        ns: str,
        checkpoint_id: str | None,
        wanted: Callable[[CheckpointRow], Collection[tuple[str, str]]],
    ) -> tuple[CheckpointRow, dict[tuple[str, str], BlobRow], list[WriteRow]] | None:
        with self._lock:
            row = await self.read_checkpoint(thread_id, ns, checkpoint_id)
            if row is None:
                return None
            blobs = await self.read_blobs(thread_id, ns, wanted(row))
            writes = await self.read_writes(thread_id, ns, [row.checkpoint_id])
            return row, blobs, writes.get(row.checkpoint_id, [])

    async def iter_checkpoints(self, query: ListQuery) -> AsyncIterator[CheckpointRow]:
        with self._lock:
            keys = sorted(
                (
                    k
                    for k in (self.checkpoints if query.thread_id is None
                              else self.checkpoints.keys_of(query.thread_id))
                    if (query.thread_id is None or k[0] == query.thread_id)
                    and (query.checkpoint_ns is None or k[1] == query.checkpoint_ns)
                ),
                reverse=True,
            )
            found = [
                row
                for key in keys
                for cid, row in self.checkpoints[key].items()
                if (query.checkpoint_id is None or cid == query.checkpoint_id)
                and (query.before is None or cid < query.before)
            ]
        found.sort(key=lambda r: (r.checkpoint_id, r.checkpoint_ns, r.thread_id), reverse=True)
        for row in found:
            yield row

    async def thread_ids(self) -> list[str]:
        with self._lock:
            return sorted({tid for (tid, _), rows in self.checkpoints.items() if rows})

    async def read_ancestors(
        self, thread_id: str, ns: str, checkpoint_id: str, limit: int
    ) -> list[CheckpointRow]:
        out: list[CheckpointRow] = []
        with self._lock:
            rows = self.checkpoints.get((thread_id, ns), {})
            cursor: str | None = checkpoint_id
            while cursor is not None and cursor in rows and len(out) < limit:
                out.append(rows[cursor])
                cursor = rows[cursor].parent_checkpoint_id
        return out

    async def read_blobs(
        self, thread_id: str, ns: str, keys: Collection[tuple[str, str]]
    ) -> dict[tuple[str, str], BlobRow]:
        out: dict[tuple[str, str], BlobRow] = {}
        with self._lock:
            stored = self.blobs.get((thread_id, ns), {})
            todo = list(keys)
            while todo:
                key = todo.pop()
                if key in out or key not in stored:
                    continue
                out[key] = blob = stored[key]
                if blob.base_version is not None:
                    todo.append((blob.channel, blob.base_version))
        return out

    async def read_writes(
        self,
        thread_id: str,
        ns: str,
        checkpoint_ids: Collection[str],
        channels: Collection[str] | None = None,
    ) -> dict[str, list[WriteRow]]:
        out: dict[str, list[WriteRow]] = {}
        with self._lock:
            for cid in checkpoint_ids:
                bucket = self.writes.get((thread_id, ns, cid))
                if bucket:
                    rows = [w for w in bucket.values() if channels is None or w.channel in channels]
                    out[cid] = sorted(rows, key=writes_order)
        return out

    async def delete_thread(self, thread_id: str, tombstone: bool = False) -> None:
        with self._lock:
            if tombstone:
                ids = [cid for key in self.checkpoints.keys_of(thread_id)
                       for cid in self.checkpoints[key]]
                before = self.tombstones.get(thread_id, (0.0, ""))[1]
                self.tombstones[thread_id] = (self.clock(), max([before, *ids]))
            self.leases.pop(thread_id, None)
            for ns_key in self.checkpoints.keys_of(thread_id):
                self.latest.pop(ns_key, None)
            for table in (self.checkpoints, self.blobs, self.writes, self.migrations):
                table.drop(thread_id)
            self.threads.pop(thread_id, None)

    async def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        with self._lock:
            for (tid, ns) in self.checkpoints.keys_of(source_thread_id):
                rows = self.checkpoints[(tid, ns)]
                if rows:
                    target = self.checkpoints[(target_thread_id, ns)]
                    for cid, row in rows.items():
                        target.setdefault(cid, replace(row, thread_id=target_thread_id))
                    if target:
                        self.latest[(target_thread_id, ns)] = max(target)
            for (tid, ns) in self.blobs.keys_of(source_thread_id):
                blobs = self.blobs[(tid, ns)]
                if blobs:
                    self.blobs[(target_thread_id, ns)].update(blobs)
            for (tid, ns, cid) in self.writes.keys_of(source_thread_id):
                writes = self.writes[(tid, ns, cid)]
                if writes:
                    target_w = self.writes[(target_thread_id, ns, cid)]
                    for key, w in writes.items():
                        target_w.setdefault(key, replace(w, thread_id=target_thread_id))
            if source_thread_id in self.threads:
                self._wrote(target_thread_id)

    async def find_runs(self, run_ids: Collection[str]) -> list[tuple[str, str, str]]:
        wanted = set(run_ids)
        with self._lock:
            return [
                (tid, ns, cid)
                for (tid, ns), rows in self.checkpoints.items()
                for cid, row in rows.items()
                if row.run_id in wanted
            ]

    async def delete_checkpoints(
        self, thread_id: str, victims: Collection[tuple[str, str]], gc: GcPlanner
    ) -> None:
        with self._lock:
            for ns, cid in victims:
                self.checkpoints.get((thread_id, ns), {}).pop(cid, None)
                self.writes.pop((thread_id, ns, cid), None)
            for ns in {ns for ns, _ in victims}:
                rows = self.checkpoints.get((thread_id, ns))
                if rows:
                    self.latest[(thread_id, ns)] = max(rows)
                else:
                    self.checkpoints.pop((thread_id, ns), None)
                    self.latest.pop((thread_id, ns), None)
            remaining = [
                row for key in self.checkpoints.keys_of(thread_id)
                for row in self.checkpoints[key].values()
            ]
            refs = [
                BlobRef(key[1], b.channel, b.version, b.base_version)
                for key in self.blobs.keys_of(thread_id)
                for b in self.blobs[key].values()
            ]
            for ns, channel, version in gc(remaining, refs):
                self.blobs[(thread_id, ns)].pop((channel, version), None)

    async def rewrite_checkpoint(
        self,
        row: CheckpointRow,
        blobs: Sequence[BlobRow],
        writes: Sequence[WriteRow] | None,
        entry: MigrationEntry,
    ) -> bool:
        key = (row.thread_id, row.checkpoint_ns)
        with self._lock:
            if entry.key in self.migrations or row.checkpoint_id not in self.checkpoints.get(key, {}):
                return False
            self._put_blobs(row.thread_id, row.checkpoint_ns, blobs)
            self.checkpoints[key][row.checkpoint_id] = row
            if writes is not None:
                bucket = self.writes[(row.thread_id, row.checkpoint_ns, row.checkpoint_id)]
                bucket.clear()
                for w in writes:
                    bucket[(w.task_id, w.idx)] = w
            self.migrations[entry.key] = entry
            self._wrote(row.thread_id, activity=False)
            return True

    async def reseal(self, thread_id: str, changes: Sequence[Reseal]) -> int:
        done = 0
        with self._lock:
            for ch in changes:
                if ch.kind == "checkpoint":
                    rows = self.checkpoints.get((thread_id, ch.checkpoint_ns), {})
                    row = rows.get(ch.key[0])
                    if row is not None and (row.checkpoint, row.metadata) == ch.old:
                        rows[ch.key[0]] = replace(row, checkpoint=ch.new[0], metadata=ch.new[1])
                        done += 1
                elif ch.kind == "blob":
                    blobs = self.blobs.get((thread_id, ch.checkpoint_ns), {})
                    blob = blobs.get((ch.key[0], ch.key[1]))
                    if blob is not None and (blob.type, blob.data) == ch.old[0]:
                        blobs[(ch.key[0], ch.key[1])] = replace(
                            blob, type=ch.new[0][0], data=ch.new[0][1])
                        done += 1
                else:
                    bucket = self.writes.get((thread_id, ch.checkpoint_ns, ch.key[0]), {})
                    write = bucket.get((ch.key[1], int(ch.key[2])))
                    if write is not None and (write.type, write.data) == ch.old[0]:
                        bucket[(ch.key[1], int(ch.key[2]))] = replace(
                            write, type=ch.new[0][0], data=ch.new[0][1])
                        done += 1
        return done

    async def read_migrations(self, thread_id: str | None = None) -> list[MigrationEntry]:
        with self._lock:
            found = [m for m in self.migrations.values() if thread_id in (None, m.thread_id)]
        return sorted(found, key=lambda m: (m.migrated_at, *m.key))

    async def read_audit_log(self, last: bool = False) -> list[AuditSwitch]:
        with self._lock:
            return self.audit_log[-1:] if last else list(self.audit_log)

    async def log_audit_switch(self, switch: AuditSwitch) -> None:
        with self._lock:
            self.audit_log.append(switch)

    async def sizes(self, thread_id: str) -> list[StoredSize]:
        acc: dict[tuple[str, str, str], list[int]] = defaultdict(lambda: [0, 0])

        def add(key: tuple[str, str, str], n: int) -> None:
            acc[key][0] += 1
            acc[key][1] += n

        with self._lock:
            for (tid, ns), rows in self.checkpoints.items():
                for r in rows.values() if tid == thread_id else ():
                    add((ns, "checkpoint", ""), len(r.checkpoint[1]) + len(r.metadata[1]))
            for (tid, ns), blobs in self.blobs.items():
                for b in blobs.values() if tid == thread_id else ():
                    add((ns, "blob", b.channel), len(b.data))
            for (tid, ns, _), writes in self.writes.items():
                for w in writes.values() if tid == thread_id else ():
                    add((ns, "write", w.channel), len(w.data))
        return [StoredSize(*key, n, size) for key, (n, size) in sorted(acc.items())]

    async def migrate(self) -> int:
        return 0  # nothing persists, so there is nothing to migrate

    async def storage_version(self) -> int:
        return 0

    # -- the thread lifecycle ---------------------------------------------------------------

    async def thread_states(
        self, cursor: str | None, limit: int
    ) -> tuple[list[ThreadState], str | None]:
        with self._lock:
            ids = sorted(t for t in self.threads if cursor is None or t > cursor)[:limit]
            states = [self.threads[t] for t in ids]
        return states, (ids[-1] if len(ids) == limit else None)

    async def thread_state(self, thread_id: str) -> ThreadState | None:
        with self._lock:
            return self.threads.get(thread_id)

    def _row(self, thread_id: str) -> ThreadState:
        state = self.threads.get(thread_id)
        if state is None:
            now = self.clock()
            state = self.threads[thread_id] = ThreadState(thread_id, now, now)
        return state

    async def set_pinned(self, thread_id: str, pinned: bool) -> None:
        with self._lock:
            self.threads[thread_id] = replace(self._row(thread_id), pinned=pinned)

    async def set_policy(self, thread_id: str, policy: str | None) -> None:
        with self._lock:
            self.threads[thread_id] = replace(self._row(thread_id), policy=policy)

    async def touch_thread(self, thread_id: str) -> None:
        with self._lock:
            state = self.threads.get(thread_id)
            if state is not None:
                self.threads[thread_id] = replace(state, read_at=self.clock())

    async def expire_thread(self, thread_id: str, generation: int, tombstone: bool = False
                            ) -> bool:
        with self._lock:
            state = self.threads.get(thread_id)
            if state is None or state.generation != generation:
                return False
            await self.delete_thread(thread_id, tombstone)
            return True

    async def mark_swept(self, thread_id: str, generation: int) -> None:
        with self._lock:
            state = self.threads.get(thread_id)
            if state is not None:
                self.threads[thread_id] = replace(state, swept=generation)

    def sweep_lock(self) -> AbstractAsyncContextManager[bool]:
        return try_lock(self._sweeping)

    async def housekeep(self, limit: int | None) -> int:
        return 0

    async def log_lifecycle(self, events: Sequence[LifecycleEvent]) -> None:
        with self._lock:
            self.lifecycle.extend(events)

    async def read_lifecycle(self, thread: str | None = None) -> list[LifecycleEvent]:
        with self._lock:
            return [e for e in self.lifecycle if thread in (None, e.thread)]

    async def vacuum(self) -> tuple[int, int]:
        return 0, 0

    # -- one writer per thread --------------------------------------------------------------

    async def tombstone(self, thread_id: str) -> float | None:
        with self._lock:
            tomb = self.tombstones.get(thread_id)
            return None if tomb is None else tomb[0]

    async def drop_tombstones(self, before: float, limit: int | None) -> int:
        with self._lock:
            old = [t for t, (at, _) in self.tombstones.items() if at < before][:limit]
            for t in old:
                del self.tombstones[t]
            dead = [t for t, (_, until) in self.leases.items() if until < before][:limit]
            for t in dead:
                del self.leases[t]
            return len(old)

    async def acquire_lease(self, thread_id: str, token: str, ttl: float) -> bool:
        with self._lock:
            now = self.clock()
            held = self.leases.get(thread_id)
            if held is not None and held[0] != token and held[1] > now:
                return False
            self.leases[thread_id] = (token, now + ttl)
            return True

    async def renew_lease(self, thread_id: str, token: str, ttl: float) -> bool:
        with self._lock:
            now = self.clock()
            held = self.leases.get(thread_id)
            if held is None or held[0] != token or held[1] <= now:
                return False
            self.leases[thread_id] = (token, now + ttl)
            return True

    async def release_lease(self, thread_id: str, token: str) -> None:
        with self._lock:
            held = self.leases.get(thread_id)
            if held is not None and held[0] == token:
                del self.leases[thread_id]

    async def read_lease(self, thread_id: str) -> LeaseRow | None:
        with self._lock:
            return self.leases.get(thread_id)

    async def read_epoch(self) -> int:
        return self.epoch

    async def raise_epoch(self, epoch: int) -> int:
        with self._lock:
            self.epoch = max(self.epoch, epoch)
            return self.epoch

    def refuses(self, exc: BaseException) -> bool:
        """Nothing here is a server that refuses: only caller errors are not outages."""
        return False

    async def close(self) -> None:
        return None


class InMemoryCheckpointer(Checkpointer):
    """Checkpoints in this process's memory: for tests, notebooks and development.

    Values are serialized as on any backend (so what works here works on SQLite), and sync
    calls run directly, with no thread or event loop.

    Args:
        serde: serializer for every stored value (default: LangGraph's, strict); one given
            is made strict too (`loading_serde`), or refused if it cannot be.
        unsafe_allow_any_class: use `serde` as given, even where stored bytes may construct
            any class through it (whoever can write to the storage can then run code here).
        snapshot_every: full value of an append-grown list at least every N versions.
        append_log_bytes: memory kept of list channels' last stored values, so that a put
            stores only the items appended (64 MiB by default; past it the least recently
            written list is dropped, and stored whole at its next put; 0: none kept).
        schema_chain: the state schema's version and upcasters (`SchemaChain`): see
            `migrate_threads`.
        audit: turn auditing on for the store, recorded in it (every checkpointer writing to
            it then seals each checkpoint; False turns nothing off): see `verify`,
            `enable_audit` and `disable_audit`.
        retention: the retention policy of threads without their own (`Retention`, or
            LangGraph Platform's `checkpointer.ttl` mapping): see `sweep`.
        sweep_every: seconds between background sweeps (None: sweep when asked).
        writers: `"single"` (default: a run's checkpoint is refused with
            `ConcurrentWriteError` when another run wrote the thread since it read it) or
            `"last_wins"` (no check): see `StoreCheckpointer`.
        tombstone_ttl: seconds a deleted thread's tombstone refuses late writes (None: none).
        redact_metadata: keep secrets out of checkpoint metadata, where LangGraph copies a run's
            `configurable` values: True (default) drops keys such as `api_key`, `token`,
            `password`, `Authorization` (`core.redact`); a list adds key names to those;
            False stores every key.
        encryption: encrypt every stored value, pending write and metadata, bound to its
            row (`Encryption`; the `encryption` extra): see `core.sealing`, `rotate_keys`.
        compression: compress stored values with zstd first (`Compression`, or True; the
            `zstd` extra).
        audit_keys: seal the audit trail with HMAC-SHA256 under these keys (`KeyProvider`;
            separate from the encryption keys), so that it cannot be forged without them:
            see `StoreCheckpointer`, `verify`.
        telemetry: OpenTelemetry spans and metrics (`Telemetry`); None: the global providers
            once configured; False: none. See `StoreCheckpointer`.

    Example:
        >>> from langgraph_ckpt_ext import InMemoryCheckpointer
        >>> graph = builder.compile(checkpointer=InMemoryCheckpointer())  # doctest: +SKIP
    """

    def __init__(
        self,
        *,
        serde: SerializerProtocol | None = None,
        snapshot_every: int = 256,
        append_log_bytes: int = DEFAULT_MAX_BYTES,
        schema_chain: SchemaChain | None = None,
        audit: bool = False,
        unsafe_allow_any_class: bool = False,
        retention: Retention | Mapping[str, Any] | None = None,
        sweep_every: float | None = None,
        writers: str = "single",
        tombstone_ttl: float | None = DEFAULT_TOMBSTONE_TTL,
        redact_metadata: bool | Iterable[str] = True,
        encryption: Encryption | None = None,
        compression: Compression | bool | None = None,
        audit_keys: KeyProvider | None = None,
        telemetry: Telemetry | bool | None = None,
    ) -> None:
        super().__init__(
            MemoryStore(), serde=serde, snapshot_every=snapshot_every,
            append_log_bytes=append_log_bytes, schema_chain=schema_chain,
            audit=audit, unsafe_allow_any_class=unsafe_allow_any_class,
            retention=retention, sweep_every=sweep_every, writers=writers,
            tombstone_ttl=tombstone_ttl, redact_metadata=redact_metadata,
            encryption=encryption, compression=compression, audit_keys=audit_keys,
            telemetry=telemetry,
        )

    @classmethod
    def from_conn_string(
        cls, conn_string: str = "memory://", **kwargs: Any
    ) -> Opening[InMemoryCheckpointer]:
        """A checkpointer for `with` or `async with`, as the other backends' (`memory://`,
        the only URL here, takes no options); its rows go when the block ends.

        Example:
            >>> with InMemoryCheckpointer.from_conn_string() as cp:  # doctest: +SKIP
            ...     graph = builder.compile(checkpointer=cp)
        """
        _, kwargs = parse_url(conn_string).arguments(kwargs, backend="memory")

        async def aopen() -> InMemoryCheckpointer:
            return cls(**kwargs)

        return Opening(lambda: cls(**kwargs), aopen)

    @property
    def store(self) -> MemoryStore:
        return self._raw_store  # type: ignore[return-value]
