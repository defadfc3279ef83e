"""A tamper-evident audit trail: each checkpoint's hash chained over its parent's.

Auditing is a setting of the store, recorded in its audit log (`Store.log_audit_switch`): turned
on by a checkpointer opened with `audit=True`, by `enable_audit()` or `lgckpt audit on`, and off
only by `disable_audit(reason=...)` / `lgckpt audit off --reason`. While it is on, every
checkpoint any of our checkpointers stores carries in its metadata

    metadata["audit"] = {
        "v": 1,            # this format
        "hash": "<hex>",   # sha256 of the checkpoint's content (below)
        "prev": "<hex>",   # the parent's "hash" ("" with no parent, or an unhashed one)
        "writes": [...],   # fingerprints of the parent's pending writes the hash covers
    }

`hash` covers, length-framed: the thread id, namespace, checkpoint id, parent id and `prev`;
the checkpoint record as stored (its serialized bytes: ts, channel versions, versions seen);
the metadata without "audit" (keys sorted, tuples as lists, serialized by a plain, unencrypted
`JsonPlusSerializer`); each channel value the checkpoint reads, by name, as the digest of its
stored bytes (a list stored as append-deltas digests as the whole list would); and the parent's
pending writes named in `writes` (task path, task id, index, channel, serialized value), in the
order LangGraph applies them.

A step's writes are stored after its checkpoint, so the child's hash covers them: those with
an index >= 0, which no later write replaces (a task's results). A special write (index < 0:
error, interrupt, resume) may legitimately be replaced later, e.g. when an old interrupt is
answered again, so it is not covered; its effect on the state is, through the task's writes and
the child's values. LangGraph stores writes and the child concurrently: the child's put first
waits for the writes of its parent that this process is storing. `writes` names the writes
covered (16 hex digits of sha256 over task id and index); one stored after the child, or by
another process meanwhile, is not protected (nor are the newest checkpoint's writes).

`verify` recomputes each hash from the stored rows alone (no cache, no schema upgrade) and
reports, oldest first: `altered` (content does not match the hash), `missing_parent` (the
parent was deleted; its child is reported), `broken_link` (`prev` is not the parent's stored
hash: the parent was replaced) and `unhashed` (written with audit off). What breaks a chain
without tampering: an eager schema migration (`migrate_threads`) rewrites checkpoints, which
then verify as altered (they are not re-hashed); pruning or deleting runs leaves the oldest kept
checkpoint with a missing parent. A copied thread (`copy_thread`) is bound to the source's thread
id: in an audited store it is sealed again under its own (`Auditor.reseal`). An unhashed
checkpoint is reported with what the store's audit log says of its time: before auditing was
turned on, after it was turned off (when, why), or while it was on.

To save reads, a checkpointer remembers (bounded, per process) the hashes and value digests of
what it stored, and the writes it stored for each checkpoint; a value not remembered is read
back from the store. The writes remembered stand for the parent's only if this checkpointer
stored the parent itself, first (nobody else knew its id while they were recorded; an index
>= 0 keeps a row already there, which is then this one); otherwise the child's put reads the
parent's writes (and, if not remembered, its hash) from the store. Not detected as a conflict:
another process running the very same task of the same checkpoint at the same time.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import datetime as dt
import hashlib
import threading
from collections import OrderedDict, defaultdict
from collections.abc import Collection, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from ..core import codec
from ..core.errors import CheckpointerError, ThreadNotFoundError
from ..core.rows import AuditSwitch, BlobRow, CheckpointRow, ListQuery, Typed, WriteRow
from ..core.store import Store

if TYPE_CHECKING:
    from _hashlib import HASH

AUDIT_KEY = "audit"
AUDIT_VERSION = 1

ALTERED = "altered"
"""The stored content (values, record, metadata, covered writes) does not match the hash."""
MISSING_PARENT = "missing_parent"
"""The checkpoint's parent is not stored (deleted)."""
BROKEN_LINK = "broken_link"
"""`prev` is not the parent's stored hash (the parent was replaced)."""
UNHASHED = "unhashed"
"""No audit record (written with audit off)."""

