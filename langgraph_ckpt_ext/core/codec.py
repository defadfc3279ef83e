"""Checkpoints to rows and back, through the checkpointer's `serde` (pure; no I/O)."""

from __future__ import annotations

import pickle
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    Checkpoint,
    CheckpointMetadata,
    PendingWrite,
)
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from pydantic import BaseModel

from .appendlog import AppendLog, ListBytes, Mark, Plan, array_header, list_bytes
from .errors import CorruptBlobError, SerializationError
from .rows import BlobRow, Typed, WriteRow
from .sealing import SEALED, open_unencrypted
from .versions import version_key

_MISS: Any = object()
_MAX_CHAIN = 64  # rows an append-delta chain may span before it counts as corrupt


@dataclass(frozen=True, slots=True, eq=False)
class Encoded:
    """A value serialized by `serde` when it was handed over: changes made to the object
    afterwards cannot reach it. A checkpointer of ours with that very serializer stores these
    bytes as they are; `value()` decodes a fresh copy. `listed`: a list's bytes item by item
    with their marks (see `encode_items`), when LangGraph's own serializer made them."""

    serde: SerializerProtocol
    typed: Typed
    is_list: bool
    listed: ListBytes | None = None

    def value(self) -> Any:
        return loads(self.serde, self.typed, "a value kept serialized")


def encode(serde: SerializerProtocol, value: Any, what: str,
           last: Encoded | None = None) -> Encoded:
    """`value` serialized now (see `Encoded`); a list reuses the bytes of the items unchanged
    since `last` (the same channel's value encoded before)."""
    if type(value) is Encoded:
        return value
    if type(value) is list and type(serde) is JsonPlusSerializer and _CONCATENATES:
        listed = encode_items(serde, value, last.listed if last is not None else None, what)
        if listed is not None:
            return Encoded(serde, ("msgpack", listed.data), True, listed)
    return Encoded(serde, dumps(serde, value, what), type(value) is list)


def decoded(value: Any) -> Any:
    """`value` itself, or a fresh copy of what an `Encoded` holds."""
    return value.value() if type(value) is Encoded else value


def dumps(serde: SerializerProtocol, value: Any, what: str) -> Typed:
    """Serialize `value`; a failure raises `SerializationError` naming `what`."""
    if type(value) is Encoded:
        # LangGraph's serializers differ only in what they may decode (an allowlist): their
        # msgpack bytes are the same, whichever made them.
        if value.serde is serde or (
            type(value.serde) is JsonPlusSerializer and type(serde) is JsonPlusSerializer
            and value.typed[0] != "pickle"
        ):
            return value.typed
        value = value.value()
    try:
        return serde.dumps_typed(value)
    except Exception as exc:
        raise SerializationError(
            f"cannot serialize {what} (a {type(value).__name__}): {exc}. Store values the "
            "serializer supports (JSON-like data, pydantic models, dataclasses, LangChain "
            "messages) or pass a serde that handles this type"
        ) from exc


def loads(serde: SerializerProtocol, typed: Typed, what: str) -> Any:
    """Deserialize a stored value; a failure raises `CorruptBlobError` naming `what`."""
    if typed[0] == SEALED:  # compressed, read by a checkpointer that seals nothing
        typed = open_unencrypted(typed, what)
    try:
        return serde.loads_typed((typed[0], bytes(typed[1])))
    except Exception as exc:
        raise CorruptBlobError(f"cannot decode {what} (type {typed[0]!r}): {exc}") from exc


def _probe_concatenates() -> bool:
    serde = JsonPlusSerializer()
    sample = [{"a": [1, None]}, "x", None, 1.5, b"y", 2**40]
    whole = serde.dumps_typed(sample)
    parts = [serde.dumps_typed([item]) for item in sample]
    return (
        whole[0] == "msgpack"
        and all(t == "msgpack" and b[:1] == b"\x91" for t, b in parts)
        and whole[1] == array_header(len(sample)) + b"".join(b[1:] for _, b in parts)
    )


