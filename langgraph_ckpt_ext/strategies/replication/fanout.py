"""The replicas as the checkpointer sees them (`Replica`, applied by a thread here, or
`ProcessReplica`, applied by the replicator process), and the order ops are queued for them
in: the primary's."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from typing import Any

from langgraph.checkpoint.base import BaseCheckpointSaver

from ...core.telemetry import Telemetry
from .options import Options, ReplicaSpec
from .process import ProcessReplica, Replicator, deliver
from .queue import Ack, Op
from .status import ReplicaStatus
from .worker import Replica

View = Replica | ProcessReplica


class Fanout:
    """The replicas' views, the replicator process (if a replica was given as a URL), and
    what was written since the last background repair (`track`)."""

    def __init__(self, specs: Sequence[ReplicaSpec], names: Sequence[str], options: Options,
                 track: bool, telemetry: Telemetry | None = None) -> None:
        self.options = options
        self.views: list[View] = []
        urls: list[tuple[str, str, dict[str, Any]]] = []
        for n, r in zip(names, specs, strict=True):
            if isinstance(r, tuple):
                self.views.append(ProcessReplica(n, len(urls), r[0], r[1], options.max_queue))
                urls.append((n, r[0], r[1]))
            else:
                self.views.append(self.replica(n, r))
        self.replicator: Replicator | None = None
        if urls:
            self.replicator = Replicator(urls, deliver(self.views), options.linger, telemetry)
            for v in self.views:
                if isinstance(v, ProcessReplica):
                    v.replicator = self.replicator
        self.lock = threading.Lock()  # the order ops are queued in: the primary's
        self._seq = 0
        # Threads written since the last background repair (None: a write named no thread).
        self._track = track
        self.written: set[str] | None = set()

    def replica(self, name: str, saver: BaseCheckpointSaver[Any]) -> Replica:
        return Replica(name, saver, self.options.max_queue, self.options.linger)

    def enqueue(self, kind: str, args: tuple[Any, ...], threads: tuple[str, ...]) -> Op:
        o = self.options
        ack = Ack(o.quorum, len(self.views)) if o.consistency == "quorum" else None
        op = Op(kind, args, threads, time.monotonic(), ack)
        with self.lock:
            self._seq += 1
            op.seq = self._seq
            if self._track:
                if not threads or kind == "delete_runs":
                    self.written = None
                elif self.written is not None:
                    self.written.update(threads)
            targets = []
            for r in self.views:
                r.push(op, o.max_wait)
                if isinstance(r, ProcessReplica):  # applied in the child
                    targets.append(r.index)
            if self.replicator is not None:
                self.replicator.ship(op, targets)
        return op

    async def queue(self, sync: bool, kind: str, args: tuple[Any, ...],
                    threads: tuple[str, ...]) -> Op:
        """`enqueue`; for an async caller, a full queue waits for room on a thread, not on
        the caller's event loop."""
        if not sync:
            for r in self.views:
                if len(r.queue) >= self.options.max_queue:
                    return await asyncio.to_thread(self.enqueue, kind, args, threads)
        return self.enqueue(kind, args, threads)

    def take_written(self) -> set[str] | None:
        with self.lock:
            written, self.written = self.written, set()
        return written

    def written_again(self, threads: set[str]) -> None:
        """Threads to compare again at the next background repair."""
        with self.lock:
            if self.written is not None:
                self.written |= threads

    def withdraw(self, op: Op) -> None:
        """A quorum write that failed: taken off every replica's queue where it still waits;
        a replica that applied it (or may have) is marked for repair."""
        for r in self.views:
            r.withdraw(op)

    def up(self) -> list[View]:
        return [r for r in self.views if r.up]

    def fenced(self) -> BaseException | None:
        """The `FencedError` a replica refused this node's writes with, if one did."""
        for r in self.views:
            if r.fenced is not None:
                return r.fenced
        return None

    def best(self) -> View | None:
        """The replica that is up, needs no repair, with the shortest queue."""
        up = self.up()
        up.sort(key=lambda r: (r.needs_repair, len(r.queue)))
        return up[0] if up else None

    def status(self) -> list[ReplicaStatus]:
        return [r.status() for r in self.views]

    def flush(self, timeout: float | None) -> bool:
        """Wait until every replica that is up has applied its queue; False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for r in self.views:
            with r.cond:
                while r.up and not r.drained():
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        return False
                    r.cond.wait(0.05 if left is None else min(left, 0.05))
        return True

    def close(self) -> None:
        """Stop the workers once they applied what is queued, end the replicator process and
        close the readers opened here."""
        for r in self.views:
            r.stop()
        for r in self.views:
            if r.thread is not None:
                r.thread.join(timeout=5)
        _finish(self.views, self.replicator)


def wind_down(views: Sequence[View], replicator: Replicator | None) -> None:
    """`close()` of a checkpointer dropped unclosed, without waiting: the workers apply what
    is queued and stop, the replicator process ends (and the readers opened here close), in a
    thread of their own."""
    for r in views:
        r.stop()
    if replicator is not None or any(isinstance(r, ProcessReplica) for r in views):
        threading.Thread(target=_finish, args=(views, replicator),
                         name="lgckpt-replicated-close", daemon=True).start()


def _finish(views: Sequence[View], replicator: Replicator | None) -> None:
    if replicator is not None:
        replicator.close()
    for r in views:
        if isinstance(r, ProcessReplica):  # the reader a URL replica opened here
            r.close()
