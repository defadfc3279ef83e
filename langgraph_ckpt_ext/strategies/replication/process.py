"""Replicas applied in a process of their own: the parent's side.

Applying a write to a replica is Python work (encoding, the driver, an event loop): done in the
graph's process it takes the GIL from the graph. Replicas given as URLs are applied by a child
process instead (`child.py`): the parent sends each write down a pipe (`pipe.py`); the child
reports back what each replica did, which the parent's view of each such replica
(`ProcessReplica`) keeps.

The parent's `linger` is spent here rather than in the child: async writes wait in an outbox
for up to `linger` seconds (or until `BATCH` of them are there) and go down the pipe as one
frame. A frame per write cost the graph's process a pickle, a write to the pipe and a wake-up
of the child each (about a tenth of a bare turn's CPU: 9 writes per turn of the benchmark's
agent); the child applies the frame's writes at once, so the lag stays one `linger`. A quorum
write, and any message that is not a write, goes at once, after what the outbox holds.
"""

from __future__ import annotations

import contextlib
import itertools
import operator
import os
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from ...core.errors import InvalidConfigError, ReplicationError
from ...core.saver import StoreCheckpointer
from ...core.telemetry import Telemetry, replay, telemetry_of
from .failures import RemoteError
from .health import Health
from .pipe import read_frame, send_frame, ship
from .queue import BATCH, Op
from .status import ReplicaStatus

_CHILD = "langgraph_ckpt_ext.strategies.replication"  # its `__main__`: `child.child_main`


