"""The thread lifecycle on SQLite: the rows every write keeps, storage migration 5 of an
existing file (lifecycle rows backfilled, incremental auto-vacuum switched on), space given
back by `vacuum`, and sweeps by several processes on one file (one at a time; a SIGKILLed
sweeper leaves every thread whole or gone, and its lock behind it released).

Time is an injected clock; no test sleeps for a TTL.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.base import empty_checkpoint

from langgraph_ckpt_ext import Retention, SQLiteCheckpointer, connect
from langgraph_ckpt_ext.backends.sqlite.migrations import LATEST, MIGRATIONS
from langgraph_ckpt_ext.backends.sqlite.store import _incremental_auto_vacuum
from langgraph_ckpt_ext.core.retention import LifecycleEvent, thread_digest
from langgraph_ckpt_ext.core.rows import MigrationEntry, WriteRow
from tests.support.forked import Forked, start
from tests.support.lifecycle import Clock, cfg

T0 = 1_000_000.0  # the fill clock of the process tests


def put_thread(cp: SQLiteCheckpointer, thread_id: str, checkpoints: int, size: int = 0) -> None:
    """`checkpoints` checkpoints of the thread; each holds `size` bytes of its own (hex)."""
    config: Any = cfg(thread_id)
    version = None
    for i in range(checkpoints):
        ckpt = empty_checkpoint()
        version = cp.get_next_version(version, None)
        ckpt["channel_values"] = {"n": i, "pad": os.urandom(size // 2).hex()}
        ckpt["channel_versions"] = {"n": version, "pad": version}
        config = cp.put(config, ckpt, {"step": i}, {"n": version, "pad": version})


def pragma(path: Path, name: str) -> Any:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(f"PRAGMA {name}").fetchone()[0]
    finally:
        conn.close()


def file_bytes(path: Path) -> int:
    wal = Path(f"{path}-wal")
    return path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "life.db"


@pytest.fixture
def cp(db: Path) -> Iterator[SQLiteCheckpointer]:
    with SQLiteCheckpointer(db) as saver:
        saver.clock = Clock()
        yield saver


# -- the lifecycle rows -----------------------------------------------------------------------


def test_every_write_path_keeps_the_row_in_its_transaction(cp: SQLiteCheckpointer) -> None:
    clock: Clock = cp.clock  # type: ignore[assignment]
    store = cp._store
    put_thread(cp, "a", 2)
    state = cp.thread_state("a")
    assert state is not None and state.created_at == state.written_at == clock.now
    assert state.generation == 2 and not state.pinned and state.read_at is None
    first = cp.get_tuple(cfg("a"))
    assert first is not None

    clock.now += 10
    cp.put_writes(first.config, [("n", 5)], "task-1")  # one statement for the thread
    state = cp.thread_state("a")
    assert state is not None and state.generation == 3 and state.written_at == clock.now
    assert state.created_at == clock.now - 10

    # a batch: one upsert per thread, whatever the number of its items
    row = next(iter(cp.run_sync(_rows(store, "a"))))
    write = WriteRow("b", "", "c-b", "task", 0, "n", "json", b"1", "")
    clock.now += 10
    cp.run_sync(store.write_batch([(row, []), (row, []), [write], [write]]))
    a, b = cp.thread_state("a"), cp.thread_state("b")
    assert a is not None and a.generation == 4 and a.written_at == clock.now
    assert b is not None and b.generation == 1 and b.created_at == clock.now

    # a schema migration is a change (generation) but not activity (written_at)
    clock.now += 10
    entry = MigrationEntry("a", "", row.checkpoint_id, 1, 2, clock.now)
    assert cp.run_sync(store.rewrite_checkpoint(row, [], None, entry))
    a = cp.thread_state("a")
    assert a is not None and a.generation == 5 and a.written_at == clock.now - 10

    # a copy gives the target a row of its own, as a write; the source's is unchanged
    clock.now += 10
    cp.copy_thread("a", "a-copy")
    copy = cp.thread_state("a-copy")
    assert copy is not None and copy.created_at == copy.written_at == clock.now
    assert copy.generation == 1 and cp.thread_state("a") == a

    # cutting history leaves the row; deleting the thread deletes it and its schema log
    assert len(list(cp.list(cfg("a")))) == 2
    cp.prune(["a"])
    assert len(list(cp.list(cfg("a")))) == 1 and cp.thread_state("a") == a
    cp.delete_thread("a")
    assert cp.thread_state("a") is None and cp.migration_log("a") == []
    assert cp.thread_state("a-copy") is not None


async def _rows(store: Any, thread_id: str) -> list[Any]:
    from langgraph_ckpt_ext.core.rows import ListQuery

    return [r async for r in store.iter_checkpoints(ListQuery(thread_id=thread_id))]


def test_a_failed_write_changes_no_row(cp: SQLiteCheckpointer) -> None:
    """The upsert rides in the write's savepoint: a write that fails leaves the row as it
    was (here: a NOT NULL violation of a checkpoint row, after the batch's pending writes
    went in: they are rolled back too)."""
    put_thread(cp, "a", 1)
    before = cp.thread_state("a")
    row = cp.run_sync(_rows(cp._store, "a"))[0]
    from dataclasses import replace

    bad = replace(row, checkpoint=(None, None))
    with pytest.raises(sqlite3.IntegrityError):
        cp.run_sync(cp._store.write_batch([[WriteRow("a", "", "x", "t", 0, "n", "json", b"1",
                                                      "")], (bad, [])]))
    assert cp.thread_state("a") == before
    assert cp.get_tuple(cfg("a", checkpoint_id="x")) is None
    assert cp.run_sync(cp._store.read_writes("a", "", ["x"])) == {}


def test_pins_policies_reads_and_swept_marks(cp: SQLiteCheckpointer) -> None:
    clock: Clock = cp.clock  # type: ignore[assignment]
    cp.pin("later")  # before the first write: a row of generation 0
    state = cp.thread_state("later")
    assert state is not None and state.pinned and state.generation == 0
    put_thread(cp, "later", 1)
    cp.set_thread_retention("later", Retention(idle=5))
    state = cp.thread_state("later")
    assert state is not None and state.pinned and state.generation == 1
    assert state.policy is not None and Retention.from_json(state.policy).idle == 5
    cp.unpin("later")
    cp.set_thread_retention("later", None)
    clock.now += 3
    cp.run_sync(cp._store.touch_thread("later"))
    cp.run_sync(cp._store.touch_thread("nobody"))  # no row: nothing made
    cp.run_sync(cp._store.mark_swept("later", 1))
    state = cp.thread_state("later")
    assert state is not None and not state.pinned and state.policy is None
    assert state.read_at == clock.now and state.swept == 1
    assert cp.thread_state("nobody") is None


def test_thread_states_pages_by_thread_id(cp: SQLiteCheckpointer) -> None:
    store = cp._store
    for i in range(7):
        cp.pin(f"t{6 - i}")
    seen, cursor = [], None
    while True:
        states, cursor = cp.run_sync(store.thread_states(cursor, 3))
        seen += [s.thread_id for s in states]
        if cursor is None:
            break
    assert seen == [f"t{i}" for i in range(7)]


def test_expire_thread_deletes_everything_only_at_its_generation(cp: SQLiteCheckpointer) -> None:
    store = cp._store
    put_thread(cp, "t", 3)
    row = cp.run_sync(_rows(store, "t"))[0]
    cp.run_sync(store.rewrite_checkpoint(row, [], None, MigrationEntry("t", "", row.checkpoint_id,
                                                                       1, 2, 1.0)))
    state = cp.thread_state("t")
    assert state is not None
    assert cp.run_sync(store.expire_thread("t", state.generation - 1)) is False
    assert cp.run_sync(store.expire_thread("nobody", 1)) is False
    assert cp.run_sync(store.expire_thread("t", state.generation)) is True
    conn = sqlite3.connect(cp._where)
    for table in ("lgx_checkpoints", "lgx_blobs", "lgx_writes", "lgx_schema_log", "lgx_threads"):
        assert conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0] == 0, table
    conn.close()


def test_lifecycle_log_survives_the_thread_and_the_file(db: Path) -> None:
    events = [LifecycleEvent(1.0, "erase", thread_digest("a"), 3, "GDPR 1"),
              LifecycleEvent(2.0, "expire", thread_digest("b"), 0, "retention")]
    with SQLiteCheckpointer(db) as cp:
        cp.run_sync(cp._store.log_lifecycle(events))
        cp.run_sync(cp._store.log_lifecycle([]))
    with SQLiteCheckpointer(db) as cp:
        assert cp.lifecycle_log() == events
        assert cp.lifecycle_log("b") == events[1:]


def test_retention_through_the_constructor_and_urls(db: Path) -> None:
    with SQLiteCheckpointer(db, retention={"idle": 60}) as cp:
        assert cp.retention == Retention(idle=60)
    with SQLiteCheckpointer.from_conn_string(f"sqlite:///{db}", retention=Retention(keep=2)) as cp:
        assert cp.retention == Retention(keep=2)
    with connect(f"sqlite:///{db}", retention={"default_ttl": 1}) as url_cp:
        assert url_cp.retention == Retention(idle=60)
    swept = SQLiteCheckpointer(db, retention={"idle": 1}, sweep_every=3600)
    try:
        assert swept._sweeper is not None and swept._sweeper.schedule.interval == 3600
    finally:
        swept.close()
    assert swept._sweeper is None


# -- sweep locks ------------------------------------------------------------------------------


def test_sweep_lock_one_holder_per_file_and_per_memory_store(db: Path) -> None:
    async def nested(outer: Any, inner: Any) -> tuple[bool, bool, bool]:
        async with outer.sweep_lock() as first, inner.sweep_lock() as second:
            pass
        async with inner.sweep_lock() as again:
            return first, second, again

    with SQLiteCheckpointer(db) as a, SQLiteCheckpointer(db) as b:
        assert a.run_sync(nested(a._store, b._store)) == (True, False, True)
        assert a.run_sync(nested(a._store, a._store)) == (True, False, True)
        assert Path(f"{db}-sweep.lock").exists()
    with SQLiteCheckpointer(":memory:") as m, SQLiteCheckpointer(":memory:") as n:
        assert m.run_sync(nested(m._store, m._store)) == (True, False, True)
        # two databases in memory are two stores: nothing shared to sweep twice
        assert m.run_sync(nested(m._store, n._store)) == (True, True, True)


# -- auto-vacuum and space ----------------------------------------------------------------------


def test_a_new_file_is_incremental_from_its_first_table(db: Path, tmp_path: Path) -> None:
    with SQLiteCheckpointer(db):
        pass
    assert pragma(db, "auto_vacuum") == 2 and pragma(db, "journal_mode") == "wal"
    with SQLiteCheckpointer(":memory:") as cp:  # in memory too (its vacuum is then pages)
        store: Any = cp._store
        assert cp.run_sync(store._writer.call(
            lambda c: c.execute("PRAGMA auto_vacuum").fetchone()[0])) == 2


def test_vacuum_gives_the_space_of_swept_threads_back(cp: SQLiteCheckpointer, db: Path) -> None:
    clock: Clock = cp.clock  # type: ignore[assignment]
    for i in range(40):
        put_thread(cp, f"old{i:02}", 5, size=4000)
    clock.now += 100
    for i in range(4):
        put_thread(cp, f"new{i}", 5, size=4000)
    cp.retention = Retention(idle=50)
    cp.vacuum()  # nothing deleted yet: the WAL is folded in, the file is its full size
    full = file_bytes(db)
    assert full > 40 * 5 * 4000
    report = cp.sweep()
    assert len(report.deleted) == 40
    assert file_bytes(db) >= full  # deleting frees pages inside the file, nothing more
    before, after = cp.vacuum()
    assert before >= full and after == file_bytes(db)
    assert after < full / 4  # most of it was the old threads
    for i in range(4):  # what stays reads back whole
        assert len(list(cp.list(cfg(f"new{i}")))) == 5
        tup = cp.get_tuple(cfg(f"new{i}"))
        assert tup is not None and len(tup.checkpoint["channel_values"]["pad"]) == 4000
    assert cp.vacuum()[1] == after  # nothing more to give back


def _old_layout(path: Path, source: Path) -> None:
    """A file as the code of storage version 4 left it: WAL, no auto-vacuum, tables of
    migrations 1-4 with their lgx_migrations rows, holding `source`'s rows."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("CREATE TABLE lgx_migrations (version INTEGER PRIMARY KEY, applied_at TEXT "
                 "NOT NULL)")
    conn.execute("BEGIN")
    for version, step in enumerate(MIGRATIONS[:4], start=1):
        for statement in step:
            conn.execute(statement)
        conn.execute("INSERT INTO lgx_migrations VALUES (?, 'then')", (version,))
    conn.execute("ATTACH DATABASE ? AS src", (str(source),))
    for table in ("lgx_checkpoints", "lgx_blobs", "lgx_writes"):
        conn.execute(f"INSERT INTO {table} SELECT * FROM src.{table}")
    conn.execute("COMMIT")
    conn.execute("DETACH DATABASE src")
    conn.close()


