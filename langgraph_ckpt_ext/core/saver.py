"""`StoreCheckpointer`: the whole `BaseCheckpointSaver` contract, once, over any `Store`.

Backends only move rows (see `store.py`). The class is composed of one mixin per concern, over
`SaverBase` (its state and the one sync bridge): `writing`, `batch`, `reading` (with the
read-time schema `upgrade`), `prune` and `auditing`; serializers are `serde.py`'s. Here: the
constructor, the sync twins, threads, storage, lifecycle, and `stored`, the row access this
package's tools use (`access.py`). The time-travel and migration methods are the public
backend classes' (mixins of the upper layers).
"""

from __future__ import annotations

import builtins
import contextlib
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    DeltaChannelHistory,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from . import codec
from .access import StoredRows
from .appendlog import DEFAULT_MAX_BYTES, AppendLog
from .audit import Auditor
from .batch import Batches, PreparedBatch
from .bridge import Bridge, run_inline
from .config import check_id
from .errors import InvalidConfigError
from .failures import unavailable
from .filters import validate_filter
from .guard import adopt_reads, adopting, carry_read, check_writers, noted, with_held_lease
from .keys import KeyProvider
from .leases import Lease
from .lifecycle import Lifecycle
from .lifetime import store_lifetime
from .reading import Reading, list_query
from .redact import redaction
from .retention import Retention
from .rotation import RotationProgress, RotationReport, rotate_keys
from .rows import CheckpointRow, MigrationEntry, StoredSize
from .schema import SchemaChain, stored_schema_version
from .sealedstore import SealedStore
from .sealing import Compression, Encryption, Sealer
from .serde import loading_serde, strict_serde
from .store import Store
from .telemetry import Telemetry, first_thread, telemetry_of, traced
from .versions import Version, next_version

__all__ = [
    "PreparedBatch", "StoreCheckpointer", "loading_serde", "stored_schema_version", "strict_serde",
]

T = TypeVar("T")

DEFAULT_TOMBSTONE_TTL = 86400.0


def check_tombstone_ttl(ttl: float | None) -> float | None:
    if ttl is None:
        return None
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not ttl > 0 or (
            ttl == float("inf")):
        raise ValueError(f"tombstone_ttl must be a positive number of seconds or None, "
                         f"not {ttl!r}")
    return float(ttl)


def check_audit_keys(keys: object) -> KeyProvider | None:
    if keys is not None and not isinstance(keys, KeyProvider):
        raise InvalidConfigError(
            f"audit_keys takes a KeyProvider (StaticKeys, EnvKeys, CallbackKeys, or your own "
            f"with current() and key()), not {type(keys).__name__}")
    return keys


