"""The data lifecycle (retention, pins, sweeps, erasure: `core/lifecycle.py`) through the
wrappers, with the names and signatures `StoreCheckpointer` has.

The lifecycle rows live in the store of the checkpointer at the bottom (the smart one's
inner checkpointer, the replicated one's primary: its *host*). A sweep or an erasure is that
checkpointer's own pass (`_sweep_pass`, `_erase`), run with what each wrapper on the way
adds to its deletions (`ExpireWrap`, `DeleteWrap`): the smart one keeps a thread it still
buffers, and drops its buffer of a thread deleted; the replicated one deletes (and cuts) on
its replicas too, through its replication path.

A hook runs inside the host's pass, where its store runs: inline (a store that never
suspends, driven without an event loop), on the host's private loop (its sync methods must
not be called there), or on the caller's loop. It is given `sync`: True only in the first
case, where it must not suspend; else it awaits (and calls only async methods).
"""

from __future__ import annotations

import builtins
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, cast

from ..core.bridge import run_inline
from ..core.leases import Lease
from ..core.lifecycle import BackgroundSweeping
from ..core.retention import (
    ErasureReport,
    LifecycleEvent,
    Retention,
    SweepReport,
    ThreadState,
)
from ..core.saver import StoreCheckpointer
from ._forward import Forwarded

Expire = Callable[[str, int], Awaitable[bool]]
"""`expire(thread_id, generation)`: delete the thread if its generation is unchanged."""
ExpireWrap = Callable[[Expire, bool], Expire]
"""What a wrapper adds to the expiry of a thread (given `sync`: see the module's doc)."""
Delete = Callable[[str], Awaitable[None]]
DeleteWrap = Callable[[Delete, bool], Delete]


def no_wrap(fn: Any, sync: bool) -> Any:
    return fn


def inline(saver: StoreCheckpointer) -> bool:
    """Whether `saver`'s store never suspends (its sync calls run inline, without a loop)."""
    return bool(saver._store.inline)


def ours(saver: object, role: str, name: str) -> StoreCheckpointer:
    if not isinstance(saver, StoreCheckpointer):
        raise NotImplementedError(
            f"{name}() needs one of this package's checkpointers as the {role} checkpointer; "
            f"{type(saver).__name__} keeps no thread lifecycle rows")
    return saver


async def host_sweep(saver: object, role: str, sync: bool, limit: int | None, dry_run: bool,
                     delete_paused: bool | None, wrap: ExpireWrap,
                     threads: Sequence[str] | None = None) -> SweepReport:
    """A sweep pass of `saver` (ours, or a wrapper of ours), its expiries wrapped by `wrap`."""
    if isinstance(saver, LifecycleForwarded):
        return await saver._guarded_sweep(sync, limit, dry_run, delete_paused, wrap, threads)
    cp = ours(saver, role, "sweep")
    pass_ = cp._sweep_pass(limit, dry_run, delete_paused, wrap(cp._expire, sync and inline(cp)),
                           threads=threads)
    return cp.run_sync(pass_) if sync else await pass_


async def host_erase(saver: object, role: str, sync: bool, where: Mapping[str, Any],
                     dry_run: bool, reason: str, wrap: DeleteWrap) -> ErasureReport:
    """An erasure by `saver` (ours, or a wrapper of ours), its deletions wrapped by `wrap`."""
    if isinstance(saver, LifecycleForwarded):
        return await saver._guarded_erase(sync, where, dry_run, reason, wrap)
    cp = ours(saver, role, "erase")
    pass_ = cp._erase(where, dry_run, reason, wrap(cp.adelete_thread, sync and inline(cp)))
    return cp.run_sync(pass_) if sync else await pass_


