"""`StoreCheckpointer`: the whole `BaseCheckpointSaver` contract, once, over any `Store`.

Backends only move rows (see `store.py`). Everything else lives here or in the pure modules
beside it: encoding, append-deltas, filters, pruning plans, the delta-channel walk, and the
sync twins, which all go through one bridge.
"""

from __future__ import annotations

import builtins
import contextlib
import copy
import dataclasses
import logging
import os
import time
from collections import OrderedDict, defaultdict
from collections.abc import (
    AsyncIterator,
    Callable,
    Collection,
    Coroutine,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar, cast

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    DeltaChannelHistory,
    PendingWrite,
    get_serializable_checkpoint_metadata,
)
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.encrypted import EncryptedSerializer
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from ..timetravel.methods import TimeTravel
from . import codec
from .appendlog import DEFAULT_MAX_BYTES, AppendLog, Plan
from .bridge import Bridge, iterate_inline, run_inline
from .chain import ParentWalk
from .config import (
    check_id,
    check_ids,
    checkpoint_id_of,
    checkpoint_ns_of,
    make_config,
    put_ids,
    thread_id_of,
    write_ids,
)
from .errors import InvalidConfigError
from .failures import unavailable
from .filters import matches, validate_filter
from .lifetime import store_lifetime
from .rows import AuditSwitch, BlobRef, BlobRow, CheckpointRow, ListQuery, StoredSize, WriteRow
from .store import BatchItem, BlobKey, Store
from .versions import (
    Version,
    any_upgraded,
    is_upgraded,
    next_version,
    plain,
    upgraded_version,
    version_key,
)

if TYPE_CHECKING:
    from ..migrations import SchemaChain
    from ..migrations.runner import MigrationProgress, MigrationReport
    from ..timetravel.audit import Auditor, AuditReport, AuditStatus
    from .rows import MigrationEntry

T = TypeVar("T")

_audit_logger = logging.getLogger("langgraph_ckpt_ext.audit")

_PAGE = 32  # rows decoded together by `list` and by the delta-channel walk


# The typed parts of our `AgentState` (frozen pydantic models, extra fields refused): always
# safe to construct, wherever LangGraph's schema walk misses them (an Annotated reducer field).
_OWN_TYPES = tuple(
    ("langgraph_ckpt_ext.state", name)
    for name in ("PlanStep", "ToolSpec", "ToolCall", "MemoryRef", "WorkingMemory")
)


def strict_serde() -> SerializerProtocol:
    """LangGraph's serializer, strict: a stored blob may construct only LangGraph's safe types,
    the typed parts of our `AgentState`, and the types the graph's state schema allows (LangGraph
    adds those when the graph compiles)."""
    return JsonPlusSerializer(allowed_msgpack_modules=_OWN_TYPES)


def loading_serde(
    serde: SerializerProtocol | None, *, unsafe_allow_any_class: bool = False
) -> SerializerProtocol:
    """The serializer a checkpointer stores and loads with: `serde` (default `strict_serde()`)
    made strict, whatever it was built with.

    A `JsonPlusSerializer` (or subclass), alone or inside `EncryptedSerializer`s, is replaced
    by a copy whose stored bytes may construct only LangGraph's safe types, the typed parts of
    our `AgentState`, the classes of its own explicit `allowed_msgpack_modules` and
    `allowed_json_modules`, and those LangGraph adds for the graph's state schema. Without
    this, LangGraph's `JsonPlusSerializer()` constructs any class a stored row names (unless
    `LANGGRAPH_STRICT_MSGPACK` is set), and an `EncryptedSerializer` hands it rows stored
    without encryption. Refused with `InvalidConfigError`, as no allowlist makes them safe:
    `pickle_fallback=True` (a stored pickle runs any code), a custom `__unpack_ext_hook__`,
    and serializers of other kinds (what they build from stored bytes is theirs to decide).

    `unsafe_allow_any_class=True` takes `serde` as it is: whoever can write to the storage may
    then run code in this process, as LangGraph's savers allow by default.
    """
    if serde is None:
        return strict_serde()
    return serde if unsafe_allow_any_class else _strict(serde)


def _strict(serde: SerializerProtocol) -> SerializerProtocol:
    if isinstance(serde, EncryptedSerializer):
        inner = _strict(serde.serde)
        if inner is serde.serde:
            return serde
        clone = copy.copy(serde)  # the caller's serializer is theirs: never changed
        clone.serde = inner
        return clone
    if isinstance(serde, JsonPlusSerializer):
        return _strict_jsonplus(serde)
    raise _cannot_be_strict(f"a {type(serde).__name__}: only LangGraph's JsonPlusSerializer, or "
                            "an EncryptedSerializer over one, is made strict here")


def _cannot_be_strict(what: str) -> InvalidConfigError:
    return InvalidConfigError(
        f"serde is {what}; loading could construct any class a stored row names. Pass "
        "unsafe_allow_any_class=True (lgckpt: --unsafe-allow-any-class) to use it anyway, "
        "trusting whoever can write to the storage"
    )


def _strict_jsonplus(serde: JsonPlusSerializer) -> JsonPlusSerializer:
    """`serde`, or a copy of it, loading only allowlisted classes (its own list kept)."""
    if serde.pickle_fallback:
        raise _cannot_be_strict("JsonPlusSerializer(pickle_fallback=True): a stored pickle runs "
                                "any code")
    if getattr(serde, "_custom_unpack_ext_hook", False):
        raise _cannot_be_strict("a JsonPlusSerializer with its own __unpack_ext_hook__")
    # LangGraph's private settings, read only: its constructor sets the copy's below.
    msgpack = getattr(serde, "_allowed_msgpack_modules", True)
    json_modules = getattr(serde, "_allowed_json_modules", True)
    allowed = {*_OWN_TYPES, *(msgpack if isinstance(msgpack, (set, frozenset)) else ())}
    if msgpack is not True and json_modules is not True and msgpack == allowed:
        return serde  # strict already (ours, or made so before)
    clone = copy.copy(serde)
    JsonPlusSerializer.__init__(
        clone,
        allowed_json_modules=json_modules if isinstance(json_modules, (set, frozenset)) else None,
        allowed_msgpack_modules=sorted(allowed),
    )
    return clone


