"""`history` and `inspect`: a thread's checkpoints, lazily and a page at a time, and the whole
state at one of them."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver, CheckpointTuple, PendingWrite

from ..core.config import check_id
from ..core.filters import matches, validate_filter
from ..core.graph import ERROR, INTERRUPT, next_nodes, user_values
from ..core.rows import ListQuery
from ..core.saver import StoreCheckpointer
from ._base import ids_of, must_get, run_sync, sync_view, thread_config


@dataclass(frozen=True)
class HistoryEntry:
    """One checkpoint of a thread, as `history` lists it."""

    config: RunnableConfig
    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str
    parent_checkpoint_id: str | None
    metadata: Mapping[str, Any]
    created_at: datetime | None
    next: tuple[str, ...] | None
    """Nodes this checkpoint triggers (what runs when the thread goes on from here); None when
    listed with `metadata_only=True` (it depends on the values)."""
    values: dict[str, Any] | None = None
    """The state's channel values (None when listed with `metadata_only=True`)."""
    pending_writes: list[PendingWrite] | None = None

    @property
    def step(self) -> int | None:
        step = self.metadata.get("step")
        return step if isinstance(step, int) else None

    @property
    def source(self) -> str | None:
        source = self.metadata.get("source")
        return source if isinstance(source, str) else None


@dataclass(frozen=True)
class HistoryPage:
    """One page of `history_page`; `before` gives the next one (None: this was the last)."""

    entries: list[HistoryEntry]
    before: RunnableConfig | None = field(default=None)


@dataclass(frozen=True)
class Inspection:
    """The state at one checkpoint, after any state-schema upgrade."""

    config: RunnableConfig
    parent_config: RunnableConfig | None
    values: dict[str, Any]
    metadata: Mapping[str, Any]
    created_at: datetime | None
    next: tuple[str, ...]
    pending_writes: list[PendingWrite]
    interrupts: tuple[Any, ...]
    """Values passed to `interrupt()` by the tasks paused at this checkpoint."""

    @property
    def status(self) -> str:
        """Where the thread stands at this checkpoint: `"awaiting_human"` (a task is paused at
        `interrupt()`), `"error"` (a task failed), `"done"` (no node left to run) or
        `"running"` (nodes are due: the thread goes on from here when invoked)."""
        channels = {channel for _, channel, _ in self.pending_writes}
        if INTERRUPT in channels:
            return "awaiting_human"
        if ERROR in channels:
            return "error"
        return "running" if self.next else "done"


def _created(ts: Any) -> datetime | None:
    try:
        return datetime.fromisoformat(str(ts)) if ts else None
    except ValueError:
        return None


def _entry(tup: CheckpointTuple, metadata_only: bool) -> HistoryEntry:
    thread_id, ns, checkpoint_id = ids_of(tup.config)
    parent = tup.parent_config["configurable"].get("checkpoint_id") if tup.parent_config else None
    cp = tup.checkpoint
    return HistoryEntry(
        config=tup.config,
        thread_id=thread_id,
        checkpoint_ns=ns,
        checkpoint_id=str(checkpoint_id or cp["id"]),
        parent_checkpoint_id=parent,
        metadata=dict(tup.metadata or {}),
        created_at=_created(cp.get("ts")),
        next=None if metadata_only else next_nodes(cp),
        values=None if metadata_only else user_values(cp.get("channel_values") or {}),
        pending_writes=None if metadata_only else list(tup.pending_writes or []),
    )


async def _rows(
    saver: BaseCheckpointSaver[Any],
    thread_id: str,
    ns: str | None,
    before: str | None,
    flt: Mapping[str, Any] | None,
    metadata_only: bool,
    limit: int | None,
) -> AsyncIterator[HistoryEntry]:
    if metadata_only and isinstance(saver, StoreCheckpointer):
        # Rows only: headers and metadata, no channel value read at all (the ids checked
        # here, as the saver's own methods would).
        stored = saver.stored
        rows = stored.iter(ListQuery(
            thread_id=check_id(thread_id, "thread_id", required=True),
            checkpoint_ns=None if ns is None else check_id(ns, "checkpoint_ns"),
            before=None if before is None else check_id(before, "checkpoint_id"),
            replica=True,
        ))
        try:
            async for row in rows:
                md = stored.metadata(row)
                if flt and not matches(md, flt):
                    continue
                header = stored.header(row)
                parent = row.parent_checkpoint_id

                yield HistoryEntry(
                    config=thread_config(row.thread_id, row.checkpoint_ns, row.checkpoint_id),
                    thread_id=row.thread_id,
                    checkpoint_ns=row.checkpoint_ns,
                    checkpoint_id=row.checkpoint_id,
                    parent_checkpoint_id=parent,
                    metadata=md,
                    created_at=_created(header.get("ts")),
                    next=None,
                )
        finally:
            await rows.aclose()  # type: ignore[attr-defined]
        return
    conf: dict[str, Any] = {"thread_id": thread_id}
    if ns is not None:
        conf["checkpoint_ns"] = ns
    before_conf = None if before is None else thread_config(thread_id, "", before)
    # The limit goes down to the saver: it decodes no more rows than are asked for.
    async for tup in saver.alist({"configurable": conf}, filter=dict(flt) if flt else None,
                                 before=before_conf, limit=limit):
        yield _entry(tup, metadata_only)


