"""Redis only: one writer per thread across processes. Each worker is a process of its own
(multiprocessing "spawn", see tests/support/writers.py) with its own
checkpointer, so the only thing the writers share is the server: the check must be atomic
with the write in Redis itself (the guarded scripts), on a standalone server and on a Cluster.

- two processes race real graph runs on one thread, round after round: each round exactly one
  run wins, the other gets `ConcurrentWriteError`, and the history stays one chain;
- a run stalled inside a node while another process deletes the thread: its late checkpoint
  is refused (`ThreadDeletedError`), nothing of it is stored;
- a lease holder stopped (SIGSTOP) past its lease: the test takes the lease, resumes it
  (SIGCONT), and the holder's next write is refused (`LeaseLostError`).

Lease time is the store's clock: the test process reads the stalled holder's expiry and sets
its own clock past it (no sleeping for a TTL)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from langgraph_ckpt_ext import RedisCheckpointer, ThreadLeasedError
from tests.support.savers import SaverHandle, open_saver, params
from tests.support.writers import (
    PROCESSES,
    Target,
    Workers,
    assert_one_chain,
    history,
    late_worker,
    race_graph,
    race_worker,
    take,
)

pytestmark = pytest.mark.redis

ROUNDS = 4


@pytest.fixture(params=params(["redis", "redis-cluster"]))
def handle(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SaverHandle]:
    with open_saver(request.param, tmp_path) as h:
        yield h


def target(handle: SaverHandle) -> Target:
    assert handle.url is not None and handle.prefix is not None
    return Target("redis", handle.prefix, handle.url)


def graph(cp: Any) -> Any:
    return race_graph(ask=False).compile(checkpointer=cp)


def test_two_processes_race_runs_one_wins_each_round(handle: SaverHandle, workers: Workers
                                                    ) -> None:
    cp = handle.inner
    thread = "race"
    config = {"configurable": {"thread_id": thread}}
    graph(cp).invoke({"log": ["start"]}, config)
    go = PROCESSES.Barrier(2)
    barriers = [PROCESSES.Barrier(2) for _ in range(ROUNDS)]
    out = PROCESSES.Queue()
    for name in "ab":
        # durability="sync": a refused checkpoint stops the run before its next step, so a
        # run refused at its input never waits at the barrier
        workers.start(race_worker, target(handle), thread, name, go, barriers, out, "sync")
    results = take(out, 2 * ROUNDS)
    for r in range(ROUNDS):
        got = sorted(o for rr, _, o in results if rr == r)
        assert got == ["ConcurrentWriteError", "won"], (r, results)
    assert_one_chain(cp, thread)
    # each round's winner ran to the end on that chain (a loser's input checkpoint may be on
    # it too: the winner read the thread after it and chained onto it)
    log = cp.get_tuple(config).checkpoint["channel_values"]["log"]
    assert log[:3] == ["start", "step", "review:auto"] and log.count("review:auto") == ROUNDS + 1
    assert {x.rsplit("-", 1)[1] for x in log if x.startswith("race-")} == {
        str(r) for r in range(ROUNDS)}


def test_late_run_after_delete_from_another_process_refused(handle: SaverHandle,
                                                            workers: Workers) -> None:
    cp = handle.inner
    thread = "late"
    config = {"configurable": {"thread_id": thread}}
    graph(cp).invoke({"log": ["start"]}, config)
    ready, deleted, out = PROCESSES.Event(), PROCESSES.Event(), PROCESSES.Queue()
    workers.start(late_worker, target(handle), thread, ready, deleted, out, run=True)
    assert ready.wait(120), "the worker's run never reached its node"
    cp.delete_thread(thread)  # while the other process's run is inside `step`
    deleted.set()
    assert take(out, 1) == [("run", "ThreadDeletedError")]
    assert history(cp, thread) == [] and cp.get_tuple(config) is None
    assert cp.tombstone(thread) is not None
    # a new run on the thread starts afresh
    graph(cp).invoke({"log": ["again"]}, config)
    assert cp.get_tuple(config).checkpoint["channel_values"]["log"][0] == "again"
    assert_one_chain(cp, thread)


def test_stalled_lease_holder_fenced_off(handle: SaverHandle, workers: Workers) -> None:
    cp: RedisCheckpointer = handle.inner
    thread = "stalled"
    config = {"configurable": {"thread_id": thread}}
    graph(cp).invoke({"log": ["start"]}, config)
    ready, go, out = PROCESSES.Event(), PROCESSES.Event(), PROCESSES.Queue()
    proc = workers.start(late_worker, target(handle), thread, ready, go, out, run=True,
                         lease_ttl=1.0)
    assert ready.wait(120), "the holder's run never reached its node"
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        held = cp.run_sync(cp.store.read_lease(thread))
        assert held is not None
        cp.clock = lambda: held[1] - 0.5  # the store's time: the lease still runs
        with pytest.raises(ThreadLeasedError):
            cp.lease(thread, ttl=30, keep_alive=False).acquire()
        cp.clock = lambda: held[1] + 0.001  # ... and now it ran out
        taker = cp.lease(thread, ttl=30, keep_alive=False).acquire()
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    go.set()  # only once it runs again: setting an Event waits for its sleepers to wake
    assert take(out, 2)[1] == ("run", "LeaseLostError")  # after ("leased", ...)
    graph(cp).invoke({"log": ["taker"]}, taker.config(config))
    taker.release()
    assert_one_chain(cp, thread)
    log = cp.get_tuple(config).checkpoint["channel_values"]["log"]
    assert "taker" in log and log[-1] == "review:auto"
