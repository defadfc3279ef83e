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

or, sealed with a key (a checkpointer given `audit_keys=`, a `KeyProvider`):

    {"v": 2, "kid": "<key id>", "hash": "<hex>", "prev": ..., "writes": ...}

where "hash" is an HMAC-SHA256 over the same content under the audit key `kid` names (the
provider's `current(None)` when sealed). An unkeyed v1 record only shows changes made by
someone who cannot also write the records: whoever can write the database can rewrite a
message, delete the thread and write it again with `audit=True`, and its v1 chain is whole. A
v2 chain cannot be forged without the key; `verify` given the keys reports unkeyed records and
records under key ids it does not hold. Audit keys are separate from the encryption keys
(rotate them independently); what is hashed is the plaintext, so a trail verifies the same
on an encrypted store.

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

To save reads, a checkpointer remembers (bounded, per process) the hashes and value digests of
what it stored, and the writes it stored for each checkpoint; a value not remembered is read
back from the store. The writes remembered stand for the parent's only if this checkpointer
stored the parent itself, first (nobody else knew its id while they were recorded; an index
>= 0 keeps a row already there, which is then this one); otherwise the child's put reads the
parent's writes (and, if not remembered, its hash) from the store. Not detected as a conflict:
another process running the very same task of the same checkpoint at the same time.

`langgraph_ckpt_ext.timetravel.audit` verifies a thread against these records (`verify`).
"""

from .digest import AUDIT_KEY, AUDIT_VERSION, KEYED_VERSION, content_hash
from .seal import Auditor, Sealed
from .status import AuditStatus

__all__ = ["AUDIT_KEY", "AUDIT_VERSION", "KEYED_VERSION", "AuditStatus", "Auditor", "Sealed",
           "content_hash"]
