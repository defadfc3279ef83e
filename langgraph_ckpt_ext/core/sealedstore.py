"""`SealedStore`: a `Store` whose values are sealed (`core.sealing`) on the way in and opened on
the way out, so that every backend, and everything above the store (reads, the audit trail,
migrations, retention, replication), works on encrypted or compressed storage unchanged.

Each value is bound to the row that holds it: a copy of a thread under another id is therefore
made here, value by value, opened for the source's rows and sealed for the target's.

Lazy rotation: a value read under an older key than its tenant's current one (or unencrypted,
with `plaintext="read"`) is remembered, per thread and bounded, and sealed again under the
current key after the thread's next write (`Store.reseal`: only if the row still holds what
was read). `rotate_keys` does the same eagerly, for every row.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from dataclasses import replace
from typing import Any

from .guard import Guard
from .rows import BlobRef, BlobRow, CheckpointRow, ListQuery, MigrationEntry, Reseal, Typed, WriteRow
from .sealing import (
    Identity,
    Opened,
    Sealer,
    blob_identity,
    checkpoint_identity,
    metadata_identity,
    write_identity,
)
from .store import BatchItem, BlobKey, GcPlanner, Store

log = logging.getLogger("langgraph_ckpt_ext.sealing")

_THREADS = 256  # threads whose stale values are remembered for lazy rotation
_PER_THREAD = 1024


class SealedStore:
    """`inner` with its values sealed by `sealer` (see the module docstring). Every method not
    defined here is the inner store's. `versions_of`: the blob keys (channel -> version key)
    a checkpoint row reads, decoded from its opened record (copies need them)."""

    _OWN = frozenset({"_inner", "_sealer", "_versions_of", "_tenants", "_stale", "_lock"})

    def __init__(self, inner: Store, sealer: Sealer,
                 versions_of: Callable[[CheckpointRow], Mapping[str, str]]) -> None:
        self._inner = inner
        self._sealer = sealer
        self._versions_of = versions_of
        self._tenants: OrderedDict[str, str | None] = OrderedDict()
        self._stale: OrderedDict[str, dict[tuple[str, str, tuple[str, ...]], _Stale]] = (
            OrderedDict())
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self._OWN:
            object.__setattr__(self, name, value)
        else:  # e.g. a test's clock: the inner store's
            setattr(self._inner, name, value)

    @property
    def inner(self) -> Store:
        """The store as it is, values sealed."""
        return self._inner

    # -- tenants -----------------------------------------------------------------------------

    def note_tenant(self, thread_id: str, tenant: str | None) -> None:
        """The tenant whose current key seals what is written next to this thread."""
        with self._lock:
            self._tenants[thread_id] = tenant
            self._tenants.move_to_end(thread_id)
            while len(self._tenants) > 4096:
                self._tenants.popitem(last=False)

    def _tenant(self, thread_id: str) -> str | None:
        return self._tenants.get(thread_id)

    # -- sealing rows ------------------------------------------------------------------------

    def seal_row(self, row: CheckpointRow, tenant: str | None = None) -> CheckpointRow:
        tid, ns, cid = row.thread_id, row.checkpoint_ns, row.checkpoint_id
        seal = self._sealer.seal
        return _with_values(row, seal(row.checkpoint, checkpoint_identity(tid, ns, cid), tenant),
                            seal(row.metadata, metadata_identity(tid, ns, cid), tenant))

    def seal_blob(self, tid: str, ns: str, blob: BlobRow, tenant: str | None = None) -> BlobRow:
        typed = self._sealer.seal((blob.type, blob.data), blob_identity(
            tid, ns, blob.channel, blob.version, blob.base_version), tenant)
        full = blob.full
        if full is not None:  # the whole value, for a store that finds the base gone
            def whole(full: Callable[[], Typed] = full) -> Typed:
                return self._sealer.seal(full(), blob_identity(
                    tid, ns, blob.channel, blob.version, None), tenant)
            return BlobRow(blob.channel, blob.version, *typed, blob.base_version, whole)
        return BlobRow(blob.channel, blob.version, *typed, blob.base_version)

    def seal_write(self, row: WriteRow, tenant: str | None = None) -> WriteRow:
        typed = self._sealer.seal((row.type, row.data), _write_ident(row), tenant)
        return _with_value(row, typed)

    def _seal_item(self, item: BatchItem) -> BatchItem:
        if isinstance(item, tuple):
            row, blobs = item
            tenant = self._tenant(row.thread_id)
            return (self.seal_row(row, tenant),
                    [self.seal_blob(row.thread_id, row.checkpoint_ns, b, tenant) for b in blobs])
        return [self.seal_write(w, self._tenant(w.thread_id)) for w in item]

    # -- opening rows ------------------------------------------------------------------------

    def open_row(self, row: CheckpointRow, remember: bool = True) -> CheckpointRow:
        tid, ns, cid = row.thread_id, row.checkpoint_ns, row.checkpoint_id
        ck = self._sealer.open(row.checkpoint, checkpoint_identity(tid, ns, cid))
        md = self._sealer.open(row.metadata, metadata_identity(tid, ns, cid))
        if remember and (ck.stale or md.stale):
            self._remember(tid, _Stale("checkpoint", ns, (cid,),
                                       (row.checkpoint, row.metadata), (ck, md),
                                       (checkpoint_identity(tid, ns, cid),
                                        metadata_identity(tid, ns, cid))))
        return _with_values(row, ck.typed, md.typed)

    def open_blob(self, tid: str, ns: str, blob: BlobRow, remember: bool = True) -> BlobRow:
        ident = blob_identity(tid, ns, blob.channel, blob.version, blob.base_version)
        opened = self._sealer.open((blob.type, blob.data), ident)
        if remember and opened.stale:
            self._remember(tid, _Stale("blob", ns, (blob.channel, blob.version),
                                       ((blob.type, blob.data),), (opened,), (ident,)))
        return BlobRow(blob.channel, blob.version, *opened.typed, blob.base_version)

    def open_write(self, row: WriteRow, remember: bool = True) -> WriteRow:
        ident = _write_ident(row)
        opened = self._sealer.open((row.type, row.data), ident)
        if remember and opened.stale:
            self._remember(row.thread_id, _Stale(
                "write", row.checkpoint_ns, (row.checkpoint_id, row.task_id, str(row.idx)),
                ((row.type, row.data),), (opened,), (ident,)))
        return _with_value(row, opened.typed)

    # -- lazy rotation -----------------------------------------------------------------------

    def _remember(self, thread_id: str, stale: _Stale) -> None:
        enc = self._sealer.encryption
        if enc is None or not enc.lazy_rotation:
            return
        with self._lock:
            held = self._stale.get(thread_id)
            if held is None:
                held = self._stale[thread_id] = {}
                while len(self._stale) > _THREADS:
                    self._stale.popitem(last=False)
            if len(held) < _PER_THREAD:
                held[(stale.kind, stale.ns, stale.key)] = stale

    async def _rotate_read(self, thread_ids: Collection[str]) -> None:
        """Seal again what was read stale of threads just written (see the module docstring)."""
        for tid in thread_ids:
            with self._lock:
                held = self._stale.pop(tid, None)
            if not held:
                continue
            changes = [s.change(self._sealer, self._tenant(tid)) for s in held.values()]
            try:
                await self._inner.reseal(tid, changes)
            except Exception as exc:  # the values stay readable under their old key
                log.warning("lazy key rotation of thread %r failed: %s", tid, exc)

    # -- the Store methods that carry values --------------------------------------------------

    async def write_checkpoint(
        self, row: CheckpointRow, blobs: Sequence[BlobRow], guard: Guard | None = None
    ) -> set[str]:
        sealed = self._seal_item((row, blobs))
        assert isinstance(sealed, tuple)
        out = await self._inner.write_checkpoint(sealed[0], sealed[1], guard)
        if self._stale:
            await self._rotate_read((row.thread_id,))
        return out

    async def write_batch(
        self, items: Sequence[BatchItem], guards: Sequence[Guard | None] | None = None
    ) -> list[set[str]]:
        out = await self._inner.write_batch([self._seal_item(i) for i in items], guards)
        if self._stale:
            await self._rotate_read({t for t in map(_thread_of, items) if t is not None})
        return out

    async def write_writes(self, rows: Sequence[WriteRow], guard: Guard | None = None) -> None:
        sealed = self._seal_item(list(rows))
        assert isinstance(sealed, list)
        await self._inner.write_writes(sealed, guard)
        if self._stale and rows:
            await self._rotate_read((rows[0].thread_id,))

    async def read_checkpoint(
        self, thread_id: str, ns: str, checkpoint_id: str | None
    ) -> CheckpointRow | None:
        row = await self._inner.read_checkpoint(thread_id, ns, checkpoint_id)
        return None if row is None else self.open_row(row)

    async def read_tuple(
        self,
        thread_id: str,
        ns: str,
        checkpoint_id: str | None,
        wanted: Callable[[CheckpointRow], Collection[tuple[str, str]]],
    ) -> tuple[CheckpointRow, dict[tuple[str, str], BlobRow], list[WriteRow]] | None:
        opened: dict[int, CheckpointRow] = {}

        def opening(row: CheckpointRow) -> CheckpointRow:
            if id(row) not in opened:
                opened[id(row)] = self.open_row(row)
            return opened[id(row)]

        found = await self._inner.read_tuple(
            thread_id, ns, checkpoint_id, lambda row: wanted(opening(row)))
        if found is None:
            return None
        row, blobs, writes = found
        return (opening(row),
                {k: self.open_blob(thread_id, ns, b) for k, b in blobs.items()},
                [self.open_write(w) for w in writes])

    async def iter_checkpoints(self, query: ListQuery) -> AsyncIterator[CheckpointRow]:
        rows = self._inner.iter_checkpoints(query)
        try:
            async for row in rows:
                yield self.open_row(row)
        finally:
            close = getattr(rows, "aclose", None)
            if close is not None:
                await close()

    async def read_ancestors(
        self, thread_id: str, ns: str, checkpoint_id: str, limit: int
    ) -> list[CheckpointRow]:
        rows = await self._inner.read_ancestors(thread_id, ns, checkpoint_id, limit)
        return [self.open_row(r) for r in rows]

    async def read_blobs(
        self, thread_id: str, ns: str, keys: Collection[tuple[str, str]]
    ) -> dict[tuple[str, str], BlobRow]:
        rows = await self._inner.read_blobs(thread_id, ns, keys)
        return {k: self.open_blob(thread_id, ns, b) for k, b in rows.items()}

    async def read_writes(
        self,
        thread_id: str,
        ns: str,
        checkpoint_ids: Collection[str],
        channels: Collection[str] | None = None,
    ) -> dict[str, list[WriteRow]]:
        found = await self._inner.read_writes(thread_id, ns, checkpoint_ids, channels)
        return {cid: [self.open_write(w) for w in rows] for cid, rows in found.items()}

    async def delete_checkpoints(
        self, thread_id: str, victims: Collection[tuple[str, str]], gc: GcPlanner
    ) -> None:
        def planner(rows: Sequence[CheckpointRow], refs: Sequence[BlobRef]
                    ) -> Collection[BlobKey]:
            return gc([self.open_row(r, remember=False) for r in rows], refs)

        await self._inner.delete_checkpoints(thread_id, victims, planner)

    async def rewrite_checkpoint(
        self,
        row: CheckpointRow,
        blobs: Sequence[BlobRow],
        writes: Sequence[WriteRow] | None,
        entry: MigrationEntry,
    ) -> bool:
        tenant = self._tenant(row.thread_id)
        return await self._inner.rewrite_checkpoint(
            self.seal_row(row, tenant),
            [self.seal_blob(row.thread_id, row.checkpoint_ns, b, tenant) for b in blobs],
            None if writes is None else [self.seal_write(w, tenant) for w in writes],
            entry)

    async def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Every value opened for the source's rows and sealed for the target's, written in
        one batch (one transaction where the backend has them)."""
        src, dst = source_thread_id, target_thread_id
        rows = [r async for r in self._inner.iter_checkpoints(ListQuery(thread_id=src))]
        by_ns: dict[str, list[CheckpointRow]] = {}
        for raw in rows:
            by_ns.setdefault(raw.checkpoint_ns, []).append(raw)
        items: list[BatchItem] = []
        for ns, raws in by_ns.items():
            tenant = None
            opened_rows = []
            for raw in sorted(raws, key=lambda r: r.checkpoint_id):
                ck = self._sealer.open(raw.checkpoint, checkpoint_identity(
                    src, ns, raw.checkpoint_id))
                md = self._sealer.open(raw.metadata, metadata_identity(src, ns, raw.checkpoint_id))
                tenant = tenant or ck.tenant
                opened_rows.append(replace(raw, thread_id=dst, checkpoint=ck.typed,
                                           metadata=md.typed))
            keys = {(ch, v) for r in opened_rows for ch, v in self._versions_of(r).items()}
            blobs = await self._inner.read_blobs(src, ns, keys)
            writes = await self._inner.read_writes(src, ns, [r.checkpoint_id for r in raws])
            tenant = self._tenant(dst) or tenant
            wanted = self._inner.wants_versions
            levels = _levels([self.open_blob(src, ns, b, remember=False)
                              for b in blobs.values()])
            for i, row in enumerate(opened_rows):
                if wanted and row.versions is None:
                    row = replace(row, versions=dict(self._versions_of(row)))
                sealed = self.seal_row(row, tenant)
                # A delta's base must be in an earlier item: the first row carries one level
                # of each delta chain per item (written again, harmlessly, as the same row).
                for level in (levels or [[]]) if i == 0 else [[]]:
                    items.append((sealed, [self.seal_blob(dst, ns, b, tenant) for b in level]))
            for cid in sorted(writes):
                items.append([self.seal_write(replace(self.open_write(w, False), thread_id=dst),
                                              tenant) for w in writes[cid]])
        if items:
            await self._inner.write_batch(items)

    async def reseal(self, thread_id: str, changes: Sequence[Reseal]) -> int:
        return await self._inner.reseal(thread_id, changes)


