"""`ReplicatedCheckpointer`: a primary and replicas, with the consistency the user chooses.

Every write goes to the primary first (a quorum write last: see `_quorum_write`). Then, per
replica, it is queued (bounded) and applied in the primary's order by a worker thread of that
replica, consecutive checkpoints and writes in one batch where the replica can take one. A
replica that fails is marked down and retried with backoff; its queue waits for it. A queue
that overflows is dropped and the replica marked for repair: `repair()` compares every thread
with the primary (checkpoint ids and content hashes) and copies, rebuilds or deletes what
differs. Reads go to the primary and fail over to the most up-to-date replica that is up when
the primary cannot be reached.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
import time
import weakref
from collections import Counter, deque
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeVar, cast

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    DeltaChannelHistory,
    copy_checkpoint,
)

from ..connect import around
from ..core.bridge import resolve
from ..core.config import make_config, thread_id_of
from ..core.errors import (
    CheckpointNotFoundError,
    InvalidConfigError,
    InvalidFilterError,
    MissingBaseError,
    PrimaryUnavailableError,
    QuorumUnavailableError,
    ReplicationError,
    SerializationError,
    ThreadExistsError,
)
from ..core.filters import validate_filter
from ..core.lifetime import Lifetime
from ..core.opening import Opening
from ..core.saver import PreparedBatch, StoreCheckpointer
from ..core.urls import parse_url
from ..timetravel.methods import TimeTravel
from ._forward import Forwarded, not_forwarded, store_method

if TYPE_CHECKING:
    from ..migrations.runner import MigrationReport

T = TypeVar("T")
Consistency = Literal["async", "quorum", "anti_entropy"]
_MODES = ("async", "quorum", "anti_entropy")
_BATCH = 64  # ops one replica applies in one batch at most
_BATCHED = ("put", "writes", "rows")  # ops a replica applies a run of as one batch
# The primary's helpers that change its store: never sent to a replica (no failover).
_WRITES = frozenset(f"{a}{name}" for a in ("", "a")
                    for name in ("migrate_threads", "enable_audit", "disable_audit"))
_PROBE = {"configurable": {"thread_id": "__lgckpt_probe__", "checkpoint_ns": ""}}

# Errors that say the call was wrong, not that a store is unreachable: raised as they are,
# never a reason to fail over or to retry.
_CALLER_ERRORS: tuple[type[BaseException], ...] = (
    InvalidConfigError, InvalidFilterError, SerializationError, CheckpointNotFoundError,
    ThreadExistsError, NotImplementedError, ValueError, TypeError, KeyError,
    MissingBaseError,  # rows that need a base this replica lacks: the thread needs a repair
)


# SQLSTATE classes (asyncpg's and psycopg's `exc.sqlstate`) of a server that answered and
# refused this request, as it would refuse it again: data exception (e.g. a NUL byte in a
# thread id), integrity constraint violation, program limit exceeded.
_REFUSED_SQLSTATES = ("22", "23", "54")


def _unavailable(exc: BaseException) -> bool:
    """Whether an error means the store could not be reached (or served) rather than a bad
    request: connection errors, timeouts, and anything a driver raises that is not a caller
    error (nor a SQL error that refuses the request itself)."""
    if isinstance(exc, ConnectionError | TimeoutError | OSError):
        return True
    sqlstate = getattr(exc, "sqlstate", None)
    if isinstance(sqlstate, str) and sqlstate[:2] in _REFUSED_SQLSTATES:
        return False
    return isinstance(exc, Exception) and not isinstance(exc, _CALLER_ERRORS)


def _caller_gone(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether the calling coroutine, started on `loop`, outlived it (closed under it, then
    collected, maybe while another loop runs): what failed then is the caller's loop, not
    the primary, which stays up."""
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        return True
    return running is not loop or loop.is_closed()


# -- what is queued ---------------------------------------------------------------------------


class _Ack:
    """Confirmations of one write by the replicas: done once `need` confirmed it, or once so
    many failed that `need` cannot be reached."""

    def __init__(self, need: int, total: int) -> None:
        self.need, self.total = need, total
        self.ok = 0
        self.errors: list[tuple[str, BaseException]] = []
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._waiters: list[Callable[[], None]] = []

    def settle(self, replica: str, error: BaseException | None) -> None:
        with self._lock:
            if error is None:
                self.ok += 1
            else:
                self.errors.append((replica, error))
            if self._done.is_set() or not (
                self.ok >= self.need or len(self.errors) > self.total - self.need
            ):
                return
            self._done.set()
            waiters, self._waiters = self._waiters, []
        for wake in waiters:
            with contextlib.suppress(RuntimeError):  # the waiter's loop has closed
                wake()

    @property
    def succeeded(self) -> bool:
        return self.ok >= self.need

    def wait(self, timeout: float) -> bool:
        return self._done.wait(timeout)

    async def await_(self, timeout: float) -> bool:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()

        def wake() -> None:
            loop.call_soon_threadsafe(resolve, future)

        with self._lock:
            if self._done.is_set():
                return True
            self._waiters.append(wake)
        try:
            await asyncio.wait_for(future, timeout)
        except (TimeoutError, asyncio.TimeoutError):  # two classes before Python 3.11
            return False
        return True


@dataclass
class _Op:
    kind: str  # rows | put | writes | delete | delete_runs | copy | prune
    args: tuple[Any, ...]
    threads: tuple[str, ...]  # the threads it touches (none known: delete_runs)
    at: float
    ack: _Ack | None = None
    seq: int = 0  # its place in the primary's order


@dataclass
class _Entry:
    op: _Op
    acked: bool = False  # whether this replica has settled the op's ack (first attempt)


def _put_config(batch: PreparedBatch) -> RunnableConfig | None:
    """What `put` returns for a batch of one checkpoint (None for writes)."""
    if not batch.puts:
        return None
    row = batch.puts[0].row
    return make_config(row.thread_id, row.checkpoint_ns, row.checkpoint_id)


def _apply(saver: BaseCheckpointSaver[Any], op: _Op) -> None:
    """An op on one saver, through its sync methods (the worker thread's)."""
    a = op.args
    if op.kind == "rows":
        saver.write_rows(*a)  # type: ignore[attr-defined]
    elif op.kind == "put":
        saver.put(*a)
    elif op.kind == "writes":
        saver.put_writes(*a)
    elif op.kind == "delete":
        saver.delete_thread(*a)
    elif op.kind == "delete_runs":
        saver.delete_for_runs(*a)
    elif op.kind == "copy":
        saver.copy_thread(*a)
    else:
        saver.prune(a[0], strategy=a[1])


# -- what the user reads -----------------------------------------------------------------------


@dataclass
class ReplicaStatus:
    """One replica's health and lag (`checkpointer.status()`)."""

    name: str
    up: bool
    queued: int
    """Operations waiting to be applied."""
    oldest_unreplicated_age: float
    """Seconds the oldest waiting operation has waited (0 when none)."""
    applied: int
    """Operations applied so far."""
    failures: int
    """Failed attempts so far (each retried, or the thread marked for repair)."""
    last_error: str | None
    needs_repair: bool
    """Operations were dropped (queue overflow, or the replica refused one): run `repair()`."""
    threads_to_repair: int


