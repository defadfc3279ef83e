"""SQL of the PostgreSQL backend, as named constants. Values are always bound parameters; key
lists travel as arrays (`unnest`), so no statement text depends on input."""

from __future__ import annotations

CHECKPOINT_COLS = (
    "thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, run_id, "
    "type, checkpoint, metadata_type, metadata"
)

# Any constant 64-bit key: `setup()` of every process takes this lock before migrating.
MIGRATION_LOCK = 0x6C67636B7074  # "lgckpt"

CREATE_MIGRATIONS = """
CREATE TABLE IF NOT EXISTS lgx_migrations (
    version INTEGER PRIMARY KEY,
    applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
)"""
LOCK_MIGRATIONS = "SELECT pg_advisory_xact_lock($1)"
SELECT_STORAGE_VERSION = "SELECT COALESCE(MAX(version), 0) FROM lgx_migrations"
# Resolved through the search path, as the other statements are (a `schema=` sets it).
MIGRATIONS_TABLE_EXISTS = "SELECT to_regclass('lgx_migrations') IS NOT NULL"
INSERT_MIGRATION = "INSERT INTO lgx_migrations (version) VALUES ($1)"

# The store's audit log (`read_audit_log`, `log_audit_switch`): the newest row is in force.
SELECT_AUDIT_LOG = "SELECT enabled, at, reason FROM lgx_audit_log ORDER BY seq"
SELECT_AUDIT_LAST = "SELECT enabled, at, reason FROM lgx_audit_log ORDER BY seq DESC LIMIT 1"
INSERT_AUDIT_SWITCH = "INSERT INTO lgx_audit_log (enabled, at, reason) VALUES ($1, $2, $3)"

UPSERT_CHECKPOINT = f"""
INSERT INTO lgx_checkpoints ({CHECKPOINT_COLS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id) DO UPDATE SET
    parent_checkpoint_id = EXCLUDED.parent_checkpoint_id, run_id = EXCLUDED.run_id,
    type = EXCLUDED.type, checkpoint = EXCLUDED.checkpoint,
    metadata_type = EXCLUDED.metadata_type, metadata = EXCLUDED.metadata"""

UPSERT_BLOBS = """
INSERT INTO lgx_blobs (thread_id, checkpoint_ns, channel, version, type, data, base_version)
SELECT $1, $2, ch, ver, ty, da, NULL
FROM unnest($3::text[], $4::text[], $5::text[], $6::bytea[]) AS b(ch, ver, ty, da)
ON CONFLICT (thread_id, checkpoint_ns, channel, version) DO UPDATE SET
    type = EXCLUDED.type, data = EXCLUDED.data, base_version = NULL"""

# Blob rows as given (full values and append-deltas), for a schema rewrite: its caller has
# checked that each delta's base is there (SELECT_BLOB_BASES), in the same transaction.
UPSERT_BLOB_ROWS = """
INSERT INTO lgx_blobs (thread_id, checkpoint_ns, channel, version, type, data, base_version)
SELECT $1, $2, ch, ver, ty, da, base
FROM unnest($3::text[], $4::text[], $5::text[], $6::bytea[], $7::text[]) AS b(ch, ver, ty, da, base)
ON CONFLICT (thread_id, checkpoint_ns, channel, version) DO UPDATE SET
    type = EXCLUDED.type, data = EXCLUDED.data, base_version = EXCLUDED.base_version"""

SELECT_BLOB_BASES = """
SELECT x.channel, x.version FROM lgx_blobs x
JOIN unnest($3::text[], $4::text[]) AS k(ch, ver) ON x.channel = k.ch AND x.version = k.ver
WHERE x.thread_id = $1 AND x.checkpoint_ns = $2"""

# Per-thread advisory locks (the two-int form, so never the migration lock's key): writers
# hold their thread's in share mode, a prune or delete of the thread holds it alone, so that
# it reads and deletes with no writer half-way. Writers only try it, in their one statement
# (no round trip more): if a prune holds it, the statement writes nothing and says so, and
# the writer takes the lock waiting, in a transaction, then writes again.
THREAD_LOCK = 0x6C67746B  # "lgtk": the class of every thread's lock, its key a hash


def _try_shared(key: str) -> str:
    return f"pg_try_advisory_xact_lock_shared({THREAD_LOCK}, {key})"


# Writers that found the thread locked: each thread's lock, in the order given (sorted).
LOCK_THREADS_SHARED = f"""
SELECT pg_advisory_xact_lock_shared({THREAD_LOCK}, k) FROM unnest($1::int[]) AS k"""
# A prune or delete: the thread alone, waiting for the writers holding it at most the
# session's lock_timeout (5 s if it has none); the server then raises lock_not_available.
LOCK_THREAD = f"""
SELECT set_config('lock_timeout', CASE current_setting('lock_timeout') WHEN '0' THEN '5s'
                                  ELSE current_setting('lock_timeout') END, true),
       pg_advisory_xact_lock({THREAD_LOCK}, $1::int)"""
# The thread's lifecycle row (`lgx_threads`), as every write leaves it: created if missing
# (created then), written now, its generation raised. The row's lock, held until the write
# commits, also makes the writers of one thread take turns: each statement takes it before it
# writes any other row (its other parts wait for it), a batch in thread id order.
def _wrote(source: str, now: str, where: str) -> str:
    return f"""INSERT INTO lgx_threads (thread_id, created_at, written_at, generation)
    SELECT {source}, {now}, {now}, 1 {where}
    ON CONFLICT (thread_id) DO UPDATE SET
        written_at = EXCLUDED.written_at, generation = lgx_threads.generation + 1
    RETURNING thread_id"""


