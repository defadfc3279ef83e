"""`SmartCheckpointer`: buffer checkpoints and writes per thread, write them when they matter.

Every `put` and `put_writes` is queued per thread, in order. A thread's queue is written, in
that order, when its policy says so (an event such as an interrupt, an error or the end of a
run; or an interval), on `flush()`, on close and at interpreter exit, and early when the
buffer passes its bounds. Until then reads of this process see the queued checkpoints and
writes as if they were stored: each value is serialized when it is handed over, and read back
decoded, as from storage (a caller changing its objects later changes nothing buffered). A
failed flush puts its items back at the head of the queue and
raises; nothing is dropped. Writing a queue in order means what is stored is always a prefix of
the thread: never a checkpoint without the writes that came before it.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import math
import threading
import time
import weakref
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    DeltaChannelHistory,
    copy_checkpoint,
    get_serializable_checkpoint_metadata,
)

from ..connect import around
from ..core import codec
from ..core.bridge import resolve
from ..core.config import (
    checkpoint_id_of,
    checkpoint_ns_of,
    make_config,
    put_ids,
    thread_id_of,
    write_ids,
)
from ..core.errors import InvalidConfigError
from ..core.filters import matches, validate_filter
from ..core.graph import ERROR as _ERROR
from ..core.graph import INTERRUPT as _INTERRUPT
from ..core.graph import next_nodes
from ..core.lifetime import Lifetime
from ..core.lru import SizedLRU
from ..core.opening import Opening
from ..core.saver import StoreCheckpointer
from ..core.versions import version_key
from ..timetravel.methods import TimeTravel
from . import policies
from ._forward import Forwarded, not_forwarded, store_method
from .policies import OnEvents, Policy, ThreadActivity


@dataclass
class _Put:
    thread_id: str
    ns: str
    checkpoint_id: str
    parent_id: str | None
    config: RunnableConfig
    checkpoint: Checkpoint
    metadata: CheckpointMetadata
    new_versions: ChannelVersions
    size: int
    at: float
    events: set[str] = field(default_factory=set)


@dataclass
class _Writes:
    thread_id: str
    ns: str
    checkpoint_id: str
    config: RunnableConfig
    writes: list[tuple[str, Any]]
    task_id: str
    task_path: str
    size: int
    at: float
    events: set[str] = field(default_factory=set)


_Item = _Put | _Writes


@dataclass(eq=False)
class _Flight:
    """A batch of one thread being written. `prepared`: its rows, once the inner checkpointer
    made them (`aprepare_batch`); a later batch may then be written with them, and stands for
    both, so that it need not wait for this one (see `_take`)."""

    items: list[_Item]
    prepared: Any = None
    stored: bool = False  # set when this batch, or a later one carrying it, is stored


@dataclass
class _Thread:
    pending: deque[_Item] = field(default_factory=deque)
    # Batches being written, oldest first; each one written also holds the rows of those
    # before it.
    flights: list[_Flight] = field(default_factory=list)
    rate: float = 0.0
    last: float = 0.0
    bytes: int = 0
    puts: int = 0
    # Called when a batch is done: flushes that found the thread busy wait on these.
    waiters: list[Callable[[], object]] = field(default_factory=list)

    @property
    def inflight(self) -> list[_Item]:
        return [i for f in self.flights for i in f.items]

    def items(self) -> list[_Item]:
        return [*self.inflight, *self.pending]

    def oldest(self) -> float | None:
        inflight = self.inflight
        first = inflight[0] if inflight else (self.pending[0] if self.pending else None)
        return None if first is None else first.at


@dataclass
class Metrics:
    """What a `SmartCheckpointer` did so far (read `checkpointer.metrics`)."""

    saves_requested: int = 0
    """Checkpoints handed to `put`."""
    writes_requested: int = 0
    """`put_writes` calls."""
    checkpoints_written: int = 0
    writes_written: int = 0
    """`put_writes` calls passed on to the inner checkpointer."""
    batches: int = 0
    """Flushes that wrote something."""
    bytes_written: int = 0
    """An estimate of the values' sizes written."""
    buffered: int = 0
    """Items waiting now."""
    buffered_bytes: int = 0
    oldest_unflushed_age: float = 0.0
    """Seconds the oldest waiting item has waited."""
    flush_failures: int = 0
    last_error: BaseException | None = None


def _puts(items: Sequence[_Item]) -> int:
    return sum(isinstance(i, _Put) for i in items)


def _put_events(metadata: CheckpointMetadata, checkpoint: Checkpoint) -> set[str]:
    """What a put tells: an `update_state`, or the end of a run."""
    found: set[str] = set()
    if metadata.get("source") == "update":
        found.add(policies.UPDATE)
    if not next_nodes(checkpoint):
        found.add(policies.END)
    return found


def _write_events(
    writes: Sequence[tuple[str, Any]], plan_channels: frozenset[str],
    side_effect_tools: frozenset[str] | None,
) -> set[str]:
    """What a task's writes tell (read from the values handed over, before they are kept
    serialized): an interrupt, an error, a plan change, a tool call."""
    found: set[str] = set()
    for channel, value in writes:
        if channel == _INTERRUPT:
            found.add(policies.INTERRUPT)
        elif channel == _ERROR:
            found.add(policies.ERROR)
        elif channel in plan_channels:
            found.add(policies.PLAN_CHANGE)
        for v in value if isinstance(value, list | tuple) else (value,):
            calls = getattr(v, "tool_calls", None)
            if calls and (side_effect_tools is None or any(
                c.get("name") in side_effect_tools for c in calls if isinstance(c, Mapping)
            )):
                found.add(policies.TOOL_CALL)
    return found