@dataclass
class ReplicationStatus:
    primary_up: bool
    primary_error: str | None
    replicas: list[ReplicaStatus]

    def __str__(self) -> str:
        lines = [f"primary: {'up' if self.primary_up else 'DOWN'}"
                 + (f" ({self.primary_error})" if self.primary_error else "")]
        for r in self.replicas:
            lines.append(
                f"{r.name}: {'up' if r.up else 'DOWN'}, {r.queued} queued, oldest "
                f"{r.oldest_unreplicated_age:.2f} s, {r.applied} applied, {r.failures} failed"
                + (", needs repair" if r.needs_repair else "")
                + (f", last error: {r.last_error}" if r.last_error else "")
            )
        return "\n".join(lines)


@dataclass
class ReplicaRepair:
    """What `repair()` did on one replica."""

    name: str
    threads_checked: int = 0
    threads_equal: int = 0
    checkpoints_copied: int = 0
    writes_copied: int = 0
    threads_rebuilt: list[str] = field(default_factory=list)
    """Threads deleted on the replica and copied whole (it held checkpoints or writes the
    primary does not, or different ones)."""
    threads_deleted: list[str] = field(default_factory=list)
    """Threads the primary no longer holds."""
    threads_skipped: list[str] = field(default_factory=list)
    """Threads with writes still queued for the replica: compared again next time."""
    threads_failed: dict[str, str] = field(default_factory=dict)
    """Threads whose repair failed, with why (the others were repaired)."""
    error: str | None = None
    """Why the repair of this replica stopped (it is resumed by running `repair()` again)."""


@dataclass
class RepairReport:
    replicas: list[ReplicaRepair]
    seconds: float

    @property
    def clean(self) -> bool:
        """True when every replica was already equal to the primary."""
        return all(
            r.error is None and not (r.checkpoints_copied or r.writes_copied
                                     or r.threads_rebuilt or r.threads_deleted
                                     or r.threads_failed)
            for r in self.replicas
        )

    def summary(self) -> str:
        lines = []
        for r in self.replicas:
            lines.append(
                f"{r.name}: {r.threads_checked} threads checked, {r.threads_equal} equal, "
                f"{r.checkpoints_copied} checkpoints and {r.writes_copied} writes copied, "
                f"{len(r.threads_rebuilt)} rebuilt, {len(r.threads_deleted)} deleted, "
                f"{len(r.threads_skipped)} skipped (busy)"
                + (f", {len(r.threads_failed)} failed" if r.threads_failed else "")
                + (f"; stopped: {r.error}" if r.error else "")
            )
        lines.append(f"{self.seconds:.2f} s")
        return "\n".join(lines)


# -- one replica ------------------------------------------------------------------------------


class _Health:
    """What every kind of replica keeps: its health, counts and what it must have repaired
    (all under `cond`)."""

    def __init__(self, name: str, owner: Any) -> None:
        # Weakly: a worker thread holds its replica, and must not hold a checkpointer dropped
        # without close() alive with it.
        self.name, self.owner = name, weakref.proxy(owner)
        self.busy: Counter[str] = Counter()  # queued ops per thread
        self.cond = threading.Condition()
        self.up = True
        self.applying = False
        self.applied = 0
        self.failures = 0
        self.last_error: BaseException | None = None
        self.repair_all = False
        self.to_repair: set[str] = set()

    def _unbusy(self, threads: tuple[str, ...]) -> None:
        for t in threads:
            self.busy[t] -= 1
            if self.busy[t] <= 0:
                del self.busy[t]

    def _status(self, queued: int, oldest_at: float | None) -> ReplicaStatus:
        return ReplicaStatus(
            self.name, self.up, queued,
            0.0 if oldest_at is None else time.monotonic() - oldest_at,
            self.applied, self.failures,
            None if self.last_error is None else _describe(self.last_error),
            self.repair_all or bool(self.to_repair), len(self.to_repair),
        )

    def _mark(self, op: _Op) -> None:
        """An op this replica will not get: its threads (all, if it names none) to repair."""
        if op.threads and op.kind != "delete_runs":
            self.to_repair.update(op.threads)
        else:
            self.repair_all = True


class _Replica(_Health):
    """A replica, its queue and the worker thread that applies it."""

    def __init__(self, name: str, saver: BaseCheckpointSaver[Any], owner: ReplicatedCheckpointer
                 ) -> None:
        super().__init__(name, owner)
        self.saver = saver
        self.queue: deque[_Entry] = deque()
        self.inflight: list[_Entry] = []  # the batch being applied (while `applying`)
        self.stopping = False
        self.thread: threading.Thread | None = None

    # The queue is only touched under `cond`.

    def start(self) -> None:
        if self.thread is None:
            self.thread = threading.Thread(
                target=self._run, name=f"lgckpt-replica-{self.name}", daemon=True)
            self.thread.start()

    def push(self, op: _Op, wait: float) -> None:
        """Queue an op; while the queue is full, wait up to `wait` s for room (backpressure) if
        the replica is up, else drop the queue and mark the replica for repair."""
        deadline = time.monotonic() + wait
        with self.cond:
            while len(self.queue) >= self.owner.max_queue:
                left = deadline - time.monotonic()
                if not self.up or left <= 0:
                    self._overflow()
                    break
                self.cond.wait(left)
            self.queue.append(_Entry(op))
            for t in op.threads:
                self.busy[t] += 1
            self.cond.notify_all()
        self.start()

    def _overflow(self) -> None:
        for entry in self.queue:
            self._settle(entry, ReplicationError(f"replica {self.name}: queue overflowed"))
            self._mark(entry.op)
        self.queue.clear()
        self.busy.clear()

    def _settle(self, entry: _Entry, error: BaseException | None) -> None:
        if not entry.acked and entry.op.ack is not None:
            entry.acked = True
            entry.op.ack.settle(self.name, error)

    def _run(self) -> None:
        backoff = 0.05
        while True:
            with self.cond:
                while not self.queue and not self.stopping and self.up:
                    self.cond.wait()
                if self.stopping and (not self.queue or not self.up):
                    return
                self._linger()
                batch = self._head()
                self.applying, self.inflight = bool(batch), batch
            try:
                if batch:
                    self._apply(batch)
                else:  # down with nothing queued: probe until it answers
                    self.saver.get_tuple(_PROBE)  # type: ignore[arg-type]
            except BaseException as exc:
                with self.cond:
                    self.applying = False
                    self.failures += 1
                    self.last_error = exc
                    if batch and not _unavailable(exc):
                        self._refused(batch, exc)
                        continue
                    self.up = False
                    for entry in batch:
                        self._settle(entry, exc)
                    self.cond.notify_all()
                    self.cond.wait(backoff)  # woken early only by close()
                backoff = min(backoff * 2, 2.0)
                continue
            backoff = 0.05
            with self.cond:
                self.applying = False
                if not self.up:  # back after an outage: it may have lost data (a restart)
                    self.repair_all = True
                self.up = True
                for entry in batch:
                    self._pop(entry)
                    self._settle(entry, None)
                self.applied += len(batch)
                self.cond.notify_all()

    def _pop(self, entry: _Entry) -> None:
        """Take an applied entry off the head (unless an overflow dropped it meanwhile)."""
        if self.queue and self.queue[0] is entry:
            self.queue.popleft()
            self._unbusy(entry.op.threads)

    def _linger(self) -> None:
        """Let a run of one thread's writes gather (a turn's checkpoints and writes come a few
        ms apart) so that it goes as one batch: fewer round trips and less Python per write.
        Not for a quorum write (someone waits on it) nor when stopping (under `cond`)."""
        try:
            linger = self.owner.linger
        except ReferenceError:  # dropped: stopping, with what is queued
            return
        if not linger or not self.up:
            return
        while self.queue and not self.stopping and len(self.queue) < _BATCH:
            first = self.queue[0].op
            if (first.ack is not None or getattr(first, "quorum", False)
                    or first.kind not in _BATCHED):
                return
            left = first.at + linger - time.monotonic()
            if left <= 0:
                return
            self.cond.wait(left)

    def _head(self) -> list[_Entry]:
        """The ops to apply next: a run of checkpoints and writes (one batch), or one other."""
        if not self.queue:
            return []
        first = self.queue[0]
        rows = first.op.kind == "rows"
        if first.op.kind not in _BATCHED or not (rows or hasattr(self.saver, "put_batch")):
            return [first]
        out: list[_Entry] = []
        for entry in self.queue:  # one thread's: a batch is one thread's on some backends
            if ((entry.op.kind == "rows") != rows or entry.op.kind not in _BATCHED
                    or entry.op.threads != first.op.threads or len(out) >= _BATCH):
                break
            out.append(entry)
        return out

    def _apply(self, batch: list[_Entry]) -> None:
        if len(batch) == 1:
            _apply(self.saver, batch[0].op)
        elif batch[0].op.kind == "rows":
            self.saver.write_rows(  # type: ignore[attr-defined]
                [item for e in batch for item in e.op.args[0]])
        else:
            self.saver.put_batch([(e.op.kind, *e.op.args) for e in batch])  # type: ignore[attr-defined]

    def _refused(self, batch: list[_Entry], exc: BaseException) -> None:
        """The replica answered but refused an op (its data differs from the primary's): apply
        the batch one by one, dropping each refused op and marking its threads for repair."""
        self.cond.release()
        try:
            outcomes: list[BaseException | None] = []
            for entry in batch:
                try:
                    _apply(self.saver, entry.op)
                    outcomes.append(None)
                except BaseException as one:
                    if _unavailable(one):
                        outcomes.append(one)
                        break
                    outcomes.append(one)
        finally:
            self.cond.acquire()
        for entry, outcome in zip(batch, outcomes, strict=False):
            if outcome is not None and _unavailable(outcome):
                break  # retried with the rest of the queue
            self._pop(entry)
            if outcome is None:
                self.applied += 1
            else:
                self._mark(entry.op)
            self._settle(entry, outcome)
        self.applying = False
        self.cond.notify_all()

    def take_back(self, seq: int) -> bool:
        """Take op `seq` off the queue if it is waiting there (not being applied)."""
        with self.cond:
            for i, entry in enumerate(self.queue):
                if entry.op.seq != seq:
                    continue
                if self.applying and any(e is entry for e in self.inflight):
                    return False
                del self.queue[i]
                self._unbusy(entry.op.threads)
                self.cond.notify_all()
                return True
        return False

    def withdraw(self, op: _Op) -> None:
        """A quorum write that failed: off the queue, or its threads marked for repair."""
        if not self.take_back(op.seq):
            with self.cond:
                self._mark(op)

    def drained(self) -> bool:
        return not self.queue and not self.applying

    def status(self) -> ReplicaStatus:
        with self.cond:
            return self._status(len(self.queue), self.queue[0].op.at if self.queue else None)

    def stop(self) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify_all()


