"""The one sync/async bridge.

LangGraph's async savers refuse sync calls from the thread of their own event loop (the error a
Jupyter cell meets). Ours run sync calls on a private event loop in a daemon thread of their own,
so a sync call never blocks or re-enters the caller's loop, whatever thread it comes from.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from typing import Any, ParamSpec, Protocol, TypeVar, cast, runtime_checkable

T = TypeVar("T")
P = ParamSpec("P")

_CLOSE_TIMEOUT = 30.0  # seconds a finalizer's close may take before the loop stops anyway


def run_inline(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine that never suspends (an in-memory store) without any event loop."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    coro.close()
    raise RuntimeError("run_inline: the coroutine suspended; it needs an event loop")


async def either(
    sync: bool,
    call: Callable[P, T],
    acall: Callable[P, Awaitable[T]],
    /,
    *args: P.args,
    **kwargs: P.kwargs,
) -> T:
    """One call of logic written once, as a coroutine, for a sync and an async entry point:
    `call` when `sync` (the coroutine then never suspends on it, and the sync entry point runs
    the whole coroutine with `run_inline`), else `await acall`. A wrapper's `flush` and
    `aflush`, say, are then `run_inline(self._flush(sync=True))` and
    `await self._flush(sync=False)`, with the inner saver's `put_batch`/`aput_batch` chosen here.
    """
    if sync:
        return call(*args, **kwargs)
    return await acall(*args, **kwargs)


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
                    try:
                        loop.run_forever()
                    finally:  # its selector's fds go with the thread, whoever stopped it
                        loop.close()

                thread = threading.Thread(target=serve, name=self._name, daemon=True)
                thread.start()
                ready.wait()
                self._loop, self._thread = loop, thread
            return self._loop

    @property
    def current_loop(self) -> asyncio.AbstractEventLoop | None:
        """The private loop if it is running (without starting it)."""
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
        value, interrupt = asyncio.run_coroutine_threadsafe(_carry(coro), loop).result()
        if interrupt is not None:
            raise interrupt
        return cast(T, value)

    def iterate(self, agen: AsyncIterator[T]) -> Iterator[T]:
        """Drive an async iterator from sync code: the first item in one round trip, then
        batches that grow to 64 items (a thread hop per item would cost more than the item)."""
        size = 1
        while True:
            items, end = self.run(_take(agen, size))
            yield from items
            if isinstance(end, BaseException):
                raise end
            if end:
                return
            size = min(size * 4, 64)

    def close(self) -> None:
        with self._guard:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        if threading.current_thread() is not thread:
            thread.join(timeout=5)

    def close_soon(self, coro: Coroutine[Any, Any, object]) -> None:
        """Run `coro` (a store's close) on the private loop, then stop the loop and its thread,
        waiting for neither: for a finalizer, which may run in any thread, this loop's too."""
        try:
            loop = self.loop
        except BaseException:  # no thread to be had (the interpreter is going)
            coro.close()
            raise
        with self._guard:
            self._loop = self._thread = None

        async def last() -> None:
            try:
                await asyncio.wait_for(coro, _CLOSE_TIMEOUT)
            finally:
                loop.stop()

        asyncio.run_coroutine_threadsafe(last(), loop)


async def _carry(coro: Coroutine[Any, Any, T]) -> tuple[T | None, BaseException | None]:
    """`coro`'s result, or the KeyboardInterrupt or SystemExit it raised (a caller's callback
    may): raised on the private loop, they would stop the loop itself, leaving the sync caller
    waiting forever and the bridge without a thread; carried back, they are raised there."""
    try:
        return await coro, None
    except (KeyboardInterrupt, SystemExit) as exc:
        return None, exc


async def _anext(agen: AsyncIterator[T]) -> T:
    return await agen.__anext__()


async def _take(agen: AsyncIterator[T], n: int) -> tuple[list[T], bool | BaseException]:
    """Up to `n` items, and whether the iterator ended (or the error it raised after them)."""
    items: list[T] = []
    try:
        while len(items) < n:
            items.append(await agen.__anext__())
    except StopAsyncIteration:
        return items, True
    except Exception as exc:
        return items, exc
    return items, False


def iterate_inline(agen: AsyncIterator[T]) -> Iterator[T]:
    """Drive an async iterator that never suspends from sync code."""
    while True:
        try:
            yield run_inline(_anext(agen))
        except StopAsyncIteration:
            return


def resolve(future: asyncio.Future[None]) -> None:
    """Complete a waiter's future unless it is already done (cancelled): scheduled with
    `loop.call_soon_threadsafe` by a thread that wakes a coroutine on that loop."""
    if not future.done():
        future.set_result(None)


@runtime_checkable
class SyncRunner(Protocol):
    """A saver that runs its own coroutines from sync code (ours: `StoreCheckpointer.run_sync`,
    on its bridge)."""

    def run_sync(self, coro: Coroutine[Any, Any, T]) -> T: ...


def run_sync(saver: object, coro: Coroutine[Any, Any, T]) -> T:
    """Run a helper's coroutine over `saver` from sync code: through the saver's own bridge
    when it has one (a `SyncRunner`: a running event loop in this thread is fine then); for any
    other saver in a fresh event loop, in a worker thread if this thread already runs one."""
    if isinstance(saver, SyncRunner):
        return saver.run_sync(coro)
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()
