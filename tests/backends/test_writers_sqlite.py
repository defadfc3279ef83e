"""One writer per thread on SQLite, across processes sharing one file: two processes racing
real graph runs on one thread (exactly one wins each round, the history stays one chain), a
late put from another process after `delete_thread` (refused by the tombstone), a stalled
lease holder (SIGSTOP past its lease) fenced off once it wakes, and storage version 5
upgraded in place to the tables of this issue.

The workers are `tests.support.writers_worker`. The stalled holder's lease runs out in real
time (that is the point: a real stall); no assertion is about timing, only about outcomes.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langgraph.graph import END, START, StateGraph

from langgraph_ckpt_ext import LeaseLostError, SQLiteCheckpointer, ThreadDeletedError
from langgraph_ckpt_ext.backends.sqlite.migrations import LATEST, MIGRATIONS
from tests.support.lifecycle import cfg
from tests.support.writers_worker import LATE_ID, State

ROOT = Path(__file__).resolve().parents[2]


def start(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.support.writers_worker", *args], cwd=ROOT,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def event(proc: subprocess.Popen[str]) -> dict[str, Any]:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.wait(30)
        raise AssertionError(proc.stderr.read() if proc.stderr else "the worker ended")
    return json.loads(line)  # type: ignore[no-any-return]


def go(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None
    proc.stdin.write("go\n")
    proc.stdin.flush()


@pytest.fixture
def workers() -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)  # a stopped worker dies only once continued
            proc.kill()
        proc.wait(30)


def step_graph() -> StateGraph:
    def step(state: State) -> dict[str, Any]:
        return {"log": ["step"]}

    g = StateGraph(State)
    g.add_node("step", step)
    g.add_edge(START, "step")
    g.add_edge("step", END)
    return g


def assert_one_chain(cp: SQLiteCheckpointer, thread_id: str) -> int:
    """Every checkpoint of the thread is an ancestor of its head; how many there are."""
    tuples = list(cp.list(cfg(thread_id)))
    by_id = {t.config["configurable"]["checkpoint_id"]: t for t in tuples}
    seen: set[str] = set()
    cursor: Any = tuples[0]
    while cursor is not None:
        seen.add(cursor.config["configurable"]["checkpoint_id"])
        parent = cursor.parent_config
        cursor = None if parent is None else by_id[parent["configurable"]["checkpoint_id"]]
    assert seen == set(by_id), f"{len(by_id) - len(seen)} checkpoint(s) off the head's chain"
    return len(tuples)


@pytest.mark.parametrize("fresh", [False, True], ids=["existing-thread", "new-thread"])
def test_two_processes_racing_graph_runs_one_wins_each_round(
    tmp_path: Path, workers: list[subprocess.Popen[str]], fresh: bool
) -> None:
    db, signals, rounds = tmp_path / "race.db", tmp_path / "signals", 4
    signals.mkdir()
    with SQLiteCheckpointer(db) as cp:
        if not fresh:
            step_graph().compile(checkpointer=cp).invoke({"log": ["start"]}, cfg("t"))
    workers += [start(str(db), "race", "t", name, str(rounds), str(signals)) for name in "ab"]
    for proc in workers:
        assert event(proc)["event"] == "ready"
    winners = []
    for r in range(rounds):
        (signals / f"go-{r}").touch()
        outcomes = [event(proc) for proc in workers]
        assert sorted(e["event"] for e in outcomes) == ["refused", "won"], outcomes
        assert {e["round"] for e in outcomes} == {r}
        assert [e["error"] for e in outcomes if e["event"] == "refused"] == [
            "ConcurrentWriteError"]
        winners.append("ab"[[e["event"] for e in outcomes].index("won")])
        with SQLiteCheckpointer(db) as cp:
            assert_one_chain(cp, "t")
    for proc in workers:
        assert proc.wait(30) == 0
    with SQLiteCheckpointer(db) as cp:
        # each round's winner ran its step on the one chain (a refused run may have left
        # its first checkpoints on it before it was overtaken: history, not a fork)
        values = cp.get_tuple(cfg("t")).checkpoint["channel_values"]["log"]
        assert [v for v in values if v.startswith("step-")] == [f"step-{w}" for w in winners]
        assert assert_one_chain(cp, "t") >= 3 * rounds


def test_a_late_put_from_another_process_after_delete_is_refused(
    tmp_path: Path, workers: list[subprocess.Popen[str]]
) -> None:
    db = tmp_path / "late.db"
    with SQLiteCheckpointer(db) as cp:
        graph = step_graph().compile(checkpointer=cp)
        graph.invoke({"log": ["start"]}, cfg("d"))
        workers.append(late := start(str(db), "late", "d"))
        assert event(late)["event"] == "read"  # the other process read the thread ...
        cp.delete_thread("d")  # ... and it is deleted before its run writes
        assert cp.tombstone("d") is not None
        go(late)
        assert event(late) == {"event": "late", "put": ThreadDeletedError.__name__,
                               "writes": ThreadDeletedError.__name__}
        assert late.wait(30) == 0
        assert list(cp.list(cfg("d"))) == [] and cp.thread_state("d") is None
        assert cp.get_tuple(cfg("d", checkpoint_id=LATE_ID)) is None
        graph.invoke({"log": ["again"]}, cfg("d"))  # a new run on the thread is welcome
        assert assert_one_chain(cp, "d") == 3


def test_a_stalled_lease_holder_is_fenced_off_when_it_wakes(
    tmp_path: Path, workers: list[subprocess.Popen[str]]
) -> None:
    db = tmp_path / "stall.db"
    with SQLiteCheckpointer(db) as cp:
        graph = step_graph().compile(checkpointer=cp)
        graph.invoke({"log": ["start"]}, cfg("s"))
        workers.append(holder := start(str(db), "stall", "s", "1"))
        leased = event(holder)  # it holds the lease and read the thread under it
        holder.send_signal(signal.SIGSTOP)
        go(holder)  # what it does when it wakes: write what it read
        while time.time() <= leased["expires_at"] + 0.05:  # a real stall past its lease
            time.sleep(0.05)
        with cp.lease("s", ttl=30, keep_alive=False) as taker:
            assert taker.token != leased["token"]
            graph.invoke({"log": ["taker"]}, taker.config(cfg("s")))
            head = cp.get_tuple(cfg("s")).config["configurable"]["checkpoint_id"]
            holder.send_signal(signal.SIGCONT)
            assert event(holder) == {"event": "late", "put": LeaseLostError.__name__,
                                     "writes": LeaseLostError.__name__}
            assert holder.wait(30) == 0
            assert cp.get_tuple(cfg("s")).config["configurable"]["checkpoint_id"] == head
        assert cp.get_tuple(cfg("s", checkpoint_id=LATE_ID)) is None
        assert cp.get_tuple(cfg("s")).checkpoint["channel_values"]["log"][-2:] == [
            "taker", "step"]
        assert assert_one_chain(cp, "s") == 6


def _version_5_file(path: Path, source: Path) -> None:
    """A file as the code of storage version 5 left it: the tables of migrations 1-5 with
    their lgx_migrations rows, holding `source`'s threads (rows and lifecycle rows)."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
    conn.execute("CREATE TABLE lgx_migrations (version INTEGER PRIMARY KEY, applied_at TEXT "
                 "NOT NULL)")
    conn.execute("BEGIN")
    for version, step in enumerate(MIGRATIONS[:5], start=1):
        for statement in step:
            conn.execute(statement)
        conn.execute("INSERT INTO lgx_migrations VALUES (?, 'then')", (version,))
    conn.execute("ATTACH DATABASE ? AS src", (str(source),))
    for table in ("lgx_checkpoints", "lgx_blobs", "lgx_writes", "lgx_threads"):
        conn.execute(f"INSERT INTO {table} SELECT * FROM src.{table}")
    conn.execute("COMMIT")
    conn.execute("DETACH DATABASE src")
    conn.close()