class StoreCheckpointer(BaseCheckpointSaver[str], TimeTravel):
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
            `langgraph_ckpt_ext.timetravel.audit`). False turns nothing off: that is
            `disable_audit(reason=...)`.
    """

    _where = ""  # what `repr` shows of where it stores: a path, a URL without its password
    audit_refresh: float = 1.0
    """Seconds this checkpointer trusts the store's audit setting it read last: a write finding
    an older reading reads it again (0: before every write). It is read at `setup()` too."""

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
    ) -> None:
        super().__init__(serde=loading_serde(serde, unsafe_allow_any_class=unsafe_allow_any_class))
        self.schema_chain = schema_chain
        # imported here: the time-travel package imports this module
        from ..timetravel.audit import Auditor

        self._auditor: Auditor = Auditor(store)
        self._audit_want = bool(audit)  # turn the store's auditing on at the first reading
        self._audit_on: bool | None = None  # the store's setting as read last (None: not yet)
        self._audit_read_at = 0.0
        self._upgrades_stored: OrderedDict[tuple[str, str, str, str], None] = OrderedDict()
        self._store = store
        # A store that resolves blobs server-side needs each row's channel versions.
        self._row_versions = bool(getattr(store, "wants_versions", False))
        self._log = AppendLog(snapshot_every, append_log_bytes)
        self._bridge = bridge or Bridge(f"lgckpt-{type(self).__name__}")
        self._lifetime = store_lifetime(type(self).__name__, store, self._bridge)

    # -- the sync twins -------------------------------------------------------------------

    def _sync(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._store.inline:
            return run_inline(coro)
        return self._bridge.run(coro)

    def _sync_iter(self, agen: AsyncIterator[T]) -> Iterator[T]:
        if self._store.inline:
            return iterate_inline(agen)
        return self._bridge.iterate(agen)

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return self._sync(self.aget_tuple(config))

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        validate_filter(filter)  # raise here, not at the first next()
        _list_query(config, before)
        return self._sync_iter(self.alist(config, filter=filter, before=before, limit=limit))

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return self._sync(self.aput(config, checkpoint, metadata, new_versions))

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        self._sync(self.aput_writes(config, writes, task_id, task_path))

    def delete_thread(self, thread_id: str) -> None:
        self._sync(self.adelete_thread(thread_id))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        self._sync(self.adelete_for_runs(run_ids))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self._sync(self.acopy_thread(source_thread_id, target_thread_id))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        self._sync(self.aprune(thread_ids, strategy=strategy))

    def get_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        return self._sync(self.aget_delta_channel_history(config=config, channels=channels))

    def get_next_version(  # type: ignore[override]
        self, current: Version | None, channel: None = None
    ) -> Version:
        return next_version(current)

    # -- writing --------------------------------------------------------------------------

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        seal = await self._audited()
        put = await self._prepare_put(config, checkpoint, metadata, new_versions, seal=seal)
        fell_back = await self._store.write_checkpoint(put.row, put.blobs)
        self._stored(put, fell_back)
        return make_config(put.row.thread_id, put.row.checkpoint_ns, put.row.checkpoint_id)

    async def _prepare_put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
        portable: bool = False,
        *,
        seal: bool = False,
    ) -> _PreparedPut:
        """A checkpoint as the rows to store (`seal`: with an audit record), and what to
        remember once they are stored."""
        md = get_serializable_checkpoint_metadata(config, metadata)
        thread_id, ns, checkpoint_id, parent_id = put_ids(config, checkpoint, md, new_versions)
        if self.schema_chain is not None:  # the stamp is the chain's: an unnamed one sets none
            md.pop("schema_name", None)  # type: ignore[typeddict-item]
            md.update(self.schema_chain.stamp())  # type: ignore[typeddict-item]
        checkpoint, upgraded = _store_upgraded(checkpoint, new_versions)
        header = codec.encode_header(self.serde, checkpoint)
        blobs, plans = codec.encode_blobs(
            self.serde, self._log, thread_id, ns, checkpoint["channel_values"], new_versions
        )
        marks = self._upgraded_blobs(thread_id, ns, checkpoint["channel_values"], upgraded)
        blobs += [b for _, b in marks]
        # A record of the audit trail copied along (a fork) would be stale: ours to write.
        if isinstance(md.get("audit"), dict) and "hash" in md["audit"]:  # type: ignore[typeddict-item]
            md.pop("audit")  # type: ignore[typeddict-item]
        sealed = None
        if seal:
            sealed = await self._auditor.seal(
                self.serde, (thread_id, ns, checkpoint_id, parent_id), header,
                md, checkpoint, codec.blob_keys(new_versions), blobs,
            )
            md["audit"] = sealed.record  # type: ignore[typeddict-unknown-key]
        md_typed = codec.dumps(self.serde, md, f"metadata of checkpoint {checkpoint_id!r}")
        run_id = md.get("run_id")
        row = CheckpointRow(
            thread_id,
            ns,
            checkpoint_id,
            parent_id,
            None if run_id is None else str(run_id),
            header,
            md_typed,
            # Redis resolves blobs by these; rows copied to another store may go to a Redis.
            codec.blob_keys(checkpoint["channel_versions"])
            if self._row_versions or portable else None,
        )
        dropped = tuple(ch for ch in new_versions if ch not in plans)
        return _PreparedPut(row, blobs, plans, [k for k, _ in marks], sealed, dropped)

    def _stored(self, put: _PreparedPut, fell_back: Collection[str], planned: bool = True) -> None:
        """Remember what a stored checkpoint holds (`planned`: its append plans still need
        committing to the log)."""
        if put.sealed is not None:
            self._auditor.stored(put.sealed)
        for key in put.marks:  # stored now: later checkpoints holding the same mark skip it
            self._upgrades_stored[key] = None
            if len(self._upgrades_stored) > 4096:
                self._upgrades_stored.popitem(last=False)
        if planned:
            self._log.record(put.row.thread_id, put.row.checkpoint_ns, put.plans, fell_back,
                             put.dropped)

    async def aput_batch(self, ops: Sequence[tuple[Any, ...]]) -> None:
        """Store checkpoints and writes in order, in one batch (one transaction or round trip
        where the backend allows). Each op is `("put", config, checkpoint, metadata,
        new_versions)` or `("writes", config, writes, task_id, task_path)`, as the arguments of
        `aput` / `aput_writes`. Used by `SmartCheckpointer` to flush a thread."""
        prepared = await self.aprepare_batch(ops)
        if prepared is None:  # audited: each hash chains on the one stored before it
            for op in ops:
                if op[0] == "put":
                    await self.aput(*op[1:])
                else:
                    await self.aput_writes(*op[1:])
            return
        await self.awrite_prepared([prepared])

    def put_batch(self, ops: Sequence[tuple[Any, ...]]) -> None:
        """Sync `aput_batch`."""
        self._sync(self.aput_batch(ops))

    async def aprepare_batch(
        self, ops: Sequence[tuple[Any, ...]], *, portable: bool = False
    ) -> PreparedBatch | None:
        """`aput_batch`'s ops as rows, not yet written. None when the store is audited (its
        records are sealed one by one as stored), unless the batch is `portable` with one
        checkpoint at most: that one is sealed as `aput` would (a replicated write).

        Batches are written with `awrite_prepared`, several at once if need be: a batch
        written again with a later one (while its own write is still out) makes the later
        write stand for both, so that it never waits for the earlier one to come back.
        `portable`: rows any of our stores can take (`awrite_rows`), not only this one.
        """
        audited = await self._audited()
        if audited and not (portable and sum(op[0] == "put" for op in ops) <= 1):
            return None
        batch = PreparedBatch([], [], set(), audited)
        try:
            for op in ops:
                if op[0] == "put":
                    _, config, checkpoint, metadata, new_versions = op
                    put = await self._prepare_put(
                        config, checkpoint, metadata, new_versions, portable, seal=audited)
                    batch.items.append((put.row, put.blobs))
                    batch.puts.append(put)
                    row = put.row
                    batch.threads.add(row.thread_id)
                    # Committed now, so that the next checkpoint (of this batch or one
                    # prepared after it) appends to this one; forgotten if a write fails.
                    self._log.record(row.thread_id, row.checkpoint_ns, put.plans, (),
                                     put.dropped)
                else:
                    rows = self._encode_writes(*op[1:])
                    if rows:
                        batch.items.append(rows)
                        batch.threads.add(rows[0].thread_id)
        except BaseException:
            for thread_id in batch.threads:
                self._log.forget(thread_id)
            raise
        return batch

    def prepare_batch(
        self, ops: Sequence[tuple[Any, ...]], *, portable: bool = False
    ) -> PreparedBatch | None:
        """Sync `aprepare_batch`."""
        return self._sync(self.aprepare_batch(ops, portable=portable))

    async def awrite_prepared(self, batches: Sequence[PreparedBatch]) -> None:
        """Write prepared batches, in order, as one batch (one transaction or round trip where
        the backend allows). Every row is an upsert, so a batch written twice (here and by a
        write of its own still out) stores the same rows."""
        items = [item for b in batches for item in b.items]
        # An audited batch's writes, as `aput_writes` stores them (a child's seal covers them).
        writes = [w for b in batches if b.audited for i in b.items if isinstance(i, list) for w in i]
        try:
            with self._auditor.writing(writes):
                fell_back = await self._store.write_batch(items) if items else []
        except BaseException:
            for thread_id in {t for b in batches for t in b.threads}:
                self._log.forget(thread_id)
            raise
        puts = [put for b in batches for put in b.puts]
        for put, fell in zip(puts, fell_back, strict=True):
            self._stored(put, fell, planned=False)

    def write_prepared(self, batches: Sequence[PreparedBatch]) -> None:
        """Sync `awrite_prepared`."""
        self._sync(self.awrite_prepared(batches))

    async def awrite_rows(self, items: Sequence[BatchItem]) -> None:
        """Store rows another checkpointer made (`PreparedBatch.rows()`), as one batch: a
        replica of ours takes the primary's rows instead of encoding every value again. The
        serializers must be alike (`rows_compatible`). An append-delta whose base is not here
        raises `MissingBaseError` and nothing is written: the thread needs a repair."""
        if items:
            await self._store.write_batch(items)

    def write_rows(self, items: Sequence[BatchItem]) -> None:
        """Sync `awrite_rows`."""
        self._sync(self.awrite_rows(items))

    def rows_compatible(self, other: BaseCheckpointSaver[Any]) -> bool:
        """Whether rows this checkpointer makes can be stored by `other` as they are: both
        ours, with LangGraph's own serializer (an encrypting one, say, would differ), and
        neither store known to be audited (an audited store seals each row as stored), as
        last read: this reads nothing, so an unreachable store can be asked.
        """
        return (
            isinstance(other, StoreCheckpointer)
            and type(self.serde) is JsonPlusSerializer
            and type(other.serde) is JsonPlusSerializer
            and not (self._audit_want or self._audit_on)
            and not (other._audit_want or other._audit_on)
        )

    def _upgraded_blobs(
        self, thread_id: str, ns: str, values: Mapping[str, Any], versions: Mapping[str, str]
    ) -> builtins.list[tuple[tuple[str, str, str, str], BlobRow]]:
        """Whole rows for values a schema upgrade gave a version on read, until a checkpoint
        holding them is stored by this process (later checkpoints of the same run still hold
        the marked version, and the row is there by then)."""
        rows = []
        for ch, vkey in versions.items():
            key = (thread_id, ns, ch, vkey)
            if ch in values and key not in self._upgrades_stored:
                what = f"channel {ch!r}"
                rows.append((key, BlobRow(ch, vkey, *codec.dumps(self.serde, values[ch], what))))
        return rows

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        rows = self._encode_writes(config, writes, task_id, task_path)
        if rows and await self._audited():
            with self._auditor.writing(rows):
                await self._store.write_writes(rows)
        elif rows:
            await self._store.write_writes(rows)

    def _encode_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> builtins.list[WriteRow]:
        thread_id, ns, checkpoint_id, task = write_ids(config, writes, task_id, task_path)
        return codec.encode_writes(
            self.serde, thread_id, ns, checkpoint_id, writes, task, task_path
        )

    # -- reading --------------------------------------------------------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        thread_id, ns = thread_id_of(config), checkpoint_ns_of(config)
        headers: dict[str, dict[str, Any]] = {}
        to_read: dict[str, str] = {}

        # Every value comes from the stored rows, in every process (see `_tuple`).
        def wanted(row: CheckpointRow) -> builtins.list[tuple[str, str]]:
            headers[row.checkpoint_id] = header = self._header(row)
            to_read.update(codec.blob_keys(header["channel_versions"]))
            return builtins.list(to_read.items())

        found = await self._store.read_tuple(thread_id, ns, checkpoint_id_of(config), wanted)
        if found is None:
            return None
        row, blobs, writes = found
        return self._tuple(row, headers[row.checkpoint_id], blobs, to_read, writes)

    def _tuple(
        self,
        row: CheckpointRow,
        header: Mapping[str, Any],
        blobs: Mapping[tuple[str, str], Any],
        to_read: Mapping[str, str],
        writes: Sequence[Any],
        metadata: CheckpointMetadata | None = None,
        upgrade: bool = True,
    ) -> CheckpointTuple:
        thread_id, ns, parent = row.thread_id, row.checkpoint_ns, row.parent_checkpoint_id
        # A list whose stored bytes are exactly those this process stored last may be read as
        # fresh copies of its items decoded before (never objects held, never other bytes).
        values = codec.resolve_blobs(self.serde, blobs, to_read,
                                     codec.ListCopies(self._log, thread_id, ns))
        checkpoint = cast(Checkpoint, {**header, "id": row.checkpoint_id, "channel_values": values})
        tup = CheckpointTuple(
            config=make_config(thread_id, ns, row.checkpoint_id),
            checkpoint=checkpoint,
            metadata=self._metadata(row) if metadata is None else metadata,
            parent_config=make_config(thread_id, ns, parent) if parent else None,
            pending_writes=codec.decode_writes(self.serde, writes),
        )
        if upgrade and self.schema_chain is not None:
            return self._upgrade(tup, self.schema_chain)
        return tup

    def _upgrade(self, tup: CheckpointTuple, chain: SchemaChain) -> CheckpointTuple:
        """A checkpoint stored under an older state schema, as the current one sees it.

        Channels whose value the upgrade changed or added get a fresh version marked as not
        stored (`upgraded_version`): the next `put` of a checkpoint that still holds them
        stores them, so a thread resumed from here keeps its upgraded values."""
        from ..migrations import compare, stored_schema_name

        if not chain.owns(stored_schema_name(tup.metadata, tup.checkpoint["id"])):
            return tup  # another chain's: its versions mean nothing to this one
        stored = stored_schema_version(tup.metadata, chain, tup.checkpoint["id"])
        if not chain.needs(stored):
            return tup

        old = tup.checkpoint["channel_values"]
        values = chain.upgrade(old, stored)
        old_versions = tup.checkpoint["channel_versions"]
        added, removed, changed = compare(old, values)
        versions = {ch: v for ch, v in old_versions.items() if ch not in removed}
        moved = [*added, *changed, *(ch for ch in values if ch not in versions)]
        if moved:
            bump = upgraded_version(_max_version(old_versions.values()))
            versions.update(dict.fromkeys(moved, bump))
        writes = [
            (task, ch, v)
            for task, channel, value in tup.pending_writes or ()
            for ch, v in chain.upgrade_write(channel, value, stored)
        ]
        checkpoint = cast(
            Checkpoint,
            {**tup.checkpoint, "channel_values": values, "channel_versions": versions},
        )
        metadata = cast(CheckpointMetadata, {**tup.metadata, "schema_version": chain.current})
        return tup._replace(checkpoint=checkpoint, metadata=metadata, pending_writes=writes)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        flt = validate_filter(filter)
        if limit is not None and limit <= 0:
            return
        query = _list_query(config, before)
        left = limit
        page: builtins.list[CheckpointRow] = []
        metadata: dict[int, CheckpointMetadata] = {}  # decoded for the filter: reused
        rows = self._store.iter_checkpoints(query)
        try:
            async for row in rows:
                if flt:
                    md = self._metadata(row)
                    if not matches(md, flt):
                        continue
                    metadata[len(page)] = md
                page.append(row)
                if left is not None:
                    left -= 1
                if len(page) >= _PAGE or left == 0:
                    for tup in await self._load(page, metadata):
                        yield tup
                    page, metadata = [], {}
                    if left == 0:
                        return
            for tup in await self._load(page, metadata):
                yield tup
        finally:
            await rows.aclose()  # type: ignore[attr-defined]

    def _metadata(self, row: CheckpointRow) -> CheckpointMetadata:
        return codec.decode_metadata(self.serde, row.metadata, f"checkpoint {row.checkpoint_id!r}")

    def _header(self, row: CheckpointRow) -> dict[str, Any]:
        return codec.decode_header(self.serde, row.checkpoint, f"checkpoint {row.checkpoint_id!r}")

    async def _load(
        self,
        rows: Sequence[CheckpointRow],
        metadata: Mapping[int, CheckpointMetadata] | None = None,
        *,
        upgrade: bool = True,
        raw_writes: dict[tuple[str, str], builtins.list[WriteRow]] | None = None,
    ) -> builtins.list[CheckpointTuple]:
        """Checkpoint tuples for rows, with one blob read and one write read per namespace
        (`metadata`: what is already decoded, by index into `rows`; `raw_writes`, if given,
        receives the write rows read, by (namespace, checkpoint id))."""
        groups: dict[tuple[str, str], builtins.list[int]] = defaultdict(builtins.list)
        for i, row in enumerate(rows):
            groups[(row.thread_id, row.checkpoint_ns)].append(i)
        out: builtins.list[CheckpointTuple | None] = [None] * len(rows)
        for (thread_id, ns), idxs in groups.items():
            headers = {i: self._header(rows[i]) for i in idxs}
            wanted = {i: codec.blob_keys(h["channel_versions"]) for i, h in headers.items()}
            keys = {key for i in idxs for key in wanted[i].items()}
            blobs = await self._store.read_blobs(thread_id, ns, keys) if keys else {}
            ids = [rows[i].checkpoint_id for i in idxs]
            writes = await self._store.read_writes(thread_id, ns, ids)
            if raw_writes is not None:
                raw_writes.update({(ns, cid): ws for cid, ws in writes.items()})
            for i in idxs:
                out[i] = self._tuple(
                    rows[i], headers[i], blobs, wanted[i],
                    writes.get(rows[i].checkpoint_id, []), (metadata or {}).get(i), upgrade,
                )
        return out  # type: ignore[return-value]

    async def aget_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        """Per channel, the writes on the parent chain since its nearest stored value (the
        seed), oldest first; ancestors are read in pages, not one by one."""
        thread_id, ns = thread_id_of(config), checkpoint_ns_of(config)
        checkpoint_id = checkpoint_id_of(config)
        check_ids(channels, "channel name")
        if not channels:
            return {}
        target = await self._store.read_checkpoint(thread_id, ns, checkpoint_id)
        walk = ParentWalk(thread_id, ns)  # a tampered parent link must not loop forever
        if target is not None:
            walk.visit(target.checkpoint_id)
        remaining = set(channels)
        seeds: dict[str, Any] = {}
        collected: builtins.list[builtins.list[PendingWrite]] = []  # per ancestor, nearest first
        cursor = target.parent_checkpoint_id if target else None
        while cursor is not None and remaining:
            batch = await self._store.read_ancestors(thread_id, ns, cursor, _PAGE)
            if not batch:
                break
            versions = [codec.blob_keys(self._header(r)["channel_versions"]) for r in batch]
            keys = {(ch, v[ch]) for v in versions for ch in remaining if ch in v}
            blobs = await self._store.read_blobs(thread_id, ns, keys) if keys else {}
            writes = await self._store.read_writes(
                thread_id, ns, [r.checkpoint_id for r in batch], remaining
            )
            for row, vers in zip(batch, versions, strict=False):
                if not remaining:
                    break
                walk.visit(row.checkpoint_id)
                mine = [w for w in writes.get(row.checkpoint_id, []) if w.channel in remaining]
                collected.append(codec.decode_writes(self.serde, mine))
                stored = {ch: vers[ch] for ch in remaining if (ch, vers.get(ch)) in blobs}
                for ch, value in codec.resolve_blobs(self.serde, blobs, stored).items():
                    seeds[ch] = value
                    remaining.discard(ch)
            cursor = batch[-1].parent_checkpoint_id
        result: dict[str, DeltaChannelHistory] = {}
        for ch in channels:
            entry: DeltaChannelHistory = {
                "writes": [w for group in reversed(collected) for w in group if w[1] == ch]
            }
            if ch in seeds:
                entry["seed"] = seeds[ch]
            result[ch] = entry
        return result

    # -- threads ----------------------------------------------------------------------------

    async def athread_ids(self) -> builtins.list[str]:
        """Every thread id that holds a checkpoint, sorted."""
        return await self._store.thread_ids()

    def thread_ids(self) -> builtins.list[str]:
        """Every thread id that holds a checkpoint, sorted."""
        return self._sync(self.athread_ids())

    # -- deleting and copying ---------------------------------------------------------------

    async def adelete_thread(self, thread_id: str) -> None:
        thread_id = check_id(thread_id, "thread_id", required=True)
        await self._store.delete_thread(thread_id)
        self._log.forget(thread_id)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        source = check_id(source_thread_id, "source_thread_id", required=True)
        target = check_id(target_thread_id, "target_thread_id", required=True)
        await self._store.copy_thread(source, target)
        self._log.forget(target)
        if await self._audited():  # the copied records are bound to the source's thread id
            await self._reseal(target)

    async def _reseal(self, thread_id: str) -> None:
        """Seal a thread's stored checkpoints again, as one batch (a copy of another's)."""
        rows = [r async for r in self._store.iter_checkpoints(ListQuery(thread_id=thread_id))]
        items: builtins.list[BatchItem] = []
        for row, record in await self._auditor.reseal(self.serde, rows):
            what = f"metadata of checkpoint {row.checkpoint_id!r}"
            md = {**self._metadata(row), "audit": record}
            versions = (codec.blob_keys(self._header(row)["channel_versions"])
                        if self._row_versions else None)
            items.append((dataclasses.replace(
                row, metadata=codec.dumps(self.serde, md, what), versions=versions), []))
        if items:
            await self._store.write_batch(items)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        ids = check_ids(run_ids, "run_id")
        if not ids:
            return
        by_thread: dict[str, builtins.list[tuple[str, str]]] = defaultdict(list)
        for thread_id, ns, checkpoint_id in await self._store.find_runs(ids):
            by_thread[thread_id].append((ns, checkpoint_id))
        for thread_id, victims in by_thread.items():
            await self._store.delete_checkpoints(thread_id, victims, self._plan_gc)
            self._log.forget(thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Prune threads: `"delete"` removes them; `"keep_latest"` keeps each namespace's newest
        checkpoint, plus the ancestors (and their writes) that its `DeltaChannel`s still need
        to rebuild their values.

        Safe while the threads are being written, from any process: checkpoints stored
        meanwhile are kept, and every checkpoint left reads back whole. Raises
        `StoreBusyError` (that thread unchanged, those before it pruned) when a thread's
        writers keep it longer than the store waits (PostgreSQL: `lock_timeout`, 5 s unless
        the session sets one): retry later."""
        _check_strategy(strategy)
        for thread_id in check_ids(thread_ids, "thread_id", required=True):
            if strategy == "delete":
                await self._store.delete_thread(thread_id)
            else:
                victims = await self._prune_victims(thread_id)
                if victims:
                    await self._store.delete_checkpoints(thread_id, victims, self._plan_gc)
            self._log.forget(thread_id)

    def prune_plan(
        self, thread_id: str, *, strategy: str = "keep_latest"
    ) -> builtins.list[tuple[str, str]]:
        """The `(checkpoint_ns, checkpoint_id)` of the checkpoints `prune([thread_id],
        strategy=...)` would delete now, newest first; nothing is changed (a dry run)."""
        return self._sync(self.aprune_plan(thread_id, strategy=strategy))

    async def aprune_plan(
        self, thread_id: str, *, strategy: str = "keep_latest"
    ) -> builtins.list[tuple[str, str]]:
        _check_strategy(strategy)
        thread_id = check_id(thread_id, "thread_id", required=True)
        if strategy == "keep_latest":
            victims = await self._prune_victims(thread_id)
        else:
            query = ListQuery(thread_id=thread_id)
            victims = [(r.checkpoint_ns, r.checkpoint_id)
                       async for r in self._store.iter_checkpoints(query)]
        return sorted(victims, key=lambda v: (v[1], v[0]), reverse=True)

    async def _prune_victims(self, thread_id: str) -> builtins.list[tuple[str, str]]:
        rows = [r async for r in self._store.iter_checkpoints(ListQuery(thread_id=thread_id))]
        by_ns: dict[str, dict[str, CheckpointRow]] = defaultdict(dict)
        for row in rows:
            by_ns[row.checkpoint_ns][row.checkpoint_id] = row
        victims: builtins.list[tuple[str, str]] = []
        for ns, by_id in by_ns.items():
            keep = await self._delta_ancestry(thread_id, ns, by_id, max(by_id))
            victims += [(ns, cid) for cid in by_id if cid not in keep]
        return victims

    async def _delta_ancestry(
        self, thread_id: str, ns: str, by_id: Mapping[str, CheckpointRow], latest: str
    ) -> set[str]:
        """`latest` and the ancestors up to each of its delta channels' nearest stored value."""
        keep = {latest}
        counters = self._metadata(by_id[latest]).get("counters_since_delta_snapshot") or {}
        needed = set(counters)
        cursor = by_id[latest].parent_checkpoint_id
        walk = ParentWalk(thread_id, ns)  # a tampered parent link must not loop forever
        walk.visit(latest)
        while needed and cursor is not None and cursor in by_id:
            walk.visit(cursor)
            keep.add(cursor)
            versions = codec.blob_keys(self._header(by_id[cursor])["channel_versions"])
            keys = {(ch, versions[ch]) for ch in needed if ch in versions}
            stored = await self._store.read_blobs(thread_id, ns, keys) if keys else {}
            needed -= {ch for ch, _ in stored}
            cursor = by_id[cursor].parent_checkpoint_id
        return keep

    def _plan_gc(
        self, remaining: Sequence[CheckpointRow], refs: Sequence[BlobRef]
    ) -> builtins.list[BlobKey]:
        """Blobs that no remaining checkpoint reads, directly or as an append-delta base."""
        by_key = {(r.checkpoint_ns, r.channel, r.version): r for r in refs}
        live: set[BlobKey] = set()
        for row in remaining:
            for ch, v in codec.blob_keys(self._header(row)["channel_versions"]).items():
                key: BlobKey | None = (row.checkpoint_ns, ch, v)
                while key is not None and key not in live and key in by_key:
                    live.add(key)
                    base = by_key[key].base_version
                    key = None if base is None else (key[0], key[1], base)
        return [k for k in by_key if k not in live]

    # -- storage ----------------------------------------------------------------------------

    def sizes(self, thread_id: str) -> builtins.list[StoredSize]:
        """What a thread takes in storage: rows and bytes of stored values per namespace, kind
        (`checkpoint`, `blob`, `write`) and channel, read natively by the backend (no value is
        decoded). Empty for a thread with nothing stored.

        Example:
            >>> sum(s.bytes for s in checkpointer.sizes("t-1"))  # doctest: +SKIP
            18342
        """
        return self._sync(self.asizes(thread_id))

    async def asizes(self, thread_id: str) -> builtins.list[StoredSize]:
        return await self._store.sizes(check_id(thread_id, "thread_id", required=True))

    def storage_version(self) -> int:
        """The storage version in force (tables or key layout), creating and changing nothing:
        0 where `setup()` never ran, so nothing was ever stored there by this package (and
        always for the in-memory backend, which keeps nothing)."""
        return self._sync(self.astorage_version())

    async def astorage_version(self) -> int:
        return await self._store.storage_version()

    # -- state-schema migration ------------------------------------------------------------

    def migrate_threads(
        self,
        thread_ids: Sequence[str] | None = None,
        *,
        dry_run: bool = False,
        progress: Callable[[MigrationProgress], None] | None = None,
        concurrency: int = 4,
        include_unstamped: bool = False,
    ) -> MigrationReport:
        """Rewrite stored checkpoints older than `schema_chain.current` (of every thread, or of
        `thread_ids`) to the current version: values, channel versions and pending writes.

        Only the chain's own threads are rewritten: those whose newest checkpoint with a chain
        name carries `schema_chain.name`. `include_unstamped=True` adds the threads with no
        name at all (written with no chain, or before chains had names), which are then
        stamped with the name; an unnamed chain needs it. A thread of another chain's name is
        never touched. Skipped threads are counted and listed in the report.

        Each checkpoint is rewritten and logged in one atomic step, at most once per version,
        so a run that was interrupted finishes the job when started again; a second run finds
        nothing to do. `dry_run` reports what would change without writing. `progress` is
        called after each thread with a `MigrationProgress`.

        Raises:
            InvalidConfigError: no `schema_chain`, or an unnamed one without
                `include_unstamped=True`.
        """
        return self._sync(
            self.amigrate_threads(
                thread_ids, dry_run=dry_run, progress=progress, concurrency=concurrency,
                include_unstamped=include_unstamped,
            )
        )

    async def amigrate_threads(
        self,
        thread_ids: Sequence[str] | None = None,
        *,
        dry_run: bool = False,
        progress: Callable[[MigrationProgress], None] | None = None,
        concurrency: int = 4,
        include_unstamped: bool = False,
    ) -> MigrationReport:
        from ..migrations.runner import migrate_threads

        if self.schema_chain is None:
            raise InvalidConfigError(
                "migrate_threads needs the state schema's chain: pass schema_chain=SchemaChain("
                "current, upcasters) to the checkpointer"
            )
        if isinstance(thread_ids, str):
            raise InvalidConfigError("thread_ids is a list of thread ids, not one string")
        if thread_ids is not None:
            thread_ids = check_ids(thread_ids, "thread_id", required=True)
        return await migrate_threads(
            self, self.schema_chain, thread_ids,
            dry_run=dry_run, progress=progress, concurrency=concurrency,
            include_unstamped=include_unstamped,
        )

    def migration_log(self, thread_id: str | None = None) -> builtins.list[MigrationEntry]:
        """The state-schema migrations stored checkpoints went through (of one thread, or of
        all), oldest first: thread, namespace, checkpoint, from and to version, and when."""
        return self._sync(self.amigration_log(thread_id))

    async def amigration_log(self, thread_id: str | None = None) -> builtins.list[MigrationEntry]:
        return await self._store.read_migrations(
            None if thread_id is None else check_id(thread_id, "thread_id", required=True))

    # -- audit trail ------------------------------------------------------------------------

    def verify(self, thread_id: str) -> AuditReport:
        """Check a thread's audit chain against storage: every namespace, oldest first.

        Each checkpoint's hash is recomputed from its stored rows (no cache, no schema upgrade)
        and its `prev` compared with its parent's stored hash. The report lists, oldest first,
        checkpoints altered, whose parent is gone, whose parent was replaced, or without a
        hash (see `langgraph_ckpt_ext.timetravel.audit`). Raises `ThreadNotFoundError` for a
        thread with no checkpoint.
        """
        return self._sync(self.averify(thread_id))

    async def averify(self, thread_id: str) -> AuditReport:
        from ..timetravel.audit import verify_thread

        return await verify_thread(
            self._store, self.serde, check_id(thread_id, "thread_id", required=True))

    def audit_status(self) -> AuditStatus:
        """Whether the store is audited, with its audit log (each time auditing was turned on
        or off, when and why), read from the store now."""
        return self._sync(self.aaudit_status())

    async def aaudit_status(self) -> AuditStatus:
        from ..timetravel.audit import AuditStatus

        log = await self._store.read_audit_log()
        self._audit_on, self._audit_read_at = bool(log) and log[-1].enabled, time.monotonic()
        return AuditStatus(self._audit_on, log)

    def enable_audit(self, *, reason: str = "enable_audit()") -> AuditStatus:
        """Turn auditing on for the store, recorded in it (nothing new if it is on already):
        from then on every checkpointer writing to it seals what it stores, each from its
        next reading of the setting (see `audit_refresh`). `audit=True` does this on open."""
        return self._sync(self.aenable_audit(reason=reason))

    async def aenable_audit(self, *, reason: str = "enable_audit()") -> AuditStatus:
        return await self._switch_audit(True, _reason(reason, "enable_audit"))

    def disable_audit(self, *, reason: str) -> AuditStatus:
        """Turn the store's auditing off: an explicit act, logged as a warning and recorded in
        the store (when, `reason`), where `verify` reports it. Checkpoints stored from then on
        are not sealed; those stored before stay verifiable. Raises `InvalidConfigError`
        without a reason.

        Example:
            >>> checkpointer.disable_audit(reason="bulk re-import, ticket 4711")  # doctest: +SKIP
        """
        return self._sync(self.adisable_audit(reason=reason))

    async def adisable_audit(self, *, reason: str) -> AuditStatus:
        return await self._switch_audit(False, _reason(reason, "disable_audit"))

    async def _switch_audit(self, enabled: bool, reason: str) -> AuditStatus:
        status = await self.aaudit_status()
        if status.enabled == enabled:
            return status
        if not enabled:
            _audit_logger.warning(
                "audit trail turned off for the store of %s: %s; checkpoints stored from now on "
                "are not sealed", type(self).__name__, reason)
        await self._store.log_audit_switch(AuditSwitch(enabled, time.time(), reason))
        return await self.aaudit_status()

    async def _audited(self) -> bool:
        """Whether the store is audited: its setting as read at most `audit_refresh` seconds
        ago, else read now."""
        if self._audit_on is None or time.monotonic() - self._audit_read_at >= self.audit_refresh:
            await self._read_audit()
        return bool(self._audit_on)

    async def _read_audit(self) -> None:
        """Read the store's audit setting; the first reading turns it on if `audit=True` (once:
        an explicit `disable_audit` later is not undone by this checkpointer)."""
        if self._audit_want:
            self._audit_want = False
            await self._switch_audit(
                True, f"audit=True ({type(self).__name__}, pid {os.getpid()})")
            return
        last = await self._store.read_audit_log(last=True)
        self._audit_on, self._audit_read_at = bool(last) and last[-1].enabled, time.monotonic()

    # -- lifecycle --------------------------------------------------------------------------

    def setup(self) -> int:
        """Create or migrate the storage; returns its version. Idempotent, and safe when several
        processes call it at once."""
        return self._sync(self.asetup())

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


