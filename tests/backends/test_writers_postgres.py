"""One writer per thread on PostgreSQL, across processes: the guard is decided on facts read
under the thread's locks, so writers in other processes (other pools, other sessions) never
both pass against the same head; tombstones refuse a late writer of another process; a
stalled lease holder (SIGSTOP) is fenced off once another took the lease; storage of the
previous version is upgraded in place.

Processes are started afresh (`tests/support/fresh.py`) and meet at multiprocessing
barriers, so each race is real. Only outcomes are asserted, never timings.
"""

from __future__ import annotations

import asyncio
import collections
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import asyncpg
import pytest
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.types import Command

from langgraph_ckpt_ext import PostgresCheckpointer
from langgraph_ckpt_ext.backends.postgres.migrations import LATEST, MIGRATIONS
from tests.support import writers as worker
from tests.support.lifecycle import later_id
from tests.support.savers import PG_DSN, drop_pg_schemas, pg_schema
from tests.support.writers import PROCESSES, Target, Workers, assert_one_chain, race_graph, take

pytestmark = pytest.mark.postgres



@pytest.fixture
def schema() -> Iterator[str]:
    name = pg_schema()
    with PostgresCheckpointer(PG_DSN, schema=name):  # the tables, before any worker
        pass
    yield name
    drop_pg_schemas(name)


def start(schema: str, thread: str) -> PostgresCheckpointer:
    """A checkpointer of the test's own process with `thread` started (paused at review)."""
    cp = PostgresCheckpointer(PG_DSN, schema=schema)
    race_graph().compile(checkpointer=cp).invoke(
        {"log": ["start"]}, {"configurable": {"thread_id": thread}})
    return cp


def join(*procs: Any) -> None:
    for proc in procs:
        proc.join(120)
        assert proc.exitcode == 0, f"worker exited with {proc.exitcode}"


def test_two_processes_racing_graph_runs_one_wins_each_round(
    schema: str, workers: Workers,
) -> None:
    rounds = 4
    with start(schema, "race") as cp:
        go, barriers = PROCESSES.Barrier(2), [PROCESSES.Barrier(2) for _ in range(rounds)]
        out = PROCESSES.Queue()
        procs = [workers.start(worker.race_worker, Target("postgres", schema), "race", name,
                               go, barriers, out) for name in "ab"]
        results = take(out, 2 * rounds)
        join(*procs)
        per_round = collections.defaultdict(list)
        for round_, _, outcome in results:
            per_round[round_].append(outcome)
        assert {r: sorted(o) for r, o in per_round.items()} == {
            r: ["ConcurrentWriteError", "won"] for r in range(rounds)}
        assert_one_chain(cp, "race")
        # the thread goes on from where the last winner left it
        graph = race_graph().compile(checkpointer=cp)
        graph.invoke(Command(resume="yes"), {"configurable": {"thread_id": "race"}})
        assert_one_chain(cp, "race")


def test_puts_from_two_processes_and_many_connections_one_lands_per_head(
    schema: str, workers: Workers,
) -> None:
    rounds, connections = 5, 8
    with start(schema, "many") as cp:
        barrier = PROCESSES.Barrier(2)
        out = PROCESSES.Queue()
        procs = [workers.start(worker.many_puts, Target("postgres", schema), p, "many",
                               rounds, connections, barrier, out) for p in range(2)]
        results = take(out, 2 * rounds)
        join(*procs)
        landed = collections.Counter[int]()
        for _, round_, n in results:
            landed[round_] += n
        assert dict(landed) == {r: 1 for r in range(rounds)}
        assert_one_chain(cp, "many")


def test_a_late_put_from_another_process_after_delete_is_refused(
    schema: str, workers: Workers,
) -> None:
    with start(schema, "late") as cp:
        read_done, deleted, out = PROCESSES.Event(), PROCESSES.Event(), PROCESSES.Queue()
        proc = workers.start(worker.late_worker, Target("postgres", schema), "late", read_done,
                             deleted, out)
        assert read_done.wait(60)
        cp.delete_thread("late")
        deleted.set()
        outcomes = dict(take(out, 2))
        join(proc)
        assert outcomes == {"put": "ThreadDeletedError", "writes": "ThreadDeletedError"}
        assert list(cp.list({"configurable": {"thread_id": "late"}})) == []
        assert cp.tombstone("late") is not None