_CONCATENATES = _probe_concatenates()
"""Whether LangGraph's serializer encodes a list as the array header followed by each item's
own encoding (msgpack does; checked once against the installed version). Append-deltas rely
on it: without it every list is stored whole."""

_FINGERPRINT = JsonPlusSerializer()
"""Tells appends apart for a serializer of the user's (its own bytes may differ each time,
e.g. encrypted): two lists start alike when LangGraph's msgpack encodings do."""


def _fingerprint(value: list[Any], last: ListBytes | None, what: str) -> ListBytes | None:
    """`value`'s LangGraph msgpack, item by item on top of `last` (see `encode_items`)."""
    try:
        return encode_items(_FINGERPRINT, value, last, what)
    except Exception:  # the user's serializer may still handle it: stored whole
        return None


def encode_list(
    serde: SerializerProtocol, log: AppendLog, key: tuple[str, str, str], version: str,
    value: list[Any] | Encoded, what: str,
) -> tuple[BlobRow, Plan | None]:
    """A list value's row, as an append-delta when its bytes extend the last ones stored
    (`key`: thread, namespace, channel), and the plan to remember once it is stored.

    With LangGraph's own serializer the list is serialized item by item, reusing the bytes of
    the items unchanged since the last list stored (`encode_items`), and a delta is a slice of
    those bytes. Any other serializer serializes the whole value and the new items (a delta's
    base may be gone when it is written, and the whole value must be the one of now).
    """
    channel = key[2]
    own = type(serde) is JsonPlusSerializer  # the stored bytes are LangGraph's msgpack
    last = log.last(*key)
    listed = None
    if own and _CONCATENATES and type(value) is list:
        listed = encode_items(serde, value, last, what)
    elif own and type(value) is Encoded and value.listed is not None:
        listed = value.listed  # made item by item by LangGraph's serializer too
    if listed is not None:
        typed: Typed = ("msgpack", listed.data)
    else:
        typed = dumps(serde, value, what)
        if _CONCATENATES and own:
            listed = list_bytes(typed[1]) if typed[0] == "msgpack" else None
        elif _CONCATENATES:
            items: list[Any] = decoded(value)
            listed = _fingerprint(items, last, what)
    if listed is None:  # e.g. the pickle fallback
        return BlobRow(channel, version, *typed), None
    if own:
        listed = _extend_copies(listed, last)
    plan = log.plan(*key, version, listed)
    if plan.base is None:
        return BlobRow(channel, version, *typed), plan
    part = (("msgpack", listed.tail(plan.start, plan.offset)) if own
            else dumps(serde, items[plan.start:], what))
    return BlobRow(channel, version, *part, plan.base, full=lambda: typed), plan


_CHUNK = 16
"""Items one mark covers (see `chunk_mark`): one pickle of sixteen items' states costs about
half of sixteen pickles (their field names pickled once), and the loop runs per chunk."""


def chunk_mark(items: Sequence[Any]) -> Mark | None:
    """What a run of items is, to tell whether it changed since it was serialized: their
    types and the state their serialization depends on, pickled together. Two runs with the
    same mark serialize to the same bytes, whichever objects they are (pickle writes values,
    and shared objects as such: a run equal in value but shared otherwise only differs).
    None: an item cannot be pickled.

    A pydantic model's state is its fields and extra fields when its class serializes them
    the standard way (`_plain_model`: LangChain's messages do); otherwise, all of it (fields
    set and private attributes too). Anything else is pickled as it is."""
    try:
        types = tuple(map(type, items))
        if _PLAIN.issuperset(types):  # LangChain's messages, say: no call per item
            states = [(item.__dict__, item.__pydantic_extra__) for item in items]
        else:
            states = [_state(item) for item in items]
        return types, pickle.dumps(states, pickle.HIGHEST_PROTOCOL)
    except Exception:
        return None


