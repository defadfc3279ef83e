"""SQL of the SQLite backend, as named constants. Values are always bound parameters; the only
text ever generated is a run of `?` placeholders sized by a count (and `many`'s run of a
constant statement's rows)."""

from __future__ import annotations

import functools

CHECKPOINT_COLS = (
    "thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, run_id, "
    "type, checkpoint, metadata_type, metadata"
)

CREATE_MIGRATIONS = """
CREATE TABLE IF NOT EXISTS lgx_migrations (
    version INTEGER PRIMARY KEY,
    applied_at TEXT NOT NULL
)"""
SELECT_STORAGE_VERSION = "SELECT COALESCE(MAX(version), 0) FROM lgx_migrations"
MIGRATIONS_TABLE_EXISTS = (
    "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'lgx_migrations'"
)
INSERT_MIGRATION = "INSERT INTO lgx_migrations (version, applied_at) VALUES (?, ?)"

# The store's audit log (`read_audit_log`, `log_audit_switch`): the newest row is in force.
SELECT_AUDIT_LOG = "SELECT enabled, at, reason FROM lgx_audit_log ORDER BY seq"
SELECT_AUDIT_LAST = "SELECT enabled, at, reason FROM lgx_audit_log ORDER BY seq DESC LIMIT 1"
INSERT_AUDIT_SWITCH = "INSERT INTO lgx_audit_log (enabled, at, reason) VALUES (?, ?, ?)"
AUDIT_LOG_EXISTS = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'lgx_audit_log'"

UPSERT_CHECKPOINT = f"""
INSERT OR REPLACE INTO lgx_checkpoints ({CHECKPOINT_COLS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"""

UPSERT_BLOB = """
INSERT OR REPLACE INTO lgx_blobs
    (thread_id, checkpoint_ns, channel, version, type, data, base_version)
VALUES (?, ?, ?, ?, ?, ?, NULL)"""

# An append-delta lands only on top of an existing base row; the caller checks the row count.
INSERT_DELTA_IF_BASE = """
INSERT OR REPLACE INTO lgx_blobs
    (thread_id, checkpoint_ns, channel, version, type, data, base_version)
SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7
WHERE EXISTS (
    SELECT 1 FROM lgx_blobs
    WHERE thread_id = ?1 AND checkpoint_ns = ?2 AND channel = ?3 AND version = ?7
)"""

INSERT_WRITE_KEEP = """
INSERT OR IGNORE INTO lgx_writes
    (thread_id, checkpoint_ns, checkpoint_id, task_id, idx, channel, type, data, task_path)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"""
INSERT_WRITE_REPLACE = INSERT_WRITE_KEEP.replace("INSERT OR IGNORE", "INSERT OR REPLACE")


@functools.lru_cache(maxsize=256)
def many(statement: str, rows: int) -> str:
    """`statement`, an INSERT of one row (`... VALUES (...)`), for `rows` rows at once: the
    rows go in order, as `executemany` would take them."""
    head, row = statement.rsplit("VALUES ", 1)
    return f"{head}VALUES {', '.join([row] * rows)}"

SELECT_CHECKPOINT = f"""
SELECT {CHECKPOINT_COLS} FROM lgx_checkpoints
WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ?"""
SELECT_LATEST_CHECKPOINT = f"""
SELECT {CHECKPOINT_COLS} FROM lgx_checkpoints
WHERE thread_id = ? AND checkpoint_ns = ?
ORDER BY checkpoint_id DESC LIMIT 1"""

# The parent chain from one checkpoint, nearest first, at most ?4 rows.
SELECT_ANCESTORS = f"""
WITH RECURSIVE chain(id, n) AS (
    SELECT ?3, 0
    UNION ALL
    SELECT c.parent_checkpoint_id, chain.n + 1
    FROM lgx_checkpoints c JOIN chain
      ON c.thread_id = ?1 AND c.checkpoint_ns = ?2 AND c.checkpoint_id = chain.id
    WHERE c.parent_checkpoint_id IS NOT NULL AND chain.n + 1 < ?4
)
SELECT {", ".join("c." + col.strip() for col in CHECKPOINT_COLS.split(","))}
FROM chain JOIN lgx_checkpoints c
  ON c.thread_id = ?1 AND c.checkpoint_ns = ?2 AND c.checkpoint_id = chain.id
ORDER BY chain.n"""


