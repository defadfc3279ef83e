"""Append-delta planning for channels that grow by appending (pure; no I/O).

LangGraph's savers write a message list whole at every step, so a thread's storage grows with
the square of its length. We remember, per process, each list channel's last written value and
how it was stored. When the next value starts with that list, only the new items are stored,
as a segment whose `base_version` is an earlier row of the same channel.

Segments merge like a binary counter: a new segment that meets one of its own level on the
chain absorbs it and moves up a level. A chain therefore holds at most log2(K) + 1 rows, each
item is rewritten about log2(K) times in all, and when the top level K is reached a full
snapshot is written instead: a full value at least every K versions, and a read that touches at
most log2(K) + 1 rows, whose bytes add up to the value's own size.

Correctness never depends on this memory: a miss writes a full value, and a store writes a
delta only if its base row still exists (falling back to the full value otherwise).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

_FULL = -1

MISS: Any = object()
"""What `cached` returns for a value it does not hold (None is a value a channel can have)."""
EMPTY: Any = object()
"""A channel with no value at a version (LangGraph versions a channel it clears): no row."""


@dataclass(frozen=True, slots=True)
class _Segment:
    version: str
    level: int  # _FULL for a full snapshot
    start: int  # index of the segment's first item in the list


@dataclass(frozen=True, slots=True)
class Chain:
    items: list[Any]
    segments: tuple[_Segment, ...]
    # Each item's serialized bytes, for a serializer whose list encoding is the items'
    # encodings concatenated (`codec.encode_list`): a prefix of `items`, filled as encoded.
    encoded: list[bytes] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Plan:
    """How to store one list value: `value[start:]` on top of `base` (None: the whole value)."""

    start: int
    base: str | None
    chain: Chain


def _extends(old: list[Any], new: list[Any]) -> bool:
    # List equality compares item by item, identity first (in C): unchanged items are the very
    # objects of the previous step, so this rarely calls an item's __eq__.
    return len(new) >= len(old) and new[: len(old)] == old


class AppendLog:
    """Remembers each list channel's last stored value, per (thread, namespace, channel)."""

    def __init__(self, snapshot_every: int = 256, max_entries: int = 4096) -> None:
        if snapshot_every < 2 or snapshot_every & (snapshot_every - 1):
            raise ValueError(f"snapshot_every must be a power of two >= 2, got {snapshot_every}")
        self.top_level = snapshot_every.bit_length() - 1
        self.max_entries = max_entries
        self._chains: OrderedDict[tuple[str, str, str], Chain] = OrderedDict()
        # Channels whose last stored value is not a list: (version, value), read back as is.
        self._values: OrderedDict[tuple[str, str, str], tuple[str, Any]] = OrderedDict()
        self._heads: dict[tuple[str, str], dict[str, str]] = {}  # (thread, ns) -> channel -> version
        self._guard = threading.Lock()

    def plan(self, thread_id: str, ns: str, channel: str, version: str, value: Any) -> Plan | None:
        """A plan for a list value, or None when the value is not a list."""
        if type(value) is not list:
            return None
        with self._guard:
            chain = self._chains.get((thread_id, ns, channel))
        # A version already in the chain (the same checkpoint put again, e.g. a retried
        # batch) would be a delta on itself: write it whole.
        if (chain is None or any(seg.version == version for seg in chain.segments)
                or not _extends(chain.items, value)):
            return self._full(version, value, chain)
        segs = list(chain.segments)
        new = _Segment(version, 0, len(chain.items))
        while len(segs) > 1 and segs[-1].level == new.level:
            merged = segs.pop()
            new = _Segment(version, new.level + 1, merged.start)
        if new.level >= self.top_level:
            return self._full(version, value, chain)
        segs.append(new)
        return Plan(new.start, segs[-2].version, Chain(list(value), tuple(segs), chain.encoded[:]))

    @staticmethod
    def _full(version: str, value: list[Any], chain: Chain | None) -> Plan:
        # A fork or a rewritten list still shares its first items with the last one stored:
        # their encodings carry over as far as the very same objects do.
        encoded: list[bytes] = []
        if chain is not None:
            for old, new, enc in zip(chain.items, value, chain.encoded, strict=False):
                if old is not new:
                    break
                encoded.append(enc)
        return Plan(0, None, Chain(list(value), (_Segment(version, _FULL, 0),), encoded))

    def commit(self, thread_id: str, ns: str, channel: str, plan: Plan, *, full: bool = False) -> None:
        """Remember a plan once its row is stored (`full`: the store wrote the whole value)."""
        self.record(thread_id, ns, {}, {channel: plan}, (channel,) if full else ())

    def remember(self, thread_id: str, ns: str, channel: str, version: str, value: Any) -> None:
        """Remember a value that is not a list, stored whole, as the channel's last (read back
        as is: LangGraph treats channel values as immutable)."""
        self.record(thread_id, ns, {channel: (version, value)}, {}, ())

    def record(
        self,
        thread_id: str,
        ns: str,
        values: Mapping[str, tuple[str, Any]],
        plans: Mapping[str, Plan],
        full: Collection[str] = (),
    ) -> None:
        """What one stored checkpoint holds, at once: `values` (channel -> (version, value))
        as `remember` takes them, `plans` as `commit` does (`full`: channels the store wrote
        whole)."""
        with self._guard:
            heads = self._heads.setdefault((thread_id, ns), {})
            for channel, (version, value) in values.items():
                if type(value) is list:
                    continue
                key = (thread_id, ns, channel)
                self._chains.pop(key, None)
                self._values[key] = (version, value)
                self._values.move_to_end(key)
                heads[channel] = version
            for channel, plan in plans.items():
                chain = plan.chain
                if channel in full:
                    chain = Chain(chain.items, (_Segment(chain.segments[-1].version, _FULL, 0),),
                                  chain.encoded)
                key = (thread_id, ns, channel)
                self._values.pop(key, None)
                self._chains[key] = chain
                self._chains.move_to_end(key)
                heads[channel] = chain.segments[-1].version
            if not heads:
                del self._heads[(thread_id, ns)]
            for held in (self._values, self._chains):
                while len(held) > self.max_entries:
                    (tid, old_ns, ch), _ = held.popitem(last=False)
                    self._drop_head(tid, old_ns, ch)

    def _drop_head(self, thread_id: str, ns: str, channel: str) -> None:
        heads = self._heads.get((thread_id, ns), {})
        heads.pop(channel, None)
        if not heads:
            self._heads.pop((thread_id, ns), None)

    def cached(self, thread_id: str, ns: str, channel: str, version: str) -> Any:
        """The value stored at `version` if it is the last one this process wrote (EMPTY if the
        channel had none there), else MISS.

        Reading it back costs a list copy instead of a deserialization; the items are the very
        objects LangGraph handed to `put`, which, like LangGraph, we treat as immutable.
        """
        with self._guard:
            chain = self._chains.get((thread_id, ns, channel))
            plain = self._values.get((thread_id, ns, channel))
        if plain is not None and plain[0] == version:
            # a dict is copied, as a list is: a caller that changes it does not change ours
            return dict(plain[1]) if type(plain[1]) is dict else plain[1]
        if chain is None or chain.segments[-1].version != version:
            return MISS
        return list(chain.items)

    def held(self, thread_id: str, ns: str) -> dict[str, str]:
        """Channel -> version of the values `cached` can serve for this thread and namespace
        (a store may then skip reading those blobs)."""
        with self._guard:
            return dict(self._heads.get((thread_id, ns), {}))

    def forget(self, thread_id: str | None = None) -> None:
        """Drop what is remembered for one thread (or all): its rows may be gone."""
        with self._guard:
            if thread_id is None:
                self._chains.clear()
                self._values.clear()
                self._heads.clear()
                return
            for key in [k for k in self._chains if k[0] == thread_id]:
                del self._chains[key]
            for key in [k for k in self._values if k[0] == thread_id]:
                del self._values[key]
            for head in [k for k in self._heads if k[0] == thread_id]:
                del self._heads[head]
