"""Checkpoints to rows and back, through the checkpointer's `serde` (pure; no I/O)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    Checkpoint,
    CheckpointMetadata,
    PendingWrite,
)
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from .appendlog import AppendLog, Chain, Plan
from .errors import CorruptBlobError, SerializationError
from .rows import BlobRow, Typed, WriteRow
from .versions import version_key


def dumps(serde: SerializerProtocol, value: Any, what: str) -> Typed:
    """Serialize `value`; a failure raises `SerializationError` naming `what`."""
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
    try:
        return serde.loads_typed((typed[0], bytes(typed[1])))
    except Exception as exc:
        raise CorruptBlobError(f"cannot decode {what} (type {typed[0]!r}): {exc}") from exc


def _array_header(n: int) -> bytes:
    if n < 16:
        return bytes((0x90 | n,))
    if n < 1 << 16:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


def _probe_concatenates() -> bool:
    serde = JsonPlusSerializer()
    sample = [{"a": [1, None]}, "x", None, 1.5, b"y", 2**40]
    whole = serde.dumps_typed(sample)
    parts = [serde.dumps_typed([item]) for item in sample]
    return (
        whole[0] == "msgpack"
        and all(t == "msgpack" and b[:1] == b"\x91" for t, b in parts)
        and whole[1] == _array_header(len(sample)) + b"".join(b[1:] for _, b in parts)
    )


_CONCATENATES = _probe_concatenates()
"""Whether LangGraph's serializer encodes a list as the array header followed by each item's
own encoding (msgpack does; checked once against the installed version)."""


def encode_list(serde: SerializerProtocol, chain: Chain, start: int, what: str) -> Typed:
    """`chain.items[start:]` serialized, reusing the encodings of items already serialized.

    With LangGraph's own serializer a list is its items' encodings one after the other, so an
    item is serialized once in a process, however often the append log rewrites it (a merge of
    segments, a full snapshot, a fork of the thread). Any other serializer (e.g. encrypting)
    serializes the slice whole.
    """
    items = chain.items
    if _CONCATENATES and type(serde) is JsonPlusSerializer:
        done = chain.encoded
        try:
            for item in items[len(done):]:
                type_, data = serde.dumps_typed([item])
                if type_ != "msgpack" or data[:1] != b"\x91":
                    break  # e.g. the pickle fallback: not an array of items
                done.append(data[1:])
        except Exception:  # reported by `dumps` below, with the value named
            pass
        if len(done) == len(items):
            return "msgpack", _array_header(len(items) - start) + b"".join(done[start:])
    return dumps(serde, items[start:], what)


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
        plan = log.plan(thread_id, ns, channel, vkey, value)
        if plan is not None:
            plans[channel] = plan
        if plan is None:
            type_, data = dumps(serde, value, what)
            rows.append(BlobRow(channel, vkey, type_, data))
        elif plan.base is None:
            rows.append(BlobRow(channel, vkey, *encode_list(serde, plan.chain, 0, what)))
        else:
            type_, data = encode_list(serde, plan.chain, plan.start, what)
            rows.append(
                BlobRow(
                    channel,
                    vkey,
                    type_,
                    data,
                    plan.base,
                    full=lambda c=plan.chain, w=what: encode_list(serde, c, 0, w),  # type: ignore[misc]
                )
            )
    return rows, plans


def resolve_blobs(
    serde: SerializerProtocol,
    rows: Mapping[tuple[str, str], BlobRow],
    wanted: Mapping[str, str],
) -> dict[str, Any]:
    """Channel values for `wanted` (channel -> version key), rebuilding append-deltas.

    A wanted version with no row is an empty channel and is left out.
    """
    memo: dict[tuple[str, str], Any] = {}

    def value_of(key: tuple[str, str], depth: int = 0) -> Any:
        if key in memo:
            return memo[key]
        row = rows.get(key)
        if row is None:
            raise CorruptBlobError(f"append-delta base {key[1]!r} of channel {key[0]!r} is missing")
        if depth > 64:
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
            value = value_of((channel, vkey))
            out[channel] = list(value) if isinstance(value, list) else value
    return out


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
