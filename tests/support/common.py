"""Small helpers many tests share: a config naming a thread, and event loops to call from."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any


def conf(thread: str, checkpoint_id: str | None = None) -> dict[str, Any]:
    """The config naming a thread (and a checkpoint of it)."""
    c: dict[str, Any] = {"thread_id": thread}
    if checkpoint_id:
        c["checkpoint_id"] = checkpoint_id
    return {"configurable": c}


class LoopThread:
    """An event loop in a thread of its own, for driving async graph calls from sync tests."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=120)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        if not self.thread.is_alive():
            self.loop.close()


def in_running_loop(fn: Callable[[], Any]) -> Any:
    """Call `fn` (which makes sync calls) from a thread whose event loop is running."""

    async def main() -> Any:
        assert asyncio.get_running_loop().is_running()
        return fn()

    return asyncio.run(main())