_RANK = {UNHASHED: 0, MISSING_PARENT: 1, ALTERED: 2, BROKEN_LINK: 3}
_DOMAIN = b"langgraph-ckpt-ext audit v1"
_PAGE = 32
_WAIT = 30.0  # seconds a put waits for its parent's writes in flight
# A plain serializer for metadata and, rarely, a value: deterministic (never encrypted).
_PLAIN = JsonPlusSerializer()

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


# -- digests ----------------------------------------------------------------------------------


def _frame(h: HASH, *parts: str | bytes) -> None:
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
class _Digest:
    """A value's digest; for a list also the running hash, to extend by an append-delta."""

    digest: bytes
    running: HASH | None = None


def _value_digest(typed: Typed) -> _Digest:
    body = _array_body(typed)
    if body is not None:
        h = hashlib.sha256(b"L")
        _frame(h, typed[0])
        h.update(body)
        return _Digest(h.digest(), h)
    h = hashlib.sha256(b"V")
    _frame(h, typed[0], bytes(typed[1]))
    return _Digest(h.digest())


def _extend(base: _Digest | None, delta: Typed) -> _Digest | None:
    body = _array_body(delta)
    if base is None or base.running is None or body is None:
        return None
    h = base.running.copy()
    h.update(body)
    return _Digest(h.digest(), h)


_UNREADABLE = _Digest(hashlib.sha256(b"unreadable").digest())


def _stored_digests(
    serde: SerializerProtocol,
    rows: Mapping[tuple[str, str], BlobRow],
    keys: Iterable[tuple[str, str]],
    memo: dict[tuple[str, str], _Digest | None],
) -> None:
    """Digests of stored values (None: no row, an empty channel) into `memo`, with the bases
    their append-deltas need; a delta that does not extend a list digests its whole value."""

    def of(key: tuple[str, str], depth: int = 0) -> _Digest | None:
        if key in memo:
            return memo[key]
        row = rows.get(key)
        if row is None:  # no value; or, under a delta, a missing base
            memo[key] = None
            return None if depth == 0 else _UNREADABLE
        if row.base_version is None:
            found: _Digest | None = _value_digest((row.type, row.data))
        elif depth > 64:
            found = _UNREADABLE
        else:
            found = _extend(of((row.channel, row.base_version), depth + 1), (row.type, row.data))
            if found is None:
                try:
                    value = codec.resolve_blobs(serde, rows, {key[0]: key[1]})[key[0]]
                    found = _value_digest(_plain(serde, value))
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


def _plain(serde: SerializerProtocol, value: Any) -> Typed:
    """`value` serialized deterministically: by a plain serializer, or if that cannot, by the
    checkpointer's (which stored it)."""
    try:
        return _PLAIN.dumps_typed(value)
    except Exception:
        return serde.dumps_typed(value)


def _metadata_bytes(serde: SerializerProtocol, metadata: Mapping[str, Any]) -> Typed:
    return _plain(serde, _canonical({k: v for k, v in metadata.items() if k != AUDIT_KEY}))


def _fingerprint(task_id: str, idx: int) -> str:
    h = hashlib.sha256()
    _frame(h, task_id, str(idx))
    return h.hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class _Write:
    order: tuple[str, str, int]
    fingerprint: str
    digest: bytes


def _write(row: WriteRow) -> _Write:
    h = hashlib.sha256()
    _frame(h, row.task_path, row.task_id, str(row.idx), row.channel, row.type, bytes(row.data))
    return _Write(codec.writes_order(row), _fingerprint(row.task_id, row.idx), h.digest())


Ids = tuple[str, str, str, "str | None"]
"""(thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id) of a checkpoint."""


def content_hash(
    ids: Ids,
    prev: str,
    header: Typed,
    metadata: Typed,
    channels: Mapping[str, _Digest | None],
    writes: Sequence[_Write],
) -> str:
    """The hash of one checkpoint (see the module docstring)."""
    tid, ns, cid, parent = ids
    h = hashlib.sha256(_DOMAIN)
    _frame(h, tid, ns, cid, parent or "", prev, header[0], bytes(header[1]), *metadata)
    held = sorted((ch, d.digest) for ch, d in channels.items() if d is not None)
    h.update(len(held).to_bytes(8, "big"))
    for ch, digest in held:
        _frame(h, ch, digest)
    h.update(len(writes).to_bytes(8, "big"))
    for w in writes:
        _frame(h, w.digest)
    return h.hexdigest()