@dataclass(slots=True)
class PreparedBatch:
    """Rows of a batch ready to write (`StoreCheckpointer.aprepare_batch`)."""

    items: builtins.list[BatchItem]
    puts: builtins.list[_PreparedPut]
    threads: set[str]
    audited: bool = False
    """Its checkpoint is sealed: its writes are recorded for the child's seal."""

    def rows(self) -> builtins.list[BatchItem]:
        """The rows alone, for another store (`awrite_rows`): plain data that pickles, an
        append-delta without the whole value it could fall back on."""
        return [
            (item[0], [b if b.full is None else
                       BlobRow(b.channel, b.version, b.type, b.data, b.base_version)
                       for b in item[1]])
            if isinstance(item, tuple) else item
            for item in self.items
        ]


@dataclass(frozen=True, slots=True)
class _PreparedPut:
    row: CheckpointRow
    blobs: builtins.list[BlobRow]
    plans: Mapping[str, Plan]
    marks: builtins.list[tuple[str, str, str, str]]
    sealed: Any
    dropped: tuple[str, ...]
    """Channels written without an append plan (not lists): the log forgets their chains."""


def stored_schema_version(metadata: Mapping[str, Any], chain: SchemaChain, checkpoint_id: str) -> int:
    """The state-schema version a checkpoint was stored under (unstamped: the chain's first)."""
    from ..migrations import SchemaVersionError

    version = metadata.get("schema_version", chain.first)
    if not isinstance(version, int) or isinstance(version, bool):
        raise SchemaVersionError(
            f"checkpoint {checkpoint_id!r} has schema_version {version!r} in its metadata, "
            "not an int"
        )
    return version


