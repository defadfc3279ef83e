"""One writer per thread through the wrappers (`core.guard`).

SmartCheckpointer: the two-runs race of `tests/core/test_writers.py` (exactly one wins, one
chain); reads served from the buffer stamp the head as buffer and store show it, so that
time travel from the buffer stays legal; a flush refused by the store drops that thread's
items only, and its run learns it (`ConcurrentWriteError` from its put, its put_writes or its
own final flush); a lease held in the caller's context reaches writes flushed later from
another thread; lease/tombstone/writers forwarded, delete leaves the tombstone.

ReplicatedCheckpointer: fencing by epoch across a promotion (two nodes over the same
primary and replica stores).

"Another writer" is a second checkpointer over the same storage (`other`): the inner one
itself for the in-memory backend (one process, one store), a fresh one over the same file,
schema or key prefix for the others (what another process would hold).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langgraph.graph import END, START, StateGraph

from langgraph_ckpt_ext import (
    ConcurrentWriteError,
    FencedError,
    ReplicatedCheckpointer,
    SmartCheckpointer,
    ThreadDeletedError,
    ThreadLeasedError,
)
from langgraph_ckpt_ext.core.guard import HEAD_KEY, read_head
from langgraph_ckpt_ext.core.saver import StoreCheckpointer
from langgraph_ckpt_ext.strategies.smart.policies import OnEvents, Periodic
from tests.strategies.test_smart import GatedStore, _astored_plan, _checkpoint
from tests.support.lifecycle import Clock, cfg, later_id
from tests.support.savers import PERSISTENT, SaverHandle, open_saver, params
from tests.support.unplugged import unplug
from tests.support.writers import State, assert_one_chain, async_race_graph, history, race

BACKENDS = ["memory", "sqlite", "postgres", "redis", "redis-cluster"]
LATER = Periodic(interval=3600.0)  # nothing written until flush(), an interrupt, close


@pytest.fixture(params=params(BACKENDS))
def handle(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SaverHandle]:
    with open_saver(request.param, tmp_path) as h:
        yield h


@contextlib.contextmanager
def other_writer(handle: SaverHandle) -> Iterator[Any]:
    """Another writer of the same storage (see the module's doc)."""
    if handle.backend not in PERSISTENT:
        yield handle.inner
        return
    other = handle.reopen()
    try:
        yield other
    finally:
        other.close()


def steps_graph(during: Any = None) -> StateGraph:
    """a -> b -> END; `during()` is called inside `a`."""

    def a(state: State) -> dict[str, Any]:
        if during is not None:
            during()
        return {"log": ["a"]}

    g = StateGraph(State)
    g.add_node("a", a)
    g.add_node("b", lambda s: {"log": ["b"]})
    g.add_edge(START, "a")
    g.add_edge("a", "b")
    g.add_edge("b", END)
    return g


def in_other_thread(fn: Any) -> Any:
    """`fn()` run in a fresh thread (no context of the caller's: no held lease, no run)."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as exc:
            out.append(exc)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    if isinstance(out[0], BaseException):
        raise out[0]
    return out[0]


# -- SmartCheckpointer -------------------------------------------------------------------------


@pytest.mark.parametrize("policy", [None, LATER], ids=["on-events", "periodic"])
@pytest.mark.parametrize("fresh", [False, True], ids=["existing-thread", "new-thread"])
def test_smart_two_concurrent_runs_one_wins(handle: SaverHandle, fresh: bool,
                                            policy: Any) -> None:
    """Both runs share one buffer: the loser's stale put is refused as it comes (against the
    buffered head), so it cannot sink the winner's batch."""
    with SmartCheckpointer(handle.inner, policy) as cp:
        assert race(cp, "t", fresh) == ["refused", "won"]
        cp.flush()
        assert_one_chain(handle.inner, "t")
        assert cp.metrics.writes_refused >= 1 and cp.metrics.buffered == 0