def _state(item: Any) -> Any:
    kind = _KINDS.get(type(item))
    if kind is None:  # `isinstance` of a pydantic class is slow: asked once per type
        kind = _KINDS[type(item)] = (
            _OTHER if not isinstance(item, BaseModel)
            else _PLAIN_MODEL if _plain_model(type(item)) else _MODEL)
        if kind == _PLAIN_MODEL:
            _PLAIN.add(type(item))
    if kind == _PLAIN_MODEL:  # its own state, without pydantic's pickling hooks
        return item.__dict__, item.__pydantic_extra__
    if kind == _MODEL:
        return (item.__dict__, item.__pydantic_extra__, item.__pydantic_fields_set__,
                item.__pydantic_private__)
    return item


_OTHER, _PLAIN_MODEL, _MODEL = range(3)
_KINDS: dict[type, int] = {}
_PLAIN: set[type] = set()
"""The pydantic classes whose items' state is their fields and extra fields alone."""


def _plain_model(cls: type[BaseModel]) -> bool:
    """Whether `model_dump()` of a `cls` depends on its fields and extra fields alone: no
    override, no custom or computed serializers, no private attributes."""
    hooks = cls.__pydantic_decorators__
    return (cls.model_dump is BaseModel.model_dump and not cls.__private_attributes__
            and not hooks.model_serializers and not hooks.field_serializers
            and not hooks.computed_fields)


def encode_items(
    serde: SerializerProtocol, value: list[Any], last: ListBytes | None, what: str
) -> ListBytes | None:
    """`value` serialized by LangGraph's own serializer a chunk of `_CHUNK` items at a time:
    a chunk whose mark (see `chunk_mark`) equals the mark of the chunk at its place in `last`
    takes that chunk's bytes, and so do the first items of a chunk that `last` held fewer of
    (its last chunk, grown) when their mark equals it; the other items are serialized. The
    bytes are those of `serde.dumps_typed(value)` (msgpack concatenates). None: an item is
    not msgpack (e.g. the pickle fallback)."""
    before: Sequence[Mark | None] = ()
    old_ends: Sequence[int] = ()
    old_count = 0
    body = memoryview(b"")
    if last is not None and last.marks is not None and last.ends is not None:
        before, old_ends, old_count = last.marks, last.ends, last.count
        body = memoryview(last.data)[last.head:]
    parts: list[bytes | memoryview] = []
    marks: list[Mark | None] = []
    ends: list[int] = []
    end = 0
    run = -1  # where, in the old body, the current run of bytes taken from `last` starts
    marks_bytes = 0
    for j, lo in enumerate(range(0, len(value), _CHUNK)):
        chunk = value[lo:lo + _CHUNK]
        mark = chunk_mark(chunk)
        marks.append(mark)
        if mark is not None:
            marks_bytes += len(mark[1])
        kept = 0  # the chunk's first items whose bytes are those `last` holds
        if j < len(before) and before[j] is not None:
            held = min(old_count - lo, _CHUNK)
            if before[j] == mark:
                kept = len(chunk)
            elif held < len(chunk) and chunk_mark(chunk[:held]) == before[j]:
                kept = held
        if kept:
            start = old_ends[j - 1] if j else 0
            if run < 0:
                run = start
            end += old_ends[j] - start
            if kept == len(chunk):
                ends.append(end)
                continue
        if run >= 0:
            parts.append(body[run:old_ends[j] if kept else old_ends[j - 1]])
            run = -1
        type_, data = dumps(serde, chunk[kept:], what)
        header = array_header(len(chunk) - kept)
        if type_ != "msgpack" or not data.startswith(header):
            return None
        parts.append(memoryview(data)[len(header):])
        end += len(data) - len(header)
        ends.append(end)
    if run >= 0:
        parts.append(body[run:old_ends[len(marks) - 1]])
    header = array_header(len(value))
    return ListBytes(header + b"".join(parts), len(header), len(value),
                     marks=tuple(marks), ends=tuple(ends),
                     marks_bytes=marks_bytes)


