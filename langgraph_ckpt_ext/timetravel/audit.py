"""Verifying a thread's tamper-evident audit trail (the records, and how every put seals them,
are `langgraph_ckpt_ext.core.audit`'s).

`verify` recomputes each hash from the stored rows alone (no cache, no schema upgrade) and
reports, oldest first: `altered` (content does not match the hash), `missing_parent` (the
parent was deleted; its child is reported), `broken_link` (`prev` is not the parent's stored
hash: the parent was replaced) and `unhashed` (written with audit off).

Keyed trails (`audit_keys=`): a record sealed with a key (v2) is checked under the key its id
names, taken from the verifying checkpointer's `audit_keys`; `unknown_key` when the provider
has no key of that id (retired, or the record was forged under another key) or no keys are
given. With keys given, an unkeyed record (v1, a plain sha256 that anyone with write access
can recompute after rewriting the content, e.g. by deleting a thread and writing it again with
`audit=True`) is reported `unkeyed`: it proves nothing against such a writer. Rotation: the
provider's current key seals new records; older ones verify while it still holds their ids.

What breaks a chain without tampering: an eager schema migration (`migrate_threads`) rewrites
checkpoints, which then verify as altered (they are not re-hashed); pruning or deleting runs
leaves the oldest kept checkpoint with a missing parent. A copied thread (`copy_thread`) is
bound to the source's thread id: in an audited store it is sealed again under its own
(`Auditor.reseal`, with the copying checkpointer's current audit key). An unhashed checkpoint
is reported with what the store's audit log says of its time: before auditing was turned on,
after it was turned off (when, why), or while it was on.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..core import codec
from ..core.access import StoredRows
from ..core.audit import AUDIT_KEY, Auditor, AuditStatus, content_hash
from ..core.audit.digest import (
    KEYED_VERSION,
    Digest,
    metadata_bytes,
    record_of,
    stored_digests,
    stored_hash,
    write_digest,
)
from ..core.audit.status import when
from ..core.errors import CheckpointerError, InvalidConfigError, ThreadNotFoundError, UnknownKeyError
from ..core.keys import KeyProvider
from ..core.retention import LifecycleEvent
from ..core.rows import AuditSwitch, CheckpointRow, ListQuery

ALTERED = "altered"
"""The stored content (values, record, metadata, covered writes) does not match the hash."""
MISSING_PARENT = "missing_parent"
"""The checkpoint's parent is not stored (deleted)."""
BROKEN_LINK = "broken_link"
"""`prev` is not the parent's stored hash (the parent was replaced)."""
UNHASHED = "unhashed"
"""No audit record (written with audit off)."""
UNKEYED = "unkeyed"
"""(Keys given) an unkeyed record: its hash matches, but anyone with write access could have
computed it, so it proves nothing against them."""
UNKNOWN_KEY = "unknown_key"
"""Sealed under a key id the audit keys do not hold (or no audit keys given): not checked."""
CUT = "cut"
"""The parent is not stored, and the store recorded cutting this thread's history (a sweep or a
prune of an audited store): a deletion on purpose, not tampering (`AuditReport.ok` holds)."""

RANK = {CUT: 0, UNHASHED: 0, UNKEYED: 0, UNKNOWN_KEY: 1, MISSING_PARENT: 1, ALTERED: 2,
        BROKEN_LINK: 3}
_SEVERITY = [ALTERED, BROKEN_LINK, MISSING_PARENT, UNKNOWN_KEY, UNKEYED, UNHASHED, CUT]
"""Problem kinds, the gravest first (`AuditReport.status`)."""
_PAGE = 32