_live: weakref.WeakSet[SmartCheckpointer] = weakref.WeakSet()


@atexit.register
def _flush_at_exit() -> None:
    for cp in list(_live):
        with contextlib.suppress(Exception):  # the interpreter is going: no one to tell
            cp.flush()


class _Timer:
    """The interval timer's thread (one for a checkpointer and its `with_allowlist` copies).

    The thread holds its checkpointer weakly while nothing is buffered, so that one dropped
    without `close()` is collected (its finalizer stops the thread), and strongly while
    checkpoints wait: those are written when due (or at exit) even if it was dropped.
    """

    def __init__(self) -> None:
        self.wake = threading.Event()
        self.closed = False
        self._thread: threading.Thread | None = None
        self._guard = threading.Lock()

    def arm(self, owner: SmartCheckpointer) -> None:
        with self._guard:
            # Gone with a dropped checkpointer, while a copy of it lives on: a new one.
            if not self.closed and (self._thread is None or not self._thread.is_alive()):
                self._thread = threading.Thread(
                    target=_serve_timer, args=(weakref.ref(owner), self), name="lgckpt-smart",
                    daemon=True)
                self._thread.start()
        self.wake.set()

    def stop(self) -> None:
        self.closed = True
        self.wake.set()


def _serve_timer(ref: weakref.ref[SmartCheckpointer], timer: _Timer) -> None:
    held: SmartCheckpointer | None = None
    while not timer.closed:
        cp = ref() if held is None else held
        if cp is None:
            return
        timer.wake.clear()  # before the pass: a wake that comes during it is not lost
        wait = cp._timer_pass()
        held = cp if cp._buffering() else None
        del cp
        timer.wake.wait(None if math.isinf(wait) else max(wait, 0.001))


