"""`RedisStore`: the rows of `StoreCheckpointer` in plain Redis (no modules), standalone or
Cluster, through redis.asyncio. See `layout.py` for the keys and `scripts.py` for the scripts."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import heapq
import json
import logging
import math
import secrets
import threading
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Sequence
from typing import Any

import ormsgpack
import redis.asyncio as aredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool
from redis.connection import URL_QUERY_ARGUMENT_PARSERS
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ReadOnlyError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ...core.codec import writes_order
from ...core.errors import (
    ConcurrentWriteError,
    InvalidConfigError,
    ReplicaAckError,
    StoreUnavailableError,
    check_storage_version,
)
from ...core.guard import Guard, LeaseRow, put_refusal, writes_refusal
from ...core.perloop import PerLoop
from ...core.retention import LifecycleEvent, ThreadState
from ...core.rows import (
    AuditSwitch,
    BlobRow,
    CheckpointRow,
    ListQuery,
    MigrationEntry,
    Reseal,
    StoredSize,
    Typed,
    WriteRow,
    whole,
)
from ...core.store import BatchItem, Cursor, GcPlanner, keyset_pages
from ...core.telemetry import count
from ...core.urls import SENTINEL, SENTINEL_OPTIONS, SentinelURL, parse_sentinel
from . import scripts
from .layout import LAYOUT_VERSION, check_parts, guard_keys, thread_keys

Client = Any  # redis.asyncio.Redis | redis.asyncio.cluster.RedisCluster
_log = logging.getLogger("langgraph_ckpt_ext.redis")

_PAGE = 64
_FIRST = 8  # rows read from each thread before a listing across threads starts merging


class _Desc:
    """A sort key ordered the other way round (heapq is a min-heap; listings go newest first)."""

    __slots__ = ("key",)

    def __init__(self, key: tuple[str, str, str]) -> None:
        self.key = key

    def __lt__(self, other: _Desc) -> bool:
        return self.key > other.key
_ATTEMPTS = 3
_SWEEP_EVERY = 512  # writes between two steps of the thread-index sweep
_SWEEP_STEP = 100  # index entries of each kind checked by one step
_PIPELINED = 500  # index entries checked per pipeline by housekeeping
_SEEN = 65536  # threads and runs this process remembers having indexed
_LOST = (RedisConnectionError, RedisTimeoutError, ConnectionError, OSError, ReadOnlyError)
# The scripts that change stored checkpoints: with `wait_replicas`, each is followed by WAIT.
_DURABLE = frozenset({"PUT", "PUT_WRITES", "BATCH", "DELETE_THREAD", "DELETE_CHECKPOINTS",
                      "LOAD", "REWRITE", "RESEAL", "EXPIRE"})
DEFAULT_WAIT_TIMEOUT = 1.0  # seconds a write waits for its replicas' acknowledgement
CONNECT_TIMEOUT = 5.0  # seconds, unless client_options say otherwise
# The meta fields a lifecycle row is read from (`exp`, `pinned`, `gen`: a row of any age
# has one of them, so a row with every field nil is no row).
_ROW_FIELDS = ("created", "written", "read", "gen", "pinned", "policy", "swept", "exp")
LOCK_LEASE = 30.0  # seconds the sweep lock outlives a holder that stops renewing it (killed)


class _Script:
    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()


_S = {name: _Script(getattr(scripts, name)) for name in (
    "PUT", "PUT_WRITES", "BATCH", "GET_TUPLE", "GET_ROW", "GET_BLOBS", "GET_WRITES", "GET_ANCESTORS",
    "PAGE", "FIND_RUNS", "DELETE_CHECKPOINTS", "DUMP", "LOAD", "DELETE_THREAD",
    "PIN", "TOUCH", "EXISTING", "REWRITE", "MIGRATIONS", "SIZES",
    "POLICY", "STATE", "SET_IF_ROW", "EXPIRE", "LOCK_RENEW", "LOCK_RELEASE",
    "LEASE_ACQUIRE", "LEASE_RENEW", "LEASE_RELEASE", "DROP_IF_BEFORE", "UNINDEX_BEFORE",
    "RAISE_EPOCH", "RESEAL",
)}
_KINDS = {b"c": "checkpoint", b"b": "blob", b"w": "write"}


def _s(b: bytes) -> str:
    return b.decode("utf-8", "surrogatepass")


def _b(s: str) -> bytes:
    return s.encode("utf-8", "surrogatepass")


def _pack_row(row: CheckpointRow) -> bytes:
    names = _b("".join(f"{ch}\0{v}\0" for ch, v in (row.versions or {}).items()))
    rest = ormsgpack.packb([row.checkpoint[0], row.checkpoint[1], row.metadata[0], row.metadata[1]])
    head = _b(f"{row.parent_checkpoint_id or ''}\0{row.run_id or ''}\0{len(names)}\0")
    return head + names + rest


def _row(thread_id: str, ns: str, cid: str, value: bytes) -> CheckpointRow:
    parent, run, n, rest = value.split(b"\0", 3)
    ctype, cdata, mtype, mdata = ormsgpack.unpackb(rest[int(n):])
    return CheckpointRow(
        thread_id, ns, cid, _s(parent) or None, _s(run) or None, (ctype, cdata), (mtype, mdata)
    )


def _field_row(thread_id: str, field: bytes, value: bytes) -> CheckpointRow:
    ns, cid = field.split(b"\0", 1)
    return _row(thread_id, _s(ns), _s(cid), value)


def _blobs(flat: Sequence[bytes]) -> dict[tuple[str, str], BlobRow]:
    out: dict[tuple[str, str], BlobRow] = {}
    for i in range(0, len(flat), 3):
        ch, ver = _s(flat[i]), _s(flat[i + 1])
        base, type_, data = flat[i + 2].split(b"\0", 2)
        out[(ch, ver)] = BlobRow(ch, ver, _s(type_), data, _s(base) or None)
    return out


def _pack_blobs(blobs: Sequence[BlobRow]) -> list[bytes]:
    """PUT's blob arguments: the heads (`channel \\0 version \\0 base \\0` per blob), then one
    value (`base \\0 type \\0 data`) per blob."""
    heads = _b("".join(f"{b.channel}\0{b.version}\0{b.base_version or ''}\0" for b in blobs))
    return [heads, *(_b(f"{b.base_version or ''}\0{b.type}\0") + b.data for b in blobs)]


def _whole(blobs: Sequence[BlobRow], channels: Collection[str]) -> list[BlobRow]:
    """`blobs` with the append-deltas of `channels` replaced by their whole values."""
    return [
        whole(b) if b.channel in channels and b.base_version is not None else b
        for b in blobs
    ]


def _pack_writes(rows: Sequence[WriteRow]) -> bytes:
    """PUT_WRITES' records: `replace \\0 len \\0 field \\0 len \\0 value` (lengths in bytes, so
    that the values may hold any byte)."""
    records = []
    for r in rows:
        field = _write_field(r)
        value = ormsgpack.packb([r.channel, r.type, r.data, r.task_path])
        records.append(b"%s%d\0%s%d\0%s" % (
            b"1" if r.idx < 0 else b"0", len(field), field, len(value), value
        ))
    return b"".join(records)


def _write_field(w: WriteRow) -> bytes:
    return b"\0".join((_b(w.checkpoint_ns), _b(w.checkpoint_id), _b(w.task_id), b"%d" % w.idx))


def _reseal_record(change: Reseal) -> list[bytes] | None:
    """RESEAL's record for a change (`kind, field, old, new`), or None for a change that can
    name no row (a part holding a NUL, which would alias another field)."""
    key = change.key
    if any("\0" in part for part in (change.checkpoint_ns, *key)):
        return None
    ns = _b(change.checkpoint_ns)
    if change.kind == "checkpoint" and len(key) == 1:
        return [b"c", ns + b"\0" + _b(key[0]), _row_tail(change.old), _row_tail(change.new)]
    if change.kind == "blob" and len(key) == 2:
        return [b"b", b"\0".join((ns, _b(key[0]), _b(key[1]))),
                *(_b(f"{t[0][0]}\0") + bytes(t[0][1]) for t in (change.old, change.new))]
    if change.kind == "write" and len(key) == 3 and key[2].lstrip("-").isdigit():
        field = b"\0".join((ns, _b(key[0]), _b(key[1]), b"%d" % int(key[2])))
        return [b"w", field, *(_write_items(t[0]) for t in (change.old, change.new))]
    return None


def _row_tail(pair: tuple[Typed, ...]) -> bytes:
    """The msgpack tail of a packed checkpoint row (`_pack_row`) for (checkpoint, metadata)."""
    (ctype, cdata), (mtype, mdata) = pair
    return ormsgpack.packb([ctype, bytes(cdata), mtype, bytes(mdata)])


def _write_items(value: Typed) -> bytes:
    """A packed write's type and data items (`_pack_writes`): msgpack items delimit
    themselves, so these bytes sit between the channel and the task path unchanged."""
    return ormsgpack.packb(value[0]) + ormsgpack.packb(bytes(value[1]))


def _writes(thread_id: str, flat: Sequence[bytes]) -> dict[str, list[WriteRow]]:
    out: dict[str, list[WriteRow]] = {}
    for i in range(0, len(flat), 2):
        ns, cid, task, idx = flat[i].split(b"\0")
        channel, type_, data, path = ormsgpack.unpackb(flat[i + 1])
        row = WriteRow(thread_id, _s(ns), _s(cid), _s(task), int(idx), channel, type_, data, path)
        out.setdefault(row.checkpoint_id, []).append(row)
    for rows in out.values():
        rows.sort(key=writes_order)
    return out


def _migrations(thread_id: str, flat: Sequence[bytes]) -> list[MigrationEntry]:
    out = []
    for i in range(0, len(flat), 2):
        ns, cid, to_version = flat[i].split(b"\0")
        from_version, at = flat[i + 1].split(b"\0")
        out.append(MigrationEntry(
            thread_id, _s(ns), _s(cid), int(from_version), int(to_version), float(at)
        ))
    return out


def _pack_guard(guard: Guard | None, target: str, ns: str) -> bytes:
    """A guard record of the guarded scripts (see `scripts._GUARD`); an unguarded item of a
    guarded batch gets flags '0---'."""
    if guard is None:
        return b"0---\0\0\0\0\0\0"
    read, lease = guard.read_head or "", guard.lease or ""
    check_parts(read, lease)
    flags = "1" + ("s" if guard.single else "-") + ("f" if guard.fresh else "-") + (
        "a" if guard.apply else "-")
    epoch = "" if guard.epoch is None else str(int(guard.epoch))
    return _b(f"{flags}\0{read}\0{lease}\0{epoch}\0{target}\0{ns}\0")


def _refused(found: Any) -> bool:
    """Whether a guarded script's answer is a refusal (`{'\\0', item, facts...}`)."""
    return isinstance(found, list) and len(found) == 7 and found[0] == b"\0"