def test_an_old_file_is_upgraded_and_its_threads_expire_from_the_upgrade(tmp_path: Path) -> None:
    source, db = tmp_path / "src.db", tmp_path / "old.db"
    with SQLiteCheckpointer(source) as src:
        for i in range(20):
            put_thread(src, f"t{i:02}", 3, size=4000)
        # a thread with pending writes and no checkpoint (a run that failed at its first step)
        src.put_writes(cfg("w-only", checkpoint_id="1ef"), [("n", 1)], "task")
    _old_layout(db, source)
    assert pragma(db, "auto_vacuum") == 0
    reader = sqlite3.connect(db, isolation_level=None)  # another process reading meanwhile
    reader.execute("BEGIN")
    reader.execute("SELECT COUNT(*) FROM lgx_checkpoints").fetchone()

    t0 = time.time()
    with SQLiteCheckpointer(db) as cp:
        t1 = time.time()
        reader.execute("COMMIT")
        assert cp.storage_version() == LATEST == 6
        assert pragma(db, "auto_vacuum") == 2  # switched, by one VACUUM at setup
        states = cp.run_sync(cp._store.thread_states(None, 100))[0]
        assert [s.thread_id for s in states] == [f"t{i:02}" for i in range(20)] + ["w-only"]
        for s in states:
            assert t0 - 1 <= s.created_at == s.written_at <= t1 + 1 and s.generation == 1
        cp.clock = Clock(t1 + 2)
        put_thread(cp, "fresh", 1)
        cp.retention = Retention(idle=3600)
        cp.clock = Clock(t0 + 3000)
        assert cp.sweep().deleted == []  # an hour from the upgrade, not from 1970
        cp.clock = Clock(t1 + 3601)
        report = cp.sweep()
        assert sorted(report.deleted) == [f"t{i:02}" for i in range(20)] + ["w-only"]
        assert cp.thread_ids() == ["fresh"]
        before, after = cp.vacuum()
        assert after < before / 4
    reader.close()
    with SQLiteCheckpointer(db) as cp:  # idempotent: nothing more to do
        assert cp.setup() == LATEST and pragma(db, "auto_vacuum") == 2