class Replicator:
    """The child process and the pipe to it (the parent's side)."""

    def __init__(self, specs: Sequence[tuple[str, str, dict[str, Any]]],
                 on_events: Callable[[list[Any]], None], linger: float = 0.0,
                 telemetry: Telemetry | None = None) -> None:
        import subprocess

        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.process = subprocess.Popen(
            [sys.executable, "-m", _CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            env=env,
        )
        assert self.process.stdin is not None and self.process.stdout is not None
        self._out, self._in = self.process.stdin, self.process.stdout
        # Room for bursts, so that a write seldom waits for the child to read (Linux).
        with contextlib.suppress(OSError, AttributeError):
            import fcntl

            fcntl.fcntl(self._out.fileno(), fcntl.F_SETPIPE_SZ, 1 << 20)
        self._lock = threading.Lock()  # the pipe, and the outbox
        self._on_events = on_events
        self.closed = threading.Event()
        self._linger = linger
        self._outbox: list[Any] = []  # async writes to send within `linger` (under `_lock`)
        self._due = threading.Event()  # the outbox has writes
        self._stopping = False
        # The child records its replicas' operations while ours is on; we trace them.
        self._telemetry = telemetry_of(telemetry)
        self._recording = self._telemetry.on
        self._names = [name for name, _, _ in specs]
        # the child applies what comes at once: the lag is spent here, in the outbox
        send_frame(self._out, ("hello", list(specs),
                               {"linger": 0.0, "telemetry": self._recording}))
        answer = read_frame(self._in)
        if answer[0] != "ready":
            self.process.wait(timeout=10)
            self._out.close()
            self._in.close()
            raise InvalidConfigError(f"the replicas could not be opened: {answer[1]}")
        self._reader = threading.Thread(target=self._read, name="lgckpt-replicator",
                                        daemon=True)
        self._reader.start()
        self._sender: threading.Thread | None = None
        if linger > 0:
            self._sender = threading.Thread(target=self._send_due, name="lgckpt-replicator-send",
                                            daemon=True)
            self._sender.start()

    def send(self, message: Any) -> None:
        """Send `message` now, after the writes the outbox holds."""
        with self._lock:
            self._send_now(message)

    def _send_now(self, message: Any | None) -> None:
        """(under `_lock`) The outbox, then `message`, as one frame."""
        batch, self._outbox = self._outbox, []
        if message is not None:
            batch.append(message)
        if len(batch) == 1:
            send_frame(self._out, batch[0])
        elif batch:
            send_frame(self._out, ("batch", batch))

    def ship(self, op: Op, targets: list[int]) -> None:
        """Send an op to the child's replicas `targets`: an async write within `linger`, a
        quorum write at once. Its arguments are taken now (`pipe.ship`): its values are
        copies already, never changed later (`writes.py`)."""
        message = ("op", op.seq, op.kind, op.threads, ship(op.kind, op.args), targets,
                   op.ack is not None)
        with self._lock:
            if self._telemetry.on is not self._recording:  # set up or shut down since
                self._recording = not self._recording
                self._outbox.append(("telemetry", self._recording))
                self._due.set()
            if op.ack is not None or self._sender is None or len(self._outbox) + 1 >= BATCH:
                self._send_now(message)
                return
            self._outbox.append(message)
            if len(self._outbox) == 1:
                self._due.set()

    def _send_due(self) -> None:
        """The sender thread: the outbox, `linger` seconds after its first write came."""
        while True:
            self._due.wait()
            if self._stopping:
                return
            time.sleep(self._linger)
            with self._lock:
                self._due.clear()
                if self._stopping:
                    return
                try:
                    self._send_now(None)
                except (OSError, ValueError):  # the child is gone: the reader says so
                    return

    def _read(self) -> None:
        try:
            while True:
                msg = read_frame(self._in)
                if msg[0] == "events":  # traced first: spans are in when a flush returns
                    for index, record in msg[2]:
                        replay(self._telemetry, record, {"lgckpt.replica": self._names[index]})
                    self._on_events(msg[1])
                elif msg[0] == "closed":
                    break
        except (EOFError, OSError, ValueError):
            pass
        finally:
            self.closed.set()

    def close(self, timeout: float = 30.0) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.send(("close",))  # after what the outbox holds
        with self._lock:
            self._stopping = True
        self._due.set()
        self.closed.wait(timeout)
        try:
            self.process.wait(timeout=5)
        except Exception:
            self.process.kill()
            self.process.wait()
        for stream in (self._out, self._in):  # the pipes' fds, not left to the collector
            with contextlib.suppress(OSError, ValueError):
                stream.close()


class ProcessReplica(Health):
    """The parent's view of a replica applied in the child: what was sent and not yet
    applied, and the health the child reports. Reads (failover, repair) use a checkpointer of
    its own in this process, opened from the same URL when first needed."""

    thread = None  # no worker thread here: the child's applies it

    def __init__(self, name: str, index: int, url: str, options: dict[str, Any],
                 max_queue: int) -> None:
        super().__init__(name, max_queue)
        self.index, self.url, self.options = index, url, options
        self.replicator: Replicator | None = None  # set once the child is started
        self.pending: OrderedDict[int, Op] = OrderedDict()
        self.acks: dict[int, Op] = {}  # quorum writes this replica has not answered yet
        self.withdrawn: set[int] = set()  # failed quorum writes the child was asked to drop
        self._saver: StoreCheckpointer | None = None

    @property
    def saver(self) -> StoreCheckpointer:
        if self._saver is None:
            from ...connecting import connect

            self._saver = connect(self.url, **self.options)
        return self._saver

    @property
    def local_saver(self) -> StoreCheckpointer | None:
        """This process's saver of the replica, if reads opened one (none is opened for
        this: the replicator process applies with the epoch each op carries)."""
        return self._saver

    @property
    def queue(self) -> OrderedDict[int, Op]:
        return self.pending

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def _send(self, message: Any) -> None:
        assert self.replicator is not None
        self.replicator.send(message)

    def push(self, op: Op, wait: float) -> None:
        with self.cond:
            self._make_room(wait)
            self.pending[op.seq] = op
            if op.ack is not None:
                self.acks[op.seq] = op
            for t in op.threads:
                self.busy[t] += 1

    def _queued(self) -> int:
        return len(self.pending)

    def _overflow(self) -> None:
        self._send(("drop", self.index))
        for op in self.acks.values():
            self._settle(op, ReplicationError(f"replica {self.name}: queue overflowed"))
        self.acks.clear()
        self.withdrawn.clear()
        for op in self.pending.values():
            self._mark(op)
        self.pending.clear()
        self.busy.clear()

    def _settle(self, op: Op, error: BaseException | None) -> None:
        if op.ack is not None:
            op.ack.settle(self.name, error)

    def withdraw(self, op: Op) -> None:
        """A quorum write that failed: the child takes it off its queue unless it is applying
        it (it reports which); applied, its threads are marked for repair."""
        with self.cond:
            self.acks.pop(op.seq, None)
            if op.seq not in self.pending:  # applied already
                self._mark(op)
                return
            self.withdrawn.add(op.seq)
        self._send(("withdraw", self.index, op.seq))

    def drained(self) -> bool:
        return not self.pending

    def event(self, kind: str, *rest: Any) -> None:
        """What the child reports, under `cond` (the caller then wakes its waiters)."""
        if kind == "settled":
            seq, error = rest
            op = self.acks.pop(seq, None)
            if op is not None:
                self._settle(op, None if error is None else RemoteError(error))
        elif kind == "applied":  # every op sent to it up to `seq` is done
            seq, self.applied = rest
            pending = self.pending
            while pending and next(iter(pending)) <= seq:
                _, op = pending.popitem(last=False)
                self._unbusy(op.threads)
                if op.seq in self.withdrawn:  # too late: it holds a write that failed
                    self.withdrawn.discard(op.seq)
                    self._mark(op)
        elif kind == "withdrawn":
            self.withdrawn.discard(rest[0])
            op = self.pending.pop(rest[0], None)
            if op is not None:
                self._unbusy(op.threads)
        elif kind == "refused":  # it refused an op: the op's threads to repair
            self._mark_threads(*rest)
        elif kind == "health":
            if rest[0] and not self.up:  # back after an outage: it may have lost data
                self.repair_all = True
            if rest[2] is not None:
                self.last_error = RemoteError(rest[2])
            self.failures = rest[1]
            self._set_up(rest[0], self.last_error)

    def status(self) -> ReplicaStatus:
        with self.cond:
            first = next(iter(self.pending.values()), None)
            return self._status(len(self.pending), None if first is None else first.at)

    def close(self) -> None:
        if self._saver is not None:
            self._saver.close()


def deliver(replicas: Sequence[Health]) -> Callable[[list[Any]], None]:
    """What the replicator process's replicas did, for its reader thread to hand to their
    views here."""
    by_index = {r.index: r for r in replicas if isinstance(r, ProcessReplica)}

    def on_events(events: list[Any]) -> None:
        # a run of events of one replica (a batch it applied) under one lock, one wake-up
        for index, run in itertools.groupby(events, key=operator.itemgetter(1)):
            r = by_index.get(index)
            if r is not None:
                with r.cond:
                    for kind, _, *rest in run:
                        r.event(kind, *rest)
                    r.cond.notify_all()

    return on_events
