"""Batches: puts and writes stored as one (`aput_batch`), or prepared as rows first and written
later, or by another of our stores (the wrappers' protocols in `inner.py`)."""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from .base import SaverBase
from .guard import Guard, apply_guard
from .store import BatchItem
from .telemetry import batch_thread, rows_thread, traced
from .writing import PreparedPut, Writing, count_items, portable_blobs


class Batches(Writing):
    """The batch methods of `StoreCheckpointer`."""

    @traced("put_batch", batch_thread)
    async def aput_batch(self, ops: Sequence[tuple[Any, ...]], *, copy: bool = False) -> None:
        """Store checkpoints and writes in order, in one batch (one transaction or round trip
        where the backend allows). Each op is `("put", config, checkpoint, metadata,
        new_versions)` or `("writes", config, writes, task_id, task_path)`, as the arguments of
        `aput` / `aput_writes`. Used by `SmartCheckpointer` to flush a thread.

        `copy`: the ops copy a history decided elsewhere (an import, a copy between stores, a
        repair), forks included: written as they are, with no one-writer check (`core.guard`)
        but the epoch."""
        prepared = await self.aprepare_batch(ops)
        if prepared is None:  # audited: each hash chains on the one stored before it
            for op in ops:
                if op[0] == "put":
                    await self._put(op[1], op[2], op[3], op[4], copy=copy)
                else:
                    await self._put_writes(op[1], op[2], op[3], op[4] if len(op) > 4 else "",
                                           copy=copy)
            return
        if copy:
            prepared.guards = [self._apply_guard()] * len(prepared.items)
        await self.awrite_prepared([prepared])

    def put_batch(self, ops: Sequence[tuple[Any, ...]], *, copy: bool = False) -> None:
        """Sync `aput_batch`."""
        self.run_sync(self.aput_batch(ops, copy=copy))

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
        batch = PreparedBatch([], [], set(), audited, [])
        try:
            for op in ops:
                if op[0] == "put":
                    _, config, checkpoint, metadata, new_versions = op
                    put = await self._prepare_put(
                        config, checkpoint, metadata, new_versions, portable, seal=audited)
                    batch.items.append((put.row, put.blobs))
                    batch.guards.append(put.guard)
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
                        batch.guards.append(self._writes_guard(op[1], rows[0].thread_id))
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
        return self.run_sync(self.aprepare_batch(ops, portable=portable))

    async def awrite_prepared(self, batches: Sequence[PreparedBatch]) -> None:
        """Write prepared batches, in order, as one batch (one transaction or round trip where
        the backend allows). Every row is an upsert, so a batch written twice (here and by a
        write of its own still out) stores the same rows."""
        items = [item for b in batches for item in b.items]
        guards = [g for b in batches for g in b.guards]
        # An audited batch's writes, as `aput_writes` stores them (a child's seal covers them).
        writes = [w for b in batches if b.audited for i in b.items if isinstance(i, list) for w in i]
        try:
            with self._auditor.writing(writes):
                fell_back = await self._write_items(items, guards)
        except BaseException:
            for thread_id in {t for b in batches for t in b.threads}:
                self._log.forget(thread_id)
            raise
        puts = [put for b in batches for put in b.puts]
        for put, fell in zip(puts, fell_back, strict=True):
            self._stored(put, fell, planned=False)

    async def _write_items(self, items: Sequence[BatchItem], guards: Sequence[Guard | None]
                           ) -> list[set[str]]:
        if not items:
            return []
        fell_back = await self._store.write_batch(
            items, guards if any(g is not None for g in guards) else None)
        count_items(items)
        return fell_back

    def write_prepared(self, batches: Sequence[PreparedBatch]) -> None:
        """Sync `awrite_prepared`."""
        self.run_sync(self.awrite_prepared(batches))

    @traced("write_rows", rows_thread)
    async def awrite_rows(self, items: Sequence[BatchItem], *, epoch: int | None = None
                          ) -> None:
        """Store rows another checkpointer made (`PreparedBatch.rows()`), as one batch: a
        replica of ours takes the primary's rows instead of encoding every value again. The
        serializers must be alike (`rows_compatible`). An append-delta whose base is not here
        raises `MissingBaseError` and nothing is written: the thread needs a repair.
        `epoch`: the writer's epoch, refused (`FencedError`) where this store's is newer;
        nothing else is checked (the writer's own store decided)."""
        if items:
            guard = apply_guard(epoch)
            await self._store.write_batch(items, None if guard is None else [guard] * len(items))
            count_items(items)

    def write_rows(self, items: Sequence[BatchItem], *, epoch: int | None = None) -> None:
        """Sync `awrite_rows`."""
        self.run_sync(self.awrite_rows(items, epoch=epoch))

    def rows_compatible(self, other: BaseCheckpointSaver[Any]) -> bool:
        """Whether rows this checkpointer makes can be stored by `other` as they are: both
        ours, with LangGraph's own serializer (an encrypting one, say, would differ), and
        neither store known to be audited (an audited store seals each row as stored), as
        last read: this reads nothing, so an unreachable store can be asked.
        """
        return (
            isinstance(other, SaverBase)
            and type(self.serde) is JsonPlusSerializer
            and type(other.serde) is JsonPlusSerializer
            and not (self._audit_want or self._audit_on)
            and not (other._audit_want or other._audit_on)
        )


@dataclass(slots=True)
class PreparedBatch:
    """Rows of a batch ready to write (`StoreCheckpointer.aprepare_batch`)."""

    items: builtins.list[BatchItem]
    puts: builtins.list[PreparedPut]
    threads: set[str]
    audited: bool = False
    """Its checkpoint is sealed: its writes are recorded for the child's seal."""
    guards: builtins.list[Guard | None] = field(default_factory=builtins.list)
    """What the store must find for each item (`core.guard`), in item order."""

    def rows(self) -> builtins.list[BatchItem]:
        """The rows alone, for another store (`awrite_rows`): plain data that pickles, an
        append-delta without the whole value it could fall back on."""
        return [(item[0], portable_blobs(item[1])) if isinstance(item, tuple) else item
                for item in self.items]