async def test_smart_two_concurrent_async_runs_one_wins(handle: SaverHandle) -> None:
    with SmartCheckpointer(handle.inner) as cp:
        graph = async_race_graph().compile(checkpointer=cp)
        config = {"configurable": {"thread_id": "a"}}
        await graph.ainvoke({"log": ["start"]}, config)
        results = await asyncio.gather(
            graph.ainvoke({"log": ["race-a"]}, config),
            graph.ainvoke({"log": ["race-b"]}, config), return_exceptions=True)
        assert sorted(type(r).__name__ for r in results) == ["ConcurrentWriteError", "dict"]
        await cp.aflush()
        assert_one_chain(handle.inner, "a")


def test_smart_race_with_another_process(handle: SaverHandle) -> None:
    """A run of this process (buffered) and a run of another writer of the same storage at
    once: one wins; if it is the other, this run's buffered items are dropped and its
    invoke fails at its own final flush."""
    with SmartCheckpointer(handle.inner) as cp, other_writer(handle) as other:
        config = {"configurable": {"thread_id": "p"}}
        steps_graph().compile(checkpointer=cp).invoke({"log": ["start"]}, config)
        meanwhile = steps_graph().compile(checkpointer=other)
        graph = steps_graph(lambda: in_other_thread(
            lambda: meanwhile.invoke({"log": ["other"]}, config))).compile(checkpointer=cp)
        before = history(handle.inner, "p")
        with pytest.raises(ConcurrentWriteError) as info:
            graph.invoke({"log": ["mine"]}, config)
        assert info.value.thread_id == "p"
        after = history(handle.inner, "p")
        assert len(after) == len(before) + 4  # the other run's: input, its first step, a, b
        assert cp.metrics.buffered == 0 and cp.get_tuple(config).checkpoint["id"] == (
            after[0].checkpoint["id"])
        assert_one_chain(handle.inner, "p")
        # the thread goes on through the wrapper, from the other run's head
        steps_graph().compile(checkpointer=cp).invoke({"log": ["again"]}, config)
        assert_one_chain(handle.inner, "p")


def test_smart_refused_thread_drops_only_its_items(handle: SaverHandle) -> None:
    """A flush of several threads: the refused thread's items go (nothing of them stored,
    the error raised once the rest is written), the other threads' are written."""
    with SmartCheckpointer(handle.inner, LATER) as cp, other_writer(handle) as other:
        graph = steps_graph().compile(checkpointer=cp)
        for t in ("ok", "lost"):
            graph.invoke({"log": ["start"]}, {"configurable": {"thread_id": t}})
        cp.flush()
        stale = cp.get_tuple(cfg("lost"))
        graph.invoke({"log": ["more"]}, {"configurable": {"thread_id": "ok"}})
        graph.invoke({"log": ["more"]}, {"configurable": {"thread_id": "lost"}})  # buffered
        steps_graph().compile(checkpointer=other).invoke(
            {"log": ["other"]}, stale.config)  # another writer got there first
        stored = [t.checkpoint["id"] for t in history(handle.inner, "lost")]
        with pytest.raises(ConcurrentWriteError) as info:
            cp.flush()
        assert info.value.thread_id == "lost"
        assert [t.checkpoint["id"] for t in history(handle.inner, "lost")] == stored
        assert len(history(handle.inner, "ok")) == 8 and cp.metrics.buffered == 0
        assert_one_chain(handle.inner, "lost")
        assert history(cp, "lost")[0].checkpoint["id"] == stored[0]  # buffered ones gone
        cp.flush()  # nothing left: the refusal was raised once