def test_a_put_racing_delete_thread_never_outlives_it(
    schema: str, workers: Workers,
) -> None:
    """The put lands before the delete (which then removes it) or is refused after it
    (`ThreadDeletedError`): never stored after the delete. Either order may happen in a
    round; the outcome is checked each round."""
    rounds = 6
    with start(schema, "del") as cp:
        barrier, out = PROCESSES.Barrier(2), PROCESSES.Queue()
        proc = workers.start(worker.put_racing_delete, Target("postgres", schema), "del",
                             rounds, barrier, out)
        seen = []
        for _ in range(rounds):
            barrier.wait(30)
            cp.delete_thread("del")
            _, outcome = out.get(timeout=60)
            seen.append(outcome)
            assert outcome in ("stored", "ThreadDeletedError")
            assert list(cp.list({"configurable": {"thread_id": "del"}})) == []
            # the thread again, for the next round: a direct first put (a graph run here would
            # meet LangGraph's pending writes sent before their checkpoint: see the report)
            cp.put({"configurable": {"thread_id": "del", "checkpoint_ns": ""}},
                   {**empty_checkpoint(), "id": later_id()},
                   {"source": "input", "step": -1}, {})
            barrier.wait(30)
        join(proc)
        assert_one_chain(cp, "del")


def test_stalled_holder_is_fenced_off_once_another_took_the_lease(
    schema: str, workers: Workers,
) -> None:
    """A holder leases the thread (1 s, no keep-alive), reads it and is stopped (SIGSTOP);
    past its lease, the test takes the lease and writes; continued (SIGCONT), the holder's
    put is refused with `LeaseLostError`."""
    with start(schema, "stall") as cp:
        ready, go, out = PROCESSES.Event(), PROCESSES.Event(), PROCESSES.Queue()
        holder = workers.start(worker.late_worker, Target("postgres", schema), "stall", ready,
                               go, out, lease_ttl=1.0)
        assert take(out, 1)[0][0] == "leased" and ready.wait(60)
        os.kill(holder.pid, signal.SIGSTOP)
        time.sleep(1.5)  # real time past the holder's lease (outcomes only asserted)
        config = {"configurable": {"thread_id": "stall"}}
        with cp.lease("stall", ttl=30, keep_alive=False) as taker:
            race_graph().compile(checkpointer=cp).invoke(
                Command(resume="taken"), taker.config(config))
            os.kill(holder.pid, signal.SIGCONT)
            go.set()  # only once it runs again: setting an Event waits for its sleepers
            assert dict(take(out, 2)) == {"put": "LeaseLostError",
                                          "writes": "LeaseLostError"}
            join(holder)
        assert_one_chain(cp, "stall")
        state = race_graph().compile(checkpointer=cp).get_state(config)
        assert state.values["log"] == ["start", "step", "review:taken"]


async def _downgrade(schema: str, version: int) -> None:
    """The schema's tables as storage `version` had them (a fresh schema, the steps up to
    it, each recorded)."""
    conn = await asyncpg.connect(PG_DSN)
    try:
        await conn.execute(f'CREATE SCHEMA "{schema}"')
        await conn.execute(f'SET search_path TO "{schema}"')
        await conn.execute("CREATE TABLE lgx_migrations (version INTEGER PRIMARY KEY, "
                           "applied_at TIMESTAMPTZ NOT NULL DEFAULT now())")
        for n, step in enumerate(MIGRATIONS[:version], 1):
            for statement in step:
                await conn.execute(statement, *((time.time(),) if "$1" in statement else ()))
            await conn.execute("INSERT INTO lgx_migrations (version) VALUES ($1)", n)
    finally:
        await conn.close()


def test_storage_of_the_previous_version_is_upgraded_in_place() -> None:
    schema = pg_schema()
    try:
        asyncio.run(_downgrade(schema, LATEST - 1))
        config = {"configurable": {"thread_id": "old"}}
        # what the previous version's writer stored: unguarded puts into its tables
        with PostgresCheckpointer(PG_DSN, schema=schema, setup=False, writers="last_wins",
                                  tombstone_ttl=None) as old:
            assert old.run_sync(old.store.storage_version()) == LATEST - 1
            race_graph().compile(checkpointer=old).invoke({"log": ["start"]}, config)
            before = [t.config for t in old.list(config)]
        with PostgresCheckpointer(PG_DSN, schema=schema) as cp:
            assert cp.run_sync(cp.store.storage_version()) == LATEST
            assert [t.config for t in cp.list(config)] == before
            graph = race_graph().compile(checkpointer=cp)
            graph.invoke(Command(resume="yes"), config)
            with cp.lease("old", ttl=30, keep_alive=False) as lease:
                graph.invoke({"log": ["leased"]}, lease.config(config))
            cp.delete_thread("old")
            assert cp.tombstone("old") is not None
            assert cp.run_sync(cp.store.read_epoch()) == 0
    finally:
        drop_pg_schemas(schema)