class _Stale:
    """A value read stale: what the row held, what it opened to, and its identity."""

    __slots__ = ("idents", "key", "kind", "ns", "old", "opened")

    def __init__(self, kind: str, ns: str, key: tuple[str, ...], old: tuple[Typed, ...],
                 opened: tuple[Opened, ...], idents: tuple[Identity, ...]) -> None:
        self.kind, self.ns, self.key, self.old = kind, ns, key, old
        self.opened, self.idents = opened, idents

    def change(self, sealer: Sealer, tenant: str | None) -> Reseal:
        new = tuple(sealer.seal(o.typed, ident, o.tenant or tenant)
                    for o, ident in zip(self.opened, self.idents, strict=True))
        return Reseal(self.kind, self.ns, self.key, self.old, new)


# Rows rebuilt field by field: `dataclasses.replace` costs more than the encryption itself.
def _with_values(row: CheckpointRow, checkpoint: Typed, metadata: Typed) -> CheckpointRow:
    return CheckpointRow(row.thread_id, row.checkpoint_ns, row.checkpoint_id,
                         row.parent_checkpoint_id, row.run_id, checkpoint, metadata, row.versions)


def _with_value(row: WriteRow, typed: Typed) -> WriteRow:
    return WriteRow(row.thread_id, row.checkpoint_ns, row.checkpoint_id, row.task_id, row.idx,
                    row.channel, typed[0], typed[1], row.task_path)


def _write_ident(row: WriteRow) -> Identity:
    return write_identity(row.thread_id, row.checkpoint_ns, row.checkpoint_id, row.task_id,
                          row.idx, row.channel)


def _thread_of(item: BatchItem) -> str | None:
    if isinstance(item, tuple):
        return item[0].thread_id
    return item[0].thread_id if item else None


def _levels(blobs: Sequence[BlobRow]) -> list[list[BlobRow]]:
    """Blobs by their depth in an append-delta chain: whole values first, then the deltas on
    them, and so on (a delta whose base is not among them counts as whole: its store falls
    back to its whole value, or refuses it)."""
    by_key = {(b.channel, b.version): b for b in blobs}
    depth: dict[tuple[str, str], int] = {}

    def of(blob: BlobRow, seen: int = 0) -> int:
        key = (blob.channel, blob.version)
        if key not in depth:
            base = (by_key.get((blob.channel, blob.base_version))
                    if blob.base_version is not None else None)
            depth[key] = 0 if base is None or seen > 64 else of(base, seen + 1) + 1
        return depth[key]

    out: list[list[BlobRow]] = []
    for blob in blobs:
        d = of(blob)
        while len(out) <= d:
            out.append([])
        out[d].append(blob)
    return out
