"""Reads through the buffer: buffered checkpoints served as if stored, and the buffered writes
of a stored checkpoint merged into what the inner checkpointer returns (`read_tuple`,
`listing`: one coroutine each for the sync and the async read). Apart from the inner
checkpointer's read, pure functions of a snapshot of the buffer (`Buffer.snapshot`)."""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import AsyncGenerator, Callable
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    CheckpointTuple,
    get_serializable_checkpoint_metadata,
)

from ...core import codec
from ...core.bridge import either
from ...core.config import checkpoint_id_of, checkpoint_ns_of, make_config, thread_id_of
from ...core.filters import matches, validate_filter
from ...core.guard import note_read, read_head
from .._forward import either_each
from .items import Item, Put, Writes, decoded_checkpoint

Snapshot = Callable[[str | None], list[Item]]
"""The buffered items of a thread (None: of all), as `Buffer.snapshot` takes them."""


async def read_tuple(inner: BaseCheckpointSaver[Any], snapshot: Snapshot,
                     config: RunnableConfig, sync: bool, single: bool = False
                     ) -> CheckpointTuple | None:
    """`get_tuple`: from the buffer, else the inner checkpointer's with the buffered writes.
    `single`: the namespace's head as buffer and store together show it is noted as read
    (`core.guard.note_read`), as the inner checkpointer notes what it reads."""
    items = snapshot(thread_id_of(config))
    tup, answered = buffered_tuple(config, items)
    if not answered:
        tup = merge(await either(sync, inner.get_tuple, inner.aget_tuple, config), items)
    if single:
        note_buffered_head(thread_id_of(config), checkpoint_ns_of(config), items)
    return tup


def note_buffered_head(thread_id: str, ns: str, items: list[Item]) -> None:
    """The namespace's head as read: the newest checkpoint buffered, if newer than the head
    the inner checkpointer noted (what is buffered goes on top of it)."""
    head = max((p.checkpoint_id for p in items if isinstance(p, Put) and p.ns == ns),
               default=None)
    stored = read_head(thread_id, ns)
    if head is not None and (stored is None or head > stored):
        note_read(thread_id, ns, head)


async def listing(
    inner: BaseCheckpointSaver[Any], snapshot: Snapshot, config: RunnableConfig | None,
    filter: dict[str, Any] | None, before: RunnableConfig | None, limit: int | None,
    sync: bool, single: bool = False,
) -> AsyncGenerator[CheckpointTuple, None]:
    """`list`: buffered checkpoints merged into the inner checkpointer's listing, newest
    first. `single`: a listing of one namespace notes its head as `read_tuple` does."""
    flt = validate_filter(filter)
    conf = (config or {}).get("configurable") or {}
    thread_id = conf.get("thread_id") or None
    items = snapshot(None if thread_id is None else str(thread_id))

    def note() -> None:  # after the inner listing noted the stored head, if it did
        if single and thread_id is not None and conf.get("checkpoint_ns") is not None:
            note_buffered_head(str(thread_id), str(conf["checkpoint_ns"]), items)

    merged = Merge(buffered_list(config, flt, before, items), items, limit)
    note()
    if merged.full():
        return
    stored = either_each(sync, inner.list, inner.alist, config, filter=filter, before=before,
                         limit=limit)
    first = True
    async with contextlib.aclosing(stored):
        async for tup in stored:
            if first:
                note()
                first = False
            for out in merged.feed(tup):
                yield out
            if merged.full():
                return
    note()
    for out in merged.rest():
        yield out


def tuple_of(put: Put, items: list[Item]) -> CheckpointTuple:
    """A buffered checkpoint as a stored one reads, with its buffered writes."""
    return CheckpointTuple(
        config=make_config(put.thread_id, put.ns, put.checkpoint_id),
        checkpoint=decoded_checkpoint(put.checkpoint),
        metadata=get_serializable_checkpoint_metadata(put.config, put.metadata),
        parent_config=(make_config(put.thread_id, put.ns, put.parent_id)
                       if put.parent_id else None),
        pending_writes=_writes_for(items, put.ns, put.checkpoint_id),
    )


def merge(tup: CheckpointTuple | None, items: list[Item]) -> CheckpointTuple | None:
    """A stored checkpoint with the writes of it still buffered."""
    if tup is None or not items:
        return tup
    conf = tup.config["configurable"]
    extra = _writes_for(items, conf.get("checkpoint_ns", ""), conf["checkpoint_id"])
    if not extra:
        return tup
    # a special write (an interrupt, a task's answers, an error) buffered since replaces
    # the stored one of its task in place, as the store does when the buffer is written
    newer = {(w[0], w[1]): w for w in extra if WRITES_IDX_MAP.get(w[1], 0) < 0}
    stored = [newer.get((w[0], w[1]), w) for w in tup.pending_writes or ()]
    have = {(t, c) for t, c, _ in stored}
    merged = stored + [w for w in extra if (w[0], w[1]) not in have]
    return tup._replace(pending_writes=merged)


