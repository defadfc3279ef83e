"""A replica applied by a thread of this process: its queue, and the worker thread that
applies it in the primary's order, a run of one thread's checkpoints and writes as one batch
where the replica takes batches (`BatchSaver`, or rows with `RowSaver`)."""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver

from ...core.errors import FencedError, ReplicationError
from ...core.inner import BatchSaver, RowSaver
from .epochs import as_replica, fence_store
from .failures import classifier
from .health import Health
from .lifecycle import apply_lifecycle
from .queue import BATCH, BATCHED, Entry, Op
from .status import ReplicaStatus

_PROBE: RunnableConfig = {"configurable": {"thread_id": "__lgckpt_probe__", "checkpoint_ns": ""}}


class Replica(Health):
    """A replica, its queue and the worker thread that applies it."""

    def __init__(self, name: str, saver: BaseCheckpointSaver[Any], max_queue: int,
                 linger: float) -> None:
        super().__init__(name, max_queue)
        self.saver, self.linger = saver, linger
        as_replica(saver, True)  # it writes what the primary decided: the epoch alone checked
        # What the replica can take besides op by op (asked once, here).
        self._batches = saver if isinstance(saver, BatchSaver) else None
        self._rows = saver if isinstance(saver, RowSaver) else None
        self.queue: deque[Entry] = deque()
        self.inflight: list[Entry] = []  # the batch being applied (while `applying`)
        self.stopping = False
        self.thread: threading.Thread | None = None
        self.fence: int | None = None
        """An epoch to raise the replica's store to once it answers, before it applies
        anything (a primary demoted by this node's promotion: its other writers are fenced
        off)."""

    # The queue is only touched under `cond`.

    def start(self) -> None:
        if self.thread is None:
            self.thread = threading.Thread(
                target=self._run, name=f"lgckpt-replica-{self.name}", daemon=True)
            self.thread.start()

    def push(self, op: Op, wait: float) -> None:
        """Queue an op; while the queue is full, wait up to `wait` s for room (backpressure) if
        the replica is up, else drop the queue and mark the replica for repair."""
        with self.cond:
            self._make_room(wait)
            self.queue.append(Entry(op))
            for t in op.threads:
                self.busy[t] += 1
            if self._wakes():
                self.cond.notify_all()
        self.start()

    def _wakes(self) -> bool:
        """Whether an op just queued must wake the worker (under `cond`): a first op (it
        waits for one), or a full batch (it lingers on the head until one). Any other wake
        would only cost the writer's thread a switch; and a replica that is down waits out
        its back-off, not retried at every write."""
        return self.up and (len(self.queue) == 1 or len(self.queue) >= BATCH)

    def _queued(self) -> int:
        return len(self.queue)

    def _overflow(self) -> None:
        for entry in self.queue:
            self._settle(entry, ReplicationError(f"replica {self.name}: queue overflowed"))
            self._mark(entry.op)
        self.queue.clear()
        self.busy.clear()

    def _settle(self, entry: Entry, error: BaseException | None) -> None:
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
                if self.fence is not None:  # a demoted primary: fenced before anything
                    fence_store(self.saver, self.fence)
                    self.fence = None
                if batch:
                    self._apply(batch)
                else:  # down with nothing queued: probe until it answers
                    self.saver.get_tuple(_PROBE)
            except BaseException as exc:
                with self.cond:
                    self.applying = False
                    self.failures += 1
                    self.last_error = exc
                    if isinstance(exc, FencedError):
                        self.fenced = exc
                    if batch and not classifier(self.saver)(exc):
                        self._refused(batch, exc)
                        continue
                    self._set_up(False, exc)
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
                self._set_up(True, None)
                for entry in batch:
                    self._pop(entry)
                    self._settle(entry, None)
                self.applied += len(batch)
                self.cond.notify_all()

    def _pop(self, entry: Entry) -> None:
        """Take an applied entry off the head (unless an overflow dropped it meanwhile)."""
        if self.queue and self.queue[0] is entry:
            self.queue.popleft()
            self._unbusy(entry.op.threads)

    def _linger(self) -> None:
        """Let a run of one thread's writes gather (a turn's checkpoints and writes come a few
        ms apart) so that it goes as one batch: fewer round trips and less Python per write.
        Not for a quorum write (someone waits on it) nor when stopping (under `cond`)."""
        if not self.linger or not self.up:
            return
        while self.queue and not self.stopping and len(self.queue) < BATCH:
            first = self.queue[0].op
            if first.ack is not None or first.quorum or first.kind not in BATCHED:
                return
            left = first.at + self.linger - time.monotonic()
            if left <= 0:
                return
            self.cond.wait(left)

    def _head(self) -> list[Entry]:
        """The ops to apply next: a run of checkpoints and writes (one batch), or one other."""
        if not self.queue:
            return []
        first = self.queue[0]
        rows = first.op.kind == "rows"
        if first.op.kind not in BATCHED or not (rows or self._batches is not None):
            return [first]
        out: list[Entry] = []
        for entry in self.queue:  # one thread's: a batch is one thread's on some backends
            if ((entry.op.kind == "rows") != rows or entry.op.kind not in BATCHED
                    or entry.op.threads != first.op.threads or len(out) >= BATCH
                    or _epoch(entry.op) != _epoch(first.op)):
                break
            out.append(entry)
        return out

    def _apply(self, batch: list[Entry]) -> None:
        if len(batch) == 1:
            self.apply(batch[0].op)
        elif batch[0].op.kind == "rows":
            self._rowsaver().write_rows([item for e in batch for item in e.op.args[0]],
                                        epoch=_epoch(batch[0].op))
        else:
            assert self._batches is not None  # `_head` makes a batch of puts only then
            self._batches.put_batch([(e.op.kind, *e.op.args) for e in batch])

    @property
    def local_saver(self) -> BaseCheckpointSaver[Any] | None:
        """The replica's saver in this process (whose writes carry the epoch)."""
        return self.saver

    def _rowsaver(self) -> RowSaver:
        if self._rows is None:  # rows are sent only to savers of ours (`rows_compatible`)
            raise TypeError(f"replica {self.name} cannot store rows")
        return self._rows

    def apply(self, op: Op) -> None:
        """An op on the replica, through its sync methods (the worker thread's)."""
        a, saver = op.args, self.saver
        if op.kind == "rows":
            self._rowsaver().write_rows(a[0], epoch=_epoch(op))
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
        elif op.kind == "lifecycle":
            apply_lifecycle(saver, a)
        else:
            saver.prune(a[0], strategy=a[1])

    def _refused(self, batch: list[Entry], exc: BaseException) -> None:
        """The replica answered but refused an op (its data differs from the primary's): apply
        the batch one by one, dropping each refused op and marking its threads for repair."""
        unavailable = classifier(self.saver)
        self.cond.release()
        try:
            outcomes: list[BaseException | None] = []
            for entry in batch:
                try:
                    self.apply(entry.op)
                    outcomes.append(None)
                except BaseException as one:
                    outcomes.append(one)
                    if unavailable(one):
                        break
        finally:
            self.cond.acquire()
        for entry, outcome in zip(batch, outcomes, strict=False):
            if outcome is not None and unavailable(outcome):
                break  # retried with the rest of the queue
            self._pop(entry)
            if outcome is None:
                self.applied += 1
            else:
                self._mark(entry.op)
            self._settle(entry, outcome)
        if not self.up and not any(o is not None and unavailable(o) for o in outcomes):
            # It answered every op: reachable again, though it may have lost data (a restart).
            self.up, self.repair_all = True, True
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

    def withdraw(self, op: Op) -> None:
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


def _epoch(op: Op) -> int | None:
    """The epoch of the primary that took a rows op (None: unknown, not checked)."""
    return op.args[1] if op.kind == "rows" and len(op.args) > 1 else None