# What a guarded write (`core.guard`) expects its thread to hold, as one SQL condition over
# the row of `lgx_guard_facts` (f) and parameters from $n on: the head (None: none), whether
# the thread has a tombstone, the token of the live lease (None: none live; "live" at the
# write's time, parameter `now`), the store's epoch, and (`exists`) whether the checkpoint of
# pending writes is stored. The Python caller decided the write on exactly these facts with
# `core.guard`; the statement takes them as they are once its thread's row lock is held, and
# `lgx_guard_expect` aborts it (nothing written) if they differ: a compare-and-set of facts,
# the rule itself is never written in SQL.
def _expect(n: int, now: str, *, head: bool, exists: bool) -> str:
    parts = [f"f.f_tombstoned = ${n}::boolean",
             f"(CASE WHEN f.f_expires > {now} THEN f.f_token END) IS NOT DISTINCT FROM "
             f"${n + 1}::text",
             f"f.f_epoch = ${n + 2}::bigint"]
    if head:
        parts.append(f"f.f_head IS NOT DISTINCT FROM ${n + 3}::text")
    if exists:  # only a tombstone makes it matter: stored, or newer than what the thread's
        # delete removed (`writes_refusal`); pending writes often come before their checkpoint
        parts.append(f"(NOT f.f_tombstoned OR f.f_exists OR f.f_newer) = ${n + 3}::boolean")
    return "lgx_guard_expect(" + " AND ".join(parts) + ")"


# A whole put in one statement, so one round trip: the thread's row, full blobs, append-deltas
# and the checkpoint row, only if every delta's base is stored (`landed`: the channels whose
# base is; else the caller writes the others whole, in a transaction); nothing at all if a
# prune holds the thread's lock ($19: its key). $20: now. A base is looked up FOR KEY SHARE:
# one that a prune deleted after this statement's snapshot was taken (its lock released in
# between) is then not found, rather than found and gone once both commit.
# Guarded (`PUT_GUARDED`): once the thread's row is locked, the facts the caller expects
# ($21: lock the epoch row; $22..$25, see `_expect`) are checked before anything else is
# written; the row lock is what makes two guarded writers of one thread take turns.
def _put_checkpoint(guarded: bool) -> str:
    after = "checked" if guarded else "thread_row"
    check = f"""
), checked AS (
    SELECT {_expect(22, "$20::double precision", head=True, exists=False)}
    FROM thread_row r CROSS JOIN LATERAL lgx_guard_facts(r.thread_id, $2, NULL, $21::boolean) f
""" if guarded else ""
    return f"""
WITH thread_lock AS (
    SELECT {_try_shared("$19::int")} AS ok
), bases AS (
    SELECT d.ch FROM unnest($7::text[], $11::text[]) AS d(ch, base)
    WHERE (SELECT ok FROM thread_lock) AND EXISTS (
        SELECT 1 FROM lgx_blobs x
        WHERE x.thread_id = $1 AND x.checkpoint_ns = $2 AND x.channel = d.ch
          AND x.version = d.base
        LIMIT 1 FOR KEY SHARE
    )
), thread_row AS (
    {_wrote("$1", "$20::double precision",
            "WHERE (SELECT ok FROM thread_lock) "
            "AND (SELECT count(*) FROM bases) = cardinality($7::text[])")}{check}
), full_blobs AS (
    INSERT INTO lgx_blobs (thread_id, checkpoint_ns, channel, version, type, data, base_version)
    SELECT $1, $2, ch, ver, ty, da, NULL
    FROM unnest($3::text[], $4::text[], $5::text[], $6::bytea[]) AS f(ch, ver, ty, da)
    WHERE EXISTS (SELECT 1 FROM {after})
    ON CONFLICT (thread_id, checkpoint_ns, channel, version) DO UPDATE SET
        type = EXCLUDED.type, data = EXCLUDED.data, base_version = NULL
), deltas AS (
    INSERT INTO lgx_blobs (thread_id, checkpoint_ns, channel, version, type, data, base_version)
    SELECT $1, $2, d.ch, d.ver, d.ty, d.da, d.base
    FROM unnest($7::text[], $8::text[], $9::text[], $10::bytea[], $11::text[])
        AS d(ch, ver, ty, da, base)
    WHERE EXISTS (SELECT 1 FROM {after})
    ON CONFLICT (thread_id, checkpoint_ns, channel, version) DO UPDATE SET
        type = EXCLUDED.type, data = EXCLUDED.data, base_version = EXCLUDED.base_version
), ckpt AS (
    INSERT INTO lgx_checkpoints ({CHECKPOINT_COLS})
    SELECT $1, $2, $12, $13, $14, $15, $16, $17, $18
    WHERE EXISTS (SELECT 1 FROM {after})
    ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id) DO UPDATE SET
        parent_checkpoint_id = EXCLUDED.parent_checkpoint_id, run_id = EXCLUDED.run_id,
        type = EXCLUDED.type, checkpoint = EXCLUDED.checkpoint,
        metadata_type = EXCLUDED.metadata_type, metadata = EXCLUDED.metadata
    RETURNING 1
)
SELECT (SELECT ok FROM thread_lock) AS locked, (SELECT array_agg(ch) FROM bases) AS landed,
       (SELECT count(*) FROM ckpt) AS stored"""


