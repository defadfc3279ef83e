"""One client (a pool, a connection) per event loop, for drivers whose connections belong to the
loop that opened them (asyncpg, redis.asyncio). Sync calls run on the bridge's loop, async calls
on the caller's: each gets its own, and `close()` closes each on its own loop."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")


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
        created = await self._opener()
        with self._guard:
            client = self._clients.setdefault(loop, created)
            if client is created:
                self._owned.append((loop, created))
        if client is not created:
            await self._closer(created)  # another task of this loop opened one first
        return client

    async def close(self) -> None:
        """Close the clients opened here; those the caller gave stay open."""
        with self._guard:
            owned, self._owned = self._owned, []
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