def test_smart_refusal_reaches_the_run_that_wrote(handle: SaverHandle) -> None:
    """Items dropped by a refused flush: a put chaining onto them, and writes for them, raise
    the refusal (nothing queued); a run elsewhere on the thread is not told."""
    with SmartCheckpointer(handle.inner, LATER) as cp, other_writer(handle) as other:
        config = {"configurable": {"thread_id": "r"}}
        graph = steps_graph().compile(checkpointer=cp)
        graph.invoke({"log": ["start"]}, config)
        cp.flush()
        run = contextvars.Context()  # the run's context: the head it read is noted there
        read = run.run(cp.get_tuple, config)
        nxt = {**read.checkpoint, "id": later_id()}
        mine = run.run(cp.put, read.config, nxt, {"source": "loop", "step": 9}, {})  # buffered
        steps_graph().compile(checkpointer=other).invoke({"log": ["other"]}, config)
        with pytest.raises(ConcurrentWriteError):
            cp.flush()
        with pytest.raises(ConcurrentWriteError):
            run.run(cp.put_writes, mine, [("log", "late")], "task-1")
        after = {**nxt, "id": later_id()}
        with pytest.raises(ConcurrentWriteError):
            run.run(cp.put, mine, after, {"source": "loop", "step": 10}, {})
        assert cp.metrics.buffered == 0
        assert cp.get_tuple(cfg("r", checkpoint_id=nxt["id"])) is None
        graph.invoke({"log": ["fresh read"]}, config)  # a new run reads again: welcome
        cp.flush()
        assert_one_chain(handle.inner, "r")


def read_and_note(cp: Any, config: Any) -> str | None:
    """Read `config` through `cp`; the head the read noted in this context."""
    cp.get_tuple(config)
    return read_head(config["configurable"]["thread_id"],
                     config["configurable"].get("checkpoint_ns", ""))


def test_smart_reads_from_the_buffer_note_the_merged_head(handle: SaverHandle) -> None:
    """Time travel from checkpoints still buffered: `update_state` on an old checkpoint and
    a run from one are deliberate forks (the head noted is the buffered one), a stale reader is
    refused."""
    with SmartCheckpointer(handle.inner, LATER) as cp:
        graph = steps_graph().compile(checkpointer=cp)
        config = {"configurable": {"thread_id": "tt"}}
        graph.invoke({"log": ["start"]}, config)
        cp.flush()
        graph.invoke({"log": ["more"]}, config)  # buffered on top of the stored ones
        run = contextvars.Context()  # a run's context: the head it read is noted there
        stale = run.run(cp.get_tuple, config)  # a run reads, before the forks below
        states = list(graph.get_state_history(config))
        head = states[0].config["configurable"]["checkpoint_id"]
        stored_old = states[-1].config  # stored, read through the inner one: noted too
        buffered_old = states[2].config  # buffered
        for read in (config, stored_old, buffered_old):
            noted = contextvars.Context().run(read_and_note, cp, read)
            assert noted == head and HEAD_KEY not in str(cp.get_tuple(read))
        graph.update_state(buffered_old, {"log": ["edited"]})  # a fork, from the buffer
        graph.invoke(None, graph.get_state(config).config)
        forked = next(iter(graph.get_state_history(config))).config
        graph.invoke(None, stored_old)  # a run from a stored old checkpoint forks too
        cp.flush()
        assert len(history(handle.inner, "tt")) == len(history(cp, "tt"))
        assert cp.get_tuple(forked) is not None
        # the run that read before those writes is refused
        run.run(cp.put, stale.config, {**stale.checkpoint, "id": later_id()},
                {"source": "loop", "step": 9}, {})
        with pytest.raises(ConcurrentWriteError):
            cp.flush()


def test_smart_held_lease_reaches_later_flushes(handle: SaverHandle) -> None:
    """Writes buffered inside `with cp.lease(...)` carry its token: flushed later from
    another thread (the timer's, another caller's) they are still the holder's."""
    with SmartCheckpointer(handle.inner, LATER) as cp:
        config = {"configurable": {"thread_id": "l"}}
        graph = steps_graph().compile(checkpointer=cp)
        with cp.lease("l", ttl=30, keep_alive=False):
            graph.invoke({"log": ["start"]}, config)
            assert cp.metrics.buffered > 0
            in_other_thread(cp.flush)  # no lease held there
            assert len(history(handle.inner, "l")) == 4
            graph.invoke({"log": ["more"]}, config)
            with pytest.raises(ThreadLeasedError):  # not the holder: refused at its flush
                in_other_thread(lambda: (cp.put_writes(
                    cp.get_tuple(config).config, [("log", "x")], "task-x"), cp.flush()))
        cp.flush()
        assert len(history(handle.inner, "l")) == 8
        assert_one_chain(handle.inner, "l")