PUT_CHECKPOINT = _put_checkpoint(False)
PUT_GUARDED = _put_checkpoint(True)

_WRITE_COLS = "thread_id, checkpoint_ns, checkpoint_id, task_id, idx, channel, type, data, task_path"
_WRITE_TYPES = ("text", "text", "text", "text", "int", "text", "text", "bytea", "text")
INSERT_WRITES_KEEP = f"""
INSERT INTO lgx_writes ({_WRITE_COLS})
SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::int[], $6::text[],
                     $7::text[], $8::bytea[], $9::text[])
ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO NOTHING"""
INSERT_WRITES_REPLACE = INSERT_WRITES_KEEP.replace(
    "DO NOTHING",
    "DO UPDATE SET channel = EXCLUDED.channel, type = EXCLUDED.type, data = EXCLUDED.data, "
    "task_path = EXCLUDED.task_path",
)


def _unnest(first: int, *types: str) -> str:
    """`unnest($first::t1[], $first+1::t2[], ...)`: one array parameter per column."""
    return f"unnest({', '.join(f'${first + i}::{t}[]' for i, t in enumerate(types))})"


# Pending writes in one statement: the threads' rows ($19: their ids, sorted; $20: now), then
# writes kept if present ($1..$9) and writes that replace ($10..$18).
# Guarded (`WRITE_WRITES_GUARDED`: pending writes of one thread and checkpoint): first the
# thread's lock in share mode (tried: $21, its key; if a prune or a lease change holds it,
# nothing is written and the count is 0), then, under the thread's row lock, the facts the
# caller expects ($22: ns, $23: checkpoint id, $24: lock the epoch row, $25..$28: see
# `_expect`).
def _write_writes(guarded: bool) -> str:
    if guarded:
        head = f"""thread_lock AS (
    SELECT {_try_shared("$21::int")} AS ok
), threads AS (
    {_wrote("t", "$20::double precision",
            "FROM unnest($19::text[]) AS t WHERE (SELECT ok FROM thread_lock)")}
), checked AS (
    SELECT {_expect(25, "$20::double precision", head=False, exists=True)}
    FROM threads r CROSS JOIN LATERAL lgx_guard_facts(r.thread_id, $22, $23, $24::boolean) f
)"""
        after = "checked"
    else:
        head = f"""threads AS (
    {_wrote("t", "$20::double precision", "FROM unnest($19::text[]) AS t")}
)"""
        after = "threads"
    return f"""
WITH {head}, kept AS (
    INSERT INTO lgx_writes ({_WRITE_COLS})
    SELECT * FROM {_unnest(1, *_WRITE_TYPES)} WHERE EXISTS (SELECT 1 FROM {after})
    ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO NOTHING
), replaced AS (
    INSERT INTO lgx_writes ({_WRITE_COLS})
    SELECT * FROM {_unnest(10, *_WRITE_TYPES)} WHERE EXISTS (SELECT 1 FROM {after})
    ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO UPDATE SET
        channel = EXCLUDED.channel, type = EXCLUDED.type, data = EXCLUDED.data,
        task_path = EXCLUDED.task_path
)
SELECT count(*) FROM {after}"""


WRITE_WRITES = _write_writes(False)
WRITE_WRITES_GUARDED = _write_writes(True)

# The facts of guarded writes as they are, for the caller to decide on (`core.guard`), in a
# transaction it then writes in: the threads' locks in share mode, waiting ($1: their keys,
# sorted), their rows locked (created if missing, generation 0 until the write raises it;
# $2: their ids, sorted; $3: now), then per (thread, namespace, checkpoint id or None)
# ($4, $5, $6) the facts, read after the locks (`lgx_guard_facts`); $7: lock the epoch row.
GUARD_FACTS = """
WITH held AS (
    SELECT pg_advisory_xact_lock_shared({lock}, k) FROM unnest($1::int[]) AS k
), locked AS (
    INSERT INTO lgx_threads (thread_id, created_at, written_at, generation)
    SELECT t, $3::double precision, $3::double precision, 0 FROM unnest($2::text[]) AS t
    WHERE (SELECT count(*) FROM held) >= 0
    ON CONFLICT (thread_id) DO UPDATE SET written_at = lgx_threads.written_at
    RETURNING thread_id
)
SELECT k.n, f.* FROM unnest($4::text[], $5::text[], $6::text[]) WITH ORDINALITY AS k(tid, ns, cid, n)
JOIN locked r ON r.thread_id = k.tid
CROSS JOIN LATERAL lgx_guard_facts(r.thread_id, k.ns, k.cid, $7::boolean) f
ORDER BY k.n""".replace("{lock}", str(THREAD_LOCK))


_AFTER_THREADS = "WHERE EXISTS (SELECT 1 FROM threads)"

