"""One URL parser for `connect`, the CLI and replica URLs; `with` / `async with` on every
backend's `from_conn_string` and on both wrappers'.

Each wrong URL form is refused with the right form in the message, before any file is made;
each documented query option takes effect; an unknown one is refused by name; a password in a
URL shows in no message, `repr` or log record."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from langgraph_ckpt_ext import (
    InMemoryCheckpointer,
    PostgresCheckpointer,
    RedisCheckpointer,
    ReplicatedCheckpointer,
    SmartCheckpointer,
    SQLiteCheckpointer,
    connect,
)
from langgraph_ckpt_ext.core.errors import InvalidConfigError, StoreUnavailableError
from langgraph_ckpt_ext.core.saver import StoreCheckpointer
from tests.cli.test_cli import free_port
from tests.support.common import conf
from tests.support.graphs import chat_graph, human
from tests.support.savers import PG_DSN, REDIS_URL, drop_pg_schemas, drop_redis_prefixes, params

SECRET = "s3cr#Et9x"
ENCODED = "s3cr%23Et9x"


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The test runs in its own empty directory: a file a URL wrongly names is seen there."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


# -- SQLite forms --------------------------------------------------------------------------------


@pytest.mark.parametrize(("url", "right"), [
    ("sqlite://rel.db", "sqlite:///rel.db"),
    ("sqlite://data/rel.db", "sqlite:///data/rel.db"),
    ("sqlite://rel.db?busy_timeout=5", "sqlite:///rel.db"),
    ("sqlite:rel.db", "sqlite:///rel.db"),
    ("sqlite:/abs/x.db", "sqlite:////abs/x.db"),
])
def test_sqlite_url_with_a_host_refused(in_tmp: Path, url: str, right: str) -> None:
    with pytest.raises(InvalidConfigError) as info:
        connect(url)
    assert right in str(info.value) and "sqlite:////" in str(info.value), info.value
    assert list(in_tmp.iterdir()) == []


@pytest.mark.parametrize(("url", "path"), [
    ("sqlite:///rel.db", "rel.db"),
    ("sqlite:///sub/rel%20x.db", "sub/rel x.db"),
    ("sqlite:////abs/x.db", "/abs/x.db"),
    ("sqlite://", ":memory:"),
    ("sqlite://:memory:", ":memory:"),
    ("sqlite:///:memory:", ":memory:"),
    ("sqlite:///x.db?busy_timeout=5", "x.db"),
])
def test_sqlite_paths(url: str, path: str) -> None:
    from langgraph_ckpt_ext.core.urls import parse_url

    parsed = parse_url(url)
    assert (parsed.backend, parsed.target) == ("sqlite", path)


def _pragma(cp: StoreCheckpointer, name: str) -> Any:
    writer = cp._store._writer  # type: ignore[attr-defined]
    return cp.run_sync(writer.call(lambda c: c.execute(f"PRAGMA {name}").fetchone()[0]))


def _constructed(url: str, **options: Any) -> Any:
    """The backend's own constructor given the URL: it reads the URL's options as `connect`."""
    from langgraph_ckpt_ext.core.urls import url_backend

    cls = {"sqlite": SQLiteCheckpointer, "postgres": PostgresCheckpointer,
           "redis": RedisCheckpointer}[str(url_backend(url))]
    return cls(url, **options)


OPENERS = {"connect": connect, "constructor": _constructed}


@pytest.mark.parametrize("opener", list(OPENERS))
def test_sqlite_query_options_take_effect(in_tmp: Path, opener: str) -> None:
    with OPENERS[opener]("sqlite:///x.db?busy_timeout=5&synchronous=normal") as cp:
        assert _pragma(cp, "busy_timeout") == 5000
        assert _pragma(cp, "synchronous") == 1  # NORMAL
        chat_graph().compile(checkpointer=cp).invoke({"messages": [human("hi")]}, conf("t"))
    assert sorted(p.name for p in in_tmp.iterdir() if not p.name.startswith("x.db-")) == [
        "x.db"]


@pytest.mark.parametrize("opener", list(OPENERS))
def test_sqlite_mode_ro(in_tmp: Path, opener: str) -> None:
    open_url = OPENERS[opener]
    with open_url("sqlite:///x.db") as cp:
        chat_graph().compile(checkpointer=cp).invoke({"messages": [human("hi")]}, conf("t"))
    with open_url("sqlite:///x.db?mode=ro") as cp:
        assert cp.thread_ids() == ["t"]
        with pytest.raises(Exception, match="readonly"):
            chat_graph().compile(checkpointer=cp).invoke({"messages": [human("x")]}, conf("u"))
    with pytest.raises(Exception, match="unable to open"), \
            open_url("sqlite:///missing.db?mode=ro") as cp:
        cp.thread_ids()
    assert not (in_tmp / "missing.db").exists()


# -- unknown and misplaced options ---------------------------------------------------------------


@pytest.mark.parametrize(("url", "name"), [
    ("sqlite:///x.db?timeout=5", "timeout"),
    ("sqlite:///x.db?busy_timeout=5&journal=wal", "journal"),
    ("memory://?ttl=5", "ttl"),
    (f"{REDIS_URL}?key_prefx=a", "key_prefx"),
    (f"{REDIS_URL}?schema=a", "schema"),
    (f"{PG_DSN}?key_prefix=a", "key_prefix"),
    (f"{PG_DSN}?busy_timeout=5", "busy_timeout"),
])
def test_unknown_option_refused_by_name(in_tmp: Path, url: str, name: str) -> None:
    with pytest.raises(InvalidConfigError, match=f"'{name}'"):
        connect(url)
    assert list(in_tmp.iterdir()) == []


@pytest.mark.parametrize(("url", "words"), [
    ("sqlite:///x.db?busy_timeout=soon", ["busy_timeout", "seconds"]),
    ("sqlite:///x.db?synchronous=fast", ["synchronous", "NORMAL"]),
    ("sqlite:///x.db?mode=rwx", ["mode", "ro"]),
    (f"{PG_DSN}?max_size=many", ["max_size", "integer"]),
    (f"{REDIS_URL}?ttl=-1", ["ttl", "seconds"]),
    ("sqlite:///x.db?mode=ro&mode=rw", ["mode", "twice"]),
])
def test_bad_option_values_refused(in_tmp: Path, url: str, words: list[str]) -> None:
    with pytest.raises(InvalidConfigError) as info:
        connect(url)
    for word in words:
        assert word in str(info.value), info.value
    assert list(in_tmp.iterdir()) == []


@pytest.mark.postgres
@pytest.mark.parametrize("opener", list(OPENERS))
def test_postgres_options(opener: str) -> None:
    schema = f"lgx_test_{uuid.uuid4().hex[:12]}"
    url = (f"{PG_DSN}?schema={schema}&min_size=1&max_size=3&application_name=lgx_urls"
           "&sslmode=disable&target_session_attrs=read-write")  # the last three: asyncpg's
    try:
        with OPENERS[opener](url) as cp:
            assert isinstance(cp, PostgresCheckpointer) and cp.store._schema == schema
            assert cp.store._options["max_size"] == 3

            async def setting() -> Any:
                pool = await cp.store._pool()
                async with pool.acquire() as conn:
                    return await conn.fetchval(
                        "SELECT current_setting('application_name') || ' ' || "
                        "current_setting('search_path')")

            assert cp.run_sync(setting()) == f"lgx_urls {schema}"
    finally:
        drop_pg_schemas(schema)


@pytest.mark.redis
@pytest.mark.parametrize("opener", list(OPENERS))
def test_redis_options(opener: str) -> None:
    prefix = f"lgxtest-{uuid.uuid4().hex[:12]}"
    url = f"{REDIS_URL}?key_prefix={prefix}&ttl=60&socket_timeout=7"
    try:
        with OPENERS[opener](url) as cp:
            assert isinstance(cp, RedisCheckpointer) and cp.ttl == 60
            assert cp.store.prefix == prefix
            chat_graph().compile(checkpointer=cp).invoke({"messages": [human("hi")]}, conf("t"))
            keys = cp.thread_keys("t")
            assert keys and all(k.startswith(prefix) for k in keys)

            async def timeout() -> Any:
                client = await cp.store._clients.open()
                return client.connection_pool.connection_kwargs["socket_timeout"]

            assert cp.run_sync(timeout()) == 7
    finally:
        drop_redis_prefixes(prefix)


@pytest.mark.parametrize("opener", list(OPENERS))
def test_option_given_twice_refused(opener: str) -> None:
    with pytest.raises(InvalidConfigError, match="key_prefix"):
        OPENERS[opener](f"{REDIS_URL}?key_prefix=a", key_prefix="b")
    with pytest.raises(InvalidConfigError, match="schema"):
        OPENERS[opener](f"{PG_DSN}?schema=a", schema="b")
    with pytest.raises(InvalidConfigError, match="busy_timeout"):
        OPENERS[opener]("sqlite:///x.db?busy_timeout=1", busy_timeout=2)


# -- passwords ------------------------------------------------------------------------------------


def _no_secret(*texts: str) -> None:
    for text in texts:
        for piece in (SECRET, ENCODED, "s3cr", "Et9x"):
            assert piece not in text, (piece, text)


@pytest.mark.parametrize("url", [
    f"postgresql://postgres:{ENCODED}@127.0.0.1:5432/test",
    f"postgresql://postgres:{SECRET}@127.0.0.1:5432/test",
    f"postgresql://postgres@127.0.0.1:5432/test?password={ENCODED}",
    f"redis://default:{ENCODED}@127.0.0.1:6379/0",
    f"rediss://:{SECRET}@127.0.0.1:6379/0?ttl=5",
])
def test_redacted_form(url: str) -> None:
    """A URL shown as `***` where its password is; one whose password holds an unencoded
    '#' (which parsers cut differently) is refused, saying to percent-encode it."""
    from langgraph_ckpt_ext.core.urls import parse_url, redact

    texts = [redact(url)]
    if SECRET in url:
        with pytest.raises(InvalidConfigError, match="percent-encode") as info:
            parse_url(url)
        texts.append(str(info.value))
    else:
        parsed = parse_url(url)
        texts += [parsed.redacted, repr(parsed), str(parsed)]
    _no_secret(*texts)
    assert all("***" in text for text in texts)


@pytest.mark.postgres
def test_password_never_in_errors_repr_or_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    closed = free_port()
    messages = []
    for url in (f"postgresql://postgres:{ENCODED}@127.0.0.1:5432/test?bogus_opt=1&schema=@x",
                f"postgresql://postgres:{SECRET}@127.0.0.1:5432/test?key_prefix=a",
                f"redis://default:{ENCODED}@127.0.0.1:6379/0?key_prefx=a",
                f"redis://default:{ENCODED}@127.0.0.1:{closed}/0",
                f"postgresql://postgres:{ENCODED}@127.0.0.1:{closed}/test",
                f"postgresql://postgres@127.0.0.1:{closed}/test?password={ENCODED}",
                f"mysql://u:{ENCODED}@127.0.0.1/x"):
        with pytest.raises(Exception) as info:
            connect(url)
        messages.append(f"{info.value} {info.value!r} {info.value.__cause__!r}")
    _no_secret(*messages, *(r.getMessage() for r in caplog.records), caplog.text)
    schema = f"lgx_test_{uuid.uuid4().hex[:12]}"
    try:
        with connect(f"postgresql://postgres:{ENCODED}@127.0.0.1:5432/test?schema={schema}"
                     ) as cp:
            assert "postgres:***@127.0.0.1:5432/test" in repr(cp)
            _no_secret(repr(cp), str(cp))
    finally:
        drop_pg_schemas(schema)
    with connect(f"redis://default:{ENCODED}@127.0.0.1:6379/0?ttl=5", setup=False) as rcp:
        _no_secret(repr(rcp))
        assert "redis://default:***@127.0.0.1:6379/0" in repr(rcp)
    _no_secret(*(r.getMessage() for r in caplog.records), caplog.text)


def test_official_source_redacts_with_the_one_redactor() -> None:
    from langgraph_ckpt_ext.transfer.official import open_official

    closed = free_port()
    for url in (f"postgresql://postgres@127.0.0.1:{closed}/test?password={ENCODED}",
                f"postgresql://postgres:{SECRET}@127.0.0.1:{closed}/test",
                f"mysql://u:{ENCODED}@127.0.0.1/x"):
        with pytest.raises((StoreUnavailableError, InvalidConfigError)) as info, \
                open_official(url):
            pass
        _no_secret(str(info.value))


def test_replica_urls_parsed_up_front(in_tmp: Path) -> None:
    primary = InMemoryCheckpointer()
    with pytest.raises(InvalidConfigError, match=r"sqlite:///rel\.db"):
        ReplicatedCheckpointer(primary, ["sqlite://rel.db"])
    with pytest.raises(InvalidConfigError, match="'timeout'"):
        ReplicatedCheckpointer(primary, ["sqlite:///r.db?timeout=5"])
    for bad in (f"mysql://u:{ENCODED}@127.0.0.1/x", (f"ftp://u:{ENCODED}@h/x", {})):
        with pytest.raises(InvalidConfigError) as info:
            ReplicatedCheckpointer(primary, [bad])  # type: ignore[list-item]
        _no_secret(str(info.value))
    assert list(in_tmp.iterdir()) == []


# -- with / async with ------------------------------------------------------------------------


def _fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def _released(threads: set[threading.Thread], fds: set[str]) -> None:
    """Every thread started and every file descriptor opened since is gone (a closing thread
    may take a moment to end)."""
    for _ in range(200):
        extra_threads = set(threading.enumerate()) - threads
        extra_fds = _fds() - fds
        if not extra_threads and not extra_fds:
            return
        time.sleep(0.05)
    raise AssertionError(f"left open: {extra_threads} fds {extra_fds}")


BACKENDS = ["memory", "sqlite", "postgres", "redis"]


def _factory(backend: str, tmp_path: Path) -> tuple[Any, str, Callable[[], None]]:
    """The backend's class, a connection string for it, and the cleanup of what it stored."""
    if backend == "memory":
        return InMemoryCheckpointer, "memory://", lambda: None
    if backend == "sqlite":
        return SQLiteCheckpointer, str(tmp_path / "ckpt.db"), lambda: None
    if backend == "postgres":
        schema = f"lgx_test_{uuid.uuid4().hex[:12]}"
        return PostgresCheckpointer, f"{PG_DSN}?schema={schema}", lambda: drop_pg_schemas(schema)
    prefix = f"lgxtest-{uuid.uuid4().hex[:12]}"
    return (RedisCheckpointer, f"{REDIS_URL}?key_prefix={prefix}",
            lambda: drop_redis_prefixes(prefix))