def select_blobs(n_keys: int) -> str:
    """Blob rows for n (channel, version) keys (params 3..), plus the bases their deltas need."""
    values = ", ".join(f"(?{3 + 2 * i}, ?{4 + 2 * i})" for i in range(n_keys))
    return f"""
WITH RECURSIVE need(channel, version) AS (
    VALUES {values}
    UNION
    SELECT b.channel, b.base_version FROM lgx_blobs b JOIN need
      ON b.thread_id = ?1 AND b.checkpoint_ns = ?2
     AND b.channel = need.channel AND b.version = need.version
    WHERE b.base_version IS NOT NULL
)
SELECT b.channel, b.version, b.type, b.data, b.base_version
FROM need JOIN lgx_blobs b
  ON b.thread_id = ?1 AND b.checkpoint_ns = ?2
 AND b.channel = need.channel AND b.version = need.version"""


def select_writes(n_ids: int, n_channels: int) -> str:
    ids = ", ".join(["?"] * n_ids)
    only = f" AND channel IN ({', '.join(['?'] * n_channels)})" if n_channels else ""
    return f"""
SELECT thread_id, checkpoint_ns, checkpoint_id, task_id, idx, channel, type, data, task_path
FROM lgx_writes
WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id IN ({ids}){only}
ORDER BY checkpoint_id, task_path, task_id, idx"""


def select_checkpoints(
    *, thread: bool, ns: bool, checkpoint_id: bool, before: bool, after_cursor: bool
) -> str:
    """A page of `list`: each flag adds one fixed condition with its bound parameter(s)."""
    where = []
    if thread:
        where.append("thread_id = ?")
    if ns:
        where.append("checkpoint_ns = ?")
    if checkpoint_id:
        where.append("checkpoint_id = ?")
    if before:
        where.append("checkpoint_id < ?")
    if after_cursor:
        where.append("(checkpoint_id, checkpoint_ns, thread_id) < (?, ?, ?)")
    clause = f"WHERE {' AND '.join(where)}" if where else ""
    return f"""
SELECT {CHECKPOINT_COLS} FROM lgx_checkpoints {clause}
ORDER BY checkpoint_id DESC, checkpoint_ns DESC, thread_id DESC LIMIT ?"""


def select_runs(n: int) -> str:
    return f"""
SELECT thread_id, checkpoint_ns, checkpoint_id FROM lgx_checkpoints
WHERE run_id IN ({", ".join(["?"] * n)})"""


# Every row of a thread, its lease included (its tombstone, if any, is left after these).
DELETE_THREAD = [
    "DELETE FROM lgx_checkpoints WHERE thread_id = ?",
    "DELETE FROM lgx_blobs WHERE thread_id = ?",
    "DELETE FROM lgx_writes WHERE thread_id = ?",
    "DELETE FROM lgx_schema_log WHERE thread_id = ?",
    "DELETE FROM lgx_threads WHERE thread_id = ?",
    "DELETE FROM lgx_leases WHERE thread_id = ?",
]