def _refusal(found: Sequence[Any], guard: Guard, item: CheckpointRow | Sequence[WriteRow],
             now: str) -> ConcurrentWriteError:
    """The error `core.guard` builds from the facts a guarded script refused on."""
    _, _, seen, tomb, token, expiry, epoch = found
    lease: LeaseRow | None = (_s(token), float(expiry)) if token else None
    if isinstance(item, CheckpointRow):
        err = put_refusal(guard, item.thread_id, item.checkpoint_ns, item.parent_checkpoint_id,
                          _s(seen) or None, tomb == b"1", lease, int(epoch), float(now))
    else:
        w = item[0]
        err = writes_refusal(guard, w.thread_id, w.checkpoint_ns, w.checkpoint_id,
                             seen == b"1", tomb == b"1", lease, int(epoch), float(now))
    if err is None:
        raise AssertionError(
            f"the Redis guard refused a write core.guard allows ({found!r}): the Lua rule in "
            "scripts._GUARD no longer mirrors core.guard")
    return err


def _tightest(bounds: Sequence[tuple[bytes, bool]]) -> bytes:
    """The lowest of several (value, inclusive) upper bounds as a ZREVRANGEBYLEX max ("+" for
    none); of two equal values, the exclusive one."""
    if not bounds:
        return b"+"
    value, inclusive = min(bounds, key=lambda b: (b[0], b[1]))
    return (b"[" if inclusive else b"(") + value


