"""Append-delta planning for channels that grow by appending (pure; no I/O).

LangGraph's savers write a message list whole at every step, so a thread's storage grows with
the square of its length. We remember, per process, the serialized bytes of each list channel's
last stored value and how it was stored. When the next value's bytes start with those bytes,
only the new items are stored, as a segment whose `base_version` is an earlier row of the same
channel.

What is stored is decided from bytes alone, never from the objects: a message changed in place
serializes differently and the list is stored whole, exactly as LangGraph's savers store it.
This relies on msgpack encoding a list as a header followed by its items' encodings, each
self-delimiting (checked once against the installed LangGraph, see `codec`): a list whose body
starts with the previous body starts with the previous items.

Segments merge like a binary counter: a new segment that meets one of its own level on the
chain absorbs it and moves up a level. A chain therefore holds at most log2(K) + 1 rows, each
item is rewritten about log2(K) times in all, and when the top level K is reached a full
snapshot is written instead: a full value at least every K versions, and a read that touches at
most log2(K) + 1 rows, whose bytes add up to the value's own size.

Correctness never depends on this memory: a miss writes a full value, and a store writes a
delta only if its base row still exists (falling back to the full value otherwise). A read may
use it only through copies of items decoded from the very bytes stored (`ListBytes.copies`).
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from .lru import SizedLRU

_FULL = -1

DEFAULT_MAX_BYTES = 64 << 20
"""What a checkpointer keeps of its lists' last stored values by default (`append_log_bytes`)."""

Mark = tuple[tuple[type, ...], bytes]


@dataclass(frozen=True, slots=True)
class ListBytes:
    """A list's msgpack encoding: `data[head:]` is its items' encodings one after another."""

    data: bytes
    head: int  # length of the array header
    count: int  # items
    # The first `copies_count` items as `copies_by` (a serializer) decodes `data`, pickled in
    # runs (each a pickled list: the items one read decoded): a read of these very bytes
    # unpickles fresh copies, several times faster than decoding them again.
    copies: tuple[bytes, ...] | None = None
    copies_by: object = None
    copies_end: int = 0  # where, in the body, the items `copies` holds end (a prefix)
    copies_count: int = 0
    # Per chunk of items (`codec._CHUNK`; the last may hold fewer), what they were when
    # serialized (see `codec.chunk_mark`; None: not comparable), and where their encodings
    # end in the body: a chunk of the next list with the same mark at the same place
    # serializes to the same bytes.
    marks: tuple[Mark | None, ...] | None = None
    ends: tuple[int, ...] | None = None
    # Bytes `copies` and `marks` hold, added up where they are made: `size` is asked at every
    # put, and summing them there would cost a pass over the list each time.
    copies_bytes: int = 0
    marks_bytes: int = 0

    def with_copies(self, copies: tuple[bytes, ...], copies_by: object, copies_bytes: int,
                    copies_end: int, copies_count: int) -> ListBytes:
        """This list holding `copies` (see the fields), made field by field: a put or a read
        asks it, and `dataclasses.replace` costs several microseconds."""
        return ListBytes(self.data, self.head, self.count, copies, copies_by, copies_end,
                         copies_count, self.marks, self.ends, copies_bytes, self.marks_bytes)

    @property
    def size(self) -> int:
        """What it holds in memory, roughly (the append log's budget)."""
        return (len(self.data) + self.copies_bytes + self.marks_bytes
                + (16 * len(self.marks) if self.marks is not None else 0))

    def starts_with(self, other: ListBytes) -> bool:
        """Whether this list's items begin with all of `other`'s (byte for byte)."""
        return self.count >= other.count and self.data.startswith(
            memoryview(other.data)[other.head:], self.head)

    def tail(self, start: int, offset: int) -> bytes:
        """The encoding of the list `items[start:]`, whose first item is at byte `offset` of
        the body."""
        return array_header(self.count - start) + self.data[self.head + offset:]


def array_header(n: int) -> bytes:
    """msgpack's header of an array of `n` items."""
    if n < 16:
        return bytes((0x90 | n,))
    if n < 1 << 16:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


def list_bytes(data: bytes) -> ListBytes | None:
    """`data` read as a msgpack array (None if it is not one)."""
    if not data:
        return None
    first = data[0]
    if 0x90 <= first <= 0x9F:
        return ListBytes(data, 1, first & 0x0F)
    if first == 0xDC and len(data) >= 3:
        return ListBytes(data, 3, int.from_bytes(data[1:3], "big"))
    if first == 0xDD and len(data) >= 5:
        return ListBytes(data, 5, int.from_bytes(data[1:5], "big"))
    return None


@dataclass(frozen=True, slots=True)
class _Segment:
    version: str
    level: int  # _FULL for a full snapshot
    start: int  # index of the segment's first item in the list
    offset: int  # byte offset of that item in the list's body