async def test_smart_async_held_lease(handle: SaverHandle) -> None:
    async with SmartCheckpointer(handle.inner, LATER) as cp:
        config = {"configurable": {"thread_id": "al"}}
        graph = steps_graph().compile(checkpointer=cp)
        async with cp.lease("al", ttl=30, keep_alive=False):
            await graph.ainvoke({"log": ["start"]}, config)
        with pytest.raises(ConcurrentWriteError):  # released: the token is stale now...
            await cp.aflush()
        assert history(handle.inner, "al") == []
        async with cp.lease("al", ttl=30, keep_alive=False):
            await graph.ainvoke({"log": ["start"]}, config)
            await asyncio.to_thread(cp.flush)
        assert len(history(handle.inner, "al")) == 4


def test_smart_forwards_lease_tombstone_writers(handle: SaverHandle) -> None:
    with SmartCheckpointer(handle.inner, OnEvents()) as cp:
        clock = Clock()
        cp.clock = clock
        assert cp.writers == handle.inner.writers == "single"
        config = {"configurable": {"thread_id": "d"}}
        graph = steps_graph().compile(checkpointer=cp)
        graph.invoke({"log": ["start"]}, config)
        late = cp.get_tuple(config)
        graph_later = SmartCheckpointer(handle.inner, LATER)
        try:
            cp.delete_thread("d")
            assert cp.tombstone("d") == clock.now == handle.inner.tombstone("d")
            # a late put of a run that read before the delete: buffered, refused at its flush
            graph_later.put(late.config, {**late.checkpoint,
                                          "id": later_id()},
                            {"source": "loop", "step": 3}, {})
            with pytest.raises(ThreadDeletedError):
                graph_later.flush()
            assert history(handle.inner, "d") == []
        finally:
            graph_later.close()
        with pytest.raises(ThreadLeasedError), cp.lease("d", ttl=30, keep_alive=False), \
                handle.inner.lease("d", ttl=30):
            pass


async def test_smart_async_tombstone(handle: SaverHandle) -> None:
    async with SmartCheckpointer(handle.inner) as cp:
        graph = steps_graph().compile(checkpointer=cp)
        await graph.ainvoke({"log": ["start"]}, {"configurable": {"thread_id": "ad"}})
        await cp.adelete_thread("ad")
        assert await cp.atombstone("ad") is not None


async def test_smart_single_writer_batch_waits_for_the_one_out(tmp_path: Path) -> None:
    """With the head rule a batch never carries the one still out (written twice, its
    checkpoints would no longer chain onto the head): it waits for it, and both land."""
    with open_saver("memory", tmp_path) as h:
        gated = GatedStore(h.inner._store, gates=2)
        gated.gates[0].set()
        h.inner._store = gated
        async with SmartCheckpointer(h.inner, OnEvents()) as smart:
            conf0 = await smart.aput(cfg("g"), _checkpoint("c0"), {"source": "loop", "step": 0},
                                     {})
            await smart.aflush()
            conf1 = await smart.aput(conf0, _checkpoint("c1"), {"source": "loop", "step": 1},
                                     {})
            first = asyncio.create_task(smart.aput_writes(conf1, [("plan", ["a"])], "task-1"))
            while gated.calls < 2:  # batch 1 is out, held at its gate
                await asyncio.sleep(0)
            conf2 = await smart.aput(conf1, _checkpoint("c2"), {"source": "loop", "step": 2},
                                     {})
            second = asyncio.create_task(smart.aput_writes(conf2, [("plan", ["b"])], "task-2"))
            for _ in range(50):
                await asyncio.sleep(0)
            assert gated.calls == 2 and not second.done()
            gated.gates[1].set()
            await asyncio.wait_for(asyncio.gather(first, second), 10)
            assert await _astored_plan(h.inner) == [("c2", [["b"]]), ("c1", [["a"]]),
                                                    ("c0", [])]
            assert smart.metrics.flush_failures == 0


# -- ReplicatedCheckpointer --------------------------------------------------------------------


