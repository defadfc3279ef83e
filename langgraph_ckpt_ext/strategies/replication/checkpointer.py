"""`ReplicatedCheckpointer`: a primary and replicas, with the consistency the user chooses.

Every write goes to the primary first (a quorum write last: see `writes.py`). Then, per
replica, it is queued (bounded) and applied in the primary's order by a worker thread of that
replica (`worker.py`), or by the replicator process (`process.py`), consecutive checkpoints
and writes in one batch where the replica can take one. A replica that fails is marked down
and retried with backoff; its queue waits for it. A queue that overflows is dropped and the
replica marked for repair: `repair()` compares every thread with the primary and copies,
rebuilds or deletes what differs (`repair.py`). Reads go to the primary and fail over to the
most up-to-date replica that is up when the primary cannot be reached (`failover.py`).

Each call is written once, as a coroutine taking `sync` (`calls.py`): the sync method runs it
with `run_inline`, the async one awaits it. LangGraph's saver methods are in `interface.py`;
this class adds its construction, the primary's helpers, repairs and closing.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import weakref
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from langgraph.checkpoint.base import BaseCheckpointSaver

from ...connecting import around
from ...core.bridge import either, run_inline
from ...core.inner import RowSaver
from ...core.lifetime import Lifetime
from ...core.opening import Opening
from ...core.saver import StoreCheckpointer
from ...core.telemetry import Telemetry, instance_name, telemetry_of
from ...timetravel.methods import TimeTravel
from .._forward import not_forwarded, store_method
from .calls import in_thread
from .failover import Failover
from .failures import describe
from .fanout import Fanout, View, wind_down
from .gate import Gate
from .interface import SaverInterface
from .options import Consistency, ReplicaArg, check, replica_spec
from .process import Replicator
from .repair import Progress, Repairs, anti_entropy
from .status import RepairReport, ReplicationStatus
from .sweeping import ReplicatedLifecycle
from .worker import Replica
from .writes import Writer

if TYPE_CHECKING:
    from ...migrations.runner import MigrationReport

# The primary's helpers that change its store: never sent to a replica (no failover).
_WRITES = frozenset(f"{a}{name}" for a in ("", "a")
                    for name in ("migrate_threads", "enable_audit", "disable_audit",
                                 "rotate_keys"))


class ReplicatedCheckpointer(SaverInterface, TimeTravel, ReplicatedLifecycle):
    """A primary checkpointer and replicas of any backend, with the consistency you choose.

    The time-travel methods (`history`, `fork`, ...) go through this checkpointer (reads to
    the primary, a fork's writes replicated); the helpers of this package's checkpointers
    (`sizes`, `verify`, `migration_log`, ...) are the primary's, and `migrate_threads`
    rewrites the primary, then repairs the threads it rewrote on every replica.

    The data lifecycle (`sweep`, `erase`, `pin`, `set_thread_retention`, ...) is the
    primary's, followed by the replicas: a thread the sweep expires or an erasure deletes is
    deleted on every replica as `delete_thread` is, a history the sweep cuts is cut the same
    on every replica, pins and per-thread policies are replicated writes, and the default
    `retention` and the `clock` are set on the replicas of this process too, so that
    retention survives a failover (see `lifecycle.py`, `sweeping.py`).

    Args:
        primary: where every write goes first and every read goes (ours or any
            `BaseCheckpointSaver`).
        replicas: one or more checkpointers (any backend) kept equal to the primary. A replica
            given as a URL (`"redis://..."`, `"sqlite:///replica.db"`, `"postgresql://..."`,
            or `(url, options)` with options for `connect`) is applied in a process of its
            own, which takes that work off this process's GIL (see `process.py`); a
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
            writes then fail with `PrimaryUnavailableError`. A promotion fences off the old
            primary's other writers (other processes still configured with it): the
            promoted store takes a newer epoch, the old primary too once it answers (before
            its repair); their writes there, and their applies to the promoted store, are
            refused (`FencedError`; `status()` shows the replica as fenced).
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
        replicas: Sequence[ReplicaArg],
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
        o, specs, names = check(
            primary, replicas, names, consistency, quorum=quorum, max_queue=max_queue,
            max_wait=max_wait, quorum_timeout=quorum_timeout, repair_interval=repair_interval,
            full_repair_every=full_repair_every, failover_reads=failover_reads,
            promote=promote, retry_primary_after=retry_primary_after, linger=linger)
        super().__init__(serde=primary.serde)
        self.consistency, self.quorum, self.linger = o.consistency, o.quorum, o.linger
        self.max_queue, self.max_wait, self.quorum_timeout = o.max_queue, o.max_wait, o.quorum_timeout
        self.repair_interval, self.full_repair_every = o.repair_interval, o.full_repair_every
        self.failover_reads, self.promote = o.failover_reads, o.promote
        self.retry_primary_after = o.retry_primary_after
        # Traced with the primary's telemetry (ours), else the global providers'; so are the
        # replicas the replicator process applies.
        self.telemetry: Telemetry = telemetry_of(getattr(primary, "telemetry", None))
        fanout = self._fanout = Fanout(specs, names, o, track=consistency == "anti_entropy",
                                       telemetry=self.telemetry)
        self._replicator: Replicator | None = fanout.replicator
        # Quorum writes carry values instead: a replica that lost an append-delta's base (a
        # restart) then writes that value whole, and the write still counts for the quorum.
        # With rows it would refuse the write until repaired, which async replication leaves
        # to `repair()` / anti-entropy.
        self._rows = consistency != "quorum" and isinstance(primary, RowSaver) and all(
            primary.rows_compatible(r.saver) if isinstance(r, Replica)
            # a replica given as a URL is opened with the defaults, plus its options
            else primary.rows_compatible(primary) and not {"serde", "audit"} & set(r.options)
            for r in fanout.views
        )
        self._closed = threading.Event()
        self._failover = Failover(primary, fanout)
        gate = Gate()
        self.db_system: str | None = getattr(primary, "db_system", None)
        self._repairs = Repairs(self._failover, fanout, gate, self._closed, self.telemetry)
        self._writer = Writer(self._failover, fanout, gate, self._repairs, self._rows,
                              self._closed)
        self._repairer: threading.Thread | None = None
        if consistency == "anti_entropy":
            self._repairer = self._repairs.thread = threading.Thread(
                target=anti_entropy, args=(weakref.ref(self), self._closed),
                name="lgckpt-anti-entropy", daemon=True)
            self._repairer.start()
        self._lifetime = Lifetime(type(self).__name__, functools.partial(
            _wind_down, fanout.views, fanout.replicator, self._closed))
        self._owned: StoreCheckpointer | None = None  # the primary `from_conn_string` opened
        self._instance = instance_name(self)
        self.telemetry.watch(self)

    @classmethod
    def from_conn_string(
        cls,
        primary: str,
        replicas: Sequence[ReplicaArg],
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
            connect_options: keyword options for `connecting` (the primary's).

        Example:
            >>> with ReplicatedCheckpointer.from_conn_string(  # doctest: +SKIP
            ...         "postgresql://db/app", ["sqlite:///replica.db"]) as cp:
            ...     graph = builder.compile(checkpointer=cp)
        """
        specs = [replica_spec(r) for r in replicas]  # refused before anything opens
        return around(primary, connect_options,
                      lambda saver: cls(saver, specs, consistency, **options))

    @property
    def replicas(self) -> list[BaseCheckpointSaver[Any]]:
        return [r.saver for r in self._fanout.views]

    def status(self) -> ReplicationStatus:
        """Whether the primary is up, and per replica: up, queued operations, the oldest
        unreplicated age, the last error, whether it needs a repair."""
        down, err = self._failover.down, self._failover.error
        return ReplicationStatus(not down, None if err is None or not down else describe(err),
                                 self._fanout.status())

    def _observations(self) -> list[tuple[str, float, dict[str, Any]]]:
        """Its gauges (`core.telemetry`): each replica's queue, lag and health."""
        out: list[tuple[str, float, dict[str, Any]]] = []
        for r in self._fanout.status():
            attributes = {"lgckpt.instance": self._instance, "lgckpt.replica": r.name}
            out += [("lgckpt.replica.queue_depth", r.queued, attributes),
                    ("lgckpt.replica.lag", r.oldest_unreplicated_age, attributes),
                    ("lgckpt.replica.up", int(r.up), attributes)]
        return out

    # -- the primary's helpers (`Forwarded`) ------------------------------------------------

    def _forward(self, name: str, threads: Sequence[str] | None, *args: Any, **kwargs: Any
                 ) -> Any:
        return run_inline(self._forwarded(True, name, args, kwargs))

    async def _aforward(self, name: str, threads: Sequence[str] | None, *args: Any,
                        **kwargs: Any) -> Any:
        return await self._forwarded(False, name, args, kwargs)

    async def _forwarded(self, sync: bool, name: str, args: tuple[Any, ...],
                         kwargs: dict[str, Any]) -> Any:
        async def call(s: BaseCheckpointSaver[Any]) -> Any:
            out = store_method(s, name, "primary")(*args, **kwargs)  # `name` is sync or async
            return out if sync else await out

        result = await self._failover.call(sync, call, write=name in _WRITES)
        if name.removeprefix("a") == "migrate_threads":
            await either(sync, self._migrated, in_thread(self._migrated), result)
        return result

    def _migrated(self, report: MigrationReport) -> None:
        """After a migration of the primary, the threads it rewrote are repaired on every
        replica (a replica that is down, or a thread with writes queued, stays marked for
        repair: `status()` says so, the next `repair()` does it)."""
        threads = sorted({c.thread_id for c in report.changes})
        if report.dry_run or not threads:
            return
        for r in self._fanout.views:
            with r.cond:
                r.to_repair.update(threads)
        self._repair(threads)

    if not TYPE_CHECKING:  # (for mypy, an unknown attribute stays an error)
        def __getattr__(self, name: str) -> Any:
            failover = vars(self).get("_failover")  # None while being built
            primary = failover.primary if failover is not None else None
            raise not_forwarded(self, primary, "primary", name, "the replicas")

    # -- waiting, repairing, closing --------------------------------------------------------

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every replica that is up has applied its queue; False on timeout."""
        return self._fanout.flush(timeout)

    async def aflush(self, timeout: float | None = None) -> bool:
        return await asyncio.to_thread(self.flush, timeout)

    def repair(self, thread_ids: Sequence[str] | None = None, *,
               progress: Progress | None = None) -> RepairReport:
        """Make every replica that is up equal to the primary.

        Per thread (all of them, or `thread_ids`), checkpoint ids and content hashes (values,
        metadata, pending writes) are compared. Missing checkpoints and writes are copied; a
        thread holding checkpoints or writes the primary does not (or different ones) is
        deleted on the replica and copied whole; a thread the primary no longer holds is
        deleted. A thread with writes still queued for the replica is skipped and reported.
        Running it again after it stopped resumes: equal threads are only compared.
        `progress(replica, done, total)` is called after each thread."""
        return self._repair(thread_ids, progress)

    async def arepair(self, thread_ids: Sequence[str] | None = None, *,
                      progress: Progress | None = None) -> RepairReport:
        return await asyncio.to_thread(self.repair, thread_ids, progress=progress)

    def _repair(self, thread_ids: Sequence[str] | None, progress: Progress | None = None,
                quick: bool = False) -> RepairReport:
        """`repair()` (the background repair's too: see `Repairs.run` for `quick`)."""
        return self._repairs.run(thread_ids, progress, quick)

    def _anti_entropy_pass(self, passes: int) -> None:
        self._repairs.anti_entropy_pass(passes, self._repair)

    def close(self, timeout: float | None = 30.0) -> None:
        """Apply what is queued (up to `timeout` s), then stop the workers and the background
        repair (and the background sweeper). The primary and replicas are the caller's and
        stay open."""
        self.stop_sweeper()
        self.flush(timeout)
        self._lifetime.closed()
        self._closed.set()
        self._fanout.close()
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


def _wind_down(views: list[View], replicator: Replicator | None,
               closed: threading.Event) -> None:
    """`close()` of a checkpointer dropped unclosed: the background repair stops too."""
    closed.set()
    wind_down(views, replicator)
