"""The put side of the audit trail: sealing each checkpoint as it is stored, with per-process
caches of what this checkpointer stored (see `core.audit`)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections import OrderedDict, defaultdict
from collections.abc import Collection, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from langgraph.checkpoint.serde.base import SerializerProtocol

from .. import codec
from ..keys import KeyProvider
from ..rows import BlobRow, CheckpointRow, Typed, WriteRow
from ..store import Store
from .digest import (
    Digest,
    Ids,
    WriteDigest,
    extend_digest,
    make_record,
    metadata_bytes,
    parents_first,
    plain_bytes,
    stored_digests,
    stored_hash,
    value_digest,
    write_digest,
)

_WAIT = 30.0  # seconds a put waits for its parent's writes in flight

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class _Lru(Generic[K, V]):
    def __init__(self, size: int) -> None:
        self.size = size
        self.items: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        found = self.items.get(key)
        if found is not None:
            self.items.move_to_end(key)
        return found

    def put(self, key: K, value: V) -> None:
        self.items[key] = value
        self.items.move_to_end(key)
        while len(self.items) > self.size:
            self.items.popitem(last=False)


@dataclass(slots=True)
class _WritesRecord:
    """The pending writes of one checkpoint that this checkpointer stored."""

    ours: bool = False
    """This checkpointer stored the checkpoint itself, and had not stored it before: nobody else
    knew its id while its writes were recorded (writes may come before the put: LangGraph runs
    the next step while the put is pending)."""
    writes: dict[tuple[str, int], WriteDigest] = field(default_factory=dict)
    """Those with an index >= 0, by (task id, index)."""


_NO_VALUE = Digest(b"")  # cached: the version holds no value


@dataclass(frozen=True, slots=True)
class Sealed:
    """An audit record for a checkpoint about to be stored, and what to remember once it is."""

    record: dict[str, Any]
    key: tuple[str, str, str]
    digests: dict[tuple[str, str, str, str], Digest | None]


class Auditor:
    """The put side of the audit trail, with its per-process caches (thread-safe); `keys`:
    where the audit keys come from (None: records are unkeyed, v1)."""

    def __init__(self, store: Store, size: int = 8192, keys: KeyProvider | None = None) -> None:
        self._store = store
        self.keys = keys
        self._guard = threading.Lock()
        self._hashes: _Lru[tuple[str, str, str], str] = _Lru(size)
        self._digests: _Lru[tuple[str, str, str, str], Digest] = _Lru(size)
        self._writes: _Lru[tuple[str, str, str], _WritesRecord] = _Lru(size // 4)
        # Writes of a checkpoint being stored now, and puts of its child waiting for them.
        self._pending: dict[tuple[str, str, str], list[concurrent.futures.Future[None]]] = {}
        self._counts: dict[tuple[str, str, str], int] = {}

    async def seal(
        self,
        serde: SerializerProtocol,
        ids: Ids,
        header: Typed,
        metadata: Mapping[str, Any],
        checkpoint: Mapping[str, Any],
        new_versions: Mapping[str, str],
        blobs: Sequence[BlobRow],
    ) -> Sealed:
        """The audit record of a checkpoint about to be stored (as `header`, with `blobs`);
        `new_versions`: channel -> version key of the values written at this step."""
        tid, ns, cid, parent = ids
        key = (tid, ns, cid)
        values: Mapping[str, Any] = checkpoint["channel_values"]
        reads = codec.blob_keys(checkpoint["channel_versions"])
        with self._guard:
            rec = self._writes.get(key)
            if rec is None:
                self._writes.put(key, _WritesRecord(ours=True))
            elif self._hashes.get(key) is None:
                rec.ours = True
        written = {b.channel: b for b in blobs}
        digests: dict[str, Digest | None] = {}
        learned: dict[tuple[str, str, str, str], Digest | None] = {}
        unknown: list[tuple[str, str]] = []
        for ch, vkey in reads.items():
            blob = written.get(ch)
            if blob is not None and blob.version == vkey:
                digests[ch] = learned[(tid, ns, ch, vkey)] = await self._written(
                    serde, tid, ns, blob, values.get(ch)
                )
            elif ch not in written and new_versions.get(ch) == vkey:
                digests[ch] = learned[(tid, ns, ch, vkey)] = None  # emptied at this version
            else:
                with self._guard:
                    hit = self._digests.get((tid, ns, ch, vkey))
                if hit is None:
                    unknown.append((ch, vkey))
                else:
                    digests[ch] = None if hit is _NO_VALUE else hit
        if unknown:
            memo = await self._read_digests(serde, tid, ns, unknown)
            for (ch, vkey), d in memo.items():
                learned[(tid, ns, ch, vkey)] = d
            for ch, vkey in unknown:
                digests[ch] = memo.get((ch, vkey))
        prev, covered = await self._parent(serde, tid, ns, parent)
        record = make_record(ids, prev, header, metadata_bytes(serde, metadata), digests, covered,
                             self.keys)
        return Sealed(record, key, learned)

    async def _written(
        self, serde: SerializerProtocol, tid: str, ns: str, blob: BlobRow, value: Any
    ) -> Digest:
        """The digest of a value stored now: from its row, or its delta on the base's."""
        if blob.base_version is None:
            return value_digest((blob.type, blob.data))
        with self._guard:
            base = self._digests.get((tid, ns, blob.channel, blob.base_version))
        if base is None:
            memo = await self._read_digests(serde, tid, ns, [(blob.channel, blob.base_version)])
            base = memo.get((blob.channel, blob.base_version))
        found = extend_digest(base, (blob.type, blob.data))
        return found if found is not None else value_digest(plain_bytes(serde, codec.decoded(value)))

    async def _read_digests(
        self, serde: SerializerProtocol, tid: str, ns: str, keys: Collection[tuple[str, str]]
    ) -> dict[tuple[str, str], Digest | None]:
        rows = await self._store.read_blobs(tid, ns, keys)
        memo: dict[tuple[str, str], Digest | None] = {}
        stored_digests(serde, rows, keys, memo)
        return memo

    async def _parent(
        self, serde: SerializerProtocol, tid: str, ns: str, parent: str | None
    ) -> tuple[str, list[WriteDigest]]:
        """The parent's hash and the writes of it to cover: remembered, or read."""
        if not parent:
            return "", []
        key = (tid, ns, parent)
        await self._settled(key)
        with self._guard:
            prev = self._hashes.get(key)
            rec = self._writes.items.pop(key, None)
        if prev is None:
            prev = stored_hash(serde, await self._store.read_checkpoint(tid, ns, parent))
        if rec is not None and rec.ours:
            return prev, sorted(rec.writes.values(), key=lambda w: w.order)
        stored = await self._store.read_writes(tid, ns, [parent])
        kept = (write_digest(w) for w in stored.get(parent, []) if w.idx >= 0)
        return prev, sorted(kept, key=lambda w: w.order)

    async def reseal(
        self, serde: SerializerProtocol, rows: Sequence[CheckpointRow]
    ) -> list[tuple[CheckpointRow, dict[str, Any]]]:
        """Audit records for stored checkpoints of one thread (a copy of another thread, whose
        records name the source's id), parents first, from the stored rows alone (the caches
        are neither used nor changed)."""
        by_ns: dict[str, list[CheckpointRow]] = defaultdict(list)
        for row in rows:
            by_ns[row.checkpoint_ns].append(row)
        out: list[tuple[CheckpointRow, dict[str, Any]]] = []
        for ns, ns_rows in by_ns.items():
            out += await self._reseal_ns(serde, ns, parents_first(ns_rows))
        return out

    async def _reseal_ns(
        self, serde: SerializerProtocol, ns: str, rows: list[CheckpointRow]
    ) -> list[tuple[CheckpointRow, dict[str, Any]]]:
        tid = rows[0].thread_id
        reads = {r.checkpoint_id: codec.blob_keys(codec.decode_header(
            serde, r.checkpoint, f"checkpoint {r.checkpoint_id!r}")["channel_versions"])
            for r in rows}
        keys = {key for rd in reads.values() for key in rd.items()}
        memo: dict[tuple[str, str], Digest | None] = {}
        if keys:
            stored_digests(serde, await self._store.read_blobs(tid, ns, keys), keys, memo)
        parents = {r.parent_checkpoint_id for r in rows if r.parent_checkpoint_id}
        stored = await self._store.read_writes(tid, ns, parents) if parents else {}
        hashes: dict[str, str] = {}
        out = []
        for row in rows:
            parent = row.parent_checkpoint_id
            prev = hashes.get(parent or "", "")
            covered = sorted((write_digest(w) for w in stored.get(parent or "", []) if w.idx >= 0),
                             key=lambda w: w.order)
            md = codec.decode_metadata(serde, row.metadata, f"checkpoint {row.checkpoint_id!r}")
            channels = {ch: memo.get((ch, v)) for ch, v in reads[row.checkpoint_id].items()}
            record = make_record((tid, ns, row.checkpoint_id, parent), prev, row.checkpoint,
                                 metadata_bytes(serde, md), channels, covered, self.keys)
            hashes[row.checkpoint_id] = record["hash"]
            out.append((row, record))
        return out

    def stored(self, sealed: Sealed) -> None:
        """The sealed checkpoint is stored: remember its hash and the digests learned."""
        with self._guard:
            self._hashes.put(sealed.key, str(sealed.record["hash"]))
            for k, d in sealed.digests.items():
                self._digests.put(k, _NO_VALUE if d is None else d)

    async def _settled(self, key: tuple[str, str, str]) -> None:
        """Wait for the writes of a checkpoint this process is storing now: LangGraph stores a
        step's writes and the next checkpoint concurrently."""
        with self._guard:
            if not self._counts.get(key):
                return
            done: concurrent.futures.Future[None] = concurrent.futures.Future()
            self._pending.setdefault(key, []).append(done)
        try:
            if self._store.inline:  # those writes never suspend: they run in other threads
                done.result(_WAIT)
            else:
                await asyncio.wait_for(asyncio.wrap_future(done), _WAIT)
        except (TimeoutError, asyncio.TimeoutError, concurrent.futures.TimeoutError):
            pass  # those writes are then not covered, which is safe

    @contextlib.contextmanager
    def writing(self, rows: Sequence[WriteRow]) -> Iterator[None]:
        """Around storing pending writes (enter before the first suspension): the child's put
        waits for them, and records them once stored."""
        keys = {(r.thread_id, r.checkpoint_ns, r.checkpoint_id) for r in rows}
        with self._guard:
            for key in keys:
                self._counts[key] = self._counts.get(key, 0) + 1
        try:
            yield
            self._wrote(rows)
        finally:
            with self._guard:
                for key in keys:
                    self._counts[key] -= 1
                    if not self._counts[key]:
                        del self._counts[key]
                        for done in self._pending.pop(key, ()):
                            if not done.done():  # a waiter that timed out cancelled its own
                                done.set_result(None)

    def _wrote(self, rows: Sequence[WriteRow]) -> None:
        """Pending writes are stored: one with an index >= 0 kept a row already there (the
        first recorded), one < 0 (never covered) replaced it."""
        groups: dict[tuple[str, str, str], list[WriteRow]] = defaultdict(list)
        for r in rows:
            if r.idx >= 0:
                groups[(r.thread_id, r.checkpoint_ns, r.checkpoint_id)].append(r)
        for key, group in groups.items():
            made = [(r, write_digest(r)) for r in group]
            with self._guard:
                rec = self._writes.get(key)
                if rec is None:
                    rec = _WritesRecord()
                    self._writes.put(key, rec)
                for r, w in made:
                    rec.writes.setdefault((r.task_id, r.idx), w)