class RemoteError(Exception):
    """An error a replica raised in the replicator process (its message names its type)."""


def _describe(exc: BaseException) -> str:
    if isinstance(exc, RemoteError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


# -- the checkpointer -------------------------------------------------------------------------


class ReplicatedCheckpointer(BaseCheckpointSaver[Any], TimeTravel, Forwarded):
    """A primary checkpointer and replicas of any backend, with the consistency you choose.

    The time-travel methods (`history`, `fork`, ...) go through this checkpointer (reads to
    the primary, a fork's writes replicated); the helpers of this package's checkpointers
    (`sizes`, `verify`, `migration_log`, ...) are the primary's, and `migrate_threads`
    rewrites the primary, then repairs the threads it rewrote on every replica.

    Args:
        primary: where every write goes first and every read goes (ours or any
            `BaseCheckpointSaver`).
        replicas: one or more checkpointers (any backend) kept equal to the primary. A replica
            given as a URL (`"redis://..."`, `"sqlite:///replica.db"`, `"postgresql://..."`,
            or `(url, options)` with options for `connect`) is applied in a process of its
            own, which takes that work off this process's GIL (see `_replicator.py`); a
            checkpointer object is applied by a thread of this process.
        consistency: `"async"`: a write returns once the primary has it; replicas follow
            from their queues, and a replica's failure never fails the write. `"quorum"`: a
            write goes to the replicas first, and to the primary once `quorum` of them
            confirmed it; it returns once the primary has it too. One that fails its quorum
            raises `QuorumUnavailableError` and is not on the primary (reads never show it),
            nor, after its repair, on any replica; with fewer replicas up, it fails before
            any store is touched. `"anti_entropy"`: `"async"`, plus a
            `repair()` every `repair_interval` seconds in the background: of the threads
            written since the last one (and those marked for repair), and of every thread
            each `full_repair_every` passes.
        quorum: the replicas a `"quorum"` write waits for (default 1).
        max_queue: operations queued per replica; when full, a write waits up to
            `max_wait` seconds for room (backpressure), then the queue is dropped and the
            replica marked for repair (at once when the replica is down).
        failover_reads: read from the most up-to-date replica that is up when the primary
            cannot be reached (on by default); it may lag behind the primary by its queue.
        promote: when the primary cannot be reached, make that replica the primary for writes
            too (the old primary becomes a replica, marked for a full repair); off by default:
            writes then fail with `PrimaryUnavailableError`.
        names: a name per replica for status and reports (default `replica-0`, ...).
        linger: seconds a replica waits after a write comes for more of them, to apply them as
            one batch (async modes; a quorum write goes at once).

    Example:
        >>> cp = ReplicatedCheckpointer(pg, [redis_cp, sqlite_cp], "quorum")  # doctest: +SKIP
        >>> graph = builder.compile(checkpointer=cp)                          # doctest: +SKIP
        >>> print(cp.status()); print(cp.repair().summary())                  # doctest: +SKIP
    """

    def __init__(
        self,
        primary: BaseCheckpointSaver[Any],
        replicas: Sequence[BaseCheckpointSaver[Any] | str | tuple[str, dict[str, Any]]],
        consistency: Consistency = "async",
        *,
        quorum: int = 1,
        max_queue: int = 10_000,
        max_wait: float = 5.0,
        quorum_timeout: float = 30.0,
        repair_interval: float = 60.0,
        full_repair_every: int = 10,
        failover_reads: bool = True,
        promote: bool = False,
        retry_primary_after: float = 1.0,
        names: Sequence[str] | None = None,
        linger: float = 0.01,
    ) -> None:
        if not isinstance(primary, BaseCheckpointSaver):
            raise InvalidConfigError(f"primary must be a BaseCheckpointSaver, got {primary!r}")
        replicas = [_replica_spec(r) for r in replicas]
        for r in replicas:
            if r is primary:
                raise InvalidConfigError("a replica is the primary itself: replicas must be "
                                         "other checkpointers")
        if len({id(r) for r in replicas}) != len(replicas):
            raise InvalidConfigError("the same checkpointer is given twice as a replica")
        if consistency not in _MODES:
            raise InvalidConfigError(
                f"unknown consistency {consistency!r}: use one of {', '.join(_MODES)}")
        if consistency == "quorum":
            if not replicas:
                raise InvalidConfigError("consistency='quorum' needs at least one replica")
            if not 1 <= quorum <= len(replicas):
                raise InvalidConfigError(
                    f"quorum={quorum} must be between 1 and the number of replicas "
                    f"({len(replicas)})")
        for name, value in (("max_wait", max_wait), ("quorum_timeout", quorum_timeout),
                            ("repair_interval", repair_interval),
                            ("retry_primary_after", retry_primary_after), ("linger", linger)):
            if not value >= 0:
                raise InvalidConfigError(f"{name} must be >= 0, got {value!r}")
        if max_queue < 1:
            raise InvalidConfigError(f"max_queue must be >= 1, got {max_queue!r}")
        names = list(names) if names is not None else [f"replica-{i}" for i in range(len(replicas))]
        if len(names) != len(replicas) or len(set(names)) != len(names):
            raise InvalidConfigError("names must give each replica a different name")
        super().__init__(serde=primary.serde)
        self.primary = primary
        self.consistency = consistency
        self.quorum = quorum
        self.max_queue, self.max_wait, self.quorum_timeout = max_queue, max_wait, quorum_timeout
        self.repair_interval = repair_interval
        self.full_repair_every = max(1, int(full_repair_every))
        # Threads written since the last background repair (None: a write named no thread).
        self._written: set[str] | None = set()
        self.failover_reads, self.promote = failover_reads, promote
        self.retry_primary_after = retry_primary_after
        self.linger = linger
        self._seq = 0
        self._replicator: Any = None
        self._replicas: list[Any] = []
        urls: list[tuple[str, str, dict[str, Any]]] = []
        for n, r in zip(names, replicas, strict=True):
            if isinstance(r, tuple):
                from ._replicator import ProcessReplica

                self._replicas.append(ProcessReplica(n, len(urls), r[0], r[1], self))
                urls.append((n, r[0], r[1]))
            else:
                self._replicas.append(_Replica(n, cast(BaseCheckpointSaver[Any], r), self))
        if urls:
            from ._replicator import Replicator

            self._replicator = Replicator(urls, _deliver(self._replicas), linger)
        # Quorum writes carry values instead: a replica that lost an append-delta's base (a
        # restart) then writes that value whole, and the write still counts for the quorum.
        # With rows it would refuse the write until repaired, which async replication leaves
        # to `repair()` / anti-entropy.
        self._rows = consistency != "quorum" and isinstance(primary, StoreCheckpointer) and all(
            primary.rows_compatible(r.saver) if isinstance(r, _Replica)
            # a replica given as a URL is opened with the defaults, plus its options
            else primary.rows_compatible(primary) and not {"serde", "audit"} & set(r.options)
            for r in self._replicas
        )
        self._lock = threading.Lock()  # the order ops are queued in: the primary's
        self._primary_down_until = 0.0
        self._primary_error: BaseException | None = None
        self._closed = threading.Event()
        self._repairing = threading.Lock()
        # A thread's repair and the writes to it exclude each other: a write to a thread being
        # repaired waits (before the primary is touched), a thread with a write in flight (on
        # the primary, not yet queued) is not repaired. Else a repair reads the primary and a
        # replica at different moments of a write, and copies it twice or deletes it.
        self._gate = threading.Condition()
        self._in_flight: Counter[str | None] = Counter()  # None: threads unknown (by run ids)
        self._held: set[str] = set()  # threads being repaired
        self._repairer: threading.Thread | None = None
        if consistency == "anti_entropy":
            self._repairer = threading.Thread(
                target=_anti_entropy, args=(weakref.ref(self), self._closed),
                name="lgckpt-anti-entropy", daemon=True)
            self._repairer.start()
        self._lifetime = Lifetime(type(self).__name__, functools.partial(
            _wind_down, self._replicas, self._replicator, self._closed))
        self._owned: StoreCheckpointer | None = None  # the primary `from_conn_string` opened

    @classmethod
    def from_conn_string(
        cls,
        primary: str,
        replicas: Sequence[BaseCheckpointSaver[Any] | str | tuple[str, dict[str, Any]]],
        consistency: Consistency = "async",
        *,
        connect_options: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> Opening[ReplicatedCheckpointer]:
        """A `ReplicatedCheckpointer` whose primary is what `connect(primary)` opens, for
        `with` or `async with`: on exit, what is queued is applied and the primary closed
        (with the replicas given as URLs; replicas given as objects stay the caller's).

        Args:
            primary: a URL for `connect`, with its query options.
            replicas, consistency, options: as for the constructor.
            connect_options: keyword options for `connect` (the primary's).

        Example:
            >>> with ReplicatedCheckpointer.from_conn_string(  # doctest: +SKIP
            ...         "postgresql://db/app", ["sqlite:///replica.db"]) as cp:
            ...     graph = builder.compile(checkpointer=cp)
        """
        specs = [_replica_spec(r) for r in replicas]  # refused before anything opens
        return around(primary, connect_options,
                      lambda saver: cls(saver, specs, consistency, **options))

    @property
    def replicas(self) -> list[BaseCheckpointSaver[Any]]:
        return [r.saver for r in self._replicas]

    # -- status -----------------------------------------------------------------------------

    def status(self) -> ReplicationStatus:
        """Whether the primary is up, and per replica: up, queued operations, the oldest
        unreplicated age, the last error, whether it needs a repair."""
        down = time.monotonic() < self._primary_down_until
        err = self._primary_error
        return ReplicationStatus(
            not down, None if err is None or not down else _describe(err),
            [r.status() for r in self._replicas],
        )

    # -- writing ----------------------------------------------------------------------------

    def _check_quorum(self) -> None:
        """Before the primary is touched: not closed, and enough replicas up for a quorum
        write."""
        if self._closed.is_set():
            raise ReplicationError(
                "this ReplicatedCheckpointer is closed: its replicas no longer follow, so it "
                "takes no more writes (open a new one over the same checkpointers)")
        if self.consistency != "quorum":
            return
        up = [r for r in self._replicas if r.up]
        if len(up) < self.quorum:
            down = ", ".join(f"{r.name} ({_describe(r.last_error) if r.last_error else 'down'})"
                             for r in self._replicas if not r.up)
            raise QuorumUnavailableError(
                f"quorum write needs {self.quorum} replica(s) up, {len(up)} are: {down}. "
                "Nothing was written; retry once they are back, or lower quorum")

    def _enqueue(self, kind: str, args: tuple[Any, ...], threads: tuple[str, ...]) -> _Op:
        ack = _Ack(self.quorum, len(self._replicas)) if self.consistency == "quorum" else None
        op = _Op(kind, args, threads, time.monotonic(), ack)
        with self._lock:
            self._seq += 1
            op.seq = self._seq
            if self._repairer is not None:
                if not threads or kind == "delete_runs":
                    self._written = None
                elif self._written is not None:
                    self._written.update(threads)
            targets = []
            for r in self._replicas:
                r.push(op, self.max_wait)
                if r.thread is None and hasattr(r, "index"):  # applied in the child
                    targets.append(r.index)
            if self._replicator is not None:
                self._replicator.ship(op, targets)
        return op

    def _primary_known_down(self) -> None:
        """A quorum write while the primary is known to be down (and no replica may take its
        place): refused before any replica is touched."""
        if not self.promote and time.monotonic() < self._primary_down_until:
            self._fallback(True, self._primary_error, self.primary)  # raises

    def _withdraw(self, op: _Op) -> None:
        """A quorum write that failed: taken off every replica's queue where it still waits;
        a replica that applied it (or may have) is marked for repair."""
        for r in self._replicas:
            r.withdraw(op)

    def _undo(self, threads: tuple[str, ...]) -> None:
        """After a quorum write that failed: its threads repaired on the replicas that can be
        now, which removes it from those that took it (the others stay marked for repair)."""
        if threads:
            with contextlib.suppress(Exception):  # reported in each replica's status
                self._repair(sorted(set(threads)))

    def _refusal(self, ack: _Ack) -> BaseException:
        """Why a quorum write failed: the replicas' own error when they all refused it as a bad
        request, else `QuorumUnavailableError`."""
        if ack.errors and not any(_unavailable(e) for _, e in ack.errors):
            return ack.errors[0][1]
        why = "; ".join(f"{n}: {_describe(e)}" for n, e in ack.errors) or (
            f"no answer within {self.quorum_timeout} s")
        return QuorumUnavailableError(
            f"only {ack.ok} of the {self.quorum} replica(s) the quorum needs confirmed the write "
            f"({why}), so it was not written to the primary: no read of it shows the write. "
            "Replicas that took it were repaired, or are marked for repair (`status()`, "
            "`repair()`); retry once they are back, or lower quorum")

    def _after_quorum_failure(self, op: _Op, failed: BaseException | None,
                              threads: tuple[str, ...]) -> BaseException:
        """What a failed quorum write leaves (nothing a reader of the primary sees), and the
        error to raise: `failed` (the primary's) or why the quorum was not met."""
        if failed is None or (isinstance(failed, Exception) and not _unavailable(failed)):
            self._undo(threads)  # else the primary cannot be read for a repair now
        return failed if failed is not None else self._refusal(cast(_Ack, op.ack))

    def _quorum_write(self, kind: str, call: Callable[[BaseCheckpointSaver[Any]], T],
                      args: tuple[Any, ...], threads: tuple[str, ...]) -> T:
        """A quorum write goes to the replicas first, and to the primary (where every read
        goes) only once `quorum` of them confirmed it: a write that fails its quorum is never
        seen as stored. It is then withdrawn from the replicas (`_after_quorum_failure`)."""
        self._primary_known_down()
        self._enter(threads)
        failed: BaseException | None = None
        try:
            op = self._enqueue(kind, args, threads)
            ack = cast(_Ack, op.ack)
            try:
                if ack.wait(self.quorum_timeout) and ack.succeeded:
                    return self._on_primary(call, write=True)
            except BaseException as exc:
                failed = exc
            self._withdraw(op)
        finally:
            self._leave(threads)
        raise self._after_quorum_failure(op, failed, threads)

    async def _aquorum_write(self, kind: str, call: Callable[[BaseCheckpointSaver[Any]], Any],
                             args: tuple[Any, ...], threads: tuple[str, ...]) -> Any:
        self._primary_known_down()
        await self._aenter(threads)
        failed: BaseException | None = None
        try:
            op = await self._aenqueue(kind, args, threads)
            ack = cast(_Ack, op.ack)
            try:
                if await ack.await_(self.quorum_timeout) and ack.succeeded:
                    return await self._aon_primary(call, write=True)
            except BaseException as exc:
                failed = exc
            self._withdraw(op)
        finally:
            self._leave(threads)
        if failed is not None and not isinstance(failed, Exception):  # cancelled: no repair
            raise failed
        raise await asyncio.to_thread(self._after_quorum_failure, op, failed, threads)

    def _blocked(self, threads: tuple[str, ...]) -> bool:
        """Whether a write to `threads` must wait for a repair (under `_gate`)."""
        return any(t in self._held for t in threads) if threads else bool(self._held)

    def _enter(self, threads: tuple[str, ...]) -> None:
        with self._gate:
            while self._blocked(threads):
                self._gate.wait()
            for t in threads or (None,):
                self._in_flight[t] += 1

    async def _aenter(self, threads: tuple[str, ...]) -> None:
        while True:  # a repair holds a thread briefly: polled, off nobody's thread
            with self._gate:
                if not self._blocked(threads):
                    for t in threads or (None,):
                        self._in_flight[t] += 1
                    return
            await asyncio.sleep(0.005)

    def _leave(self, threads: tuple[str, ...]) -> None:
        with self._gate:
            for t in threads or (None,):
                self._in_flight[t] -= 1
                if self._in_flight[t] <= 0:
                    del self._in_flight[t]

    def _hold(self, thread_id: str) -> bool:
        """Hold a thread's writes off for its repair; False when one is in flight."""
        with self._gate:
            if self._in_flight.get(thread_id) or self._in_flight.get(None):
                return False
            self._held.add(thread_id)
            return True

    def _unhold(self, thread_id: str) -> None:
        with self._gate:
            self._held.discard(thread_id)
            self._gate.notify_all()

    def _write(self, kind: str, call: Callable[[BaseCheckpointSaver[Any]], T],
               args: tuple[Any, ...] | Callable[[], tuple[Any, ...]],
               threads: tuple[str, ...]) -> T:
        """Write to the primary, then queue the op for the replicas (`args`: the op's, or
        what makes them once the primary is written); a quorum write the other way round."""
        self._check_quorum()
        if self.consistency == "quorum":  # values, never rows: `args` is a tuple
            return self._quorum_write(kind, call, cast(tuple[Any, ...], args), threads)
        self._enter(threads)
        try:
            result = self._on_primary(call, write=True)
            self._enqueue(kind, args() if callable(args) else args, threads)
        finally:
            self._leave(threads)
        return result

    async def _awrite(self, kind: str, call: Callable[[BaseCheckpointSaver[Any]], Any],
                      args: tuple[Any, ...] | Callable[[], tuple[Any, ...]],
                      threads: tuple[str, ...]) -> Any:
        self._check_quorum()
        if self.consistency == "quorum":
            return await self._aquorum_write(kind, call, cast(tuple[Any, ...], args), threads)
        await self._aenter(threads)
        try:
            result = await self._aon_primary(call, write=True)
            await self._aenqueue(kind, args() if callable(args) else args, threads)
        finally:
            self._leave(threads)
        return result

    async def _aenqueue(self, kind: str, args: tuple[Any, ...], threads: tuple[str, ...]
                        ) -> _Op:
        # A full queue waits for room: on a thread, not on the caller's event loop.
        if any(len(r.queue) >= self.max_queue for r in self._replicas):
            return await asyncio.to_thread(self._enqueue, kind, args, threads)
        return self._enqueue(kind, args, threads)

    # A replica applies a put later, from another thread, while LangGraph goes on; and LangGraph
    # changes some values in place (`add_messages` gives ids to the messages of an input or a
    # write once it applies them, maybe before a background put has serialized them). So the
    # primary and the replicas all get one copy taken when the call came: a channel's list
    # shallowly (its items are stored values, no longer changed), anything else through the
    # serializer.

    def _frozen_put(self, config: RunnableConfig, checkpoint: Checkpoint,
                    metadata: CheckpointMetadata, new_versions: ChannelVersions
                    ) -> tuple[Any, ...]:
        checkpoint = copy_checkpoint(checkpoint)
        values = checkpoint["channel_values"]
        for ch in new_versions:
            if ch in values:
                values[ch] = self._frozen(values[ch])
        return (config, checkpoint, self._frozen(dict(metadata)), dict(new_versions))

    def _frozen(self, value: Any) -> Any:
        """A copy of `value` that later changes in place cannot reach (a list's items too: a
        message may be changed in place and put again)."""
        if value is None or isinstance(value, str | int | float | bool | bytes):
            return value
        return self.serde.loads_typed(self.serde.dumps_typed(value))

    def _frozen_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                       task_id: str, task_path: str) -> tuple[Any, ...]:
        frozen = [(ch, self._frozen(v)) for ch, v in writes]
        return (config, frozen, task_id, task_path)

    # Our checkpointers, all with LangGraph's own serializer: the primary encodes each write
    # once, and the replicas store the very rows it stored (`awrite_rows`), taken when the
    # call came (later changes in place cannot reach bytes). Otherwise each replica gets the
    # call's values, copied (`_frozen_*`), and encodes them itself.

    def _rows_write(self, op: tuple[Any, ...]) -> tuple[Any, Callable[[], tuple[Any, ...]]]:
        made: list[PreparedBatch] = []

        def call(s: BaseCheckpointSaver[Any]) -> Any:
            batch = s.prepare_batch([op], portable=True)  # type: ignore[attr-defined]
            s.write_prepared([batch])  # type: ignore[attr-defined]
            made.append(batch)
            return _put_config(batch)

        return call, lambda: (made[-1].rows(),)

    def _arows_write(self, op: tuple[Any, ...]) -> tuple[Any, Callable[[], tuple[Any, ...]]]:
        made: list[PreparedBatch] = []

        async def call(s: BaseCheckpointSaver[Any]) -> Any:
            batch = await s.aprepare_batch([op], portable=True)  # type: ignore[attr-defined]
            await s.awrite_prepared([batch])  # type: ignore[attr-defined]
            made.append(batch)
            return _put_config(batch)

        return call, lambda: (made[-1].rows(),)

    def put(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
            new_versions: ChannelVersions) -> RunnableConfig:
        threads = (thread_id_of(config),)
        if self._rows:
            call, rows = self._rows_write(("put", config, checkpoint, metadata, new_versions))
            return self._write("rows", call, rows, threads)  # type: ignore[no-any-return]
        args = self._frozen_put(config, checkpoint, metadata, new_versions)
        return self._write("put", lambda s: s.put(*args), args, threads)

    async def aput(self, config: RunnableConfig, checkpoint: Checkpoint,
                   metadata: CheckpointMetadata, new_versions: ChannelVersions) -> RunnableConfig:
        threads = (thread_id_of(config),)
        if self._rows:
            call, rows = self._arows_write(("put", config, checkpoint, metadata, new_versions))
            return await self._awrite("rows", call, rows, threads)  # type: ignore[no-any-return]
        args = self._frozen_put(config, checkpoint, metadata, new_versions)
        return await self._awrite(  # type: ignore[no-any-return]
            "put", lambda s: s.aput(*args), args, threads)

    def put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str,
                   task_path: str = "") -> None:
        threads = (thread_id_of(config),)
        if self._rows:
            call, rows = self._rows_write(("writes", config, writes, task_id, task_path))
            self._write("rows", call, rows, threads)
            return
        args = self._frozen_writes(config, writes, task_id, task_path)
        self._write("writes", lambda s: s.put_writes(*args), args, threads)

    async def aput_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                          task_id: str, task_path: str = "") -> None:
        threads = (thread_id_of(config),)
        if self._rows:
            call, rows = self._arows_write(("writes", config, writes, task_id, task_path))
            await self._awrite("rows", call, rows, threads)
            return
        args = self._frozen_writes(config, writes, task_id, task_path)
        await self._awrite("writes", lambda s: s.aput_writes(*args), args, threads)

    def delete_thread(self, thread_id: str) -> None:
        self._write("delete", lambda s: s.delete_thread(thread_id), (thread_id,),
                    (str(thread_id),))

    async def adelete_thread(self, thread_id: str) -> None:
        await self._awrite("delete", lambda s: s.adelete_thread(thread_id), (thread_id,),
                           (str(thread_id),))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        ids = list(run_ids)
        self._write("delete_runs", lambda s: s.delete_for_runs(ids), (ids,), ())

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        ids = list(run_ids)
        await self._awrite("delete_runs", lambda s: s.adelete_for_runs(ids), (ids,), ())

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        args = (source_thread_id, target_thread_id)
        self._write("copy", lambda s: s.copy_thread(*args), args,
                    (str(source_thread_id), str(target_thread_id)))

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        args = (source_thread_id, target_thread_id)
        await self._awrite("copy", lambda s: s.acopy_thread(*args), args,
                           (str(source_thread_id), str(target_thread_id)))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        ids = list(thread_ids)
        self._write("prune", lambda s: s.prune(ids, strategy=strategy), (ids, strategy),
                    tuple(map(str, ids)))

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        ids = list(thread_ids)
        await self._awrite("prune", lambda s: s.aprune(ids, strategy=strategy), (ids, strategy),
                           tuple(map(str, ids)))

    # -- the primary, and failing over ------------------------------------------------------

    def _primary_down(self, exc: BaseException, failed: BaseCheckpointSaver[Any]) -> None:
        with self._lock:  # atomic with a promotion (which clears this)
            if self.primary is failed:  # not a primary a concurrent call has since replaced
                self._primary_down_until = time.monotonic() + self.retry_primary_after
                self._primary_error = exc

    def _fallback(self, write: bool, cause: BaseException | None,
                  failed: BaseCheckpointSaver[Any]) -> BaseCheckpointSaver[Any]:
        """Where a call goes while the primary (`failed`) is down: a replica for reads
        (failover), or, for writes, a promoted replica; else `PrimaryUnavailableError`."""
        if self.primary is not failed:  # a concurrent call has promoted a replica meanwhile
            return self.primary
        why = _describe(cause) if cause is not None else "down"
        if write and not self.promote:
            raise PrimaryUnavailableError(
                f"the primary is unreachable ({why}): writes are refused so that the replicas "
                "do not diverge from it. Retry once it is back, or pass promote=True to make a "
                "replica the primary") from cause
        if not write and not self.failover_reads:
            raise PrimaryUnavailableError(
                f"the primary is unreachable ({why}) and failover_reads is off") from cause
        best = self._best_replica()
        if best is None:
            raise PrimaryUnavailableError(
                f"the primary is unreachable ({why}) and no replica is up") from cause
        if write:
            self._promote(best, failed)
            return self.primary
        return best.saver

    def _best_replica(self) -> _Replica | None:
        """The replica that is up, needs no repair, with the shortest queue."""
        up = [r for r in self._replicas if r.up]
        up.sort(key=lambda r: (r.repair_all or bool(r.to_repair), len(r.queue)))
        return up[0] if up else None

    def _promote(self, replica: _Replica, failed: BaseCheckpointSaver[Any]) -> None:
        """Make `replica` the primary in place of `failed`: what is queued for it is applied
        first; the old primary becomes a replica under the same name, marked for a full
        repair."""
        with self._lock:
            if self.primary is not failed:  # promoted by a concurrent call meanwhile
                return
            deadline = time.monotonic() + self.max_wait
            with replica.cond:
                while not replica.drained() and replica.up and time.monotonic() < deadline:
                    replica.cond.wait(0.05)
            replica.stop()
            old = self.primary
            # The old primary's down window goes first: a call that sees the new primary must
            # not see that window (it would promote another replica in its place).
            self._primary_down_until = 0.0
            self._primary_error = None
            self.primary = replica.saver
            demoted = _Replica(replica.name, old, self)
            demoted.up = False
            demoted.repair_all = True
            self._replicas[self._replicas.index(replica)] = demoted
            demoted.start()  # probes the old primary until it answers

    def _on_primary(self, call: Callable[[BaseCheckpointSaver[Any]], T], write: bool = False) -> T:
        primary = self.primary
        if time.monotonic() < self._primary_down_until:
            return call(self._fallback(write, self._primary_error, primary))
        try:
            return call(primary)
        except BaseException as exc:
            if not _unavailable(exc) or not (self._replicas and (
                    self.failover_reads or write)):
                raise
            self._primary_down(exc, primary)
            return call(self._fallback(write, exc, primary))

    async def _aon_primary(self, call: Callable[[BaseCheckpointSaver[Any]], Any],
                           write: bool = False) -> Any:
        primary, loop = self.primary, asyncio.get_running_loop()
        if time.monotonic() < self._primary_down_until:
            return await call(self._fallback(write, self._primary_error, primary))
        try:
            return await call(primary)
        except BaseException as exc:
            if _caller_gone(loop) or not _unavailable(exc) or not (self._replicas and (
                    self.failover_reads or write)):
                raise
            self._primary_down(exc, primary)
            return await call(self._fallback(write, exc, primary))

    # -- reading ----------------------------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return self._on_primary(lambda s: s.get_tuple(config))

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await self._aon_primary(  # type: ignore[no-any-return]
            lambda s: s.aget_tuple(config))

    def list(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
             before: RunnableConfig | None = None, limit: int | None = None
             ) -> Iterator[CheckpointTuple]:
        validate_filter(filter)  # raise here, not at the first next()
        # Fail over only before the first item: a listing never mixes two stores.
        return self._on_primary(lambda s: _started(
            s.list(config, filter=filter, before=before, limit=limit)))

    async def alist(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
                    before: RunnableConfig | None = None, limit: int | None = None
                    ) -> AsyncIterator[CheckpointTuple]:
        validate_filter(filter)
        first, rest = await self._aon_primary(lambda s: _astarted(
            s.alist(config, filter=filter, before=before, limit=limit)))
        if first is _END:
            return
        yield first
        async for tup in rest:
            yield tup

    def get_delta_channel_history(self, *, config: RunnableConfig, channels: Sequence[str]
                                  ) -> Mapping[str, DeltaChannelHistory]:
        return self._on_primary(
            lambda s: s.get_delta_channel_history(config=config, channels=channels))

    async def aget_delta_channel_history(self, *, config: RunnableConfig, channels: Sequence[str]
                                         ) -> Mapping[str, DeltaChannelHistory]:
        return await self._aon_primary(  # type: ignore[no-any-return]
            lambda s: s.aget_delta_channel_history(config=config, channels=channels))

    def get_next_version(self, current: Any, channel: Any = None) -> Any:
        return self.primary.get_next_version(current, channel)

    # -- the primary's helpers (`Forwarded`) ------------------------------------------------

    def _forward(self, name: str, threads: Sequence[str] | None, *args: Any, **kwargs: Any
                 ) -> Any:
        result = self._on_primary(
            lambda s: store_method(s, name, "primary")(*args, **kwargs), write=name in _WRITES)
        if name == "migrate_threads":
            self._migrated(result)
        return result

    async def _aforward(self, name: str, threads: Sequence[str] | None, *args: Any,
                        **kwargs: Any) -> Any:
        result = await self._aon_primary(
            lambda s: store_method(s, name, "primary")(*args, **kwargs), write=name in _WRITES)
        if name == "amigrate_threads":
            await asyncio.to_thread(self._migrated, result)
        return result

    def _migrated(self, report: MigrationReport) -> None:
        """After a migration of the primary, the threads it rewrote are repaired on every
        replica (a replica that is down, or a thread with writes queued, stays marked for
        repair: `status()` says so, the next `repair()` does it)."""
        threads = sorted({c.thread_id for c in report.changes})
        if report.dry_run or not threads:
            return
        for r in self._replicas:
            with r.cond:
                r.to_repair.update(threads)
        self._repair(threads)

    if not TYPE_CHECKING:  # (for mypy, an unknown attribute stays an error)
        def __getattr__(self, name: str) -> Any:
            raise not_forwarded(self, "primary", name, "the replicas")

    # -- waiting, repairing, closing --------------------------------------------------------

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every replica that is up has applied its queue; False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for r in self._replicas:
            with r.cond:
                while r.up and not r.drained():
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        return False
                    r.cond.wait(0.05 if left is None else min(left, 0.05))
        return True

    async def aflush(self, timeout: float | None = None) -> bool:
        return await asyncio.to_thread(self.flush, timeout)

    def repair(self, thread_ids: Sequence[str] | None = None, *,
               progress: Callable[[str, int, int], None] | None = None) -> RepairReport:
        """Make every replica that is up equal to the primary.

        Per thread (all of them, or `thread_ids`), checkpoint ids and content hashes (values,
        metadata, pending writes) are compared. Missing checkpoints and writes are copied; a
        thread holding checkpoints or writes the primary does not (or different ones) is
        deleted on the replica and copied whole; a thread the primary no longer holds is
        deleted. A thread with writes still queued for the replica is skipped and reported.
        Running it again after it stopped resumes: equal threads are only compared.
        `progress(replica, done, total)` is called after each thread."""
        return self._repair(thread_ids, progress)

    def _repair(self, thread_ids: Sequence[str] | None,
                progress: Callable[[str, int, int], None] | None = None,
                quick: bool = False) -> RepairReport:
        """`repair()`. `quick` (anti-entropy's passes between full ones): a thread not marked
        for repair that has as many stored rows, per kind and channel, on both stores
        (`sizes`, one query each) counts as equal without reading its values: lost rows are
        found at once, changed values at the next full pass."""
        started = time.monotonic()
        with self._repairing:
            reports = [self._repair_one(r, thread_ids, progress, quick) for r in self._replicas]
        return RepairReport(reports, time.monotonic() - started)

    async def arepair(self, thread_ids: Sequence[str] | None = None, *,
                      progress: Callable[[str, int, int], None] | None = None) -> RepairReport:
        return await asyncio.to_thread(self.repair, thread_ids, progress=progress)

    def _repair_one(self, replica: _Replica, only: Sequence[str] | None,
                    progress: Callable[[str, int, int], None] | None,
                    quick: bool = False) -> ReplicaRepair:
        report = ReplicaRepair(replica.name)
        if not replica.up:
            report.error = f"down: {_describe(replica.last_error) if replica.last_error else ''}"
            return report
        with replica.cond:
            marked, full = set(replica.to_repair), replica.repair_all
        try:
            if only is not None:
                threads = sorted(set(map(str, only)))
            else:
                from ..transfer import thread_ids

                threads = sorted(set(thread_ids(self.primary)) | set(thread_ids(replica.saver)))
            for n, thread_id in enumerate(threads, 1):
                if self._closed.is_set() and threading.current_thread() is self._repairer:
                    report.error = "closed"  # the background repair stops with close()
                    return report
                if not self._hold(thread_id):
                    report.threads_skipped.append(thread_id)
                else:
                    try:
                        with replica.cond:
                            busy = replica.busy.get(thread_id, 0) > 0
                        if busy:
                            report.threads_skipped.append(thread_id)
                        else:
                            try:
                                _repair_thread(self.primary, replica.saver, thread_id, report,
                                               quick and thread_id not in marked)
                            except Exception as exc:
                                if _unavailable(exc):
                                    raise  # a store is down: stop; the next run resumes
                                # this thread only (e.g. a value the replica refuses)
                                report.threads_failed[thread_id] = _describe(exc)
                            else:
                                with replica.cond:
                                    replica.to_repair.discard(thread_id)
                    finally:
                        self._unhold(thread_id)
                if progress is not None:
                    progress(replica.name, n, len(threads))
        except BaseException as exc:
            report.error = _describe(exc)
            return report
        with replica.cond:
            if only is None and full and not report.threads_skipped and not (
                    report.threads_failed):
                replica.repair_all = False
            if only is None:  # marked threads neither store holds any more
                replica.to_repair -= marked - set(report.threads_skipped)
        return report

    def _anti_entropy_pass(self, passes: int) -> None:
        """Repair the threads written since the last pass and those marked for repair; every
        `full_repair_every` passes (and when a write named no thread), every thread (a replica
        may also lose data no write of ours tells of: a restart)."""
        with self._lock:
            written, self._written = self._written, set()
        full = written is None or passes % self.full_repair_every == 0
        marked = set().union(*(r.to_repair for r in self._replicas))
        if not full and not written and not marked and not any(
                r.repair_all for r in self._replicas):
            return
        if any(r.repair_all for r in self._replicas):
            full = True
        try:
            report = self._repair(None if full else sorted((written or set()) | marked),
                                  quick=not full)
        except Exception:  # reported in each replica's status; tried again next pass
            return
        busy = {t for r in report.replicas for t in r.threads_skipped}
        with self._lock:  # compared again next time
            if self._written is not None:
                self._written |= busy

    def close(self, timeout: float | None = 30.0) -> None:
        """Apply what is queued (up to `timeout` s), then stop the workers and the background
        repair. The primary and replicas are the caller's and stay open."""
        self.flush(timeout)
        self._lifetime.closed()
        self._closed.set()
        for r in self._replicas:
            r.stop()
        for r in self._replicas:
            if r.thread is not None:
                r.thread.join(timeout=5)
        if self._replicator is not None:
            self._replicator.close()
        for r in self._replicas:
            if hasattr(r, "close"):  # the reader a URL replica opened here
                r.close()
        if self._repairer is not None and self._repairer is not threading.current_thread():
            self._repairer.join(timeout=5)  # before the caller closes the stores it reads
        owned, self._owned = self._owned, None
        if owned is not None:
            owned.close()

    async def aclose(self, timeout: float | None = 30.0) -> None:
        await asyncio.to_thread(self.close, timeout)

    def __enter__(self) -> ReplicatedCheckpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> ReplicatedCheckpointer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _anti_entropy(ref: weakref.ref[ReplicatedCheckpointer], closed: threading.Event) -> None:
    """The background repair: a pass every `repair_interval` (holding the checkpointer only
    during a pass), until it is closed or dropped."""
    passes = 0
    while True:
        cp = ref()
        if cp is None:
            return
        interval = cp.repair_interval
        del cp
        if closed.wait(interval):
            return
        cp = ref()
        if cp is None:
            return
        passes += 1
        cp._anti_entropy_pass(passes)
        del cp


