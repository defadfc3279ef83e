"""`StoredRows`: row-level access to what a `StoreCheckpointer` stores (`checkpointer.stored`).

For this package's tools that work below LangGraph's saver interface: the migration runner
rewrites stored checkpoints, a metadata-only history lists rows without reading a value, and
`verify` recomputes audit hashes from the bytes as stored. Rows are decoded with the
checkpointer's serializer; nothing here goes through the caches of a put.
"""

from __future__ import annotations

import builtins
from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from langgraph.checkpoint.base import CheckpointMetadata, CheckpointTuple
from langgraph.checkpoint.serde.base import SerializerProtocol

from . import codec
from .retention import LifecycleEvent, thread_digest
from .rows import AuditSwitch, BlobRow, CheckpointRow, ListQuery, MigrationEntry, WriteRow

if TYPE_CHECKING:
    from .saver import StoreCheckpointer
    from .sealedstore import SealedStore


class StoredRows:
    """The rows of one checkpointer's store (see the module docstring)."""

    def __init__(self, saver: StoreCheckpointer) -> None:
        self._saver = saver

    @property
    def serde(self) -> SerializerProtocol:
        """The serializer the rows' values and records are encoded with."""
        return self._saver.serde

    @property
    def inline(self) -> bool:
        """The store never suspends (in memory): its coroutines must run one at a time."""
        return self._saver._store.inline

    @property
    def snapshot_every(self) -> int:
        """How often a list stored as append-deltas is stored whole (see `AppendLog`)."""
        return int(2 ** self._saver._log.top_level)

    @property
    def sealed(self) -> SealedStore | None:
        """The layer that seals values (encryption, compression), whose `inner` holds the
        rows as stored; None when values are stored as they are."""
        from .sealedstore import SealedStore

        store = self._saver._store
        return store if isinstance(store, SealedStore) else None

    def iter(self, query: ListQuery) -> AsyncIterator[CheckpointRow]:
        """Checkpoint rows matching `query`, newest first, no value read (close it with
        `aclose()` when leaving early)."""
        return self._saver._store.iter_checkpoints(query)

    def metadata(self, row: CheckpointRow) -> CheckpointMetadata:
        """A row's metadata, decoded."""
        return self._saver._metadata(row)

    def header(self, row: CheckpointRow) -> dict[str, Any]:
        """A row's checkpoint record without its values (ts, channel versions, versions seen)."""
        return self._saver._header(row)

    async def load(
        self,
        rows: Sequence[CheckpointRow],
        *,
        upgrade: bool = True,
        raw_writes: dict[tuple[str, str], builtins.list[WriteRow]] | None = None,
    ) -> builtins.list[CheckpointTuple]:
        """Checkpoint tuples for rows (values and pending writes read a namespace at a time);
        `upgrade=False`: as stored, no schema upgrade; `raw_writes`, if given, receives the
        write rows read, by (namespace, checkpoint id)."""
        return await self._saver._load(rows, upgrade=upgrade, raw_writes=raw_writes)

    def encode(
        self, row: CheckpointRow, header: Mapping[str, Any], metadata: Mapping[str, Any]
    ) -> CheckpointRow:
        """`row` with a new checkpoint record (`header`, its values left out) and metadata,
        encoded as a put would (same ids, parent and order)."""
        cid = row.checkpoint_id
        return replace(
            row,
            checkpoint=codec.dumps(self.serde, dict(header), f"checkpoint {cid!r}"),
            metadata=codec.dumps(self.serde, dict(metadata), f"metadata of checkpoint {cid!r}"),
            versions=codec.blob_keys(header["channel_versions"])
            if self._saver._row_versions else None,
        )

    async def rewrite(
        self,
        row: CheckpointRow,
        blobs: Sequence[BlobRow],
        writes: Sequence[WriteRow] | None,
        entry: MigrationEntry,
    ) -> bool:
        """Rewrite a stored checkpoint in place and log the migration, atomically; False (and
        nothing written) when the log holds `entry` already (see `Store.rewrite_checkpoint`)."""
        return await self._saver._store.rewrite_checkpoint(row, blobs, writes, entry)

    async def collect_garbage(self, thread_id: str) -> None:
        """Delete the thread's blobs that no stored checkpoint reads any more (after a
        rewrite), and forget what this process remembers of its lists."""
        await self._saver._store.delete_checkpoints(thread_id, [], self._saver._plan_gc)
        self._saver._log.forget(thread_id)

    async def read_blobs(
        self, thread_id: str, ns: str, keys: Collection[tuple[str, str]]
    ) -> dict[tuple[str, str], BlobRow]:
        """The blob rows for `(channel, version)` keys, with the bases their deltas need."""
        return await self._saver._store.read_blobs(thread_id, ns, keys)

    async def read_writes(
        self, thread_id: str, ns: str, checkpoint_ids: Collection[str]
    ) -> dict[str, builtins.list[WriteRow]]:
        """The pending-write rows of checkpoints, by checkpoint id, in LangGraph's order."""
        return await self._saver._store.read_writes(thread_id, ns, checkpoint_ids)

    async def audit_log(self) -> builtins.list[AuditSwitch]:
        """The store's audit switches, oldest first."""
        return await self._saver._store.read_audit_log()

    async def lifecycle(self, thread_id: str) -> builtins.list[LifecycleEvent]:
        """The deletions the store recorded of a thread (erasures, expiries, history cuts)."""
        return await self._saver._store.read_lifecycle(thread_digest(thread_id))
