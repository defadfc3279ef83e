"""`PostgresCheckpointer`: PostgreSQL through asyncpg, for many workers on many machines."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from langgraph.checkpoint.serde.base import SerializerProtocol

from ...core.appendlog import DEFAULT_MAX_BYTES
from ...core.errors import InvalidConfigError, StoreUnavailableError, require
from ...core.keys import KeyProvider
from ...core.opening import Opening, set_up
from ...core.retention import Retention
from ...core.saver import DEFAULT_TOMBSTONE_TTL, loading_serde
from ...core.sealing import Compression, Encryption
from ...core.telemetry import Telemetry
from ...core.urls import parse_url, reads_url, redact
from ...migrations import SchemaChain
from ..checkpointer import Checkpointer

require("asyncpg", "postgres")

import asyncpg  # noqa: E402

from .store import PostgresStore  # noqa: E402

__all__ = ["PostgresCheckpointer", "StoreUnavailableError"]

_SCHEMA = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


class PostgresCheckpointer(Checkpointer):
    """Checkpoints in PostgreSQL, on asyncpg pools.

    Requests from many coroutines run on many pool connections at once; a put is one
    transaction. A lost connection (a restarted server) is retried, then raises
    `StoreUnavailableError`; the checkpointer keeps working once the server is back.

    Args:
        conn: a DSN (`postgresql://user@host/db`), or an `asyncpg.Pool` the caller owns (then
            call `await checkpointer.asetup()` once, and use it from that pool's event loop, or
            pass `dsn=` as well so that sync calls can open a pool of their own).
        schema: keep the tables in this schema (created by `setup()`), e.g. one per tenant.
        serde: serializer for every stored value (default: LangGraph's, strict); one given
            is made strict too (`loading_serde`), or refused if it cannot be.
        unsafe_allow_any_class: use `serde` as given, even where stored bytes may construct
            any class through it (whoever can write to the storage can then run code here).
        snapshot_every: full value of an append-grown list at least every N versions.
        append_log_bytes: memory kept of list channels' last stored values, so that a put
            stores only the items appended (64 MiB by default; past it the least recently
            written list is dropped, and stored whole at its next put; 0: none kept).
        setup: create or migrate the tables now (DSN only; idempotent, safe across processes).
        schema_chain: the state schema's version and upcasters (`SchemaChain`; not to be
            confused with `schema`, the PostgreSQL schema): see `migrate_threads`.
        audit: turn auditing on for the store, recorded in it (every checkpointer writing to
            it then seals each checkpoint; False turns nothing off): see `verify`,
            `enable_audit` and `disable_audit`.
        retention: the retention policy of threads without their own (`Retention`, or
            LangGraph Platform's `checkpointer.ttl` mapping): see `sweep`. Passes of every
            process sharing the schema take turns (a session advisory lock; a killed sweeper's
            lock goes with its session); each holds one pool connection for the pass, so the
            pool needs `max_size` >= 2. Behind PgBouncer in transaction mode that session lock
            is not ours to keep: sweep on a direct connection to the server.
        sweep_every: seconds between background sweeps (None: sweep when asked).
        writers: `"single"` (default): a run's checkpoint is refused (`ConcurrentWriteError`,
            nothing stored) when another run, in any process, wrote the thread since this run
            read it; `"last_wins"`: no such check (LangGraph's savers' behaviour). See
            `StoreCheckpointer`. A put that chains onto the thread's head as this process
            expects it stays one round trip; otherwise the facts are read in a transaction.
        tombstone_ttl: seconds a deleted thread's tombstone refuses the late writes of runs
            that read it before the delete (default a day; None: no tombstones).
        redact_metadata: keep secrets out of checkpoint metadata, where LangGraph copies a run's
            `configurable` values: True (default) drops keys such as `api_key`, `token`,
            `password`, `Authorization` (`core.redact`); a list adds key names to those;
            False stores every key.
        encryption: encrypt every stored value, pending write and metadata, bound to its
            row (`Encryption`; the `encryption` extra): see `core.sealing`, `rotate_keys`.
        compression: compress stored values with zstd first (`Compression`, or True; the
            `zstd` extra).
        audit_keys: seal the audit trail with HMAC-SHA256 under these keys (`KeyProvider`;
            separate from the encryption keys), so that it cannot be forged without them:
            see `StoreCheckpointer`, `verify`.
        telemetry: OpenTelemetry spans and metrics (`Telemetry`); None: the global providers
            once configured; False: none. See `StoreCheckpointer`.
        read_replicas: DSNs of read replicas (streaming standbys), or `host:port` entries
            (user, database and options as in `conn`, which must then be a DSN). History
            reads (`list`, `get_state_history`, time travel, `lgckpt` and exports) go to a
            replica, in turn; `get_tuple` (what a run starts from) goes to one only once it
            has replayed this process's last write (its WAL position, noted after each
            commit: one more round trip per write), else to the primary; a replica that
            fails is left out for a few seconds. Every write, and every read that decides
            a write (prune, sweep, erasure), stays on the primary. See
            docs/high-availability.md.
        replica_wait: seconds a `get_tuple` waits for a replica to replay this process's
            last write before it reads from the primary instead (0: never waits).
        pool_options: passed to `asyncpg.create_pool`, e.g. `min_size`, `max_size`. Behind
            PgBouncer in transaction mode pass `statement_cache_size=0`.

    Example:
        >>> async with PostgresCheckpointer.from_conn_string(dsn) as cp:  # doctest: +SKIP
        ...     graph = builder.compile(checkpointer=cp)
    """

    db_system = "postgresql"

    @reads_url("postgres")
    def __init__(
        self,
        conn: str | asyncpg.Pool,
        *,
        dsn: str | None = None,
        schema: str | None = None,
        serde: SerializerProtocol | None = None,
        snapshot_every: int = 256,
        append_log_bytes: int = DEFAULT_MAX_BYTES,
        setup: bool = True,
        schema_chain: SchemaChain | None = None,
        audit: bool = False,
        unsafe_allow_any_class: bool = False,
        retention: Retention | Mapping[str, Any] | None = None,
        sweep_every: float | None = None,
        writers: str = "single",
        tombstone_ttl: float | None = DEFAULT_TOMBSTONE_TTL,
        redact_metadata: bool | Iterable[str] = True,
        encryption: Encryption | None = None,
        compression: Compression | bool | None = None,
        audit_keys: KeyProvider | None = None,
        telemetry: Telemetry | bool | None = None,
        read_replicas: Sequence[str] = (),
        replica_wait: float = 0.5,
        **pool_options: Any,
    ) -> None:
        # Refused before any connection opens; the serializer then goes in as it is.
        serde = loading_serde(serde, unsafe_allow_any_class=unsafe_allow_any_class)
        if schema is not None and not _SCHEMA.match(schema):
            raise InvalidConfigError(f"invalid schema name {schema!r}: use letters, digits, '_'")
        if schema is not None:
            settings = dict(pool_options.pop("server_settings", None) or {})
            settings.setdefault("search_path", schema)
            pool_options["server_settings"] = settings
        if replica_wait < 0:
            raise InvalidConfigError("replica_wait is seconds, 0 or more")
        primary = conn if isinstance(conn, str) else dsn
        replicas = [replica_dsn(primary, r) for r in read_replicas]
        if isinstance(conn, str):
            self._where = redact(conn) + (f" schema={schema}" if schema else "")
            store = PostgresStore(dsn=conn, pool_options=pool_options, schema=schema,
                                  read_replicas=replicas, replica_wait=replica_wait)
        else:
            store = PostgresStore(dsn=dsn, pool=conn, pool_options=pool_options, schema=schema,
                                  read_replicas=replicas, replica_wait=replica_wait)
            setup = False
        super().__init__(
            store, serde=serde, snapshot_every=snapshot_every,
            append_log_bytes=append_log_bytes, schema_chain=schema_chain,
            audit=audit, unsafe_allow_any_class=unsafe_allow_any_class,
            retention=retention, sweep_every=sweep_every, writers=writers,
            tombstone_ttl=tombstone_ttl, redact_metadata=redact_metadata,
            encryption=encryption, compression=compression, audit_keys=audit_keys,
            telemetry=telemetry,
        )
        if setup:
            self._setup_or_close()

    @classmethod
    def from_conn_string(cls, conn_string: str, **kwargs: Any) -> Opening[PostgresCheckpointer]:
        """Open a pool, create or migrate the tables, yield the checkpointer, close the pool on
        exit: `with` for sync graph calls, `async with` for async ones (the pool then on the
        running event loop).

        Args:
            conn_string: a DSN, with our query options (`schema`, `min_size`, `max_size`,
                `writers`, `tombstone_ttl`; see `connect`) and asyncpg's.
            kwargs: as for the constructor.

        Example:
            >>> with PostgresCheckpointer.from_conn_string(dsn + "?schema=app") as cp:  # doctest: +SKIP
            ...     graph = builder.compile(checkpointer=cp)
        """
        dsn, kwargs = parse_url(conn_string).arguments(kwargs, backend="postgres")
        kwargs["serde"] = loading_serde(  # refused before the pool opens
            kwargs.get("serde"), unsafe_allow_any_class=kwargs.get("unsafe_allow_any_class", False))

        async def aopen() -> PostgresCheckpointer:
            saver = cls(dsn, **{**kwargs, "setup": False})
            return await set_up(saver, kwargs.get("setup", True))

        return Opening(lambda: cls(dsn, **kwargs), aopen)

    @property
    def store(self) -> PostgresStore:
        return self._raw_store  # type: ignore[return-value]


def replica_dsn(primary: str | None, replica: str) -> str:
    """A replica's DSN: `replica` itself if it is one, else (`host:port`) the primary's DSN
    with that host in place of its own (or its list of hosts), less `target_session_attrs`
    (a standby is never read-write).

    Example:
        >>> replica_dsn("postgresql://app@h1:5432,h2:5432/db?sslmode=require&"
        ...             "target_session_attrs=read-write", "h3:5433")
        'postgresql://app@h3:5433/db?sslmode=require'
    """
    if "://" in replica:
        return replica
    if not primary:
        raise InvalidConfigError(
            f"read replica {replica!r} is a host: give it as a DSN, or give the primary's")
    scheme, _, rest = primary.partition("://")
    netloc, slash, tail = rest.partition("/")
    user, at, _ = netloc.rpartition("@")
    path, _, query = tail.partition("?")
    kept = [p for p in query.split("&") if p and not p.startswith("target_session_attrs=")]
    query = "&".join(kept)
    return f"{scheme}://{user}{at}{replica}{slash}{path}{'?' if query else ''}{query}"