def _deliver(replicas: Sequence[Any]) -> Callable[[list[Any]], None]:
    """What the replicator process's replicas did, for its reader thread to hand to their
    views here (`ProcessReplica`)."""
    by_index = {r.index: r for r in replicas if r.thread is None and hasattr(r, "index")}

    def on_events(events: list[Any]) -> None:
        for kind, index, *rest in events:
            r = by_index.get(index)
            if r is not None:
                with r.cond:
                    r.event(kind, *rest)

    return on_events


def _wind_down(replicas: Sequence[Any], replicator: Any, closed: threading.Event) -> None:
    """`close()` of a checkpointer dropped unclosed, without waiting: the workers apply what
    is queued and stop, the background repair stops, the replicator process ends (and the
    readers opened here close), in a thread of their own."""
    closed.set()
    for r in replicas:
        r.stop()

    def finish() -> None:
        if replicator is not None:
            replicator.close()
        for r in replicas:
            if hasattr(r, "close"):
                r.close()

    if replicator is not None or any(hasattr(r, "close") for r in replicas):
        threading.Thread(target=finish, name="lgckpt-replicated-close", daemon=True).start()


def _replica_spec(r: Any) -> Any:
    """A replica as given: a checkpointer, or `(url, options)` for the replicator process."""
    if isinstance(r, BaseCheckpointSaver):
        return r
    if isinstance(r, str):
        r = (r, {})
    if (isinstance(r, tuple) and len(r) == 2 and isinstance(r[0], str)
            and isinstance(r[1], dict)):
        try:
            parsed = parse_url(r[0])  # refused here, not in the replicator process
            parsed.arguments(r[1])
        except InvalidConfigError as exc:
            raise InvalidConfigError(f"replica URL: {exc}") from None
        if parsed.backend == "memory":
            raise InvalidConfigError(
                f"a replica URL must be sqlite:///..., postgresql://... or redis://..., got "
                f"{parsed.redacted!r} (a memory:// replica in another process would be lost "
                "with it)")
        return r
    what = "a tuple that is not (url, options)" if isinstance(r, tuple) else repr(r)
    raise InvalidConfigError(
        f"each replica must be a BaseCheckpointSaver, a URL or (url, options), got {what}")