def _url(backend: str, conn: str) -> str:
    return f"sqlite:///{conn}" if backend == "sqlite" else conn


def _warm_up(backend: str, tmp_path: Path) -> None:
    """Open and close once, so that what lives for the process (drivers' caches, the Redis
    cluster probe) is there before the resources are counted."""
    cls, conn, clean = _factory(backend, tmp_path / "warm")
    (tmp_path / "warm").mkdir()
    with cls.from_conn_string(conn) as cp:
        cp.get_tuple(conf("warm"))
    clean()


@pytest.mark.parametrize("backend", params(BACKENDS))
def test_from_conn_string_with(backend: str, tmp_path: Path) -> None:
    _warm_up(backend, tmp_path)
    cls, conn, clean = _factory(backend, tmp_path)
    threads, fds = set(threading.enumerate()), _fds()
    try:
        with cls.from_conn_string(conn) as cp:
            assert isinstance(cp, cls)
            graph = chat_graph().compile(checkpointer=cp)
            graph.invoke({"messages": [human("hi")]}, conf("t"))
            assert len(graph.get_state(conf("t")).values["messages"]) == 2
        _released(threads, fds)
    finally:
        clean()


@pytest.mark.parametrize("backend", params(BACKENDS))
def test_from_conn_string_async_with(backend: str, tmp_path: Path) -> None:
    _warm_up(backend, tmp_path)
    cls, conn, clean = _factory(backend, tmp_path)
    threads, fds = set(threading.enumerate()), _fds()

    async def run() -> None:
        async with cls.from_conn_string(conn) as cp:
            graph = chat_graph().compile(checkpointer=cp)
            await graph.ainvoke({"messages": [human("hi")]}, conf("t"))
            assert len((await graph.aget_state(conf("t"))).values["messages"]) == 2

    try:
        asyncio.run(run())
        _released(threads, fds)
    finally:
        clean()


