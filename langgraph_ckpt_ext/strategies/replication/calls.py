"""How the checkpointer's calls run. Each is written once, as a coroutine that takes `sync`:
the sync entry point drives it with `run_inline` (it then never suspends: the savers' sync
methods are picked with `core.bridge.either`, blocking waits happen in place), the async one
awaits it (blocking waits go to a worker thread, off the caller's loop)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import ParamSpec, TypeVar

T = TypeVar("T")
P = ParamSpec("P")


def in_thread(fn: Callable[P, T]) -> Callable[P, Awaitable[T]]:
    """`fn` run by a worker thread when awaited: the async twin of a blocking call."""

    async def call(*args: P.args, **kwargs: P.kwargs) -> T:
        return await asyncio.to_thread(fn, *args, **kwargs)

    return call


async def ready(value: T) -> T:
    """A value already at hand, as an awaitable."""
    return value


def caller_gone(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether the calling coroutine, started on `loop`, outlived it (closed under it, then
    collected, maybe while another loop runs): what failed then is the caller's loop, not
    the primary, which stays up."""
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        return True
    return running is not loop or loop.is_closed()
