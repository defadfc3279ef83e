"""A store that can be made unreachable (`Unplugged`): a real store behind a switch, for tests
where one process loses a database another still reaches (each has its own checkpointer, and
its own switch). While `down`, every store call raises `ConnectionError`, an outage to every
wrapper; nothing reaches the real store."""

from __future__ import annotations

import inspect
from typing import Any


class Unplugged:
    def __init__(self, store: Any) -> None:
        self._inner = store
        self.down = False

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if not inspect.iscoroutinefunction(attr) and not inspect.isasyncgenfunction(attr):
            return attr
        if inspect.isasyncgenfunction(attr):
            async def agen(*args: Any, **kwargs: Any) -> Any:
                self._check(name)
                async for item in attr(*args, **kwargs):
                    yield item
            return agen

        async def call(*args: Any, **kwargs: Any) -> Any:
            self._check(name)
            return await attr(*args, **kwargs)
        return call

    def _check(self, name: str) -> None:
        if self.down:
            raise ConnectionError(f"store unreachable (test switch): {name}")


def unplug(saver: Any) -> Unplugged:
    """Put `saver`'s store (one of ours) behind a switch; the switch."""
    switch = Unplugged(saver._store)
    saver._store = switch
    return switch