# A whole `write_batch` in one statement: one round trip, one transaction (a statement is
# atomic), whatever the number of checkpoints and writes. Each array holds a key once.
# $39: the lock keys of the batch's threads; if a prune holds one, the statement writes
# nothing and returns one row, locked false. $1..$4: (thread, ns, channel, version) of the
# bases that append-deltas of the batch need from storage (the bases written earlier in the
# batch are not among them). If one of them is missing, the statement writes nothing and
# returns those keys: the caller then makes the deltas on them whole values and runs it again.
# Otherwise: the threads' rows ($40: their ids, sorted; $41: now), first, then blob rows as
# given, deltas included ($5..$11), checkpoint rows ($12..$20), writes kept if present
# ($21..$29) and writes that replace ($30..$38), and one row, locked true with no key. The
# `LIMIT 1` probes keep each base lookup an index probe.
WRITE_BATCH = f"""
WITH thread_lock AS (
    SELECT coalesce(bool_and({_try_shared("k")}), true) AS ok FROM unnest($39::int[]) AS k
), missing AS (
    SELECT k.tid, k.ns, k.ch, k.ver
    FROM {_unnest(1, "text", "text", "text", "text")} AS k(tid, ns, ch, ver)
    WHERE (SELECT ok FROM thread_lock) AND NOT EXISTS (
        SELECT 1 FROM lgx_blobs
        WHERE thread_id = k.tid AND checkpoint_ns = k.ns AND channel = k.ch AND version = k.ver
        LIMIT 1 FOR KEY SHARE
    )
), threads AS (
    {_wrote("t", "$41::double precision", "FROM unnest($40::text[]) AS t "
            "WHERE (SELECT ok FROM thread_lock) AND NOT EXISTS (SELECT 1 FROM missing)")}
), blobs AS (
    INSERT INTO lgx_blobs (thread_id, checkpoint_ns, channel, version, type, data, base_version)
    SELECT * FROM {_unnest(5, "text", "text", "text", "text", "text", "bytea", "text")}
    {_AFTER_THREADS}
    ON CONFLICT (thread_id, checkpoint_ns, channel, version) DO UPDATE SET
        type = EXCLUDED.type, data = EXCLUDED.data, base_version = EXCLUDED.base_version
), checkpoints AS (
    INSERT INTO lgx_checkpoints ({CHECKPOINT_COLS})
    SELECT * FROM {_unnest(12, "text", "text", "text", "text", "text", "text", "bytea", "text",
                           "bytea")}
    {_AFTER_THREADS}
    ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id) DO UPDATE SET
        parent_checkpoint_id = EXCLUDED.parent_checkpoint_id, run_id = EXCLUDED.run_id,
        type = EXCLUDED.type, checkpoint = EXCLUDED.checkpoint,
        metadata_type = EXCLUDED.metadata_type, metadata = EXCLUDED.metadata
), kept AS (
    INSERT INTO lgx_writes ({_WRITE_COLS})
    SELECT * FROM {_unnest(21, *_WRITE_TYPES)}
    {_AFTER_THREADS}
    ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO NOTHING
), replaced AS (
    INSERT INTO lgx_writes ({_WRITE_COLS})
    SELECT * FROM {_unnest(30, *_WRITE_TYPES)}
    {_AFTER_THREADS}
    ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO UPDATE SET
        channel = EXCLUDED.channel, type = EXCLUDED.type, data = EXCLUDED.data,
        task_path = EXCLUDED.task_path
)
SELECT l.ok AS locked, m.tid, m.ns, m.ch, m.ver FROM thread_lock l LEFT JOIN missing m ON l.ok"""


SELECT_CHECKPOINT = f"""
SELECT {CHECKPOINT_COLS} FROM lgx_checkpoints
WHERE thread_id = $1 AND checkpoint_ns = $2 AND checkpoint_id = $3"""
SELECT_LATEST_CHECKPOINT = f"""
SELECT {CHECKPOINT_COLS} FROM lgx_checkpoints
WHERE thread_id = $1 AND checkpoint_ns = $2
ORDER BY checkpoint_id DESC LIMIT 1"""

_C_COLS = ", ".join("c." + col.strip() for col in CHECKPOINT_COLS.split(","))

# The parent chain from one checkpoint, nearest first, at most $4 rows; primary-key probes, as
# for blobs below.
SELECT_ANCESTORS = f"""
WITH RECURSIVE chain(id, n) AS (
    SELECT $3::text COLLATE "C", 0
    UNION ALL
    SELECT p.parent_checkpoint_id, chain.n + 1
    FROM chain CROSS JOIN LATERAL (
        SELECT parent_checkpoint_id FROM lgx_checkpoints
        WHERE thread_id = $1 AND checkpoint_ns = $2 AND checkpoint_id = chain.id
        LIMIT 1
    ) p
    WHERE p.parent_checkpoint_id IS NOT NULL AND chain.n + 1 < $4
)
SELECT {_C_COLS}
FROM chain CROSS JOIN LATERAL (
    SELECT * FROM lgx_checkpoints
    WHERE thread_id = $1 AND checkpoint_ns = $2 AND checkpoint_id = chain.id
    LIMIT 1
) c
ORDER BY chain.n"""

# Lateral lookups by primary key (`LIMIT 1` keeps them from being flattened into a join): an
# index probe per row of the chain, whatever the planner believes about the table's size. A
# hash join here would scan every blob of every thread.
SELECT_BLOBS = """
WITH RECURSIVE need(channel, version) AS (
    SELECT ch COLLATE "C", ver COLLATE "C" FROM unnest($3::text[], $4::text[]) AS k(ch, ver)
    UNION
    SELECT need.channel, b.base_version
    FROM need CROSS JOIN LATERAL (
        SELECT base_version FROM lgx_blobs
        WHERE thread_id = $1 AND checkpoint_ns = $2
          AND channel = need.channel AND version = need.version
        LIMIT 1
    ) b
    WHERE b.base_version IS NOT NULL
)
SELECT b.channel, b.version, b.type, b.data, b.base_version
FROM need CROSS JOIN LATERAL (
    SELECT channel, version, type, data, base_version FROM lgx_blobs
    WHERE thread_id = $1 AND checkpoint_ns = $2
      AND channel = need.channel AND version = need.version
    LIMIT 1
) b"""

