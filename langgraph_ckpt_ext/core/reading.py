"""Reading: one checkpoint, a listing, rows decoded a page at a time, and the delta-channel
walk; a schema upgrade is applied to what is read (`upgrade.py`)."""

from __future__ import annotations

import builtins
from collections import defaultdict
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import replace
from typing import Any, cast

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    DeltaChannelHistory,
    PendingWrite,
)

from . import codec
from .base import PAGE, SaverBase
from .chain import ParentWalk
from .config import check_ids, checkpoint_id_of, checkpoint_ns_of, make_config, thread_id_of
from .filters import matches, validate_filter
from .guard import note_read
from .rows import CheckpointRow, ListQuery, WriteRow
from .telemetry import config_thread
from .upgrade import upgrade_read


class Reading(SaverBase):
    """The read methods of `StoreCheckpointer`."""

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        thread_id, ns = thread_id_of(config), checkpoint_ns_of(config)
        headers: dict[str, dict[str, Any]] = {}
        to_read: dict[str, str] = {}

        # Every value comes from the stored rows, in every process (see `_tuple`).
        def wanted(row: CheckpointRow) -> builtins.list[tuple[str, str]]:
            headers[row.checkpoint_id] = header = self._header(row)
            to_read.update(codec.blob_keys(header["channel_versions"]))
            return builtins.list(to_read.items())

        asked = checkpoint_id_of(config)
        found = await self._store.read_tuple(thread_id, ns, asked, wanted)
        if found is None:
            if asked is None and self._single:
                note_read(thread_id, ns, None)  # found empty: no head to keep to
            return None
        row, blobs, writes = found
        tup = self._tuple(row, headers[row.checkpoint_id], blobs, to_read, writes)
        if not self._single:
            return tup
        # The head as read, for every put of the run this read starts (`core.guard`).
        head: str | None = row.checkpoint_id
        if asked is not None:
            newest = await self._store.read_checkpoint(thread_id, ns, None)
            head = None if newest is None else newest.checkpoint_id
        note_read(thread_id, ns, head)
        return tup

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
            return upgrade_read(tup, self.schema_chain)
        return tup

    def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        return self._listing(config, filter, before, limit)

    def _listing(self, config: RunnableConfig | None, filter: dict[str, Any] | None,
                 before: RunnableConfig | None, limit: int | None,
                 notes: dict[tuple[str, str], str | None] | None = None
                 ) -> AsyncIterator[CheckpointTuple]:
        """`alist`; the head of the namespace it lists is also noted in `notes`."""
        items = self._alist(config, filter, before, limit, notes)
        if not self.telemetry.on:
            return items
        return self.telemetry.listing(
            self.db_system, None if config is None else config_thread(config), items)

    async def _alist(self, config: RunnableConfig | None, filter: dict[str, Any] | None,
                     before: RunnableConfig | None, limit: int | None,
                     notes: dict[tuple[str, str], str | None] | None
                     ) -> AsyncIterator[CheckpointTuple]:
        """`alist`, untraced."""
        flt = validate_filter(filter)
        if limit is not None and limit <= 0:
            return
        query = list_query(config, before)
        # A listing of one namespace is a read of it (LangGraph replays a subgraph from the
        # checkpoint it lists): its head is noted as `get_tuple` notes it (`core.guard`).
        head_of = ((query.thread_id, query.checkpoint_ns) if self._single
                   and query.thread_id is not None and query.checkpoint_ns is not None
                   and query.checkpoint_id is None else None)
        if head_of is not None and (query.before is not None or flt):
            newest = await self._store.read_checkpoint(*head_of, None)
            note_read(*head_of, None if newest is None else newest.checkpoint_id, notes)
            head_of = None
        left = limit
        page: builtins.list[CheckpointRow] = []
        metadata: dict[int, CheckpointMetadata] = {}  # decoded for the filter: reused
        rows = self._store.iter_checkpoints(replace(query, replica=True))
        try:
            async for row in rows:
                if head_of is not None:  # newest first: the head
                    note_read(*head_of, row.checkpoint_id, notes)
                    head_of = None
                if flt:
                    md = self._metadata(row)
                    if not matches(md, flt):
                        continue
                    metadata[len(page)] = md
                page.append(row)
                if left is not None:
                    left -= 1
                if len(page) >= PAGE or left == 0:
                    for tup in await self._load(page, metadata):
                        yield tup
                    page, metadata = [], {}
                    if left == 0:
                        return
            if head_of is not None:
                note_read(*head_of, None, notes)  # found empty
            for tup in await self._load(page, metadata):
                yield tup
        finally:
            await rows.aclose()  # type: ignore[attr-defined]

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
            batch = await self._store.read_ancestors(thread_id, ns, cursor, PAGE)
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


def list_query(config: RunnableConfig | None, before: RunnableConfig | None) -> ListQuery:
    """`list`'s query, every id in it checked (no thread id: every thread)."""
    conf = (config or {}).get("configurable") or {}
    return ListQuery(
        thread_id=None if conf.get("thread_id") in (None, "") else thread_id_of(config),
        checkpoint_ns=None if conf.get("checkpoint_ns") is None else checkpoint_ns_of(config),
        checkpoint_id=checkpoint_id_of(config) if config else None,
        before=checkpoint_id_of(before) if before else None,
    )
