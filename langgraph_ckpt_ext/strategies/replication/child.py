"""The replicator process (`python -m langgraph_ckpt_ext.strategies.replication`, see
`__main__.py`, so none of the user's modules are imported again): opens the replicas from
their URLs and applies the ops the parent sends with the same per-replica workers as
in-process replication (`worker.Replica`), reporting back what each replica did."""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Sequence
from typing import IO, Any

from langgraph.checkpoint.base import BaseCheckpointSaver

from ...core.saver import StoreCheckpointer
from ...core.telemetry import Record, Recording
from .epochs import as_replica
from .failures import classifier, describe, foreign_unavailable
from .pipe import read_frame, send_frame
from .queue import Entry, Op
from .worker import Replica

_OUTBOX_EVERY = 0.002  # the child tells what its replicas did at most this often
_APPLIED_EVERY = 0.02  # ... and that they applied ops (all the parent's flush waits for)
_UNBOUNDED = 1 << 62  # the parent bounds each queue


class _Deferred(BaseCheckpointSaver[Any]):
    """A replica that could not be reached when the child started: every call opens it first
    (the worker marks it down meanwhile and probes it until it answers). It takes batches and
    rows as every replica given as a URL does (one of ours)."""

    def __init__(self, url: str, options: dict[str, Any]) -> None:
        super().__init__()
        self.url, self.options = url, options
        self.saver: StoreCheckpointer | None = None

    def _open(self) -> StoreCheckpointer:
        if self.saver is None:
            from ...connecting import connect

            self.saver = connect(self.url, **self.options)
            as_replica(self.saver, True)
        return self.saver

    def is_unavailable(self, exc: BaseException) -> bool:
        return foreign_unavailable(exc) if self.saver is None else classifier(self.saver)(exc)

    # What the worker calls (`Replica.apply`, its probe), and the batch abilities it asks for.

    def get_tuple(self, *a: Any, **kw: Any) -> Any:
        return self._open().get_tuple(*a, **kw)

    def put(self, *a: Any, **kw: Any) -> Any:
        return self._open().put(*a, **kw)

    def put_writes(self, *a: Any, **kw: Any) -> None:
        self._open().put_writes(*a, **kw)

    def delete_thread(self, *a: Any, **kw: Any) -> None:
        self._open().delete_thread(*a, **kw)

    def delete_for_runs(self, *a: Any, **kw: Any) -> None:
        self._open().delete_for_runs(*a, **kw)

    def copy_thread(self, *a: Any, **kw: Any) -> None:
        self._open().copy_thread(*a, **kw)

    def prune(self, *a: Any, **kw: Any) -> None:
        self._open().prune(*a, **kw)

    def put_batch(self, ops: Any) -> None:
        self._open().put_batch(ops)

    async def aput_batch(self, ops: Any) -> None:
        await self._open().aput_batch(ops)

    def prepare_batch(self, ops: Any, *, portable: bool = False) -> Any:
        return self._open().prepare_batch(ops, portable=portable)

    async def aprepare_batch(self, ops: Any, *, portable: bool = False) -> Any:
        return await self._open().aprepare_batch(ops, portable=portable)

    def write_prepared(self, batches: Any) -> None:
        self._open().write_prepared(batches)

    async def awrite_prepared(self, batches: Any) -> None:
        await self._open().awrite_prepared(batches)

    def write_op(self, op: Any) -> Any:
        return self._open().write_op(op)

    async def awrite_op(self, op: Any) -> Any:
        return await self._open().awrite_op(op)

    def write_rows(self, items: Any, *, epoch: int | None = None) -> None:
        self._open().write_rows(items, epoch=epoch)

    async def awrite_rows(self, items: Any, *, epoch: int | None = None) -> None:
        await self._open().awrite_rows(items, epoch=epoch)

    def rows_compatible(self, other: BaseCheckpointSaver[Any]) -> bool:
        return self._open().rows_compatible(other)

    def lifecycle_target(self) -> StoreCheckpointer:
        """Where a lifecycle op applies (`lifecycle.apply_lifecycle`)."""
        return self._open()