def test_a_busy_file_keeps_working_and_vacuum_switches_it_later(tmp_path: Path) -> None:
    db = tmp_path / "busy.db"
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("CREATE TABLE pad (x BLOB)")
    conn.executemany("INSERT INTO pad VALUES (?)", [(os.urandom(4000),) for _ in range(100)])
    writer = sqlite3.connect(db, isolation_level=None, timeout=0)
    writer.execute("BEGIN IMMEDIATE")  # another process writing past the busy timeout
    vacuuming = sqlite3.connect(db, isolation_level=None, timeout=0.05)
    assert _incremental_auto_vacuum(vacuuming) is False  # a warning, no error
    assert pragma(db, "auto_vacuum") == 0
    writer.execute("ROLLBACK")
    conn.execute("DELETE FROM pad")
    for c in (writer, vacuuming, conn):
        c.close()
    with SQLiteCheckpointer(db, setup=False) as cp:
        before, after = cp.vacuum()  # switches (a full VACUUM this once)
        assert after < before / 4
    assert pragma(db, "auto_vacuum") == 2


def test_the_switch_reads_the_file_not_a_stale_header(tmp_path: Path) -> None:
    """A connection that read the header before another process switched the file sees the
    switch (else every setup of a long-lived process would VACUUM the file again)."""
    db = tmp_path / "stale.db"
    old = sqlite3.connect(db, isolation_level=None)
    old.execute("PRAGMA journal_mode = WAL")
    old.execute("CREATE TABLE pad (x BLOB)")
    assert old.execute("PRAGMA auto_vacuum").fetchone()[0] == 0  # cached now
    other = sqlite3.connect(db, isolation_level=None)
    assert _incremental_auto_vacuum(other) is True
    assert old.execute("PRAGMA auto_vacuum").fetchone()[0] == 0  # the stale cache
    vacuums: list[str] = []
    old.set_trace_callback(lambda statement: vacuums.append(statement)
                           if statement.startswith("VACUUM") else None)
    assert _incremental_auto_vacuum(old) is True and vacuums == []
    for c in (old, other):
        c.close()


