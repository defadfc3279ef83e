"""A thread's repair and the writes to it exclude each other: a write to a thread being
repaired waits (before the primary is touched), a thread with a write in flight (on the
primary, not yet queued) is not repaired. Else a repair reads the primary and a replica at
different moments of a write, and copies it twice or deletes it."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter


class Gate:
    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())  # never taken twice
        self._in_flight: Counter[str | None] = Counter()  # None: threads unknown (by run ids)
        self._held: set[str] = set()  # threads being repaired

    def _blocked(self, threads: tuple[str, ...]) -> bool:
        """Whether a write to `threads` must wait for a repair (under `_cond`)."""
        return any(t in self._held for t in threads) if threads else bool(self._held)

    async def enter(self, sync: bool, threads: tuple[str, ...]) -> None:
        """A write to `threads` starts, once no repair holds them: a sync caller waits in
        place (never suspending), an async one polls, off nobody's thread (a repair holds a
        thread briefly)."""
        while True:
            with self._cond:
                if not self._blocked(threads):
                    for t in threads or (None,):
                        self._in_flight[t] += 1
                    return
                if sync:
                    self._cond.wait()
                    continue
            await asyncio.sleep(0.005)

    def leave(self, threads: tuple[str, ...]) -> None:
        with self._cond:
            for t in threads or (None,):
                self._in_flight[t] -= 1
                if self._in_flight[t] <= 0:
                    del self._in_flight[t]

    def hold(self, thread_id: str) -> bool:
        """Hold a thread's writes off for its repair; False when one is in flight."""
        with self._cond:
            if self._in_flight.get(thread_id) or self._in_flight.get(None):
                return False
            self._held.add(thread_id)
            return True

    def unhold(self, thread_id: str) -> None:
        with self._cond:
            self._held.discard(thread_id)
            self._cond.notify_all()