class SmartCheckpointer(BaseCheckpointSaver[Any], TimeTravel, Forwarded):
    """Wraps any checkpointer and writes to it when it matters.

    The time-travel methods (`history`, `fork`, ...) read through the buffer; the helpers of
    this package's checkpointers (`sizes`, `verify`, `migrate_threads`, ...) are the inner
    one's, called once the buffer of the threads they read or rewrite is written.

    Args:
        inner: the checkpointer that stores (ours or any `BaseCheckpointSaver`).
        policy: when to write a thread's buffer (default `OnEvents()`: at once on an interrupt,
            an error, a tool call, a plan change, an `update_state`, or the end of a run).
            Whatever the policy, a thread that pauses at `interrupt()` is written at once.
        coalesce: write only the newest checkpoint of each namespace buffered since the last
            flush (re-parented onto the last one written), with its writes: fewer rows, less
            history.
        max_checkpoints / max_bytes: bounds of one thread's buffer; past them it is written at
            once (and the whole buffer when all threads together pass `max_bytes` x 4).
        plan_channels: channels whose writes count as a plan change.
        side_effect_tools: the tools whose calls count as an event (None: every tool call);
            a call to a read-only tool can then wait for the run's end like any other step.

    Example:
        >>> cp = SmartCheckpointer(SQLiteCheckpointer("agent.db"), policy=Hybrid())  # doctest: +SKIP
        >>> graph = builder.compile(checkpointer=cp)                                    # doctest: +SKIP
    """

    def __init__(
        self,
        inner: BaseCheckpointSaver[Any],
        policy: Policy | None = None,
        *,
        coalesce: bool = False,
        max_checkpoints: int = 256,
        max_bytes: int = 32 * 1024 * 1024,
        plan_channels: Sequence[str] = ("plan",),
        side_effect_tools: Sequence[str] | None = None,
    ) -> None:
        if not isinstance(inner, BaseCheckpointSaver):
            raise InvalidConfigError(f"inner must be a BaseCheckpointSaver, got {inner!r}")
        if policy is not None and not isinstance(policy, Policy):
            raise InvalidConfigError(f"policy must be a Policy (OnEvents(), ...), got {policy!r}")
        if max_checkpoints < 1 or max_bytes < 1:
            raise InvalidConfigError("max_checkpoints and max_bytes must be >= 1")
        super().__init__(serde=inner.serde)
        self.inner = inner
        # Ours can write a batch together with the rows of one still being written.
        self._carries = callable(getattr(inner, "aprepare_batch", None))
        # Buffered values are kept serialized (`codec.Encoded`); ours store those bytes as
        # they are, any other checkpointer is given them decoded.
        self._takes_encoded = isinstance(inner, StoreCheckpointer)
        # (thread, ns, channel) -> (version key, encoded value) of the last value buffered:
        # a channel a checkpoint holds but did not write is not serialized again.
        self._encoded: SizedLRU[tuple[str, str, str], tuple[str, codec.Encoded]] = SizedLRU(
            max_bytes, lambda hit: hit[1].listed.size if hit[1].listed else len(hit[1].typed[1]))
        self.policy = policy or OnEvents()
        self.coalesce = coalesce
        self.max_checkpoints = max_checkpoints
        self.max_bytes = max_bytes
        self.plan_channels = frozenset(plan_channels)
        self.side_effect_tools = None if side_effect_tools is None else frozenset(
            side_effect_tools)
        self._threads: dict[str, _Thread] = {}
        # LangGraph may pass a step's writes before the checkpoint they belong to (both go out
        # from background tasks). `_seen`: checkpoints queued here; `_orphans`: writes flushed
        # before their checkpoint came (read back with it); `_urgent`: checkpoints whose writes
        # were an event (an interrupt): written the moment they come.
        self._seen: OrderedDict[tuple[str, str, str], None] = OrderedDict()
        self._orphans: OrderedDict[tuple[str, str, str], list[_Writes]] = OrderedDict()
        self._urgent: set[tuple[str, str, str]] = set()
        # (thread, ns) -> id of the checkpoint that ended a run and was written at once: a
        # write of that run that comes after it (LangGraph sends a step's writes from a
        # background task) goes at once too, so that the run is whole when it returns.
        self._ended: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._lock = threading.RLock()
        self._metrics = Metrics()
        self._timer = _Timer()
        self._lifetime = Lifetime(type(self).__name__, self._timer.stop)
        self._owned: StoreCheckpointer | None = None  # an inner one `from_conn_string` opened
        _live.add(self)

    @classmethod
    def from_conn_string(
        cls, conn_string: str, policy: Policy | None = None, *,
        connect_options: Mapping[str, Any] | None = None, **options: Any,
    ) -> Opening[SmartCheckpointer]:
        """A `SmartCheckpointer` over the checkpointer `connect(conn_string)` opens, for `with`
        or `async with`: on exit, what is buffered is written and that checkpointer closed.

        Args:
            conn_string: a URL for `connect`, with its query options.
            policy, options: as for the constructor.
            connect_options: keyword options for `connect`.

        Example:
            >>> with SmartCheckpointer.from_conn_string("sqlite:///agent.db") as cp:  # doctest: +SKIP
            ...     graph = builder.compile(checkpointer=cp)
        """
        return around(conn_string, connect_options, lambda inner: cls(inner, policy, **options))

    # -- metrics ----------------------------------------------------------------------------

    @property
    def metrics(self) -> Metrics:
        """A snapshot of what was requested, written and is waiting."""
        with self._lock:
            m = Metrics(**self._metrics.__dict__)
            now = time.monotonic()
            oldest = [t.oldest() for t in self._threads.values()]
            times = [o for o in oldest if o is not None]
            m.buffered = sum(len(t.pending) + len(t.inflight) for t in self._threads.values())
            m.buffered_bytes = sum(t.bytes for t in self._threads.values())
            m.oldest_unflushed_age = now - min(times) if times else 0.0
            return m

    # -- queueing ---------------------------------------------------------------------------

    def _queue(self, item: _Item) -> bool:
        """Queue an item; True if its thread must be written now."""
        events = item.events
        now = item.at
        with self._lock:
            st = self._threads.setdefault(item.thread_id, _Thread())
            gap = now - st.last if st.last else math.inf
            st.rate = 0.7 * st.rate + 0.3 * (1.0 / max(gap, 1e-3))
            st.last = now
            st.pending.append(item)
            st.bytes += item.size
            st.puts += isinstance(item, _Put)
            if isinstance(item, _Put):
                self._metrics.saves_requested += 1
            else:
                self._metrics.writes_requested += 1
            key = (item.thread_id, item.ns, item.checkpoint_id)
            urgent = False
            if isinstance(item, _Put):
                _remember(self._seen, key, None)
                urgent = key in self._urgent
                self._urgent.discard(key)
                self._ended.pop((item.thread_id, item.ns), None)
            else:
                ended = self._ended.get((item.thread_id, item.ns))
                urgent = ended is not None and item.checkpoint_id <= ended
            puts = st.puts
            due = (
                urgent
                or policies.INTERRUPT in events  # a human is waiting on it: always at once
                or self.policy.flush_on(events)
                or puts > self.max_checkpoints
                or st.bytes > self.max_bytes
                or self._age_due(st, now)
            )
            if due and isinstance(item, _Writes) and key not in self._seen:
                self._urgent.add(key)
            if due and isinstance(item, _Put) and policies.END in events:
                _remember(self._ended, (item.thread_id, item.ns), item.checkpoint_id, 1024)
        if not due:
            self._arm_timer()
        return due

    def _age_due(self, st: _Thread, now: float) -> bool:
        oldest = st.oldest()
        if oldest is None:
            return False
        activity = ThreadActivity(now - oldest, len(st.pending), st.rate)
        return now - oldest >= self.policy.max_age(activity)

    def _over_total(self) -> bool:
        with self._lock:
            return sum(t.bytes for t in self._threads.values()) > 4 * self.max_bytes

    def _put_item(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> tuple[_Put, RunnableConfig]:
        # Ids checked now, as a direct put would: a bad one must not fail a later flush.
        thread_id, ns, checkpoint_id, parent_id = put_ids(
            config, checkpoint, get_serializable_checkpoint_metadata(config, metadata),
            new_versions)
        values = self._freeze(thread_id, ns, checkpoint, new_versions)
        size = 256 + sum(len(values[ch].typed[1]) for ch in new_versions if ch in values)
        item = _Put(
            thread_id, ns, checkpoint_id, parent_id, config,
            {**copy_checkpoint(checkpoint), "channel_values": values},
            dict(metadata),  # type: ignore[arg-type]
            dict(new_versions), size, time.monotonic(),
        )
        item.events = _put_events(item.metadata, item.checkpoint)
        return item, make_config(thread_id, ns, checkpoint_id)

    def _freeze(
        self, thread_id: str, ns: str, checkpoint: Checkpoint, new_versions: ChannelVersions
    ) -> dict[str, codec.Encoded]:
        """The checkpoint's values serialized as of now, as a direct `put` would store them: a
        channel this step wrote is serialized; one it did not write is the value buffered at
        its version, if any (else serialized too)."""
        versions = checkpoint.get("channel_versions") or {}
        out: dict[str, codec.Encoded] = {}
        for ch, value in (checkpoint.get("channel_values") or {}).items():
            vkey = version_key(versions[ch]) if ch in versions else None
            key = (thread_id, ns, ch)
            with self._lock:
                hit = self._encoded.get(key)
            if ch not in new_versions and hit is not None and hit[0] == vkey:
                out[ch] = hit[1]
                continue
            out[ch] = enc = codec.encode(self.serde, value, f"channel {ch!r}",
                                         hit[1] if hit is not None else None)
            if vkey is not None:
                with self._lock:
                    self._encoded.put(key, (vkey, enc))
        return out

    def _writes_item(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str,
        task_path: str,
    ) -> _Writes:
        thread_id, ns, checkpoint_id, task = write_ids(config, writes, task_id, task_path)
        frozen = [(ch, codec.encode(self.serde, v, f"write to channel {ch!r} of task "
                                    f"{task_id!r}")) for ch, v in writes]
        size = 64 + sum(len(v.typed[1]) for _, v in frozen)
        item = _Writes(thread_id, ns, checkpoint_id, config,
                       frozen, task, task_path, size, time.monotonic())
        item.events = _write_events(writes, self.plan_channels, self.side_effect_tools)
        return item

    # -- writing ----------------------------------------------------------------------------

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        item, out = self._put_item(config, checkpoint, metadata, new_versions)
        if self._queue(item):
            self._flush_thread(item.thread_id, until_empty=False)
        elif self._over_total():
            self.flush()
        return out

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        item, out = self._put_item(config, checkpoint, metadata, new_versions)
        if self._queue(item):
            await self._aflush_thread(item.thread_id, until_empty=False)
        elif self._over_total():
            await self.aflush()
        return out

    def put_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str,
        task_path: str = "",
    ) -> None:
        item = self._writes_item(config, writes, task_id, task_path)
        if self._queue(item):
            self._flush_thread(item.thread_id, until_empty=False)

    async def aput_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str,
        task_path: str = "",
    ) -> None:
        item = self._writes_item(config, writes, task_id, task_path)
        if self._queue(item):
            await self._aflush_thread(item.thread_id, until_empty=False)

    # -- flushing ---------------------------------------------------------------------------

    def _take(
        self, thread_id: str, wake: Callable[[], object]
    ) -> tuple[_Flight, list[_Flight]] | Literal[False] | None:
        """Move a thread's queue in flight, with the batches still being written that it must
        carry: (flight, carried). None: wait (`wake` is called when a batch of the thread is
        done). False: nothing queued.

        A batch starts while an earlier one of the thread is still out only if it can carry
        the earlier one's rows (our checkpointers, once those rows are made; one batch out at
        a time, not more): it is then one statement holding both, so that once it is stored
        the earlier rows are too, whatever became of their own write. The thread stays a
        prefix of what was put, in order."""
        with self._lock:
            st = self._threads.get(thread_id)
            if st is None or not st.pending:
                return False
            # One batch carried at most: each row is then sent at most twice.
            if st.flights and not (
                self._carries and len(st.flights) == 1 and st.flights[0].prepared is not None
            ):
                st.waiters.append(wake)
                return None
            batch = list(st.pending)
            st.pending.clear()
            kept = self._coalesced(batch) if self.coalesce else batch
            if kept is not batch:  # what coalescing dropped no longer counts against bounds
                st.bytes -= sum(i.size for i in batch) - sum(i.size for i in kept)
                st.puts -= _puts(batch) - _puts(kept)
            carried = list(st.flights)
            flight = _Flight(kept)
            st.flights.append(flight)
            return flight, carried

    def _done(self, thread_id: str, flight: _Flight, error: BaseException | None) -> bool:
        """Book a batch's write; True if its items are stored (by it, or by a later batch
        that carried it: then its own failure loses nothing, and is only counted)."""
        waiters: list[Callable[[], object]] = []
        with self._lock:
            st = self._threads.get(thread_id)
            if st is not None and flight in st.flights:
                waiters, st.waiters = st.waiters, []
                self._settle(thread_id, st, flight, error)
            elif error is not None:  # already settled by a later batch
                self._metrics.flush_failures += 1
                self._metrics.last_error = error
        for wake in waiters:
            with contextlib.suppress(RuntimeError):  # a waiter's event loop already closed
                wake()
        return flight.stored

    def _settle(
        self, thread_id: str, st: _Thread, flight: _Flight, error: BaseException | None
    ) -> None:
        """Book a finished batch (under the lock). Stored: it and every batch it carried are.
        Failed: a later batch carrying it decides; if none, all of them go back to the front
        of the queue."""
        at = st.flights.index(flight)
        if error is not None:
            self._metrics.flush_failures += 1
            self._metrics.last_error = error
            if at < len(st.flights) - 1:
                return
            back = st.inflight
            st.flights.clear()
            st.pending.extendleft(reversed(back))
            return
        for f in st.flights[: at + 1]:
            f.stored = True
        batch = [i for f in st.flights[: at + 1] for i in f.items]
        del st.flights[: at + 1]
        for i in batch:
            key = (i.thread_id, i.ns, i.checkpoint_id)
            if isinstance(i, _Put):
                self._orphans.pop(key, None)
            elif key not in self._seen:  # its checkpoint is still to come
                _remember(self._orphans, key, []).append(i)
        size = sum(i.size for i in batch)
        st.bytes = max(0, st.bytes - size)
        st.puts = max(0, st.puts - _puts(batch))
        self._metrics.batches += 1
        self._metrics.bytes_written += size
        self._metrics.checkpoints_written += sum(isinstance(i, _Put) for i in batch)
        self._metrics.writes_written += sum(isinstance(i, _Writes) for i in batch)
        if not st.pending and not st.flights:
            del self._threads[thread_id]
            if not self._threads:  # the timer may let go of this checkpointer now
                self._timer.wake.set()

    def _flush_thread(self, thread_id: str, until_empty: bool = True) -> None:
        """Write the thread's queue as one batch (after a flush already writing it, unless
        this one can carry it); with `until_empty`, also what was queued meanwhile."""
        while True:
            idle = threading.Event()
            took = self._take(thread_id, idle.set)
            if took is None:  # another flush of this thread is writing: after it
                idle.wait()
                continue
            if took is False:
                return
            flight, carried = took
            try:
                self._write_sync(flight, carried)
            except BaseException as exc:
                if not self._done(thread_id, flight, exc):
                    raise
            else:
                self._done(thread_id, flight, None)
            if not until_empty:
                return

    async def _aflush_thread(self, thread_id: str, until_empty: bool = True) -> None:
        loop = asyncio.get_running_loop()
        while True:
            idle = loop.create_future()
            took = self._take(thread_id, functools.partial(
                loop.call_soon_threadsafe, resolve, idle))
            if took is None:
                await idle
                continue
            if took is False:
                return
            flight, carried = took
            try:
                await self._write_async(flight, carried)
            except BaseException as exc:
                if not self._done(thread_id, flight, exc):
                    raise
            else:
                self._done(thread_id, flight, None)
            if not until_empty:
                return

    def _made(self, flight: _Flight, prepared: Any) -> None:
        with self._lock:
            flight.prepared = prepared

    def _write_sync(self, flight: _Flight, carried: list[_Flight]) -> None:
        ops = [_op(i, self._takes_encoded) for i in flight.items]
        if self._carries:
            prepared = self.inner.prepare_batch(ops)  # type: ignore[attr-defined]
            if prepared is not None:
                self._made(flight, prepared)
                self.inner.write_prepared(  # type: ignore[attr-defined]
                    [*(f.prepared for f in carried), prepared])
                return
        batcher = getattr(self.inner, "put_batch", None)
        if batcher is not None:
            batcher(ops)
            return
        for op in ops:
            if op[0] == "put":
                self.inner.put(*op[1:])
            else:
                self.inner.put_writes(*op[1:])

    async def _write_async(self, flight: _Flight, carried: list[_Flight]) -> None:
        ops = [_op(i, self._takes_encoded) for i in flight.items]
        if self._carries:
            prepared = await self.inner.aprepare_batch(ops)  # type: ignore[attr-defined]
            if prepared is not None:
                self._made(flight, prepared)
                await self.inner.awrite_prepared(  # type: ignore[attr-defined]
                    [*(f.prepared for f in carried), prepared])
                return
        batcher = getattr(self.inner, "aput_batch", None)
        if batcher is not None:
            await batcher(ops)
            return
        for op in ops:
            if op[0] == "put":
                await self.inner.aput(*op[1:])
            else:
                await self.inner.aput_writes(*op[1:])

    def _coalesced(self, batch: list[_Item]) -> list[_Item]:
        """The newest checkpoint of each namespace (re-parented onto the one before the batch,
        storing every channel that moved in the batch) and its writes; writes of checkpoints
        already stored stay."""
        newest: dict[str, _Put] = {}
        first_parent: dict[str, str | None] = {}
        moved: dict[str, dict[str, Any]] = {}
        for item in batch:
            if isinstance(item, _Put):
                first_parent.setdefault(item.ns, item.parent_id)
                moved.setdefault(item.ns, {}).update(item.new_versions)
                newest[item.ns] = item
        buffered = {(i.ns, i.checkpoint_id) for i in batch if isinstance(i, _Put)}
        out: list[_Item] = []
        for item in batch:
            if isinstance(item, _Put):
                if newest[item.ns] is not item:
                    continue
                versions = item.checkpoint["channel_versions"]
                conf = dict(item.config["configurable"])
                conf["checkpoint_id"] = first_parent[item.ns]
                if conf["checkpoint_id"] is None:
                    conf.pop("checkpoint_id")
                out.append(_Put(
                    item.thread_id, item.ns, item.checkpoint_id, first_parent[item.ns],
                    {**item.config, "configurable": conf},
                    item.checkpoint, item.metadata,
                    {ch: versions[ch] for ch in moved[item.ns] if ch in versions},
                    item.size, item.at,
                ))
            elif (item.ns, item.checkpoint_id) not in buffered or (
                newest.get(item.ns) is not None
                and newest[item.ns].checkpoint_id == item.checkpoint_id
            ):
                out.append(item)
        return out

    def flush(self) -> None:
        """Write every thread's buffer now (each thread's in one batch)."""
        with self._lock:
            threads = list(self._threads)
        errors = []
        for thread_id in threads:
            try:
                self._flush_thread(thread_id)
            except Exception as exc:
                errors.append(exc)
        if errors:
            raise errors[0]

    async def aflush(self) -> None:
        with self._lock:
            threads = list(self._threads)
        errors = []
        for thread_id in threads:
            try:
                await self._aflush_thread(thread_id)
            except Exception as exc:
                errors.append(exc)
        if errors:
            raise errors[0]

    # -- the interval timer -----------------------------------------------------------------

    def _arm_timer(self) -> None:
        self._timer.arm(self)

    def _next_due(self) -> tuple[float, list[str]]:
        """Seconds until the next thread is due, and the threads due now."""
        now = time.monotonic()
        wait, due = math.inf, []
        with self._lock:
            for thread_id, st in self._threads.items():
                oldest = st.oldest()
                if oldest is None or st.flights:
                    continue
                limit = self.policy.max_age(ThreadActivity(now - oldest, len(st.pending),
                                                           st.rate))
                left = oldest + limit - now
                if left <= 0:
                    due.append(thread_id)
                else:
                    wait = min(wait, left)
        return wait, due

    def _timer_pass(self) -> float:
        """Write the threads due now; seconds until the next one is due."""
        wait, due = self._next_due()
        for thread_id in due:
            try:
                self._flush_thread(thread_id)
            except Exception:  # kept in the buffer and in metrics.last_error; retried
                wait = min(wait, 1.0)
        return wait

    def _buffering(self) -> bool:
        with self._lock:
            return bool(self._threads)

    # -- reading ----------------------------------------------------------------------------

    def _snapshot(self, thread_id: str | None) -> list[_Item]:
        """The buffered items of a thread (or all), each checkpoint preceded by the writes
        that were stored before it came: taken at one instant, so that a batch settling
        meanwhile (which forgets those writes) cannot hide them from the read."""
        with self._lock:
            if thread_id is not None:
                st = self._threads.get(thread_id)
                items = st.items() if st else []
            else:
                items = [i for st in self._threads.values() for i in st.items()]
            if not self._orphans:
                return items
            early: list[_Item] = []
            for i in items:
                if isinstance(i, _Put):
                    early.extend(self._orphans.get((i.thread_id, i.ns, i.checkpoint_id), ()))
            return [*early, *items]

    def _tuple_of(self, put: _Put, items: list[_Item]) -> CheckpointTuple:
        return CheckpointTuple(
            config=make_config(put.thread_id, put.ns, put.checkpoint_id),
            checkpoint=_decoded_checkpoint(put.checkpoint),
            metadata=get_serializable_checkpoint_metadata(put.config, put.metadata),
            parent_config=(make_config(put.thread_id, put.ns, put.parent_id)
                           if put.parent_id else None),
            pending_writes=_writes_for(items, put.ns, put.checkpoint_id),
        )

    def _merge(self, tup: CheckpointTuple | None, items: list[_Item]) -> CheckpointTuple | None:
        if tup is None or not items:
            return tup
        conf = tup.config["configurable"]
        extra = _writes_for(items, conf.get("checkpoint_ns", ""), conf["checkpoint_id"])
        if not extra:
            return tup
        # a special write (an interrupt, a task's answers, an error) buffered since replaces
        # the stored one of its task in place, as the store does when the buffer is written
        newer = {(w[0], w[1]): w for w in extra if WRITES_IDX_MAP.get(w[1], 0) < 0}
        stored = [newer.get((w[0], w[1]), w) for w in tup.pending_writes or ()]
        have = {(t, c) for t, c, _ in stored}
        merged = stored + [w for w in extra if (w[0], w[1]) not in have]
        return tup._replace(pending_writes=merged)

    def _buffered_tuple(
        self, config: RunnableConfig
    ) -> tuple[CheckpointTuple | None, list[_Item], bool]:
        """(a tuple served from the buffer, the thread's items, whether the buffer answered)."""
        thread_id, ns = thread_id_of(config), checkpoint_ns_of(config)
        checkpoint_id = checkpoint_id_of(config)
        items = self._snapshot(thread_id)
        puts = [i for i in items if isinstance(i, _Put) and i.ns == ns]
        if checkpoint_id is not None:
            for p in puts:
                if p.checkpoint_id == checkpoint_id:
                    return self._tuple_of(p, items), items, True
            return None, items, False
        if puts:
            return self._tuple_of(max(puts, key=lambda p: p.checkpoint_id), items), items, True
        return None, items, False

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        tup, items, answered = self._buffered_tuple(config)
        if answered:
            return tup
        return self._merge(self.inner.get_tuple(config), items)

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        tup, items, answered = self._buffered_tuple(config)
        if answered:
            return tup
        return self._merge(await self.inner.aget_tuple(config), items)

    def _buffered_list(
        self,
        config: RunnableConfig | None,
        flt: dict[str, Any] | None,
        before: RunnableConfig | None,
    ) -> tuple[list[CheckpointTuple], list[_Item]]:
        conf = (config or {}).get("configurable") or {}
        thread_id = conf.get("thread_id") or None
        ns = conf.get("checkpoint_ns")
        checkpoint_id = conf.get("checkpoint_id")
        before_id = checkpoint_id_of(before) if before else None
        items = self._snapshot(None if thread_id is None else str(thread_id))
        found = []
        for p in items:
            if not isinstance(p, _Put):
                continue
            if ns is not None and p.ns != ns:
                continue
            if checkpoint_id is not None and p.checkpoint_id != checkpoint_id:
                continue
            if before_id is not None and not p.checkpoint_id < before_id:
                continue
            tup = self._tuple_of(p, items)
            if flt and not matches(tup.metadata, flt):
                continue
            found.append(tup)
        found.sort(key=_order, reverse=True)
        return found, items

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        flt = validate_filter(filter)
        buffered, items = self._buffered_list(config, flt, before)
        merge = _Merge(buffered, items, limit, self._merge)
        if merge.full():
            return
        for tup in self.inner.list(config, filter=filter, before=before, limit=limit):
            yield from merge.feed(tup)
            if merge.full():
                return
        yield from merge.rest()

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        flt = validate_filter(filter)
        buffered, items = self._buffered_list(config, flt, before)
        merge = _Merge(buffered, items, limit, self._merge)
        if merge.full():
            return
        async for tup in self.inner.alist(config, filter=filter, before=before, limit=limit):
            for out in merge.feed(tup):
                yield out
            if merge.full():
                return
        for out in merge.rest():
            yield out

    # -- everything else: written first, then the inner checkpointer --------------------------

    def delete_thread(self, thread_id: str) -> None:
        self._drop(thread_id)
        self.inner.delete_thread(thread_id)

    async def adelete_thread(self, thread_id: str) -> None:
        self._drop(thread_id)
        await self.inner.adelete_thread(thread_id)

    def _drop(self, thread_id: str) -> None:
        while True:
            with self._lock:
                st = self._threads.get(str(thread_id))
                if st is None or not st.flights:
                    self._threads.pop(str(thread_id), None)
                    self._encoded.drop_thread(str(thread_id))
                    if not self._threads:
                        self._timer.wake.set()
                    return
            time.sleep(0.002)  # a flush is writing it: delete after it

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self._flush_thread(str(source_thread_id))
        self._flush_thread(str(target_thread_id))
        self.inner.copy_thread(source_thread_id, target_thread_id)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await self._aflush_thread(str(source_thread_id))
        await self._aflush_thread(str(target_thread_id))
        await self.inner.acopy_thread(source_thread_id, target_thread_id)

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        self.flush()
        self.inner.delete_for_runs(run_ids)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await self.aflush()
        await self.inner.adelete_for_runs(run_ids)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        for t in thread_ids:
            self._flush_thread(str(t))
        self.inner.prune(thread_ids, strategy=strategy)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        for t in thread_ids:
            await self._aflush_thread(str(t))
        await self.inner.aprune(thread_ids, strategy=strategy)

    def get_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        self._flush_thread(thread_id_of(config))
        return self.inner.get_delta_channel_history(config=config, channels=channels)

    async def aget_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        await self._aflush_thread(thread_id_of(config))
        return await self.inner.aget_delta_channel_history(config=config, channels=channels)

    def with_allowlist(self, extra_allowlist: Collection[tuple[str, ...]]) -> SmartCheckpointer:
        """A view that may also decode the graph's own types (LangGraph asks for it when it
        compiles a graph under LANGGRAPH_STRICT_MSGPACK): the inner checkpointer too, since
        reads go through it. Buffer and inner storage stay shared."""
        clone = super().with_allowlist(extra_allowlist)
        if clone is not self:
            clone.inner = self.inner.with_allowlist(extra_allowlist)  # type: ignore[attr-defined]
        return clone  # type: ignore[return-value]

    def get_next_version(self, current: Any, channel: Any = None) -> Any:
        return self.inner.get_next_version(current, channel)

    # -- the inner checkpointer's helpers (`Forwarded`): the buffer they read written first --

    def _forward(self, name: str, threads: Sequence[str] | None, *args: Any, **kwargs: Any
                 ) -> Any:
        method = store_method(self.inner, name, "inner")
        if threads is None:
            self.flush()
        for t in threads or ():
            self._flush_thread(str(t))
        result = method(*args, **kwargs)
        self._forget(name, threads)
        return result

    async def _aforward(self, name: str, threads: Sequence[str] | None, *args: Any,
                        **kwargs: Any) -> Any:
        method = store_method(self.inner, name, "inner")
        if threads is None:
            await self.aflush()
        for t in threads or ():
            await self._aflush_thread(str(t))
        result = await method(*args, **kwargs)
        self._forget(name, threads)
        return result

    def _forget(self, name: str, threads: Sequence[str] | None) -> None:
        """After a migration: the values remembered as stored were rewritten."""
        if name.endswith("migrate_threads"):
            with self._lock:
                for t in [None] if threads is None else threads:
                    self._encoded.drop_thread(None if t is None else str(t))

    if not TYPE_CHECKING:  # (for mypy, an unknown attribute stays an error)
        def __getattr__(self, name: str) -> Any:
            raise not_forwarded(self, "inner", name, "the buffer")

    # -- lifecycle --------------------------------------------------------------------------

    def close(self) -> None:
        """Write everything buffered and stop the interval timer (the inner checkpointer is
        the caller's and stays open, unless `from_conn_string` opened it)."""
        self.flush()
        self._lifetime.closed()
        self._timer.stop()
        owned, self._owned = self._owned, None
        if owned is not None:
            owned.close()

    async def aclose(self) -> None:
        await self.aflush()
        self._lifetime.closed()
        self._timer.stop()
        owned, self._owned = self._owned, None
        if owned is not None:
            await owned.aclose()

    def __enter__(self) -> SmartCheckpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> SmartCheckpointer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _remember(memo: OrderedDict[Any, Any], key: Any, value: Any, size: int = 8192) -> Any:
    """memo[key] (set to `value` if missing), most recent last, at most `size` keys."""
    if key in memo:
        memo.move_to_end(key)
        return memo[key]
    memo[key] = value
    while len(memo) > size:
        memo.popitem(last=False)
    return value