@pytest.fixture(params=params(BACKENDS))
def pair(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[SaverHandle,
                                                                          SaverHandle]]:
    """A primary's storage and a replica's, each a handle of its own."""
    with open_saver(request.param, tmp_path / "p") as p, \
            open_saver(request.param, tmp_path / "r") as r:
        yield p, r


def connection(handle: SaverHandle) -> Any:
    """Another checkpointer over the handle's storage (another process's connection)."""
    if handle.backend not in PERSISTENT:
        return StoreCheckpointer(handle.inner.store)
    return handle.reopen()


def test_replicated_two_concurrent_runs_one_wins(pair: tuple[SaverHandle, SaverHandle]
                                                 ) -> None:
    p, r = pair
    with ReplicatedCheckpointer(p.inner, [r.inner]) as cp:
        for fresh, t in ((False, "t"), (True, "n")):
            assert race(cp, t, fresh) == ["refused", "won"]
            assert cp.flush(timeout=30)
            assert_one_chain(p.inner, t)
            assert_one_chain(r.inner, t)
        assert not cp.status().primary_error and cp.status().replicas[0].up


def test_replicated_lease_tombstone_writers_go_to_the_primary(
    pair: tuple[SaverHandle, SaverHandle]
) -> None:
    p, r = pair
    with ReplicatedCheckpointer(p.inner, [r.inner]) as cp:
        assert cp.writers == "single"
        graph = steps_graph().compile(checkpointer=cp)
        config = {"configurable": {"thread_id": "d"}}
        graph.invoke({"log": ["start"]}, config)
        with cp.lease("d", ttl=30, keep_alive=False), pytest.raises(ThreadLeasedError), \
                p.inner.lease("d", ttl=30):
            pass
        late = cp.get_tuple(config)
        cp.delete_thread("d")
        assert cp.flush(timeout=30)
        assert cp.tombstone("d") is not None and p.inner.tombstone("d") is not None
        assert r.inner.tombstone("d") is not None  # the delete replicated with its tombstone
        with pytest.raises(ThreadDeletedError):
            cp.put(late.config, {**late.checkpoint, "id": later_id()},
                   {"source": "loop", "step": 3}, {})
        assert history(p.inner, "d") == [] and history(r.inner, "d") == []


def test_replicated_promotion_fences_off_the_demoted_primarys_writers(
    pair: tuple[SaverHandle, SaverHandle]
) -> None:
    """Two nodes over the same primary and replica stores. Node 1 loses the primary and
    promotes the replica (a newer epoch there); node 2, still writing through the old
    primary, has its applies to the promoted store refused (`status()` says fenced, its next
    write raises `FencedError`); once the old primary answers node 1 raises its epoch first,
    and node 2's writes through it are refused. Node 1's history stays one chain."""
    p, r = pair
    p1, r1 = connection(p), connection(r)
    switch = unplug(p1)
    node1 = ReplicatedCheckpointer(p1, [r1], promote=True, retry_primary_after=0.05,
                                   names=["replica"])
    node2 = ReplicatedCheckpointer(p.inner, [r.inner], names=["replica"])
    try:
        g1 = steps_graph().compile(checkpointer=node1)
        g2 = steps_graph().compile(checkpointer=node2)
        one, two = {"configurable": {"thread_id": "one"}}, {"configurable": {"thread_id": "two"}}
        g1.invoke({"log": ["start"]}, one)
        g2.invoke({"log": ["start"]}, two)
        assert node1.flush(timeout=30) and node2.flush(timeout=30)

        switch.down = True  # node 1 loses the primary: the replica is promoted, epoch 1
        g1.invoke({"log": ["after failover"]}, one)
        assert node1.primary is r1 and r1.writer_epoch == 1
        assert r.inner.read_epoch() == 1

        # node 2 still reaches the old primary: its writes land there, but the promoted
        # store refuses their applies (epoch 0 < 1), and says so; never retried. (Node 2
        # may learn it within this very run: its next write is then refused.)
        before = len(history(p.inner, "two"))
        with contextlib.suppress(FencedError):
            g2.invoke({"log": ["through the old primary"]}, two)
        assert len(history(p.inner, "two")) > before
        assert node2.flush(timeout=30)
        status = node2.status().replicas[0]
        assert status.fenced and "FencedError" in (status.last_error or "")
        assert status.needs_repair and "FENCED" in str(node2.status())
        with pytest.raises(FencedError):
            g2.invoke({"log": ["again"]}, two)

        switch.down = False  # the old primary answers: fenced first, then a replica
        wait_until(lambda: node1.status().replicas[0].up, 30)
        assert p.inner.read_epoch() == 1
        late = p.inner.get_tuple(cfg("two"))
        with pytest.raises(FencedError):  # any writer of the old primary with epoch 0
            p.inner.put(late.config, {**late.checkpoint,
                                      "id": later_id()},
                        {"source": "loop", "step": 9}, {})

        g1.invoke({"log": ["later"]}, one)
        assert node1.flush(timeout=30)
        report = node1.repair()
        assert all(x.error is None for x in report.replicas), report.summary()
        assert_one_chain(r.inner, "one")
        assert_one_chain(p.inner, "one")
        assert [t.checkpoint["id"] for t in history(p.inner, "one")] == [
            t.checkpoint["id"] for t in history(r.inner, "one")]
        assert not node1.status().replicas[0].fenced
    finally:
        node1.close(timeout=5)
        node2.close(timeout=5)
        for c in (p1, r1):
            if c is not p.inner and c is not r.inner and p.backend in PERSISTENT:
                c.close()


