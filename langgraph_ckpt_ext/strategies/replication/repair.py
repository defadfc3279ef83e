"""`repair()`: every replica that is up made equal to the primary, thread by thread (compared
and written by `transfer`, the same code as `lgckpt copy`), and the background repair of
`consistency="anti_entropy"`."""

from __future__ import annotations

import contextlib
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from langgraph.checkpoint.base import BaseCheckpointSaver

from ...core.saver import StoreCheckpointer
from ...core.telemetry import Telemetry, count
from .failover import Failover
from .failures import describe, unavailable_at
from .fanout import Fanout, View
from .gate import Gate
from .status import RepairReport, ReplicaRepair

Progress = Callable[[str, int, int], None]


class Repairs:
    def __init__(self, failover: Failover, fanout: Fanout, gate: Gate,
                 closed: threading.Event, telemetry: Telemetry) -> None:
        self.failover, self.fanout, self.gate, self.closed = failover, fanout, gate, closed
        self.telemetry = telemetry  # a repair is a `repair` span, with what it did
        self.thread: threading.Thread | None = None  # the background repair's
        self._running = threading.Lock()

    def run(self, thread_ids: Sequence[str] | None, progress: Progress | None = None,
            quick: bool = False) -> RepairReport:
        """`repair()`. `quick` (anti-entropy's passes between full ones): a thread not marked
        for repair that has as many stored rows, per kind and channel, on both stores
        (`sizes`, one query each) counts as equal without reading its values: lost rows are
        found at once, changed values at the next full pass."""
        started = time.monotonic()
        telemetry = self.telemetry
        with self._running, contextlib.ExitStack() as stack:
            traced = telemetry.on
            if traced:
                stack.enter_context(telemetry.operation(
                    getattr(self.failover.primary, "db_system", None), "repair", None,
                    {"lgckpt.quick": quick, "lgckpt.replicas": len(self.fanout.views)}))
            reports = [self._one(r, thread_ids, progress, quick) for r in self.fanout.views]
            if traced:
                count(threads_checked=sum(r.threads_checked for r in reports),
                      checkpoints_copied=sum(r.checkpoints_copied for r in reports),
                      writes_copied=sum(r.writes_copied for r in reports),
                      threads_rebuilt=sum(len(r.threads_rebuilt) for r in reports),
                      threads_deleted=sum(len(r.threads_deleted) for r in reports),
                      threads_failed=sum(len(r.threads_failed) for r in reports))
        return RepairReport(reports, time.monotonic() - started)

    def _one(self, replica: View, only: Sequence[str] | None, progress: Progress | None,
             quick: bool) -> ReplicaRepair:
        report = ReplicaRepair(replica.name)
        if not replica.up:
            report.error = f"down: {describe(replica.last_error) if replica.last_error else ''}"
            return report
        with replica.cond:
            marked, full = set(replica.to_repair), replica.repair_all
        try:
            primary = self.failover.primary
            if only is not None:
                threads = sorted(set(map(str, only)))
            else:
                from ...transfer import thread_ids

                threads = sorted(set(thread_ids(primary)) | set(thread_ids(replica.saver)))
            for n, thread_id in enumerate(threads, 1):
                if self.closed.is_set() and threading.current_thread() is self.thread:
                    report.error = "closed"  # the background repair stops with close()
                    return report
                self._thread(replica, thread_id, report, quick and thread_id not in marked)
                if progress is not None:
                    progress(replica.name, n, len(threads))
        except BaseException as exc:
            report.error = describe(exc)
            return report
        with replica.cond:
            if only is None and full and not report.threads_skipped and not (
                    report.threads_failed):
                replica.repair_all = False
            if only is None:  # marked threads neither store holds any more
                replica.to_repair -= marked - set(report.threads_skipped)
        return report

    def _thread(self, replica: View, thread_id: str, report: ReplicaRepair,
                quick: bool) -> None:
        """One thread, unless a write to it is in flight or queued (skipped: busy)."""
        if not self.gate.hold(thread_id):
            report.threads_skipped.append(thread_id)
            return
        try:
            with replica.cond:
                busy = replica.busy.get(thread_id, 0) > 0
            if busy:
                report.threads_skipped.append(thread_id)
                return
            primary = self.failover.primary
            try:
                repair_thread(primary, replica.saver, thread_id, report, quick)
            except Exception as exc:
                if unavailable_at(exc, primary, replica.saver):
                    raise  # a store is down: stop; the next run resumes
                # this thread only (e.g. a value the replica refuses)
                report.threads_failed[thread_id] = describe(exc)
            else:
                with replica.cond:
                    replica.to_repair.discard(thread_id)
        finally:
            self.gate.unhold(thread_id)

    def anti_entropy_pass(self, passes: int, repair: Callable[..., RepairReport]) -> None:
        """Repair the threads written since the last pass and those marked for repair; every
        `full_repair_every` passes (and when a write named no thread), every thread (a replica
        may also lose data no write of ours tells of: a restart). `repair`: the
        checkpointer's `_repair`."""
        views = self.fanout.views
        written = self.fanout.take_written()
        full = written is None or passes % self.fanout.options.full_repair_every == 0
        marked = set().union(*(r.to_repair for r in views))
        if not full and not written and not marked and not any(r.repair_all for r in views):
            return
        if any(r.repair_all for r in views):
            full = True
        try:
            report = repair(None if full else sorted((written or set()) | marked),
                            quick=not full)
        except Exception:  # reported in each replica's status; tried again next pass
            return
        self.fanout.written_again({t for r in report.replicas for t in r.threads_skipped})