async def ahistory(
    saver: BaseCheckpointSaver[Any],
    thread_id: str,
    *,
    metadata_only: bool = False,
    filter: Mapping[str, Any] | None = None,
    subgraphs: bool = False,
    before: RunnableConfig | str | None = None,
    limit: int | None = None,
    checkpoint_ns: str | None = None,
) -> AsyncIterator[HistoryEntry]:
    """A thread's checkpoints, newest first, read lazily (a page of rows at a time; values
    are decoded only for the entries reached).

    Args:
        metadata_only: list ids, metadata, times and next nodes without reading any value.
        filter: metadata equality filter, e.g. `{"source": "loop"}`.
        subgraphs: include the checkpoints of subgraphs (every namespace), not only the root.
        before: start after this checkpoint (a config or a checkpoint id).
        limit: at most this many entries.
        checkpoint_ns: only this namespace (a subgraph's, such as `"child:<task id>"`);
            overrides `subgraphs`.
    """
    flt = validate_filter(dict(filter) if filter else None)
    if limit is not None and limit <= 0:
        return
    cursor = before if before is None or isinstance(before, str) else ids_of(before)[2]
    n = 0
    ns = checkpoint_ns if checkpoint_ns is not None else None if subgraphs else ""
    async for entry in _rows(saver, str(thread_id), ns, cursor, flt, metadata_only, limit):
        yield entry
        n += 1
        if limit is not None and n >= limit:
            return


def history(
    saver: BaseCheckpointSaver[Any],
    thread_id: str,
    *,
    metadata_only: bool = False,
    filter: Mapping[str, Any] | None = None,
    subgraphs: bool = False,
    before: RunnableConfig | str | None = None,
    limit: int | None = None,
    checkpoint_ns: str | None = None,
) -> Iterator[HistoryEntry]:
    """Sync twin of `ahistory`: an iterator that reads a page at a time as it is consumed."""
    page_size = 32
    cursor = before
    left = limit
    saver = sync_view(saver)
    while left is None or left > 0:
        size = page_size if left is None else min(page_size, left)
        entries = run_sync(saver, _collect(ahistory(
            saver, thread_id, metadata_only=metadata_only, filter=filter, subgraphs=subgraphs,
            before=cursor, limit=size, checkpoint_ns=checkpoint_ns,
        )))
        yield from entries
        if left is not None:
            left -= len(entries)
        if len(entries) < size:
            return
        cursor = entries[-1].config


async def _collect(entries: AsyncIterator[HistoryEntry]) -> list[HistoryEntry]:
    return [e async for e in entries]


async def ahistory_page(
    saver: BaseCheckpointSaver[Any],
    thread_id: str,
    *,
    size: int = 20,
    metadata_only: bool = False,
    filter: Mapping[str, Any] | None = None,
    subgraphs: bool = False,
    before: RunnableConfig | str | None = None,
) -> HistoryPage:
    """One page of a thread's history; pass the page's `before` to get the next one."""
    entries = [e async for e in ahistory(
        saver, thread_id, metadata_only=metadata_only, filter=filter, subgraphs=subgraphs,
        before=before, limit=size + 1,
    )]
    more = len(entries) > size
    entries = entries[:size]
    return HistoryPage(entries, entries[-1].config if more and entries else None)


def history_page(
    saver: BaseCheckpointSaver[Any],
    thread_id: str,
    *,
    size: int = 20,
    metadata_only: bool = False,
    filter: Mapping[str, Any] | None = None,
    subgraphs: bool = False,
    before: RunnableConfig | str | None = None,
) -> HistoryPage:
    saver = sync_view(saver)
    return run_sync(saver, ahistory_page(
        saver, thread_id, size=size, metadata_only=metadata_only, filter=filter,
        subgraphs=subgraphs, before=before,
    ))


async def ainspect(saver: BaseCheckpointSaver[Any], config: RunnableConfig) -> Inspection:
    """The state at the checkpoint `config` names (the thread's latest without a checkpoint
    id): values after any state-schema upgrade, metadata, pending writes, next nodes and the
    values of pending interrupts."""
    tup = await must_get(saver, config)
    cp = tup.checkpoint
    writes = list(tup.pending_writes or [])
    interrupts = tuple(
        getattr(i, "value", i)
        for _, channel, value in writes if channel == INTERRUPT
        for i in (value if isinstance(value, (list, tuple)) else [value])
    )
    return Inspection(
        config=tup.config,
        parent_config=tup.parent_config,
        values=user_values(cp.get("channel_values") or {}),
        metadata=dict(tup.metadata or {}),
        created_at=_created(cp.get("ts")),
        next=next_nodes(cp),
        pending_writes=writes,
        interrupts=interrupts,
    )


def inspect(saver: BaseCheckpointSaver[Any], config: RunnableConfig) -> Inspection:
    saver = sync_view(saver)
    return run_sync(saver, ainspect(saver, config))