class LifecycleForwarded(Forwarded, BackgroundSweeping):
    """Mixed into the wrappers: `StoreCheckpointer`'s lifecycle methods (see
    `core/lifecycle.py` for what each does), over the wrapper's hooks."""

    # -- what each wrapper provides -----------------------------------------------------------

    def _lifecycle_saver(self) -> Any:
        """The checkpointer holding the lifecycle rows and the retention policy."""
        raise NotImplementedError

    async def _set_lifecycle(self, sync: bool, name: str, thread_id: str, *args: Any) -> None:
        """`pin`, `unpin` or `set_thread_retention` (`args`: the policy as JSON, or None)."""
        raise NotImplementedError

    async def _guarded_sweep(self, sync: bool, limit: int | None, dry_run: bool,
                             delete_paused: bool | None, wrap: ExpireWrap,
                             threads: Sequence[str] | None = None) -> SweepReport:
        raise NotImplementedError

    async def _guarded_erase(self, sync: bool, where: Mapping[str, Any], dry_run: bool,
                             reason: str, wrap: DeleteWrap) -> ErasureReport:
        raise NotImplementedError

    # -- policy, pins ------------------------------------------------------------------------

    def _host(self, name: str) -> Any:
        """`_lifecycle_saver()`, or `NotImplementedError` when it keeps no lifecycle rows."""
        saver = self._lifecycle_saver()
        if not isinstance(saver, StoreCheckpointer | LifecycleForwarded):
            raise NotImplementedError(
                f"{name} needs one of this package's checkpointers inside the wrapper; "
                f"{type(saver).__name__} keeps no thread lifecycle rows")
        return saver

    @property
    def retention(self) -> Retention | None:
        """The retention policy of every thread without one of its own (see
        `StoreCheckpointer.retention`)."""
        return cast("Retention | None", self._host("retention").retention)

    @retention.setter
    def retention(self, value: Retention | Mapping[str, Any] | None) -> None:
        self._set_attribute("retention", Retention.coerce(value))

    @property
    def clock(self) -> Callable[[], float]:
        """What "now" is for lifecycle rows and sweeps (see `StoreCheckpointer.clock`)."""
        return cast("Callable[[], float]", self._host("clock").clock)

    @clock.setter
    def clock(self, clock: Callable[[], float]) -> None:
        self._set_attribute("clock", clock)

    def _set_attribute(self, name: str, value: Any) -> None:
        setattr(self._host(name), name, value)

    def pin(self, thread_id: str) -> None:
        """Exempt a thread from every retention rule (see `StoreCheckpointer.pin`)."""
        run_inline(self._set_lifecycle(True, "pin", thread_id))

    async def apin(self, thread_id: str) -> None:
        await self._set_lifecycle(False, "pin", thread_id)

    def unpin(self, thread_id: str) -> None:
        run_inline(self._set_lifecycle(True, "unpin", thread_id))

    async def aunpin(self, thread_id: str) -> None:
        await self._set_lifecycle(False, "unpin", thread_id)

    def set_thread_retention(self, thread_id: str,
                             retention: Retention | Mapping[str, Any] | None) -> None:
        """Give one thread its own retention policy (None: the checkpointer's again)."""
        run_inline(self._set_lifecycle(True, "set_thread_retention", thread_id,
                                       _policy_json(retention)))

    async def aset_thread_retention(self, thread_id: str,
                                    retention: Retention | Mapping[str, Any] | None) -> None:
        await self._set_lifecycle(False, "set_thread_retention", thread_id,
                                  _policy_json(retention))

    def thread_state(self, thread_id: str) -> ThreadState | None:
        """A thread's lifecycle row (see `StoreCheckpointer.thread_state`)."""
        return cast("ThreadState | None", self._forward("thread_state", [thread_id], thread_id))

    async def athread_state(self, thread_id: str) -> ThreadState | None:
        return cast("ThreadState | None",
                    await self._aforward("athread_state", [thread_id], thread_id))

    def lifecycle_log(self, thread_id: str | None = None) -> builtins.list[LifecycleEvent]:
        """The deletions the store recorded (see `StoreCheckpointer.lifecycle_log`)."""
        return cast("builtins.list[LifecycleEvent]",
                    self._forward("lifecycle_log", (), thread_id))

    async def alifecycle_log(self, thread_id: str | None = None
                             ) -> builtins.list[LifecycleEvent]:
        return cast("builtins.list[LifecycleEvent]",
                    await self._aforward("alifecycle_log", (), thread_id))

    def vacuum(self) -> tuple[int, int]:
        """Give the space of deleted rows back (see `StoreCheckpointer.vacuum`)."""
        return cast("tuple[int, int]", self._forward("vacuum", ()))

    async def avacuum(self) -> tuple[int, int]:
        return cast("tuple[int, int]", await self._aforward("avacuum", ()))

    # -- one writer per thread: the host's (`StoreCheckpointer.lease`, ...) ---------------------

    def lease(self, thread_id: str, ttl: float = 30.0, *, wait: float = 0.0,
              keep_alive: bool = True) -> Lease:
        """A lease of the thread in the host's store (see `StoreCheckpointer.lease`): the
        writes of this wrapper carry its token wherever they are written from."""
        return cast(Lease, self._host("lease").lease(thread_id, ttl, wait=wait,
                                                     keep_alive=keep_alive))

    def tombstone(self, thread_id: str) -> float | None:
        """When the thread was deleted, while its tombstone lasts (None: no tombstone)."""
        return cast("float | None", self._host("tombstone").tombstone(thread_id))

    async def atombstone(self, thread_id: str) -> float | None:
        return cast("float | None", await self._host("atombstone").atombstone(thread_id))

    @property
    def writers(self) -> str:
        """The host's `writers` (`"single"` or `"last_wins"`)."""
        return cast(str, self._host("writers").writers)

    # -- sweeping, erasure ---------------------------------------------------------------------

    def sweep(self, limit: int | None = None, *, dry_run: bool = False,
              delete_paused: bool | None = None,
              threads: Sequence[str] | None = None) -> SweepReport:
        """One pass of the retention policies (see `StoreCheckpointer.sweep`), through this
        wrapper: see its class for what it adds."""
        return run_inline(self._guarded_sweep(True, limit, dry_run, delete_paused, no_wrap,
                                              threads))

    async def asweep(self, limit: int | None = None, *, dry_run: bool = False,
                     delete_paused: bool | None = None,
                     threads: Sequence[str] | None = None) -> SweepReport:
        return await self._guarded_sweep(False, limit, dry_run, delete_paused, no_wrap, threads)

    def erase(self, where: Mapping[str, Any], *, dry_run: bool = False,
              reason: str = "") -> ErasureReport:
        """Delete every thread whose metadata matches `where`, and its forks (see
        `StoreCheckpointer.erase`), through this wrapper: see its class for what it adds."""
        return run_inline(self._guarded_erase(True, where, dry_run, reason, no_wrap))

    async def aerase(self, where: Mapping[str, Any], *, dry_run: bool = False,
                     reason: str = "") -> ErasureReport:
        return await self._guarded_erase(False, where, dry_run, reason, no_wrap)


def _policy_json(retention: Retention | Mapping[str, Any] | None) -> str | None:
    policy = Retention.coerce(retention)  # refused here, before anything is written
    return None if policy is None else policy.to_json()


async def set_on(saver: Any, sync: bool, name: str, thread_id: str, *args: Any) -> None:
    """`name` (`pin`, `unpin`, `set_thread_retention` with the policy as JSON) on `saver`."""
    if name == "set_thread_retention":
        args = (None if args[0] is None else Retention.from_json(args[0]),)
    method = getattr(saver, name if sync else f"a{name}", None)
    if not callable(method):
        raise NotImplementedError(
            f"{name}() needs one of this package's checkpointers; {type(saver).__name__} "
            "keeps no thread lifecycle rows")
    out = method(thread_id, *args)
    if not sync:
        await out


__all__ = [
    "DeleteWrap",
    "ExpireWrap",
    "LifecycleForwarded",
    "host_erase",
    "host_sweep",
    "inline",
    "no_wrap",
    "ours",
    "set_on",
]
