"""`connect(url)`: a checkpointer from a URL, its driver imported only then."""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote, urlparse

from .core.saver import StoreCheckpointer


def connect(url: str, **options: Any) -> StoreCheckpointer:
    """A ready checkpointer for `url`.

    `memory://` gives an `InMemoryCheckpointer`; `sqlite:///relative.db`,
    `sqlite:////absolute/path.db` and `sqlite://:memory:` a `SQLiteCheckpointer`;
    `postgresql://...` a `PostgresCheckpointer`; `redis://...` (or `rediss://`) a
    `RedisCheckpointer`, standalone or Cluster.
    Keyword options go to the checkpointer's constructor.

    Example:
        >>> cp = connect("sqlite:///agent.db")  # doctest: +SKIP
    """
    scheme = urlparse(url).scheme
    if scheme == "memory":
        from .backends.memory import InMemoryCheckpointer

        return InMemoryCheckpointer(**options)
    if scheme == "sqlite":
        from .backends.sqlite import SQLiteCheckpointer

        rest = url[len("sqlite://") :]
        path = ":memory:" if rest in ("", "/", ":memory:", "/:memory:") else unquote(rest[1:])
        return SQLiteCheckpointer(path, **options)
    if scheme in ("postgres", "postgresql"):
        from .backends.postgres import PostgresCheckpointer

        return PostgresCheckpointer(url, **options)
    if scheme in ("redis", "rediss"):
        from .backends.redis import RedisCheckpointer

        return RedisCheckpointer(url, **options)
    raise ValueError(
        f"unsupported checkpointer URL {url!r}: use memory://, sqlite:///path.db, "
        "postgresql://... or redis://..."
    )