# The schema log (`lgx_schema_log`) is not copied: it records what happened to the source
# thread's rows, not to the copy's.
COPY_THREAD = [
    f"""INSERT OR IGNORE INTO lgx_checkpoints ({CHECKPOINT_COLS})
    SELECT ?, checkpoint_ns, checkpoint_id, parent_checkpoint_id, run_id,
           type, checkpoint, metadata_type, metadata
    FROM lgx_checkpoints WHERE thread_id = ?""",
    """INSERT OR IGNORE INTO lgx_blobs
        (thread_id, checkpoint_ns, channel, version, type, data, base_version)
    SELECT ?, checkpoint_ns, channel, version, type, data, base_version
    FROM lgx_blobs WHERE thread_id = ?""",
    """INSERT OR IGNORE INTO lgx_writes
        (thread_id, checkpoint_ns, checkpoint_id, task_id, idx, channel, type, data, task_path)
    SELECT ?, checkpoint_ns, checkpoint_id, task_id, idx, channel, type, data, task_path
    FROM lgx_writes WHERE thread_id = ?""",
]

DELETE_CHECKPOINT = """
DELETE FROM lgx_checkpoints WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ?"""
DELETE_CHECKPOINT_WRITES = """
DELETE FROM lgx_writes WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ?"""
SELECT_THREAD_CHECKPOINTS = f"SELECT {CHECKPOINT_COLS} FROM lgx_checkpoints WHERE thread_id = ?"
SELECT_THREAD_BLOB_REFS = """
SELECT checkpoint_ns, channel, version, base_version FROM lgx_blobs WHERE thread_id = ?"""
DELETE_BLOB = """
DELETE FROM lgx_blobs WHERE thread_id = ? AND checkpoint_ns = ? AND channel = ? AND version = ?"""

# State-schema migration of one stored checkpoint (`rewrite_checkpoint`).
CHECKPOINT_EXISTS = """
SELECT 1 FROM lgx_checkpoints WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ?"""
UPDATE_CHECKPOINT = """
UPDATE lgx_checkpoints
SET parent_checkpoint_id = ?, run_id = ?, type = ?, checkpoint = ?, metadata_type = ?, metadata = ?
WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ?"""
# The caller checks the row count: 0 means the entry is logged already.
INSERT_SCHEMA_LOG = """
INSERT OR IGNORE INTO lgx_schema_log
    (thread_id, checkpoint_ns, checkpoint_id, from_version, to_version, migrated_at)
VALUES (?, ?, ?, ?, ?, ?)"""

# Key rotation, encrypting a store in place (`reseal`): compare-and-swap on the typed values
# the row held when read (a row rewritten or deleted since matches nothing: row count 0).
RESEAL_CHECKPOINT = """
UPDATE lgx_checkpoints SET type = ?, checkpoint = ?, metadata_type = ?, metadata = ?
WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ?
  AND type = ? AND checkpoint = ? AND metadata_type = ? AND metadata = ?"""
RESEAL_BLOB = """
UPDATE lgx_blobs SET type = ?, data = ?
WHERE thread_id = ? AND checkpoint_ns = ? AND channel = ? AND version = ?
  AND type = ? AND data = ?"""
RESEAL_WRITE = """
UPDATE lgx_writes SET type = ?, data = ?
WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ? AND task_id = ? AND idx = ?
  AND type = ? AND data = ?"""

_SCHEMA_LOG_COLS = (
    "thread_id, checkpoint_ns, checkpoint_id, from_version, to_version, migrated_at"
)
_SCHEMA_LOG_ORDER = "ORDER BY migrated_at, thread_id, checkpoint_ns, checkpoint_id, to_version"
SELECT_SCHEMA_LOG = f"SELECT {_SCHEMA_LOG_COLS} FROM lgx_schema_log {_SCHEMA_LOG_ORDER}"
SELECT_THREAD_SCHEMA_LOG = (
    f"SELECT {_SCHEMA_LOG_COLS} FROM lgx_schema_log WHERE thread_id = ? {_SCHEMA_LOG_ORDER}"
)

# Thread ids by a loose index scan: one index probe per thread, not one row read per checkpoint.
SELECT_THREAD_IDS = """
WITH RECURSIVE t(tid) AS (
    SELECT MIN(thread_id) FROM lgx_checkpoints
    UNION ALL
    SELECT (SELECT MIN(thread_id) FROM lgx_checkpoints WHERE thread_id > t.tid)
    FROM t WHERE t.tid IS NOT NULL
)
SELECT tid FROM t WHERE tid IS NOT NULL"""

