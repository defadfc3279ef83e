"""`RedisCheckpointer`: plain Redis 6+ (no modules) or Redis Cluster, with per-thread TTLs."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from langgraph.checkpoint.serde.base import SerializerProtocol

from ...core.appendlog import DEFAULT_MAX_BYTES
from ...core.bridge import Bridge
from ...core.errors import require
from ...core.keys import KeyProvider
from ...core.opening import Opening, set_up
from ...core.retention import Retention
from ...core.saver import DEFAULT_TOMBSTONE_TTL, loading_serde
from ...core.sealing import Compression, Encryption
from ...core.telemetry import Telemetry
from ...core.urls import parse_url, reads_url, redact
from ...migrations import SchemaChain
from ..checkpointer import Checkpointer

require("redis", "redis")

from .layout import check_prefix  # noqa: E402
from .store import DEFAULT_WAIT_TIMEOUT, Client, RedisStore  # noqa: E402

__all__ = ["RedisCheckpointer"]


class RedisCheckpointer(Checkpointer):
    """Checkpoints in Redis, with no module needed, standalone or Cluster.

    Every key of a thread carries the thread's hash tag, so a thread lives in one slot and each
    operation is one server-side script: a put is atomic, and a reader never sees half of one.
    With `ttl`, every write gives all of the thread's keys one deadline, so a thread expires
    whole; `pin()` exempts a thread.

    Two ways to let threads go, which can be used together: `ttl` is Redis's own expiry of
    the keys (no sweeper needed, idle time since the last write only, the thread deleted
    whole); `retention` is the sweeper's policy (`sweep`, or `sweep_every`), as on every
    backend (idle or absolute age, a date, `keep_latest`, a history cap, per-thread
    policies, paused threads spared). A sweep also drops the index entries of threads gone
    by `ttl`. `pin()` exempts a thread from both.

    Args:
        conn: a URL (`redis://host:6379/0`, `rediss://...`, or
            `redis+sentinel://host:26379,host:26380/service/0` for the master the sentinels
            name, followed across failovers) or a `redis.asyncio.Redis` /
            `redis.asyncio.cluster.RedisCluster` client the caller owns (created with
            `decode_responses=False`, the default; it stays open when the checkpointer closes),
            such as `redis.asyncio.sentinel.Sentinel(...).master_for(service)`.
        ttl: seconds a thread lives after its last write: Redis expires its keys (None: no
            expiry).
        refresh_on_read: reading a thread (`get_tuple`, `list`) refreshes its TTL too.
        key_prefix: the first part of every key: separate apps or tenants on one server.
        cluster: a URL is a Redis Cluster (None: ask the server).
        serde: serializer for every stored value (default: LangGraph's, strict); one given
            is made strict too (`loading_serde`), or refused if it cannot be.
        unsafe_allow_any_class: use `serde` as given, even where stored bytes may construct
            any class through it (whoever can write to the storage can then run code here).
        snapshot_every: full value of an append-grown list at least every N versions.
        append_log_bytes: memory kept of list channels' last stored values, so that a put
            stores only the items appended (64 MiB by default; past it the least recently
            written list is dropped, and stored whole at its next put; 0: none kept).
        setup: record the key layout's version now (URL only; idempotent).
        schema_chain: the state schema's version and upcasters (`SchemaChain`): see
            `migrate_threads`.
        audit: turn auditing on for the store, recorded in it (every checkpointer writing to
            it then seals each checkpoint; False turns nothing off): see `verify`,
            `enable_audit` and `disable_audit`.
        retention: the retention policy of threads without their own (`Retention`, or
            LangGraph Platform's `checkpointer.ttl` mapping), applied by `sweep`: see there.
            Independent of `ttl`.
        sweep_every: seconds between background sweeps (None: sweep when asked).
        writers: `"single"` (default): a run's checkpoint is refused (`ConcurrentWriteError`,
            nothing stored) when another run wrote the thread since this run read it, decided
            in the write's own script, so that two processes never both pass against one head
            (standalone or Cluster); `"last_wins"`: no such check (LangGraph's behaviour). See
            `StoreCheckpointer`, and `RedisStore` for how a writer epoch is checked in Cluster.
        tombstone_ttl: seconds a deleted thread's tombstone refuses late writes (default a
            day; None: none left). The sweep drops older ones by the checkpointer's clock;
            the tombstone key also carries this as a native TTL, so one outlives no sweep.
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
        wait_replicas: after each write that changes checkpoints (put, put_writes, deletes),
            wait for this many replicas to acknowledge it (Redis's `WAIT`, on the connection
            that wrote); fewer in time raises `ReplicaAckError`, the write then being on the
            master only (0: no wait; not with Cluster).
        wait_timeout: seconds a write waits for those replicas (default 1).
        client_options: passed to `redis.asyncio.Redis.from_url` (or `RedisCluster.from_url`);
            `socket_connect_timeout` defaults to 5 s.

    Example:
        >>> async with RedisCheckpointer.from_conn_string("redis://localhost:6379", ttl=3600) as cp:
        ...     graph = builder.compile(checkpointer=cp)  # doctest: +SKIP
    """

    db_system = "redis"

    @reads_url("redis")
    def __init__(
        self,
        conn: str | Client,
        *,
        ttl: float | None = None,
        refresh_on_read: bool = False,
        key_prefix: str = "lgckpt",
        cluster: bool | None = None,
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
        wait_replicas: int = 0,
        wait_timeout: float = DEFAULT_WAIT_TIMEOUT,
        **client_options: Any,
    ) -> None:
        # Refused before any connection opens; the serializer then goes in as it is.
        serde = loading_serde(serde, unsafe_allow_any_class=unsafe_allow_any_class)
        bridge = Bridge(f"lgckpt-{type(self).__name__}")
        given = not isinstance(conn, str)
        if isinstance(conn, str):
            self._where = redact(conn) + f" key_prefix={key_prefix}"
        store = RedisStore(
            prefix=check_prefix(key_prefix),
            ttl=ttl,
            refresh_on_read=refresh_on_read,
            url=None if given else conn,
            client=conn if given else None,
            cluster=cluster,
            is_private_loop=lambda loop: loop is bridge.current_loop,
            client_options=client_options,
            wait_replicas=wait_replicas,
            wait_timeout=wait_timeout,
        )
        super().__init__(
            store, serde=serde, snapshot_every=snapshot_every,
            append_log_bytes=append_log_bytes, bridge=bridge,
            schema_chain=schema_chain, audit=audit, unsafe_allow_any_class=unsafe_allow_any_class,
            retention=retention, sweep_every=sweep_every, writers=writers,
            tombstone_ttl=tombstone_ttl, redact_metadata=redact_metadata,
            encryption=encryption, compression=compression, audit_keys=audit_keys,
            telemetry=telemetry,
        )
        if self._tombstone_ttl is not None:
            store.tombstone_ttl_ms = max(1, int(self._tombstone_ttl * 1000))
        if setup and not given:
            self._setup_or_close()

    @classmethod
    def from_conn_string(cls, url: str, **kwargs: Any) -> Opening[RedisCheckpointer]:
        """Connect, record the layout version, yield the checkpointer, close its clients on
        exit: `with` for sync graph calls, `async with` for async ones.

        Args:
            url: a `redis://`, `rediss://` or `redis+sentinel://` URL, with our query options
                (`key_prefix`, `ttl`, `wait_replicas`, `wait_timeout`, `writers`,
                `tombstone_ttl`; see `connect`) and redis-py's.
            kwargs: as for the constructor.

        Example:
            >>> url = "redis://localhost?ttl=3600"
            >>> with RedisCheckpointer.from_conn_string(url) as cp:  # doctest: +SKIP
            ...     graph = builder.compile(checkpointer=cp)
        """
        conn, kwargs = parse_url(url).arguments(kwargs, backend="redis")

        async def aopen() -> RedisCheckpointer:
            saver = cls(conn, **{**kwargs, "setup": False})
            return await set_up(saver, kwargs.get("setup", True))

        return Opening(lambda: cls(conn, **kwargs), aopen)

    @property
    def store(self) -> RedisStore:
        return self._raw_store  # type: ignore[return-value]

    @property
    def ttl(self) -> float | None:
        """Seconds a thread lives after its last write (None: no expiry)."""
        ms = self.store.ttl_ms
        return None if ms is None else ms / 1000

    async def athread_keys(self, thread_id: str) -> list[str]:
        """The keys holding a thread (those that exist), e.g. for `MEMORY USAGE`."""
        return await self.store.existing_keys(str(thread_id))

    def thread_keys(self, thread_id: str) -> list[str]:
        return self.run_sync(self.athread_keys(thread_id))
