"""The rows every backend stores: plain values, no I/O, no serialization logic."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

Typed = tuple[str, bytes]
"""A serialized value: the serializer's type tag and its bytes."""


@dataclass(frozen=True, slots=True)
class CheckpointRow:
    """One checkpoint without its channel values (those live in blobs)."""

    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str
    parent_checkpoint_id: str | None
    run_id: str | None
    checkpoint: Typed
    metadata: Typed
    # channel -> version key of the values this checkpoint reads; set on rows being written,
    # for a store that resolves blobs server-side (Redis). None on rows read back.
    versions: Mapping[str, str] | None = field(default=None, compare=False, repr=False)

    # Rows cross a pipe to a replicator process: pickled as their fields, not through the
    # slots state that dataclasses give (several times slower either way).
    def __reduce__(self) -> tuple[Any, ...]:
        return (CheckpointRow, (self.thread_id, self.checkpoint_ns, self.checkpoint_id,
                                self.parent_checkpoint_id, self.run_id, self.checkpoint,
                                self.metadata, self.versions))


@dataclass(frozen=True, slots=True)
class BlobRow:
    """One channel's value at one version.

    With `base_version` set, `data` holds only the items appended to the list stored at
    `base_version` (an append-delta); `full` then gives the whole value, for a store that finds
    the base gone and must write a full row instead.
    """

    channel: str
    version: str
    type: str
    data: bytes
    base_version: str | None = None
    full: Callable[[], Typed] | None = field(default=None, compare=False, repr=False)

    def portable(self) -> BlobRow:
        """This row as stored or sent on: its bytes alone, without the whole value it could
        fall back on (a closure over the values it was made from)."""
        if self.full is None:
            return self
        return BlobRow(self.channel, self.version, self.type, self.data, self.base_version)

    def __reduce__(self) -> tuple[Any, ...]:
        # `full` stays behind: it holds the value it was made from, not plain data.
        return (BlobRow, (self.channel, self.version, self.type, self.data, self.base_version))


def whole(blob: BlobRow) -> BlobRow:
    """The whole-value row for an append-delta whose base a store found missing."""
    if blob.full is None:
        from .errors import MissingBaseError

        raise MissingBaseError(
            f"the base {blob.base_version!r} of channel {blob.channel!r} at version "
            f"{blob.version!r} is not stored here, and the row has no whole value to fall "
            "back on: this thread needs a repair"
        )
    return BlobRow(blob.channel, blob.version, *blob.full())


@dataclass(frozen=True, slots=True)
class BlobRef:
    """Where a blob sits in its delta chain, without its bytes (for garbage collection)."""

    checkpoint_ns: str
    channel: str
    version: str
    base_version: str | None


@dataclass(frozen=True, slots=True)
class WriteRow:
    """One pending write of a task, keyed `(checkpoint, task_id, idx)`."""

    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str
    task_id: str
    idx: int
    channel: str
    type: str
    data: bytes
    task_path: str = ""

    def __reduce__(self) -> tuple[Any, ...]:
        return (WriteRow, (self.thread_id, self.checkpoint_ns, self.checkpoint_id, self.task_id,
                           self.idx, self.channel, self.type, self.data, self.task_path))


@dataclass(frozen=True, slots=True)
class Reseal:
    """One stored value rewritten in place (`Store.reseal`: key rotation, encrypting a store),
    only if the row still holds `old`."""

    kind: str
    """`"checkpoint"` (the record and the metadata of a checkpoint row, both replaced),
    `"blob"` or `"write"`."""
    checkpoint_ns: str
    key: tuple[str, ...]
    """checkpoint: (checkpoint_id,); blob: (channel, version); write: (checkpoint_id,
    task_id, str(idx))."""
    old: tuple[Typed, ...]
    """What the row holds now: (checkpoint, metadata) of a checkpoint row, else (value,)."""
    new: tuple[Typed, ...]
    """What it holds after, in the same shape."""


@dataclass(frozen=True, slots=True)
class MigrationEntry:
    """One state-schema migration of one stored checkpoint, as logged by the backend."""

    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str
    from_version: int
    to_version: int
    migrated_at: float
    """When, in seconds since the epoch (UTC)."""

    @property
    def key(self) -> tuple[str, str, str, int]:
        """What makes an entry unique: a checkpoint migrates to a version at most once."""
        return (self.thread_id, self.checkpoint_ns, self.checkpoint_id, self.to_version)


@dataclass(frozen=True, slots=True)
class AuditSwitch:
    """Auditing of a store turned on or off (`Store.log_audit_switch`): the store's audit log."""

    enabled: bool
    at: float
    """When, in seconds since the epoch (UTC)."""
    reason: str
    """Why, as given (who turned it on, or the reason required to turn it off)."""


@dataclass(frozen=True, slots=True, order=True)
class StoredSize:
    """What one part of a thread takes in storage (`Store.sizes`): the rows of one kind, in one
    namespace, for one channel, and the bytes of their stored values (serialized data as the
    backend lays it out; keys, indexes and the engine's own overhead are not counted)."""

    checkpoint_ns: str
    kind: str
    """`"checkpoint"` (checkpoint records with their metadata), `"blob"` (channel values and
    append-deltas) or `"write"` (pending writes)."""
    channel: str
    """The channel of a blob or a write; `""` for checkpoint records."""
    rows: int
    bytes: int


@dataclass(frozen=True, slots=True)
class ListQuery:
    """Which checkpoint rows `Store.iter_checkpoints` yields, newest first."""

    thread_id: str | None = None
    checkpoint_ns: str | None = None
    checkpoint_id: str | None = None
    before: str | None = None
    replica: bool = False
    """The rows may come from a read replica, as far as it has replayed (a store with
    replicas): for reads that show history, never for decisions that write."""

    @property
    def params(self) -> list[str]:
        """The values of the conditions that are set, in field order."""
        return [
            v for v in (self.thread_id, self.checkpoint_ns, self.checkpoint_id, self.before)
            if v is not None
        ]
