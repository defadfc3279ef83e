"""What every `from_conn_string` returns: a context manager for `with` and `async with`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Generic, Protocol, TypeVar


class Closable(Protocol):
    def close(self) -> Any: ...

    async def aclose(self) -> Any: ...


class SetUp(Closable, Protocol):
    async def asetup(self) -> Any: ...


C = TypeVar("C", bound=Closable)
S = TypeVar("S", bound=SetUp)


async def set_up(saver: S, setup: bool = True) -> S:
    """`saver` after `asetup()` (when `setup`); closed again if that fails."""
    if setup:
        try:
            await saver.asetup()
        except BaseException:
            await saver.aclose()
            raise
    return saver


class Opening(Generic[C]):
    """`with` opens the checkpointer in the calling thread, for sync graph calls; `async with`
    opens it on the running event loop, for async ones. Either way it is closed on exit, and
    one that fails to open closes what it had opened.

    Both are what LangGraph's own savers offer (`with SqliteSaver.from_conn_string(...)`,
    `async with AsyncSqliteSaver.from_conn_string(...)`); ours serve sync and async calls
    whichever way they were opened.
    """

    def __init__(self, open_sync: Callable[[], C], open_async: Callable[[], Awaitable[C]]
                 ) -> None:
        self._open_sync, self._open_async = open_sync, open_async
        self._opened: C | None = None

    def __enter__(self) -> C:
        self._opened = self._open_sync()
        return self._opened

    def __exit__(self, *exc: object) -> None:
        opened, self._opened = self._opened, None
        if opened is not None:
            opened.close()

    async def __aenter__(self) -> C:
        self._opened = await self._open_async()
        return self._opened

    async def __aexit__(self, *exc: object) -> None:
        opened, self._opened = self._opened, None
        if opened is not None:
            await opened.aclose()
