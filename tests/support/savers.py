"""The one way tests build a checkpointer: a backend (memory, sqlite, sqlite-memory, postgres,
redis, redis-cluster), alone or under a wrapper (smart, replicated), for sync tests
(`open_saver`) and async ones (`asaver`). Each returns a `SaverHandle`: the saver, where its
storage lives (URL, schema, key prefix, file) and the cleanup of that storage. Nothing is
stored on the checkpointer objects themselves.

PostgreSQL and Redis are the servers on this machine; `LGCKPT_TEST_PG_DSN` and
`LGCKPT_TEST_REDIS_URL` point the tests elsewhere. A server that does not answer fails the
tests that need it, unless the run says `LGCKPT_TEST_SERVERS=optional` (see `unless_reachable`)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from langgraph_ckpt_ext import (
    InMemoryCheckpointer,
    PostgresCheckpointer,
    RedisCheckpointer,
    ReplicatedCheckpointer,
    SmartCheckpointer,
    SQLiteCheckpointer,
)
from langgraph_ckpt_ext.core.saver import StoreCheckpointer

PG_DSN = os.environ.get("LGCKPT_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("LGCKPT_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")

BACKENDS = ["memory", "sqlite", "sqlite-memory", "postgres", "redis", "redis-cluster"]
PERSISTENT = {"sqlite", "postgres", "redis", "redis-cluster"}
"""Backends whose storage outlives the checkpointer object."""

# -- the servers: which backend needs which, reachable or not --------------------------------------

SERVERS = {"postgres": ("PostgreSQL", PG_DSN, 5432), "redis": ("Redis", REDIS_URL, 6379)}


def servers_of(kind: str) -> set[str]:
    """The servers (marker names: postgres, redis) a backend or a wrapped kind needs: the
    backends after the last colon, joined by "+" ("smart-events:redis", "replicated:postgres+
    sqlite")."""
    backends = kind.rpartition(":")[2].split("+")
    return {s for s in ("postgres", "redis") for b in backends if b.startswith(s)}


def param(kind: str, *also: str) -> Any:
    """`kind` as a parametrize value, marked with the servers it (and the backends `also`, for
    example a wrapper's replicas) needs."""
    servers = set().union(*map(servers_of, (kind, *also)))
    return pytest.param(kind, id=kind, marks=[getattr(pytest.mark, s) for s in sorted(servers)])


def params(kinds: Sequence[str]) -> list[Any]:
    return [param(k) for k in kinds]


_probed: dict[str, str | None] = {}


def unreachable(server: str) -> str | None:
    """Why `server` (postgres, redis) cannot be used, or None if it answers a TCP connect.
    Probed once per process, with a short timeout."""
    if server not in _probed:
        name, url, default_port = SERVERS[server]
        parts = urlsplit(url)
        host, port = parts.hostname or "127.0.0.1", parts.port or default_port
        try:
            socket.create_connection((host, port), timeout=1.0).close()
            _probed[server] = None
        except OSError as exc:
            _probed[server] = f"{name} not reachable at {host}:{port}: {exc}"
    return _probed[server]


_marks_of_current_test: set[str] | None = None


def set_current_marks(marks: set[str] | None) -> None:
    """(conftest) the markers of the test now running, for `require`."""
    global _marks_of_current_test
    _marks_of_current_test = marks


def require(server: str) -> None:
    """A test is about to use `server`: it must carry the marker, and the server must answer
    (otherwise the test is skipped, with the reason)."""
    if _marks_of_current_test is not None and server not in _marks_of_current_test:
        raise AssertionError(f"this test uses {SERVERS[server][0]} but is not marked "
                             f"@pytest.mark.{server}")
    unless_reachable(server)


def unless_reachable(server: str) -> None:
    """Stop a test that needs `server` when it does not answer: failed with the reason, so
    that no run passes by skipping what it did not test. Only a developer's run that says so
    (`LGCKPT_TEST_SERVERS=optional`: no servers on this machine) skips these tests instead,
    with the reason; `scripts/test.sh`, `.ci/run` and CI never do."""
    reason = unreachable(server)
    if reason is None:
        return
    if os.environ.get("LGCKPT_TEST_SERVERS") != "optional":
        pytest.fail(f"{reason} (set LGCKPT_TEST_SERVERS=optional to skip the tests that need "
                    "it on a machine without it)", pytrace=False)
    pytest.skip(reason)


# -- storage names and their cleanup --------------------------------------------------------------


def pg_schema() -> str:
    """A schema of its own for one test: tests never see each other's rows."""
    require("postgres")
    return f"lgx_test_{uuid.uuid4().hex[:12]}"


def unique_prefix() -> str:
    """A Redis key prefix no other test uses (for a server that may not exist)."""
    return f"lgxtest-{uuid.uuid4().hex[:12]}"


def redis_prefix() -> str:
    """A key prefix of its own for one test, on the shared server."""
    require("redis")
    return unique_prefix()


_END_HOLDERS = """
SELECT pg_terminate_backend(l.pid) FROM pg_locks l
JOIN pg_class c ON c.oid = l.relation JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND l.granted AND l.pid <> pg_backend_pid()"""


def drop_pg_schemas(*schemas: str) -> None:
    import asyncpg

    async def drop() -> None:
        conn = await asyncpg.connect(PG_DSN, server_settings={"lock_timeout": "5s"})
        try:
            for schema in schemas:
                for _ in range(3):
                    try:
                        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
                        break
                    except asyncpg.LockNotAvailableError:
                        # A session a test left behind on purpose (an event loop closed in
                        # the middle of a query) holds locks in this test's own schema.
                        await conn.execute(_END_HOLDERS, schema)
        finally:
            await conn.close()

    asyncio.run(drop())


def drop_redis_prefixes(*prefixes: str, url: str = REDIS_URL) -> int:
    """Delete every key under these prefixes (tests only: SCAN is fine here); how many."""
    import redis

    client = redis.Redis.from_url(url)
    n = 0
    try:
        for prefix in prefixes:
            for key in client.scan_iter(match=f"{prefix}:*", count=1000):
                n += client.delete(key)
    finally:
        client.close()
    return n


_cluster: contextlib.ExitStack | None = None
_cluster_url: str | None = None


def redis_cluster_url() -> str:
    """A Redis Cluster of three masters for this test process, started on first use (on free
    loopback ports) and stopped by `stop_redis_cluster` when the session ends."""
    global _cluster, _cluster_url
    require("redis")
    if _cluster_url is None:
        from tests.support.redis_servers import redis_cluster

        _cluster = contextlib.ExitStack()
        _cluster_url = _cluster.enter_context(redis_cluster(3)).url
    return _cluster_url


def stop_redis_cluster() -> None:
    global _cluster, _cluster_url
    if _cluster is not None:
        _cluster.close()
        _cluster = _cluster_url = None


# -- the handle --------------------------------------------------------------------------------


@dataclass
class SaverHandle:
    """A test's checkpointer and its storage. `saver` is what the test drives (the backend's
    saver, or a wrapper over it); `inner` the backend's saver; `close()` closes both and drops
    the storage this handle created (PostgreSQL schema, Redis keys of its prefix, SQLite file)."""

    backend: str
    saver: Any
    inner: StoreCheckpointer
    directory: Path
    url: str | None = None  # the server's URL (postgres, redis, redis-cluster)
    schema: str | None = None  # postgres
    prefix: str | None = None  # redis, redis-cluster
    path: Path | None = None  # sqlite (a file)
    replicas: list[SaverHandle] = field(default_factory=list)  # a replicated wrapper's
    owns_path: bool = True  # False when the SQLite file was there before this handle

    def options(self) -> dict[str, Any]:
        """The constructor options naming this storage (schema, key prefix)."""
        if self.schema is not None:
            return {"schema": self.schema}
        if self.prefix is not None:
            return {"key_prefix": self.prefix}
        return {}

    def reopen(self, **options: Any) -> StoreCheckpointer:
        """A new checkpointer of the same backend over this storage (a persistent backend),
        given `options`; the caller closes it, the storage stays this handle's."""
        return _backend_saver(self.backend, self.directory, {**self.options(), **options})[0]

    def store_url(self) -> str:
        """The URL naming this storage, as the CLI and `connect` take it."""
        if self.backend == "sqlite":
            return f"sqlite:///{self.path}"
        if self.schema is not None:
            return f"{self.url}?schema={self.schema}"
        if self.prefix is not None:
            return f"{self.url}?key_prefix={self.prefix}"
        raise ValueError(f"{self.backend} has no URL")

    def replica_spec(self) -> Any:
        """This storage as a replica given by URL (with options), for the replicator process."""
        if self.backend == "sqlite":
            return f"sqlite:///{self.path}"
        return (self.url, self.options())

    def redis_client(self) -> Any:
        """A sync client of the server (or cluster) this Redis storage lives on."""
        import redis
        from redis.cluster import RedisCluster

        if self.backend == "redis-cluster":
            return RedisCluster.from_url(self.url)
        return redis.Redis.from_url(self.url)

    def close_savers(self) -> None:
        """Close the wrapper (if any), the backend's saver and the replicas' (closing twice is
        harmless)."""
        if self.saver is not self.inner:
            self.saver.close()
        self.inner.close()
        for replica in self.replicas:
            replica.close_savers()

    def cleanup(self) -> None:
        """Drop what this handle stored (a cluster's keys go with the cluster at the end of the
        session)."""
        for replica in self.replicas:
            replica.cleanup()
        if self.backend == "postgres" and self.schema:
            drop_pg_schemas(self.schema)
        elif self.backend == "redis" and self.prefix:
            drop_redis_prefixes(self.prefix, url=self.url or REDIS_URL)
        elif self.path is not None and self.owns_path:
            for suffix in ("", "-wal", "-shm", "-journal"):
                Path(f"{self.path}{suffix}").unlink(missing_ok=True)

    def close(self) -> None:
        self.close_savers()
        self.cleanup()

    def __enter__(self) -> SaverHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _backend_saver(backend: str, directory: Path, options: dict[str, Any]
                   ) -> tuple[StoreCheckpointer, dict[str, Any]]:
    """A backend's saver made with its constructor, and the handle fields naming its storage."""
    if backend == "memory":
        return InMemoryCheckpointer(**options), {}
    if backend == "sqlite":
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / "ckpt.db"
        fields = {"path": path, "owns_path": not path.exists()}
        return SQLiteCheckpointer(path, **options), fields
    if backend == "sqlite-memory":
        return SQLiteCheckpointer(":memory:", **options), {}
    if backend == "postgres":
        schema = options.pop("schema", None) or pg_schema()
        require("postgres")
        return (PostgresCheckpointer(PG_DSN, schema=schema, **options),
                {"url": PG_DSN, "schema": schema})
    if backend in ("redis", "redis-cluster"):
        prefix = options.pop("key_prefix", None) or redis_prefix()
        require("redis")
        url = REDIS_URL if backend == "redis" else redis_cluster_url()
        return (RedisCheckpointer(url, key_prefix=prefix, **options),
                {"url": url, "prefix": prefix})
    raise ValueError(backend)


def open_saver(
    backend: str,
    directory: Path,
    *,
    wrapper: str | None = None,
    policy: Any = None,
    replicas: Sequence[str] = (),
    replica_urls: bool = False,
    wrapper_options: Mapping[str, Any] | None = None,
    **options: Any,
) -> SaverHandle:
    """A checkpointer of `backend` over fresh storage (a SQLite file in `directory`, a schema
    or key prefix of its own), given `options`; under a `wrapper`:

    - "smart": a SmartCheckpointer with `policy` (None: its default);
    - "replicated": a ReplicatedCheckpointer over it and a replica of each backend in
      `replicas` (each in a subdirectory; given as URLs when `replica_urls`, for the
      replicator process), with `wrapper_options` (consistency, quorum, ...).
    """
    inner, fields = _backend_saver(backend, directory, dict(options))
    handle = SaverHandle(backend, inner, inner, directory, **fields)
    if wrapper == "smart":
        handle.saver = SmartCheckpointer(inner, policy)
    elif wrapper == "replicated":
        for i, kind in enumerate(replicas):
            handle.replicas.append(open_saver(kind, directory / f"replica-{i}"))
        specs = [r.replica_spec() if replica_urls else r.saver for r in handle.replicas]
        handle.saver = ReplicatedCheckpointer(inner, specs, **(wrapper_options or {}))
    elif wrapper is not None:
        raise ValueError(wrapper)
    return handle


@contextlib.contextmanager
def saver_handle(backend: str, directory: Path, **kw: Any) -> Iterator[SaverHandle]:
    """`open_saver` as a context manager: closed and cleaned up at the end."""
    handle = open_saver(backend, directory, **kw)
    try:
        yield handle
    finally:
        handle.close()


@contextlib.asynccontextmanager
async def asaver(
    backend: str,
    directory: Path,
    *,
    construct: str = "from_conn_string",
    wrapper: str | None = None,
    policy: Any = None,
    replicas: Sequence[str] = (),
    wrapper_options: Mapping[str, Any] | None = None,
    **options: Any,
) -> AsyncIterator[SaverHandle]:
    """The async twin of `open_saver`, opened and closed from the test's event loop. The
    backend's saver is made by `construct`: "from_conn_string" (the class's async context
    manager), "init" (the plain constructor, closed with `aclose`) or, for Redis, "client"
    (over an asyncio client the test owns). Wrappers are entered with `async with`."""
    async with contextlib.AsyncExitStack() as stack:
        handle = await stack.enter_async_context(
            _abackend(backend, directory, construct, options))
        if wrapper == "smart":
            handle.saver = await stack.enter_async_context(SmartCheckpointer(handle.inner, policy))
        elif wrapper == "replicated":
            for i, kind in enumerate(replicas):
                handle.replicas.append(await stack.enter_async_context(
                    _abackend(kind, directory / f"replica-{i}", construct, {})))
            handle.saver = await stack.enter_async_context(ReplicatedCheckpointer(
                handle.inner, [r.saver for r in handle.replicas], **(wrapper_options or {})))
        elif wrapper is not None:
            raise ValueError(wrapper)
        yield handle


@contextlib.asynccontextmanager
async def _abackend(backend: str, directory: Path, construct: str, options: dict[str, Any]
                    ) -> AsyncIterator[SaverHandle]:
    options = dict(options)
    fields: dict[str, Any] = {}
    made: list[SaverHandle] = []
    async with contextlib.AsyncExitStack() as stack:
        # first in, so last out: the storage is dropped once the saver (and client) closed
        stack.push_async_callback(asyncio.to_thread, lambda: [h.cleanup() for h in made])
        if backend == "memory":
            cp: Any = InMemoryCheckpointer(**options)
        elif construct == "client":  # a Redis client the test owns, closed after the saver
            import redis.asyncio as aredis

            fields = {"url": REDIS_URL, "prefix": options.pop("key_prefix", None) or redis_prefix()}
            client = aredis.Redis.from_url(REDIS_URL)
            stack.push_async_callback(client.aclose)
            cp = RedisCheckpointer(client, key_prefix=fields["prefix"], **options)
            stack.push_async_callback(cp.aclose)
            await cp.asetup()
        else:
            if backend in ("sqlite", "sqlite-memory"):
                cls: Any = SQLiteCheckpointer
                directory.mkdir(parents=True, exist_ok=True)
                path = directory / "ckpt.db"
                target: Any = path if backend == "sqlite" else ":memory:"
                if backend == "sqlite":
                    fields = {"path": path, "owns_path": not path.exists()}
            elif backend == "postgres":
                cls, target = PostgresCheckpointer, PG_DSN
                fields = {"url": PG_DSN, "schema": options.pop("schema", None) or pg_schema()}
                options["schema"] = fields["schema"]
            elif backend in ("redis", "redis-cluster"):
                cls = RedisCheckpointer
                target = REDIS_URL if backend == "redis" else redis_cluster_url()
                fields = {"url": target, "prefix": options.pop("key_prefix", None) or redis_prefix()}
                options["key_prefix"] = fields["prefix"]
            else:
                raise ValueError(backend)
            if construct == "from_conn_string":
                cp = await stack.enter_async_context(cls.from_conn_string(target, **options))
            elif construct == "init":
                cp = cls(target, **options)
                stack.push_async_callback(cp.aclose)
            else:
                raise ValueError(construct)
        made.append(SaverHandle(backend, cp, cp, directory, **fields))
        yield made[0]