# -- listing helpers --------------------------------------------------------------------------

_END: Any = object()


def _started(it: Iterator[CheckpointTuple]) -> Iterator[CheckpointTuple]:
    """Take the first item now (so that a failing store fails here), then the rest."""
    first = next(it, _END)
    if first is _END:
        return iter(())

    def rest() -> Iterator[CheckpointTuple]:
        yield first
        yield from it

    return rest()


async def _astarted(it: AsyncIterator[CheckpointTuple]
                    ) -> tuple[Any, AsyncIterator[CheckpointTuple]]:
    first = await anext(it, _END)
    return first, it


# -- repair -----------------------------------------------------------------------------------


def _repair_thread(primary: BaseCheckpointSaver[Any], replica: BaseCheckpointSaver[Any],
                   thread_id: str, report: ReplicaRepair, quick: bool = False) -> None:
    """One thread: compared and written by `transfer` (the same code as `lgckpt copy`)."""
    from ..transfer import diff_thread, put_thread, thread_tuples

    if quick and isinstance(primary, StoreCheckpointer) and isinstance(
            replica, StoreCheckpointer):
        # Rows, not bytes: each backend counts the bytes of its own layout.
        def rows(saver: StoreCheckpointer) -> list[tuple[str, str, str, int]]:
            return sorted((s.checkpoint_ns, s.kind, s.channel, s.rows)
                          for s in saver.sizes(thread_id))

        ours = rows(primary)
        if ours and ours == rows(replica):
            report.threads_checked += 1
            report.threads_equal += 1
            return

    source = thread_tuples(primary, thread_id)
    target = thread_tuples(replica, thread_id)
    report.threads_checked += 1
    if not source:
        if target:
            replica.delete_thread(thread_id)
            report.threads_deleted.append(thread_id)
        else:
            report.threads_equal += 1
        return
    d = diff_thread(primary.serde, thread_id, source, target)
    if d.equal:
        report.threads_equal += 1
        return
    if d.conflict is not None:  # held things the primary does not: written again whole
        replica.delete_thread(thread_id)
        report.threads_rebuilt.append(thread_id)
    checkpoints, writes = put_thread(replica, thread_id, source, d.missing)
    report.checkpoints_copied += checkpoints
    report.writes_copied += writes
