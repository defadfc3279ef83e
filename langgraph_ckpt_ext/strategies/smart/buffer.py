"""The buffer's state machine: each thread's queue of items, the batches of it being written
(`Flight`), and what is remembered across batches (writes that came before their checkpoint,
runs that ended). Every method takes the buffer's lock; nothing here does I/O or waits."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from ...core.batch import PreparedBatch
from ...core.errors import ConcurrentWriteError
from ...core.guard import LEASE_KEY, put_guard, put_refusal
from . import policies
from .items import Item, Put, Writes, coalesced, puts
from .metrics import Metrics
from .policies import Policy, ThreadActivity


@dataclass(eq=False)
class Flight:
    """A batch of one thread being written. `prepared`: its rows, once the inner checkpointer
    made them (`RowSaver.aprepare_batch`); a later batch may then be written with them, and
    stands for both, so that it need not wait for this one (see `Buffer.take`)."""

    items: list[Item]
    prepared: PreparedBatch | None = None
    stored: bool = False  # set when this batch, or a later one carrying it, is stored


@dataclass
class ThreadQueue:
    pending: deque[Item] = field(default_factory=deque)
    # Batches being written, oldest first; each one written also holds the rows of those
    # before it.
    flights: list[Flight] = field(default_factory=list)
    rate: float = 0.0
    last: float = 0.0
    bytes: int = 0
    puts: int = 0
    # Called when a batch is done: flushes that found the thread busy wait on these.
    waiters: list[Callable[[], object]] = field(default_factory=list)

    @property
    def inflight(self) -> list[Item]:
        return [i for f in self.flights for i in f.items]

    def items(self) -> list[Item]:
        return [*self.inflight, *self.pending]

    def oldest(self) -> float | None:
        inflight = self.inflight
        first = inflight[0] if inflight else (self.pending[0] if self.pending else None)
        return None if first is None else first.at


class Buffer:
    """What a `SmartCheckpointer` (and its `with_allowlist` copies) holds unwritten.

    LangGraph may pass a step's writes before the checkpoint they belong to (both go out from
    background tasks). `seen`: checkpoints queued here; `orphans`: writes stored before their
    checkpoint is (read back with it while it is buffered); `urgent`: checkpoints whose
    writes were an event (an interrupt): written the moment they come. `ended`: (thread, ns)
    -> id of the checkpoint that ended a run and was written at once: a write of that run
    that comes after it goes at once too, so that the run is whole when it returns.

    One writer per thread (an inner checkpointer with `writers="single"`): `refused` maps
    (thread, ns, checkpoint id) to the `ConcurrentWriteError` that dropped it, from the store
    (a flush refused: the thread's whole queue goes, nothing of it stored) or from `queue`
    (a put the buffered head already refuses, checked here so that one run's stale put never
    sinks the batch of the run that got there first). A later put chaining onto a refused
    checkpoint, or writes for one, raise that error: it reaches the run that wrote them.
    """

    def __init__(self, on_empty: Callable[[], object]) -> None:
        self.lock = threading.RLock()
        self.threads: dict[str, ThreadQueue] = {}
        self.seen: OrderedDict[tuple[str, str, str], None] = OrderedDict()
        self.orphans: OrderedDict[tuple[str, str, str], list[Writes]] = OrderedDict()
        self.urgent: set[tuple[str, str, str]] = set()
        self.ended: OrderedDict[tuple[str, str], str] = OrderedDict()
        self.refused: OrderedDict[tuple[str, str, str], ConcurrentWriteError] = OrderedDict()
        # refusals that dropped items no caller was told of yet: error -> (thread, checkpoints,
        # pending writes dropped); `flush()` and `close()` raise them, the exit logs them
        self.unreported: OrderedDict[ConcurrentWriteError, tuple[str, int, int]] = OrderedDict()
        self.counts = Metrics()
        self._on_empty = on_empty  # the buffer emptied: the timer may let go of its owner

    def queue(self, item: Item, policy: Policy, max_checkpoints: int, max_bytes: int,
              single: bool = False) -> bool:
        """Queue an item; True if its thread must be written now. `ConcurrentWriteError`
        (nothing queued) for an item of a refused run, or a put the buffered head refuses
        (`single`: the head rule applies)."""
        events = item.events
        now = item.at
        with self.lock:
            self._check(item, single)
            st = self.threads.setdefault(item.thread_id, ThreadQueue())
            gap = now - st.last if st.last else math.inf
            st.rate = 0.7 * st.rate + 0.3 * (1.0 / max(gap, 1e-3))
            st.last = now
            st.pending.append(item)
            st.bytes += item.size
            st.puts += isinstance(item, Put)
            if isinstance(item, Put):
                self.counts.saves_requested += 1
            else:
                self.counts.writes_requested += 1
            key = (item.thread_id, item.ns, item.checkpoint_id)
            urgent = False
            if isinstance(item, Put):
                _remember(self.seen, key, None)
                urgent = key in self.urgent
                self.urgent.discard(key)
                self.ended.pop((item.thread_id, item.ns), None)
            else:
                ended = self.ended.get((item.thread_id, item.ns))
                urgent = ended is not None and item.checkpoint_id <= ended
            due = (
                urgent
                or policies.INTERRUPT in events  # a human is waiting on it: always at once
                or policy.flush_on(events)
                or st.puts > max_checkpoints
                or st.bytes > max_bytes
                or _age_due(policy, st, now)
            )
            if due and isinstance(item, Writes) and key not in self.seen:
                self.urgent.add(key)
            if due and isinstance(item, Put) and policies.END in events:
                _remember(self.ended, (item.thread_id, item.ns), item.checkpoint_id, 1024)
        return due

    def _check(self, item: Item, single: bool) -> None:
        """Refuse an item of a refused run, or a put the head as buffered refuses (the store
        checks again when it is written: the buffer knows nothing of other processes)."""
        t, ns = item.thread_id, item.ns
        if isinstance(item, Writes):
            refused = self.refused.get((t, ns, item.checkpoint_id))
            if refused is not None:
                self.unreported.pop(refused, None)
                raise refused
            return
        if item.parent_id is not None:
            refused = self.refused.get((t, ns, item.parent_id))
            if refused is not None:
                _remember(self.refused, (t, ns, item.checkpoint_id), refused, 4096)
                self.unreported.pop(refused, None)
                raise refused
        st = self.threads.get(t)
        if not single or st is None:
            return
        head = max((i.checkpoint_id for i in st.items() if isinstance(i, Put) and i.ns == ns),
                   default=None)
        if head is None:  # nothing of the namespace buffered: the store decides
            return
        guard = put_guard(item.config, item.metadata, item.parent_id, t, single=True,
                          epoch=None)
        # the head rule alone: leases, tombstones and epochs are the store's to check
        refusal = put_refusal(dataclasses.replace(guard, lease=None), t, ns, item.parent_id,
                              head, False)
        if refusal is not None:
            _remember(self.refused, (t, ns, item.checkpoint_id), refusal, 4096)
            self.counts.writes_refused += 1
            raise refusal

    def other_holder(self, item: Item) -> bool:
        """Whether the thread's queue holds items of another lease holder (or of none, when
        this one carries a token): written first in a batch of their own, so that a refusal
        of one holder's writes never drops another's."""
        token = item.config.get("configurable", {}).get(LEASE_KEY)
        with self.lock:
            st = self.threads.get(item.thread_id)
            return st is not None and any(
                i.config.get("configurable", {}).get(LEASE_KEY) != token for i in st.pending)

    def refusal(self, item: Item) -> ConcurrentWriteError | None:
        """The error that dropped this item from the buffer, if it was refused (then told:
        the caller raises it)."""
        with self.lock:
            refused = self.refused.get((item.thread_id, item.ns, item.checkpoint_id))
            if refused is not None:
                self.unreported.pop(refused, None)
            return refused

    def told(self, error: ConcurrentWriteError) -> None:
        """A caller was given this refusal."""
        with self.lock:
            self.unreported.pop(error, None)

    def take_unreported(self) -> list[tuple[str, int, int, ConcurrentWriteError]]:
        """The refusals no caller was told of, (thread, checkpoints and writes dropped, error),
        now told."""
        with self.lock:
            lost = [(t, n, w, e) for e, (t, n, w) in self.unreported.items()]
            self.unreported.clear()
            return lost

    def over(self, max_bytes: int) -> bool:
        """Whether all threads together hold more than `max_bytes`."""
        with self.lock:
            return sum(t.bytes for t in self.threads.values()) > max_bytes

    def take(
        self, thread_id: str, wake: Callable[[], object], coalesce: bool, carry: bool = True
    ) -> tuple[Flight, list[Flight]] | Literal[False] | None:
        """Move a thread's queue in flight, with the batches still being written that it must
        carry: (flight, carried). None: wait (`wake` is called when a batch of the thread is
        done). False: nothing queued.

        A batch starts while an earlier one of the thread is still out only if it can carry
        the earlier one's rows (our checkpointers, once those rows are made; one batch out at
        a time, not more): it is then one statement holding both, so that once it is stored
        the earlier rows are too, whatever became of their own write. The thread stays a
        prefix of what was put, in order. Not with `carry` False (the head rule: a batch
        written again once stored is refused, its checkpoints no longer chain onto the
        head)."""
        with self.lock:
            st = self.threads.get(thread_id)
            if st is None or not st.pending:
                return False
            # One batch carried at most: each row is then sent at most twice. (Rows are only
            # made for an inner checkpointer that can carry them.)
            if st.flights and not (carry and len(st.flights) == 1
                                   and st.flights[0].prepared is not None):
                st.waiters.append(wake)
                return None
            batch = list(st.pending)
            st.pending.clear()
            kept = coalesced(batch) if coalesce else batch
            if kept is not batch:  # what coalescing dropped no longer counts against bounds
                st.bytes -= sum(i.size for i in batch) - sum(i.size for i in kept)
                st.puts -= puts(batch) - puts(kept)
                # nor are the writes stored before a checkpoint coalescing dropped read back
                keep = {(i.ns, i.checkpoint_id) for i in kept if isinstance(i, Put)}
                for i in batch:
                    if isinstance(i, Put) and (i.ns, i.checkpoint_id) not in keep:
                        self.orphans.pop((i.thread_id, i.ns, i.checkpoint_id), None)
            carried = list(st.flights)
            flight = Flight(kept)
            st.flights.append(flight)
            return flight, carried

    def made(self, flight: Flight, prepared: PreparedBatch) -> None:
        with self.lock:
            flight.prepared = prepared

    def done(self, thread_id: str, flight: Flight, error: BaseException | None) -> bool:
        """Book a batch's write; True if its items are stored (by it, or by a later batch
        that carried it: then its own failure loses nothing, and is only counted)."""
        waiters: list[Callable[[], object]] = []
        with self.lock:
            st = self.threads.get(thread_id)
            if st is not None and flight in st.flights:
                waiters, st.waiters = st.waiters, []
                self._settle(thread_id, st, flight, error)
            elif error is not None:  # already settled by a later batch
                self.counts.flush_failures += 1
                self.counts.last_error = error
        for wake in waiters:
            with contextlib.suppress(RuntimeError):  # a waiter's event loop already closed
                wake()
        return flight.stored

    def _settle(
        self, thread_id: str, st: ThreadQueue, flight: Flight, error: BaseException | None
    ) -> None:
        """Book a finished batch (under the lock). Stored: it and every batch it carried are.
        Failed: a later batch carrying it decides; if none, all of them go back to the front
        of the queue."""
        at = st.flights.index(flight)
        if error is not None:
            self.counts.flush_failures += 1
            self.counts.last_error = error
            if at < len(st.flights) - 1:
                return
            if isinstance(error, ConcurrentWriteError):
                self._drop_refused(thread_id, st, error)
                return
            back = st.inflight
            st.flights.clear()
            st.pending.extendleft(reversed(back))
            return
        for f in st.flights[: at + 1]:
            f.stored = True
        batch = [i for f in st.flights[: at + 1] for i in f.items]
        del st.flights[: at + 1]
        # Writes stored before their checkpoint is (still to come, or queued behind them):
        # a read served from the buffer must find them until the checkpoint is stored too.
        unstored = {(i.thread_id, i.ns, i.checkpoint_id) for i in st.items()
                    if isinstance(i, Put)}
        for i in batch:
            key = (i.thread_id, i.ns, i.checkpoint_id)
            if isinstance(i, Put):
                self.orphans.pop(key, None)
            elif key not in self.seen or key in unstored:
                _remember(self.orphans, key, []).append(i)
        size = sum(i.size for i in batch)
        st.bytes = max(0, st.bytes - size)
        st.puts = max(0, st.puts - puts(batch))
        self.counts.batches += 1
        self.counts.bytes_written += size
        self.counts.checkpoints_written += sum(isinstance(i, Put) for i in batch)
        self.counts.writes_written += sum(isinstance(i, Writes) for i in batch)
        if not st.pending and not st.flights:
            del self.threads[thread_id]
            if not self.threads:
                self._on_empty()

    def _drop_refused(self, thread_id: str, st: ThreadQueue, error: ConcurrentWriteError
                      ) -> None:
        """The store refused the thread's batch: nothing of it was stored, and what was
        queued since chains onto it; all of it goes, remembered as refused."""
        dropped = [*st.inflight, *st.pending]
        st.flights.clear()
        st.pending.clear()
        for i in dropped:
            _remember(self.refused, (i.thread_id, i.ns, i.checkpoint_id), error, 4096)
            if isinstance(i, Put):
                self.orphans.pop((i.thread_id, i.ns, i.checkpoint_id), None)
        self.counts.writes_refused += 1
        _remember(self.unreported, error,
                  (thread_id, puts(dropped), len(dropped) - puts(dropped)), 4096)
        del self.threads[thread_id]
        if not self.threads:
            self._on_empty()

    def snapshot(self, thread_id: str | None) -> list[Item]:
        """The buffered items of a thread (or all), each checkpoint preceded by the writes
        that were stored before it came: taken at one instant, so that a batch settling
        meanwhile (which forgets those writes) cannot hide them from the read."""
        with self.lock:
            if thread_id is not None:
                st = self.threads.get(thread_id)
                items = st.items() if st else []
            else:
                items = [i for st in self.threads.values() for i in st.items()]
            if not self.orphans:
                return items
            early: list[Item] = []
            for i in items:
                if isinstance(i, Put):
                    early.extend(self.orphans.get((i.thread_id, i.ns, i.checkpoint_id), ()))
            return [*early, *items]

    def thread_ids(self) -> list[str]:
        with self.lock:
            return list(self.threads)

    def next_due(self, policy: Policy) -> tuple[float, list[str]]:
        """Seconds until the next thread is due, and the threads due now."""
        now = time.monotonic()
        wait, due = math.inf, []
        with self.lock:
            for thread_id, st in self.threads.items():
                oldest = st.oldest()
                if oldest is None or st.flights:
                    continue
                limit = policy.max_age(ThreadActivity(now - oldest, len(st.pending), st.rate))
                left = oldest + limit - now
                if left <= 0:
                    due.append(thread_id)
                else:
                    wait = min(wait, left)
        return wait, due

    def holds(self, thread_id: str) -> bool:
        """Whether the thread has items queued or being written."""
        with self.lock:
            st = self.threads.get(thread_id)
            return st is not None and bool(st.pending or st.flights)

    def drop(self, thread_id: str) -> bool:
        """Drop a thread's queue (it is being deleted); False while a batch of it is being
        written (then try again after it)."""
        with self.lock:
            st = self.threads.get(thread_id)
            if st is not None and st.flights:
                return False
            self.threads.pop(thread_id, None)
            if not self.threads:
                self._on_empty()
            return True

    def metrics(self) -> Metrics:
        """A snapshot of the counts, with what waits now."""
        with self.lock:
            m = Metrics(**self.counts.__dict__)
            now = time.monotonic()
            oldest = [t.oldest() for t in self.threads.values()]
            times = [o for o in oldest if o is not None]
            m.buffered = sum(len(t.pending) + len(t.inflight) for t in self.threads.values())
            m.buffered_bytes = sum(t.bytes for t in self.threads.values())
            m.oldest_unflushed_age = now - min(times) if times else 0.0
            return m


def _age_due(policy: Policy, st: ThreadQueue, now: float) -> bool:
    oldest = st.oldest()
    if oldest is None:
        return False
    activity = ThreadActivity(now - oldest, len(st.pending), st.rate)
    return now - oldest >= policy.max_age(activity)


def _remember(memo: OrderedDict[Any, Any], key: Any, value: Any, size: int = 8192) -> Any:
    """memo[key] (set to `value` if missing), most recent last, at most `size` keys."""
    if key in memo:
        memo.move_to_end(key)
        return memo[key]
    memo[key] = value
    while len(memo) > size:
        memo.popitem(last=False)
    return value