@dataclass(frozen=True)
class AuditProblem:
    """One checkpoint that does not verify."""

    kind: str
    """`altered`, `missing_parent`, `broken_link`, `unhashed`, `unkeyed`, `unknown_key` or
    `cut` (constants of this module)."""
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
    deletions: list[LifecycleEvent] = field(default_factory=list)
    """What the store recorded deleting of this thread on purpose, oldest first: an erasure
    (then nothing is left to check, and `erased` is True), expiries and history cuts."""
    seals: dict[tuple[str, str], str | None] = field(default_factory=dict)
    """Each checkpoint examined, by (namespace, id): the audit key id its record is sealed
    under, "" for an unkeyed record, None for none (or one that cannot be read)."""
    keyed: bool = False
    """Audit keys were given: unkeyed records count as problems (`unkeyed`)."""

    @property
    def status(self) -> str:
        """The overall verdict: "intact" (`ok`), else the gravest problem kind found
        ("altered", "broken_link", "missing_parent", "unknown_key", "unkeyed", "unhashed")."""
        if self.ok:
            return "intact"
        kinds = {p.kind for p in self.problems}
        return next(k for k in _SEVERITY if k in kinds)

    def verdict(self, checkpoint_id: str, checkpoint_ns: str = "") -> str:
        """One checkpoint's verdict: "intact", or its gravest problem kind; KeyError for one
        not examined."""
        if (checkpoint_ns, checkpoint_id) not in self.seals:
            raise KeyError(checkpoint_id)
        kinds = {p.kind for p in self.problems
                 if (p.checkpoint_ns, p.checkpoint_id) == (checkpoint_ns, checkpoint_id)}
        return next((k for k in _SEVERITY if k in kinds), "intact")

    @property
    def key_ids(self) -> dict[str, int]:
        """Checkpoints sealed under each audit key id (unkeyed ones not counted)."""
        out: dict[str, int] = {}
        for kid in self.seals.values():
            if kid:
                out[kid] = out.get(kid, 0) + 1
        return out

    @property
    def erased(self) -> bool:
        """The thread is gone, and the store recorded erasing (or expiring) it."""
        return self.checked == 0 and any(e.action in ("erase", "expire") for e in self.deletions)

    @property
    def ok(self) -> bool:
        """No problem but the history cuts the store recorded."""
        return all(p.kind == CUT for p in self.problems)

    @property
    def first(self) -> AuditProblem | None:
        """The oldest checkpoint's problem (where tampering shows first), or None."""
        return self.problems[0] if self.problems else None

    def __str__(self) -> str:
        if self.erased:
            last = [e for e in self.deletions if e.action in ("erase", "expire")][-1]
            why = f" ({last.reason})" if last.reason else ""
            verb = "erased" if last.action == "erase" else "deleted by retention"
            return (f"audit of thread {self.thread_id!r}: {verb} at {when(last.at)}{why}, "
                    f"{last.checkpoints or 'its'} checkpoint(s) deleted on purpose, as recorded")
        head = f"audit of thread {self.thread_id!r}: {self.checked} checkpoint(s) checked"
        kids = self.key_ids
        sealed = (f", sealed under audit key(s) {', '.join(sorted(kids))}" if kids else
                  ", unkeyed (sha256: not proof against someone with write access)")
        if self.ok:
            cuts = [e for e in self.deletions if e.action == "trim"]
            if cuts:
                return (f"{head}, intact{sealed} (history cut on purpose {len(cuts)} time(s), "
                        f"last at {when(cuts[-1].at)})")
            return f"{head}, intact{sealed}"
        lines = [f"{head}, {len(self.problems)} problem(s), oldest first:"]
        lines += [f"  {p}" for p in self.problems[:20]]
        if len(self.problems) > 20:
            lines.append(f"  ... and {len(self.problems) - 20} more")
        lines += [f"  the store's audit was turned off at {when(s.at)} ({s.reason}): "
                  "checkpoints stored after it are not sealed"
                  for s in self.switches if not s.enabled]
        return "\n".join(lines)


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
                f"turned on at {when(switches[0].at)})")
    if not before[-1].enabled:
        return ("it has no audit hash (written with audit off: the store's audit was turned "
                f"off at {when(before[-1].at)}: {before[-1].reason})")
    return ("it has no audit hash, though the store was audited when it was stored (since "
            f"{when(before[-1].at)}): by a checkpointer that had not read the setting yet, "
            "or its record was removed")


