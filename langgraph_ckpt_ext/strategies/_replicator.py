"""Replicas applied in a process of their own (`ReplicatedCheckpointer(isolation="process")`).

Applying a write to a replica is Python work (encoding, the driver, an event loop): done in the
graph's process it takes the GIL from the graph. Here the parent only pickles each write once,
when it comes, and sends it down a pipe; a child process (`python -m
langgraph_ckpt_ext.strategies._replicator`, so none of the user's modules are imported again)
opens the replicas from their URLs and applies the writes with the same per-replica workers as
in-process replication, reporting back what each replica did.

A put carries only the channels it writes. Its values were copied when the call came (see
`ReplicatedCheckpointer._frozen`); no list is sent as a tail of an earlier one, since what a
replica stores is decided from the values, never from which objects they are.

The pipe carries pickles between a parent and the child it started: nothing else writes to it.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import struct
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import IO, Any

from langgraph.checkpoint.base import get_serializable_checkpoint_metadata

from .replicated import RemoteError, _describe, _Health

_HEADER = struct.Struct("!I")
_OUTBOX_EVERY = 0.002  # the child sends what its replicas did at most this often


def send_frame(stream: IO[bytes], message: Any) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def read_frame(stream: IO[bytes]) -> Any:
    head = stream.read(_HEADER.size)
    if len(head) < _HEADER.size:
        raise EOFError
    (size,) = _HEADER.unpack(head)
    data = stream.read(size)
    if len(data) < size:
        raise EOFError
    return pickle.loads(data)


def _plain_config(config: Any) -> dict[str, Any]:
    """The ids a store reads from a config (a run's config also holds callbacks and the like,
    which neither pickle nor matter here)."""
    conf = config["configurable"]
    keep = {k: conf[k] for k in ("thread_id", "checkpoint_ns", "checkpoint_id") if k in conf}
    return {"configurable": keep}


def ship(kind: str, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """An op's arguments for the pipe. A put: its metadata as the store would make it from the
    run's config, and only the channels it writes."""
    if kind == "writes":
        return (_plain_config(args[0]), *args[1:])
    if kind != "put":
        return args
    config, checkpoint, metadata, new_versions = args
    values = checkpoint["channel_values"]
    sent = {ch: values[ch] for ch in new_versions if ch in values}
    metadata = get_serializable_checkpoint_metadata(config, metadata)
    return (_plain_config(config), {**checkpoint, "channel_values": sent}, metadata, new_versions)


# -- the child ---------------------------------------------------------------------------------


class _Deferred:
    """A replica that could not be reached when the child started: every call tries to open
    it first (the worker marks it down meanwhile and probes it until it answers)."""

    def __init__(self, url: str, options: dict[str, Any]) -> None:
        self.url, self.options = url, options
        self.saver: Any = None

    def _open(self) -> Any:
        if self.saver is None:
            from ..connect import connect

            self.saver = connect(self.url, **self.options)
        return self.saver

    def put_batch(self, ops: Any) -> None:  # asked for (`hasattr`) before any call is made
        self._open().put_batch(ops)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(type(self._open()), name)  # a method: opened (or failing) at the call
        return lambda *a, **kw: attr(self._open(), *a, **kw)


class _Outbox:
    """What the child's replicas did, sent to the parent in batches."""

    def __init__(self, stream: IO[bytes]) -> None:
        self.stream = stream
        self.items: list[Any] = []
        self.lock = threading.Lock()
        self.wake = threading.Event()

    def put(self, item: Any) -> None:
        with self.lock:
            self.items.append(item)
        self.wake.set()

    def run(self) -> None:
        while True:
            self.wake.wait()
            time.sleep(_OUTBOX_EVERY)  # let a few more come
            self.wake.clear()
            self.flush()

    def flush(self) -> None:
        with self.lock:
            items, self.items = self.items, []
            if items:
                send_frame(self.stream, ("events", items))