def _op(item: _Item, encoded: bool = True) -> tuple[Any, ...]:
    """The call that stores an item (`encoded`: values as kept, else decoded)."""
    if isinstance(item, _Put):
        checkpoint = item.checkpoint if encoded else _decoded_checkpoint(item.checkpoint)
        return ("put", item.config, checkpoint, item.metadata, item.new_versions)
    writes = item.writes if encoded else [(ch, codec.decoded(v)) for ch, v in item.writes]
    return ("writes", item.config, writes, item.task_id, item.task_path)


def _decoded_checkpoint(checkpoint: Checkpoint) -> Checkpoint:
    """A copy of a buffered checkpoint, values decoded: LangGraph starts a run from the
    checkpoint it reads and updates its versions in place, which must not reach the buffer."""
    values = {ch: codec.decoded(v) for ch, v in checkpoint["channel_values"].items()}
    return {**copy_checkpoint(checkpoint), "channel_values": values}


def _writes_for(items: list[_Item], ns: str, checkpoint_id: str) -> list[tuple[str, str, Any]]:
    """Buffered writes of one checkpoint, as stored: a task's write at an index >= 0 is kept
    once (the first), a special one (index < 0) replaced by the last."""
    rows: dict[tuple[str, int], tuple[str, str, str, Any]] = {}
    for item in items:
        if isinstance(item, _Writes) and item.ns == ns and item.checkpoint_id == checkpoint_id:
            for i, (channel, value) in enumerate(item.writes):
                idx = WRITES_IDX_MAP.get(channel, i)
                key = (item.task_id, idx)
                if idx >= 0 and key in rows:
                    continue
                rows[key] = (item.task_path, item.task_id, channel, value)
    # in the order LangGraph applies them: task path, task id, index; decoded afresh
    order = sorted(rows, key=lambda k: (rows[k][0], k[0], k[1]))
    return [(rows[k][1], rows[k][2], codec.decoded(rows[k][3])) for k in order]