def _record_of(metadata: Mapping[str, Any]) -> dict[str, Any] | None:
    """The audit record if well-formed, else None."""
    rec = metadata.get(AUDIT_KEY)
    if (
        isinstance(rec, dict)
        and rec.get("v") == AUDIT_VERSION
        and isinstance(rec.get("hash"), str)
        and isinstance(rec.get("prev"), str)
        and isinstance(rec.get("writes"), list)
        and all(isinstance(w, str) for w in rec["writes"])
    ):
        return rec
    return None


def _stored_hash(serde: SerializerProtocol, row: CheckpointRow | None) -> str:
    """A stored checkpoint's audit hash ("" when missing, unhashed or unreadable)."""
    if row is None:
        return ""
    try:
        md = codec.decode_metadata(serde, row.metadata, f"checkpoint {row.checkpoint_id!r}")
    except CheckpointerError:
        return ""
    rec = _record_of(md)
    return "" if rec is None else str(rec["hash"])


def _parents_first(rows: Sequence[CheckpointRow]) -> list[CheckpointRow]:
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


# -- the put side -------------------------------------------------------------------------------


class _Lru(Generic[K, V]):
    def __init__(self, size: int) -> None:
        self.size = size
        self.items: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        found = self.items.get(key)
        if found is not None:
            self.items.move_to_end(key)
        return found

    def put(self, key: K, value: V) -> None:
        self.items[key] = value
        self.items.move_to_end(key)
        while len(self.items) > self.size:
            self.items.popitem(last=False)


@dataclass(slots=True)
class _WritesRecord:
    """The pending writes of one checkpoint that this checkpointer stored."""

    ours: bool = False
    """This checkpointer stored the checkpoint itself, and had not stored it before: nobody else
    knew its id while its writes were recorded (writes may come before the put: LangGraph runs
    the next step while the put is pending)."""
    writes: dict[tuple[str, int], _Write] = field(default_factory=dict)
    """Those with an index >= 0, by (task id, index)."""


_NO_VALUE = _Digest(b"")  # cached: the version holds no value


@dataclass(frozen=True, slots=True)
class Sealed:
    """An audit record for a checkpoint about to be stored, and what to remember once it is."""

    record: dict[str, Any]
    key: tuple[str, str, str]
    digests: dict[tuple[str, str, str, str], _Digest | None]