@dataclass(frozen=True, slots=True)
class Chain:
    """A list channel's last stored value, as bytes, and the rows it is stored in."""

    value: ListBytes
    segments: tuple[_Segment, ...]


@dataclass(frozen=True, slots=True)
class Plan:
    """How to store one list value: items `start:` (from byte `offset` of the body) on top of
    `base` (None: the whole value)."""

    start: int
    offset: int
    base: str | None
    chain: Chain


class AppendLog:
    """Remembers each list channel's last stored bytes, per (thread, namespace, channel),
    bounded to `max_bytes` in all (least recently written dropped first)."""

    def __init__(self, snapshot_every: int = 256, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        if snapshot_every < 2 or snapshot_every & (snapshot_every - 1):
            raise ValueError(f"snapshot_every must be a power of two >= 2, got {snapshot_every}")
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
            raise ValueError(
                f"append_log_bytes must be a number of bytes >= 0 (0: no append-deltas), got "
                f"{max_bytes!r}")
        self.top_level = snapshot_every.bit_length() - 1
        self._chains: SizedLRU[tuple[str, str, str], Chain] = SizedLRU(
            max_bytes, lambda chain: chain.value.size)
        self._guard = threading.Lock()

    @property
    def max_bytes(self) -> int:
        """The bound on `held_bytes`."""
        return self._chains.max_bytes

    @property
    def held_bytes(self) -> int:
        """Bytes remembered now: each list's bytes, with its decoded copies and marks."""
        with self._guard:
            return self._chains.total

    def _chain(self, thread_id: str, ns: str, channel: str) -> Chain | None:
        with self._guard:
            return self._chains.get((thread_id, ns, channel))

    def last(self, thread_id: str, ns: str, channel: str) -> ListBytes | None:
        """The bytes of the list last stored for a channel, if remembered."""
        chain = self._chain(thread_id, ns, channel)
        return None if chain is None else chain.value

    def stored_at(self, thread_id: str, ns: str, channel: str, version: str) -> ListBytes | None:
        """The bytes of the list last stored for a channel, if that was at `version`."""
        chain = self._chain(thread_id, ns, channel)
        return chain.value if chain is not None and chain.segments[-1].version == version else None

    def attach(self, thread_id: str, ns: str, channel: str, value: ListBytes) -> None:
        """`value` (with its copies) instead of the remembered bytes, if those are the same."""
        key = (thread_id, ns, channel)
        with self._guard:
            chain = self._chains.get(key)
            if chain is not None and chain.value.data == value.data:
                self._chains.put(key, Chain(value, chain.segments))

    def plan(self, thread_id: str, ns: str, channel: str, version: str, value: ListBytes) -> Plan:
        """How to store a list value, given its bytes."""
        chain = self._chain(thread_id, ns, channel)
        # A version already in the chain (the same checkpoint put again, e.g. a retried
        # batch) would be a delta on itself: write it whole.
        if (chain is None or any(seg.version == version for seg in chain.segments)
                or not value.starts_with(chain.value)):
            return self._full(version, value)
        segs = list(chain.segments)
        new = _Segment(version, 0, chain.value.count, len(chain.value.data) - chain.value.head)
        while len(segs) > 1 and segs[-1].level == new.level:
            merged = segs.pop()
            new = _Segment(version, new.level + 1, merged.start, merged.offset)
        if new.level >= self.top_level:
            return self._full(version, value)
        segs.append(new)
        return Plan(new.start, new.offset, segs[-2].version, Chain(value, tuple(segs)))

    @staticmethod
    def _full(version: str, value: ListBytes) -> Plan:
        return Plan(0, 0, None, Chain(value, (_Segment(version, _FULL, 0, 0),)))

    def commit(self, thread_id: str, ns: str, channel: str, plan: Plan, *, full: bool = False) -> None:
        """Remember a plan once its row is stored (`full`: the store wrote the whole value)."""
        self.record(thread_id, ns, {channel: plan}, (channel,) if full else ())

    def record(
        self,
        thread_id: str,
        ns: str,
        plans: Mapping[str, Plan],
        full: Collection[str] = (),
        dropped: Collection[str] = (),
    ) -> None:
        """What one stored checkpoint holds, at once: `plans` as `commit` takes them (`full`:
        channels the store wrote whole); `dropped`: channels stored in some other way (not a
        list, or not planned), whose chains no longer describe the last row."""
        with self._guard:
            for channel in dropped:
                self._chains.pop((thread_id, ns, channel))
            for channel, plan in plans.items():
                chain = plan.chain
                if channel in full:
                    chain = Chain(chain.value, (_Segment(chain.segments[-1].version, _FULL, 0, 0),))
                self._chains.put((thread_id, ns, channel), chain)

    def forget(self, thread_id: str | None = None) -> None:
        """Drop what is remembered for one thread (or all): its rows may be gone."""
        with self._guard:
            self._chains.drop_thread(thread_id)