class _Outbox:
    """What the child's replicas did, sent to the parent in frames.

    An event the parent acts on (a quorum write settled, one taken back, one refused, a
    replica's health) goes within `_OUTBOX_EVERY`; that ops were applied goes as one mark per
    replica (`("applied", index, seq, count)`: every op it was sent up to `seq` is done, and
    its count of applied ops), within `_APPLIED_EVERY`, so a run of turns costs the parent a
    few small frames rather than an event per op and replica. A frame holds the events in
    order, then the health of each replica that changed, then the marks: the parent never sees
    a replica's queue empty before it learned what that replica refused or how it fared."""

    def __init__(self, stream: IO[bytes]) -> None:
        self.stream = stream
        self.replicas: list[ChildReplica] = []
        self.items: list[Any] = []
        self.marks: dict[int, int] = {}  # replica index -> the last op seq it is done with
        self.lock = threading.Lock()  # taken after a replica's `cond`, never before
        self.wake = threading.Event()  # something to send
        self.urgent = threading.Event()  # something to send soon
        self._send_lock = threading.Lock()  # one frame at a time, in order
        self._health: dict[int, tuple[bool, int, str | None]] = {}  # as last sent
        # The replicas' operations, for the parent to trace while its telemetry is on.
        self.recordings: list[Recording] = []
        self.records: list[tuple[int, Record]] = []

    def recording(self, index: int) -> Recording:
        """The telemetry of replica `index`'s saver: its operations go to the parent."""
        def sink(record: Record) -> None:
            with self.lock:
                self.records.append((index, record))
            self.wake.set()

        made = Recording(sink)
        self.recordings.append(made)
        return made

    def record(self, on: bool) -> None:
        """The parent's telemetry turned on or off."""
        for r in self.recordings:
            r.recording = on

    def put(self, item: Any) -> None:
        with self.lock:
            self.items.append(item)
        self.urgent.set()
        self.wake.set()

    def done(self, index: int, seq: int) -> None:
        """Replica `index` is done with op `seq` and every op before it (under its `cond`)."""
        with self.lock:
            self.marks[index] = seq
        self.wake.set()

    def run(self) -> None:
        while True:
            self.wake.wait()
            time.sleep(_OUTBOX_EVERY)  # let a few more come
            if not self.urgent.is_set():
                self.urgent.wait(_APPLIED_EVERY - _OUTBOX_EVERY)
            self.wake.clear()
            self.urgent.clear()
            self.flush()

    def health_changed(self) -> bool:
        """Whether a replica's health differs from what the parent was last told."""
        return any(self._health.get(r.index) != _health(r) for r in self.replicas)

    def flush(self) -> None:
        with self._send_lock:
            with self.lock:
                items, self.items = self.items, []
                marks, self.marks = self.marks, {}
                records, self.records = self.records, []
            # read after the events and marks were taken: at least as new as they are
            states = [(r, _health(r), _applied(r)) for r in self.replicas]
            for r, state, _ in states:
                if self._health.get(r.index) != state:
                    self._health[r.index] = state
                    items.append(("health", r.index, *state))
            items += [("applied", i, seq, applied) for r, _, applied in states
                      if (seq := marks.get(i := r.index)) is not None]
            if items or records:
                send_frame(self.stream, ("events", items, records))


def _health(r: ChildReplica) -> tuple[bool, int, str | None]:
    with r.cond:
        err = r.last_error
        return r.up, r.failures, None if err is None else describe(err)


def _applied(r: ChildReplica) -> int:
    with r.cond:
        return r.applied


