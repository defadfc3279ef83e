"""What every kind of replica keeps: its health, its counts and what it must have repaired."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter

from ...core.urls import redact_text
from .failures import describe
from .queue import Op
from .status import ReplicaStatus

log = logging.getLogger("langgraph_ckpt_ext.replication")


class Health:
    """A replica's health, counts and what it must have repaired (all under `cond`), and its
    queue's bound (`max_queue` ops)."""

    def __init__(self, name: str, max_queue: int) -> None:
        self.name, self.max_queue = name, max_queue
        self.busy: Counter[str] = Counter()  # queued ops per thread
        self.cond = threading.Condition()
        self.up = True
        self.applying = False
        self.applied = 0
        self.failures = 0
        self.last_error: BaseException | None = None
        self.repair_all = False
        self.to_repair: set[str] = set()
        self.fenced: BaseException | None = None
        """The `FencedError` it refused an apply with: its epoch is newer than this node's
        primary's (another node promoted it); this node's writes are refused from then on."""

    def _queued(self) -> int:
        raise NotImplementedError

    def _overflow(self) -> None:
        """Drop the queue: each op's threads marked for repair (under `cond`)."""
        raise NotImplementedError

    def _make_room(self, wait: float) -> None:
        """While the queue is full, wait up to `wait` s for room (backpressure) if the replica
        is up, else drop the queue and mark the replica for repair (under `cond`)."""
        if self._queued() < self.max_queue:
            return
        deadline = time.monotonic() + wait
        while self._queued() >= self.max_queue:
            left = deadline - time.monotonic()
            if not self.up or left <= 0:
                log.warning("replica %s: its queue of %d writes was dropped (%s); the threads "
                            "it held are marked for repair", self.name, self._queued(),
                            "down" if not self.up else "full for too long",
                            extra={"lgckpt": {"replica": self.name, "queued": self._queued(),
                                              "up": self.up}})
                self._overflow()
                break
            self.cond.wait(left)

    def _set_up(self, up: bool, error: BaseException | None) -> None:
        """Record whether the replica answers (under `cond`), logged when that changes."""
        if up != self.up:
            details = {"replica": self.name, "up": up, "failures": self.failures,
                       "error": None if error is None else redact_text(describe(error))}
            if up:
                log.info("replica %s is back after %d failed attempts", self.name,
                         self.failures, extra={"lgckpt": details})
            else:
                log.warning("replica %s is down: %s", self.name, details["error"],
                            extra={"lgckpt": details})
        self.up = up

    def _unbusy(self, threads: tuple[str, ...]) -> None:
        for t in threads:
            self.busy[t] -= 1
            if self.busy[t] <= 0:
                del self.busy[t]

    def _status(self, queued: int, oldest_at: float | None) -> ReplicaStatus:
        return ReplicaStatus(
            self.name, self.up, queued,
            0.0 if oldest_at is None else time.monotonic() - oldest_at,
            self.applied, self.failures,
            None if self.last_error is None else describe(self.last_error),
            self.repair_all or bool(self.to_repair), len(self.to_repair),
            self.fenced is not None,
        )

    def _mark(self, op: Op) -> None:
        """An op this replica will not get: its threads (all, if it names none) to repair."""
        self._mark_threads(op.kind, op.threads)

    def _mark_threads(self, kind: str, threads: tuple[str, ...]) -> None:
        if threads and kind != "delete_runs":
            self.to_repair.update(threads)
        else:
            self.repair_all = True

    @property
    def needs_repair(self) -> bool:
        return self.repair_all or bool(self.to_repair)