def child_main() -> None:  # pragma: no cover - runs in the child; covered by its tests
    from ..connect import connect
    from .replicated import _Op, _Replica

    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing but frames on the pipe
    outbox = _Outbox(stdout)

    class Owner:
        max_queue = 1 << 62  # the parent bounds each queue
        linger = 0.0

    class ChildReplica(_Replica):
        index = 0

        def _settle(self, entry: Any, error: BaseException | None) -> None:
            if entry.op.quorum and not entry.acked:  # only a quorum write waits on it
                entry.acked = True
                outbox.put(("settled", self.index, entry.op.seq,
                            None if error is None else _describe(error)))

        def _pop(self, entry: Any) -> None:
            if self.queue and self.queue[0] is entry:
                super()._pop(entry)
                outbox.put(("applied", self.index, entry.op.seq))

        def _mark(self, op: Any) -> None:
            super()._mark(op)
            outbox.put(("refused", self.index, op.seq))

    try:
        hello = read_frame(stdin)
        specs: Sequence[tuple[str, str, dict[str, Any]]] = hello[1]
        Owner.linger = float(hello[2].get("linger", 0.0))
        replicas = []
        owner = Owner()  # held here: a replica holds its owner weakly
        for i, (name, url, options) in enumerate(specs):
            try:
                saver: Any = connect(url, **options)
            except (ConnectionError, OSError):  # down at start: opened once it answers
                saver = _Deferred(url, options)
            r = ChildReplica(name, saver, owner)  # type: ignore[arg-type]
            r.index = i
            replicas.append(r)
    except BaseException as exc:
        send_frame(stdout, ("fatal", _describe(exc)))
        return
    send_frame(stdout, ("ready",))
    threading.Thread(target=outbox.run, daemon=True).start()

    def watch() -> None:  # tell the parent when a replica goes down or comes back
        seen: dict[int, tuple[bool, int]] = {}
        while True:
            time.sleep(0.05)
            for r in replicas:
                with r.cond:
                    state = (r.up, r.failures)
                    err = r.last_error
                if seen.get(r.index) != state:
                    seen[r.index] = state
                    outbox.put(("health", r.index, state[0], state[1],
                                None if err is None else _describe(err)))

    threading.Thread(target=watch, daemon=True).start()
    try:
        while True:
            msg = read_frame(stdin)
            if msg[0] == "op":
                _, seq, kind, threads, args, targets, quorum = msg
                op = _Op(kind, args, threads, time.monotonic(), seq=seq)
                op.quorum = quorum  # type: ignore[attr-defined]
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
            elif msg[0] == "close":
                break
    except EOFError:  # the parent is gone: apply what came, then stop
        pass
    for r in replicas:
        r.stop()
    for r in replicas:
        if r.thread is not None:
            r.thread.join()
    outbox.flush()
    send_frame(stdout, ("closed",))


# -- the parent's end ----------------------------------------------------------------------------


class Replicator:
    """The child process and the pipe to it (the parent's side)."""

    def __init__(self, specs: Sequence[tuple[str, str, dict[str, Any]]],
                 on_events: Callable[[list[Any]], None], linger: float = 0.0) -> None:
        import subprocess

        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "langgraph_ckpt_ext.strategies._replicator"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
        )
        assert self.process.stdin is not None and self.process.stdout is not None
        self._out, self._in = self.process.stdin, self.process.stdout
        # Room for bursts, so that a write seldom waits for the child to read (Linux).
        with contextlib.suppress(OSError, AttributeError):
            import fcntl

            fcntl.fcntl(self._out.fileno(), fcntl.F_SETPIPE_SZ, 1 << 20)
        self._lock = threading.Lock()
        self._on_events = on_events
        self.closed = threading.Event()
        send_frame(self._out, ("hello", list(specs), {"linger": linger}))
        answer = read_frame(self._in)
        if answer[0] != "ready":
            self.process.wait(timeout=10)
            self._out.close()
            self._in.close()
            from ..core.errors import InvalidConfigError

            raise InvalidConfigError(f"the replicas could not be opened: {answer[1]}")
        self._reader = threading.Thread(target=self._read, name="lgckpt-replicator",
                                        daemon=True)
        self._reader.start()

    def send(self, message: Any) -> None:
        with self._lock:
            send_frame(self._out, message)

    def ship(self, op: Any, targets: list[int]) -> None:
        """Send an op to the child's replicas `targets`."""
        with self._lock:
            args = ship(op.kind, op.args)
            send_frame(self._out, ("op", op.seq, op.kind, op.threads, args, targets,
                                   op.ack is not None))

    def _read(self) -> None:
        try:
            while True:
                msg = read_frame(self._in)
                if msg[0] == "events":
                    self._on_events(msg[1])
                elif msg[0] == "closed":
                    break
        except (EOFError, OSError, ValueError):
            pass
        finally:
            self.closed.set()

    def close(self, timeout: float = 30.0) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.send(("close",))
        self.closed.wait(timeout)
        try:
            self.process.wait(timeout=5)
        except Exception:
            self.process.kill()
            self.process.wait()
        for stream in (self._out, self._in):  # the pipes' fds, not left to the collector
            with contextlib.suppress(OSError, ValueError):
                stream.close()