class Repaired(Protocol):
    """What the background repair asks of the checkpointer it holds weakly."""

    repair_interval: float

    def _anti_entropy_pass(self, passes: int) -> None: ...


def anti_entropy(ref: weakref.ref[Repaired], closed: threading.Event) -> None:
    """The background repair: a pass every `repair_interval` (holding the checkpointer only
    during a pass), until it is closed or dropped."""
    passes = 0
    while True:
        cp = ref()
        if cp is None:
            return
        interval = cp.repair_interval
        del cp
        if closed.wait(interval):
            return
        cp = ref()
        if cp is None:
            return
        passes += 1
        cp._anti_entropy_pass(passes)
        del cp


def repair_thread(primary: BaseCheckpointSaver[Any], replica: BaseCheckpointSaver[Any],
                  thread_id: str, report: ReplicaRepair, quick: bool = False) -> None:
    """One thread: compared and written by `transfer` (the same code as `lgckpt copy`)."""
    from ...transfer import diff_thread, put_thread, thread_tuples

    if quick and isinstance(primary, StoreCheckpointer) and isinstance(
            replica, StoreCheckpointer):
        # Rows, not bytes: each backend counts the bytes of its own layout.
        def rows(saver: StoreCheckpointer) -> list[tuple[str, str, str, int]]:
            return sorted((s.checkpoint_ns, s.kind, s.channel, s.rows)
                          for s in saver.sizes(thread_id))

        ours = rows(primary)
        if ours and ours == rows(replica):
            report.threads_checked += 1
            report.threads_equal += 1
            return

    source = thread_tuples(primary, thread_id)
    target = thread_tuples(replica, thread_id)
    report.threads_checked += 1
    if not source:
        if target:
            replica.delete_thread(thread_id)
            report.threads_deleted.append(thread_id)
        else:
            report.threads_equal += 1
        return
    d = diff_thread(primary.serde, thread_id, source, target)
    if d.equal:
        report.threads_equal += 1
        return
    if d.conflict is not None:  # held things the primary does not: written again whole
        replica.delete_thread(thread_id)
        report.threads_rebuilt.append(thread_id)
    checkpoints, writes = put_thread(replica, thread_id, source, d.missing)
    report.checkpoints_copied += checkpoints
    report.writes_copied += writes
