"""`SQLiteCheckpointer`: the embedded default, one file (or `":memory:"`) through aiosqlite."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import time
from collections.abc import Iterable, Mapping
from typing import Any

import aiosqlite
from langgraph.checkpoint.serde.base import SerializerProtocol

from ...core.appendlog import DEFAULT_MAX_BYTES
from ...core.bridge import Bridge
from ...core.guard import check_writers
from ...core.keys import KeyProvider
from ...core.opening import Opening, set_up
from ...core.retention import Retention
from ...core.saver import DEFAULT_TOMBSTONE_TTL, check_tombstone_ttl, loading_serde
from ...core.sealing import Compression, Encryption
from ...core.telemetry import Telemetry
from ...core.urls import parse_url, reads_url
from ...migrations import SchemaChain
from ..checkpointer import Checkpointer
from .store import SQLiteStore

__all__ = ["SQLiteCheckpointer"]

_SYNC_LEVELS = ("OFF", "NORMAL", "FULL", "EXTRA")


def _is_memory(path: str) -> bool:
    return path == ":memory:" or (path.startswith("file:") and "mode=memory" in path)


def _is_read_only(path: str) -> bool:
    return path.startswith("file:") and "mode=ro" in path


async def _connect(path: str, busy_timeout: float) -> aiosqlite.Connection:
    conn = aiosqlite.connect(
        path, isolation_level=None, timeout=busy_timeout, uri=path.startswith("file:")
    )
    # aiosqlite's worker thread is not a daemon: a checkpointer never closed (plain sync use)
    # would keep the interpreter from exiting. Committed data is safe in the file either way.
    thread = getattr(conn, "_thread", None)
    if thread is not None and not thread.is_alive():
        thread.daemon = True
    return await conn


async def _is_new(conn: aiosqlite.Connection) -> bool:
    """Whether the database is empty (a new file, or memory): not a page written yet."""
    async with conn.execute("PRAGMA page_count") as cursor:
        row = await cursor.fetchone()
    return row is not None and int(row[0]) == 0


async def _pragma(conn: aiosqlite.Connection, pragma: str) -> None:
    async with conn.execute(pragma) as cursor:
        await cursor.fetchall()  # a statement left unfinished would block a COMMIT


async def _to_wal(conn: aiosqlite.Connection, busy_timeout: float) -> None:
    """Switch the file to WAL mode. The switch takes the file for itself, and SQLite refuses
    it at once ("database is locked", without waiting the busy timeout) while another
    connection, in this process or another, is opening or switching the same file: tried
    again until the busy timeout has passed."""
    deadline = time.monotonic() + busy_timeout
    pause = 0.005
    while True:
        try:
            await _pragma(conn, "PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() + pause > deadline:
                raise
        await asyncio.sleep(pause)
        pause = min(pause * 2, 0.1)


def _inline_connection(path: str, synchronous: str) -> sqlite3.Connection | None:
    """The connection for light writes on the caller's thread (`worker.GroupCommit`): no busy
    timeout (a busy file sends the batch to the writer's thread, which waits), usable from any
    thread one at a time. None unless the file is in WAL mode: only there does a COMMIT never
    wait for readers."""
    conn = sqlite3.connect(path, isolation_level=None, timeout=0, check_same_thread=False,
                           uri=path.startswith("file:"))
    try:
        if conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal":
            conn.execute(f"PRAGMA synchronous = {synchronous.upper()}")
            return conn
    except sqlite3.OperationalError:  # busy this instant: every write goes to the thread
        pass
    conn.close()
    return None


async def _open_store(path: str, busy_timeout: float, synchronous: str,
                      inline_commits: bool = False) -> SQLiteStore:
    if synchronous.upper() not in _SYNC_LEVELS:
        raise ValueError(f"synchronous must be one of {_SYNC_LEVELS}, got {synchronous!r}")
    writer = await _connect(path, busy_timeout)
    reader = None
    inline = None
    try:
        pragmas = [f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}"]
        if not _is_read_only(path) and await _is_new(writer):
            # Before anything creates the file (WAL mode included): afterwards, only a VACUUM
            # can switch it (see `store._incremental_auto_vacuum`).
            pragmas.append("PRAGMA auto_vacuum = INCREMENTAL")
        pragmas.append(f"PRAGMA synchronous = {synchronous.upper()}")
        for pragma in pragmas:
            await _pragma(writer, pragma)
        if not _is_memory(path):
            if not _is_read_only(path):  # switching to WAL writes to the file
                await _to_wal(writer, busy_timeout)
            reader = await _connect(path, busy_timeout)
            await _pragma(reader, pragmas[0])
            if inline_commits and not _is_read_only(path):
                inline = _inline_connection(path, synchronous)
    except BaseException:  # a file that could not be set up leaves no connection open
        for conn in (reader, writer):
            if conn is not None:
                await conn.close()
        raise
    return SQLiteStore(writer, reader, inline)


class SQLiteCheckpointer(Checkpointer):
    """Checkpoints in a SQLite file: the embedded default.

    One object serves sync and async graph calls, from any thread, including a thread whose
    event loop is running (a notebook cell). Several processes can share one file: it runs in
    WAL mode, and writers wait up to `busy_timeout` seconds for each other.

    Args:
        conn: a path, `":memory:"`, a `file:` URI, or an open `aiosqlite.Connection` (which
            stays the caller's: `close()` leaves it open).
        serde: serializer for every stored value (default: LangGraph's, strict); one given
            is made strict too (`loading_serde`), or refused if it cannot be.
        unsafe_allow_any_class: use `serde` as given, even where stored bytes may construct
            any class through it (whoever can write to the storage can then run code here).
        snapshot_every: full value of an append-grown list at least every N versions.
        append_log_bytes: memory kept of list channels' last stored values, so that a put
            stores only the items appended (64 MiB by default; past it the least recently
            written list is dropped, and stored whole at its next put; 0: none kept).
        busy_timeout: seconds to wait for another writer of the same file.
        synchronous: SQLite's `PRAGMA synchronous` (`"FULL"` by default, as LangGraph's saver;
            `"NORMAL"` is faster and still safe against a crash of the process).
        inline_commits: commit light writes (puts, pending writes) on the caller's thread
            while the disk is quick and the file free, instead of handing each to the
            connection's thread: less CPU, but the event loop waits for each commit's fsync.
            Off by default: LangGraph's server (`langgraph dev`) refuses blocking calls in its
            event loop. For scripts and workers of your own. See docs/backends.md.
        setup: create or migrate the tables now (idempotent; safe across processes).
        schema_chain: the state schema's version and upcasters (`SchemaChain`): see
            `migrate_threads`.
        audit: turn auditing on for the store, recorded in it (every checkpointer writing to
            it then seals each checkpoint; False turns nothing off): see `verify`,
            `enable_audit` and `disable_audit`.
        retention: the retention policy of threads without their own (`Retention`, or
            LangGraph Platform's `checkpointer.ttl` mapping): see `sweep`. Several processes
            may sweep one file: one pass runs at a time (a lock file `<path>-sweep.lock`
            beside it). `vacuum` gives the space of deleted threads back to the file system.
        sweep_every: seconds between background sweeps (None: sweep when asked).
        writers: `"single"` (default): a run's checkpoint is refused with
            `ConcurrentWriteError` (nothing of it stored) when another run, in this process
            or another one sharing the file, wrote the thread since this run read it; the
            check runs in the write's own transaction. `"last_wins"`: no such check
            (LangGraph's own savers' behaviour). See `StoreCheckpointer`.
        tombstone_ttl: seconds a deleted thread's tombstone refuses late writes of runs that
            read it before the delete (`ThreadDeletedError`; default a day; None: no
            tombstones). The sweeper removes older ones.
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

    Example:
        >>> cp = SQLiteCheckpointer("agent.db")                      # doctest: +SKIP
        >>> graph = builder.compile(checkpointer=cp)                  # doctest: +SKIP
        >>> graph.invoke(inputs, {"configurable": {"thread_id": "t-1"}})  # doctest: +SKIP
    """

    db_system = "sqlite"

    @reads_url("sqlite")
    def __init__(
        self,
        conn: str | os.PathLike[str] | aiosqlite.Connection = ":memory:",
        *,
        serde: SerializerProtocol | None = None,
        snapshot_every: int = 256,
        append_log_bytes: int = DEFAULT_MAX_BYTES,
        busy_timeout: float = 30.0,
        synchronous: str = "FULL",
        inline_commits: bool = False,
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
        _store: SQLiteStore | None = None,
    ) -> None:
        # Refused before any connection opens; the serializer then goes in as it is.
        serde = loading_serde(serde, unsafe_allow_any_class=unsafe_allow_any_class)
        check_writers(writers)
        check_tombstone_ttl(tombstone_ttl)
        bridge = Bridge("lgckpt-sqlite")
        if not isinstance(conn, aiosqlite.Connection):
            self._where = os.fspath(conn)
        store = _store
        if store is None:
            if isinstance(conn, aiosqlite.Connection):
                store = SQLiteStore(conn, None)
                store.owns_connections = False
            else:
                store = bridge.run(_open_store(
                    os.fspath(conn), busy_timeout, synchronous, inline_commits))
        super().__init__(
            store, serde=serde, snapshot_every=snapshot_every,
            append_log_bytes=append_log_bytes, bridge=bridge,
            schema_chain=schema_chain, audit=audit, unsafe_allow_any_class=unsafe_allow_any_class,
            retention=retention, sweep_every=sweep_every, writers=writers,
            tombstone_ttl=tombstone_ttl, redact_metadata=redact_metadata,
            encryption=encryption, compression=compression, audit_keys=audit_keys,
            telemetry=telemetry,
        )
        if setup and _store is None:
            self._setup_or_close()

    @classmethod
    def from_conn_string(
        cls, conn_string: str | os.PathLike[str], **kwargs: Any
    ) -> Opening[SQLiteCheckpointer]:
        """Open the file, create or migrate the tables, yield the checkpointer, close it on
        exit: `with` for sync graph calls, `async with` for async ones.

        Args:
            conn_string: a path, `":memory:"`, a `file:` URI, or a `sqlite:///path.db` URL
                with its query options (see `connect`).
            kwargs: as for the constructor.

        Example:
            >>> async with SQLiteCheckpointer.from_conn_string("agent.db") as cp:  # doctest: +SKIP
            ...     graph = builder.compile(checkpointer=cp)
        """
        conn = os.fspath(conn_string)
        if conn.startswith("sqlite://"):
            conn, kwargs = parse_url(conn).arguments(kwargs, backend="sqlite")
        kwargs["serde"] = loading_serde(  # refused before the file opens
            kwargs.get("serde"), unsafe_allow_any_class=kwargs.get("unsafe_allow_any_class", False))
        return Opening(lambda: cls(conn, **kwargs), lambda: cls._aopen(conn, dict(kwargs)))

    @classmethod
    async def _aopen(cls, conn: str, kwargs: dict[str, Any]) -> SQLiteCheckpointer:
        """The checkpointer, its connections opened on the running event loop."""
        setup = kwargs.pop("setup", True)
        store = await _open_store(
            conn, kwargs.pop("busy_timeout", 30.0), kwargs.pop("synchronous", "FULL"),
            kwargs.pop("inline_commits", False))
        try:
            saver = cls(conn, _store=store, **kwargs)
        except BaseException:
            await store.close()
            raise
        return await set_up(saver, setup)

    @property
    def store(self) -> SQLiteStore:
        """The row store under this checkpointer (leases, tombstones, the epoch: tools and
        tests reading below the saver interface)."""
        return self._raw_store  # type: ignore[return-value]
