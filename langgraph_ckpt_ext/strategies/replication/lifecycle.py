"""The data lifecycle of a `ReplicatedCheckpointer`: what its sweeps, erasures, pins and
policies send its replicas, and how a replica applies it (a `"lifecycle"` op, in the
primary's order like every write).

The primary decides (its lifecycle rows, its sweep lock); the replicas follow:

- an expired thread is deleted on the primary, atomically iff unchanged since the pass read
  it, then on every replica as `delete_thread` is (queued in the primary's order; in
  `"quorum"` mode the sweep waits for the quorum's confirmations, as far as it can be met,
  but a conditional delete cannot go to the replicas first);
- a history cut (`keep`, `"keep_latest"`) is sent as what the primary kept: each replica
  deletes the thread's other checkpoints (`keep_only`). Applied in the primary's order, the
  replica then holds what the primary held when it cut, so it loses exactly the checkpoints
  the primary lost (a write to the thread waits while the kept list is read and queued);
- an erasure deletes each thread through the replication path (`delete_thread`), then
  copies the primary's erasure records to the replicas (`verify` on a promoted replica
  still tells an erased thread);
- pins and per-thread policies are written like any write (so they survive a failover);
  the default policy and the clock are set on the replicas of this process too.

A replica that is not one of this package's checkpointers keeps no lifecycle rows: it is
sent the deletions, and nothing else applies to it.
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from typing import Any

from ...core.bridge import run_inline
from ...core.retention import LifecycleEvent, thread_digest
from ...core.rows import ListQuery
from ...core.saver import StoreCheckpointer
from .._lifecycle import LifecycleForwarded, set_on


def apply_lifecycle(saver: Any, args: Sequence[Any]) -> None:
    """A `"lifecycle"` op on a replica (by the worker thread: sync calls)."""
    target = getattr(saver, "lifecycle_target", None)
    if callable(target):  # a replica the replicator process opens on first use
        saver = target()
    name, thread_id, *rest = args
    if name in ("pin", "unpin", "set_thread_retention"):
        if isinstance(saver, StoreCheckpointer | LifecycleForwarded):
            run_inline(set_on(saver, True, name, thread_id, *rest))
    elif isinstance(saver, StoreCheckpointer):  # the others keep no rows nor log
        if name == "keep_only":
            saver.run_sync(keep_only(saver, thread_id, rest[0]))
        elif name == "log":
            saver.run_sync(saver._store.log_lifecycle(rest[0]))
        else:
            raise ValueError(f"unknown lifecycle op {name!r}")


async def kept(saver: StoreCheckpointer, thread_id: str) -> builtins.list[tuple[str, str]]:
    """The thread's checkpoints, as (ns, checkpoint id)."""
    return [(r.checkpoint_ns, r.checkpoint_id)
            async for r in saver._store.iter_checkpoints(ListQuery(thread_id=thread_id))]


async def keep_only(saver: StoreCheckpointer, thread_id: str,
                    keep: Sequence[Sequence[str]]) -> int:
    """Delete the thread's checkpoints not in `keep` (with their writes, and the blobs only
    they read, as a cut of the primary does; recorded in an audited store); how many."""
    wanted = {(ns, cid) for ns, cid in keep}
    victims = [v for v in await kept(saver, thread_id) if v not in wanted]
    if victims:
        cut = await saver._cut(thread_id, victims, "retention")
        if await saver._audited():  # as the primary's sweep: `verify` tells a cut
            await saver._store.log_lifecycle([cut])
    return len(victims)


async def erasure_records(saver: StoreCheckpointer, threads: Sequence[str], at: float
                          ) -> builtins.list[LifecycleEvent]:
    """The records the primary's erasure at `at` logged for `threads`."""
    out: builtins.list[LifecycleEvent] = []
    for tid in threads:
        out += [e for e in await saver._store.read_lifecycle(thread_digest(tid))
                if e.action == "erase" and e.at == at]
    return out


__all__ = ["apply_lifecycle", "erasure_records", "keep_only", "kept"]
