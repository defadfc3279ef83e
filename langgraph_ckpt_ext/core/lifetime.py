"""What a checkpointer dropped without `close()` still holds, released when it is collected.

A file or socket left open warns (`ResourceWarning`) and closes when collected; a checkpointer
does the same with its connections, pools and threads. The finalizer holds the store and the
bridge, never the checkpointer: anything that led back to it would keep it alive for good.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable

from .bridge import Bridge
from .store import Store


class Lifetime:
    """The life of what a checkpointer opened: `closed()` on `close()`, else released (with a
    `ResourceWarning`) once this object is collected.

    One `Lifetime` serves a checkpointer and its shallow copies (`with_allowlist`, which
    LangGraph's `compile` may call and keep the copy of, dropping the original): they share
    the store, so it is released when the last of them goes.
    """

    __slots__ = ("__weakref__", "_finalizer")

    def __init__(self, name: str, release: Callable[[], object]) -> None:
        self._finalizer = weakref.finalize(self, _release, name, release)
        # At exit the process gives everything back anyway; a close then would race the
        # interpreter's teardown.
        self._finalizer.atexit = False

    def closed(self) -> None:
        """Closed by its owner: nothing left to release, nothing to warn about."""
        self._finalizer.detach()


def store_lifetime(name: str, store: Store, bridge: Bridge) -> Lifetime | None:
    """A `Lifetime` that closes `store` and stops `bridge` (None for a store that holds no
    connection: an in-memory one)."""
    if store.inline:
        return None
    return Lifetime(name, lambda: bridge.close_soon(store.close()))


def _release(name: str, release: Callable[[], object]) -> None:
    try:
        release()
    finally:  # after the release: a warning filtered into an error must not prevent it
        # Attributed to this module (stacklevel 1): a collection happens anywhere, and a
        # filter can name the module.
        warnings.warn(
            f"unclosed {name}: close() it (or use it in `with` / `async with`) to release "
            "its connections and threads",
            ResourceWarning,
            stacklevel=1,
        )
