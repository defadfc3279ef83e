"""One writer per thread, on every backend: two real concurrent runs on one thread (exactly
one wins, the other gets `ConcurrentWriteError`, the history stays one chain), the
time-travel flows still legal, tombstones after a delete, leases with fencing, epochs.

Time for tombstones and leases is an injected clock (`cp.clock`): nothing sleeps for a TTL.
The runs meet at a barrier inside a node, after both have read the thread, so the race is
real every time (each run reads, writes its input checkpoint, then waits for the other).
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.types import Command

from langgraph_ckpt_ext import (
    ConcurrentWriteError,
    FencedError,
    LeaseLostError,
    ThreadDeletedError,
    ThreadLeasedError,
)
from tests.support.lifecycle import DAY, Clock, cfg, later_id
from tests.support.savers import SaverHandle, open_saver, params
from tests.support.writers import assert_one_chain, async_race_graph, history, race, race_graph

BACKENDS = ["memory", "sqlite", "postgres", "redis", "redis-cluster"]


def started(cp: Any, thread_id: str) -> tuple[Any, dict[str, Any]]:
    """The race graph on `cp`, and a thread it started (paused at its review)."""
    graph = race_graph().compile(checkpointer=cp)
    config = {"configurable": {"thread_id": thread_id}}
    graph.invoke({"log": ["start"]}, config)
    return graph, config


def clocked(cp: Any) -> Clock:
    """A settable clock, set on `cp` (tombstones and leases age by it)."""
    clock = Clock()
    cp.clock = clock
    return clock


@pytest.fixture(params=params(BACKENDS))
def handle(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SaverHandle]:
    with open_saver(request.param, tmp_path) as h:
        yield h


@pytest.mark.parametrize("fresh", [False, True], ids=["existing-thread", "new-thread"])
def test_two_concurrent_runs_one_wins_the_history_stays_one_chain(
    handle: SaverHandle, fresh: bool
) -> None:
    cp = handle.inner
    assert race(cp, "t", fresh) == ["refused", "won"]
    assert_one_chain(cp, "t")
    # the thread goes on from where the winner left it
    graph = race_graph().compile(checkpointer=cp)
    graph.invoke(Command(resume="yes"), {"configurable": {"thread_id": "t"}})
    assert_one_chain(cp, "t")


async def test_two_concurrent_async_runs_one_wins(handle: SaverHandle) -> None:
    cp = handle.inner
    graph = async_race_graph().compile(checkpointer=cp)
    config = {"configurable": {"thread_id": "a"}}
    await graph.ainvoke({"log": ["start"]}, config)
    results = await asyncio.gather(
        graph.ainvoke({"log": ["race-a"]}, config), graph.ainvoke({"log": ["race-b"]}, config),
        return_exceptions=True)
    refused = [r for r in results if isinstance(r, ConcurrentWriteError)]
    assert len(refused) == 1, results
    assert not [r for r in results if isinstance(r, BaseException) and r not in refused]
    assert_one_chain(cp, "a")


def test_last_wins_keeps_langgraphs_behaviour(tmp_path: Path) -> None:
    with open_saver("memory", tmp_path, writers="last_wins") as h:
        assert h.inner.writers == "last_wins"
        assert race(h.inner, "t", False) == ["won", "won"]  # and the history forked
        with pytest.raises(AssertionError, match="off the head's chain"):
            assert_one_chain(h.inner, "t")


def test_time_travel_flows_stay_legal(handle: SaverHandle) -> None:
    cp = handle.inner
    graph, config = started(cp, "tt")
    snapshot = graph.get_state(config)
    graph.invoke(Command(resume="yes"), config)  # resume after an interrupt
    graph.invoke({"log": ["more"]}, config)
    # update_state on an old checkpoint (its config taken before later turns)
    graph.update_state(snapshot.config, {"log": ["edited"]})
    # a run from an explicit old checkpoint forks on purpose, then goes on
    old = list(graph.get_state_history(config))[-2].config
    graph.invoke(None, old)
    forked = graph.get_state(config)
    graph.invoke(Command(resume="again"), forked.config)
    graph.invoke({"log": ["after"]}, config)
    assert graph.get_state(config).values["log"][-1] in ("review:again", "review:auto", "step")
    # direct puts (no run, no stamp) are not refused: LangGraph's own suite writes so
    for step in range(3):
        ckpt = empty_checkpoint()
        cp.put(cfg("direct"), ckpt, {"source": "input", "step": step}, {})


def test_a_put_refused_stores_nothing(handle: SaverHandle) -> None:
    cp = handle.inner
    graph, config = started(cp, "n")
    run = contextvars.Context()  # a run's context: the head it read is noted there
    stale = run.run(cp.get_tuple, config)  # a run reads ...
    graph.invoke(Command(resume="yes"), config)  # ... another writes meanwhile
    before = len(history(cp, "n"))
    ckpt = {**stale.checkpoint, "id": later_id()}
    with pytest.raises(ConcurrentWriteError) as info:
        run.run(cp.put, stale.config, ckpt, {"source": "loop", "step": 99}, {})
    assert info.value.thread_id == "n" and "another run" in str(info.value)
    assert len(history(cp, "n")) == before
    assert cp.get_tuple(cfg("n", checkpoint_id=ckpt["id"])) is None
    # a batch holding the refused put stores none of its items
    fresh = cp.get_tuple(config)
    ok = {**fresh.checkpoint, "id": later_id()}
    with pytest.raises(ConcurrentWriteError):
        run.run(cp.put_batch, [("put", fresh.config, ok, {"source": "loop", "step": 7}, {}),
                               ("put", stale.config, ckpt, {"source": "loop", "step": 99}, {})])
    assert len(history(cp, "n")) == before


def test_puts_racing_from_many_threads_exactly_one_per_head(handle: SaverHandle) -> None:
    """The check is atomic with the write: 8 threads read the same head and put at once;
    exactly one lands each round."""
    cp = handle.inner
    graph = race_graph().compile(checkpointer=cp)
    graph.invoke({"log": ["start"]}, {"configurable": {"thread_id": "many"}})
    for round_ in range(5):
        read = cp.get_tuple(cfg("many"))
        go = threading.Barrier(8)
        won: list[int] = []

        def put(i: int, read: Any = read, go: threading.Barrier = go,
                round_: int = round_, won: list[int] = won) -> None:
            ckpt = {**read.checkpoint, "id": later_id()}
            go.wait()
            try:
                cp.put(read.config, ckpt, {"source": "loop", "step": 10 + round_}, {})
                won.append(i)
            except ConcurrentWriteError:
                pass

        threads = [threading.Thread(target=put, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(won) == 1, won
    assert_one_chain(cp, "many")


def test_delete_then_late_put_and_late_writes_refused_new_run_welcome(
    handle: SaverHandle,
) -> None:
    cp = handle.inner
    clock = clocked(cp)
    graph, config = started(cp, "d")
    late = cp.get_tuple(config)  # a run read the thread before the delete
    cp.delete_thread("d")
    assert cp.tombstone("d") == clock.now
    ckpt = {**late.checkpoint, "id": later_id()}
    with pytest.raises(ThreadDeletedError):
        cp.put(late.config, ckpt, {"source": "loop", "step": 3}, {})
    with pytest.raises(ThreadDeletedError):
        cp.put_writes(late.config, [("log", "late")], "task-1")
    assert history(cp, "d") == [] and cp.get_tuple(config) is None
    # a new run on the same thread id starts afresh, and goes on
    graph.invoke({"log": ["again"]}, config)
    graph.invoke(Command(resume="yes"), config)
    assert graph.get_state(config).values["log"][0] == "again"
    assert_one_chain(cp, "d")
    # the tombstone lasts `tombstone_ttl`, then the sweeper removes it
    clock.advance(DAY - 1)
    assert cp.sweep().tombstones_dropped == 0
    clock.advance(2)
    assert cp.sweep().tombstones_dropped == 1 and cp.tombstone("d") is None


def test_expired_thread_leaves_a_tombstone(handle: SaverHandle) -> None:
    cp = handle.inner
    clock = clocked(cp)
    _, config = started(cp, "x")
    late = cp.get_tuple(config)
    cp.retention = {"idle": 60, "delete_paused": True}
    clock.advance(61)
    assert cp.sweep().deleted == ["x"]
    with pytest.raises(ThreadDeletedError):
        cp.put(late.config, {**late.checkpoint, "id": later_id()},
               {"source": "loop", "step": 3}, {})


def test_no_tombstones_when_turned_off(tmp_path: Path) -> None:
    with open_saver("memory", tmp_path, tombstone_ttl=None) as h:
        cp = h.inner
        graph = race_graph().compile(checkpointer=cp)
        config = {"configurable": {"thread_id": "d"}}
        graph.invoke({"log": ["start"]}, config)
        late = cp.get_tuple(config)
        cp.delete_thread("d")
        assert cp.tombstone("d") is None
        cp.put(late.config, {**late.checkpoint, "id": later_id()},
               {"source": "loop", "step": 3}, {})  # brought back, as LangGraph's savers do


def test_lease_refuses_a_second_holder_and_writers_without_its_token(
    handle: SaverHandle,
) -> None:
    cp = handle.inner
    graph, config = started(cp, "l")
    with cp.lease("l", ttl=30, keep_alive=False) as lease:
        graph.invoke(Command(resume="yes"), config)  # this context holds the lease
        with pytest.raises(ThreadLeasedError), cp.lease("l", ttl=30):
            pass
        errors: list[BaseException] = []

        def other() -> None:  # another thread, not holding it: refused before it writes
            try:
                graph.invoke({"log": ["other"]}, config)
            except BaseException as exc:
                errors.append(exc)

        t = threading.Thread(target=other)
        t.start()
        t.join()
        assert len(errors) == 1 and isinstance(errors[0], ThreadLeasedError)
        # the token travels in a config too (a run started elsewhere)
        result: list[Any] = []
        t = threading.Thread(target=lambda: result.append(
            graph.invoke({"log": ["carried"]}, lease.config(config))))
        t.start()
        t.join()
        assert result
    graph.invoke({"log": ["free"]}, config)  # released: anyone writes again
    assert_one_chain(cp, "l")


async def test_async_lease(handle: SaverHandle) -> None:
    cp = handle.inner
    graph = race_graph().compile(checkpointer=cp)
    config = {"configurable": {"thread_id": "al"}}
    async with cp.lease("al", ttl=30) as lease:
        await graph.ainvoke({"log": ["start"]}, config)
        await lease.arenew()
        with pytest.raises(ThreadLeasedError):
            await cp.lease("al", ttl=30).aacquire()
    await graph.ainvoke(Command(resume="yes"), config)


def test_stalled_holder_is_fenced_off_after_its_lease_expires(handle: SaverHandle) -> None:
    cp = handle.inner
    clock = clocked(cp)
    graph, config = started(cp, "s")
    stalled = cp.lease("s", ttl=10, keep_alive=False).acquire()
    read = cp.get_tuple(stalled.config(config))  # reads, then stalls past its lease
    clock.advance(11)
    with pytest.raises(LeaseLostError):
        stalled.renew()
    with pytest.raises(LeaseLostError):  # expired, nobody else yet: still refused
        cp.put(stalled.config(read.config),
               {**read.checkpoint, "id": later_id()},
               {"source": "loop", "step": 5}, {})
    with cp.lease("s", ttl=10, keep_alive=False) as taker:
        graph.invoke(Command(resume="yes"), taker.config(config))
        with pytest.raises(LeaseLostError):
            cp.put_writes(stalled.config(read.config), [("log", "stale")], "task-s")
    stalled.release()  # a lost lease's release takes nothing from anyone
    graph.invoke({"log": ["after"]}, config)
    assert_one_chain(cp, "s")


def test_lease_arguments_checked(handle: SaverHandle) -> None:
    cp = handle.inner
    for bad in (0, -1, float("nan"), float("inf"), "10", True):
        with pytest.raises(ValueError, match="ttl"):
            cp.lease("t", ttl=bad)
    with pytest.raises(ValueError, match="wait"):
        cp.lease("t", ttl=1, wait=-1)
    with pytest.raises(ValueError, match="writers"):
        open_saver("memory", Path("."), writers="many")


def test_epoch_fences_off_an_older_writer(handle: SaverHandle) -> None:
    cp = handle.inner
    graph = race_graph().compile(checkpointer=cp)
    config = {"configurable": {"thread_id": "e"}}
    cp.writer_epoch = 1
    graph.invoke({"log": ["start"]}, config)
    assert cp.read_epoch() == 0
    assert cp.raise_epoch(2) == 2
    assert cp.raise_epoch(1) == 2 == cp.read_epoch()  # never goes back
    for bad in (-1, 1.5, "2", True):
        with pytest.raises(ValueError, match="epoch"):
            cp.raise_epoch(bad)
    with pytest.raises(FencedError):
        graph.invoke(Command(resume="yes"), config)
    rows = cp.prepare_batch([("put", cfg("e2"), empty_checkpoint(),
                              {"source": "input", "step": -1}, {})])
    assert rows is not None
    with pytest.raises(FencedError):
        cp.write_rows(rows.rows(), epoch=1)
    cp.write_rows(rows.rows(), epoch=2)
    cp.writer_epoch = 2
    graph.invoke(Command(resume="yes"), config)