def _order(tup: CheckpointTuple) -> tuple[str, str, str]:
    c = tup.config["configurable"]
    return (str(c["checkpoint_id"]), str(c.get("checkpoint_ns", "")), str(c["thread_id"]))


def _key(tup: CheckpointTuple) -> tuple[str, str, str]:
    return _order(tup)


class _Merge:
    """Buffered tuples merged into the inner checkpointer's listing, newest first, without
    repeats (a checkpoint being written can be in both), up to `limit`."""

    def __init__(self, buffered: list[CheckpointTuple], items: list[_Item], limit: int | None,
                 merge: Any) -> None:
        self.queue = deque(buffered)
        self.seen = {_key(t) for t in buffered}
        self.items, self.left, self.merge = items, limit, merge

    def full(self) -> bool:
        return self.left is not None and self.left <= 0

    def _take(self, tup: CheckpointTuple) -> list[CheckpointTuple]:
        if self.full():
            return []
        if self.left is not None:
            self.left -= 1
        return [tup]

    def feed(self, tup: CheckpointTuple) -> list[CheckpointTuple]:
        out: list[CheckpointTuple] = []
        while self.queue and _order(self.queue[0]) > _order(tup) and not self.full():
            out += self._take(self.queue.popleft())
        if _key(tup) not in self.seen:
            out += self._take(self.merge(tup, self.items))
        return out

    def rest(self) -> list[CheckpointTuple]:
        out: list[CheckpointTuple] = []
        while self.queue and not self.full():
            out += self._take(self.queue.popleft())
        return out