def _extend_copies(listed: ListBytes, last: ListBytes | None) -> ListBytes:
    """`listed` with the copies `last` holds of its first items (see `ListBytes.copies`),
    when it extends `last`: the items added are decoded by the next read that needs them."""
    if last is None or last.copies is None or not listed.starts_with(last):
        return listed
    return listed.with_copies(last.copies, last.copies_by, last.copies_bytes, last.copies_end,
                              last.copies_count)


class ListCopies:
    """What `resolve_blobs` may read from a process's memory instead of decoding: a list
    channel whose stored bytes are exactly those this process last stored for it."""

    def __init__(self, log: AppendLog, thread_id: str, ns: str) -> None:
        self._log, self._thread_id, self._ns = log, thread_id, ns

    def held(self, channel: str, version: str) -> ListBytes | None:
        return self._log.stored_at(self._thread_id, self._ns, channel, version)

    def read(self, channel: str, held: ListBytes, serde: SerializerProtocol) -> list[Any]:
        """The items of `held` (stored exactly so): fresh copies of those copied before, the
        others decoded now (and copied for the next read)."""
        done = held.copies if held.copies is not None and held.copies_by is serde else ()
        copied = held.copies_count if done else 0
        items: list[Any] = []
        for run in done:
            items += pickle.loads(run)
        if copied < held.count:
            start = held.copies_end if done else 0
            tail = loads(serde, ("msgpack", held.tail(copied, start)), f"channel {channel!r}")
            try:
                runs: tuple[bytes, ...]
                if len(done) >= _RUNS:  # one run again: a pickled list loads faster whole
                    runs = (pickle.dumps([*items, *tail], pickle.HIGHEST_PROTOCOL),)
                else:
                    runs = (*done, pickle.dumps(list(tail), pickle.HIGHEST_PROTOCOL))
            except Exception:  # something pickle cannot copy: decoded at every read
                return [*items, *tail]
            self._log.attach(self._thread_id, self._ns, channel, held.with_copies(
                runs, serde, sum(map(len, runs)), len(held.data) - held.head, held.count))
            items += tail
        return items


_RUNS = 8
"""Runs of copies a list holds before a read pickles them as one again."""


def encode_header(serde: SerializerProtocol, checkpoint: Checkpoint) -> Typed:
    header = {k: v for k, v in checkpoint.items() if k != "channel_values"}
    return dumps(serde, header, f"checkpoint {checkpoint.get('id')!r}")


def decode_header(serde: SerializerProtocol, typed: Typed, what: str) -> dict[str, Any]:
    header = loads(serde, typed, what)
    if not isinstance(header, dict) or "channel_versions" not in header:
        raise CorruptBlobError(f"{what} is not a checkpoint record")
    return header


def encode_blobs(
    serde: SerializerProtocol,
    log: AppendLog,
    thread_id: str,
    ns: str,
    values: Mapping[str, Any],
    new_versions: Mapping[str, Any],
) -> tuple[list[BlobRow], dict[str, Plan]]:
    """Rows for the channels in `new_versions` that hold a value, and the append plans used.

    A channel in `new_versions` without a value is empty at that version: no row is written.
    """
    rows: list[BlobRow] = []
    plans: dict[str, Plan] = {}
    for channel, version in new_versions.items():
        if channel not in values:
            continue
        value = values[channel]
        vkey = version_key(version)
        what = f"channel {channel!r}"
        if type(value) is not list and not (type(value) is Encoded and value.is_list):
            rows.append(BlobRow(channel, vkey, *dumps(serde, value, what)))
            continue
        row, plan = encode_list(serde, log, (thread_id, ns, channel), vkey, value, what)
        rows.append(row)
        if plan is not None:
            plans[channel] = plan
    return rows, plans