SELECT_WRITES = f"""
SELECT {_WRITE_COLS} FROM lgx_writes
WHERE thread_id = $1 AND checkpoint_ns = $2 AND checkpoint_id = ANY($3::text[])
  AND ($4::text[] IS NULL OR channel = ANY($4::text[]))
ORDER BY checkpoint_id, task_path, task_id, idx"""


# One checkpoint (the latest of its namespace without $3) with its pending writes, in one
# round trip: the writes as parallel arrays in `writes_sort_key` order.
_TUPLE_WRITES = """
LEFT JOIN LATERAL (
    SELECT array_agg(w.task_id ORDER BY w.task_path, w.task_id, w.idx) AS w_task,
           array_agg(w.idx ORDER BY w.task_path, w.task_id, w.idx) AS w_idx,
           array_agg(w.channel ORDER BY w.task_path, w.task_id, w.idx) AS w_channel,
           array_agg(w.type ORDER BY w.task_path, w.task_id, w.idx) AS w_type,
           array_agg(w.data ORDER BY w.task_path, w.task_id, w.idx) AS w_data,
           array_agg(w.task_path ORDER BY w.task_path, w.task_id, w.idx) AS w_path
    FROM lgx_writes w
    WHERE w.thread_id = c.thread_id AND w.checkpoint_ns = c.checkpoint_ns
      AND w.checkpoint_id = c.checkpoint_id
) w ON true"""
SELECT_TUPLE = f"""
SELECT {_C_COLS}, w.* FROM (
    SELECT * FROM lgx_checkpoints
    WHERE thread_id = $1 AND checkpoint_ns = $2 AND checkpoint_id = $3
) c {_TUPLE_WRITES}"""
SELECT_LATEST_TUPLE = f"""
SELECT {_C_COLS}, w.* FROM (
    SELECT * FROM lgx_checkpoints
    WHERE thread_id = $1 AND checkpoint_ns = $2
    ORDER BY checkpoint_id DESC LIMIT 1
) c {_TUPLE_WRITES}"""


def select_checkpoints(
    *, thread: bool, ns: bool, checkpoint_id: bool, before: bool, after_cursor: bool
) -> str:
    """A page of `list`: each flag adds one fixed condition, numbered in order; the page size
    is the last parameter."""
    where, n = [], 0
    for flag, condition in (
        (thread, "thread_id = ${}"),
        (ns, "checkpoint_ns = ${}"),
        (checkpoint_id, "checkpoint_id = ${}"),
        (before, "checkpoint_id < ${}"),
    ):
        if flag:
            n += 1
            where.append(condition.format(n))
    if after_cursor:
        where.append(f"(checkpoint_id, checkpoint_ns, thread_id) < (${n + 1}, ${n + 2}, ${n + 3})")
        n += 3
    clause = f"WHERE {' AND '.join(where)}" if where else ""
    return f"""SELECT {CHECKPOINT_COLS} FROM lgx_checkpoints {clause}
ORDER BY checkpoint_id DESC, checkpoint_ns DESC, thread_id DESC LIMIT ${n + 1}"""


SELECT_RUNS = """
SELECT thread_id, checkpoint_ns, checkpoint_id FROM lgx_checkpoints
WHERE run_id = ANY($1::text[])"""

def _delete_thread(guard: str) -> str:
    """Every row of thread $1, its lease included, in one statement, where `guard` (a CTE's
    name) has a row."""
    cond = f"AND EXISTS (SELECT 1 FROM {guard})" if guard else ""
    parts = ", ".join(
        f"d_{table} AS (DELETE FROM lgx_{table} WHERE thread_id = $1 {cond} RETURNING 1)"
        for table in ("checkpoints", "blobs", "writes", "schema_log", "threads", "leases")
    )
    return parts


def _tombstone(flag: str, now: str, guard: str) -> str:
    """The thread's tombstone, left (stamped `now`) if `flag`, and `guard` has a row."""
    cond = f"AND EXISTS (SELECT 1 FROM {guard})" if guard else ""
    return f"""tomb AS (
    INSERT INTO lgx_tombstones (thread_id, deleted_at, last_checkpoint_id)
    SELECT $1, {now}, COALESCE((SELECT max(c.checkpoint_id COLLATE "C") FROM lgx_checkpoints c
                                WHERE c.thread_id = $1), '')
    WHERE {flag} {cond}
    ON CONFLICT (thread_id) DO UPDATE SET deleted_at = EXCLUDED.deleted_at,
        last_checkpoint_id = GREATEST(lgx_tombstones.last_checkpoint_id,
                                      EXCLUDED.last_checkpoint_id)
)"""


# A thread's rows, its lifecycle row and lease included (`delete_thread`), and its tombstone
# if $2 (stamped $3).
DELETE_THREAD = f"""
WITH {_delete_thread('')}, {_tombstone("$2::boolean", "$3::double precision", "")}
SELECT count(*) FROM d_threads"""
# The same only if the thread's row still has generation $2 (`expire_thread`; $3, $4: the
# tombstone and its time): the row is locked first, so a write of the thread (which raises
# it) either commits before, and is seen, or waits, and comes after. Returns 1 if the thread
# went.
EXPIRE_THREAD = f"""
WITH guard AS (
    SELECT 1 FROM lgx_threads WHERE thread_id = $1 AND generation = $2 FOR UPDATE
), {_delete_thread("guard")}, {_tombstone("$3::boolean", "$4::double precision", "guard")}
SELECT count(*) FROM d_threads"""