def _tables(path: Path) -> set[str]:
    conn = sqlite3.connect(path)
    try:
        return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    finally:
        conn.close()


def test_storage_version_5_upgrades_in_place(tmp_path: Path) -> None:
    source, db = tmp_path / "src.db", tmp_path / "v5.db"
    with SQLiteCheckpointer(source) as src:
        graph = step_graph().compile(checkpointer=src)
        for i in range(3):
            graph.invoke({"log": [f"start-{i}"]}, cfg(f"t{i}"))
        before = {f"t{i}": src.get_tuple(cfg(f"t{i}")).checkpoint for i in range(3)}
    _version_5_file(db, source)
    assert not {"lgx_tombstones", "lgx_leases", "lgx_epoch"} & _tables(db)
    with SQLiteCheckpointer(db) as cp:
        assert cp.storage_version() == LATEST == 6
        assert {"lgx_tombstones", "lgx_leases", "lgx_epoch"} <= _tables(db)
        assert cp.thread_ids() == ["t0", "t1", "t2"]
        for tid, ckpt in before.items():
            assert cp.get_tuple(cfg(tid)).checkpoint == ckpt
        assert cp.run_sync(cp.store.read_epoch()) == 0
        # the old threads go on under the guard, and get tombstones and leases
        graph = step_graph().compile(checkpointer=cp)
        graph.invoke({"log": ["more"]}, cfg("t0"))
        assert assert_one_chain(cp, "t0") == 6
        with cp.lease("t1", ttl=30, keep_alive=False) as lease:
            assert cp.run_sync(cp.store.read_lease("t1"))[0] == lease.token
        cp.delete_thread("t2")
        assert cp.tombstone("t2") is not None
        late = cp.get_tuple(cfg("t1"))
        cp.delete_thread("t1")
        with pytest.raises(ThreadDeletedError):
            cp.put(late.config, {**late.checkpoint, "id": LATE_ID},
                   {"source": "loop", "step": 9}, {})
    with SQLiteCheckpointer(db) as cp:  # idempotent
        assert cp.setup() == LATEST