def resolve_blobs(
    serde: SerializerProtocol,
    rows: Mapping[tuple[str, str], BlobRow],
    wanted: Mapping[str, str],
    known: ListCopies | None = None,
) -> dict[str, Any]:
    """Channel values for `wanted` (channel -> version key), rebuilding append-deltas.

    A wanted version with no row is an empty channel and is left out. `known`: lists this
    process stored; a stored value whose bytes are exactly those is read as fresh copies of
    items this process decoded from the same bytes, not decoded again.
    """
    memo: dict[tuple[str, str], Any] = {}

    def copied(channel: str, vkey: str) -> Any:
        held = known.held(channel, vkey) if known is not None else None
        if held is None:
            return _MISS
        stored = _stored_list(rows, (channel, vkey))
        if stored is None or stored.count != held.count or stored.data != held.data:
            return _MISS
        return known.read(channel, held, serde)  # type: ignore[union-attr]

    def value_of(key: tuple[str, str], depth: int = 0) -> Any:
        if key in memo:
            return memo[key]
        row = rows.get(key)
        if row is None:
            raise CorruptBlobError(f"append-delta base {key[1]!r} of channel {key[0]!r} is missing")
        if depth > _MAX_CHAIN:
            raise CorruptBlobError(f"append-delta chain of channel {key[0]!r} is cyclic or too long")
        what = f"channel {key[0]!r} at version {key[1]!r}"
        part = loads(serde, (row.type, row.data), what)
        if row.base_version is not None:
            base = value_of((row.channel, row.base_version), depth + 1)
            if not isinstance(base, list) or not isinstance(part, list):
                raise CorruptBlobError(f"append-delta of {what} does not extend a list")
            part = base + part
        memo[key] = part
        return part

    out: dict[str, Any] = {}
    for channel, vkey in wanted.items():
        if (channel, vkey) in rows:
            value = copied(channel, vkey)
            if value is _MISS:
                value = value_of((channel, vkey))
            out[channel] = list(value) if isinstance(value, list) else value
    return out


def _stored_list(rows: Mapping[tuple[str, str], BlobRow], key: tuple[str, str]) -> ListBytes | None:
    """The msgpack bytes of a stored list, its append-deltas joined, without decoding (None
    if a row is not a msgpack list, or a base is missing)."""
    bodies: list[bytes | memoryview] = []
    count = 0
    for _ in range(_MAX_CHAIN + 1):
        row = rows.get(key)
        if row is None or row.type != "msgpack":
            return None
        part = list_bytes(row.data)
        if part is None:
            return None
        bodies.append(memoryview(part.data)[part.head:])
        count += part.count
        if row.base_version is None:
            header = array_header(count)
            return ListBytes(header + b"".join(reversed(bodies)), len(header), count)
        key = (key[0], row.base_version)
    return None


def blob_keys(channel_versions: Mapping[str, Any]) -> dict[str, str]:
    return {ch: version_key(v) for ch, v in channel_versions.items()}


def encode_writes(
    serde: SerializerProtocol,
    thread_id: str,
    ns: str,
    checkpoint_id: str,
    writes: Sequence[tuple[str, Any]],
    task_id: str,
    task_path: str,
) -> list[WriteRow]:
    rows = []
    for i, (channel, value) in enumerate(writes):
        type_, data = dumps(serde, value, f"write to channel {channel!r} of task {task_id!r}")
        idx = WRITES_IDX_MAP.get(channel, i)
        rows.append(
            WriteRow(thread_id, ns, checkpoint_id, task_id, idx, channel, type_, data, task_path)
        )
    return rows


def writes_order(row: WriteRow) -> tuple[str, str, int]:
    """`writes_sort_key` of a stored row: the order LangGraph applies a step's writes in."""
    return (row.task_path, row.task_id, row.idx)


def decode_writes(serde: SerializerProtocol, rows: Iterable[WriteRow]) -> list[PendingWrite]:
    return [
        (r.task_id, r.channel, loads(serde, (r.type, r.data), f"write to channel {r.channel!r}"))
        for r in rows
    ]


def decode_metadata(serde: SerializerProtocol, typed: Typed, what: str) -> CheckpointMetadata:
    md = loads(serde, typed, f"metadata of {what}")
    if not isinstance(md, dict):
        raise CorruptBlobError(f"metadata of {what} is not a mapping")
    return md  # type: ignore[return-value]