def wait_until(check: Any, timeout: float) -> None:
    """Poll a background thread's progress (not a TTL): fail after `timeout` seconds."""
    import time

    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


@pytest.mark.parametrize("end", ["close", "with", "aclose"])
def test_smart_turns_another_writer_beat_are_never_dropped_silently(
    handle: SaverHandle, end: str
) -> None:
    """This process buffers turns (`Periodic`); another writer writes the thread first. The
    buffered turns cannot be stored: `close()`, the end of a `with` block and `aclose()` raise,
    naming the thread and what was lost, and the metrics do not count them as written."""
    cp = SmartCheckpointer(handle.inner, LATER)
    config = {"configurable": {"thread_id": "lost"}}
    graph = steps_graph().compile(checkpointer=cp)
    graph.invoke({"log": ["start"]}, config)
    cp.flush()
    graph.invoke({"log": ["mine"]}, config)  # buffered: nothing stored yet
    with other_writer(handle) as other:
        steps_graph().compile(checkpointer=other).invoke({"log": ["theirs"]}, config)
    with pytest.raises(ConcurrentWriteError, match=r"thread 'lost': 4 checkpoint") as info:
        if end == "close":
            cp.close()
        elif end == "with":
            with cp:
                pass
        else:
            asyncio.run(cp.aclose())
    assert info.value.thread_id == "lost" and "not stored" in str(info.value)
    m = cp.metrics
    assert m.buffered == 0 and m.writes_refused == 1 and m.checkpoints_written == 4
    cp.close()  # told once: closing again is quiet


def test_smart_turns_lost_at_interpreter_exit_are_logged(tmp_path: Path) -> None:
    """Never closed: the exit's flush is refused, and the log names the thread and the loss."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(f"""
        from langgraph_ckpt_ext import Periodic, SmartCheckpointer, SQLiteCheckpointer
        from tests.strategies.test_writers_wrappers import steps_graph
        path = {str(tmp_path / "exit.db")!r}
        config = {{"configurable": {{"thread_id": "at-exit"}}}}
        inner = SQLiteCheckpointer(path)
        cp = SmartCheckpointer(inner, Periodic(3600))
        steps_graph().compile(checkpointer=cp).invoke({{"log": ["mine"]}}, config)
        other = SQLiteCheckpointer(path)
        steps_graph().compile(checkpointer=other).invoke({{"log": ["theirs"]}}, config)
        other.close()
        print("exiting", flush=True)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).resolve().parents[2])
    assert "exiting" in done.stdout, done.stderr
    assert "lost at interpreter exit" in done.stderr and "'at-exit'" in done.stderr
