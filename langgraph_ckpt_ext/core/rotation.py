"""Eager key rotation: every stored value sealed under an older key than its tenant's current one
(or stored unencrypted, when the checkpointer encrypts with `plaintext="read"`) is sealed again
under the current key, in place (`Store.reseal`).

Each value is replaced only if its row still holds what was read, so a rotation runs beside
live writers, sweeps and deletes; a value rewritten meanwhile is already current. A run that was
killed resumes when started again: values already current are counted and left alone. Values
that fail to open (an unknown key, a row tampered with) are listed in the report and left as
they are.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from .bridge import run_workers
from .errors import CorruptBlobError, InvalidConfigError
from .rows import CheckpointRow, ListQuery, Reseal, Typed
from .sealedstore import SealedStore
from .sealing import (
    Identity,
    Opened,
    Sealer,
    blob_identity,
    checkpoint_identity,
    describe,
    key_id_of,
    metadata_identity,
    write_identity,
)

if TYPE_CHECKING:
    from .saver import StoreCheckpointer

_CHUNK = 256  # values resealed per store call


@dataclass(frozen=True)
class RotationProgress:
    """Reported after each thread: how far the run is."""

    threads_done: int
    threads_total: int
    rows_rotated: int
    thread_id: str


@dataclass
class RotationReport:
    """The outcome of `rotate_keys`."""

    dry_run: bool
    threads_seen: int = 0
    threads_rotated: int = 0
    """Threads with a value sealed again (or, in a dry run, to seal again)."""
    rows_seen: int = 0
    """Rows looked at: checkpoints (record and metadata), blobs, pending writes."""
    rows_rotated: int = 0
    """Rows whose values were sealed again under their current key (dry run: would be)."""
    rows_current: int = 0
    """Rows already under their current key: left alone (a resumed run's done part)."""
    rows_changed_meanwhile: int = 0
    """Rows rewritten or deleted by others between this run's read and its rewrite."""
    from_keys: dict[str, int] = field(default_factory=dict)
    """Rows to rotate, by the key id they were under ("" for unencrypted ones)."""
    unreadable: list[str] = field(default_factory=list)
    """Rows that failed to open, with why (left as they are)."""
    seconds: float = 0.0

    def summary(self) -> str:
        verb = "would re-seal" if self.dry_run else "re-sealed"
        froms = ", ".join(f"{k or 'unencrypted'}: {n}" for k, n in sorted(self.from_keys.items()))
        lines = [
            f"{verb} {self.rows_rotated} row(s) of {self.threads_rotated} thread(s) "
            f"({self.threads_seen} thread(s), {self.rows_seen} row(s) seen; "
            f"{self.rows_current} already current; {self.rows_changed_meanwhile} changed "
            f"meanwhile) in {self.seconds:.2f} s" + (f"; from {froms}" if froms else ""),
        ]
        if self.unreadable:
            lines.append(f"  {len(self.unreadable)} row(s) could not be opened (left as they "
                         "are):")
            lines += [f"    {u}" for u in self.unreadable[:20]]
            if len(self.unreadable) > 20:
                lines.append(f"    ... and {len(self.unreadable) - 20} more")
        return "\n".join(lines)


async def rotate_keys(
    saver: StoreCheckpointer,
    thread_ids: Collection[str] | None = None,
    *,
    dry_run: bool = False,
    progress: Callable[[RotationProgress], None] | None = None,
    concurrency: int = 4,
) -> RotationReport:
    """See `StoreCheckpointer.rotate_keys`."""
    store = saver._store
    if not isinstance(store, SealedStore) or saver._sealer.encryption is None:
        raise InvalidConfigError(
            "rotate_keys needs a checkpointer opened with encryption=Encryption(keys=...): "
            "it seals every value under the keys' current id")
    report = RotationReport(dry_run=dry_run)
    started = time.perf_counter()
    threads = (await saver.athread_ids() if thread_ids is None
               else list(dict.fromkeys(str(t) for t in thread_ids)))
    pending = iter(threads)
    done = 0
    stopped: list[BaseException] = []

    async def worker() -> None:
        nonlocal done
        for tid in pending:
            if stopped:
                return
            await _rotate_thread(saver, store, tid, dry_run, report)
            done += 1
            if progress is not None:
                progress(RotationProgress(done, len(threads), report.rows_rotated, tid))

    if store.inline or concurrency <= 1:
        await worker()
    else:
        await run_workers(worker, concurrency, stopped)
    report.seconds = time.perf_counter() - started
    return report


class _Changes:
    """The values of one thread to seal again."""

    def __init__(self, sealer: Sealer, report: RotationReport) -> None:
        self.sealer, self.report = sealer, report
        self.out: list[Reseal] = []

    def open(self, typed: Typed, ident: Identity) -> Opened | None:
        try:
            return self.sealer.open(typed, ident)
        except CorruptBlobError as exc:
            self.report.rows_seen += 1
            self.report.unreadable.append(f"{describe(ident)}: {type(exc).__name__}")
            return None

    def add(self, kind: str, ns: str, key: tuple[str, ...], old: tuple[Typed, ...],
            opened: tuple[Opened, ...], idents: tuple[Identity, ...]) -> None:
        self.report.rows_seen += 1
        if not any(o.stale for o in opened):
            self.report.rows_current += 1
            return
        kid = key_id_of(next(t for o, t in zip(opened, old, strict=True) if o.stale))
        self.report.from_keys[kid] = self.report.from_keys.get(kid, 0) + 1
        new = tuple(self.sealer.seal(o.typed, ident, o.tenant)
                    for o, ident in zip(opened, idents, strict=True))
        self.out.append(Reseal(kind, ns, key, old, new))


async def _rotate_thread(saver: StoreCheckpointer, store: SealedStore, tid: str,
                         dry_run: bool, report: RotationReport) -> None:
    inner = store.inner
    raws = [r async for r in inner.iter_checkpoints(ListQuery(thread_id=tid))]
    if not raws:
        return
    report.threads_seen += 1
    changes = _Changes(saver._sealer, report)
    by_ns: dict[str, list[CheckpointRow]] = {}
    for raw in raws:
        by_ns.setdefault(raw.checkpoint_ns, []).append(raw)
    for ns, rows in by_ns.items():
        keys: set[tuple[str, str]] = set()
        for raw in rows:
            cid = raw.checkpoint_id
            idents = (checkpoint_identity(tid, ns, cid), metadata_identity(tid, ns, cid))
            ck = changes.open(raw.checkpoint, idents[0])
            md = changes.open(raw.metadata, idents[1])
            if ck is None or md is None:
                continue
            changes.add("checkpoint", ns, (cid,), (raw.checkpoint, raw.metadata), (ck, md),
                        idents)
            try:
                keys |= saver._versions_of(replace(raw, checkpoint=ck.typed)).items()
            except CorruptBlobError as exc:
                report.unreadable.append(f"{describe(idents[0])}: {exc}")
        for blob in (await inner.read_blobs(tid, ns, keys)).values():
            ident = blob_identity(tid, ns, blob.channel, blob.version, blob.base_version)
            opened = changes.open((blob.type, blob.data), ident)
            if opened is not None:
                changes.add("blob", ns, (blob.channel, blob.version),
                            ((blob.type, blob.data),), (opened,), (ident,))
        writes = await inner.read_writes(tid, ns, [r.checkpoint_id for r in rows])
        for w in (w for ws in writes.values() for w in ws):
            ident = write_identity(tid, ns, w.checkpoint_id, w.task_id, w.idx, w.channel)
            opened = changes.open((w.type, w.data), ident)
            if opened is not None:
                changes.add("write", ns, (w.checkpoint_id, w.task_id, str(w.idx)),
                            ((w.type, w.data),), (opened,), (ident,))
    if not changes.out:
        return
    report.threads_rotated += 1
    if dry_run:
        report.rows_rotated += len(changes.out)
        return
    for i in range(0, len(changes.out), _CHUNK):
        part = changes.out[i:i + _CHUNK]
        applied = await inner.reseal(tid, part)
        report.rows_rotated += applied
        report.rows_changed_meanwhile += len(part) - applied