def buffered_tuple(
    config: RunnableConfig, items: list[Item]
) -> tuple[CheckpointTuple | None, bool]:
    """(the tuple `get_tuple` serves from the thread's buffered items, whether the buffer
    answered: else the inner checkpointer is asked)."""
    ns, checkpoint_id = checkpoint_ns_of(config), checkpoint_id_of(config)
    found = [i for i in items if isinstance(i, Put) and i.ns == ns]
    if checkpoint_id is not None:
        for p in found:
            if p.checkpoint_id == checkpoint_id:
                return tuple_of(p, items), True
        return None, False
    if found:
        return tuple_of(max(found, key=lambda p: p.checkpoint_id), items), True
    return None, False


def buffered_list(
    config: RunnableConfig | None, flt: dict[str, Any] | None, before: RunnableConfig | None,
    items: list[Item],
) -> list[CheckpointTuple]:
    """The buffered checkpoints a `list` call selects, newest first."""
    conf = (config or {}).get("configurable") or {}
    ns = conf.get("checkpoint_ns")
    checkpoint_id = conf.get("checkpoint_id")
    before_id = checkpoint_id_of(before) if before else None
    found = []
    for p in items:
        if not isinstance(p, Put):
            continue
        if ns is not None and p.ns != ns:
            continue
        if checkpoint_id is not None and p.checkpoint_id != checkpoint_id:
            continue
        if before_id is not None and not p.checkpoint_id < before_id:
            continue
        tup = tuple_of(p, items)
        if flt and not matches(tup.metadata, flt):
            continue
        found.append(tup)
    found.sort(key=_order, reverse=True)
    return found


def _writes_for(items: list[Item], ns: str, checkpoint_id: str) -> list[tuple[str, str, Any]]:
    """Buffered writes of one checkpoint, as stored: a task's write at an index >= 0 is kept
    once (the first), a special one (index < 0) replaced by the last."""
    rows: dict[tuple[str, int], tuple[str, str, str, Any]] = {}
    for item in items:
        if isinstance(item, Writes) and item.ns == ns and item.checkpoint_id == checkpoint_id:
            for i, (channel, value) in enumerate(item.writes):
                idx = WRITES_IDX_MAP.get(channel, i)
                key = (item.task_id, idx)
                if idx >= 0 and key in rows:
                    continue
                rows[key] = (item.task_path, item.task_id, channel, value)
    # in the order LangGraph applies them: task path, task id, index; decoded afresh
    order = sorted(rows, key=lambda k: (rows[k][0], k[0], k[1]))
    return [(rows[k][1], rows[k][2], codec.decoded(rows[k][3])) for k in order]


def _order(tup: CheckpointTuple) -> tuple[str, str, str]:
    """A listing's order (newest first when reversed); also a checkpoint's identity."""
    c = tup.config["configurable"]
    return (str(c["checkpoint_id"]), str(c.get("checkpoint_ns", "")), str(c["thread_id"]))


class Merge:
    """Buffered tuples merged into the inner checkpointer's listing, newest first, without
    repeats (a checkpoint being written can be in both), up to `limit`."""

    def __init__(self, buffered: list[CheckpointTuple], items: list[Item],
                 limit: int | None) -> None:
        self.queue = deque(buffered)
        self.seen = {_order(t) for t in buffered}
        self.items, self.left = items, limit

    def full(self) -> bool:
        return self.left is not None and self.left <= 0

    def _take(self, tup: CheckpointTuple | None) -> list[CheckpointTuple]:
        if self.full() or tup is None:
            return []
        if self.left is not None:
            self.left -= 1
        return [tup]

    def feed(self, tup: CheckpointTuple) -> list[CheckpointTuple]:
        """What to yield, in order, up to and with one tuple of the inner listing."""
        out: list[CheckpointTuple] = []
        while self.queue and _order(self.queue[0]) > _order(tup) and not self.full():
            out += self._take(self.queue.popleft())
        if _order(tup) not in self.seen:
            out += self._take(merge(tup, self.items))
        return out

    def rest(self) -> list[CheckpointTuple]:
        """What to yield once the inner listing ended."""
        out: list[CheckpointTuple] = []
        while self.queue and not self.full():
            out += self._take(self.queue.popleft())
        return out