# -- sweeps by several processes on one file ------------------------------------------------------


def _worker(target: str, *args: Any) -> Forked:
    return start("tests.support.sweep_worker", target, *map(str, args))


def _events(proc: Forked) -> list[dict[str, Any]]:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    return [json.loads(line) for line in out.splitlines()]


def _fill(target: str, threads: int, checkpoints: int) -> None:
    assert _events(_worker(target, "fill", threads, checkpoints, T0))[-1]["event"] == "filled"


def _next_event(proc: Forked) -> dict[str, Any]:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, proc.stderr.read() if proc.stderr else "the worker ended"
    return json.loads(line)  # type: ignore[no-any-return]


def _expired_lines(proc: Forked, n: int) -> list[dict[str, Any]]:
    """The next `n` threads a "step" sweeper expired: let go after each but the last, after
    which it waits (mid-pass, holding the sweep lock) until told again or its stdin ends."""
    assert proc.stdin is not None
    seen: list[dict[str, Any]] = []
    while len(seen) < n:
        event = _next_event(proc)
        if event["event"] == "expired":
            seen.append(event)
            if len(seen) < n:
                proc.stdin.write("\n")
                proc.stdin.flush()
    return seen


def test_two_processes_sweeping_one_file_one_pass_deletes(db: Path) -> None:
    target, threads = f"sqlite:{db}", 8
    _fill(target, threads, 2)
    first = _worker(target, "sweep", T0 + 100, 10, "-", "step")
    early = _expired_lines(first, 1)  # the first pass holds the lock, waiting mid-pass
    second = _events(_worker(target, "sweep", T0 + 100, 10))
    assert first.poll() is None  # still sweeping when the second one ended
    assert [e["event"] for e in second] == ["start", "done"]
    assert second[-1]["locked_out"] is True and second[-1]["deleted"] == 0
    rest = _events(first)
    expired = early + [e for e in rest if e["event"] == "expired"]
    assert [e["thread"] for e in expired] == [f"t{i:05}" for i in range(threads)]
    assert all(e["done"] for e in expired)  # none twice, none missed
    assert rest[-1] == {"event": "done", "deleted": threads, "locked_out": False, "busy": 0,
                        "examined": threads}
    with SQLiteCheckpointer(db) as cp:
        assert cp.thread_ids() == [] and cp.run_sync(cp._store.thread_states(None, 5))[0] == []


