"""Storage migrations of the PostgreSQL backend: step N brings the tables to version N.

`setup()` takes a transaction-scoped advisory lock, then applies each pending step in one
transaction together with its row in `lgx_migrations`. Text columns that are ordered use the
"C" collation, so that the database orders them as Python does (`writes_sort_key`).
A statement that names `$1` is given the store's clock (`PostgresStore.clock()`, epoch seconds)
there: the time a step stamps on rows it backfills. Append steps; never edit a released one.
"""

from __future__ import annotations

MIGRATIONS: list[list[str]] = [
    # 1: checkpoints, per-channel blobs (full values or append-deltas), pending writes.
    [
        """CREATE TABLE lgx_checkpoints (
            thread_id TEXT COLLATE "C" NOT NULL,
            checkpoint_ns TEXT COLLATE "C" NOT NULL DEFAULT '',
            checkpoint_id TEXT COLLATE "C" NOT NULL,
            parent_checkpoint_id TEXT COLLATE "C",
            run_id TEXT,
            type TEXT NOT NULL,
            checkpoint BYTEA NOT NULL,
            metadata_type TEXT NOT NULL,
            metadata BYTEA NOT NULL,
            PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id)
        )""",
        "CREATE INDEX lgx_checkpoints_run_id ON lgx_checkpoints (run_id) WHERE run_id IS NOT NULL",
        "CREATE INDEX lgx_checkpoints_thread_order "
        "ON lgx_checkpoints (thread_id, checkpoint_id, checkpoint_ns)",
        """CREATE TABLE lgx_blobs (
            thread_id TEXT COLLATE "C" NOT NULL,
            checkpoint_ns TEXT COLLATE "C" NOT NULL DEFAULT '',
            channel TEXT COLLATE "C" NOT NULL,
            version TEXT COLLATE "C" NOT NULL,
            type TEXT NOT NULL,
            data BYTEA NOT NULL,
            base_version TEXT COLLATE "C",
            PRIMARY KEY (thread_id, checkpoint_ns, channel, version)
        )""",
        """CREATE TABLE lgx_writes (
            thread_id TEXT COLLATE "C" NOT NULL,
            checkpoint_ns TEXT COLLATE "C" NOT NULL DEFAULT '',
            checkpoint_id TEXT COLLATE "C" NOT NULL,
            task_id TEXT COLLATE "C" NOT NULL,
            idx INTEGER NOT NULL,
            channel TEXT COLLATE "C" NOT NULL,
            type TEXT NOT NULL,
            data BYTEA NOT NULL,
            task_path TEXT COLLATE "C" NOT NULL DEFAULT '',
            PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id, task_id, idx)
        )""",
    ],
    # 2: the log of state-schema migrations of stored checkpoints (`rewrite_checkpoint`); its
    # key makes a rewrite happen once, whoever retries it. Read in time order.
    [
        """CREATE TABLE lgx_schema_log (
            thread_id TEXT COLLATE "C" NOT NULL,
            checkpoint_ns TEXT COLLATE "C" NOT NULL DEFAULT '',
            checkpoint_id TEXT COLLATE "C" NOT NULL,
            from_version INTEGER NOT NULL,
            to_version INTEGER NOT NULL,
            migrated_at DOUBLE PRECISION NOT NULL,
            PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id, to_version)
        )""",
        "CREATE INDEX lgx_schema_log_order "
        "ON lgx_schema_log (migrated_at, thread_id, checkpoint_ns, checkpoint_id, to_version)",
    ],
    # 3: the store's audit log: auditing turned on or off (`log_audit_switch`), the newest row
    # in force (a store-level setting every checkpointer of the schema follows).
    [
        """CREATE TABLE lgx_audit_log (
            seq BIGSERIAL PRIMARY KEY,
            enabled BOOLEAN NOT NULL,
            at DOUBLE PRECISION NOT NULL,
            reason TEXT NOT NULL
        )""",
    ],
    # 4: the thread lifecycle (retention, sweeps, erasure): one row per thread, kept by every
    # write in the write's own statement (`PUT_CHECKPOINT`, `WRITE_BATCH`, `WRITE_WRITES`), and
    # the log of deletions (thread digests, never ids). A thread row is updated at every write:
    # the free space a fillfactor leaves keeps those updates on their page (HOT, no index
    # write). Threads stored before this step get a row stamped with the time of the step.
    [
        """CREATE TABLE lgx_threads (
            thread_id TEXT COLLATE "C" PRIMARY KEY,
            created_at DOUBLE PRECISION NOT NULL,
            written_at DOUBLE PRECISION NOT NULL,
            read_at DOUBLE PRECISION,
            generation BIGINT NOT NULL DEFAULT 0,
            pinned BOOLEAN NOT NULL DEFAULT false,
            policy TEXT,
            swept BIGINT
        ) WITH (fillfactor = 70)""",
        """CREATE TABLE lgx_lifecycle_log (
            seq BIGSERIAL PRIMARY KEY,
            at DOUBLE PRECISION NOT NULL,
            action TEXT NOT NULL,
            thread TEXT COLLATE "C" NOT NULL,
            checkpoints BIGINT NOT NULL,
            reason TEXT NOT NULL DEFAULT ''
        )""",
        "CREATE INDEX lgx_lifecycle_log_thread ON lgx_lifecycle_log (thread, seq)",
        """INSERT INTO lgx_threads (thread_id, created_at, written_at, generation)
        SELECT thread_id, $1::double precision, $1::double precision, 1
        FROM (SELECT thread_id FROM lgx_checkpoints UNION SELECT thread_id FROM lgx_writes) t""",
    ],
    # 5: one writer per thread (`core.guard`): tombstones of deleted threads, leases, the
    # store's writer epoch (one row), and the two functions a guarded write calls after it
    # holds its thread's row lock. `lgx_guard_facts` is VOLATILE plpgsql, so each of its
    # queries takes a snapshot of its own: it sees every write committed before the lock was
    # granted, which a sub-query of the calling statement (whose snapshot predates the wait)
    # would not. `lgx_guard_expect` aborts the calling statement (SQLSTATE LX001) when the
    # facts are not the ones its caller decided on.
    [
        """CREATE TABLE lgx_tombstones (
            thread_id TEXT COLLATE "C" PRIMARY KEY,
            deleted_at DOUBLE PRECISION NOT NULL,
            last_checkpoint_id TEXT COLLATE "C" NOT NULL DEFAULT ''
        )""",
        "CREATE INDEX lgx_tombstones_at ON lgx_tombstones (deleted_at)",
        """CREATE TABLE lgx_leases (
            thread_id TEXT COLLATE "C" PRIMARY KEY,
            token TEXT NOT NULL,
            expires_at DOUBLE PRECISION NOT NULL
        )""",
        "CREATE INDEX lgx_leases_expiry ON lgx_leases (expires_at)",
        """CREATE TABLE lgx_epoch (
            one BOOLEAN PRIMARY KEY DEFAULT true CHECK (one),
            epoch BIGINT NOT NULL
        )""",
        "INSERT INTO lgx_epoch (one, epoch) VALUES (true, 0)",
        """CREATE FUNCTION lgx_guard_facts(
            p_thread TEXT, p_ns TEXT, p_checkpoint TEXT, p_lock_epoch BOOLEAN
        ) RETURNS TABLE (f_head TEXT, f_tombstoned BOOLEAN, f_token TEXT,
                         f_expires DOUBLE PRECISION, f_epoch BIGINT, f_exists BOOLEAN,
                         f_newer BOOLEAN)
        LANGUAGE plpgsql VOLATILE AS $fn$
        BEGIN
            IF p_lock_epoch THEN  -- a raise of the epoch waits for this write to commit
                SELECT e.epoch INTO f_epoch FROM lgx_epoch e FOR SHARE;
            ELSE
                SELECT e.epoch INTO f_epoch FROM lgx_epoch e;
            END IF;
            SELECT c.checkpoint_id INTO f_head FROM lgx_checkpoints c
            WHERE c.thread_id = p_thread AND c.checkpoint_ns = p_ns
            ORDER BY c.checkpoint_id DESC LIMIT 1;
            f_tombstoned := EXISTS (SELECT 1 FROM lgx_tombstones t WHERE t.thread_id = p_thread);
            SELECT l.token, l.expires_at INTO f_token, f_expires FROM lgx_leases l
            WHERE l.thread_id = p_thread;
            f_exists := p_checkpoint IS NOT NULL AND EXISTS (
                SELECT 1 FROM lgx_checkpoints c WHERE c.thread_id = p_thread
                AND c.checkpoint_ns = p_ns AND c.checkpoint_id = p_checkpoint);
            -- newer than every checkpoint the thread's delete removed: a new run's
            f_newer := p_checkpoint IS NOT NULL AND EXISTS (
                SELECT 1 FROM lgx_tombstones t WHERE t.thread_id = p_thread
                AND p_checkpoint COLLATE "C" > t.last_checkpoint_id);
            RETURN NEXT;
        END
        $fn$""",
        """CREATE FUNCTION lgx_guard_expect(p_ok BOOLEAN) RETURNS BOOLEAN
        LANGUAGE plpgsql VOLATILE AS $fn$
        BEGIN
            IF p_ok IS NOT TRUE THEN
                RAISE EXCEPTION 'lgx: the thread changed since this write was decided'
                    USING ERRCODE = 'LX001';
            END IF;
            RETURN true;
        END
        $fn$""",
    ],
]

LATEST = len(MIGRATIONS)