async def verify_thread(
    stored: StoredRows, thread_id: str, keys: KeyProvider | None = None
) -> AuditReport:
    """Recompute every checkpoint's hash of a thread from what is stored (no cache, no schema
    upgrade) and check each link to its parent; `keys`: the audit keys that keyed records are
    checked under (given, unkeyed records are reported `unkeyed`)."""
    rows = [r async for r in stored.iter(ListQuery(thread_id=thread_id))]
    deletions = await stored.lifecycle(thread_id)
    switches = await stored.audit_log()
    if not rows:
        report = AuditReport(thread_id, 0, [], switches, deletions, keyed=keys is not None)
        if report.erased:
            return report
        raise ThreadNotFoundError(f"thread {thread_id!r} has no stored checkpoint to verify")
    by_ns: dict[str, list[CheckpointRow]] = defaultdict(list)
    for r in rows:
        by_ns[r.checkpoint_ns].append(r)
    problems: list[AuditProblem] = []
    cuts = [e.at for e in deletions if e.action == "trim"]
    seals: dict[tuple[str, str], str | None] = {}
    for ns, ns_rows in by_ns.items():
        problems += await _verify_ns(stored, thread_id, ns, ns_rows, switches, bool(cuts),
                                     keys, seals)
    if cuts:  # a parent gone by a recorded history cut was deleted on purpose
        problems = [AuditProblem(CUT, p.thread_id, p.checkpoint_ns, p.checkpoint_id,
                                 f"{p.detail}, by a history cut the store recorded "
                                 f"(last at {when(cuts[-1])})")
                    if p.kind == MISSING_PARENT else p for p in problems]
    problems.sort(key=lambda p: (p.checkpoint_id, p.checkpoint_ns, RANK[p.kind]))
    return AuditReport(thread_id, len(rows), problems, switches, deletions, seals,
                       keys is not None)


