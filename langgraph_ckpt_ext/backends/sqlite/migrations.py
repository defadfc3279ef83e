"""Storage migrations of the SQLite backend: step N brings the tables to version N.

`setup()` applies each pending step in its own `BEGIN IMMEDIATE` transaction together with its
row in `lgx_migrations`, so a step and its record commit together, and two processes running
`setup()` at once apply each step once. A statement that names `:now` is given the store's clock
(`SQLiteStore.clock()`, epoch seconds) there: the time a step stamps on rows it backfills.
Append steps; never edit a released one.
"""

from __future__ import annotations

MIGRATIONS: list[list[str]] = [
    # 1: checkpoints, per-channel blobs (full values or append-deltas), pending writes.
    [
        """CREATE TABLE lgx_checkpoints (
            thread_id TEXT NOT NULL,
            checkpoint_ns TEXT NOT NULL DEFAULT '',
            checkpoint_id TEXT NOT NULL,
            parent_checkpoint_id TEXT,
            run_id TEXT,
            type TEXT NOT NULL,
            checkpoint BLOB NOT NULL,
            metadata_type TEXT NOT NULL,
            metadata BLOB NOT NULL,
            PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id)
        )""",
        "CREATE INDEX lgx_checkpoints_run_id ON lgx_checkpoints (run_id) WHERE run_id IS NOT NULL",
        """CREATE TABLE lgx_blobs (
            thread_id TEXT NOT NULL,
            checkpoint_ns TEXT NOT NULL DEFAULT '',
            channel TEXT NOT NULL,
            version TEXT NOT NULL,
            type TEXT NOT NULL,
            data BLOB NOT NULL,
            base_version TEXT,
            PRIMARY KEY (thread_id, checkpoint_ns, channel, version)
        )""",
        """CREATE TABLE lgx_writes (
            thread_id TEXT NOT NULL,
            checkpoint_ns TEXT NOT NULL DEFAULT '',
            checkpoint_id TEXT NOT NULL,
            task_id TEXT NOT NULL,
            idx INTEGER NOT NULL,
            channel TEXT NOT NULL,
            type TEXT NOT NULL,
            data BLOB NOT NULL,
            task_path TEXT NOT NULL DEFAULT '',
            PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id, task_id, idx)
        )""",
    ],
    # 2: a thread's checkpoints in `list` order across namespaces, without sorting the thread.
    [
        "CREATE INDEX lgx_checkpoints_thread_order "
        "ON lgx_checkpoints (thread_id, checkpoint_id, checkpoint_ns)",
    ],
    # 3: the log of state-schema migrations of stored checkpoints (`rewrite_checkpoint`): a
    # checkpoint migrates to a version at most once; read back in time order.
    [
        """CREATE TABLE lgx_schema_log (
            thread_id TEXT NOT NULL,
            checkpoint_ns TEXT NOT NULL DEFAULT '',
            checkpoint_id TEXT NOT NULL,
            from_version INTEGER NOT NULL,
            to_version INTEGER NOT NULL,
            migrated_at REAL NOT NULL,
            PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id, to_version)
        )""",
        "CREATE INDEX lgx_schema_log_order ON lgx_schema_log "
        "(migrated_at, thread_id, checkpoint_ns, checkpoint_id, to_version)",
    ],
    # 4: the store's audit log: auditing turned on or off (`log_audit_switch`), the newest row
    # in force (a store-level setting every checkpointer of the file follows).
    [
        """CREATE TABLE lgx_audit_log (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            enabled INTEGER NOT NULL,
            at REAL NOT NULL,
            reason TEXT NOT NULL
        )""",
    ],
    # 5: the thread lifecycle (retention, sweeps, erasure): one row per thread, kept by every
    # write in the write's own transaction, and the log of deletions (thread ids as digests).
    # Existing threads get a row stamped with the time of this migration: when they were
    # really created or last written is not known, and the migration time is the conservative
    # guess (an idle policy counts from the upgrade, never expiring a thread early).
    # Beside this step, `setup` switches an existing file to incremental auto-vacuum (a
    # VACUUM, which no transaction can hold: see `store._incremental_auto_vacuum`).
    [
        """CREATE TABLE lgx_threads (
            thread_id TEXT PRIMARY KEY,
            created_at REAL NOT NULL,
            written_at REAL NOT NULL,
            read_at REAL,
            generation INTEGER NOT NULL DEFAULT 0,
            pinned INTEGER NOT NULL DEFAULT 0,
            policy TEXT,
            swept INTEGER
        ) WITHOUT ROWID""",
        """CREATE TABLE lgx_lifecycle_log (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            at REAL NOT NULL,
            action TEXT NOT NULL,
            thread TEXT NOT NULL,
            checkpoints INTEGER NOT NULL,
            reason TEXT NOT NULL DEFAULT ''
        )""",
        "CREATE INDEX lgx_lifecycle_log_thread ON lgx_lifecycle_log (thread, seq)",
        # The thread ids by a loose index scan of each table (one probe per thread: 0.02 s
        # where reading every row takes 0.3 s, for 1.2 million rows of 2,100 threads).
        """WITH RECURSIVE
            c(tid) AS (SELECT MIN(thread_id) FROM lgx_checkpoints
                       UNION ALL
                       SELECT (SELECT MIN(thread_id) FROM lgx_checkpoints WHERE thread_id > c.tid)
                       FROM c WHERE c.tid IS NOT NULL),
            w(tid) AS (SELECT MIN(thread_id) FROM lgx_writes
                       UNION ALL
                       SELECT (SELECT MIN(thread_id) FROM lgx_writes WHERE thread_id > w.tid)
                       FROM w WHERE w.tid IS NOT NULL)
        INSERT OR IGNORE INTO lgx_threads (thread_id, created_at, written_at, generation)
        SELECT tid, :now, :now, 1
        FROM (SELECT tid FROM c UNION SELECT tid FROM w)
        WHERE tid IS NOT NULL""",
    ],
    # 6: one writer per thread (`core.guard`): tombstones of deleted threads (kept apart from
    # the lifecycle rows, which go with the thread), leases with their fencing tokens, and the
    # store's writer epoch (one row). Times are the checkpointer's `clock()`. A guarded write
    # reads all of them, with the namespace's head (the primary key serves MAX(checkpoint_id)),
    # in its own write transaction. A tombstone keeps the newest checkpoint id the delete
    # removed: pending writes for a newer checkpoint come from a run that started after the
    # delete (LangGraph may store a step's writes before their checkpoint's put lands).
    [
        """CREATE TABLE lgx_tombstones (
            thread_id TEXT PRIMARY KEY,
            deleted_at REAL NOT NULL,
            last_checkpoint_id TEXT NOT NULL DEFAULT ''
        ) WITHOUT ROWID""",
        "CREATE INDEX lgx_tombstones_deleted_at ON lgx_tombstones (deleted_at)",
        """CREATE TABLE lgx_leases (
            thread_id TEXT PRIMARY KEY,
            token TEXT NOT NULL,
            expires_at REAL NOT NULL
        ) WITHOUT ROWID""",
        """CREATE TABLE lgx_epoch (
            one INTEGER PRIMARY KEY CHECK (one = 1),
            epoch INTEGER NOT NULL
        )""",
        "INSERT INTO lgx_epoch (one, epoch) VALUES (1, 0)",
    ],
]

LATEST = len(MIGRATIONS)
