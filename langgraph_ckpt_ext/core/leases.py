"""Leases: a thread held by one holder for a while, with a fencing token every write of the
holder carries and the store checks (`core.guard`), so that a holder that stalled past its
lease (a long pause, a partition) cannot write once another has taken the thread."""

from __future__ import annotations

import asyncio
import math
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Mapping
from contextvars import Token
from types import TracebackType
from typing import Any, TypeVar

from langchain_core.runnables import RunnableConfig

from .config import check_id
from .errors import LeaseLostError, ThreadLeasedError
from .guard import LEASE_KEY, held_leases
from .store import Store

T = TypeVar("T")


class Lease:
    """A lease of one thread (`checkpointer.lease(thread_id, ttl=...)`), used as a context
    manager, sync or async: taken on entry (`ThreadLeasedError` if another holder has it and
    `wait` runs out), released on exit. Inside the block, writes of the thread from this
    context carry the lease's token; `config()` gives a config that carries it anywhere (a
    run started in another thread or process). With `keep_alive`, a daemon thread renews the
    lease every third of its `ttl`; a holder that stops renewing (stalled, partitioned) loses
    it at expiry, and its writes are refused (`LeaseLostError`) once another holder takes it.
    """

    def __init__(self, store: Store, run_sync: Callable[[Coroutine[Any, Any, Any]], Any],
                 thread_id: str, ttl: float, wait: float, keep_alive: bool) -> None:
        if not isinstance(ttl, (int, float)) or isinstance(ttl, bool) or not (
                math.isfinite(ttl) and ttl > 0):
            raise ValueError(f"a lease's ttl must be a positive number of seconds, not {ttl!r}")
        if not isinstance(wait, (int, float)) or isinstance(wait, bool) or not (
                math.isfinite(wait) and wait >= 0):
            raise ValueError(f"wait must be a number of seconds >= 0, not {wait!r}")
        self.thread_id = check_id(thread_id, "thread_id", required=True)
        self.ttl, self.wait, self.keep_alive = float(ttl), float(wait), keep_alive
        self.token = uuid.uuid4().hex
        """The fencing token: every write of the holder carries it."""
        self._store, self._run_sync = store, run_sync
        self._ctx: Token[Mapping[str, str]] | None = None
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None
        self.lost = False
        """Set when a renewal found the lease expired or taken over."""

    def config(self, config: RunnableConfig | None = None) -> RunnableConfig:
        """`config` (default: the thread's) carrying this lease's token."""
        base: dict[str, Any] = dict(config or {})
        conf = dict(base.get("configurable") or {})
        conf.setdefault("thread_id", self.thread_id)
        conf[LEASE_KEY] = self.token
        base["configurable"] = conf
        return base  # type: ignore[return-value]

    # -- taking, renewing, releasing ----------------------------------------------------------

    async def aacquire(self) -> Lease:
        deadline = time.monotonic() + self.wait
        while not await self._store.acquire_lease(self.thread_id, self.token, self.ttl):
            await asyncio.sleep(self._pause(deadline))
        return self

    def acquire(self) -> Lease:
        deadline = time.monotonic() + self.wait
        while not self._run_sync(self._store.acquire_lease(self.thread_id, self.token, self.ttl)):
            time.sleep(self._pause(deadline))
        return self

    def _pause(self, deadline: float) -> float:
        """Seconds to wait before asking again; `ThreadLeasedError` once `wait` has run out."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise ThreadLeasedError(
                f"thread {self.thread_id!r} is leased by another holder", self.thread_id)
        return min(0.05, left)

    async def arenew(self) -> None:
        """Extend the lease by its `ttl` from now; `LeaseLostError` if it was lost."""
        if not await self._store.renew_lease(self.thread_id, self.token, self.ttl):
            self.lost = True
            raise LeaseLostError(f"the lease of thread {self.thread_id!r} expired or was "
                                 "taken over", self.thread_id)

    def renew(self) -> None:
        self._run_sync(self.arenew())

    async def arelease(self) -> None:
        self._stop.set()
        await self._store.release_lease(self.thread_id, self.token)

    def release(self) -> None:
        self._stop.set()
        self._run_sync(self._store.release_lease(self.thread_id, self.token))

    # -- the block ----------------------------------------------------------------------------

    def _enter(self) -> None:
        self._ctx = held_leases.set({**held_leases.get(), self.thread_id: self.token})
        if self.keep_alive:
            self._renewer = threading.Thread(
                target=self._renew_loop, name=f"lgckpt-lease-{self.thread_id[:16]}",
                daemon=True)
            self._renewer.start()

    def _exit(self) -> None:
        self._stop.set()
        if self._ctx is not None:
            held_leases.reset(self._ctx)
            self._ctx = None

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            try:
                self.renew()
            except LeaseLostError:
                return
            except Exception:  # an outage: the next renewal tries again, expiry decides
                continue

    def __enter__(self) -> Lease:
        self.acquire()
        self._enter()
        return self

    def __exit__(self, *exc: object) -> None:
        self._exit()
        self.release()

    async def __aenter__(self) -> Lease:
        await self.aacquire()
        self._enter()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self._exit()
        await self.arelease()