async def _verify_ns(
    source: StoredRows,
    thread_id: str,
    ns: str,
    rows: list[CheckpointRow],
    switches: Sequence[AuditSwitch] = (),
    cut: bool = False,
    audit_keys: KeyProvider | None = None,
    seals: dict[tuple[str, str], str | None] | None = None,
) -> list[AuditProblem]:
    """The problems of one namespace's checkpoints; `cut`: the store recorded cutting this
    thread's history (a checkpoint whose parent went with a cut, taking the pending writes
    its hash covers, cannot be checked, and is reported as cut); `seals` receives each row's
    key id (see `AuditReport.seals`)."""
    serde = source.serde
    rows.sort(key=lambda r: r.checkpoint_id)
    by_id = {r.checkpoint_id: r for r in rows}
    problems: list[AuditProblem] = []

    def problem(row: CheckpointRow, kind: str, detail: str) -> None:
        problems.append(AuditProblem(kind, thread_id, ns, row.checkpoint_id, detail))

    seals = {} if seals is None else seals

    memo: dict[tuple[str, str], Digest | None] = {}
    for start in range(0, len(rows), _PAGE):
        page = rows[start : start + _PAGE]
        checks: list[tuple[CheckpointRow, dict[str, Any], Mapping[str, Any], dict[str, str]]] = []
        for row in page:
            seals[(ns, row.checkpoint_id)] = None
            what = f"checkpoint {row.checkpoint_id!r}"
            try:
                md: Mapping[str, Any] = codec.decode_metadata(serde, row.metadata, what)
                header = codec.decode_header(serde, row.checkpoint, what)
                reads = codec.blob_keys(header["channel_versions"])
            except CheckpointerError as exc:
                problem(row, ALTERED, f"its stored record cannot be decoded ({exc})")
                continue
            rec = record_of(md)
            if rec is None:
                if AUDIT_KEY in md:
                    problem(row, ALTERED, "its audit record is malformed")
                else:
                    problem(row, UNHASHED, _unhashed(header.get("ts"), switches))
                continue
            seals[(ns, row.checkpoint_id)] = rec["kid"] if rec["v"] == KEYED_VERSION else ""
            checks.append((row, rec, md, reads))
        keys = {(ch, v) for *_, reads in checks for ch, v in reads.items()} - memo.keys()
        if keys:
            stored_digests(serde, await source.read_blobs(thread_id, ns, keys), keys, memo)
        parents = {r.parent_checkpoint_id for r, *_ in checks if r.parent_checkpoint_id}
        read = await source.read_writes(thread_id, ns, parents) if parents else {}
        writes = {cid: {w.fingerprint: w for w in map(write_digest, ws)} for cid, ws in read.items()}
        for row, rec, md, reads in checks:
            parent = row.parent_checkpoint_id
            if parent and parent not in by_id:
                problem(row, MISSING_PARENT, f"its parent checkpoint {parent} is not stored "
                        "(deleted)")
            stored = writes.get(parent or "", {})
            covered = [stored[f] for f in rec["writes"] if f in stored]
            channels = {ch: memo.get((ch, v)) for ch, v in reads.items()}
            ids = (thread_id, ns, row.checkpoint_id, parent)
            key, refused = _seal_key(rec, audit_keys)
            found = rec["hash"]  # a seal that cannot be checked is not reported altered
            if refused is not None:
                problem(row, UNKNOWN_KEY, refused)
            else:
                found = content_hash(ids, rec["prev"], row.checkpoint, metadata_bytes(serde, md),
                                     channels, covered, key)
            lost = len(rec["writes"]) - len(covered)
            if found == rec["hash"] and audit_keys is not None and key is None and refused is None:
                problem(row, UNKEYED, "its audit record is unkeyed (a sha256 anyone can "
                        "compute): not proof against someone with write access, who can "
                        "rewrite the content and its record alike")
            if found != rec["hash"] and cut and lost and parent and parent not in by_id:
                problem(row, CUT, f"its parent {parent} went with a recorded history cut, "
                        f"with {lost} pending write(s) its hash covers: its content cannot be "
                        "checked against its hash")
            elif found != rec["hash"]:
                also = f"; {lost} pending write(s) of its parent that it covers are gone" if lost else ""
                problem(row, ALTERED, "its stored content (channel values, checkpoint record, "
                        f"metadata or its parent's pending writes) does not match its hash{also}")
            if parent in by_id:
                expected = stored_hash(serde, by_id[parent])
                if rec["prev"] != expected:
                    problem(row, BROKEN_LINK, f"it follows a parent hashed {rec['prev'][:16] or '-'}"
                            f"..., but its stored parent {parent} is hashed "
                            f"{expected[:16] or '-'}... (replaced)")
            elif not parent and rec["prev"]:
                problem(row, BROKEN_LINK, "it has no parent, but its audit record names one")
    return problems


def _seal_key(rec: Mapping[str, Any], keys: KeyProvider | None) -> tuple[bytes | None, str | None]:
    """The key a record is checked under (None: an unkeyed record), or why it cannot be."""
    if rec["v"] != KEYED_VERSION:
        return None, None
    kid = rec["kid"]
    if keys is None:
        return None, (f"sealed under audit key {kid!r}, but no audit keys are given "
                      "(audit_keys=...; the CLI reads $LGCKPT_AUDIT_KEYS): not checked")
    try:
        return keys.key(kid), None
    except (UnknownKeyError, InvalidConfigError):
        return None, (f"sealed under audit key {kid!r}, which the audit keys do not hold "
                      "(retired, or sealed by someone else's key): not checked")


__all__ = [
    "ALTERED",
    "AUDIT_KEY",
    "BROKEN_LINK",
    "CUT",
    "MISSING_PARENT",
    "UNHASHED",
    "UNKEYED",
    "UNKNOWN_KEY",
    "AuditProblem",
    "AuditReport",
    "AuditStatus",
    "Auditor",
    "content_hash",
    "verify_thread",
]