# A copy, in one statement; the target gets a lifecycle row as a write gives one (if the
# source has one), taken before its other rows are written ($3: now). The log of schema
# migrations stays with its thread: a copy is not migrated, it is a copy.
_FIRST = "(SELECT count(*) FROM target_row) >= 0"  # after the target's row, whatever it is
COPY_THREAD = f"""
WITH target_row AS (
    {_wrote("$1", "$3::double precision",
            "WHERE EXISTS (SELECT 1 FROM lgx_threads WHERE thread_id = $2)")}
), c AS (
    INSERT INTO lgx_checkpoints ({CHECKPOINT_COLS})
    SELECT $1, checkpoint_ns, checkpoint_id, parent_checkpoint_id, run_id,
           type, checkpoint, metadata_type, metadata
    FROM lgx_checkpoints WHERE thread_id = $2 AND {_FIRST} ON CONFLICT DO NOTHING
), b AS (
    INSERT INTO lgx_blobs
        (thread_id, checkpoint_ns, channel, version, type, data, base_version)
    SELECT $1, checkpoint_ns, channel, version, type, data, base_version
    FROM lgx_blobs WHERE thread_id = $2 AND {_FIRST} ON CONFLICT DO NOTHING
), w AS (
    INSERT INTO lgx_writes ({_WRITE_COLS})
    SELECT $1, checkpoint_ns, checkpoint_id, task_id, idx, channel, type, data, task_path
    FROM lgx_writes WHERE thread_id = $2 AND {_FIRST} ON CONFLICT DO NOTHING
)
SELECT count(*) FROM target_row"""

# Values sealed again in place (`Store.reseal`: key rotation), in one statement: the thread's
# lock in share mode, waiting (so no prune or delete of the thread is half-way, and none starts
# before this commits), then its lifecycle row locked but left as it is (FOR NO KEY UPDATE, the
# lock a write takes on it first: writers of the thread and this take turns, every one taking
# the two locks in the same order, so none deadlocks), then each value replaced only where its
# row still holds exactly the old one (a row a writer changed meanwhile is compared as it is
# now). A thread with no lifecycle row is rewritten without that lock. $1: the thread, $2: its
# lock key; checkpoints (record and metadata) $3..$12, blobs $13..$19, pending writes $20..$27;
# the statement returns how many rows it changed. Each array holds a row's key once.
RESEAL = f"""
WITH held AS (
    SELECT pg_advisory_xact_lock_shared({THREAD_LOCK}, $2::int)
), thread_row AS (
    SELECT 1 FROM lgx_threads WHERE thread_id = $1 AND (SELECT count(*) FROM held) >= 0
    FOR NO KEY UPDATE
), c AS (
    UPDATE lgx_checkpoints x
    SET type = n.nty, checkpoint = n.nda, metadata_type = n.nmty, metadata = n.nmda
    FROM {_unnest(3, "text", "text", "text", "bytea", "text", "bytea", "text", "bytea", "text",
                  "bytea")} AS n(ns, cid, oty, oda, omty, omda, nty, nda, nmty, nmda)
    WHERE x.thread_id = $1 AND x.checkpoint_ns = n.ns AND x.checkpoint_id = n.cid
      AND x.type = n.oty AND x.checkpoint = n.oda
      AND x.metadata_type = n.omty AND x.metadata = n.omda
      AND (SELECT count(*) FROM thread_row) >= 0
    RETURNING 1
), b AS (
    UPDATE lgx_blobs x SET type = n.nty, data = n.nda
    FROM {_unnest(13, "text", "text", "text", "text", "bytea", "text", "bytea")}
        AS n(ns, ch, ver, oty, oda, nty, nda)
    WHERE x.thread_id = $1 AND x.checkpoint_ns = n.ns AND x.channel = n.ch
      AND x.version = n.ver AND x.type = n.oty AND x.data = n.oda
      AND (SELECT count(*) FROM thread_row) >= 0
    RETURNING 1
), w AS (
    UPDATE lgx_writes x SET type = n.nty, data = n.nda
    FROM {_unnest(20, "text", "text", "text", "int", "text", "bytea", "text", "bytea")}
        AS n(ns, cid, task, idx, oty, oda, nty, nda)
    WHERE x.thread_id = $1 AND x.checkpoint_ns = n.ns AND x.checkpoint_id = n.cid
      AND x.task_id = n.task AND x.idx = n.idx AND x.type = n.oty AND x.data = n.oda
      AND (SELECT count(*) FROM thread_row) >= 0
    RETURNING 1
)
SELECT (SELECT count(*) FROM c) + (SELECT count(*) FROM b) + (SELECT count(*) FROM w)"""

