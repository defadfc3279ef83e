"""Pruning and garbage collection: which checkpoints `prune` deletes (keeping what the newest
one's delta channels need), and which blobs no remaining checkpoint reads."""

from __future__ import annotations

import builtins
from collections import defaultdict
from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING

from . import codec
from .base import SaverBase
from .chain import ParentWalk
from .config import check_id, check_ids
from .retention import LifecycleEvent, thread_digest
from .rows import BlobRef, CheckpointRow, ListQuery
from .store import BlobKey
from .telemetry import no_thread, traced


class Pruning(SaverBase):
    """The prune and delete-by-run methods of `StoreCheckpointer`."""

    if TYPE_CHECKING:
        async def _audited(self) -> bool: ...

    @traced("delete_for_runs", no_thread)
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

    @traced("prune", no_thread)
    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Prune threads: `"delete"` removes them; `"keep_latest"` keeps each namespace's newest
        checkpoint, plus the ancestors (and their writes) that its `DeltaChannel`s still need
        to rebuild their values.

        Safe while the threads are being written, from any process: checkpoints stored
        meanwhile are kept, and every checkpoint left reads back whole. Raises
        `StoreBusyError` (that thread unchanged, those before it pruned) when a thread's
        writers keep it longer than the store waits (PostgreSQL: `lock_timeout`, 5 s unless
        the session sets one): retry later. `"delete_all"` is `"delete"` (LangGraph's server
        names it so)."""
        strategy = _check_strategy(strategy)
        events: builtins.list[LifecycleEvent] = []
        for thread_id in check_ids(thread_ids, "thread_id", required=True):
            if strategy == "delete":
                await self._store.delete_thread(thread_id, self._tombstone_ttl is not None)
            else:
                victims = await self._prune_victims(thread_id)
                if victims:
                    events.append(await self._cut(thread_id, victims, "prune"))
            self._log.forget(thread_id)
        if events and await self._audited():  # `verify` tells these cuts from tampering
            await self._store.log_lifecycle(events)

    async def _cut(self, thread_id: str, victims: Collection[tuple[str, str]], reason: str
                   ) -> LifecycleEvent:
        """Delete `victims` of a thread (`delete_checkpoints`, with the blobs only they read);
        the record of that cut, for the store's lifecycle log (kept where it is audited, so
        that `verify` tells the cut from tampering)."""
        await self._store.delete_checkpoints(thread_id, victims, self._plan_gc)
        self._log.forget(thread_id)
        return LifecycleEvent(self._store.clock(), "trim", thread_digest(thread_id),
                              len(victims), reason)

    def prune_plan(
        self, thread_id: str, *, strategy: str = "keep_latest"
    ) -> builtins.list[tuple[str, str]]:
        """The `(checkpoint_ns, checkpoint_id)` of the checkpoints `prune([thread_id],
        strategy=...)` would delete now, newest first; nothing is changed (a dry run)."""
        return self.run_sync(self.aprune_plan(thread_id, strategy=strategy))

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
        return await self._trim_victims(thread_id, 1)

    async def _trim_victims(self, thread_id: str, keep: int) -> builtins.list[tuple[str, str]]:
        """The checkpoints beyond each namespace's newest `keep`, less what a kept one's
        `DeltaChannel`s need to rebuild their values."""
        rows = [r async for r in self._store.iter_checkpoints(ListQuery(thread_id=thread_id))]
        by_ns: dict[str, dict[str, CheckpointRow]] = defaultdict(dict)
        for row in rows:
            by_ns[row.checkpoint_ns][row.checkpoint_id] = row
        victims: builtins.list[tuple[str, str]] = []
        for ns, by_id in by_ns.items():
            if len(by_id) <= keep:
                continue
            kept: set[str] = set()
            for cid in sorted(by_id, reverse=True)[:keep]:
                if cid not in kept:
                    kept |= await self._delta_ancestry(thread_id, ns, by_id, cid)
            victims += [(ns, cid) for cid in by_id if cid not in kept]
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


def _check_strategy(strategy: str) -> str:
    """`strategy`, `"delete_all"` (LangGraph's server's name, from its gRPC `Prune`) read as
    `"delete"`."""
    if strategy == "delete_all":
        return "delete"
    if strategy not in ("keep_latest", "delete"):
        raise ValueError(f"unknown prune strategy {strategy!r}: use 'keep_latest' or 'delete'")
    return strategy