def _list_query(config: RunnableConfig | None, before: RunnableConfig | None) -> ListQuery:
    """`list`'s query, every id in it checked (no thread id: every thread)."""
    conf = (config or {}).get("configurable") or {}
    return ListQuery(
        thread_id=None if conf.get("thread_id") in (None, "") else thread_id_of(config),
        checkpoint_ns=None if conf.get("checkpoint_ns") is None else checkpoint_ns_of(config),
        checkpoint_id=checkpoint_id_of(config) if config else None,
        before=checkpoint_id_of(before) if before else None,
    )


def _reason(reason: object, call: str) -> str:
    if not isinstance(reason, str) or not reason.strip():
        raise InvalidConfigError(
            f"{call} needs a reason (reason='...'), recorded in the store's audit log; got "
            f"{reason!r}")
    return reason.strip()


def _check_strategy(strategy: str) -> None:
    if strategy not in ("keep_latest", "delete"):
        raise ValueError(f"unknown prune strategy {strategy!r}: use 'keep_latest' or 'delete'")


def _max_version(versions: Iterable[Version]) -> Version | None:
    try:
        return max(versions, default=None)
    except TypeError:  # mixed kinds (never written by us): the floats are ours
        return max((v for v in versions if not isinstance(v, str)), default=None)


def _store_upgraded(
    checkpoint: Checkpoint, new_versions: ChannelVersions
) -> tuple[Checkpoint, dict[str, str]]:
    """The checkpoint as stored (marked versions made plain, also where nodes saw them), and the
    channels holding a value that a schema upgrade changed on read and that this step did not
    write (channel -> version key): LangGraph names only a step's writes in `new_versions`, so
    those values are stored with the first checkpoint that holds them."""
    if not any_upgraded():  # the common case: no scan of every version on every put
        return checkpoint, {}
    versions = checkpoint["channel_versions"]
    seen = checkpoint.get("versions_seen") or {}
    if not any(is_upgraded(v) for v in versions.values()) and not any(
        is_upgraded(v) for node in seen.values() for v in node.values()
    ):
        return checkpoint, {}
    extra = {
        ch: version_key(plain(v))
        for ch, v in versions.items()
        if is_upgraded(v) and ch not in new_versions
    }
    stored = {
        **checkpoint,
        "channel_versions": {ch: plain(v) for ch, v in versions.items()},
        "versions_seen": {
            node: {ch: plain(v) for ch, v in vs.items()} for node, vs in seen.items()
        },
    }
    return cast(Checkpoint, stored), extra
