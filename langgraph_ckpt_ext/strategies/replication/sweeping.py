"""The data lifecycle of `ReplicatedCheckpointer` (`sweep`, `erase`, `pin`, ...): the
primary's passes, with the hooks that make the replicas follow (see `lifecycle.py`)."""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from typing import Any

from langgraph.checkpoint.base import BaseCheckpointSaver

from ...core.bridge import either
from ...core.config import check_id
from ...core.errors import ReplicationError
from ...core.retention import ErasureReport, SweepReport
from ...core.saver import StoreCheckpointer
from .._forward import store_method
from .._lifecycle import (
    DeleteWrap,
    Expire,
    ExpireWrap,
    LifecycleForwarded,
    inline,
    ours,
    set_on,
)
from .fanout import Fanout
from .lifecycle import erasure_records, kept
from .worker import Replica
from .writes import Writer


class ReplicatedLifecycle(LifecycleForwarded):
    """Mixed into `ReplicatedCheckpointer`."""

    _fanout: Fanout
    _writer: Writer
    _closed: threading.Event
    quorum: int
    quorum_timeout: float

    @property
    def primary(self) -> BaseCheckpointSaver[Any]:
        raise NotImplementedError

    def _delete_thread(self, sync: bool, thread_id: str) -> Coroutine[Any, Any, None]:
        raise NotImplementedError

    def _lifecycle_saver(self) -> Any:
        return self.primary

    def _set_attribute(self, name: str, value: Any) -> None:
        """The default retention policy or the clock: the primary's, and that of every replica
        of this process that keeps lifecycle rows (one may become the primary)."""
        setattr(self._host(name), name, value)
        for r in self._fanout.views:
            if isinstance(r, Replica) and isinstance(r.saver, StoreCheckpointer
                                                     | LifecycleForwarded):
                setattr(r.saver, name, value)

    async def _set_lifecycle(self, sync: bool, name: str, thread_id: str, *args: Any) -> None:
        store_method(self.primary, name, "primary")  # refused before anything is queued
        tid = check_id(thread_id, "thread_id", required=True)
        await self._writer.write(sync, "lifecycle",
                                 lambda s: set_on(s, sync, name, thread_id, *args),
                                 (name, tid, *args), (tid,))

    def _primary_host(self, name: str) -> StoreCheckpointer:
        if self._closed.is_set():
            raise ReplicationError(
                f"this ReplicatedCheckpointer is closed: {name}() would not reach its replicas")
        return ours(self.primary, "primary", name)

    async def _guarded_sweep(self, sync: bool, limit: int | None, dry_run: bool,
                             delete_paused: bool | None, wrap: ExpireWrap,
                             threads: Sequence[str] | None = None) -> SweepReport:
        primary = self._primary_host("sweep")
        hook_sync = sync and inline(primary)
        expire = wrap(self._replicated_expire(primary._expire, hook_sync), hook_sync)
        pass_ = primary._sweep_pass(limit, dry_run, delete_paused, expire,
                                    self._replicated_cut(primary, hook_sync), threads)
        return primary.run_sync(pass_) if sync else await pass_

    def _replicated_expire(self, expire: Expire, sync: bool) -> Expire:
        """The primary's conditional expiry, followed, when it deleted, by the thread's
        deletion on every replica (queued in the primary's order, as `delete_thread`)."""
        async def replicated(thread_id: str, generation: int) -> bool:
            threads = (str(thread_id),)
            await self._writer.gate.enter(sync, threads)
            try:
                if not await expire(thread_id, generation):
                    return False
                op = await self._fanout.queue(sync, "delete", (thread_id,), threads)
            finally:
                self._writer.gate.leave(threads)
            if op.ack is not None and len(self._fanout.up()) >= self.quorum:
                # quorum mode: wait for the confirmations as a delete_thread would, but an
                # expiry done on the primary stands (a replica that failed is repaired)
                await either(sync, op.ack.wait, op.ack.await_, self.quorum_timeout)
            return True

        return replicated

    def _replicated_cut(self, primary: StoreCheckpointer, sync: bool
                        ) -> Callable[[str], Awaitable[None]]:
        """After the sweep cut a thread's history on the primary: what it kept, sent to the
        replicas, which delete the rest (in the primary's order: what they then hold is what
        the primary held when it cut)."""
        async def cut(thread_id: str) -> None:
            threads = (str(thread_id),)
            await self._writer.gate.enter(sync, threads)  # no write of it meanwhile
            try:
                keep = await kept(primary, thread_id)
                await self._fanout.queue(sync, "lifecycle", ("keep_only", threads[0], keep),
                                         threads)
            finally:
                self._writer.gate.leave(threads)

        return cut

    async def _guarded_erase(self, sync: bool, where: Mapping[str, Any], dry_run: bool,
                             reason: str, wrap: DeleteWrap) -> ErasureReport:
        primary = self._primary_host("erase")
        hook_sync = sync and inline(primary)

        async def delete(thread_id: str) -> None:
            await self._delete_thread(hook_sync, thread_id)

        async def erase() -> ErasureReport:
            report = await primary._erase(where, dry_run, reason, wrap(delete, hook_sync))
            if not dry_run and report.threads:  # the records too: a replica may be promoted
                records = await erasure_records(primary, report.threads, report.at)
                await self._fanout.queue(hook_sync, "lifecycle", ("log", "", records),
                                         tuple(report.threads))
            return report

        return primary.run_sync(erase()) if sync else await erase()


__all__ = ["ReplicatedLifecycle"]