@pytest.mark.parametrize("backend", params(BACKENDS))
@pytest.mark.parametrize("wrapper", ["smart", "replicated"])
def test_wrappers_from_conn_string(backend: str, wrapper: str, tmp_path: Path) -> None:
    """`with` and `async with` on each wrapper's `from_conn_string`: it opens the inner
    checkpointer from the URL and closes it on exit."""
    _warm_up(backend, tmp_path)
    _, conn, clean = _factory(backend, tmp_path)
    url = _url(backend, conn)
    replica = f"sqlite:///{tmp_path / 'replica.db'}"

    def opened() -> Any:
        if wrapper == "smart":
            return SmartCheckpointer.from_conn_string(url)
        return ReplicatedCheckpointer.from_conn_string(url, [replica])

    threads, fds = set(threading.enumerate()), _fds()
    try:
        with opened() as cp:
            assert isinstance(cp, SmartCheckpointer | ReplicatedCheckpointer)
            chat_graph().compile(checkpointer=cp).invoke({"messages": [human("hi")]}, conf("t"))
        _released(threads, fds)

        async def run() -> None:
            async with opened() as cp:
                graph = chat_graph().compile(checkpointer=cp)
                await graph.ainvoke({"messages": [human("again")]}, conf("t"))
                state = await graph.aget_state(conf("t"))
                if backend != "memory":  # a memory store lives as long as its object
                    assert len(state.values["messages"]) == 4

        asyncio.run(run())
        _released(threads, fds)
        if wrapper == "replicated":
            with SQLiteCheckpointer.from_conn_string(tmp_path / "replica.db") as r:
                assert r.thread_ids() == ["t"]
    finally:
        clean()


def test_from_conn_string_bad_url_opens_nothing(in_tmp: Path) -> None:
    with pytest.raises(InvalidConfigError, match=r"sqlite:///rel\.db"), \
            SmartCheckpointer.from_conn_string("sqlite://rel.db"):
        pass
    assert list(in_tmp.iterdir()) == []


@pytest.fixture(autouse=True)
def _no_leftover_loop() -> Iterator[None]:
    yield
    asyncio.set_event_loop(None)
