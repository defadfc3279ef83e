"""The primary, and where a call goes while it cannot be reached: to the most up-to-date
replica that is up for a read (failover), to a replica made the primary for a write
(`promote`), or nowhere (`PrimaryUnavailableError`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from langgraph.checkpoint.base import BaseCheckpointSaver

from ...core.bridge import either
from ...core.errors import PrimaryUnavailableError
from .calls import caller_gone, in_thread
from .epochs import as_replica, fence_store, has_epoch, read_epoch, write_with
from .failures import classifier, describe
from .fanout import Fanout, View

T = TypeVar("T")
Saver = BaseCheckpointSaver[Any]


class Failover:
    def __init__(self, primary: Saver, fanout: Fanout) -> None:
        self.primary = primary
        self.fanout, self.options = fanout, fanout.options
        self.down_until = 0.0
        self.error: BaseException | None = None
        self.epoch: int | None = None
        """The epoch this node writes with (`epochs.py`); None until read."""

    @property
    def down(self) -> bool:
        return time.monotonic() < self.down_until

    async def call(self, sync: bool, call: Callable[[Saver], Awaitable[T]],
                   write: bool = False) -> T:
        """`call` on the primary, or where it goes while the primary is down. `call` picks
        the saver's sync or async method by `sync` (`core.bridge.either`)."""
        primary = self.primary
        loop = None if sync else asyncio.get_running_loop()
        if self.down:
            return await call(self.fallback(write, self.error, primary))
        try:
            return await call(primary)
        except BaseException as exc:
            if (loop is not None and caller_gone(loop)) or not classifier(primary)(exc) or not (
                    self.fanout.views and (self.options.failover_reads or write)):
                raise
            self._down(exc, primary)
            return await call(self.fallback(write, exc, primary))

    async def learn_epoch(self, sync: bool) -> None:
        """Before the first write: the primary's epoch, which this node's writes (to the
        primary, and the applies to its replicas) carry from then on. Unreachable: the next
        write tries again (the write itself fails over as it would)."""
        primary = self.primary
        if self.epoch is not None or not has_epoch(primary):
            return
        try:
            epoch = await either(sync, read_epoch, in_thread(read_epoch), primary)
        except Exception as exc:
            if classifier(primary)(exc):
                return
            raise
        with self.fanout.lock:
            if self.epoch is None and self.primary is primary and epoch is not None:
                self.epoch = epoch
                write_with([primary, *(r.local_saver for r in self.fanout.views)], epoch)

    def _down(self, exc: BaseException, failed: Saver) -> None:
        with self.fanout.lock:  # atomic with a promotion (which clears this)
            if self.primary is failed:  # not a primary a concurrent call has since replaced
                self.down_until = time.monotonic() + self.options.retry_primary_after
                self.error = exc

    def known_down(self) -> None:
        """A quorum write while the primary is known to be down (and no replica may take its
        place): refused before any replica is touched."""
        if not self.options.promote and self.down:
            self.fallback(True, self.error, self.primary)  # raises

    def fallback(self, write: bool, cause: BaseException | None, failed: Saver) -> Saver:
        """Where a call goes while the primary (`failed`) is down: a replica for reads
        (failover), or, for writes, a promoted replica; else `PrimaryUnavailableError`."""
        if self.primary is not failed:  # a concurrent call has promoted a replica meanwhile
            return self.primary
        why = describe(cause) if cause is not None else "down"
        if write and not self.options.promote:
            raise PrimaryUnavailableError(
                f"the primary is unreachable ({why}): writes are refused so that the replicas "
                "do not diverge from it. Retry once it is back, or pass promote=True to make a "
                "replica the primary") from cause
        if not write and not self.options.failover_reads:
            raise PrimaryUnavailableError(
                f"the primary is unreachable ({why}) and failover_reads is off") from cause
        best = self.fanout.best()
        if best is None:
            raise PrimaryUnavailableError(
                f"the primary is unreachable ({why}) and no replica is up") from cause
        if write:
            self._promote(best, failed)
            return self.primary
        return best.saver

    def _promote(self, replica: View, failed: Saver) -> None:
        """Make `replica` the primary in place of `failed`: what is queued for it is applied
        first; the old primary becomes a replica under the same name, marked for a full
        repair."""
        views = self.fanout.views
        with self.fanout.lock:
            if self.primary is not failed:  # promoted by a concurrent call meanwhile
                return
            deadline = time.monotonic() + self.options.max_wait
            with replica.cond:
                while not replica.drained() and replica.up and time.monotonic() < deadline:
                    replica.cond.wait(0.05)
            replica.stop()
            old = self.primary
            # A newer epoch: on the promoted store now, on the demoted one once it answers
            # (`Replica.fence`), so that writers still going through it are fenced off.
            # (the old primary cannot be asked: it is down; its epoch is known, or it is 0)
            known = [e for e in (self.epoch, read_epoch(replica.saver)) if e is not None]
            epoch = max(known, default=0) + 1
            fence_store(replica.saver, epoch)
            as_replica(replica.saver, False)
            self.epoch = epoch
            write_with([old, *(r.local_saver for r in views)], epoch)
            # The old primary's down window goes first: a call that sees the new primary must
            # not see that window (it would promote another replica in its place).
            self.down_until = 0.0
            self.error = None
            self.primary = replica.saver
            demoted = self.fanout.replica(replica.name, old)
            demoted.up = False
            demoted.repair_all = True
            demoted.fence = epoch
            views[views.index(replica)] = demoted
            demoted.start()  # probes the old primary until it answers