class ProcessReplica(_Health):
    """The parent's view of a replica applied in the child: what was sent and not yet
    applied, and the health the child reports. Reads (failover, repair) use a checkpointer of
    its own in this process, opened from the same URL when first needed."""

    def __init__(self, name: str, index: int, url: str, options: dict[str, Any],
                 owner: Any) -> None:
        super().__init__(name, owner)
        self.index, self.url, self.options = index, url, options
        self.pending: OrderedDict[int, Any] = OrderedDict()
        self.acks: dict[int, Any] = {}  # quorum writes this replica has not answered yet
        self.withdrawn: set[int] = set()  # failed quorum writes the child was asked to drop
        self.thread = None
        self._saver: Any = None

    @property
    def saver(self) -> Any:
        if self._saver is None:
            from ..connect import connect

            self._saver = connect(self.url, **self.options)
        return self._saver

    @property
    def queue(self) -> OrderedDict[int, Any]:
        return self.pending

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def push(self, op: Any, wait: float) -> None:
        deadline = time.monotonic() + wait
        with self.cond:
            while len(self.pending) >= self.owner.max_queue:
                left = deadline - time.monotonic()
                if not self.up or left <= 0:
                    self._overflow()
                    break
                self.cond.wait(left)
            self.pending[op.seq] = op
            if op.ack is not None:
                self.acks[op.seq] = op
            self.busy.update(op.threads)

    def _overflow(self) -> None:
        from ..core.errors import ReplicationError

        self.owner._replicator.send(("drop", self.index))
        for op in self.acks.values():
            op.ack.settle(self.name, ReplicationError(f"replica {self.name}: queue overflowed"))
        self.acks.clear()
        self.withdrawn.clear()
        for op in self.pending.values():
            self._mark(op)
        self.pending.clear()
        self.busy.clear()

    def withdraw(self, op: Any) -> None:
        """A quorum write that failed: the child takes it off its queue unless it is applying
        it (it reports which); applied, its threads are marked for repair."""
        with self.cond:
            self.acks.pop(op.seq, None)
            if op.seq not in self.pending:  # applied already
                self._mark(op)
                return
            self.withdrawn.add(op.seq)
        self.owner._replicator.send(("withdraw", self.index, op.seq))

    def drained(self) -> bool:
        return not self.pending

    def event(self, kind: str, *rest: Any) -> None:
        """What the child reports, under `cond`."""
        if kind == "settled":
            seq, error = rest
            op = self.acks.pop(seq, None)
            if op is not None:
                op.ack.settle(self.name, None if error is None else RemoteError(error))
        elif kind == "applied":
            op = self.pending.pop(rest[0], None)
            if op is not None:
                self.applied += 1
                self._unbusy(op.threads)
                if op.seq in self.withdrawn:  # too late: it holds a write that failed
                    self.withdrawn.discard(op.seq)
                    self._mark(op)
        elif kind == "withdrawn":
            self.withdrawn.discard(rest[0])
            op = self.pending.pop(rest[0], None)
            if op is not None:
                self._unbusy(op.threads)
        elif kind == "refused":
            op = self.pending.get(rest[0])
            if op is not None:
                self._mark(op)
        elif kind == "health":
            if rest[0] and not self.up:  # back after an outage: it may have lost data
                self.repair_all = True
            self.up, self.failures = rest[0], rest[1]
            if rest[2] is not None:
                self.last_error = RemoteError(rest[2])
        self.cond.notify_all()

    def status(self) -> Any:
        with self.cond:
            first = next(iter(self.pending.values()), None)
            return self._status(len(self.pending), None if first is None else first.at)

    def close(self) -> None:
        if self._saver is not None:
            self._saver.close()


if __name__ == "__main__":  # pragma: no cover
    # Through the package's module, not this `__main__` copy: one set of classes.
    from langgraph_ckpt_ext.strategies._replicator import child_main as _main

    _main()