# What a thread takes: rows and value bytes per namespace, kind and channel (`Store.sizes`).
SELECT_THREAD_SIZES = """
SELECT checkpoint_ns, 'checkpoint', '', COUNT(*), SUM(length(checkpoint) + length(metadata))
FROM lgx_checkpoints WHERE thread_id = ?1 GROUP BY checkpoint_ns
UNION ALL
SELECT checkpoint_ns, 'blob', channel, COUNT(*), SUM(length(data))
FROM lgx_blobs WHERE thread_id = ?1 GROUP BY checkpoint_ns, channel
UNION ALL
SELECT checkpoint_ns, 'write', channel, COUNT(*), SUM(length(data))
FROM lgx_writes WHERE thread_id = ?1 GROUP BY checkpoint_ns, channel"""

# -- the thread lifecycle (one row per thread in lgx_threads) ----------------------------------

# A write of a checkpoint or of pending writes (?1 thread, ?2 now): one statement per thread
# and transaction, in the write's own transaction.
UPSERT_THREAD_WRITTEN = """
INSERT INTO lgx_threads (thread_id, created_at, written_at, generation) VALUES (?1, ?2, ?2, 1)
ON CONFLICT (thread_id) DO UPDATE SET written_at = excluded.written_at,
                                      generation = generation + 1"""
# A schema migration of a stored checkpoint: a change, not activity (written_at stays).
UPSERT_THREAD_CHANGED = """
INSERT INTO lgx_threads (thread_id, created_at, written_at, generation) VALUES (?1, ?2, ?2, 1)
ON CONFLICT (thread_id) DO UPDATE SET generation = generation + 1"""
# The target of `copy_thread` (?1), written as a write, if the source (?3) has a row.
UPSERT_THREAD_COPIED = """
INSERT INTO lgx_threads (thread_id, created_at, written_at, generation)
SELECT ?1, ?2, ?2, 1 WHERE EXISTS (SELECT 1 FROM lgx_threads WHERE thread_id = ?3)
ON CONFLICT (thread_id) DO UPDATE SET written_at = excluded.written_at,
                                      generation = generation + 1"""
# Pinning or a policy of a thread that may have no row yet (generation 0: never written).
UPSERT_THREAD_PINNED = """
INSERT INTO lgx_threads (thread_id, created_at, written_at, generation, pinned)
VALUES (?1, ?2, ?2, 0, ?3)
ON CONFLICT (thread_id) DO UPDATE SET pinned = excluded.pinned"""
UPSERT_THREAD_POLICY = """
INSERT INTO lgx_threads (thread_id, created_at, written_at, generation, policy)
VALUES (?1, ?2, ?2, 0, ?3)
ON CONFLICT (thread_id) DO UPDATE SET policy = excluded.policy"""
TOUCH_THREAD = "UPDATE lgx_threads SET read_at = ? WHERE thread_id = ?"
MARK_SWEPT = "UPDATE lgx_threads SET swept = ? WHERE thread_id = ?"
SELECT_GENERATION = "SELECT generation FROM lgx_threads WHERE thread_id = ?"

_THREAD_COLS = "thread_id, created_at, written_at, read_at, generation, pinned, policy, swept"
SELECT_THREAD_STATE = f"SELECT {_THREAD_COLS} FROM lgx_threads WHERE thread_id = ?"
# Keyset pages in thread id order (the primary key): no open cursor between pages.
SELECT_THREAD_STATES = f"SELECT {_THREAD_COLS} FROM lgx_threads ORDER BY thread_id LIMIT ?"
SELECT_THREAD_STATES_AFTER = (
    f"SELECT {_THREAD_COLS} FROM lgx_threads WHERE thread_id > ? ORDER BY thread_id LIMIT ?"
)