class RedisStore:
    """Rows in Redis: each operation is one script on the thread's keys (one slot).

    One writer per thread (`core.guard`): a guarded write's script reads the namespace's head,
    the thread's tombstone and lease row (keys of the thread's slot) and decides before it
    writes, so two writers of a namespace never both pass against one head, standalone or
    Cluster. Times (tombstones, lease expiries) are `clock()`'s, passed in, never the
    server's. The store's epoch (`<prefix>:epoch`, only read for a guard with an epoch): on a
    standalone server the script reads the key itself (atomic). In a Cluster it lives in
    another slot: the write reads it just before its script and passes it in, and the script
    also checks the thread's own `ep` (the newest epoch that wrote the thread, kept in meta by
    every guarded write). So once a newer primary has written a thread, an older writer's
    write to it is refused atomically; before that, a `raise_epoch` landing between the read
    and the script is missed by that one write (a window of one round trip).
    """

    inline = False
    wants_versions = True  # the row lists the blobs it reads, for the read scripts

    def __init__(
        self,
        *,
        prefix: str,
        ttl: float | None,
        refresh_on_read: bool,
        url: str | None = None,
        client: Client | None = None,
        cluster: bool | None = None,
        is_private_loop: Callable[[asyncio.AbstractEventLoop], bool] = lambda _: False,
        client_options: dict[str, Any] | None = None,
        wait_replicas: int = 0,
        wait_timeout: float = DEFAULT_WAIT_TIMEOUT,
    ) -> None:
        if url is None and client is None:
            raise InvalidConfigError("RedisStore needs a URL or a client")
        if ttl is not None and not (isinstance(ttl, int | float) and ttl > 0 and math.isfinite(ttl)):
            raise InvalidConfigError(f"ttl must be a positive number of seconds or None, not {ttl!r}")
        if client is not None:
            _check_client(client)
        if not (isinstance(wait_replicas, int) and wait_replicas >= 0):
            raise InvalidConfigError(f"wait_replicas must be an integer >= 0, not {wait_replicas!r}")
        if not (isinstance(wait_timeout, int | float) and 0 < wait_timeout < math.inf):
            raise InvalidConfigError(
                f"wait_timeout must be a positive number of seconds, not {wait_timeout!r}")
        self.wait_replicas = wait_replicas
        self._wait_ms = max(1, int(wait_timeout * 1000))  # WAIT 0 would block for ever
        self.prefix = prefix
        self.ttl_ms = None if ttl is None else max(1, int(ttl * 1000))
        self.refresh_on_read = refresh_on_read
        self._url = url
        self._cluster = cluster
        self._given = client
        self._is_private = is_private_loop
        # A host that drops packets would otherwise hold a connect (and the caller) for as long
        # as the OS retries SYNs, minutes; the caller's own value wins.
        self._options = {"socket_connect_timeout": CONNECT_TIMEOUT, **(client_options or {})}
        self._clients: PerLoop[Client] = PerLoop(self._open, _close, lambda c: None)
        self._threads_key = f"{prefix}:threads"
        self._runs_key = f"{prefix}:runs"
        self._layout_key = f"{prefix}:layout"
        self._audit_key = f"{prefix}:audit"
        self._lifecycle_key = f"{prefix}:lifecycle"
        self._lock_key = f"{prefix}:sweep-lock"
        self._tombstones_key = f"{prefix}:tombstones"
        self._leases_key = f"{prefix}:leases"
        self._epoch_key = f"{prefix}:epoch"
        self.tombstone_ttl_ms: int | None = None
        """A tombstone's native TTL (the checkpointer's `tombstone_ttl`); a backstop only:
        `drop_tombstones` goes by `clock()`."""
        self.clock: Callable[[], float] = time.time
        self.lock_lease = LOCK_LEASE
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._writes_since_sweep = 0
        self._runs_cursor = b"-"
        # The step of the sweep running in the background, and the loop it runs on; the lock
        # keeps two loops (a caller's, the sync bridge's) from starting one each.
        self._sweeping: tuple[asyncio.AbstractEventLoop, asyncio.Task[None]] | None = None
        self._sweep_lock = threading.Lock()

    # -- connections --------------------------------------------------------------------------

    async def _open(self) -> Client:
        if self._url is None:
            return _clone(self._given)
        if self._url.lower().startswith(SENTINEL + "://"):
            return _sentinel_client(parse_sentinel(self._url), self._options)
        if self._cluster is None:
            probe = aredis.Redis.from_url(self._url, **self._options)
            try:
                info = await probe.info("cluster")
            finally:
                await probe.aclose()
            self._cluster = bool(info.get("cluster_enabled"))
        if self._cluster:
            if self.wait_replicas:
                raise InvalidConfigError(
                    "wait_replicas is not supported on Redis Cluster (WAIT names no key, so no "
                    "node); use it with a standalone master or redis+sentinel://")
            return RedisCluster.from_url(self._url, **self._options)
        return aredis.Redis.from_url(self._url, **self._options)

    async def _client(self) -> Client:
        # A client the caller gave serves the caller's loops; sync calls, which run on the
        # bridge's loop, get a clone of it (redis.asyncio connections belong to one loop).
        if self._given is not None and not self._is_private(asyncio.get_running_loop()):
            return self._given
        return await self._clients.open()

    async def _retrying(self, op: Callable[[Client], Awaitable[Any]]) -> Any:
        """Run `op` on this loop's client; a lost connection is retried, then reported."""
        for attempt in range(_ATTEMPTS):
            try:
                return await op(await self._client())
            except _LOST as exc:
                # The server may have restarted without its data (or a failover lost the last
                # writes): index entries remembered as added must be added again.
                self._seen.clear()
                if attempt == _ATTEMPTS - 1 and isinstance(exc, ReadOnlyError):
                    raise StoreUnavailableError(
                        f"Redis refused a write as a read-only replica ({exc}): a failover may "
                        "have demoted this server. Nothing was written; point the URL at the "
                        "new master, or use redis+sentinel:// to follow failovers"
                    ) from exc
                if attempt == _ATTEMPTS - 1:
                    raise StoreUnavailableError(
                        f"Redis unreachable ({type(exc).__name__}: {exc}); tried {_ATTEMPTS} "
                        "times. Every write is one script, so nothing was half-written; retry "
                        "once the server is back"
                    ) from exc
                count(retries=1)  # on the operation's span, if it is traced
                await asyncio.sleep(0.2 * (attempt + 1))
        raise AssertionError("unreachable")

    async def _call(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        script = _S[name]
        if self.wait_replicas and name in _DURABLE:
            return await self._acknowledged(name, script, keys, args)

        async def op(client: Client) -> Any:
            try:
                if type(client) is aredis.Redis and not client.single_connection_client:
                    return await _evalsha(client, script.sha, keys, args)
                return await client.evalsha(script.sha, len(keys), *keys, *args)
            except NoScriptError:  # a new or restarted server: EVAL caches the script
                return await client.eval(script.source, len(keys), *keys, *args)

        return await self._retrying(op)

    async def _acknowledged(self, name: str, script: _Script, keys: Sequence[str],
                            args: Sequence[Any]) -> Any:
        """A write script, then WAIT on the same connection (one pipeline): its result once
        `wait_replicas` replicas have acknowledged it; else `ReplicaAckError`."""

        async def op(client: Client) -> tuple[Any, int]:
            for command, ref in (("EVALSHA", script.sha), ("EVAL", script.source)):
                pipe = client.pipeline(transaction=False)
                pipe.execute_command(command, ref, len(keys), *keys, *args)
                pipe.execute_command("WAIT", self.wait_replicas, self._wait_ms)
                result, acks = await pipe.execute(raise_on_error=False)
                if not isinstance(result, NoScriptError):  # a new master: EVAL caches it
                    break
            for found in (result, acks):
                if isinstance(found, Exception):
                    raise found
            return result, int(acks)

        result, acks = await self._retrying(op)
        if acks < self.wait_replicas:
            raise ReplicaAckError(
                f"Redis ran the write ({name}) on the master, but {acks} of the "
                f"{self.wait_replicas} replicas wanted acknowledged it within "
                f"{self._wait_ms} ms: it is stored on the master and may be lost if the master "
                "fails before a replica copies it. Retry it once the replicas are back (or "
                "lower wait_replicas)")
        return result

    async def _command(self, *args: Any) -> Any:
        return await self._retrying(lambda client: client.execute_command(*args))

    def keys(self, thread_id: str) -> tuple[str, ...]:
        return thread_keys(self.prefix, thread_id)

    async def existing_keys(self, thread_id: str) -> list[str]:
        """The keys of a thread that exist now (one round trip)."""
        return [_s(k) for k in await self._call("EXISTING", self.keys(thread_id), [])]

    @property
    def _ttl_arg(self) -> str:
        return "" if self.ttl_ms is None else str(self.ttl_ms)

    # -- the thread and run indexes (hints, verified by the sweep) ---------------------------

    def _hint(self) -> str:
        return "+inf" if self.ttl_ms is None else str(int(time.time() * 1000) + self.ttl_ms)

    def _remember(self, key: str) -> bool:
        """True if `key` was not remembered yet (and remember it)."""
        if key in self._seen:
            self._seen.move_to_end(key)
            return False
        self._seen[key] = None
        while len(self._seen) > _SEEN:
            self._seen.popitem(last=False)
        return True

    async def _index(self, thread_id: str, run_ids: Collection[str], *, force: bool = False) -> bool:
        """Index the thread and its runs (once per process, or again with `force`); whether
        the thread's entry was added by this call."""
        hint = self._hint()
        added = False
        if self._remember("t\0" + thread_id) or force:
            await self._command("ZADD", self._threads_key, hint, thread_id)
            added = True
        for run in run_ids:
            if self._remember(f"r\0{run}\0{thread_id}") or force:
                await self._command("ZADD", self._runs_key, 0, f"{run}\0{thread_id}")
        return added

    async def _indexed(self, thread_id: str, new: Any, added: bool) -> None:
        """After a write: a write script reports a new lifecycle row (`new` == 1); unless this
        call's `_index` just added the entry, add it again (another process may have dropped
        it when the thread was deleted or expired, while this one still remembers it)."""
        if new == 1 and not added:
            await self._command("ZADD", self._threads_key, self._hint(), thread_id)
            self._remember("t\0" + thread_id)

    async def _unindex(self, *thread_ids: str) -> None:
        """Drop threads' index entries; if a write made one again meanwhile (its writer may
        have added the entry just before the drop), put it back."""
        if not thread_ids:
            return
        await self._command("ZREM", self._threads_key, *thread_ids)
        for tid in thread_ids:
            self._seen.pop("t\0" + tid, None)
        there = await self._each("exists", [self.keys(t)[6] for t in thread_ids])
        back = [p for t, n in zip(thread_ids, there, strict=True) if n
                for p in (self._hint(), t)]
        if back:
            await self._command("ZADD", self._threads_key, *back)

    @property
    def _now(self) -> str:
        """`clock()` as the scripts store it (the repr of the float)."""
        return repr(float(self.clock()))

    async def _after_write(self, n: int = 1) -> None:
        """Count `n` writes; every `_SWEEP_EVERY` writes, start a step of the index sweep in the
        background, on this loop: the write returns without waiting for its round trips."""
        with self._sweep_lock:
            self._writes_since_sweep += n
            if self._writes_since_sweep < _SWEEP_EVERY or self._sweep_running():
                return
            self._writes_since_sweep = 0
            loop = asyncio.get_running_loop()
            self._sweeping = loop, loop.create_task(self._background_sweep())

    def _sweep_running(self) -> bool:
        if self._sweeping is None:
            return False
        loop, task = self._sweeping
        return not task.done() and not loop.is_closed()

    async def _background_sweep(self) -> None:
        try:
            await self.housekeep(_SWEEP_STEP)
        except Exception as exc:  # the entries are hints: the next step checks them again
            _log.debug("index sweep step failed: %r", exc)

    async def _stop_sweep(self) -> None:
        """Cancel the sweep's step in progress (waited for if it runs on this loop)."""
        with self._sweep_lock:
            sweeping, self._sweeping = self._sweeping, None
        if sweeping is None or sweeping[1].done():
            return
        loop, task = sweeping
        if loop is asyncio.get_running_loop():
            task.cancel()
            await asyncio.wait([task])
        elif not loop.is_closed():
            loop.call_soon_threadsafe(task.cancel)

    async def housekeep(self, limit: int | None = None) -> int:
        """Check index entries: threads whose deadline hint has passed, and the next `limit`
        run entries (a rolling pass; all of them when `limit` is None). Drop those whose
        thread is gone, re-score live threads. Returns how many entries were dropped. Runs
        by itself every few hundred writes, and at the start of every sweep pass."""
        dropped = 0
        now = int(time.time() * 1000)  # Redis's own expiry runs on real time
        args: list[Any] = ["ZRANGEBYSCORE", self._threads_key, "-inf", now]
        if limit is not None:
            args += ["LIMIT", 0, limit]
        members = [_s(m) for m in await self._command(*args)]
        for first in range(0, len(members), _PIPELINED):
            tids = members[first:first + _PIPELINED]
            # The thread's deadline is that of its first key that exists: a thread whose
            # checkpoints are all deleted may keep its migration log and its lifecycle row; a
            # row made by a pin may come before any checkpoint. One pipeline per chunk.
            ttls = await self._each("pttl", [
                k for t in tids for k in (self.keys(t)[0], self.keys(t)[7], self.keys(t)[6])])
            at = int(time.time() * 1000)
            gone: list[str] = []
            scores: list[Any] = []
            for i, tid in enumerate(tids):
                ttl = next((t for t in ttls[3 * i:3 * i + 3] if t != -2), -2)
                if ttl == -2:
                    gone.append(tid)
                else:
                    scores += ["+inf" if ttl == -1 else at + ttl, tid]
            if scores:
                await self._command("ZADD", self._threads_key, "XX", *scores)
            await self._unindex(*gone)
            dropped += len(gone)
        # Run entries are all scored 0 (they are read by lexical range): walk them in turn.
        start = self._runs_cursor if limit is not None else b"-"
        while True:
            runs = await self._command(
                "ZRANGEBYLEX", self._runs_key, start, "+", "LIMIT", 0, limit or _PIPELINED
            )
            there = await self._each(
                "exists", [self.keys(_s(m.split(b"\0", 1)[1]))[0] for m in runs])
            dead = [m for m, n in zip(runs, there, strict=True) if not n]
            if dead:
                await self._command("ZREM", self._runs_key, *dead)
                for m in dead:
                    self._seen.pop("r\0" + _s(m), None)
                dropped += len(dead)
            start = b"(" + runs[-1] if len(runs) == (limit or _PIPELINED) else b"-"
            if limit is not None or start == b"-":
                break
        self._runs_cursor = start
        return dropped

    async def _each(self, command: str, keys: Sequence[str]) -> list[Any]:
        """One single-key command on each of `keys`, in one pipeline (Redis Cluster: one per
        node, in parallel)."""
        if not keys:
            return []

        async def op(client: Client) -> list[Any]:
            pipe = client.pipeline(transaction=False)
            for k in keys:
                getattr(pipe, command)(k)
            return list(await pipe.execute())

        found: list[Any] = await self._retrying(op)
        return found

    # -- set-up -------------------------------------------------------------------------------

    async def migrate(self) -> int:
        """Record the key layout's version; refuse a layout newer than this code."""
        await self._command("SET", self._layout_key, LAYOUT_VERSION, "NX")
        current = int(await self._command("GET", self._layout_key))
        check_storage_version(current, LAYOUT_VERSION)
        return current

    async def storage_version(self) -> int:
        current = await self._command("GET", self._layout_key)
        return 0 if current is None else int(current)

    async def read_audit_log(self, last: bool = False) -> list[AuditSwitch]:
        found = await self._command("LRANGE", self._audit_key, -1 if last else 0, -1)
        out = []
        for entry in found or ():
            on, at, why = bytes(entry).split(b"\0", 2)
            out.append(AuditSwitch(on == b"1", float(at), _s(why)))
        return out

    async def log_audit_switch(self, switch: AuditSwitch) -> None:
        entry = b"%d\0%s\0%s" % (switch.enabled, _b(repr(float(switch.at))), _b(switch.reason))
        await self._command("RPUSH", self._audit_key, entry)

    # -- writing ------------------------------------------------------------------------------

    async def _guarded(self, thread_id: str, guards: Sequence[Guard | None] | None
                       ) -> tuple[Sequence[str], str]:
        """The keys of a write's script and the epoch to pass it: the thread's keys; with a
        guard its tombstone and lease keys too, and, for a guard with an epoch, the store's
        epoch key (standalone) or its value read now (Cluster: another slot)."""
        keys = self.keys(thread_id)
        if not guards or all(g is None for g in guards):
            return keys, ""
        keys = (*keys, *guard_keys(self.prefix, thread_id))
        if not any(g is not None and g.epoch is not None for g in guards):
            return keys, ""
        if isinstance(await self._client(), RedisCluster):
            return keys, str(await self.read_epoch())
        return (*keys, self._epoch_key), ""

    async def write_checkpoint(
        self, row: CheckpointRow, blobs: Sequence[BlobRow], guard: Guard | None = None
    ) -> set[str]:
        tid, ns = row.thread_id, row.checkpoint_ns
        check_parts(ns, row.checkpoint_id, *(p for b in blobs for p in (b.channel, b.version)))
        record = b"" if guard is None else _pack_guard(guard, row.parent_checkpoint_id or "", ns)
        added = await self._index(tid, [row.run_id] if row.run_id else [])
        packed = _pack_row(row)
        keys, epoch = await self._guarded(tid, [guard])
        fell_back: set[str] = set()
        while True:
            now = self._now
            heads, *values = _pack_blobs(blobs)
            missing = await self._call(
                "PUT", keys,
                [self._ttl_arg, now, ns, row.checkpoint_id, packed, heads, record, epoch,
                 *values],
            )
            if guard is not None and _refused(missing):
                raise _refusal(missing, guard, row, now)
            if not isinstance(missing, list):
                await self._indexed(tid, missing, added)
                break
            # An append-delta's base is gone (pruned, expired, deleted elsewhere): store
            # those values whole. Nothing was written by the refused call.
            gone = {_s(m) for m in missing}
            if gone & fell_back:
                raise AssertionError(f"full values still refused for {sorted(gone)}")
            fell_back |= gone
            blobs = _whole(blobs, gone)
        await self._after_write()
        return fell_back

    async def write_batch(
        self, items: Sequence[BatchItem], guards: Sequence[Guard | None] | None = None
    ) -> list[set[str]]:
        """All of `items` in one BATCH script call. A batch holds one thread's items, all in
        one hash slot: the script checks every guarded item, then applies them in order, or,
        if some append-delta's base is gone, none, naming those; they are then re-sent whole,
        as `write_checkpoint` does. The thread and run index entries as the single calls
        make them."""
        if guards is not None and len(guards) != len(items):
            raise ValueError(f"write_batch got {len(guards)} guards for {len(items)} items")
        tid: str | None = None
        runs: dict[str, None] = {}
        # One entry per item the script gets: a checkpoint (row, packed row, blobs, result) or
        # packed writes (an empty list of writes is no item).
        entries: list[tuple[CheckpointRow, bytes, list[BlobRow], set[str]] | bytes] = []
        # per entry: its guard and the item it checks (for the error of a refusal)
        checks: list[tuple[Guard | None, CheckpointRow | Sequence[WriteRow]]] = []
        records: list[bytes] = []
        out: list[set[str]] = []
        for i, item in enumerate(items):
            guard = None if guards is None else guards[i]
            if isinstance(item, tuple):
                row, blobs = item
                tids = [row.thread_id]
                check_parts(row.checkpoint_ns, row.checkpoint_id, *(
                    p for b in blobs for p in (b.channel, b.version, b.base_version or "")
                ))
                if row.run_id:
                    runs[row.run_id] = None
                out.append(set())
                entries.append((row, _pack_row(row), list(blobs), out[-1]))
                checks.append((guard, row))
                records.append(_pack_guard(guard, row.parent_checkpoint_id or "", row.checkpoint_ns))
            else:
                tids = [w.thread_id for w in item]
                check_parts(*(p for w in item for p in (w.checkpoint_ns, w.checkpoint_id, w.task_id)))
                if item:
                    entries.append(_pack_writes(item))
                    checks.append((guard, item))
                    records.append(_pack_guard(guard, item[0].checkpoint_id, item[0].checkpoint_ns))
            for t in tids:
                if tid is None:
                    tid = t
                elif t != tid:
                    raise ValueError(f"write_batch takes one thread's items, not {tid!r} and {t!r}")
        if tid is None:
            return out  # nothing to store
        added = await self._index(tid, runs)
        keys, epoch = await self._guarded(tid, [g for g, _ in checks])
        record = b"".join(records) if len(keys) > len(self.keys(tid)) else b""
        kinds = "".join("w" if isinstance(e, bytes) else "c" for e in entries)
        while True:
            now = self._now
            args: list[Any] = [self._ttl_arg, now, kinds, record, epoch]
            for e in entries:
                if isinstance(e, bytes):
                    args.append(e)
                else:
                    row, packed, blobs, _ = e
                    args += [row.checkpoint_ns, row.checkpoint_id, packed, *_pack_blobs(blobs)]
            missing = await self._call("BATCH", keys, args)
            if record and _refused(missing):
                guard, checked = checks[int(missing[1])]
                assert guard is not None
                raise _refusal(missing, guard, checked, now)
            if not isinstance(missing, list):
                await self._indexed(tid, missing, added)
                break
            # Nothing was written: store the deltas whose base is gone whole, and try again.
            gone: dict[int, set[str]] = {}
            for i in range(0, len(missing), 2):
                gone.setdefault(int(missing[i]), set()).add(_s(missing[i + 1]))
            for pos, channels in gone.items():
                e = entries[pos]
                assert not isinstance(e, bytes)
                row, packed, blobs, fell_back = e
                if channels & fell_back:
                    raise AssertionError(f"full values still refused for {sorted(channels)}")
                fell_back |= channels
                entries[pos] = (row, packed, _whole(blobs, channels), fell_back)
        await self._after_write(len(entries))
        return out

    async def write_writes(self, rows: Sequence[WriteRow], guard: Guard | None = None) -> None:
        by_thread: dict[str, list[WriteRow]] = {}
        for r in rows:
            check_parts(r.checkpoint_ns, r.checkpoint_id, r.task_id)
            by_thread.setdefault(r.thread_id, []).append(r)
        for tid, group in by_thread.items():
            first = group[0]
            record = b"" if guard is None else _pack_guard(
                guard, first.checkpoint_id, first.checkpoint_ns)
            added = await self._index(tid, ())
            keys, epoch = await self._guarded(tid, [guard])
            now = self._now
            new = await self._call(
                "PUT_WRITES", keys, [self._ttl_arg, now, _pack_writes(group), record, epoch])
            if guard is not None and _refused(new):
                raise _refusal(new, guard, group, now)
            await self._indexed(tid, new, added)
        await self._after_write()

    async def rewrite_checkpoint(
        self,
        row: CheckpointRow,
        blobs: Sequence[BlobRow],
        writes: Sequence[WriteRow] | None,
        entry: MigrationEntry,
    ) -> bool:
        tid, ns, cid = row.thread_id, row.checkpoint_ns, row.checkpoint_id
        if (entry.thread_id, entry.checkpoint_ns, entry.checkpoint_id) != (tid, ns, cid):
            raise ValueError(f"migration entry {entry.key!r} is not for checkpoint {(tid, ns, cid)!r}")
        check_parts(ns, cid, *(p for b in blobs for p in (b.channel, b.version, b.base_version or "")))
        head: list[Any] = [
            self._ttl_arg, ns, cid, _pack_row(row),
            # A row read back has no channel list: the stored one stays (same channels read).
            "1" if row.versions is None else "",
            b"%d" % entry.to_version,
            b"%d\0%s" % (entry.from_version, _b(repr(float(entry.migrated_at)))),
            "" if writes is None else "1",
        ]
        for w in writes or ():
            if (w.thread_id, w.checkpoint_ns, w.checkpoint_id) != (tid, ns, cid):
                raise ValueError(
                    f"write {(w.thread_id, w.checkpoint_ns, w.checkpoint_id, w.task_id, w.idx)!r} "
                    f"is not for checkpoint {(tid, ns, cid)!r}"
                )
            check_parts(w.task_id)
        head.append(_pack_writes(writes or []))
        sent_whole: set[str] = set()
        while True:
            done = await self._call("REWRITE", self.keys(tid), [*head, *_pack_blobs(blobs)])
            if not isinstance(done, list):
                break
            # deltas whose base is gone: sent whole (nothing was written by that call)
            gone = {_s(m) for m in done}
            if gone & sent_whole:
                raise AssertionError(f"full values still refused for {sorted(gone)}")
            sent_whole |= gone
            blobs = _whole(blobs, gone)
        if not done:
            return False
        await self._index(tid, [row.run_id] if row.run_id else [])
        await self._after_write()
        return True

    async def reseal(self, thread_id: str, changes: Sequence[Reseal]) -> int:
        """One RESEAL script over the thread's keys: each value compared with what the change
        read and replaced only if equal, its key's TTL kept (a hash field has none of its
        own). The lifecycle row, the head and the indexes stay as they are."""
        records = [r for ch in changes if (r := _reseal_record(ch)) is not None]
        if not records:
            return 0
        args = [part for record in records for part in record]
        return int(await self._call("RESEAL", self.keys(thread_id), args))

    async def read_migrations(self, thread_id: str | None = None) -> list[MigrationEntry]:
        tids = [thread_id] if thread_id is not None else await self.thread_ids()
        out: list[MigrationEntry] = []
        for start in range(0, len(tids), 64):
            chunk = tids[start:start + 64]
            logs = await asyncio.gather(
                *(self._call("MIGRATIONS", self.keys(t), []) for t in chunk)
            )
            for tid, flat in zip(chunk, logs, strict=True):
                out += _migrations(tid, flat)
        out.sort(key=lambda m: (m.migrated_at, *m.key))
        return out

    def _bury_args(self, thread_id: str, tombstone: bool) -> tuple[Sequence[str], list[Any]]:
        """DELETE_THREAD's and EXPIRE's keys, and their tombstone arguments."""
        keys = (*self.keys(thread_id), *guard_keys(self.prefix, thread_id))
        ttl = "" if self.tombstone_ttl_ms is None else str(self.tombstone_ttl_ms)
        return keys, [self._now if tombstone else "", ttl]

    async def delete_thread(self, thread_id: str, tombstone: bool = False) -> None:
        keys, args = self._bury_args(thread_id, tombstone)
        if tombstone:  # indexed first: a tombstone never exists unindexed (a dropped index
            # entry whose tombstone never came is harmless: `drop_tombstones` finds none)
            await self._command("ZADD", self._tombstones_key, args[0], thread_id)
        await self._call("DELETE_THREAD", keys, args)
        await self._unindex(thread_id)

    async def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        # Rows, blobs and writes; not the migration log (the copy was not migrated itself).
        rows, blobs, writes = await self._call("DUMP", self.keys(source_thread_id), [])
        if not rows:
            return  # nothing to copy: leave no key behind for the target
        runs = {_s(v.split(b"\0", 2)[1]) for v in rows[1::2]} - {""}
        await self._index(target_thread_id, runs, force=True)
        await self._call(
            "LOAD", self.keys(target_thread_id),
            [self._ttl_arg, self._now, len(rows) // 2, len(blobs) // 2, *rows, *blobs, *writes],
        )

    async def delete_checkpoints(
        self, thread_id: str, victims: Collection[tuple[str, str]], gc: GcPlanner
    ) -> None:
        # The script finds the dead blobs itself, as `gc` would (by each row's channel list,
        # the very list reads follow), in the call that deletes them: a plan made here could
        # be stale by the time it is applied, on a thread being written.
        args: list[Any] = [len(victims)]
        for ns, cid in victims:
            args += [ns, cid]
        await self._call("DELETE_CHECKPOINTS", self.keys(thread_id), args)

    # -- the thread lifecycle ------------------------------------------------------------------
    #
    # A thread's lifecycle row is its meta hash: gen (raised by every write script), created,
    # written (set by the same scripts, `now` = clock() passed in), read, pinned, policy,
    # swept. Rows of threads written before these fields existed get created = written = the
    # time a sweep (or `thread_state`) first looks at them (STATE).

    async def thread_states(
        self, cursor: str | None, limit: int
    ) -> tuple[list[ThreadState], str | None]:
        """A page of the thread index, walked with ZSCAN (no entry present throughout the
        walk is missed, whatever is added or dropped meanwhile; one may come twice). A ZSCAN
        step may return more than `limit` entries: those left over travel in the cursor
        (JSON: ZSCAN's cursor and the ids still to read), never re-asked of the server.
        Entries whose thread is gone (a native TTL) are dropped from the index."""
        if cursor is None:
            scan, pending, started = "0", [], False
        else:
            scan, pending = json.loads(cursor)
            started = True
        out: list[ThreadState] = []
        while True:
            if pending:
                take, pending = pending[:limit - len(out)], pending[limit - len(out):]
                out += await self._states(take)
                if pending:
                    return out, json.dumps([scan, pending])
            if started and scan == "0":
                return out, None
            if len(out) >= limit:
                return out, json.dumps([scan, []])
            nxt, members = await self._command(
                "ZSCAN", self._threads_key, scan, "COUNT", max(limit, 10)
            )
            started = True
            scan = _s(nxt) if isinstance(nxt, bytes) else str(nxt)
            # redis-py pairs each member with its score; raw, they alternate.
            names = (m[0] for m in members) if members and isinstance(members[0], tuple | list) \
                else members[::2]
            pending = sorted({_s(m) for m in names})

    async def _states(self, thread_ids: Sequence[str]) -> list[ThreadState]:
        """The rows of `thread_ids`: one pipeline of HMGETs (Redis Cluster: one per node, in
        parallel); a row from before the lifecycle fields is stamped by STATE. The index
        entries of threads without a row are dropped."""
        if not thread_ids:
            return []

        async def op(client: Client) -> list[Any]:
            pipe = client.pipeline(transaction=False)
            for t in thread_ids:
                pipe.hmget(self.keys(t)[6], *_ROW_FIELDS)
            return list(await pipe.execute())

        found: list[Any] = await self._retrying(op)
        out = []
        gone = []
        for tid, fields in zip(thread_ids, found, strict=True):
            if fields[0] is None or fields[1] is None:
                # no row (every field nil: the keys are gone), or a row without its times
                fields = None if all(f is None for f in fields) else await self._call(
                    "STATE", (self.keys(tid)[6],), [self._now])
            if fields is None:
                gone.append(tid)
            else:
                out.append(_state(tid, fields))
        await self._unindex(*gone)
        return out

    async def thread_state(self, thread_id: str) -> ThreadState | None:
        fields = await self._call("STATE", (self.keys(thread_id)[6],), [self._now])
        return None if fields is None else _state(thread_id, fields)

    async def set_pinned(self, thread_id: str, pinned: bool) -> None:
        """Pin: every key of the thread persists (no TTL); unpin: the TTL counts again from
        now. Works before the thread's first write (its row is made then)."""
        await self._call(
            "PIN", self.keys(thread_id), ["1" if pinned else "", self._ttl_arg, self._now])
        await self._index(thread_id, (), force=True)

    async def set_policy(self, thread_id: str, policy: str | None) -> None:
        await self._call(
            "POLICY", self.keys(thread_id), [policy or "", self._ttl_arg, self._now])
        await self._index(thread_id, (), force=True)

    async def touch_thread(self, thread_id: str) -> None:
        await self._call("SET_IF_ROW", (self.keys(thread_id)[6],), ["read", self._now])

    async def expire_thread(self, thread_id: str, generation: int, tombstone: bool = False
                            ) -> bool:
        """One script: every key of the thread goes (leaving its `tombstone`) if its gen is
        still `generation`; then its thread index entry (its run index entries go at
        `housekeep`)."""
        keys, args = self._bury_args(thread_id, tombstone)
        if tombstone:
            await self._command("ZADD", self._tombstones_key, args[0], thread_id)
        done = await self._call("EXPIRE", keys, [generation, *args])
        if done:
            await self._unindex(thread_id)
        return bool(done)

    async def mark_swept(self, thread_id: str, generation: int) -> None:
        await self._call("SET_IF_ROW", (self.keys(thread_id)[6],), ["swept", generation])

    @contextlib.asynccontextmanager
    async def sweep_lock(self) -> AsyncIterator[bool]:
        """`SET NX PX` of a random token, renewed every third of its lease while the pass
        runs, released by compare-and-delete: a killed holder's lock lapses after the lease."""
        token = secrets.token_hex(16)
        lease = max(1, int(self.lock_lease * 1000))
        if not await self._command("SET", self._lock_key, token, "NX", "PX", lease):
            yield False
            return

        async def renew() -> None:
            while True:
                await asyncio.sleep(lease / 3000)
                try:
                    if not await self._call("LOCK_RENEW", (self._lock_key,), [token, lease]):
                        _log.warning("the sweep lock lapsed during a pass")
                        return
                except Exception as exc:  # the next renewal tries again
                    _log.debug("sweep lock renewal failed: %r", exc)

        renewing = asyncio.ensure_future(renew())
        try:
            yield True
        finally:
            renewing.cancel()
            await asyncio.wait([renewing])
            await self._call("LOCK_RELEASE", (self._lock_key,), [token])

    async def log_lifecycle(self, events: Sequence[LifecycleEvent]) -> None:
        if events:
            await self._command("RPUSH", self._lifecycle_key, *(_pack_event(e) for e in events))

    async def read_lifecycle(self, thread: str | None = None) -> list[LifecycleEvent]:
        found = await self._command("LRANGE", self._lifecycle_key, 0, -1)
        events = [_event(bytes(e)) for e in found or ()]
        return [e for e in events if thread in (None, e.thread)]

    async def vacuum(self) -> tuple[int, int]:
        return 0, 0  # Redis gives a deleted key's memory back by itself

    # -- reading ------------------------------------------------------------------------------

    async def read_checkpoint(
        self, thread_id: str, ns: str, checkpoint_id: str | None
    ) -> CheckpointRow | None:
        check_parts(ns, checkpoint_id or "")
        found = await self._call("GET_ROW", self.keys(thread_id), [ns, checkpoint_id or ""])
        return None if found is None else _row(thread_id, ns, _s(found[0]), found[1])

    async def read_tuple(
        self,
        thread_id: str,
        ns: str,
        checkpoint_id: str | None,
        wanted: Callable[[CheckpointRow], Collection[tuple[str, str]]],
    ) -> tuple[CheckpointRow, dict[tuple[str, str], BlobRow], list[WriteRow]] | None:
        check_parts(ns, checkpoint_id or "")
        keys = self.keys(thread_id)
        found = await self._call("GET_TUPLE", keys, [ns, checkpoint_id or ""])
        if found is None:
            return None
        if self.refresh_on_read:
            await self._call("TOUCH", keys, [self._ttl_arg])
        cid, packed, flat_blobs, flat_writes = found
        row = _row(thread_id, ns, _s(cid), packed)
        blobs = _blobs(flat_blobs)
        wanted(row)  # the script read every blob the row names
        writes = _writes(thread_id, flat_writes)
        return row, blobs, writes.get(row.checkpoint_id, [])

    async def read_ancestors(
        self, thread_id: str, ns: str, checkpoint_id: str, limit: int
    ) -> list[CheckpointRow]:
        check_parts(ns, checkpoint_id)
        flat = await self._call("GET_ANCESTORS", self.keys(thread_id), [ns, checkpoint_id, limit])
        return [_row(thread_id, ns, _s(flat[i]), flat[i + 1]) for i in range(0, len(flat), 2)]

    async def read_blobs(
        self, thread_id: str, ns: str, keys: Collection[tuple[str, str]]
    ) -> dict[tuple[str, str], BlobRow]:
        if not keys:
            return {}
        check_parts(ns)
        args = [ns, *(p for key in keys for p in key)]
        return _blobs(await self._call("GET_BLOBS", self.keys(thread_id), args))

    async def read_writes(
        self,
        thread_id: str,
        ns: str,
        checkpoint_ids: Collection[str],
        channels: Collection[str] | None = None,
    ) -> dict[str, list[WriteRow]]:
        if not checkpoint_ids or (channels is not None and not channels):
            return {}
        check_parts(ns)
        flat = await self._call("GET_WRITES", self.keys(thread_id), [ns, *checkpoint_ids])
        out = _writes(thread_id, flat)
        if channels is not None:
            chans = set(channels)
            out = {cid: [w for w in ws if w.channel in chans] for cid, ws in out.items()}
        return out

    async def thread_ids(self) -> list[str]:
        """Every thread id of the index that holds a checkpoint now, sorted (the index also
        names threads pinned before their first write, and threads gone by TTL until
        housekeeping drops them)."""
        ids = sorted(_s(m) for m in await self._command("ZRANGE", self._threads_key, 0, -1))
        found = [await self._each("exists", [self.keys(t)[0] for t in ids[i:i + _PIPELINED]])
                 for i in range(0, len(ids), _PIPELINED)]
        return [t for t, n in zip(ids, (n for chunk in found for n in chunk), strict=True) if n]

    async def sizes(self, thread_id: str) -> list[StoredSize]:
        flat = await self._call("SIZES", self.keys(thread_id), [])
        return sorted(
            StoredSize(_s(flat[i]), _KINDS[flat[i + 1]], _s(flat[i + 2]), int(flat[i + 3]),
                       int(flat[i + 4]))
            for i in range(0, len(flat), 5)
        )

    def iter_checkpoints(self, query: ListQuery) -> AsyncIterator[CheckpointRow]:
        ns = query.checkpoint_ns
        if ns is not None:
            check_parts(ns)
        if query.checkpoint_id is not None:
            check_parts(query.checkpoint_id)

        async def thread_page(
            tid: str, cursor: Cursor | None, size: int = _PAGE
        ) -> list[CheckpointRow]:
            cid, before = query.checkpoint_id, query.before
            if ns is not None:
                head = _b(ns) + b"\0"
                index, low = "ix", b"[" + head
                uppers: list[tuple[bytes, bool]] = [(head[:-1] + b"\1", False)]
                if cid is not None:
                    low = b"[" + head + _b(cid)
                    uppers.append((head + _b(cid), True))
                if before is not None:
                    uppers.append((head + _b(before), False))
                if cursor is not None:
                    uppers.append((head + _b(cursor[0]), tid < cursor[2]))
            else:
                index, low = "ord", b"-"
                uppers = []
                if cid is not None:
                    low = b"[" + _b(cid) + b"\0"
                    uppers.append((_b(cid) + b"\1", False))
                if before is not None:
                    uppers.append((_b(before), False))
                if cursor is not None:
                    uppers.append((_b(cursor[0]) + b"\0" + _b(cursor[1]), tid < cursor[2]))
            flat = await self._call(
                "PAGE", self.keys(tid), [index, _tightest(uppers), low, size]
            )
            return [_field_row(tid, flat[i], flat[i + 1]) for i in range(0, len(flat), 2)]

        async def page(cursor: Cursor | None) -> list[CheckpointRow]:
            assert query.thread_id is not None
            return await thread_page(query.thread_id, cursor)

        async def merged() -> AsyncIterator[CheckpointRow]:
            """Every thread's rows in one order: a k-way merge of per-thread pages, each
            thread read a page at a time as the merge reaches it."""
            heap: list[tuple[_Desc, str, deque[CheckpointRow], bool]] = []

            def push(tid: str, rows: deque[CheckpointRow], more: bool) -> None:
                r = rows[0]
                heapq.heappush(heap, (_Desc((r.checkpoint_id, r.checkpoint_ns, tid)), tid, rows,
                                      more))

            tids = await self.thread_ids()
            for start in range(0, len(tids), 64):
                chunk = tids[start:start + 64]
                pages = await asyncio.gather(*(thread_page(t, None, _FIRST) for t in chunk))
                for tid, first in zip(chunk, pages, strict=True):
                    if first:
                        push(tid, deque(first), len(first) == _FIRST)
            while heap:
                _, tid, rows, more = heapq.heappop(heap)
                row = rows.popleft()
                yield row
                if not rows and more:
                    nxt = await thread_page(tid, (row.checkpoint_id, row.checkpoint_ns, tid))
                    rows, more = deque(nxt), len(nxt) == _PAGE
                if rows:
                    push(tid, rows, more)

        if query.thread_id is None:
            return merged()
        if self.refresh_on_read:
            return self._touching(query.thread_id, keyset_pages(page, _PAGE))
        return keyset_pages(page, _PAGE)

    async def _touching(
        self, thread_id: str, rows: AsyncIterator[CheckpointRow]
    ) -> AsyncIterator[CheckpointRow]:
        await self._call("TOUCH", self.keys(thread_id), [self._ttl_arg])
        async for row in rows:
            yield row

    async def find_runs(self, run_ids: Collection[str]) -> list[tuple[str, str, str]]:
        runs = list(run_ids)
        check_parts(*runs)
        tids: set[str] = set()
        for run in runs:
            r = _b(run)
            members = await self._command(
                "ZRANGEBYLEX", self._runs_key, b"[" + r + b"\0", b"(" + r + b"\1"
            )
            tids |= {_s(m.split(b"\0", 1)[1]) for m in members}
        out: list[tuple[str, str, str]] = []
        for tid in sorted(tids):
            for member in await self._call("FIND_RUNS", self.keys(tid), runs):
                ns, cid = member.split(b"\0", 1)
                out.append((tid, _s(ns), _s(cid)))
        return out

    # -- one writer per thread: tombstones, leases, the epoch ----------------------------------

    async def tombstone(self, thread_id: str) -> float | None:
        found = await self._command("GET", guard_keys(self.prefix, thread_id)[0])
        return None if found is None else float(found.rpartition(b"\0")[2])  # `last \0 at`

    async def drop_tombstones(self, before: float, limit: int | None) -> int:
        """Tombstones and lease rows older than `before` (by their stored times, `clock()`'s,
        found through their indexes): each dropped by a script that checks its time again."""
        dropped = 0
        cut = repr(float(before))
        for index, which in ((self._tombstones_key, 0), (self._leases_key, 1)):
            args: list[Any] = ["ZRANGEBYSCORE", index, "-inf", f"({cut}"]
            if limit is not None:
                args += ["LIMIT", 0, limit]
            tids = [_s(m) for m in await self._command(*args)]
            for tid in tids:
                gone = await self._call(
                    "DROP_IF_BEFORE", (guard_keys(self.prefix, tid)[which],), [cut])
                dropped += int(gone) if which == 0 else 0
            if tids:
                await self._call("UNINDEX_BEFORE", (index,), [cut, *tids])
        return dropped

    async def _lease(self, script: str, thread_id: str, token: str, ttl: float) -> bool:
        now = float(self.clock())
        until = now + ttl
        done = await self._call(
            script, (guard_keys(self.prefix, thread_id)[1],), [token, repr(now), repr(until)])
        if done:  # a hint for `drop_tombstones` (checked again there)
            await self._command("ZADD", self._leases_key, repr(until), thread_id)
        return bool(done)

    async def acquire_lease(self, thread_id: str, token: str, ttl: float) -> bool:
        return await self._lease("LEASE_ACQUIRE", thread_id, token, ttl)

    async def renew_lease(self, thread_id: str, token: str, ttl: float) -> bool:
        return await self._lease("LEASE_RENEW", thread_id, token, ttl)

    async def release_lease(self, thread_id: str, token: str) -> None:
        await self._call("LEASE_RELEASE", (guard_keys(self.prefix, thread_id)[1],), [token])

    async def read_lease(self, thread_id: str) -> LeaseRow | None:
        found = await self._command("GET", guard_keys(self.prefix, thread_id)[1])
        if found is None:
            return None
        token, until = bytes(found).split(b"\0", 1)
        return _s(token), float(until)

    async def read_epoch(self) -> int:
        found = await self._command("GET", self._epoch_key)
        return 0 if found is None else int(found)

    async def raise_epoch(self, epoch: int) -> int:
        return int(await self._call("RAISE_EPOCH", (self._epoch_key,), [int(epoch)]))

    def refuses(self, exc: BaseException) -> bool:
        """None of Redis's errors is taken for a refusal: every error that is not a caller
        error counts as an outage (a `ResponseError` too)."""
        return False

    async def close(self) -> None:
        """Stop the index sweep's step in progress; close the clients this store opened (a
        client passed in stays the caller's)."""
        await self._stop_sweep()
        await self._clients.close()


def _num(value: bytes | None) -> float | None:
    return None if value is None else float(value)


def _state(thread_id: str, fields: Sequence[bytes | None]) -> ThreadState:
    """A lifecycle row from STATE's answer."""
    created, written, read, gen, pinned, policy, swept = fields[:7]
    return ThreadState(
        thread_id,
        created_at=float(created or 0),
        written_at=float(written or 0),
        read_at=_num(read),
        generation=int(gen or 0),
        pinned=bool(pinned),
        policy=None if policy is None else _s(policy),
        swept=None if swept is None else int(swept),
    )


def _pack_event(e: LifecycleEvent) -> bytes:
    return b"\0".join((_b(repr(float(e.at))), _b(e.action), _b(e.thread),
                       b"%d" % e.checkpoints, _b(e.reason)))


def _event(entry: bytes) -> LifecycleEvent:
    at, action, thread, n, reason = entry.split(b"\0", 4)
    return LifecycleEvent(float(at), _s(action), _s(thread), int(n), _s(reason))


async def _evalsha(client: aredis.Redis, sha: str, keys: Sequence[str], args: Sequence[Any]
                   ) -> Any:
    """`EVALSHA sha len(keys) *keys *args` on a connection of `client`'s pool: what
    `client.evalsha` does (the client's retry policy, a connection that failed or was cancelled
    mid-call disconnected, never handed back with a reply unread), without its per-call
    observability hooks and generic packing: about 1 M instructions of a 30 M agent turn
    (`bench_floor.py --instructions`). Arguments are encoded by the connection's encoder, so
    a value is sent as `evalsha` would send it; bytes as they are."""
    pool = client.connection_pool
    conn = await pool.get_connection()  # type: ignore[no-untyped-call]
    try:
        encode = conn.encoder.encode
        parts = [b"*%d\r\n$7\r\nEVALSHA\r\n" % (3 + len(keys) + len(args))]
        for arg in (sha, len(keys), *keys, *args):
            data = arg if type(arg) is bytes else encode(arg)
            parts += (b"$%d\r\n" % len(data), data, b"\r\n")
        packed = b"".join(parts)

        async def attempt() -> Any:
            await conn.send_packed_command(packed)
            return await conn.read_response()  # a reply of the server's errors is raised

        return await conn.retry.call_with_retry(attempt, lambda _error: conn.disconnect())
    finally:
        await pool.release(conn)


def _sentinel_client(url: SentinelURL, options: dict[str, Any]) -> Client:
    """A client of the master the sentinels name (redis-py asks them again after a lost
    connection or a READONLY answer, so it follows a failover); the sentinels get the socket
    options and `sentinel_username` / `sentinel_password`."""
    kwargs: dict[str, Any] = {}
    for name, value in url.query:
        parse: Any = URL_QUERY_ARGUMENT_PARSERS.get(name)
        kwargs[name] = parse(value) if parse is not None and name not in SENTINEL_OPTIONS else value
    kwargs.update(options)
    own = {k: kwargs.pop(k) for k in SENTINEL_OPTIONS if k in kwargs}
    sentinel_kwargs = {k: v for k, v in kwargs.items() if k.startswith("socket_")}
    sentinel_kwargs.update({k.removeprefix("sentinel_"): v for k, v in own.items()})
    manager = Sentinel(list(url.sentinels), sentinel_kwargs=sentinel_kwargs)
    return manager.master_for(url.service, db=url.db, username=url.username,
                              password=url.password, **kwargs)


async def _close(client: Client) -> None:
    """Close a client this store opened, and its sentinels' clients if it has them."""
    await client.aclose()
    pool = None if isinstance(client, RedisCluster) else client.connection_pool
    if isinstance(pool, SentinelConnectionPool):
        await pool.sentinel_manager.aclose()


def _check_client(client: Client) -> None:
    kwargs = _connection_kwargs(client)
    if kwargs.get("decode_responses"):
        raise InvalidConfigError(
            "the Redis client was created with decode_responses=True; checkpoints are bytes: "
            "pass a client with decode_responses=False (the default)"
        )


def _connection_kwargs(client: Client) -> dict[str, Any]:
    if isinstance(client, RedisCluster):
        return dict(client.get_connection_kwargs())
    return dict(client.connection_pool.connection_kwargs)


def _clone(client: Client) -> Client:
    """A new client with the same settings, for another event loop."""
    if isinstance(client, RedisCluster):
        kwargs: dict[str, Any] = {k: v for k, v in client.get_connection_kwargs().items()
                  if k in ("username", "password", "db", "socket_timeout",
                           "socket_connect_timeout", "ssl", "ssl_ca_certs", "ssl_certfile",
                           "ssl_keyfile", "ssl_cert_reqs", "client_name")}
        nodes = [ClusterNode(n.host, n.port) for n in client.get_nodes()]
        return RedisCluster(startup_nodes=nodes, **kwargs)
    pool = client.connection_pool
    if isinstance(pool, SentinelConnectionPool):
        return _clone_sentinel(pool)
    return aredis.Redis(
        connection_pool=type(pool)(connection_class=pool.connection_class, **pool.connection_kwargs)
    )


def _clone_sentinel(pool: SentinelConnectionPool) -> Client:
    """A new master client asking new clients of the same sentinels (for another loop)."""
    manager = pool.sentinel_manager
    where = [(s.connection_pool.connection_kwargs["host"], s.connection_pool.connection_kwargs["port"])
             for s in manager.sentinels]
    copy = Sentinel(
        where, min_other_sentinels=manager.min_other_sentinels,
        sentinel_kwargs=manager.sentinel_kwargs)
    kwargs = {k: v for k, v in pool.connection_kwargs.items() if k != "connection_pool"}
    return copy.master_for(pool.service_name, connection_class=pool.connection_class,
                           check_connection=pool.check_connection, **kwargs)