def test_a_sigkilled_sweep_leaves_threads_whole_or_gone(db: Path) -> None:
    target, threads, per_thread = f"sqlite:{db}", 10, 4
    _fill(target, threads, per_thread)
    proc = _worker(target, "sweep", T0 + 100, 10, "-", "step")
    try:
        _expired_lines(proc, 3)
        proc.send_signal(signal.SIGKILL)  # mid-pass, holding the sweep lock
    finally:
        proc.wait(30)
    assert proc.returncode == -9
    with SQLiteCheckpointer(db) as cp:
        gone = 0
        for i in range(threads):
            tid = f"t{i:05}"
            tuples = list(cp.list(cfg(tid)))
            if not tuples:
                assert cp.thread_state(tid) is None
                gone += 1
                continue
            assert len(tuples) == per_thread and cp.thread_state(tid) is not None
            for tup in tuples:  # every checkpoint with the values it names
                step = tup.metadata["step"]
                assert tup.checkpoint["channel_values"]["items"] == list(range(step + 1))
        assert gone == 3
    # the lock died with its holder: the next pass runs, and finishes the job
    done = _events(_worker(target, "sweep", T0 + 100, 10))[-1]
    assert done["locked_out"] is False and done["deleted"] == threads - gone
    with SQLiteCheckpointer(db) as cp:
        assert cp.thread_ids() == []


def test_a_thread_written_by_another_process_during_a_sweep_is_skipped(db: Path) -> None:
    target, threads = f"sqlite:{db}", 6
    _fill(target, threads, 2)
    proc = _worker(target, "sweep", T0 + 100, 10, "-", "step")
    last = f"t{threads - 1:05}"
    try:
        _expired_lines(proc, 1)  # the pass read every row already (one page), and waits
        with SQLiteCheckpointer(db) as cp:
            cp.clock = Clock(T0 + 99)
            tup = cp.get_tuple(cfg(last))
            assert tup is not None
            cp.put_writes(tup.config, [("items", [99])], "late-task")
        events = _events(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    done = events[-1]
    assert done["busy"] == 1 and done["deleted"] == threads - 1
    assert {"event": "expired", "thread": last, "done": False} in events
    with SQLiteCheckpointer(db) as cp:
        assert cp.thread_ids() == [last] and len(list(cp.list(cfg(last)))) == 2
