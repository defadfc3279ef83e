"""One client (a pool, a connection) per event loop, for drivers whose connections belong to the
loop that opened them (asyncpg, redis.asyncio). Sync calls run on the bridge's loop, async calls
on the caller's: each gets its own, and `close()` closes each on its own loop.

A caller's loop may end long before the checkpointer does (one `asyncio.run` per request): its
client is closed as that loop shuts down (`asyncio.run` closes every open async generator of
the loop before closing it, and one of ours waits there for that), else dropped, for the
collector to close its sockets, once the loop is found closed. Neither is kept for good: a
script making 200 requests would hold 200 pools' connections."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import weakref
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


def running_loop() -> asyncio.AbstractEventLoop | None:
    """The event loop running in this thread, or None (not an error) outside any."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class PerLoop(Generic[T]):
    """Clients keyed by event loop: opened on demand, given by the caller, or both.

    Args:
        opener: opens a client for the running loop.
        closer: closes a client this registry opened (awaited on the client's own loop).
        killer: drops a client without awaiting, when its loop cannot run the closer.
    """

    def __init__(
        self,
        opener: Callable[[], Awaitable[T]],
        closer: Callable[[T], Awaitable[object]],
        killer: Callable[[T], object],
    ) -> None:
        self._opener, self._closer, self._killer = opener, closer, killer
        self._clients: dict[asyncio.AbstractEventLoop | None, T] = {}
        self._owned: list[tuple[asyncio.AbstractEventLoop, T]] = []
        # Per owned client, held until its loop shuts down: an async generator of that loop.
        self._keepers: dict[asyncio.AbstractEventLoop, AsyncGenerator[None, None]] = {}
        self._guard = threading.Lock()

    def give(self, loop: asyncio.AbstractEventLoop | None, client: T) -> None:
        """Register a client the caller owns (never closed here); `loop` None: given outside
        any loop."""
        with self._guard:
            self._clients[loop] = client

    def lookup(self, loop: asyncio.AbstractEventLoop | None) -> T | None:
        with self._guard:
            return self._clients.get(loop)

    async def open(self) -> T:
        """The running loop's client, opening one if it has none."""
        loop = asyncio.get_running_loop()
        found = self.lookup(loop)
        if found is not None:
            return found
        self._drop_closed()
        created = await self._opener()
        with self._guard:
            client = self._clients.setdefault(loop, created)
            if client is created:
                self._owned.append((loop, created))
        if client is not created:
            await self._closer(created)  # another task of this loop opened one first
        else:
            await self._close_with(loop, created)
        return client

    async def _close_with(self, loop: asyncio.AbstractEventLoop, client: T) -> None:
        """Have `client` closed when `loop` shuts down its async generators."""
        keeper = _keeper(weakref.ref(self), loop, client)
        await keeper.__anext__()  # started on `loop`: one of its async generators now
        with self._guard:
            self._keepers[loop] = keeper

    async def release(self, loop: asyncio.AbstractEventLoop, client: T) -> None:
        """Close `client`, opened here for `loop`, unless `close()` took it already."""
        with self._guard:
            if not any(lp is loop and c is client for lp, c in self._owned):
                return
            self._owned = [(lp, c) for lp, c in self._owned if c is not client]
            if self._clients.get(loop) is client:
                del self._clients[loop]
            self._keepers.pop(loop, None)
        try:
            await asyncio.wait_for(self._closer(client), 5)
        except Exception:
            self._killer(client)

    def _drop_closed(self) -> None:
        """Forget the clients of loops closed without shutting down (`loop.close()` alone):
        nothing can close them now; the collector closes their sockets."""
        with self._guard:
            gone = [loop for loop in self._clients if loop is not None and loop.is_closed()]
            for loop in gone:
                del self._clients[loop]
                self._keepers.pop(loop, None)
            self._owned = [(lp, c) for lp, c in self._owned if not lp.is_closed()]

    async def close(self) -> None:
        """Close the clients opened here; those the caller gave stay open."""
        with self._guard:
            owned, self._owned = self._owned, []
            self._keepers = {}
            for _, client in owned:
                self._clients = {k: v for k, v in self._clients.items() if v is not client}
        current = asyncio.get_running_loop()
        for loop, client in owned:
            if loop.is_closed():
                continue  # its loop is gone, and with it any way to close it: left to GC
            if loop is current:
                await self._closer(client)
            elif loop.is_running():
                # That loop's thread may be the one waiting for this close (a sync close()
                # from a notebook cell): give it a moment, then drop the client.
                fut = asyncio.run_coroutine_threadsafe(_await(self._closer(client)), loop)
                try:
                    await asyncio.wait_for(asyncio.wrap_future(fut), 5)
                except asyncio.TimeoutError:
                    fut.cancel()
                    self._killer(client)
            else:
                self._killer(client)


async def _await(aw: Awaitable[object]) -> None:
    await aw


async def _keeper(
    owner: weakref.ref[PerLoop[Any]], loop: asyncio.AbstractEventLoop, client: Any
) -> AsyncGenerator[None, None]:
    """Suspended until `loop` closes it (`shutdown_asyncgens`, run by `asyncio.run` before it
    closes the loop), then closes `client` there, on its own loop."""
    try:
        yield
    finally:
        registry = owner()
        if registry is not None and not loop.is_closed():
            with contextlib.suppress(Exception):
                await registry.release(loop, client)