class ChildReplica(Replica):
    """A replica in the child: what it does is also told to the parent (`ProcessReplica`)."""

    def __init__(self, index: int, name: str, saver: BaseCheckpointSaver[Any], linger: float,
                 outbox: _Outbox) -> None:
        super().__init__(name, saver, _UNBOUNDED, linger)
        self.index, self.outbox = index, outbox

    def _settle(self, entry: Entry, error: BaseException | None) -> None:
        if entry.op.quorum and not entry.acked:  # only a quorum write waits on it
            entry.acked = True
            self.outbox.put(("settled", self.index, entry.op.seq,
                             None if error is None else describe(error)))

    def _pop(self, entry: Entry) -> None:
        if self.queue and self.queue[0] is entry:
            super()._pop(entry)
            self.outbox.done(self.index, entry.op.seq)

    def _mark(self, op: Op) -> None:
        super()._mark(op)
        self.outbox.put(("refused", self.index, op.kind, op.threads))


def _open(specs: Sequence[tuple[str, str, dict[str, Any]]], linger: float, outbox: _Outbox
          ) -> list[ChildReplica]:
    from ...connecting import connect

    replicas = []
    for i, (name, url, options) in enumerate(specs):
        if options.get("telemetry") is not False:  # traced by the parent, unless refused
            options = {**options, "telemetry": outbox.recording(i)}
        try:
            saver: BaseCheckpointSaver[Any] = connect(url, **options)
            as_replica(saver, True)
        except (ConnectionError, OSError):  # down at start: opened once it answers
            saver = _Deferred(url, options)
        replicas.append(ChildReplica(i, name, saver, linger, outbox))
    return replicas


def _watch(outbox: _Outbox) -> None:
    """Tell the parent when a replica goes down or comes back, or fails again, while it
    applies nothing (its frames tell it otherwise)."""
    while True:
        time.sleep(0.05)
        if outbox.health_changed():
            outbox.urgent.set()
            outbox.wake.set()


def _serve(stdin: IO[bytes], replicas: list[ChildReplica], outbox: _Outbox) -> None:
    """Apply what the parent sends until it says close (or is gone)."""
    try:
        while True:
            msg = read_frame(stdin)
            for m in msg[1] if msg[0] == "batch" else (msg,):
                if not _handle(m, replicas, outbox):
                    return
    except EOFError:  # the parent is gone: apply what came, then stop
        pass


def _handle(msg: Any, replicas: list[ChildReplica], outbox: _Outbox) -> bool:
    """One message of the parent's; False once it says close."""
    if msg[0] == "op":
        _, seq, kind, threads, args, targets, quorum = msg
        op = Op(kind, args, threads, time.monotonic(), seq=seq, quorum=quorum)
        for i in targets:
            replicas[i].push(op, 0.0)
    elif msg[0] == "withdraw":  # a quorum write that failed, if not yet applied
        if replicas[msg[1]].take_back(msg[2]):
            outbox.put(("withdrawn", msg[1], msg[2]))
    elif msg[0] == "drop":
        r = replicas[msg[1]]
        with r.cond:
            r.queue.clear()
            r.busy.clear()
    elif msg[0] == "telemetry":
        outbox.record(msg[1])
    elif msg[0] == "close":
        return False
    return True


def child_main() -> None:  # pragma: no cover - runs in the child; covered by its tests
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing but frames on the pipe
    # what the replicas do is logged by the parent, from the health this process reports
    logging.getLogger("langgraph_ckpt_ext").addHandler(logging.NullHandler())
    outbox = _Outbox(stdout)
    try:
        hello = read_frame(stdin)
        replicas = outbox.replicas = _open(hello[1], float(hello[2].get("linger", 0.0)),
                                           outbox)
        outbox.record(bool(hello[2].get("telemetry")))
    except BaseException as exc:
        send_frame(stdout, ("fatal", describe(exc)))
        return
    send_frame(stdout, ("ready",))
    threading.Thread(target=outbox.run, daemon=True).start()
    threading.Thread(target=_watch, args=(outbox,), daemon=True).start()
    _serve(stdin, replicas, outbox)
    for r in replicas:
        r.stop()
    for r in replicas:
        if r.thread is not None:
            r.thread.join()
    outbox.flush()
    send_frame(stdout, ("closed",))

