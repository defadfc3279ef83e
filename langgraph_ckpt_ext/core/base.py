"""What every part of `StoreCheckpointer` shares: its state, the sync bridge, and the decoding
of a stored row's header and metadata. The parts (writing, batches, reading, pruning, auditing)
are mixins over this base, composed in `saver.py`."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import AsyncIterator, Coroutine, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from langgraph.checkpoint.base import BaseCheckpointSaver, CheckpointMetadata

from . import codec
from .appendlog import AppendLog
from .bridge import Bridge, iterate_inline, run_inline
from .rows import CheckpointRow
from .store import Store
from .telemetry import Telemetry

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig

    from .audit import Auditor
    from .redact import Redaction
    from .schema import SchemaChain
    from .sealing import Sealer

T = TypeVar("T")

PAGE = 32  # rows decoded together by `list`, the delta-channel walk and the migration runner


class SaverBase(BaseCheckpointSaver[str]):
    """The state a `StoreCheckpointer` keeps (set by its `__init__`), and its bridge."""

    schema_chain: SchemaChain | None
    _store: Store
    _log: AppendLog
    _bridge: Bridge
    _auditor: Auditor
    _audit_want: bool
    _audit_on: bool | None
    _audit_read_at: float
    _upgrades_stored: OrderedDict[tuple[str, str, str, str], None]
    _row_versions: bool
    """The store resolves blobs server-side: each checkpoint row carries its channel versions."""
    _single: bool
    """`writers="single"`: puts are checked against the namespace's head (`core.guard`)."""
    _tombstone_ttl: float | None
    """Seconds a deleted thread's tombstone lasts (None: no tombstones are left)."""
    writer_epoch: int | None = None
    """The epoch this checkpointer writes with (a `ReplicatedCheckpointer` sets its
    primary's): the store refuses its guarded writes once its own epoch is newer."""
    _redaction: Redaction | None
    """Which metadata keys are secrets, kept out of storage (None: none)."""
    telemetry: Telemetry
    """Where this checkpointer's spans and metric points go (`core.telemetry`)."""
    db_system: str | None = None
    """The backend as OpenTelemetry names database systems (`"postgresql"`, ...); None
    for the in-memory one."""
    replica_apply: bool = False
    """This checkpointer is a replica of a `ReplicatedCheckpointer`: what it is given to
    write was decided by the primary, so only the epoch is checked (no head rule, tombstone
    or lease); a promotion turns it off."""

    _sealer: Sealer
    """How values are sealed at rest (`core.sealing`); `_store` seals them when it is active."""
    _raw_store: Store
    """The backend's store itself (values as stored, sealed or not)."""

    def _note_tenant(self, config: RunnableConfig, thread_id: str) -> None:
        """Remember the tenant a run names, whose key seals what it writes (`Encryption`)."""
        enc = self._sealer.encryption
        if enc is not None and enc.tenant is not None:
            self._store.note_tenant(thread_id, enc.tenant_of(config))  # type: ignore[attr-defined]

    def _sync_iter(self, agen: AsyncIterator[T]) -> Iterator[T]:
        if self._store.inline:
            return iterate_inline(agen)
        return self._bridge.iterate(agen)

    def run_sync(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run one of this checkpointer's coroutines from sync code, as its own sync methods do
        (on its private event loop, or inline for a store that never suspends): how the
        time-travel helpers and wrappers call it from sync code."""
        if self._store.inline:
            return run_inline(coro)
        return self._bridge.run(coro)

    def _metadata(self, row: CheckpointRow) -> CheckpointMetadata:
        return codec.decode_metadata(self.serde, row.metadata, f"checkpoint {row.checkpoint_id!r}")

    def _header(self, row: CheckpointRow) -> dict[str, Any]:
        return codec.decode_header(self.serde, row.checkpoint, f"checkpoint {row.checkpoint_id!r}")
