"""Writing one checkpoint or one task's writes: encoding, append-delta plans, the audit seal,
and values a read-time schema upgrade changed."""

from __future__ import annotations

import builtins
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    get_serializable_checkpoint_metadata,
)

from . import codec
from .appendlog import Plan
from .auditing import Auditing
from .config import make_config, put_ids, write_ids
from .guard import Guard, apply_guard, put_guard, writes_guard
from .rows import BlobRow, CheckpointRow, WriteRow
from .store import BatchItem
from .telemetry import config_thread, count, note, traced, tracing
from .versions import any_upgraded, is_upgraded, plain, version_key


class Writing(Auditing):
    """`aput` and `aput_writes` of `StoreCheckpointer`, and the preparing of a put's rows."""

    @traced("put", config_thread)
    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        row = (await self._put(config, checkpoint, metadata, new_versions)).row
        return make_config(row.thread_id, row.checkpoint_ns, row.checkpoint_id)

    async def _put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
        copy: bool = False,
        portable: bool = False,
    ) -> PreparedPut:
        """`aput`; `copy`: a checkpoint copied from elsewhere (`aput_batch(copy=True)`);
        `portable`: its rows made for any of our stores too (`awrite_op`)."""
        seal = await self._audited()
        put = await self._prepare_put(config, checkpoint, metadata, new_versions, portable,
                                      seal=seal)
        guard = self._apply_guard() if copy else put.guard
        fell_back = await self._store.write_checkpoint(put.row, put.blobs, guard)
        self._stored(put, fell_back)
        if tracing():
            count_items([(put.row, put.blobs)])
            count(delta_channels=sum(b.base_version is not None and b.channel not in fell_back
                                     for b in put.blobs))
            note(namespace_depth=_depth(put.row.checkpoint_ns))
        return put

    async def _prepare_put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
        portable: bool = False,
        *,
        seal: bool = False,
    ) -> PreparedPut:
        """A checkpoint as the rows to store (`seal`: with an audit record), and what to
        remember once they are stored."""
        md = get_serializable_checkpoint_metadata(config, metadata)
        if self._redaction is not None:  # a secret a config carried stays out of storage
            md = cast(CheckpointMetadata, self._redaction.drop(md))
        thread_id, ns, checkpoint_id, parent_id = put_ids(config, checkpoint, md, new_versions)
        self._note_tenant(config, thread_id)
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
        guard = self._put_guard(config, md, parent_id, thread_id)
        return PreparedPut(row, blobs, plans, [k for k, _ in marks], sealed, dropped, guard)

    def _put_guard(self, config: RunnableConfig, md: Mapping[str, Any], parent: str | None,
                   thread_id: str) -> Guard | None:
        """What the store must find for this put (`core.guard`); None: nothing to check."""
        if self.replica_apply:
            return self._apply_guard()
        guard = put_guard(config, md, parent, thread_id, single=self._single,
                          epoch=self.writer_epoch)
        if not guard.checks and self._tombstone_ttl is None:
            return None
        return guard

    def _apply_guard(self) -> Guard | None:
        """A replica's write, or a copy: the writer's epoch alone is checked."""
        return apply_guard(self.writer_epoch)

    def _writes_guard(self, config: RunnableConfig, thread_id: str) -> Guard | None:
        if self.replica_apply:
            return self._apply_guard()
        guard = writes_guard(config, thread_id, epoch=self.writer_epoch)
        if not guard.checks and self._tombstone_ttl is None:
            return None
        return guard

    def _stored(self, put: PreparedPut, fell_back: Collection[str], planned: bool = True) -> None:
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

    @traced("put_writes", config_thread)
    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        await self._put_writes(config, writes, task_id, task_path)

    async def _put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
        copy: bool = False,
    ) -> builtins.list[WriteRow]:
        """`aput_writes` (`copy`: as for `_put`); the rows it stored."""
        rows = self._encode_writes(config, writes, task_id, task_path)
        if not rows:
            return rows
        guard = self._apply_guard() if copy else self._writes_guard(config, rows[0].thread_id)
        if await self._audited():
            with self._auditor.writing(rows):
                await self._store.write_writes(rows, guard)
        else:
            await self._store.write_writes(rows, guard)
        if tracing():
            count_items([rows])
            note(namespace_depth=_depth(rows[0].checkpoint_ns))
        return rows

    async def awrite_op(self, op: tuple[Any, ...]
                        ) -> tuple[RunnableConfig | None, builtins.list[BatchItem]]:
        """Store one op (`("put", ...)` or `("writes", ...)`, as for `aput_batch`) as `aput`
        / `aput_writes` store it, and give back what `aput` returns (None for writes) and the
        rows it stored, for another of our stores (`awrite_rows`): a replicated write is
        encoded once, by the primary."""
        telemetry = self.telemetry
        if not telemetry.on:
            return await self._write_op(op)
        with telemetry.operation(self.db_system, "put" if op[0] == "put" else "put_writes",
                                 config_thread(op[1])):
            return await self._write_op(op)

    async def _write_op(self, op: tuple[Any, ...]
                        ) -> tuple[RunnableConfig | None, builtins.list[BatchItem]]:
        if op[0] == "put":
            put = await self._put(op[1], op[2], op[3], op[4], portable=True)
            row = put.row
            return (make_config(row.thread_id, row.checkpoint_ns, row.checkpoint_id),
                    [(row, portable_blobs(put.blobs))])
        rows = await self._put_writes(op[1], op[2], op[3], op[4] if len(op) > 4 else "")
        return None, [rows] if rows else []

    def write_op(self, op: tuple[Any, ...]
                 ) -> tuple[RunnableConfig | None, builtins.list[BatchItem]]:
        """Sync `awrite_op`."""
        return self.run_sync(self.awrite_op(op))

    def _encode_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> builtins.list[WriteRow]:
        thread_id, ns, checkpoint_id, task = write_ids(config, writes, task_id, task_path)
        self._note_tenant(config, thread_id)
        return codec.encode_writes(
            self.serde, thread_id, ns, checkpoint_id, writes, task, task_path
        )


def _row_bytes(row: CheckpointRow, blobs: Sequence[BlobRow]) -> int:
    return len(row.checkpoint[1]) + len(row.metadata[1]) + sum(len(b.data) for b in blobs)


def count_items(items: Sequence[BatchItem]) -> None:
    """Count the rows and bytes of a batch for the operation traced, if one is."""
    if not tracing():
        return
    rows = size = 0
    for item in items:
        if isinstance(item, tuple):
            rows += 1 + len(item[1])
            size += _row_bytes(*item)
        else:
            rows += len(item)
            size += sum(len(w.data) for w in item)
    count(rows=rows, bytes=size)


def _depth(ns: str) -> int:
    """How deep a checkpoint namespace is: 0 for the root graph, 1 for a subgraph, ...
    (LangGraph joins a nested graph's namespace to its parent's with `|`)."""
    return 0 if not ns else ns.count("|") + 1


def portable_blobs(blobs: Sequence[BlobRow]) -> builtins.list[BlobRow]:
    """Blobs as another store takes them: plain data that pickles, an append-delta without
    the whole value it could fall back on."""
    return [b.portable() for b in blobs]


@dataclass(frozen=True, slots=True)
class PreparedPut:
    row: CheckpointRow
    blobs: builtins.list[BlobRow]
    plans: Mapping[str, Plan]
    marks: builtins.list[tuple[str, str, str, str]]
    sealed: Any
    dropped: tuple[str, ...]
    """Channels written without an append plan (not lists): the log forgets their chains."""
    guard: Guard | None = None
    """What the store must find to take it (`core.guard`)."""


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
