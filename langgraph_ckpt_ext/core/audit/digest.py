"""The audit trail's digests: how a checkpoint's hash is computed from its stored rows, shared
by the put side (`seal`) and by verification (pure; no I/O). See `core.audit` for the format."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from .. import codec
from ..errors import CheckpointerError
from ..keys import KeyProvider
from ..rows import BlobRow, CheckpointRow, Typed, WriteRow

if TYPE_CHECKING:
    from _hashlib import HASH

AUDIT_KEY = "audit"
AUDIT_VERSION = 1
"""The unkeyed format: "hash" is a sha256 (anyone can compute it)."""
KEYED_VERSION = 2
"""The keyed format: "hash" is an HMAC-SHA256 under the audit key named by "kid"."""

_DOMAIN = b"langgraph-ckpt-ext audit v1"
_KEYED_DOMAIN = b"langgraph-ckpt-ext audit v2"
# A plain serializer for metadata and, rarely, a value: deterministic (never encrypted).
_PLAIN = JsonPlusSerializer()




def _frame(h: HASH | hmac.HMAC, *parts: str | bytes) -> None:
    """Feed parts, each preceded by its length (so no two sequences of parts collide)."""
    out: list[bytes] = []
    for part in parts:
        data = part.encode("utf-8", "surrogatepass") if isinstance(part, str) else part
        out += (len(data).to_bytes(8, "big"), data)
    h.update(b"".join(out))


def _array_body(typed: Typed) -> bytes | None:
    """The items of a msgpack array, without its header (a list's items pack one by one, so a
    list's body is its base's body followed by an append-delta's)."""
    type_, data = typed
    if type_ != "msgpack" or not data:
        return None
    head = data[0]
    if 0x90 <= head <= 0x9F:
        return bytes(data[1:])
    if head == 0xDC:
        return bytes(data[3:])
    if head == 0xDD:
        return bytes(data[5:])
    return None


@dataclass(frozen=True, slots=True)
class Digest:
    """A value's digest; for a list also the running hash, to extend by an append-delta."""

    digest: bytes
    running: HASH | None = None


def value_digest(typed: Typed) -> Digest:
    body = _array_body(typed)
    if body is not None:
        h = hashlib.sha256(b"L")
        _frame(h, typed[0])
        h.update(body)
        return Digest(h.digest(), h)
    h = hashlib.sha256(b"V")
    _frame(h, typed[0], bytes(typed[1]))
    return Digest(h.digest())


def extend_digest(base: Digest | None, delta: Typed) -> Digest | None:
    body = _array_body(delta)
    if base is None or base.running is None or body is None:
        return None
    h = base.running.copy()
    h.update(body)
    return Digest(h.digest(), h)


_UNREADABLE = Digest(hashlib.sha256(b"unreadable").digest())


def stored_digests(
    serde: SerializerProtocol,
    rows: Mapping[tuple[str, str], BlobRow],
    keys: Iterable[tuple[str, str]],
    memo: dict[tuple[str, str], Digest | None],
) -> None:
    """Digests of stored values (None: no row, an empty channel) into `memo`, with the bases
    their append-deltas need; a delta that does not extend a list digests its whole value."""

    def of(key: tuple[str, str], depth: int = 0) -> Digest | None:
        if key in memo:
            return memo[key]
        row = rows.get(key)
        if row is None:  # no value; or, under a delta, a missing base
            memo[key] = None
            return None if depth == 0 else _UNREADABLE
        if row.base_version is None:
            found: Digest | None = value_digest((row.type, row.data))
        elif depth > 64:
            found = _UNREADABLE
        else:
            found = extend_digest(of((row.channel, row.base_version), depth + 1), (row.type, row.data))
            if found is None:
                try:
                    value = codec.resolve_blobs(serde, rows, {key[0]: key[1]})[key[0]]
                    found = value_digest(plain_bytes(serde, value))
                except (CheckpointerError, KeyError):
                    found = _UNREADABLE
        memo[key] = found
        return found

    for key in keys:
        of(key)


_SCALARS = (str, int, float, bool, type(None))


def _canonical(value: Any) -> Any:
    """Dicts with sorted keys and tuples as lists, all the way down (a metadata round trip
    turns tuples into lists)."""
    if type(value) in _SCALARS:
        return value
    if isinstance(value, dict):
        try:
            keys = sorted(value)
        except TypeError:  # keys of several types
            keys = sorted(value, key=lambda k: (type(k).__name__, str(k)))
        return {k: _canonical(value[k]) for k in keys}
    if isinstance(value, list | tuple):
        return [_canonical(v) for v in value]
    if isinstance(value, set | frozenset):  # iteration order varies between processes
        return sorted((_canonical(v) for v in value), key=lambda v: (type(v).__name__, repr(v)))
    return value


def plain_bytes(serde: SerializerProtocol, value: Any) -> Typed:
    """`value` serialized deterministically: by a plain serializer, or if that cannot, by the
    checkpointer's (which stored it)."""
    try:
        return _PLAIN.dumps_typed(value)
    except Exception:
        return serde.dumps_typed(value)


def metadata_bytes(serde: SerializerProtocol, metadata: Mapping[str, Any]) -> Typed:
    return plain_bytes(serde, _canonical({k: v for k, v in metadata.items() if k != AUDIT_KEY}))


def _fingerprint(task_id: str, idx: int) -> str:
    h = hashlib.sha256()
    _frame(h, task_id, str(idx))
    return h.hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class WriteDigest:
    order: tuple[str, str, int]
    fingerprint: str
    digest: bytes


def write_digest(row: WriteRow) -> WriteDigest:
    h = hashlib.sha256()
    _frame(h, row.task_path, row.task_id, str(row.idx), row.channel, row.type, bytes(row.data))
    return WriteDigest(codec.writes_order(row), _fingerprint(row.task_id, row.idx), h.digest())


Ids = tuple[str, str, str, "str | None"]
"""(thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id) of a checkpoint."""


def content_hash(
    ids: Ids,
    prev: str,
    header: Typed,
    metadata: Typed,
    channels: Mapping[str, Digest | None],
    writes: Sequence[WriteDigest],
    key: bytes | None = None,
) -> str:
    """The hash of one checkpoint (see the module docstring): a sha256, or with `key` an
    HMAC-SHA256 under it, over the same content."""
    tid, ns, cid, parent = ids
    h: HASH | hmac.HMAC = (hashlib.sha256(_DOMAIN) if key is None
                           else hmac.new(key, _KEYED_DOMAIN, "sha256"))
    _frame(h, tid, ns, cid, parent or "", prev, header[0], bytes(header[1]), *metadata)
    held = sorted((ch, d.digest) for ch, d in channels.items() if d is not None)
    h.update(len(held).to_bytes(8, "big"))
    for ch, digest in held:
        _frame(h, ch, digest)
    h.update(len(writes).to_bytes(8, "big"))
    for w in writes:
        _frame(h, w.digest)
    return h.hexdigest()


def make_record(
    ids: Ids,
    prev: str,
    header: Typed,
    metadata: Typed,
    channels: Mapping[str, Digest | None],
    writes: Sequence[WriteDigest],
    keys: KeyProvider | None = None,
) -> dict[str, Any]:
    """A checkpoint's audit record: unkeyed (v1) without `keys`, else sealed (v2) under the
    key `keys.current(None)` names."""
    record: dict[str, Any] = {"v": AUDIT_VERSION}
    key = None
    if keys is not None:
        kid = keys.current(None)
        key = keys.key(kid)
        record = {"v": KEYED_VERSION, "kid": kid}
    record["hash"] = content_hash(ids, prev, header, metadata, channels, writes, key)
    record["prev"] = prev
    record["writes"] = [w.fingerprint for w in writes]
    return record


def record_of(metadata: Mapping[str, Any]) -> dict[str, Any] | None:
    """The audit record if well-formed (v1, or v2 naming its key id), else None."""
    rec = metadata.get(AUDIT_KEY)
    if (
        isinstance(rec, dict)
        and (rec.get("v") == AUDIT_VERSION
             or (rec.get("v") == KEYED_VERSION and isinstance(rec.get("kid"), str)))
        and isinstance(rec.get("hash"), str)
        and isinstance(rec.get("prev"), str)
        and isinstance(rec.get("writes"), list)
        and all(isinstance(w, str) for w in rec["writes"])
    ):
        return rec
    return None


def stored_hash(serde: SerializerProtocol, row: CheckpointRow | None) -> str:
    """A stored checkpoint's audit hash ("" when missing, unhashed or unreadable)."""
    if row is None:
        return ""
    try:
        md = codec.decode_metadata(serde, row.metadata, f"checkpoint {row.checkpoint_id!r}")
    except CheckpointerError:
        return ""
    rec = record_of(md)
    return "" if rec is None else str(rec["hash"])


def parents_first(rows: Sequence[CheckpointRow]) -> list[CheckpointRow]:
    """One namespace's rows with each parent before its children (ids grow with time, so
    their order nearly always is; a parent with a larger id is moved up)."""
    ordered = sorted(rows, key=lambda r: r.checkpoint_id)
    by_id = {r.checkpoint_id: r for r in ordered}
    out: list[CheckpointRow] = []
    done: set[str] = set()
    for row in ordered:
        chain: list[CheckpointRow] = []
        cur: CheckpointRow | None = row
        while cur is not None and cur.checkpoint_id not in done:
            done.add(cur.checkpoint_id)
            chain.append(cur)
            cur = by_id.get(cur.parent_checkpoint_id or "")
        out += reversed(chain)
    return out
