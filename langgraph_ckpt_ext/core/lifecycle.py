"""The data lifecycle of `StoreCheckpointer`: retention policies, pins, the sweeper (a method,
and a background thread), erasure by metadata, and giving space back (`vacuum`).

What a store keeps for it is one lifecycle row per thread (`ThreadState`, see `store.py`);
everything deciding what to delete is here, once, for every backend. A pass never races a
writer: a thread expires only if its row's generation is still the one the pass read (one
atomic step in the store, `expire_thread`), and a history cut keeps whatever is written
meanwhile (`delete_checkpoints`).
"""

from __future__ import annotations

import asyncio
import builtins
import logging
import threading
from collections import OrderedDict, defaultdict
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from typing import Any

from langgraph.checkpoint.base import CheckpointTuple

from .config import check_id, check_ids
from .errors import InvalidConfigError, StoreBusyError
from .filters import matches, validate_filter
from .graph import INTERRUPT
from .prune import Pruning
from .retention import (
    ErasureReport,
    LifecycleEvent,
    Retention,
    SweepReport,
    SweepSchedule,
    ThreadState,
    check_limit,
    is_platform,
    thread_digest,
)
from .rows import ListQuery
from .telemetry import config_thread, no_thread, traced

_log = logging.getLogger("langgraph_ckpt_ext.lifecycle")

_PAGE = 500  # lifecycle rows read per round trip by a sweep pass
_TOUCHED = 4096  # threads whose last recorded read this process remembers

Deleter = Callable[[str], Awaitable[None]]


def check_where(where: Any) -> dict[str, Any]:
    """An erasure's metadata filter: a non-empty mapping of keys to values, as `list` takes
    (refused before anything is read or deleted)."""
    if not isinstance(where, Mapping) or not where:
        raise InvalidConfigError(
            "erase needs a metadata filter naming at least one key, e.g. {'user_id': 'u-42'}")
    flt = validate_filter(dict(where))
    for key, value in flt.items():
        if not key:
            raise InvalidConfigError("erase: a metadata key cannot be empty")
        if value is None:
            raise InvalidConfigError(f"erase: metadata key {key!r} needs a value, not None")
    return flt


class Sweeper:
    """A background thread calling `sweep(limit)` every `interval` seconds until stopped."""

    def __init__(self, sweep: Callable[[int | None], object], schedule: SweepSchedule,
                 name: str) -> None:
        self.schedule = schedule
        self._sweep = sweep
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.schedule.interval):
            try:
                report = self._sweep(self.schedule.limit)
                _log.info("%s", report)
            except Exception as exc:  # the next pass tries again
                _log.warning("background sweep failed: %r", exc)

    def stop(self, wait: bool = True) -> None:
        self._stop.set()
        if wait and self._thread is not threading.current_thread():
            self._thread.join()


class BackgroundSweeping:
    """`start_sweeper` and `stop_sweeper` over the class's own `sweep(limit)`: of a
    checkpointer, and of a wrapper (whose passes go through it)."""

    _sweeper: Sweeper | None = None

    def sweep(self, limit: int | None = None) -> SweepReport:
        raise NotImplementedError

    def start_sweeper(self, interval: float | None = None, *, limit: int | None = None) -> None:
        """Sweep in the background every `interval` seconds (a daemon thread; LangGraph
        Platform's default, 5 minutes, when None), `limit` threads changed at most per pass;
        stopped by `stop_sweeper` or `close`."""
        self.stop_sweeper()
        schedule = SweepSchedule(interval if interval is not None else 300.0, limit)
        self._sweeper = Sweeper(lambda n: self.sweep(n), schedule,
                                f"lgckpt-sweeper-{type(self).__name__}")

    def stop_sweeper(self) -> None:
        sweeper, self._sweeper = self._sweeper, None
        if sweeper is not None:
            sweeper.stop()