INSERT_LIFECYCLE = """
INSERT INTO lgx_lifecycle_log (at, action, thread, checkpoints, reason) VALUES (?, ?, ?, ?, ?)"""
_LIFECYCLE_COLS = "at, action, thread, checkpoints, reason"
SELECT_LIFECYCLE = f"SELECT {_LIFECYCLE_COLS} FROM lgx_lifecycle_log ORDER BY seq"
SELECT_THREAD_LIFECYCLE = (
    f"SELECT {_LIFECYCLE_COLS} FROM lgx_lifecycle_log WHERE thread = ? ORDER BY seq"
)


# -- one writer per thread (`core.guard`): tombstones, leases, the epoch -----------------------

# What a guarded write must find (?1 thread, ?2 namespace, ?3 its checkpoint id), in one
# statement of primary-key probes, run in the write's own transaction: the namespace's head
# (MAX over the primary key's index), whether the checkpoint exists (for pending writes),
# the thread's tombstone (the newest checkpoint id its delete removed; NULL: none), its
# lease row, the store's epoch.
SELECT_GUARD_FACTS = """
SELECT (SELECT MAX(checkpoint_id) FROM lgx_checkpoints
        WHERE thread_id = ?1 AND checkpoint_ns = ?2),
       EXISTS (SELECT 1 FROM lgx_checkpoints
               WHERE thread_id = ?1 AND checkpoint_ns = ?2 AND checkpoint_id = ?3),
       (SELECT last_checkpoint_id FROM lgx_tombstones WHERE thread_id = ?1),
       l.token, l.expires_at,
       (SELECT epoch FROM lgx_epoch)
FROM (SELECT 1) LEFT JOIN lgx_leases l ON l.thread_id = ?1"""

# Before the thread's rows go (?1 thread, ?2 now): the newest checkpoint id they hold, kept
# across repeated deletes.
UPSERT_TOMBSTONE = """
INSERT INTO lgx_tombstones (thread_id, deleted_at, last_checkpoint_id)
SELECT ?1, ?2, COALESCE(MAX(checkpoint_id), '') FROM lgx_checkpoints WHERE thread_id = ?1
ON CONFLICT (thread_id) DO UPDATE SET
    deleted_at = excluded.deleted_at,
    last_checkpoint_id = MAX(last_checkpoint_id, excluded.last_checkpoint_id)"""
SELECT_TOMBSTONE = "SELECT deleted_at FROM lgx_tombstones WHERE thread_id = ?"
# ?1 before, ?2 at most this many (-1: all)
DELETE_OLD_TOMBSTONES = """
DELETE FROM lgx_tombstones WHERE thread_id IN (
    SELECT thread_id FROM lgx_tombstones WHERE deleted_at < ?1 ORDER BY deleted_at LIMIT ?2)"""
DELETE_DEAD_LEASES = """
DELETE FROM lgx_leases WHERE thread_id IN (
    SELECT thread_id FROM lgx_leases WHERE expires_at < ?1 LIMIT ?2)"""

# ?1 thread, ?2 token, ?3 expires at, ?4 now: taken unless another token's lease is live
# (the row count says which: 0 when it is).
ACQUIRE_LEASE = """
INSERT INTO lgx_leases (thread_id, token, expires_at) VALUES (?1, ?2, ?3)
ON CONFLICT (thread_id) DO UPDATE SET token = excluded.token, expires_at = excluded.expires_at
WHERE lgx_leases.token = excluded.token OR lgx_leases.expires_at <= ?4"""
RENEW_LEASE = """
UPDATE lgx_leases SET expires_at = ?3 WHERE thread_id = ?1 AND token = ?2 AND expires_at > ?4"""
RELEASE_LEASE = "DELETE FROM lgx_leases WHERE thread_id = ? AND token = ?"
SELECT_LEASE = "SELECT token, expires_at FROM lgx_leases WHERE thread_id = ?"

SELECT_EPOCH = "SELECT epoch FROM lgx_epoch"
RAISE_EPOCH = "UPDATE lgx_epoch SET epoch = MAX(epoch, ?)"
