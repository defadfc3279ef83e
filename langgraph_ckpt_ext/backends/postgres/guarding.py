"""What a guarded write of `PostgresStore` expects to find, so that the common one takes one
round trip (no I/O here).

A guarded write must be decided by `core.guard` on the facts its thread holds once the
writer holds the thread's row lock. Reading them first takes a transaction of several round
trips; instead the store guesses them (the put chains onto the head, no tombstone unless this
process saw one, the lease the writer carries, the epoch last seen), decides on the guess
with `core.guard`, and sends the write with the guess: the statement compares the facts it
finds under the lock with it and aborts if they differ (`sql._expect`, SQLSTATE LX001).
Only then does the store read the facts in a transaction and decide on them.

The comparison is of facts, not of the rule: the lease as (is one live, whose token), on
which alone `core.guard` decides, the others as they are stored.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from ...core.guard import Guard, LeaseRow
from ...core.rows import CheckpointRow

MISSED = "LX001"
"""SQLSTATE of `lgx_guard_expect`: the thread is not as the write expected."""
_REMEMBERED = 4096


def missed(exc: BaseException) -> bool:
    """Whether `exc` is a guarded statement aborted because its guess was wrong."""
    return getattr(exc, "sqlstate", None) == MISSED


@dataclass(frozen=True, slots=True)
class Facts:
    """A thread's facts as `lgx_guard_facts` reads them."""

    head: str | None
    tombstoned: bool
    token: str | None
    expires: float | None
    epoch: int
    exists: bool
    """The checkpoint asked about is stored."""
    newer: bool = False
    """It is newer than every checkpoint the thread's delete removed (a new run's)."""

    @property
    def lease(self) -> LeaseRow | None:
        return None if self.token is None or self.expires is None else (self.token, self.expires)


@dataclass(frozen=True, slots=True)
class Expected:
    """The facts a guarded statement is sent with (`sql._expect`)."""

    head: str | None
    tombstoned: bool
    live_token: str | None
    epoch: int
    exists: bool = True

    @property
    def lease(self) -> LeaseRow | None:
        return None if self.live_token is None else (self.live_token, float("inf"))

    def put_facts(self, now: float) -> tuple[Any, ...]:
        """`put_refusal`'s arguments after the parent: head, tombstoned, lease, epoch, now."""
        return self.head, self.tombstoned, self.lease, self.epoch, now

    def writes_facts(self, now: float) -> tuple[Any, ...]:
        """`writes_refusal`'s arguments after the checkpoint id."""
        return self.exists, self.tombstoned, self.lease, self.epoch, now

    def params(self) -> tuple[Any, ...]:
        """The parameters `sql._expect` compares first: tombstoned, live token, epoch."""
        return self.tombstoned, self.live_token, self.epoch


class Seen:
    """What this process last found of the facts that rarely change: the store's epoch, and
    the threads with a tombstone (a new run on a deleted thread id), a bounded number."""

    def __init__(self) -> None:
        self.epoch = 0
        self._tombstoned: OrderedDict[str, None] = OrderedDict()

    def expect_put(self, row: CheckpointRow, guard: Guard) -> Expected:
        return Expected(row.parent_checkpoint_id, row.thread_id in self._tombstoned,
                        guard.lease, self.epoch)

    def expect_writes(self, thread_id: str, guard: Guard) -> Expected:
        return Expected(None, thread_id in self._tombstoned, guard.lease, self.epoch)

    def saw(self, thread_id: str, facts: Facts) -> None:
        self.epoch = facts.epoch
        if facts.tombstoned:
            self._tombstoned[thread_id] = None
            self._tombstoned.move_to_end(thread_id)
            if len(self._tombstoned) > _REMEMBERED:
                self._tombstoned.popitem(last=False)
        else:
            self._tombstoned.pop(thread_id, None)
