"""Writing the buffer: a thread's queue as one batch to the inner checkpointer (`Flusher`),
logic written once as coroutines for a sync flush (driven by `run_inline`: it must never
suspend, and does not) and an async one (`either` picks the inner call); the interval
timer's thread (`Timer`); and the flush at interpreter exit (`LIVE`)."""

from __future__ import annotations

import asyncio
import atexit
import functools
import logging
import math
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from langgraph.checkpoint.base import BaseCheckpointSaver

from ...core.bridge import either, resolve, run_inline
from ...core.errors import ConcurrentWriteError
from ...core.inner import BatchSaver, RowSaver
from ...core.saver import StoreCheckpointer
from ...core.telemetry import Telemetry, telemetry_of
from .buffer import Buffer, Flight
from .items import op
from .policies import Policy


class Flusher:
    """Writes a `Buffer`'s threads to one inner checkpointer, which is looked at once here:
    rows it can prepare and carry (`RowSaver`), a batch in one call (`BatchSaver`), or op by
    op (any LangGraph saver)."""

    def __init__(self, buffer: Buffer, inner: BaseCheckpointSaver[Any]) -> None:
        self.buffer = buffer
        self.inner = inner
        self.rows = inner if isinstance(inner, RowSaver) else None
        self.batches = inner if isinstance(inner, BatchSaver) else None
        # Buffered values are kept serialized (`codec.Encoded`); ours store those bytes as
        # they are, any other checkpointer is given them decoded.
        self.encoded = isinstance(inner, StoreCheckpointer)
        # One writer per thread: the buffered head is checked at `put`, and a batch is never
        # written twice (once stored, its checkpoints no longer chain onto the head).
        self.single = getattr(inner, "writers", None) == "single"
        # Flushes are traced with the inner checkpointer's telemetry (ours), else the global
        # providers'.
        self.telemetry: Telemetry = telemetry_of(getattr(inner, "telemetry", None))
        self.system: str | None = getattr(inner, "db_system", None)

    async def threads(self, thread_ids: Sequence[str] | None, coalesce: bool, sync: bool,
                      refusals: bool = False) -> None:
        """Write the buffer of these threads, in turn (None: of every thread, each tried,
        then the first error raised). A thread's batch refused by the store
        (`ConcurrentWriteError`) is dropped and its run told (`Buffer.refused`); it is raised
        here only with `refusals` (after the other threads are written)."""
        errors: list[Exception] = []
        for thread_id in self.buffer.thread_ids() if thread_ids is None else thread_ids:
            try:
                await self.thread(str(thread_id), coalesce, sync)
            except ConcurrentWriteError as exc:
                if refusals:
                    errors.append(exc)
            except Exception as exc:
                if thread_ids is not None:
                    raise
                errors.append(exc)
        if errors:
            raise errors[0]

    async def thread(self, thread_id: str, coalesce: bool, sync: bool, until_empty: bool = True
                     ) -> None:
        """Write the thread's queue as one batch (after a flush already writing it, unless
        this one can carry it); with `until_empty`, also what was queued meanwhile."""
        while True:
            idle = _Idle(sync)
            took = self.buffer.take(thread_id, idle.wake, coalesce, carry=not self.single)
            if took is None:  # another flush of this thread is writing: after it
                await idle.wait()
                continue
            if took is False:
                return
            flight, carried = took
            try:
                await self._traced(thread_id, flight, carried, sync)
            except BaseException as exc:
                if not self.buffer.done(thread_id, flight, exc):
                    raise
            else:
                self.buffer.done(thread_id, flight, None)
            if not until_empty:
                return

    async def _traced(self, thread_id: str, flight: Flight, carried: list[Flight], sync: bool
                      ) -> None:
        """`_write`, as a `flush` span when traced: the checkpoints and writes it stores, the
        earlier batches it carries, and (ours) the rows and bytes."""
        ops = [op(i, self.encoded) for i in flight.items]
        if not self.telemetry.on:
            await self._write(ops, flight, carried, sync)
            return
        puts = sum(o[0] == "put" for o in ops)
        with self.telemetry.operation(self.system, "flush", thread_id, {
                "lgckpt.checkpoints": puts, "lgckpt.writes": len(ops) - puts,
                "lgckpt.carried": len(carried)}):
            await self._write(ops, flight, carried, sync)

    async def _write(self, ops: list[tuple[Any, ...]], flight: Flight, carried: list[Flight],
                     sync: bool) -> None:
        rows, inner = self.rows, self.inner
        if rows is not None:
            prepared = await either(sync, rows.prepare_batch, rows.aprepare_batch, ops)
            if prepared is not None:
                self.buffer.made(flight, prepared)
                # (a carried batch always has its rows: `Buffer.take` waits for them)
                batches = [p for f in carried if (p := f.prepared) is not None]
                await either(sync, rows.write_prepared, rows.awrite_prepared,
                             [*batches, prepared])
                return
        if self.batches is not None:
            await either(sync, self.batches.put_batch, self.batches.aput_batch, ops)
            return
        for o in ops:
            if o[0] == "put":
                await either(sync, inner.put, inner.aput, *o[1:])
            else:
                await either(sync, inner.put_writes, inner.aput_writes, *o[1:])

    def due(self, policy: Policy, coalesce: bool) -> float:
        """Write the threads due now (the timer's pass); seconds until the next one is due."""
        wait, due = self.buffer.next_due(policy)
        for thread_id in due:
            try:
                run_inline(self.thread(thread_id, coalesce, sync=True))
            except ConcurrentWriteError:  # dropped; its run is told (`Buffer.refused`)
                pass
            except Exception:  # kept in the buffer and in metrics.last_error; retried
                wait = min(wait, 1.0)
        return wait


