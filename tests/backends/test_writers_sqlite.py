"""One writer per thread on SQLite, across processes sharing one file: two processes racing
real graph runs on one thread (exactly one wins each round, the history stays one chain), a
late put from another process after `delete_thread` (refused by the tombstone), a stalled
lease holder (SIGSTOP past its lease) fenced off once it wakes, and storage version 5
upgraded in place to the tables of this issue.

The workers are `tests.support.writers`'s, each in a spawned process. The stalled holder's
lease runs out in real time (that is the point: a real stall); no assertion is about timing,
only about outcomes.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import threading
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.graph import END, START, StateGraph

from langgraph_ckpt_ext import LeaseLostError, SQLiteCheckpointer, ThreadDeletedError
from langgraph_ckpt_ext.backends.sqlite.migrations import LATEST, MIGRATIONS
from tests.support.lifecycle import cfg, later_id
from tests.support.writers import (
    PROCESSES,
    State,
    Target,
    Workers,
    assert_one_chain,
    late_puts,
    late_worker,
    race_worker,
    take,
)


def joined(proc: Any) -> int:
    proc.join(30)
    return int(proc.exitcode)


def step_graph() -> StateGraph:
    def step(state: State) -> dict[str, Any]:
        return {"log": ["step"]}

    g = StateGraph(State)
    g.add_node("step", step)
    g.add_edge(START, "step")
    g.add_edge("step", END)
    return g


@pytest.mark.parametrize("fresh", [False, True], ids=["existing-thread", "new-thread"])
def test_two_processes_racing_graph_runs_one_wins_each_round(
    tmp_path: Path, workers: Workers, fresh: bool
) -> None:
    db, rounds = tmp_path / "race.db", 4
    with SQLiteCheckpointer(db) as cp:
        if not fresh:
            step_graph().compile(checkpointer=cp).invoke({"log": ["start"]}, cfg("t"))
    go, out = PROCESSES.Barrier(3), PROCESSES.Queue()  # each round starts when the test says so
    barriers = [PROCESSES.Barrier(2) for _ in range(rounds)]
    procs = [workers.start(race_worker, Target("sqlite", str(db)), "t", name, go, barriers, out)
             for name in "ab"]
    winners = []
    for r in range(rounds):
        go.wait(60)
        outcomes = take(out, 2)
        assert sorted(o for _, _, o in outcomes) == ["ConcurrentWriteError", "won"], outcomes
        assert {rr for rr, _, _ in outcomes} == {r}
        winners.append(next(name for _, name, o in outcomes if o == "won"))
        with SQLiteCheckpointer(db) as cp:
            assert_one_chain(cp, "t")
    for proc in procs:
        assert joined(proc) == 0
    with SQLiteCheckpointer(db) as cp:
        # each round's winner ran its step on the one chain, right after its input (a refused
        # run may have left its input checkpoint on it before it was overtaken: history, not
        # a fork)
        values = cp.get_tuple(cfg("t")).checkpoint["channel_values"]["log"]
        ran = [values[i - 1] for i, v in enumerate(values) if v == "step" and i > 0]
        assert [v for v in ran if v.startswith("race-")] == [
            f"race-{w}-{r}" for r, w in enumerate(winners)]
        assert assert_one_chain(cp, "t") >= 3 * rounds


def test_a_late_put_from_another_process_after_delete_is_refused(
    tmp_path: Path, workers: Workers
) -> None:
    db = tmp_path / "late.db"
    with SQLiteCheckpointer(db) as cp:
        graph = step_graph().compile(checkpointer=cp)
        graph.invoke({"log": ["start"]}, cfg("d"))
        ready, go, out = PROCESSES.Event(), PROCESSES.Event(), PROCESSES.Queue()
        late = workers.start(late_worker, Target("sqlite", str(db)), "d", ready, go, out)
        assert ready.wait(60)  # the other process read the thread ...
        cp.delete_thread("d")  # ... and it is deleted before its run writes
        assert cp.tombstone("d") is not None
        go.set()
        assert dict(take(out, 2)) == {"put": ThreadDeletedError.__name__,
                                      "writes": ThreadDeletedError.__name__}
        assert joined(late) == 0
        assert list(cp.list(cfg("d"))) == [] and cp.thread_state("d") is None
        assert not late_puts(cp, "d")
        graph.invoke({"log": ["again"]}, cfg("d"))  # a new run on the thread is welcome
        assert assert_one_chain(cp, "d") == 3


def test_a_stalled_lease_holder_is_fenced_off_when_it_wakes(
    tmp_path: Path, workers: Workers
) -> None:
    db = tmp_path / "stall.db"
    with SQLiteCheckpointer(db) as cp:
        graph = step_graph().compile(checkpointer=cp)
        graph.invoke({"log": ["start"]}, cfg("s"))
        ready, go, out = PROCESSES.Event(), PROCESSES.Event(), PROCESSES.Queue()
        holder = workers.start(late_worker, Target("sqlite", str(db)), "s", ready, go, out,
                               lease_ttl=1.0)
        _, token, expires_at = take(out, 1)[0]  # it holds the lease ...
        assert ready.wait(60)  # ... and read the thread under it
        os.kill(holder.pid, signal.SIGSTOP)
        while time.time() <= expires_at + 0.05:  # a real stall past its lease
            time.sleep(0.05)
        with cp.lease("s", ttl=30, keep_alive=False) as taker:
            assert taker.token != token
            graph.invoke({"log": ["taker"]}, taker.config(cfg("s")))
            head = cp.get_tuple(cfg("s")).config["configurable"]["checkpoint_id"]
            os.kill(holder.pid, signal.SIGCONT)
            go.set()  # what it does once it runs again: write what it read
            assert dict(take(out, 2)) == {"put": LeaseLostError.__name__,
                                          "writes": LeaseLostError.__name__}
            assert joined(holder) == 0
            assert cp.get_tuple(cfg("s")).config["configurable"]["checkpoint_id"] == head
        assert not late_puts(cp, "s")
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
            conn.execute(statement, {"now": time.time()})  # `:now`: the backfill time
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
            cp.put(late.config, {**late.checkpoint, "id": later_id()},
                   {"source": "loop", "step": 9}, {})
    with SQLiteCheckpointer(db) as cp:  # idempotent
        assert cp.setup() == LATEST


def _open_at_once(path: Path, names: list[str]) -> list[BaseException]:
    """Each name a thread with its own event loop, opening `path` at the same moment and
    putting one checkpoint to the thread of that name; what they raised."""
    ready = threading.Barrier(len(names))
    errors: list[BaseException] = []

    async def open_and_put(name: str) -> None:
        ready.wait(30)
        async with SQLiteCheckpointer.from_conn_string(path) as cp:
            await cp.aput(cfg(name), empty_checkpoint(), {"source": "loop", "step": 0}, {})

    def run(name: str) -> None:
        try:
            asyncio.run(open_and_put(name))
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)

    workers = [threading.Thread(target=run, args=(name,)) for name in names]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
    return errors


def test_openers_of_a_new_file_at_once_all_open(tmp_path: Path) -> None:
    """Four openers of one new file at once (as LangGraph's server opens its checkpointer once
    per thread), over rounds. SQLite refuses the switch to WAL at once, without waiting its
    busy timeout, while another connection is switching: every opener must wait its turn and
    write, none fail with "database is locked"."""
    names = [f"t{i}" for i in range(4)]
    for n in range(25):
        path = tmp_path / f"ck{n}.db"
        errors = _open_at_once(path, names)
        assert not errors, f"round {n}: {errors!r}"
        with closing(sqlite3.connect(path)) as conn:
            assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
            rows = conn.execute("SELECT DISTINCT thread_id FROM lgx_checkpoints").fetchall()
        assert {r[0] for r in rows} == set(names)
