"""`connect(url)`: a checkpointer from a URL, its driver imported only then."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from .core.errors import InvalidConfigError
from .core.saver import StoreCheckpointer

# The option each scheme takes from the URL's query (the driver would refuse it).
_URL_OPTIONS = {"postgres": "schema", "postgresql": "schema", "redis": "key_prefix",
                "rediss": "key_prefix"}


def connect(url: str, **options: Any) -> StoreCheckpointer:
    """A ready checkpointer for `url`.

    `memory://` gives an `InMemoryCheckpointer`; `sqlite:///relative.db`,
    `sqlite:////absolute/path.db` and `sqlite://:memory:` a `SQLiteCheckpointer`;
    `postgresql://...` a `PostgresCheckpointer`; `redis://...` (or `rediss://`) a
    `RedisCheckpointer`, standalone or Cluster.

    The URL may name where the rows live on a shared server: `postgresql://...?schema=NAME`
    (the PostgreSQL schema, as `schema=`) and `redis://...?key_prefix=NAME` (as
    `key_prefix=`); every other query parameter goes to the driver. Keyword options go to the
    checkpointer's constructor (one given both ways is refused).

    Example:
        >>> cp = connect("sqlite:///agent.db")  # doctest: +SKIP
        >>> cp = connect("postgresql://app@db/agents?schema=tenant_a")  # doctest: +SKIP
    """
    scheme = urlsplit(url).scheme
    if scheme in _URL_OPTIONS:
        url, options = _take_option(url, _URL_OPTIONS[scheme], options)
    if scheme == "memory":
        from .backends.memory import InMemoryCheckpointer

        return InMemoryCheckpointer(**options)
    if scheme == "sqlite":
        from .backends.sqlite import SQLiteCheckpointer

        return SQLiteCheckpointer(sqlite_path(url), **options)
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


def sqlite_path(url: str) -> str:
    """The file a `sqlite://` URL names (`":memory:"` for `sqlite://` and `sqlite://:memory:`)."""
    rest = url[len("sqlite://") :]
    return ":memory:" if rest in ("", "/", ":memory:", "/:memory:") else unquote(rest[1:])


def _take_option(url: str, name: str, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """`url` without the query parameter `name`, and `options` with its value added."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    values = [v for k, v in query if k == name]
    if not values:
        return url, options
    if len(values) > 1 or name in options:
        raise InvalidConfigError(f"{name} is given twice (in the URL and as an option): keep one")
    rest = urlencode([(k, v) for k, v in query if k != name])
    return urlunsplit(parts._replace(query=rest)), {**options, name: values[0]}
