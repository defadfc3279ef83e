"""`connect(url)`: a checkpointer from a URL, its driver imported only then."""

from __future__ import annotations

from typing import Any

from .core.saver import StoreCheckpointer
from .core.urls import parse_url


def connect(url: str, **options: Any) -> StoreCheckpointer:
    """A ready checkpointer for `url`.

    `memory://` gives an `InMemoryCheckpointer`; `sqlite:///relative.db`,
    `sqlite:////absolute/path.db` and `sqlite://` (in memory) a `SQLiteCheckpointer`;
    `postgresql://...` a `PostgresCheckpointer`; `redis://...` (or `rediss://`) a
    `RedisCheckpointer`, standalone or Cluster.

    Query options (each also a keyword option of the checkpointer; one given both ways is
    refused):

    - SQLite: `busy_timeout` (seconds), `synchronous` (`OFF`, `NORMAL`, `FULL`, `EXTRA`),
      `mode` (`ro`: read-only, nothing created or written; `rw`: the file must exist).
    - PostgreSQL: `schema` (where the tables live), `min_size` and `max_size` (the pool);
      every other parameter goes to asyncpg (`sslmode`, `target_session_attrs`, ...; one it
      does not know becomes a server setting, e.g. `application_name`).
    - Redis: `key_prefix`, `ttl` (seconds); every other parameter must be one redis-py takes
      (`socket_timeout`, `health_check_interval`, ...).

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

