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

Each sync/async pair of methods runs one coroutine, `sync=True` driven by `run_inline` (it
calls the inner checkpointer's sync methods and never suspends) or awaited.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Collection,
    Iterator,
    Mapping,
    Sequence,
)
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    DeltaChannelHistory,
)

from ...connecting import around
from ...core.bridge import either, run_inline
from ...core.config import thread_id_of
from ...core.errors import ConcurrentWriteError, InvalidConfigError
from ...core.guard import carry_read
from ...core.lifetime import Lifetime
from ...core.opening import Opening
from ...core.retention import ErasureReport, SweepReport
from ...core.saver import StoreCheckpointer
from ...core.telemetry import instance_name
from ...timetravel.methods import TimeTravel
from .._forward import Closing, iterate_closing, not_forwarded, store_method
from .._lifecycle import (
    Delete,
    DeleteWrap,
    Expire,
    ExpireWrap,
    LifecycleForwarded,
    host_erase,
    host_sweep,
    set_on,
)
from .buffer import Buffer
from .flusher import LIVE, Flusher, Timer
from .items import Encoder, Item, writes_item
from .metrics import Metrics
from .overlay import listing, read_tuple
from .policies import OnEvents, Policy

P = ParamSpec("P")
T = TypeVar("T")


class SmartCheckpointer(BaseCheckpointSaver[Any], TimeTravel, LifecycleForwarded, Closing):
    """Wraps any checkpointer and writes to it when it matters.

    The time-travel methods (`history`, `fork`, ...) read through the buffer; the helpers of
    this package's checkpointers (`sizes`, `verify`, `migrate_threads`, ...) are the inner
    one's, called once the buffer of the threads they read or rewrite is written.

    The data lifecycle (`sweep`, `erase`, `pin`, `retention`, `clock`, ...) is the inner
    one's, with the buffer taken into account: a thread with items buffered (or being
    written) is active, so a sweep never expires it (it is reported `busy`, and left for the
    next pass, by when its flush has recorded the write); an erasure writes the buffer first
    (so that buffered checkpoints are searched too) and drops the buffer of each thread it
    deletes; a background sweeper (`start_sweeper`) sweeps through this wrapper and stops on
    its `close`. A read served from the buffer is not recorded as a read (`refresh_on_read`):
    that thread is buffered, hence active, and its flush records a later write anyway.

    One writer per thread (an inner checkpointer with `writers="single"`, `core.guard`): a
    read served from the buffer carries the head as buffer and store together show it, so a
    run that starts from it chains, or forks on purpose, exactly as without the wrapper. A
    put the buffered head already refuses (another run of this process got there first) is
    refused as it comes (`ConcurrentWriteError`, nothing queued). A batch the store refuses
    (another writer, a tombstone, a lease, an epoch) stores nothing: that thread's buffered
    items are dropped (the other threads' are written) and the run that wrote them gets the
    error from its own flush (the put or put_writes of an event, or of its end), else from
    its next put or put_writes on them; `flush()` raises it too. A run whose end stays
    buffered (a periodic policy) may have returned by then: `metrics.writes_refused` counts
    such batches. Writes inside `with checkpointer.lease(...)` carry its token wherever they
    are flushed from; `lease`, `tombstone` and `writers` are the inner checkpointer's.

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

    inner: BaseCheckpointSaver[Any]

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
        self.policy = policy or OnEvents()
        self.coalesce = coalesce
        self.max_checkpoints = max_checkpoints
        self.max_bytes = max_bytes
        self.plan_channels = frozenset(plan_channels)
        self.side_effect_tools = None if side_effect_tools is None else frozenset(
            side_effect_tools)
        # Shared with `with_allowlist` copies: one buffer, one timer, one encoding memo.
        self._timer = Timer()
        self._buffer = Buffer(on_empty=self._timer.wake.set)
        self._encoder = Encoder(max_bytes)
        self._wrap(inner)
        self._lifetime = Lifetime(type(self).__name__, self._timer.stop)
        self._owned: StoreCheckpointer | None = None  # an inner one `from_conn_string` opened
        LIVE.add(self)
        # spans and gauges go where its inner checkpointer's do
        self.telemetry, self.db_system = self._flusher.telemetry, self._flusher.system
        self._instance = instance_name(self)
        self.telemetry.watch(self)

    def _wrap(self, inner: BaseCheckpointSaver[Any]) -> None:
        self.inner = inner
        self._flusher = Flusher(self._buffer, inner)

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

    @property
    def metrics(self) -> Metrics:
        """A snapshot of what was requested, written and is waiting."""
        return self._buffer.metrics()

    def _observations(self) -> list[tuple[str, float, dict[str, Any]]]:
        """Its gauges (`core.telemetry`): what it holds, and for how long."""
        m = self._buffer.metrics()
        attributes: dict[str, Any] = {"lgckpt.instance": self._instance}
        if self._flusher.system is not None:
            attributes["db.system.name"] = self._flusher.system
        return [("lgckpt.smart.buffered", m.buffered, attributes),
                ("lgckpt.smart.oldest_unflushed_age", m.oldest_unflushed_age, attributes)]

    # -- writing ----------------------------------------------------------------------------

    def put(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
            new_versions: ChannelVersions) -> RunnableConfig:
        return run_inline(self._put(config, checkpoint, metadata, new_versions, sync=True))

    async def aput(self, config: RunnableConfig, checkpoint: Checkpoint,
                   metadata: CheckpointMetadata, new_versions: ChannelVersions
                   ) -> RunnableConfig:
        return await self._put(config, checkpoint, metadata, new_versions, sync=False)

    async def _put(self, config: RunnableConfig, checkpoint: Checkpoint,
                   metadata: CheckpointMetadata, new_versions: ChannelVersions, sync: bool
                   ) -> RunnableConfig:
        if self._flusher.single:  # flushed later, maybe from another thread: the read goes along
            config = carry_read(config, metadata)
        item, out = self._encoder.put(self.serde, config, checkpoint, metadata, new_versions)
        if await self._queue_apart(item, sync):
            await self._write_now(item, sync)
        elif self._buffer.over(4 * self.max_bytes):
            await self._flusher.threads(None, self.coalesce, sync)
        return out

    def put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                   task_id: str, task_path: str = "") -> None:
        run_inline(self._put_writes(config, writes, task_id, task_path, sync=True))

    async def aput_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                          task_id: str, task_path: str = "") -> None:
        await self._put_writes(config, writes, task_id, task_path, sync=False)

    async def _put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                          task_id: str, task_path: str, sync: bool) -> None:
        item = writes_item(self.serde, config, writes, task_id, task_path, self.plan_channels,
                           self.side_effect_tools)
        if await self._queue_apart(item, sync):
            await self._write_now(item, sync)

    async def _queue_apart(self, item: Item, sync: bool) -> bool:
        """`_queue`, after writing what another lease holder queued for the thread."""
        if self._buffer.other_holder(item):
            with contextlib.suppress(ConcurrentWriteError):  # theirs: told as they put
                await self._flusher.thread(item.thread_id, self.coalesce, sync)
        return self._queue(item)

    def _queue(self, item: Item) -> bool:
        """Queue an item; True if its thread must be written now (else the timer watches).
        `ConcurrentWriteError` for an item of a run refused (see `Buffer.refused`)."""
        due = self._buffer.queue(item, self.policy, self.max_checkpoints, self.max_bytes,
                                 self._flusher.single)
        if not due:
            self._timer.arm(self)
        return due

    async def _write_now(self, item: Item, sync: bool) -> None:
        """Write the item's thread; its refusal is raised to the run even when another flush
        (the timer's, another run's) took the item and was refused."""
        try:
            await self._flusher.thread(item.thread_id, self.coalesce, sync, until_empty=False)
        except ConcurrentWriteError as exc:
            self._buffer.told(exc)
            raise
        refused = self._buffer.refusal(item)
        if refused is not None:
            raise refused

    def flush(self) -> None:
        """Write every thread's buffer now (each thread's in one batch). A thread's batch the
        store refuses (`ConcurrentWriteError`: another writer got there first) is dropped, its
        run told; once the other threads are written, a `ConcurrentWriteError` names every
        thread whose checkpoints were dropped so (here or by an earlier flush) that no caller
        was told of yet, and how many."""
        run_inline(self._flush_all(sync=True))

    async def aflush(self) -> None:
        await self._flush_all(sync=False)

    async def _flush_all(self, sync: bool) -> None:
        await self._flusher.threads(None, self.coalesce, sync)
        self._raise_unreported()

    def _raise_unreported(self) -> None:
        """Raise the refusals no caller was told of: their checkpoints are not stored."""
        lost = self._buffer.take_unreported()
        if not lost:
            return
        first = lost[0][3]
        turns = "; ".join(f"thread {t!r}: {n} checkpoint(s), {w} pending write(s)"
                          for t, n, w, _ in lost)
        # the first refusal's own class (a lease, a deletion, a fence...), saying all of them
        raise type(first)(
            f"buffered items were refused by the store and are not stored ({turns}). First "
            f"refusal: {first}", first.thread_id, first.checkpoint_ns) from first

    def _timer_pass(self) -> float:
        """Write the threads due now; seconds until the next one is due."""
        return self._flusher.due(self.policy, self.coalesce)

    def _buffering(self) -> bool:
        return bool(self._buffer.thread_ids())

    # -- reading ----------------------------------------------------------------------------

    def _snapshot(self, thread_id: str | None) -> list[Item]:
        """The buffered items a read sees (see `Buffer.snapshot`)."""
        return self._buffer.snapshot(thread_id)

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return run_inline(read_tuple(self.inner, self._snapshot, config, sync=True,
                                     single=self._flusher.single))

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await read_tuple(self.inner, self._snapshot, config, sync=False,
                                single=self._flusher.single)

    def list(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
             before: RunnableConfig | None = None, limit: int | None = None
             ) -> Iterator[CheckpointTuple]:
        return iterate_closing(listing(self.inner, self._snapshot, config, filter, before, limit,
                                       sync=True, single=self._flusher.single))

    def alist(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
              before: RunnableConfig | None = None, limit: int | None = None
              ) -> AsyncIterator[CheckpointTuple]:
        return listing(self.inner, self._snapshot, config, filter, before, limit, sync=False,
                       single=self._flusher.single)

    # -- everything else: written first, then the inner checkpointer --------------------------

    async def _then(
        self, threads: Sequence[str] | None, sync: bool, call: Callable[P, T],
        acall: Callable[P, Awaitable[T]], /, *args: P.args, **kwargs: P.kwargs,
    ) -> T:
        """The inner checkpointer's `call` (or `acall`), once the buffer of `threads` (None:
        every thread) is written."""
        await self._flusher.threads(threads, self.coalesce, sync)
        return await either(sync, call, acall, *args, **kwargs)

    def delete_thread(self, thread_id: str) -> None:
        run_inline(self._delete(thread_id, True))

    async def adelete_thread(self, thread_id: str) -> None:
        await self._delete(thread_id, False)

    async def _delete(self, thread_id: str, sync: bool) -> None:
        await self._drop(thread_id, sync)
        await either(sync, self.inner.delete_thread, self.inner.adelete_thread, thread_id)

    async def _drop(self, thread_id: str, sync: bool) -> None:
        """Drop the buffer of a thread being deleted."""
        while not self._buffer.drop(str(thread_id)):
            # A flush is writing it: delete after it. Async, the flush may run on this very
            # loop, so it waits by yielding to the loop, never by blocking it.
            await either(sync, time.sleep, _asleep, 0.002)
        self._encoder.forget(str(thread_id))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        run_inline(self._then([source_thread_id, target_thread_id], True, self.inner.copy_thread,
                              self.inner.acopy_thread, source_thread_id, target_thread_id))

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await self._then([source_thread_id, target_thread_id], False, self.inner.copy_thread,
                         self.inner.acopy_thread, source_thread_id, target_thread_id)

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        run_inline(self._then(None, True, self.inner.delete_for_runs,
                              self.inner.adelete_for_runs, run_ids))

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await self._then(None, False, self.inner.delete_for_runs, self.inner.adelete_for_runs,
                         run_ids)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        run_inline(self._then(thread_ids, True, self.inner.prune, self.inner.aprune, thread_ids,
                              strategy=strategy))

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await self._then(thread_ids, False, self.inner.prune, self.inner.aprune, thread_ids,
                         strategy=strategy)

    def get_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        return run_inline(self._then(
            [thread_id_of(config)], True, self.inner.get_delta_channel_history,
            self.inner.aget_delta_channel_history, config=config, channels=channels))

    async def aget_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        return await self._then(
            [thread_id_of(config)], False, self.inner.get_delta_channel_history,
            self.inner.aget_delta_channel_history, config=config, channels=channels)

    def with_allowlist(self, extra_allowlist: Collection[tuple[str, ...]]) -> SmartCheckpointer:
        """A view that may also decode the graph's own types (LangGraph asks for it when it
        compiles a graph under LANGGRAPH_STRICT_MSGPACK): the inner checkpointer too, since
        reads go through it. Buffer and inner storage stay shared."""
        clone = super().with_allowlist(extra_allowlist)
        if clone is self or not isinstance(clone, SmartCheckpointer):
            return self
        clone._wrap(self.inner.with_allowlist(extra_allowlist))
        return clone

    def get_next_version(self, current: Any, channel: Any = None) -> Any:
        return self.inner.get_next_version(current, channel)

    # -- the inner checkpointer's helpers (`Forwarded`): the buffer they read written first --

    def _forward(self, name: str, threads: Sequence[str] | None, *args: Any, **kwargs: Any
                 ) -> Any:
        return run_inline(self._pass_on(name, threads, True, *args, **kwargs))

    async def _aforward(self, name: str, threads: Sequence[str] | None, *args: Any,
                        **kwargs: Any) -> Any:
        return await self._pass_on(name, threads, False, *args, **kwargs)

    async def _pass_on(self, name: str, threads: Sequence[str] | None, sync: bool, *args: Any,
                       **kwargs: Any) -> Any:
        method = store_method(self.inner, name, "inner")
        await self._flusher.threads(threads, self.coalesce, sync)
        result = method(*args, **kwargs) if sync else await method(*args, **kwargs)
        if name.endswith("migrate_threads"):  # the values remembered as stored were rewritten
            for t in [None] if threads is None else threads:
                self._encoder.forget(None if t is None else str(t))
        return result

    # -- the data lifecycle (`LifecycleForwarded`): the inner checkpointer's, minus the buffer --

    def _lifecycle_saver(self) -> Any:
        return self.inner

    async def _set_lifecycle(self, sync: bool, name: str, thread_id: str, *args: Any) -> None:
        await set_on(self.inner, sync, name, thread_id, *args)

    async def _guarded_sweep(self, sync: bool, limit: int | None, dry_run: bool,
                             delete_paused: bool | None, wrap: ExpireWrap,
                             threads: Sequence[str] | None = None) -> SweepReport:
        report = await host_sweep(self.inner, "inner", sync, limit, dry_run, delete_paused,
                                  lambda expire, s: wrap(self._unless_buffered(expire), s),
                                  threads)
        if dry_run:  # (a real pass asks `_unless_buffered`)
            held = [t for t in report.deleted if self._buffer.holds(t)]
            report.deleted = [t for t in report.deleted if t not in held]
            report.busy += held
        return report

    def _unless_buffered(self, expire: Expire) -> Expire:
        """An expiry that spares a thread this buffer holds items of (or is writing)."""
        async def guarded(thread_id: str, generation: int) -> bool:
            if self._buffer.holds(thread_id) or not await expire(thread_id, generation):
                return False
            self._encoder.forget(thread_id)
            return True

        return guarded

    async def _guarded_erase(self, sync: bool, where: Mapping[str, Any], dry_run: bool,
                             reason: str, wrap: DeleteWrap) -> ErasureReport:
        await self._flusher.threads(None, self.coalesce, sync)  # buffered metadata counts too

        def dropping(delete: Delete, hook_sync: bool) -> Delete:
            async def drop_then(thread_id: str) -> None:
                await self._drop(thread_id, hook_sync)
                await delete(thread_id)

            return wrap(drop_then, hook_sync)

        return await host_erase(self.inner, "inner", sync, where, dry_run, reason, dropping)

    if not TYPE_CHECKING:  # (for mypy, an unknown attribute stays an error)
        def __getattr__(self, name: str) -> Any:
            # vars(): no attribute lookup that could come back here while being built
            raise not_forwarded(self, vars(self).get("inner"), "inner", name, "the buffer")

    # -- lifecycle --------------------------------------------------------------------------

    def close(self) -> None:
        """Write everything buffered, stop the interval timer and the background sweeper (the
        inner checkpointer is the caller's and stays open, unless `from_conn_string` opened
        it)."""
        run_inline(self._close(sync=True))

    async def aclose(self) -> None:
        await self._close(sync=False)

    async def _close(self, sync: bool) -> None:
        """Write the buffer, stop; then raise what `flush()` would (a failed write, refused
        checkpoints no caller was told of): nothing is dropped silently."""
        self.stop_sweeper()
        try:
            await self._flusher.threads(None, self.coalesce, sync)
        finally:
            self._lifetime.closed()
            self._timer.stop()
            owned, self._owned = self._owned, None
            if owned is not None:
                await either(sync, owned.close, owned.aclose)
        self._raise_unreported()


async def _asleep(seconds: float) -> None:
    await asyncio.sleep(seconds)