class StoreCheckpointer(Lifecycle, Batches, Reading):
    """A checkpointer over a `Store`; one object serves sync and async graph calls.

    Args:
        store: the backend's row storage.
        serde: serializer for every stored value (default: strict `JsonPlusSerializer`);
            its loading is made strict too (see `loading_serde`).
        unsafe_allow_any_class: take `serde` as given, even if stored bytes may construct any
            class through it (whoever can write to the storage can then run code here).
        snapshot_every: a list channel grown by appending is stored as deltas, with a full
            value at least every `snapshot_every` versions (a power of two).
        append_log_bytes: memory this process keeps of list channels' last stored values (see
            `AppendLog`), least recently written dropped first (such a list is stored whole at
            its next put). 0: none kept, every list stored whole.
        schema_chain: the state schema's version and upcasters (`SchemaChain`): checkpoints
            are stamped with its current version, older ones are upgraded when read, and
            `migrate_threads` rewrites them in storage.
        audit: turn auditing on for the store (recorded in it, see `enable_audit`): every
            checkpointer that writes to it, whatever its own `audit`, then chains a hash
            through each checkpoint it stores (`metadata["audit"]`), so that `verify` finds
            stored checkpoints altered, deleted or replaced since (see
            `langgraph_ckpt_ext.core.audit`). False turns nothing off: that is
            `disable_audit(reason=...)`.
        retention: the retention policy of every thread without its own (`Retention`, a
            mapping of its fields, or LangGraph Platform's `checkpointer.ttl` mapping, whose
            `sweep_interval_minutes` starts the background sweeper): see `sweep`.
        sweep_every: seconds between background sweeps (a daemon thread; None: none).
        writers: `"single"` (default): a run's checkpoint is refused
            (`ConcurrentWriteError`, nothing stored) when another run wrote the thread since
            this run read it, so that two runs on one thread never fork its history (see
            `core.guard` for the rule, which keeps time travel legal); `"last_wins"`: no
            such check (LangGraph's own savers' behaviour).
        tombstone_ttl: seconds a deleted thread's tombstone lasts (default a day): late
            writes of runs that read the thread before the delete are refused
            (`ThreadDeletedError`); the sweeper removes tombstones older than this. None:
            none left.
        redact_metadata: keep secrets out of checkpoint metadata, where LangGraph copies a run's
            `configurable` values: True (default) drops keys such as `api_key`, `token`,
            `password`, `Authorization` (`core.redact`); a list adds key names to those;
            False stores every key.
        encryption: encrypt every stored value, pending write and metadata, bound to its row
            (`Encryption`: keys, algorithm, tenants, plaintext policy; see `core.sealing`).
        compression: compress stored values with zstd before any encryption (`Compression`,
            or True for its defaults).
        audit_keys: seal the audit trail with a key (`KeyProvider`: `StaticKeys`, `EnvKeys`,
            `CallbackKeys`; 32-byte keys, separate from the encryption keys): each record is
            an HMAC-SHA256 under the key `audit_keys.current(None)` names, with its id, so
            that someone who can write the store but lacks the key cannot forge a trail; and
            `verify` checks records under the key ids they name. None: unkeyed sha256 records,
            tamper-evident only against someone who cannot also rewrite them.
        telemetry: OpenTelemetry spans and metrics of its operations (`Telemetry`: which
            providers, how thread ids show). None (default): the global providers, once an
            application configures them (nothing is recorded before, nor without the `otel`
            extra); False: none.
    """

    _where = ""  # what `repr` shows of where it stores: a path, a URL without its password

    def __init__(
        self,
        store: Store,
        *,
        serde: SerializerProtocol | None = None,
        snapshot_every: int = 256,
        append_log_bytes: int = DEFAULT_MAX_BYTES,
        bridge: Bridge | None = None,
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
        self.telemetry = telemetry_of(telemetry)
        self._redaction = redaction(redact_metadata)
        self._sealer = Sealer(encryption, Compression() if compression is True
                              else compression or None)
        self._single = check_writers(writers) == "single"
        self._tombstone_ttl = check_tombstone_ttl(tombstone_ttl)
        super().__init__(serde=loading_serde(serde, unsafe_allow_any_class=unsafe_allow_any_class))
        self._raw_store = store
        if self._sealer.active:
            store = SealedStore(store, self._sealer, self._versions_of)
        self.schema_chain = schema_chain
        self._auditor: Auditor = Auditor(store, keys=check_audit_keys(audit_keys))
        self._audit_want = bool(audit)  # turn the store's auditing on at the first reading
        self._audit_on: bool | None = None  # the store's setting as read last (None: not yet)
        self._audit_read_at = 0.0
        self._upgrades_stored: OrderedDict[tuple[str, str, str, str], None] = OrderedDict()
        self._store = store
        # A store that resolves blobs server-side needs each row's channel versions.
        self._row_versions = store.wants_versions
        self._log = AppendLog(snapshot_every, append_log_bytes)
        self._bridge = bridge or Bridge(f"lgckpt-{type(self).__name__}")
        self._lifetime = store_lifetime(type(self).__name__, store, self._bridge)
        self._configure_lifecycle(retention, sweep_every)

    def _versions_of(self, row: CheckpointRow) -> dict[str, str]:
        """The blob keys a checkpoint row reads (from its record)."""
        return codec.blob_keys(self._header(row)["channel_versions"])

    @property
    def encryption(self) -> Encryption | None:
        """How stored values are encrypted (None: they are not)."""
        return self._sealer.encryption

    @property
    def compression(self) -> Compression | None:
        """How stored values are compressed (None: they are not)."""
        return self._sealer.compression

    def rotate_keys(
        self,
        thread_ids: Collection[str] | None = None,
        *,
        dry_run: bool = False,
        progress: Callable[[RotationProgress], None] | None = None,
        concurrency: int = 4,
    ) -> RotationReport:
        """Seal every stored value under its tenant's current key, in place: values under an
        older key, and (with `Encryption(plaintext="read")`) values stored unencrypted, which
        encrypts an existing store. Safe beside live writers (a value is replaced only if its
        row still holds what was read); a killed run resumes when started again (values
        already current are left alone). `dry_run`: count, change nothing. `progress` is
        called after each thread. Values that fail to open are listed in the report.

        Example:
            >>> print(checkpointer.rotate_keys().summary())  # doctest: +SKIP
            re-sealed 812 row(s) of 40 thread(s) (...)
        """
        return self.run_sync(self.arotate_keys(thread_ids, dry_run=dry_run, progress=progress,
                                               concurrency=concurrency))

    async def arotate_keys(
        self,
        thread_ids: Collection[str] | None = None,
        *,
        dry_run: bool = False,
        progress: Callable[[RotationProgress], None] | None = None,
        concurrency: int = 4,
    ) -> RotationReport:
        """Async `rotate_keys`."""
        return await rotate_keys(self, thread_ids, dry_run=dry_run, progress=progress,
                                 concurrency=concurrency)

    @property
    def stored(self) -> StoredRows:
        """Row-level access to what this checkpointer stores, for this package's tools that
        work below the saver interface (schema migration, metadata-only history, verify)."""
        return StoredRows(self)

    # -- the sync twins -------------------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        # read on the bridge's loop: the head it saw is recorded in this, the caller's, context
        tup, notes = self.run_sync(noted(self.aget_tuple(config)))
        adopt_reads(notes)
        return tup

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        validate_filter(filter)  # raise here, not at the first next()
        list_query(config, before)
        notes: dict[tuple[str, str], str | None] = {}
        return adopting(self._sync_iter(self._listing(config, filter, before, limit, notes)),
                        notes)

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return self.run_sync(self.aput(carry_read(with_held_lease(config), metadata),
                                       checkpoint, metadata, new_versions))

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        self.run_sync(self.aput_writes(with_held_lease(config), writes, task_id, task_path))

    def delete_thread(self, thread_id: str) -> None:
        self.run_sync(self.adelete_thread(thread_id))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        self.run_sync(self.adelete_for_runs(run_ids))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self.run_sync(self.acopy_thread(source_thread_id, target_thread_id))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        self.run_sync(self.aprune(thread_ids, strategy=strategy))

    def get_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        return self.run_sync(self.aget_delta_channel_history(config=config, channels=channels))

    def get_next_version(  # type: ignore[override]
        self, current: Version | None, channel: None = None
    ) -> Version:
        return next_version(current)

    # -- threads ----------------------------------------------------------------------------

    async def athread_ids(self) -> builtins.list[str]:
        """Every thread id that holds a checkpoint, sorted."""
        return await self._store.thread_ids()

    def thread_ids(self) -> builtins.list[str]:
        """Every thread id that holds a checkpoint, sorted."""
        return self.run_sync(self.athread_ids())

    # -- deleting and copying ---------------------------------------------------------------

    @traced("delete_thread", first_thread)
    async def adelete_thread(self, thread_id: str) -> None:
        thread_id = check_id(thread_id, "thread_id", required=True)
        await self._store.delete_thread(thread_id, self._tombstone_ttl is not None)
        self._log.forget(thread_id)

    # -- one writer per thread --------------------------------------------------------------

    def lease(self, thread_id: str, ttl: float = 30.0, *, wait: float = 0.0,
              keep_alive: bool = True) -> Lease:
        """A lease of the thread, for `with` or `async with`: refuses a second run before it
        starts (`ThreadLeasedError` once `wait` seconds pass), and fences off a holder whose
        lease expired: every write of the thread without the live lease's token is refused
        while it lasts, and the token stops working once it expires or another takes it.

        Example:
            >>> async with checkpointer.lease("t-1", ttl=30) as lease:  # doctest: +SKIP
            ...     await graph.ainvoke(inputs, lease.config())
        """
        return Lease(self._store, self.run_sync, thread_id, ttl, wait, keep_alive)

    async def atombstone(self, thread_id: str) -> float | None:
        """When the thread was deleted, while its tombstone lasts (None: no tombstone)."""
        return await self._store.tombstone(check_id(thread_id, "thread_id", required=True))

    def tombstone(self, thread_id: str) -> float | None:
        """When the thread was deleted, while its tombstone lasts (None: no tombstone)."""
        return self.run_sync(self.atombstone(thread_id))

    async def aread_epoch(self) -> int:
        """The store's writer epoch (0 until raised; see `raise_epoch`)."""
        return await self._store.read_epoch()

    def read_epoch(self) -> int:
        """The store's writer epoch (0 until raised; see `raise_epoch`)."""
        return self.run_sync(self.aread_epoch())

    async def araise_epoch(self, epoch: int) -> int:
        """Make the store's writer epoch at least `epoch` (it never goes back); the epoch in
        force. From then on, writes of checkpointers whose `writer_epoch` is older are
        refused (`FencedError`): how a failover fences off a demoted primary's writers."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"an epoch is an integer >= 0, not {epoch!r}")
        return await self._store.raise_epoch(epoch)

    def raise_epoch(self, epoch: int) -> int:
        """Sync `araise_epoch`."""
        return self.run_sync(self.araise_epoch(epoch))

    @property
    def writers(self) -> str:
        """`"single"` or `"last_wins"` (see the constructor)."""
        return "single" if self._single else "last_wins"

    @traced("copy_thread", first_thread)
    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        source = check_id(source_thread_id, "source_thread_id", required=True)
        target = check_id(target_thread_id, "target_thread_id", required=True)
        await self._store.copy_thread(source, target)
        self._log.forget(target)
        if await self._audited():  # the copied records are bound to the source's thread id
            await self._reseal(target)

    # -- storage ----------------------------------------------------------------------------

    def sizes(self, thread_id: str) -> builtins.list[StoredSize]:
        """What a thread takes in storage: rows and bytes of stored values per namespace, kind
        (`checkpoint`, `blob`, `write`) and channel, read natively by the backend (no value is
        decoded). Empty for a thread with nothing stored.

        Example:
            >>> sum(s.bytes for s in checkpointer.sizes("t-1"))  # doctest: +SKIP
            18342
        """
        return self.run_sync(self.asizes(thread_id))

    async def asizes(self, thread_id: str) -> builtins.list[StoredSize]:
        return await self._store.sizes(check_id(thread_id, "thread_id", required=True))

    def storage_version(self) -> int:
        """The storage version in force (tables or key layout), creating and changing nothing:
        0 where `setup()` never ran, so nothing was ever stored there by this package (and
        always for the in-memory backend, which keeps nothing)."""
        return self.run_sync(self.astorage_version())

    async def astorage_version(self) -> int:
        return await self._store.storage_version()

    def migration_log(self, thread_id: str | None = None) -> builtins.list[MigrationEntry]:
        """The state-schema migrations stored checkpoints went through (of one thread, or of
        all), oldest first: thread, namespace, checkpoint, from and to version, and when."""
        return self.run_sync(self.amigration_log(thread_id))

    async def amigration_log(self, thread_id: str | None = None) -> builtins.list[MigrationEntry]:
        return await self._store.read_migrations(
            None if thread_id is None else check_id(thread_id, "thread_id", required=True))

    # -- lifecycle --------------------------------------------------------------------------

    def setup(self) -> int:
        """Create or migrate the storage; returns its version. Idempotent, and safe when several
        processes call it at once."""
        return self.run_sync(self.asetup())

    async def asetup(self) -> int:
        version = await self._store.migrate()
        await self._read_audit()
        return version

    def _setup_or_close(self) -> None:
        """`setup()` for a constructor: one that fails closes what it opened (its caller never
        gets the object to close)."""
        try:
            self.setup()
        except BaseException:
            with contextlib.suppress(Exception):  # the setup's error is the one to see
                self.close()
            raise

    async def aclose(self) -> None:
        """Close what this checkpointer owns (a connection or pool passed in stays open)."""
        self._closing()
        await self._store.close()
        self._bridge.close()

    def close(self) -> None:
        self._closing()
        if self._store.inline:
            run_inline(self._store.close())
        else:
            self._bridge.run(self._store.close())
        self._bridge.close()

    def _closing(self) -> None:
        self.stop_sweeper()
        if self._lifetime is not None:  # closed by its owner: nothing to release when dropped
            self._lifetime.closed()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._where}>" if self._where else super().__repr__()

    def __enter__(self: T) -> T:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self: T) -> T:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def is_unavailable(self, exc: BaseException) -> bool:
        """Whether `exc`, raised by this checkpointer, means its store could not be reached
        (a wrapper fails over or retries) rather than that it refused the request."""
        return unavailable(exc, self._store.refuses)