class Auditor:
    """The put side of the audit trail, with its per-process caches (thread-safe)."""

    def __init__(self, store: Store, size: int = 8192) -> None:
        self._store = store
        self._guard = threading.Lock()
        self._hashes: _Lru[tuple[str, str, str], str] = _Lru(size)
        self._digests: _Lru[tuple[str, str, str, str], _Digest] = _Lru(size)
        self._writes: _Lru[tuple[str, str, str], _WritesRecord] = _Lru(size // 4)
        # Writes of a checkpoint being stored now, and puts of its child waiting for them.
        self._pending: dict[tuple[str, str, str], list[concurrent.futures.Future[None]]] = {}
        self._counts: dict[tuple[str, str, str], int] = {}

    async def seal(
        self,
        serde: SerializerProtocol,
        ids: Ids,
        header: Typed,
        metadata: Mapping[str, Any],
        checkpoint: Mapping[str, Any],
        new_versions: Mapping[str, str],
        blobs: Sequence[BlobRow],
    ) -> Sealed:
        """The audit record of a checkpoint about to be stored (as `header`, with `blobs`);
        `new_versions`: channel -> version key of the values written at this step."""
        tid, ns, cid, parent = ids
        key = (tid, ns, cid)
        values: Mapping[str, Any] = checkpoint["channel_values"]
        reads = codec.blob_keys(checkpoint["channel_versions"])
        with self._guard:
            rec = self._writes.get(key)
            if rec is None:
                self._writes.put(key, _WritesRecord(ours=True))
            elif self._hashes.get(key) is None:
                rec.ours = True
        written = {b.channel: b for b in blobs}
        digests: dict[str, _Digest | None] = {}
        learned: dict[tuple[str, str, str, str], _Digest | None] = {}
        unknown: list[tuple[str, str]] = []
        for ch, vkey in reads.items():
            blob = written.get(ch)
            if blob is not None and blob.version == vkey:
                digests[ch] = learned[(tid, ns, ch, vkey)] = await self._written(
                    serde, tid, ns, blob, values.get(ch)
                )
            elif ch not in written and new_versions.get(ch) == vkey:
                digests[ch] = learned[(tid, ns, ch, vkey)] = None  # emptied at this version
            else:
                with self._guard:
                    hit = self._digests.get((tid, ns, ch, vkey))
                if hit is None:
                    unknown.append((ch, vkey))
                else:
                    digests[ch] = None if hit is _NO_VALUE else hit
        if unknown:
            memo = await self._read_digests(serde, tid, ns, unknown)
            for (ch, vkey), d in memo.items():
                learned[(tid, ns, ch, vkey)] = d
            for ch, vkey in unknown:
                digests[ch] = memo.get((ch, vkey))
        prev, covered = await self._parent(serde, tid, ns, parent)
        record = {
            "v": AUDIT_VERSION,
            "hash": content_hash(ids, prev, header, _metadata_bytes(serde, metadata), digests, covered),
            "prev": prev,
            "writes": [w.fingerprint for w in covered],
        }
        return Sealed(record, key, learned)

    async def _written(
        self, serde: SerializerProtocol, tid: str, ns: str, blob: BlobRow, value: Any
    ) -> _Digest:
        """The digest of a value stored now: from its row, or its delta on the base's."""
        if blob.base_version is None:
            return _value_digest((blob.type, blob.data))
        with self._guard:
            base = self._digests.get((tid, ns, blob.channel, blob.base_version))
        if base is None:
            memo = await self._read_digests(serde, tid, ns, [(blob.channel, blob.base_version)])
            base = memo.get((blob.channel, blob.base_version))
        found = _extend(base, (blob.type, blob.data))
        return found if found is not None else _value_digest(_plain(serde, codec.decoded(value)))

    async def _read_digests(
        self, serde: SerializerProtocol, tid: str, ns: str, keys: Collection[tuple[str, str]]
    ) -> dict[tuple[str, str], _Digest | None]:
        rows = await self._store.read_blobs(tid, ns, keys)
        memo: dict[tuple[str, str], _Digest | None] = {}
        _stored_digests(serde, rows, keys, memo)
        return memo

    async def _parent(
        self, serde: SerializerProtocol, tid: str, ns: str, parent: str | None
    ) -> tuple[str, list[_Write]]:
        """The parent's hash and the writes of it to cover: remembered, or read."""
        if not parent:
            return "", []
        key = (tid, ns, parent)
        await self._settled(key)
        with self._guard:
            prev = self._hashes.get(key)
            rec = self._writes.items.pop(key, None)
        if prev is None:
            prev = _stored_hash(serde, await self._store.read_checkpoint(tid, ns, parent))
        if rec is not None and rec.ours:
            return prev, sorted(rec.writes.values(), key=lambda w: w.order)
        stored = await self._store.read_writes(tid, ns, [parent])
        kept = (_write(w) for w in stored.get(parent, []) if w.idx >= 0)
        return prev, sorted(kept, key=lambda w: w.order)

    async def reseal(
        self, serde: SerializerProtocol, rows: Sequence[CheckpointRow]
    ) -> list[tuple[CheckpointRow, dict[str, Any]]]:
        """Audit records for stored checkpoints of one thread (a copy of another thread, whose
        records name the source's id), parents first, from the stored rows alone (the caches
        are neither used nor changed)."""
        by_ns: dict[str, list[CheckpointRow]] = defaultdict(list)
        for row in rows:
            by_ns[row.checkpoint_ns].append(row)
        out: list[tuple[CheckpointRow, dict[str, Any]]] = []
        for ns, ns_rows in by_ns.items():
            out += await self._reseal_ns(serde, ns, _parents_first(ns_rows))
        return out

    async def _reseal_ns(
        self, serde: SerializerProtocol, ns: str, rows: list[CheckpointRow]
    ) -> list[tuple[CheckpointRow, dict[str, Any]]]:
        tid = rows[0].thread_id
        reads = {r.checkpoint_id: codec.blob_keys(codec.decode_header(
            serde, r.checkpoint, f"checkpoint {r.checkpoint_id!r}")["channel_versions"])
            for r in rows}
        keys = {key for rd in reads.values() for key in rd.items()}
        memo: dict[tuple[str, str], _Digest | None] = {}
        if keys:
            _stored_digests(serde, await self._store.read_blobs(tid, ns, keys), keys, memo)
        parents = {r.parent_checkpoint_id for r in rows if r.parent_checkpoint_id}
        stored = await self._store.read_writes(tid, ns, parents) if parents else {}
        hashes: dict[str, str] = {}
        out = []
        for row in rows:
            parent = row.parent_checkpoint_id
            prev = hashes.get(parent or "", "")
            covered = sorted((_write(w) for w in stored.get(parent or "", []) if w.idx >= 0),
                             key=lambda w: w.order)
            md = codec.decode_metadata(serde, row.metadata, f"checkpoint {row.checkpoint_id!r}")
            channels = {ch: memo.get((ch, v)) for ch, v in reads[row.checkpoint_id].items()}
            found = content_hash((tid, ns, row.checkpoint_id, parent), prev, row.checkpoint,
                                 _metadata_bytes(serde, md), channels, covered)
            hashes[row.checkpoint_id] = found
            out.append((row, {"v": AUDIT_VERSION, "hash": found, "prev": prev,
                              "writes": [w.fingerprint for w in covered]}))
        return out

    def stored(self, sealed: Sealed) -> None:
        """The sealed checkpoint is stored: remember its hash and the digests learned."""
        with self._guard:
            self._hashes.put(sealed.key, str(sealed.record["hash"]))
            for k, d in sealed.digests.items():
                self._digests.put(k, _NO_VALUE if d is None else d)

    async def _settled(self, key: tuple[str, str, str]) -> None:
        """Wait for the writes of a checkpoint this process is storing now: LangGraph stores a
        step's writes and the next checkpoint concurrently."""
        with self._guard:
            if not self._counts.get(key):
                return
            done: concurrent.futures.Future[None] = concurrent.futures.Future()
            self._pending.setdefault(key, []).append(done)
        try:
            if self._store.inline:  # those writes never suspend: they run in other threads
                done.result(_WAIT)
            else:
                await asyncio.wait_for(asyncio.wrap_future(done), _WAIT)
        except (TimeoutError, asyncio.TimeoutError, concurrent.futures.TimeoutError):
            pass  # those writes are then not covered, which is safe

    @contextlib.contextmanager
    def writing(self, rows: Sequence[WriteRow]) -> Iterator[None]:
        """Around storing pending writes (enter before the first suspension): the child's put
        waits for them, and records them once stored."""
        keys = {(r.thread_id, r.checkpoint_ns, r.checkpoint_id) for r in rows}
        with self._guard:
            for key in keys:
                self._counts[key] = self._counts.get(key, 0) + 1
        try:
            yield
            self._wrote(rows)
        finally:
            with self._guard:
                for key in keys:
                    self._counts[key] -= 1
                    if not self._counts[key]:
                        del self._counts[key]
                        for done in self._pending.pop(key, ()):
                            if not done.done():  # a waiter that timed out cancelled its own
                                done.set_result(None)

    def _wrote(self, rows: Sequence[WriteRow]) -> None:
        """Pending writes are stored: one with an index >= 0 kept a row already there (the
        first recorded), one < 0 (never covered) replaced it."""
        groups: dict[tuple[str, str, str], list[WriteRow]] = defaultdict(list)
        for r in rows:
            if r.idx >= 0:
                groups[(r.thread_id, r.checkpoint_ns, r.checkpoint_id)].append(r)
        for key, group in groups.items():
            made = [(r, _write(r)) for r in group]
            with self._guard:
                rec = self._writes.get(key)
                if rec is None:
                    rec = _WritesRecord()
                    self._writes.put(key, rec)
                for r, w in made:
                    rec.writes.setdefault((r.task_id, r.idx), w)


# -- the verify side ------------------------------------------------------------------------------


@dataclass(frozen=True)
class AuditProblem:
    """One checkpoint that does not verify."""

    kind: str
    """`altered`, `missing_parent`, `broken_link` or `unhashed` (constants of this module)."""
    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str
    detail: str

    def __str__(self) -> str:
        ns = f" [{self.checkpoint_ns}]" if self.checkpoint_ns else ""
        return f"{self.kind}: checkpoint {self.checkpoint_id}{ns}: {self.detail}"


@dataclass(frozen=True)
class AuditReport:
    """The outcome of `verify`: problems ordered by checkpoint (oldest first)."""

    thread_id: str
    checked: int
    """Checkpoints examined (every namespace)."""
    problems: list[AuditProblem]
    switches: list[AuditSwitch] = field(default_factory=list)
    """The store's audit log (`AuditStatus.log`): where sealing began and where it stops."""

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def first(self) -> AuditProblem | None:
        """The oldest checkpoint's problem (where tampering shows first), or None."""
        return self.problems[0] if self.problems else None

    def __str__(self) -> str:
        head = f"audit of thread {self.thread_id!r}: {self.checked} checkpoint(s) checked"
        if self.ok:
            return f"{head}, intact"
        lines = [f"{head}, {len(self.problems)} problem(s), oldest first:"]
        lines += [f"  {p}" for p in self.problems[:20]]
        if len(self.problems) > 20:
            lines.append(f"  ... and {len(self.problems) - 20} more")
        lines += [f"  the store's audit was turned off at {_when(s.at)} ({s.reason}): "
                  "checkpoints stored after it are not sealed"
                  for s in self.switches if not s.enabled]
        return "\n".join(lines)


@dataclass(frozen=True)
class AuditStatus:
    """Whether a store is audited (`StoreCheckpointer.audit_status`), and its audit log."""

    enabled: bool
    log: list[AuditSwitch]
    """Each time auditing was turned on or off, oldest first (the newest is in force)."""

    @property
    def turned_off(self) -> list[AuditSwitch]:
        """The explicit turn-offs: where the trail stops being sealed."""
        return [s for s in self.log if not s.enabled]

    def __str__(self) -> str:
        head = "audit: on" if self.enabled else "audit: off"
        return "\n".join([head, *(f"  {_when(s.at)} {'on ' if s.enabled else 'off'} {s.reason}"
                                  for s in self.log)])


def _when(at: float) -> str:
    return dt.datetime.fromtimestamp(at, dt.timezone.utc).isoformat(timespec="seconds")


def _epoch(ts: Any) -> float | None:
    try:
        return dt.datetime.fromisoformat(str(ts)).timestamp()
    except ValueError:
        return None


def _unhashed(ts: Any, switches: Sequence[AuditSwitch]) -> str:
    """Why a checkpoint has no audit record, as far as the store's audit log tells."""
    at = _epoch(ts)
    before = [s for s in switches if at is not None and s.at <= at]
    if not switches or at is None:
        return "it has no audit hash (written with audit off)"
    if not before:
        return ("it has no audit hash (written with audit off, before the store's audit was "
                f"turned on at {_when(switches[0].at)})")
    if not before[-1].enabled:
        return ("it has no audit hash (written with audit off: the store's audit was turned "
                f"off at {_when(before[-1].at)}: {before[-1].reason})")
    return ("it has no audit hash, though the store was audited when it was stored (since "
            f"{_when(before[-1].at)}): by a checkpointer that had not read the setting yet, "
            "or its record was removed")


async def verify_thread(store: Store, serde: SerializerProtocol, thread_id: str) -> AuditReport:
    """Recompute every checkpoint's hash of a thread from what is stored (no cache, no schema
    upgrade) and check each link to its parent."""
    rows = [r async for r in store.iter_checkpoints(ListQuery(thread_id=thread_id))]
    if not rows:
        raise ThreadNotFoundError(f"thread {thread_id!r} has no stored checkpoint to verify")
    by_ns: dict[str, list[CheckpointRow]] = defaultdict(list)
    for r in rows:
        by_ns[r.checkpoint_ns].append(r)
    switches = await store.read_audit_log()
    problems: list[AuditProblem] = []
    for ns, ns_rows in by_ns.items():
        problems += await _verify_ns(store, serde, thread_id, ns, ns_rows, switches)
    problems.sort(key=lambda p: (p.checkpoint_id, p.checkpoint_ns, _RANK[p.kind]))
    return AuditReport(thread_id, len(rows), problems, switches)


async def _verify_ns(
    store: Store,
    serde: SerializerProtocol,
    thread_id: str,
    ns: str,
    rows: list[CheckpointRow],
    switches: Sequence[AuditSwitch] = (),
) -> list[AuditProblem]:
    rows.sort(key=lambda r: r.checkpoint_id)
    by_id = {r.checkpoint_id: r for r in rows}
    problems: list[AuditProblem] = []

    def problem(row: CheckpointRow, kind: str, detail: str) -> None:
        problems.append(AuditProblem(kind, thread_id, ns, row.checkpoint_id, detail))

    memo: dict[tuple[str, str], _Digest | None] = {}
    for start in range(0, len(rows), _PAGE):
        page = rows[start : start + _PAGE]
        checks: list[tuple[CheckpointRow, dict[str, Any], Mapping[str, Any], dict[str, str]]] = []
        for row in page:
            what = f"checkpoint {row.checkpoint_id!r}"
            try:
                md: Mapping[str, Any] = codec.decode_metadata(serde, row.metadata, what)
                header = codec.decode_header(serde, row.checkpoint, what)
                reads = codec.blob_keys(header["channel_versions"])
            except CheckpointerError as exc:
                problem(row, ALTERED, f"its stored record cannot be decoded ({exc})")
                continue
            rec = _record_of(md)
            if rec is None:
                if AUDIT_KEY in md:
                    problem(row, ALTERED, "its audit record is malformed")
                else:
                    problem(row, UNHASHED, _unhashed(header.get("ts"), switches))
                continue
            checks.append((row, rec, md, reads))
        keys = {(ch, v) for *_, reads in checks for ch, v in reads.items()} - memo.keys()
        if keys:
            _stored_digests(serde, await store.read_blobs(thread_id, ns, keys), keys, memo)
        parents = {r.parent_checkpoint_id for r, *_ in checks if r.parent_checkpoint_id}
        read = await store.read_writes(thread_id, ns, parents) if parents else {}
        writes = {cid: {w.fingerprint: w for w in map(_write, ws)} for cid, ws in read.items()}
        for row, rec, md, reads in checks:
            parent = row.parent_checkpoint_id
            if parent and parent not in by_id:
                problem(row, MISSING_PARENT, f"its parent checkpoint {parent} is not stored "
                        "(deleted)")
            stored = writes.get(parent or "", {})
            covered = [stored[f] for f in rec["writes"] if f in stored]
            channels = {ch: memo.get((ch, v)) for ch, v in reads.items()}
            ids = (thread_id, ns, row.checkpoint_id, parent)
            found = content_hash(
                ids, rec["prev"], row.checkpoint, _metadata_bytes(serde, md), channels, covered
            )
            if found != rec["hash"]:
                lost = len(rec["writes"]) - len(covered)
                also = f"; {lost} pending write(s) of its parent that it covers are gone" if lost else ""
                problem(row, ALTERED, "its stored content (channel values, checkpoint record, "
                        f"metadata or its parent's pending writes) does not match its hash{also}")
            if parent in by_id:
                expected = _stored_hash(serde, by_id[parent])
                if rec["prev"] != expected:
                    problem(row, BROKEN_LINK, f"it follows a parent hashed {rec['prev'][:16] or '-'}"
                            f"..., but its stored parent {parent} is hashed "
                            f"{expected[:16] or '-'}... (replaced)")
            elif not parent and rec["prev"]:
                problem(row, BROKEN_LINK, "it has no parent, but its audit record names one")
    return problems


__all__ = [
    "ALTERED",
    "AUDIT_KEY",
    "BROKEN_LINK",
    "MISSING_PARENT",
    "UNHASHED",
    "AuditProblem",
    "AuditReport",
    "AuditStatus",
    "Auditor",
    "content_hash",
    "verify_thread",
]
