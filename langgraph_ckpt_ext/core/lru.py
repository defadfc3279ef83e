"""A mapping bounded by the bytes of what it holds (pure; not locked: its owner locks)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

K = TypeVar("K", bound=tuple[str, ...])
V = TypeVar("V")


class SizedLRU(Generic[K, V]):
    """Values by key, each of `size_of(value)` bytes, at most `max_bytes` in all: storing past
    that drops the least recently stored first. Keys are tuples whose first part is a thread id
    (see `drop_thread`)."""

    def __init__(self, max_bytes: int, size_of: Callable[[V], int]) -> None:
        self.max_bytes = max_bytes
        self._size_of = size_of
        self._items: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._of: dict[str, set[K]] = {}  # a thread's keys, so dropping them is no scan
        self.total = 0
        """Bytes held."""

    def get(self, key: K) -> V | None:
        found = self._items.get(key)
        return None if found is None else found[0]

    def put(self, key: K, value: V) -> None:
        """Store `value` as the most recent, then drop the oldest while over the bound."""
        self.pop(key)
        size = self._size_of(value)
        self._items[key] = (value, size)
        self._of.setdefault(key[0], set()).add(key)
        self.total += size
        while self.total > self.max_bytes and self._items:
            self.pop(next(iter(self._items)))

    def pop(self, key: K) -> None:
        found = self._items.pop(key, None)
        if found is not None:
            self.total -= found[1]
            keys = self._of.get(key[0])
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._of[key[0]]

    def drop_thread(self, thread_id: str | None) -> None:
        """Drop every key of one thread (None: all)."""
        if thread_id is None:
            self._items.clear()
            self._of.clear()
            self.total = 0
            return
        for key in list(self._of.get(thread_id, ())):
            self.pop(key)

    def __iter__(self) -> Iterator[K]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)
