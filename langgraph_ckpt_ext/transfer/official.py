"""Reading databases written by LangGraph's official `SqliteSaver` and `PostgresSaver`,
read-only, so that `copy_threads` moves their threads into ours."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from urllib.parse import quote

from langgraph.checkpoint.serde.base import SerializerProtocol

from ..core.errors import InvalidConfigError, StoreUnavailableError, require
from ..core.saver import strict_serde
from ..core.urls import mask, parse_url, redact, url_secrets
from .threads import Saver


@contextlib.contextmanager
def open_official(url: str, *, serde: SerializerProtocol | None = None) -> Iterator[Saver]:
    """LangGraph's own saver over a database it wrote, read-only, for `copy_threads`.

    `sqlite:///relative.db` or `sqlite:////absolute.db` (or a plain path) gives a
    `SqliteSaver` on a read-only connection; `postgresql://...` a `PostgresSaver` whose
    session refuses writes (`default_transaction_read_only`); a schema goes in the URL as
    `?options=-c%20search_path%3Dmy_schema`. Values are decoded with `serde` (default: our
    strict serializer). The connection is closed on leaving the block.

    Raises `MissingDependencyError` naming the `pip install` when langgraph-checkpoint-sqlite
    (or -postgres and psycopg) is missing, `StoreUnavailableError` when the database cannot
    be reached, `InvalidConfigError` when it is not one these savers wrote.

    Example:
        >>> with open_official("sqlite:///langgraph.db") as source:  # doctest: +SKIP
        ...     copy_threads(source, connect("sqlite:///ours.db"))
    """
    scheme = url.partition("://")[0].lower() if "://" in url else ""
    if scheme in ("postgres", "postgresql"):
        with _official_postgres(url, serde or strict_serde()) as saver:
            yield saver
    elif scheme in ("sqlite", ""):
        with _official_sqlite(_sqlite_path(url), serde or strict_serde()) as saver:
            yield saver
    else:
        raise InvalidConfigError(
            f"unsupported URL {redact(url)!r} for LangGraph's savers: use sqlite:///path.db "
            "or postgresql://user@host/db"
        )


def _sqlite_path(url: str) -> str:
    """The file a `sqlite:///` URL (read by the one parser) or a plain path names."""
    if not url.startswith("sqlite:"):
        return url
    path = parse_url(url).arguments(backend="sqlite")[0]
    if path == ":memory:":
        raise InvalidConfigError(f"{url!r} names no database file: use sqlite:///path.db")
    return path


@contextlib.contextmanager
def _official_sqlite(path: str, serde: SerializerProtocol) -> Iterator[Saver]:
    import sqlite3

    mod = require("langgraph.checkpoint.sqlite", package="langgraph-checkpoint-sqlite",
                  what="LangGraph's SqliteSaver databases")
    if not os.path.isfile(path):
        raise StoreUnavailableError(f"no SQLite database at {path!r}: check the path")
    uri = f"file:{quote(os.path.abspath(path))}?mode=ro"
    conn = sqlite3.connect(uri, uri=True, check_same_thread=False)
    try:
        try:
            names = {r[0] for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'")}
        except sqlite3.DatabaseError as exc:
            raise InvalidConfigError(f"{path!r} is not an SQLite database ({exc})") from None
        if not {"checkpoints", "writes"} <= names:
            raise InvalidConfigError(
                f"{path!r} was not written by LangGraph's SqliteSaver (it has no checkpoints "
                "and writes tables)" + (": for one of ours use `copy`" if
                                         "lgx_checkpoints" in names else ""))
        yield mod.SqliteSaver(conn, serde=serde)
    finally:
        conn.close()


@contextlib.contextmanager
def _official_postgres(url: str, serde: SerializerProtocol) -> Iterator[Saver]:
    psycopg = require("psycopg", package="langgraph-checkpoint-postgres psycopg[binary]",
                      what="LangGraph's PostgresSaver databases")
    pg = require("langgraph.checkpoint.postgres", package="langgraph-checkpoint-postgres",
                 what="LangGraph's PostgresSaver databases")
    from psycopg.conninfo import conninfo_to_dict, make_conninfo
    from psycopg.rows import dict_row

    try:
        params = conninfo_to_dict(url)
    except psycopg.ProgrammingError as exc:
        raise InvalidConfigError(f"invalid PostgreSQL URL {redact(url)!r}: "
                                 f"{mask(str(exc), url_secrets(url))}") from None
    # Every transaction of this session is read-only: the source cannot be changed by us.
    params["options"] = f"{params.get('options') or ''} -c default_transaction_read_only=on"
    params.setdefault("connect_timeout", 10)
    try:
        conn = psycopg.connect(make_conninfo("", **params), autocommit=True,
                               prepare_threshold=0, row_factory=dict_row)
    except psycopg.OperationalError as exc:
        reason = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        reason = mask(reason, url_secrets(url))
        raise StoreUnavailableError(
            f"cannot connect to PostgreSQL at {redact(url)}: {reason}; check the URL and that "
            "the server is running"
        ) from None
    try:
        saver = pg.PostgresSaver(conn, serde=serde)
        try:  # the very query `list` runs: its tables and columns are there
            conn.execute(saver.SELECT_SQL + "WHERE false")
        except psycopg.Error as exc:
            raise InvalidConfigError(
                f"{redact(url)} holds no database of LangGraph's current PostgresSaver "
                f"({str(exc).strip().splitlines()[0]}): check the database and schema (a schema "
                "goes in the URL as ?options=-c%20search_path%3Dname); an older one is "
                "upgraded by running PostgresSaver.setup() on it"
            ) from None
        yield saver
    finally:
        conn.close()