# Delete checkpoints ($2, $3: namespaces and ids) with their writes, and return what the GC
# plans from, in one round trip: the thread's remaining checkpoints ('c', then the columns of
# CHECKPOINT_COLS after thread_id) and its blobs ('b', ns, channel, version, base_version).
# The deletes are not visible to the statement's own reads: remaining rows are filtered.
PRUNE_CHECKPOINTS = """
WITH victims AS (
    SELECT * FROM unnest($2::text[], $3::text[]) AS v(ns, cid)
), gone AS (
    DELETE FROM lgx_checkpoints
    WHERE thread_id = $1 AND (checkpoint_ns, checkpoint_id) IN (SELECT * FROM victims)
), gone_writes AS (
    DELETE FROM lgx_writes
    WHERE thread_id = $1 AND (checkpoint_ns, checkpoint_id) IN (SELECT * FROM victims)
)
SELECT 'c', checkpoint_ns, checkpoint_id, parent_checkpoint_id, run_id,
       type, checkpoint, metadata_type, metadata
FROM lgx_checkpoints
WHERE thread_id = $1 AND (checkpoint_ns, checkpoint_id) NOT IN (SELECT * FROM victims)
UNION ALL
SELECT 'b', checkpoint_ns, channel, version, base_version, NULL, NULL, NULL, NULL
FROM lgx_blobs WHERE thread_id = $1"""
DELETE_BLOBS = """
DELETE FROM lgx_blobs
WHERE thread_id = $1 AND (checkpoint_ns, channel, version) IN (
    SELECT * FROM unnest($2::text[], $3::text[], $4::text[]))"""

# State-schema migration of one stored checkpoint, in one statement: lock the thread's row
# (as a write does, first), then the checkpoint row (a concurrent delete waits, or wins and
# leaves nothing to log), log the entry unless its key is logged already, rewrite the row only
# if the entry was logged, and then raise the thread's generation ($11: now, for a thread with
# no row yet). The count tells the caller whether to go on with the blobs and writes, in the
# same transaction.
REWRITE_CHECKPOINT = """
WITH thread_row AS (
    SELECT 1 FROM lgx_threads WHERE thread_id = $1 FOR NO KEY UPDATE
), target AS (
    SELECT thread_id, checkpoint_ns, checkpoint_id FROM lgx_checkpoints
    WHERE thread_id = $1 AND checkpoint_ns = $2 AND checkpoint_id = $3
      AND (SELECT count(*) FROM thread_row) >= 0
    FOR UPDATE
), logged AS (
    INSERT INTO lgx_schema_log
        (thread_id, checkpoint_ns, checkpoint_id, from_version, to_version, migrated_at)
    SELECT thread_id, checkpoint_ns, checkpoint_id, $4::integer, $5::integer,
           $6::double precision
    FROM target
    ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, to_version) DO NOTHING
    RETURNING 1
), rewritten AS (
    UPDATE lgx_checkpoints
    SET type = $7, checkpoint = $8, metadata_type = $9, metadata = $10
    WHERE thread_id = $1 AND checkpoint_ns = $2 AND checkpoint_id = $3
      AND EXISTS (SELECT 1 FROM logged)
    RETURNING thread_id
), bumped AS (
    INSERT INTO lgx_threads (thread_id, created_at, written_at, generation)
    SELECT thread_id, $11::double precision, $11::double precision, 1 FROM rewritten
    ON CONFLICT (thread_id) DO UPDATE SET generation = lgx_threads.generation + 1
)
SELECT count(*) FROM rewritten"""
DELETE_CHECKPOINT_WRITES = """
DELETE FROM lgx_writes WHERE thread_id = $1 AND checkpoint_ns = $2 AND checkpoint_id = $3"""

_LOG_COLS = "thread_id, checkpoint_ns, checkpoint_id, from_version, to_version, migrated_at"
_LOG_ORDER = "ORDER BY migrated_at, thread_id, checkpoint_ns, checkpoint_id, to_version"
SELECT_MIGRATIONS = f"SELECT {_LOG_COLS} FROM lgx_schema_log {_LOG_ORDER}"
SELECT_THREAD_MIGRATIONS = f"SELECT {_LOG_COLS} FROM lgx_schema_log WHERE thread_id = $1 {_LOG_ORDER}"

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
SELECT checkpoint_ns, 'checkpoint'::text, ''::text, COUNT(*),
       SUM(octet_length(checkpoint) + octet_length(metadata))