class Lifecycle(Pruning, BackgroundSweeping):
    """Retention, pins, sweeps, erasure and vacuum: mixed into `StoreCheckpointer`."""

    _retention: Retention | None = None
    _sweep_in_flight = 8
    """Threads a sweep pass works on at once."""
    _touched: OrderedDict[str, float]

    # -- policy -----------------------------------------------------------------------------

    @property
    def retention(self) -> Retention | None:
        """The retention policy of every thread without one of its own (None: keep all)."""
        return self._retention

    @retention.setter
    def retention(self, value: Retention | Mapping[str, Any] | None) -> None:
        self._retention = Retention.coerce(value)

    @property
    def clock(self) -> Callable[[], float]:
        """What "now" is for lifecycle rows and sweeps (epoch seconds; `time.time` by
        default). Tests set their own, so that no test sleeps for a TTL."""
        return self._store.clock

    @clock.setter
    def clock(self, clock: Callable[[], float]) -> None:
        self._store.clock = clock

    def _configure_lifecycle(
        self, retention: Retention | Mapping[str, Any] | None, sweep_every: float | None
    ) -> None:
        self._touched = OrderedDict()
        schedule = None
        if is_platform(retention):
            policy, schedule = Retention.from_platform(retention)
            self._retention = policy
        else:
            self._retention = Retention.coerce(retention)
        if sweep_every is not None:
            schedule = SweepSchedule(sweep_every, schedule.limit if schedule else None)
        if schedule is not None:
            self.start_sweeper(schedule.interval, limit=schedule.limit)

    def pin(self, thread_id: str) -> None:
        """Exempt a thread from every retention rule (and the Redis TTL) until `unpin`; works
        before the thread's first write."""
        self.run_sync(self.apin(thread_id))

    async def apin(self, thread_id: str) -> None:
        await self._store.set_pinned(check_id(thread_id, "thread_id", required=True), True)

    def unpin(self, thread_id: str) -> None:
        """Give a pinned thread its retention again (its idle time counts from its last
        write or read, as if never pinned; the Redis TTL restarts from now)."""
        self.run_sync(self.aunpin(thread_id))

    async def aunpin(self, thread_id: str) -> None:
        await self._store.set_pinned(check_id(thread_id, "thread_id", required=True), False)

    def set_thread_retention(
        self, thread_id: str, retention: Retention | Mapping[str, Any] | None
    ) -> None:
        """Give one thread its own retention policy (None: the checkpointer's again)."""
        self.run_sync(self.aset_thread_retention(thread_id, retention))

    async def aset_thread_retention(
        self, thread_id: str, retention: Retention | Mapping[str, Any] | None
    ) -> None:
        policy = Retention.coerce(retention)
        await self._store.set_policy(check_id(thread_id, "thread_id", required=True),
                                     None if policy is None else policy.to_json())

    def thread_state(self, thread_id: str) -> ThreadState | None:
        """A thread's lifecycle row: created, last written and read, pinned, its own policy."""
        return self.run_sync(self.athread_state(thread_id))

    async def athread_state(self, thread_id: str) -> ThreadState | None:
        return await self._store.thread_state(check_id(thread_id, "thread_id", required=True))

    async def _touch(self, thread_id: str, idle: float) -> None:
        """Record a read of the thread (`refresh_on_read`), at most once per tenth of the idle
        time per thread and process, so that reads stay reads."""
        now = self._store.clock()
        last = self._touched.get(thread_id)
        if last is not None and now - last < idle / 10:
            return
        await self._store.touch_thread(thread_id)
        self._touched[thread_id] = now
        self._touched.move_to_end(thread_id)
        while len(self._touched) > _TOUCHED:
            self._touched.popitem(last=False)

    @traced("get_tuple", config_thread)
    async def aget_tuple(self, config: Any) -> CheckpointTuple | None:
        found = await super().aget_tuple(config)
        policy = self._retention
        if found is not None and policy is not None and policy.refresh_on_read:
            idle = policy.seconds[0]
            if idle is not None:
                await self._touch(found.config["configurable"]["thread_id"], idle)
        return found

    # -- sweeping -----------------------------------------------------------------------------

    def sweep(self, limit: int | None = None, *, dry_run: bool = False,
              delete_paused: bool | None = None,
              threads: Sequence[str] | None = None) -> SweepReport:
        """One pass of the retention policies over the store: expire threads (delete them or
        cut them to their latest checkpoint), cap histories at `keep`.

        Args:
            limit: change at most this many threads (the next pass goes on).
            dry_run: decide, report, change nothing.
            delete_paused: delete expired threads paused at an `interrupt()` too (default:
                each policy's `delete_paused`, False unless set).
            threads: look at these threads only (default: every thread of the store).

        Safe beside running graphs and other sweepers, in any process: a thread written
        while the pass looks at it is skipped (`busy`), never half deleted; on a store shared
        by processes one pass runs at a time (the others return `locked_out`).
        """
        return self.run_sync(self.asweep(limit, dry_run=dry_run, delete_paused=delete_paused,
                                         threads=threads))

    async def asweep(self, limit: int | None = None, *, dry_run: bool = False,
                     delete_paused: bool | None = None,
                     threads: Sequence[str] | None = None) -> SweepReport:
        return await self._sweep_pass(limit, dry_run, delete_paused, self._expire,
                                      threads=threads)

    async def _expire(self, thread_id: str, generation: int) -> bool:
        if await self._store.expire_thread(thread_id, generation,
                                           self._tombstone_ttl is not None):
            self._log.forget(thread_id)
            return True
        return False

    @traced("sweep", no_thread, lambda r: {
        "threads_examined": r.examined, "threads_deleted": len(r.deleted),
        "threads_trimmed": len(r.trimmed), "checkpoints_deleted": r.checkpoints_deleted,
        "threads_busy": len(r.busy), "threads_paused": len(r.paused)})
    async def _sweep_pass(
        self,
        limit: int | None,
        dry_run: bool,
        delete_paused: bool | None,
        expire: Callable[[str, int], Awaitable[bool]],
        trimmed: Callable[[str], Awaitable[None]] | None = None,
        threads: Sequence[str] | None = None,
    ) -> SweepReport:
        """A sweep pass (of `threads` only, if given); `expire(thread_id, generation)` deletes
        an expired thread if its generation is unchanged, `trimmed(thread_id)` follows a
        history cut (a wrapper passes its own, to replicate them)."""
        check_limit(limit)
        named = None if threads is None else check_ids(threads, "thread_id", required=True)
        store = self._store
        report = SweepReport(at=store.clock(), dry_run=dry_run)
        async with store.sweep_lock() as held:
            if not held:
                report.locked_out = True
                return report
            if not dry_run:
                await store.housekeep(limit)
                if self._tombstone_ttl is not None:
                    report.tombstones_dropped = await store.drop_tombstones(
                        report.at - self._tombstone_ttl, limit)
            events: builtins.list[LifecycleEvent] = []
            changed, cursor = 0, None
            while not report.more:
                if named is None:
                    states, cursor = await store.thread_states(cursor, _PAGE)
                else:  # the named threads, a page at a time
                    start = int(cursor or 0)
                    rows = [await store.thread_state(t) for t in named[start:start + _PAGE]]
                    states = [r for r in rows if r is not None]
                    cursor = str(start + _PAGE) if start + _PAGE < len(named) else None
                todo: builtins.list[tuple[ThreadState, Retention]] = []
                for state in states:
                    if state.pinned:
                        report.examined += 1
                        report.pinned += 1
                        continue
                    policy = (Retention.from_json(state.policy) if state.policy
                              else self._retention)
                    if policy is None:
                        report.examined += 1
                        continue
                    todo.append((state, policy))
                # A few threads at a time: their round trips overlap (a pool, a pipeline, one
                # group commit for SQLite), and `limit` is never overshot.
                while todo:
                    room = (self._sweep_in_flight if limit is None
                            else min(self._sweep_in_flight, limit - changed))
                    if room <= 0:
                        report.more = True
                        break
                    chunk, todo = todo[:room], todo[room:]
                    report.examined += len(chunk)
                    done = await self._each([
                        self._sweep_thread(state, policy, report, delete_paused, expire,
                                           trimmed, events)
                        for state, policy in chunk])
                    changed += sum(done)
                if cursor is None:
                    break
            for found in (report.deleted, report.paused, report.busy):
                found.sort()
            if events and await self._audited():
                await store.log_lifecycle(events)
        return report

    async def _each(self, coros: builtins.list[Coroutine[Any, Any, bool]]
                    ) -> builtins.list[bool]:
        """Run `coros` together (one after the other for a store that never suspends), all
        to their end; the first error is raised after."""
        if self._store.inline:
            return [await c for c in coros]
        results = await asyncio.gather(*coros, return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                raise r
        return [bool(r) for r in results]

    async def _sweep_thread(
        self,
        state: ThreadState,
        policy: Retention,
        report: SweepReport,
        delete_paused: bool | None,
        expire: Callable[[str, int], Awaitable[bool]],
        trimmed: Callable[[str], Awaitable[None]] | None,
        events: builtins.list[LifecycleEvent],
    ) -> bool:
        """Apply `policy` to one thread; whether it changed (or, dry, would change)."""
        tid, now = state.thread_id, report.at
        expired = policy.expired(state, now)
        if expired and policy.strategy == "delete":
            spare = not (policy.delete_paused if delete_paused is None else delete_paused)
            if spare and await self._paused(tid):
                report.paused.append(tid)
                return False
            if report.dry_run or await expire(tid, state.generation):
                report.deleted.append(tid)
                events.append(LifecycleEvent(now, "expire", thread_digest(tid), 0, "retention"))
                return True
            report.busy.append(tid)
            return False
        keep = 1 if expired else policy.keep
        if keep is None or state.swept == state.generation:
            return False  # nothing to cut, or nothing written since the last cut
        victims = await self._trim_victims(tid, keep)
        if report.dry_run:
            if victims:
                report.trimmed[tid] = len(victims)
                report.checkpoints_deleted += len(victims)
            return bool(victims)
        if victims:
            current = await self._store.thread_state(tid)
            if current is None or current.generation != state.generation:
                report.busy.append(tid)
                return False
            try:
                events.append(await self._cut(tid, victims, "retention"))
            except StoreBusyError:  # its writers kept it past the store's wait: next pass
                report.busy.append(tid)
                return False
            report.trimmed[tid] = len(victims)
            report.checkpoints_deleted += len(victims)
            if trimmed is not None:
                await trimmed(tid)
        await self._store.mark_swept(tid, state.generation)
        return bool(victims)

    async def _paused(self, thread_id: str) -> bool:
        """Whether the thread's newest root checkpoint waits at an `interrupt()`."""
        row = await self._store.read_checkpoint(thread_id, "", None)
        if row is None:
            return False
        found = await self._store.read_writes(thread_id, "", [row.checkpoint_id], [INTERRUPT])
        return bool(found.get(row.checkpoint_id))

    # -- erasure ------------------------------------------------------------------------------

    def erase(self, where: Mapping[str, Any], *, dry_run: bool = False,
              reason: str = "") -> ErasureReport:
        """Delete every thread one of whose checkpoints' metadata matches `where` (as `list`'s
        filter: `{"user_id": "u-42"}`), in every namespace, with its pending writes and
        schema log, and every fork made of it (`fork`'s `fork_of` link), transitively.

        The store records the erasure (when, how many checkpoints, the threads' digests,
        never their content), so that `verify` of an erased thread reports it erased. A
        wrapper erases on its replicas too. `dry_run`: report what would go, delete nothing.
        """
        return self.run_sync(self.aerase(where, dry_run=dry_run, reason=reason))

    async def aerase(self, where: Mapping[str, Any], *, dry_run: bool = False,
                     reason: str = "") -> ErasureReport:
        return await self._erase(where, dry_run, reason, self.adelete_thread)

    async def _erase(self, where: Mapping[str, Any], dry_run: bool, reason: str,
                     delete: Deleter) -> ErasureReport:
        flt = check_where(where)
        if not isinstance(reason, str):
            raise InvalidConfigError("erase: reason must be text")
        report = ErasureReport(at=self._store.clock(), where=sorted(flt), dry_run=dry_run)
        counts = await self._erasure_targets(flt)
        report.threads = sorted(counts)
        report.checkpoints = sum(counts.values())
        if dry_run:
            return report
        for tid in report.threads:  # each recorded once gone: a record never outlives data
            await delete(tid)
            await self._store.log_lifecycle([LifecycleEvent(
                report.at, "erase", thread_digest(tid), counts[tid], reason)])
        return report

    async def _erasure_targets(self, flt: Mapping[str, Any]) -> dict[str, int]:
        """Threads matching `flt` and their forks (transitively): thread -> checkpoints."""
        counts: dict[str, int] = defaultdict(int)
        matched: set[str] = set()
        forks: dict[str, set[str]] = defaultdict(set)  # source thread -> its forks
        async for row in self._store.iter_checkpoints(ListQuery()):
            counts[row.thread_id] += 1
            md = self._metadata(row)
            if row.thread_id not in matched and matches(md, flt):
                matched.add(row.thread_id)
            source = md.get("fork_of")
            if isinstance(source, str) and source != row.thread_id:
                forks[source].add(row.thread_id)
        todo = builtins.list(matched)
        while todo:
            for fork in forks.pop(todo.pop(), ()):
                if fork not in matched:
                    matched.add(fork)
                    todo.append(fork)
        return {tid: counts[tid] for tid in matched}

    def lifecycle_log(self, thread_id: str | None = None) -> builtins.list[LifecycleEvent]:
        """The deletions the store recorded (erasures; expiries and cuts in an audited
        store), oldest first; of one thread id, or all."""
        return self.run_sync(self.alifecycle_log(thread_id))

    async def alifecycle_log(self, thread_id: str | None = None
                             ) -> builtins.list[LifecycleEvent]:
        digest = None if thread_id is None else thread_digest(
            check_id(thread_id, "thread_id", required=True))
        return await self._store.read_lifecycle(digest)

    # -- space --------------------------------------------------------------------------------

    def vacuum(self) -> tuple[int, int]:
        """Give the space of deleted rows back to the file system (SQLite: an incremental
        vacuum; PostgreSQL: `VACUUM` of our tables; nothing to do in memory or on Redis).
        Returns the storage's size in bytes before and after (0, 0 where it cannot tell)."""
        return self.run_sync(self.avacuum())

    async def avacuum(self) -> tuple[int, int]:
        return await self._store.vacuum()


__all__ = ["BackgroundSweeping", "Lifecycle", "Sweeper", "check_where"]
