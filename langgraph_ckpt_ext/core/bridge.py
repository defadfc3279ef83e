"""The one sync/async bridge, and a lock that works across event loops and threads.

LangGraph's async savers refuse sync calls from the thread of their own event loop (the error a
Jupyter cell meets). Ours run sync calls on a private event loop in a daemon thread of their own,
so a sync call never blocks or re-enters the caller's loop, whatever thread it comes from.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import AsyncIterator, Coroutine, Iterator
from typing import Any, TypeVar

T = TypeVar("T")


def run_inline(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine that never suspends (an in-memory store) without any event loop."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    coro.close()
    raise RuntimeError("run_inline: the coroutine suspended; it needs an event loop")


class Bridge:
    """Runs coroutines to completion for sync callers on a private loop thread.

    The thread and loop start on first use and stop on `close()`. Sync calls made from that
    very thread (a coroutine on the private loop calling a sync method) would wait on
    themselves, so they raise instead.
    """

    def __init__(self, name: str = "lgckpt-bridge") -> None:
        self._name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._guard = threading.Lock()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        with self._guard:
            if self._loop is None or self._loop.is_closed():
                loop = asyncio.new_event_loop()
                ready = threading.Event()

                def serve() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(ready.set)
                    loop.run_forever()

                thread = threading.Thread(target=serve, name=self._name, daemon=True)
                thread.start()
                ready.wait()
                self._loop, self._thread = loop, thread
            return self._loop

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the private loop and wait for its result in the calling thread."""
        loop = self.loop
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError(
                "a sync checkpointer method was called from the checkpointer's own loop; "
                "use the async method (aget_tuple, aput, ...) there"
            )
        return asyncio.run_coroutine_threadsafe(coro, loop).result()

    def iterate(self, agen: AsyncIterator[T]) -> Iterator[T]:
        """Drive an async iterator from sync code, one item per round trip."""
        while True:
            try:
                yield self.run(_anext(agen))
            except StopAsyncIteration:
                return

    def close(self) -> None:
        with self._guard:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        if threading.current_thread() is not thread:
            thread.join(timeout=5)
            loop.close()


async def _anext(agen: AsyncIterator[T]) -> T:
    return await agen.__anext__()


def iterate_inline(agen: AsyncIterator[T]) -> Iterator[T]:
    """Drive an async iterator that never suspends from sync code."""
    while True:
        try:
            yield run_inline(_anext(agen))
        except StopAsyncIteration:
            return


class AsyncMutex:
    """A mutual-exclusion lock for coroutines of any event loop, in any thread.

    `asyncio.Lock` belongs to one loop; a checkpointer serves the caller's loop and the bridge's
    loop at once. Waiters queue in order; the releaser hands the lock straight to the next one.
    """

    def __init__(self) -> None:
        self._state = threading.Lock()
        self._locked = False
        self._waiters: deque[asyncio.Future[None]] = deque()

    async def __aenter__(self) -> None:
        await self.acquire()

    async def __aexit__(self, *exc: object) -> None:
        self.release()

    async def acquire(self) -> None:
        with self._state:
            if not self._locked:
                self._locked = True
                return
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append(fut)
        try:
            await fut
        except asyncio.CancelledError:
            with self._state:
                if fut in self._waiters:  # never handed the lock
                    self._waiters.remove(fut)
                    raise
            if fut.done() and not fut.cancelled():  # granted just before the cancel landed
                self.release()
            # else `_grant` sees the cancelled future and passes the lock on.
            raise

    def release(self) -> None:
        with self._state:
            if not self._waiters:
                self._locked = False
                return
            fut = self._waiters.popleft()
        fut.get_loop().call_soon_threadsafe(self._grant, fut)

    def _grant(self, fut: asyncio.Future[None]) -> None:
        if fut.done():  # the waiter was cancelled meanwhile: pass the lock on
            self.release()
        else:
            fut.set_result(None)