FROM lgx_checkpoints WHERE thread_id = $1 GROUP BY checkpoint_ns
UNION ALL
SELECT checkpoint_ns, 'blob', channel, COUNT(*), SUM(octet_length(data))
FROM lgx_blobs WHERE thread_id = $1 GROUP BY checkpoint_ns, channel
UNION ALL
SELECT checkpoint_ns, 'write', channel, COUNT(*), SUM(octet_length(data))
FROM lgx_writes WHERE thread_id = $1 GROUP BY checkpoint_ns, channel"""


# -- the thread lifecycle (`lgx_threads`, `lgx_lifecycle_log`) -----------------------------------

_STATE_COLS = "thread_id, created_at, written_at, read_at, generation, pinned, policy, swept"
# Keyset pages in thread id order (the primary key): $1 the page size, $2 the last id seen.
SELECT_THREAD_STATES = f"SELECT {_STATE_COLS} FROM lgx_threads ORDER BY thread_id LIMIT $1"
SELECT_THREAD_STATES_AFTER = f"""
SELECT {_STATE_COLS} FROM lgx_threads WHERE thread_id > $2 ORDER BY thread_id LIMIT $1"""
SELECT_THREAD_STATE = f"SELECT {_STATE_COLS} FROM lgx_threads WHERE thread_id = $1"
# A pin or a policy before the thread's first write creates its row, generation 0 ($2: now).
SET_PINNED = """
INSERT INTO lgx_threads (thread_id, created_at, written_at, pinned) VALUES ($1, $2, $2, $3)
ON CONFLICT (thread_id) DO UPDATE SET pinned = EXCLUDED.pinned"""
SET_POLICY = """
INSERT INTO lgx_threads (thread_id, created_at, written_at, policy) VALUES ($1, $2, $2, $3)
ON CONFLICT (thread_id) DO UPDATE SET policy = EXCLUDED.policy"""
TOUCH_THREAD = "UPDATE lgx_threads SET read_at = $2 WHERE thread_id = $1"
MARK_SWEPT = "UPDATE lgx_threads SET swept = $2 WHERE thread_id = $1"

INSERT_LIFECYCLE = """
INSERT INTO lgx_lifecycle_log (at, action, thread, checkpoints, reason)
SELECT * FROM unnest($1::double precision[], $2::text[], $3::text[], $4::bigint[], $5::text[])"""
_LIFECYCLE_COLS = "at, action, thread, checkpoints, reason"
SELECT_LIFECYCLE = f"SELECT {_LIFECYCLE_COLS} FROM lgx_lifecycle_log ORDER BY seq"
SELECT_THREAD_LIFECYCLE = f"""
SELECT {_LIFECYCLE_COLS} FROM lgx_lifecycle_log WHERE thread = $1 ORDER BY seq"""

# The sweep lock of the schema the tables are in (the one `search_path` resolves them to, so
# every checkpointer of the schema, however configured, agrees): a session-level advisory lock
# (the one-bigint form, so never a thread's), its key a hash of the schema's name. A session
# that ends (a killed process) releases it. Returns the key, to unlock with, and whether held.
TRY_SWEEP_LOCK = """
SELECT k, pg_try_advisory_lock(k) FROM (
    SELECT ('x' || substr(md5('lgx-sweep:' || coalesce(current_schema(), '')), 1, 16))
           ::bit(64)::bigint AS k
) s"""
SWEEP_UNLOCK = "SELECT pg_advisory_unlock($1)"

# -- one writer per thread: tombstones, leases, the epoch (`core.guard`) ------------------

SELECT_TOMBSTONE = "SELECT deleted_at FROM lgx_tombstones WHERE thread_id = $1"
# Tombstones left before $1, and leases expired before it, at most $2 of each (NULL: all).
DROP_TOMBSTONES = """
WITH dead_leases AS (
    DELETE FROM lgx_leases WHERE thread_id IN (
        SELECT thread_id FROM lgx_leases WHERE expires_at < $1 ORDER BY expires_at LIMIT $2)
), gone AS (
    DELETE FROM lgx_tombstones WHERE thread_id IN (
        SELECT thread_id FROM lgx_tombstones WHERE deleted_at < $1 ORDER BY deleted_at LIMIT $2)
    RETURNING 1
)
SELECT count(*) FROM gone"""
# Lease thread $1 to token $2 until $3, unless another token's lease is live at $4 (then no
# row comes back). Its caller holds the thread's lock alone: no guarded write is half-way.
ACQUIRE_LEASE = """
INSERT INTO lgx_leases AS l (thread_id, token, expires_at) VALUES ($1, $2, $3)
ON CONFLICT (thread_id) DO UPDATE SET token = EXCLUDED.token, expires_at = EXCLUDED.expires_at
WHERE l.token = EXCLUDED.token OR l.expires_at <= $4
RETURNING 1"""
RENEW_LEASE = """
UPDATE lgx_leases SET expires_at = $3
WHERE thread_id = $1 AND token = $2 AND expires_at > $4 RETURNING 1"""
RELEASE_LEASE = "DELETE FROM lgx_leases WHERE thread_id = $1 AND token = $2"
SELECT_LEASE = "SELECT token, expires_at FROM lgx_leases WHERE thread_id = $1"
SELECT_EPOCH = "SELECT epoch FROM lgx_epoch"
RAISE_EPOCH = "UPDATE lgx_epoch SET epoch = greatest(epoch, $1) RETURNING epoch"

# Our tables: their size in bytes (heap, TOAST and indexes), and VACUUM (outside a transaction).
TABLES = ("lgx_checkpoints", "lgx_blobs", "lgx_writes", "lgx_schema_log", "lgx_audit_log",
          "lgx_threads", "lgx_lifecycle_log", "lgx_migrations", "lgx_tombstones", "lgx_leases",
          "lgx_epoch")
STORAGE_SIZE = """
SELECT coalesce(sum(pg_total_relation_size(r)), 0)::bigint
FROM unnest($1::text[]) AS t(name), LATERAL to_regclass(t.name) AS r WHERE r IS NOT NULL"""
VACUUM = f"VACUUM (ANALYZE) {', '.join(TABLES)}"

# -- read replicas (`PostgresStore` with `read_replicas`) --------------------------------------

# A WAL position at or past a client's committed write, read on its connection after the
# commit: the flushed one, since the commit waited for its flush (`synchronous_commit` on or
# more) and a standby receives WAL only as far as it is flushed (the written position may be
# past what a dead primary ever sends).
CURRENT_LSN = "SELECT (pg_current_wal_flush_lsn() - '0/0'::pg_lsn)::bigint"
# How far a server has replayed: a standby's replay position, a primary's (a promoted standby)
# current one.
REPLAYED_LSN = """
SELECT (CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn()
             ELSE pg_current_wal_lsn() END - '0/0'::pg_lsn)::bigint"""
