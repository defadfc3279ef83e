"""`connect(url)`: a checkpointer from a URL, its driver imported only then; `around`: the
same, wrapped (what the wrappers' `from_conn_string` opens). A top-level module: it may import
`core` and the backends (each lazily, when its URL is named)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from .core.opening import Closable, Opening
from .core.urls import parse_url

if TYPE_CHECKING:
    from .backends.checkpointer import Checkpointer


def connect(url: str, **options: Any) -> Checkpointer:
    """A ready checkpointer for `url`.

    `memory://` gives an `InMemoryCheckpointer`; `sqlite:///relative.db`,
    `sqlite:////absolute/path.db` and `sqlite://` (in memory) a `SQLiteCheckpointer`;
    `postgresql://...` a `PostgresCheckpointer`; `redis://...` (or `rediss://`) a
    `RedisCheckpointer`, standalone or Cluster
    (`redis+sentinel://host:26379,host:26380/service/0`: on the master the sentinels name).

    Query options (each also a keyword option of the checkpointer; one given both ways is
    refused):

    - SQLite: `busy_timeout` (seconds), `synchronous` (`OFF`, `NORMAL`, `FULL`, `EXTRA`),
      `mode` (`ro`: read-only, nothing created or written; `rw`: the file must exist).
    - PostgreSQL: `schema` (where the tables live), `min_size` and `max_size` (the pool),
      `read_replicas` (`host:port,...`: see docs/high-availability.md); several hosts
      (`postgresql://h1:5432,h2:5432/db?target_session_attrs=read-write`) reach whichever
      accepts writes; every other parameter goes to asyncpg (`sslmode`,
      `target_session_attrs`, ...; one it does not know becomes a server setting, e.g.
      `application_name`).
    - Redis: `key_prefix`, `ttl` (seconds), `wait_replicas` and `wait_timeout` (seconds);
      every other parameter must be one redis-py takes (`socket_timeout`,
      `health_check_interval`, ...); a sentinel URL also takes `sentinel_username` and
      `sentinel_password` (the sentinels' own credentials).

    Raises `InvalidConfigError` (the URL shown without its password) for a URL of another
    form, a `sqlite://host/...` URL (it names the right form), or an unknown option (by
    name), before anything is opened or created.

    Example:
        >>> cp = connect("sqlite:///agent.db?busy_timeout=5")  # doctest: +SKIP
        >>> cp = connect("postgresql://app@db/agents?schema=tenant_a")  # doctest: +SKIP
    """
    parsed = parse_url(url)
    conn, kwargs = parsed.arguments(options)
    if parsed.backend == "memory":
        from .backends.memory import InMemoryCheckpointer

        return InMemoryCheckpointer(**kwargs)
    if parsed.backend == "sqlite":
        from .backends.sqlite import SQLiteCheckpointer

        return SQLiteCheckpointer(conn, **kwargs)
    if parsed.backend == "postgres":
        from .backends.postgres import PostgresCheckpointer

        return PostgresCheckpointer(conn, **kwargs)
    from .backends.redis import RedisCheckpointer

    return RedisCheckpointer(conn, **kwargs)


W = TypeVar("W", bound=Closable)


def around(url: str, connect_options: Mapping[str, Any] | None, wrap: Callable[[Any], W]
           ) -> Opening[W]:
    """An `Opening` of a wrapper built by `wrap` around the checkpointer `connect(url)` opens;
    the wrapper owns it (`_owned`: closed with the wrapper), and it is closed again if `wrap`
    fails. `async with` opens it in a worker thread, as `connect` is sync.
    (Here, not in `core.opening`: the core imports nothing above it.)"""
    parse_url(url)  # a wrong URL is refused here, before anything opens

    def open_sync() -> W:
        inner = connect(url, **(connect_options or {}))
        try:
            wrapper = wrap(inner)
        except BaseException:
            inner.close()
            raise
        wrapper._owned = inner  # type: ignore[attr-defined]
        return wrapper

    async def open_async() -> W:
        return await asyncio.to_thread(open_sync)

    return Opening(open_sync, open_async)