class _Idle:
    """How a flush that finds a batch of its thread out waits for it: a sync one blocks on an
    event (it does not suspend), an async one awaits a future of its loop."""

    def __init__(self, sync: bool) -> None:
        self._event: threading.Event | None = None
        self._future: asyncio.Future[None] | None = None
        self.wake: Callable[[], object]
        if sync:
            self._event = event = threading.Event()
            self.wake = event.set
        else:
            loop = asyncio.get_running_loop()
            self._future = future = loop.create_future()
            self.wake = functools.partial(loop.call_soon_threadsafe, resolve, future)

    async def wait(self) -> None:
        if self._event is not None:
            self._event.wait()
        elif self._future is not None:
            await self._future


class Timed(Protocol):
    """What the timer, and the exit, ask of a checkpointer."""

    def _timer_pass(self) -> float: ...

    def _buffering(self) -> bool: ...

    def flush(self) -> None: ...


LIVE: weakref.WeakSet[Timed] = weakref.WeakSet()
"""The checkpointers whose buffer is written at interpreter exit."""


@atexit.register
def _flush_at_exit() -> None:
    for cp in list(LIVE):
        try:
            cp.flush()
        except Exception as exc:  # the interpreter is going: the log is who is left to tell
            logging.getLogger("langgraph_ckpt_ext").error(
                "SmartCheckpointer: buffered checkpoints lost at interpreter exit: %s", exc)


class Timer:
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

    def arm(self, owner: Timed) -> None:
        with self._guard:
            # Gone with a dropped checkpointer, while a copy of it lives on: a new one.
            if not self.closed and (self._thread is None or not self._thread.is_alive()):
                self._thread = threading.Thread(
                    target=_serve, args=(weakref.ref(owner), self), name="lgckpt-smart",
                    daemon=True)
                self._thread.start()
        self.wake.set()

    def stop(self) -> None:
        self.closed = True
        self.wake.set()


def _serve(ref: weakref.ref[Timed], timer: Timer) -> None:
    held: Timed | None = None
    while not timer.closed:
        cp = ref() if held is None else held
        if cp is None:
            return
        timer.wake.clear()  # before the pass: a wake that comes during it is not lost
        wait = cp._timer_pass()
        held = cp if cp._buffering() else None
        del cp
        timer.wake.wait(None if math.isinf(wait) else max(wait, 0.001))
