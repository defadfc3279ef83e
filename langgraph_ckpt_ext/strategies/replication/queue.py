"""What is queued for the replicas: an op in the primary's order, and the confirmations a
quorum write waits for."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...core.bridge import resolve

BATCH = 64  # ops one replica applies in one batch at most
BATCHED = ("put", "writes", "rows")  # ops a replica applies a run of as one batch


class Ack:
    """Confirmations of one write by the replicas: done once `need` confirmed it, or once so
    many failed that `need` cannot be reached."""

    def __init__(self, need: int, total: int) -> None:
        self.need, self.total = need, total
        self.ok = 0
        self.errors: list[tuple[str, BaseException]] = []
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._waiters: list[Callable[[], None]] = []

    def settle(self, replica: str, error: BaseException | None) -> None:
        with self._lock:
            if error is None:
                self.ok += 1
            else:
                self.errors.append((replica, error))
            if self._done.is_set() or not (
                self.ok >= self.need or len(self.errors) > self.total - self.need
            ):
                return
            self._done.set()
            waiters, self._waiters = self._waiters, []
        for wake in waiters:
            with contextlib.suppress(RuntimeError):  # the waiter's loop has closed
                wake()

    @property
    def succeeded(self) -> bool:
        return self.ok >= self.need

    def wait(self, timeout: float) -> bool:
        return self._done.wait(timeout)

    async def await_(self, timeout: float) -> bool:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()

        def wake() -> None:
            loop.call_soon_threadsafe(resolve, future)

        with self._lock:
            if self._done.is_set():
                return True
            self._waiters.append(wake)
        try:
            await asyncio.wait_for(future, timeout)
        except (TimeoutError, asyncio.TimeoutError):  # two classes before Python 3.11
            return False
        return True


@dataclass
class Op:
    kind: str  # rows | put | writes | delete | delete_runs | copy | prune | lifecycle
    args: tuple[Any, ...]
    threads: tuple[str, ...]  # the threads it touches (none known: delete_runs)
    at: float
    ack: Ack | None = None
    seq: int = 0  # its place in the primary's order
    quorum: bool = False  # in the replicator process: a quorum write (the parent waits on it)


@dataclass
class Entry:
    op: Op
    acked: bool = False  # whether this replica has settled the op's ack (first attempt)
