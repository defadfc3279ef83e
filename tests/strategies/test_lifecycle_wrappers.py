"""The data lifecycle (retention, pins, sweeps, erasure) through `SmartCheckpointer` and
`ReplicatedCheckpointer`: the same methods as the checkpointers of this package, with what
each wrapper adds (a buffered thread is active; a replica follows its primary).

Time is an injected clock (`wrapper.clock`): no test sleeps for a TTL.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import HumanMessage

from langgraph_ckpt_ext import Retention
from langgraph_ckpt_ext.core.errors import InvalidConfigError
from langgraph_ckpt_ext.core.retention import thread_digest
from langgraph_ckpt_ext.strategies.smart.policies import Periodic
from langgraph_ckpt_ext.timetravel.audit import CUT
from tests.support.graphs import chat_graph
from tests.support.lifecycle import DAY, Clock, cfg, chat, sweeps_beside_a_graph
from tests.support.savers import SaverHandle, open_saver, param


def ids(saver: Any, thread_id: str) -> list[str]:
    return [t.config["configurable"]["checkpoint_id"] for t in saver.list(cfg(thread_id))]



def clocked(cp: Any, **retention: Any) -> Clock:
    clock = Clock()
    cp.clock = clock
    if retention:
        cp.retention = Retention(**retention)
    return clock


# -- SmartCheckpointer ------------------------------------------------------------------------

SMART = ["memory", "sqlite"]


@pytest.fixture(params=[param(k) for k in SMART])
def smart(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SaverHandle]:
    with open_saver(request.param, tmp_path, wrapper="smart") as h:
        yield h


@pytest.fixture(params=[param(k) for k in SMART])
def buffering(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SaverHandle]:
    """A smart checkpointer that writes a thread's buffer only when told (or after an hour)."""
    with open_saver(request.param, tmp_path, wrapper="smart",
                    policy=Periodic(interval=3600)) as h:
        yield h


def test_smart_idle_expiry_and_clock(smart: SaverHandle) -> None:
    cp = smart.saver
    clock = clocked(cp, idle=DAY)
    assert smart.inner.clock is clock and cp.retention == Retention(idle=DAY)
    chat(cp, "old")
    clock.advance(DAY / 2)
    chat(cp, "young")
    clock.advance(DAY / 2 + 1)
    state = cp.thread_state("young")
    assert state is not None and state.written_at == clock.now - DAY / 2 - 1
    report = cp.sweep()
    assert report.deleted == ["old"] and report.examined == 2
    assert cp.get_tuple(cfg("old")) is None and smart.inner.get_tuple(cfg("old")) is None
    assert cp.get_tuple(cfg("young")) is not None
    assert asyncio.run(cp.asweep()).deleted == []


def test_smart_never_expires_a_buffered_thread(buffering: SaverHandle) -> None:
    cp, inner = buffering.saver, buffering.inner
    clock = clocked(cp, idle=60)
    chat(cp, "active")
    chat(cp, "idle")
    cp.flush()
    stored = ids(inner, "active")
    clock.advance(50)
    chat(cp, "active")  # a run goes on: buffered, not yet written
    assert ids(inner, "active") == stored
    clock.advance(11)  # the stored row says idle for 61 s
    dry = cp.sweep(dry_run=True)
    assert dry.deleted == ["idle"] and dry.busy == ["active"]
    report = cp.sweep()
    assert report.deleted == ["idle"] and report.busy == ["active"]
    assert len(ids(cp, "active")) > len(stored)  # the buffer still holds the new turn
    cp.flush()  # ... and writes it onto what was kept
    after = ids(inner, "active")
    assert after[len(after) - len(stored):] == stored and len(after) > len(stored)
    state = cp.thread_state("active")
    assert state is not None and state.written_at == clock.now
    assert cp.sweep().deleted == []


def test_smart_thread_state_writes_the_buffer_first(buffering: SaverHandle) -> None:
    cp = buffering.saver
    clock = clocked(cp)
    chat(cp, "t")
    clock.advance(5)
    state = cp.thread_state("t")  # the buffer of "t" is written first: a row, now
    assert state is not None and state.created_at == clock.now == state.written_at
    assert asyncio.run(cp.athread_state("nobody")) is None


def test_smart_erase_writes_the_buffer_and_drops_it(buffering: SaverHandle) -> None:
    cp, inner = buffering.saver, buffering.inner
    clocked(cp)
    chat(cp, "u1-a", user_id="u1")
    cp.flush()
    chat(cp, "u1-b", user_id="u1")  # only in the buffer
    chat(cp, "u2", user_id="u2")
    dry = cp.erase({"user_id": "u1"}, dry_run=True)
    assert dry.threads == ["u1-a", "u1-b"] and dry.checkpoints > 0
    report = cp.erase({"user_id": "u1"}, reason="request 9")
    assert report.threads == ["u1-a", "u1-b"]
    assert cp.thread_ids() == ["u2"] == inner.thread_ids()
    assert cp.get_tuple(cfg("u1-b")) is None and cp.metrics.buffered == 0
    cp.flush()
    assert inner.thread_ids() == ["u2"]
    log = cp.lifecycle_log("u1-b")
    assert [(e.action, e.reason) for e in log] == [("erase", "request 9")]
    assert asyncio.run(cp.alifecycle_log()) == inner.lifecycle_log()


def test_smart_erase_drops_what_was_buffered_meanwhile(
        buffering: SaverHandle, monkeypatch: pytest.MonkeyPatch) -> None:
    cp, inner = buffering.saver, buffering.inner
    clocked(cp)
    chat(cp, "u1", user_id="u1")
    newest = cp.get_tuple(cfg("u1"))
    assert newest is not None
    find = inner._erasure_targets

    async def found_while_a_write_comes(flt: Any) -> Any:
        targets = await find(flt)  # (after the erasure wrote the buffer)
        cp.put_writes(newest.config, [("messages", "late")], "task-1")  # buffered only
        return targets

    monkeypatch.setattr(inner, "_erasure_targets", found_while_a_write_comes)
    assert cp.erase({"user_id": "u1"}).threads == ["u1"]
    assert cp.metrics.buffered == 0 and cp.get_tuple(cfg("u1")) is None
    cp.flush()
    assert inner.get_tuple(cfg("u1")) is None and inner.thread_state("u1") is None


def test_smart_async_erase_drops_the_buffer(buffering: SaverHandle) -> None:
    cp, inner = buffering.saver, buffering.inner
    clocked(cp)

    async def go() -> Any:
        graph = chat_graph().compile(checkpointer=cp)
        await graph.ainvoke({"messages": [HumanMessage(content="hi")]},
                            {**cfg("gone"), "metadata": {"user_id": "u"}})
        return await cp.aerase({"user_id": "u"})

    assert asyncio.run(go()).threads == ["gone"]
    assert cp.get_tuple(cfg("gone")) is None and inner.thread_ids() == []


def test_smart_pins_and_policies(smart: SaverHandle) -> None:
    cp, inner = smart.saver, smart.inner
    clock = clocked(cp, idle=60)
    cp.pin("kept")  # before its first write
    chat(cp, "kept")
    chat(cp, "own")
    cp.set_thread_retention("own", {"idle": 3600})
    chat(cp, "short")
    asyncio.run(cp.aset_thread_retention("short", Retention(idle=10)))
    state = inner.thread_state("own")
    assert state is not None and Retention.from_json(state.policy or "") == Retention(idle=3600)
    clock.advance(30)
    assert cp.sweep().deleted == ["short"]
    clock.advance(60)
    report = cp.sweep()
    assert report.deleted == [] and report.pinned == 1
    cp.unpin("kept")
    assert cp.sweep().deleted == ["kept"]
    asyncio.run(cp.apin("own"))
    clock.advance(3600)
    assert cp.sweep().deleted == [] and inner.thread_ids() == ["own"]
    asyncio.run(cp.aunpin("own"))
    cp.set_thread_retention("own", None)
    assert cp.sweep().deleted == ["own"]
    before, after = cp.vacuum()
    assert after <= before and inner.vacuum()[0] == after


def test_smart_background_sweeper_stops_with_the_wrapper(buffering: SaverHandle) -> None:
    cp, inner = buffering.saver, buffering.inner
    clock = clocked(cp, idle=60)
    chat(cp, "idle")
    chat(cp, "active")
    cp.flush()
    one_turn = len(ids(inner, "active"))
    clock.advance(61)
    chat(cp, "active")  # buffered: the background sweeper must leave it
    cp.start_sweeper(0.02)
    sweeper = cp._sweeper
    assert sweeper is not None
    for _ in range(500):
        if inner.thread_ids() == ["active"]:
            break
        threading.Event().wait(0.01)
    assert inner.thread_ids() == ["active"]
    cp.close()
    assert cp._sweeper is None and not sweeper._thread.is_alive()
    assert len(ids(inner, "active")) == 2 * one_turn  # both turns, written on close


@pytest.mark.parametrize("policy", [None, Periodic(interval=0.01)], ids=["events", "periodic"])
def test_smart_sweeps_beside_a_running_graph(smart: SaverHandle, policy: Any) -> None:
    cp = smart.saver
    if policy is not None:
        cp.policy = policy
    sweeps_beside_a_graph(cp, cp.sweep, settle=cp.flush)


# -- ReplicatedCheckpointer -------------------------------------------------------------------

REPLICATED = [
    ("memory", ("memory",)),
    ("memory", ("sqlite", "postgres", "redis")),
    ("sqlite", ("memory", "postgres")),
]


def replicated_param(primary: str, replicas: Sequence[str]) -> Any:
    return pytest.param((primary, replicas), id=f"{primary}>{'+'.join(replicas)}",
                        marks=param(primary, *replicas).marks)


def open_replicated(tmp_path: Path, primary: str, replicas: Sequence[str],
                    **options: Any) -> SaverHandle:
    return open_saver(primary, tmp_path, wrapper="replicated", replicas=list(replicas),
                      **options)


@pytest.fixture(params=[replicated_param(p, r) for p, r in REPLICATED])
def replicated(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SaverHandle]:
    primary, replicas = request.param
    with open_replicated(tmp_path, primary, replicas) as h:
        yield h


def replicas_of(h: SaverHandle) -> list[Any]:
    return [r.inner for r in h.replicas]


def test_replicated_idle_expiry_reaches_the_replicas(replicated: SaverHandle) -> None:
    cp = replicated.saver
    clock = clocked(cp, idle=DAY)
    chat(cp, "old", turns=2)
    clock.advance(DAY / 2)
    chat(cp, "young")
    assert cp.flush(30)
    assert all(r.thread_ids() == ["old", "young"] for r in replicas_of(replicated))
    clock.advance(DAY / 2 + 1)
    report = cp.sweep()
    assert report.deleted == ["old"] and not report.busy
    assert replicated.inner.thread_ids() == ["young"]
    assert cp.flush(30)
    for r in replicas_of(replicated):
        assert r.thread_ids() == ["young"] and r.get_tuple(cfg("old")) is None
    assert all(not s.needs_repair for s in cp.status().replicas)


def test_named_threads_swept_through_each_wrapper(smart: SaverHandle,
                                                   replicated: SaverHandle) -> None:
    for h in (smart, replicated):
        cp = h.saver
        clock = clocked(cp, idle=60)
        for t in ("a", "b"):
            chat(cp, t)
        cp.flush(30) if h is replicated else cp.flush()
        clock.advance(61)
        assert cp.sweep(threads=["b"]).deleted == ["b"]
        assert asyncio.run(cp.asweep(threads=["a"], dry_run=True)).deleted == ["a"]
        assert h.inner.thread_ids() == ["a"]
        if h is replicated:
            assert cp.flush(30)
            assert all(r.thread_ids() == ["a"] for r in replicas_of(h))


def test_replicated_history_cut_is_the_primarys(replicated: SaverHandle) -> None:
    cp = replicated.saver
    clock = clocked(cp, keep=3)
    chat(cp, "t", turns=4)
    chat(cp, "short")
    assert cp.flush(30)
    total = len(ids(replicated.inner, "t"))
    report = cp.sweep()
    assert report.trimmed == {"t": total - 3}
    kept = ids(replicated.inner, "t")
    assert len(kept) == 3
    assert cp.flush(30)
    for r in replicas_of(replicated):
        assert ids(r, "t") == kept
        assert r.get_tuple(cfg("t")).checkpoint == replicated.inner.get_tuple(
            cfg("t")).checkpoint
    # expired with keep_latest: one checkpoint left everywhere, and the thread goes on
    cp.retention = Retention(idle=60, strategy="keep_latest")
    chat(cp, "t")
    chat(cp, "short")
    clock.advance(61)
    assert sorted(cp.sweep().trimmed) == ["short", "t"]
    chat(cp, "t")
    assert cp.flush(30)
    assert len(ids(replicated.inner, "short")) == 1
    for r in replicas_of(replicated):
        assert ids(r, "short") == ids(replicated.inner, "short")
        assert ids(r, "t") == ids(replicated.inner, "t")
        assert len(r.get_tuple(cfg("t")).checkpoint["channel_values"]["messages"]) == 12


def test_replicated_erase_reaches_the_replicas_across_forks(replicated: SaverHandle) -> None:
    cp = replicated.saver
    clocked(cp)
    chat(cp, "u42-a", turns=2, user_id="u-42")
    chat(cp, "u42-b", user_id="u-42")
    chat(cp, "other", user_id="u-7")
    cp.fork(cfg("u42-a"), new_thread_id="u42-fork")
    chat(cp, "u42-fork")  # the fork goes on under its own metadata
    cp.fork(cfg("u42-fork"), new_thread_id="u42-fork-fork")
    assert cp.flush(30)
    assert all(len(r.thread_ids()) == 5 for r in replicas_of(replicated))
    dry = cp.erase({"user_id": "u-42"}, dry_run=True)
    assert dry.threads == ["u42-a", "u42-b", "u42-fork", "u42-fork-fork"]
    report = cp.erase({"user_id": "u-42"}, reason="GDPR 17")
    assert report.threads == dry.threads
    assert replicated.inner.thread_ids() == ["other"]
    assert cp.flush(30)
    for r in replicated.replicas:
        assert r.inner.thread_ids() == ["other"]
        if hasattr(r.inner._store, "read_lifecycle"):  # the records too: it may be promoted
            log = r.inner.lifecycle_log("u42-fork")
            assert [(e.action, e.reason, e.thread) for e in log] == [
                ("erase", "GDPR 17", thread_digest("u42-fork"))]
    assert cp.lifecycle_log("u42-a") == replicated.inner.lifecycle_log("u42-a") != []


def test_replicated_pins_policies_and_defaults_reach_the_replicas(
        replicated: SaverHandle) -> None:
    cp = replicated.saver
    clock = clocked(cp, idle=60)
    for r in replicas_of(replicated):  # one of them may be promoted
        assert r.clock is clock and r.retention == Retention(idle=60)
    cp.pin("kept")
    chat(cp, "kept")
    chat(cp, "own")
    cp.set_thread_retention("own", {"idle": 3600})
    asyncio.run(cp.aset_thread_retention("short", Retention(idle=10)))
    chat(cp, "short")
    assert cp.flush(30)
    for r in [replicated.inner, *replicas_of(replicated)]:
        kept, own = r.thread_state("kept"), r.thread_state("own")
        assert kept is not None and kept.pinned
        assert own is not None and Retention.from_json(own.policy or "") == Retention(idle=3600)
    assert cp.thread_state("kept") == replicated.inner.thread_state("kept")
    for bad in (lambda: cp.pin(""), lambda: cp.set_thread_retention("own", {"idle": 0})):
        with pytest.raises(InvalidConfigError):  # refused before anything is queued
            bad()
    assert all(s.queued == 0 for s in cp.status().replicas)
    clock.advance(61)
    report = cp.sweep()
    assert report.deleted == ["short"] and report.pinned == 1
    asyncio.run(cp.aunpin("kept"))
    assert cp.flush(30)
    for r in replicas_of(replicated):
        state = r.thread_state("kept")
        assert state is not None and not state.pinned
        # a replica promoted now sweeps as the primary would
        assert r.sweep(dry_run=True).deleted == ["kept"]


def test_replicated_async_sweep_and_erase(replicated: SaverHandle) -> None:
    cp = replicated.saver
    clock = clocked(cp, idle=60)

    async def go() -> tuple[Any, Any]:
        graph = chat_graph().compile(checkpointer=cp)
        for tid in ("a", "b"):
            await graph.ainvoke({"messages": [HumanMessage(content="hi")]},
                                {**cfg(tid), "metadata": {"user_id": tid}})
        await cp.apin("b")
        clock.advance(61)
        swept = await cp.asweep()
        return swept, await cp.aerase({"user_id": "b"})

    swept, erased = asyncio.run(go())
    assert swept.deleted == ["a"] and erased.threads == ["b"]
    assert cp.flush(30)
    assert all(r.thread_ids() == [] for r in [replicated.inner, *replicas_of(replicated)])


def test_replicated_sweeps_beside_a_running_graph(replicated: SaverHandle) -> None:
    cp = replicated.saver
    sweeps_beside_a_graph(cp, cp.sweep)
    assert cp.flush(30)
    for r in replicas_of(replicated):
        assert ids(r, "busy") == ids(replicated.inner, "busy")


def test_replicated_quorum_expiry_waits_for_the_replicas(tmp_path: Path) -> None:
    with open_replicated(tmp_path, "memory", ("memory", "memory"),
                         wrapper_options={"consistency": "quorum", "quorum": 2}) as h:
        cp = h.saver
        clock = clocked(cp, idle=60)
        chat(cp, "t")
        clock.advance(61)
        assert cp.sweep().deleted == ["t"]
        # confirmed by both replicas before the sweep returned
        assert all(r.thread_ids() == [] for r in replicas_of(h))


@pytest.mark.redis
def test_replicated_lifecycle_in_the_replicator_process(tmp_path: Path) -> None:
    with open_replicated(tmp_path, "memory", ("sqlite", "redis"), replica_urls=True) as h:
        cp = h.saver
        clock = clocked(cp, idle=60)
        cp.pin("pinned")
        chat(cp, "pinned")
        chat(cp, "kept", turns=2)
        cp.set_thread_retention("kept", {"keep": 2})
        chat(cp, "gone")
        clock.advance(61)
        report = cp.sweep()
        assert report.deleted == ["gone"] and list(report.trimmed) == ["kept"]
        assert len(ids(h.inner, "kept")) == 2
        assert cp.flush(30)
        for r in replicas_of(h):
            assert r.thread_ids() == ["kept", "pinned"]
            assert ids(r, "kept") == ids(h.inner, "kept")
            pinned, kept = r.thread_state("pinned"), r.thread_state("kept")
            assert pinned is not None and pinned.pinned
            assert kept is not None and Retention.from_json(kept.policy or "").keep == 2


def test_wrappers_refuse_a_foreign_inner_saver(tmp_path: Path) -> None:
    from langgraph.checkpoint.memory import InMemorySaver

    from langgraph_ckpt_ext import InMemoryCheckpointer, ReplicatedCheckpointer, SmartCheckpointer

    smart = SmartCheckpointer(InMemorySaver())
    repl = ReplicatedCheckpointer(InMemorySaver(), [InMemoryCheckpointer()])
    try:
        for cp in (smart, repl):
            for name, args in (("sweep", ()), ("erase", ({"u": 1},)), ("pin", ("t",))):
                with pytest.raises(NotImplementedError, match="this package's checkpointers"):
                    getattr(cp, name)(*args)
            with pytest.raises(NotImplementedError, match="keeps no thread lifecycle rows"):
                cp.clock = Clock()
            with pytest.raises(NotImplementedError, match="keeps no thread lifecycle rows"):
                assert cp.retention is None
    finally:
        smart.close()
        repl.close()


def test_smart_over_replicated(tmp_path: Path) -> None:
    from langgraph_ckpt_ext import InMemoryCheckpointer, ReplicatedCheckpointer, SmartCheckpointer

    primary, replica = InMemoryCheckpointer(), InMemoryCheckpointer()
    repl = ReplicatedCheckpointer(primary, [replica])
    cp = SmartCheckpointer(repl, Periodic(interval=3600))
    try:
        clock = clocked(cp, idle=60)
        assert primary.clock is clock is replica.clock
        chat(cp, "idle", user_id="u1")
        chat(cp, "active", user_id="u2")
        cp.flush()
        clock.advance(61)
        chat(cp, "active")  # buffered
        report = cp.sweep()
        assert report.deleted == ["idle"] and report.busy == ["active"]
        assert repl.flush(30) and replica.thread_ids() == ["active"]
        chat(cp, "late", user_id="u2")  # buffered only: erased with the rest of u2
        assert cp.erase({"user_id": "u2"}).threads == ["active", "late"]
        assert cp.metrics.buffered == 0 and repl.flush(30)
        assert primary.thread_ids() == [] == replica.thread_ids()
    finally:
        cp.close()
        repl.close()


def test_audited_replicas_verify_cuts_and_erasures(tmp_path: Path) -> None:
    """A replica, promoted one day, tells a cut or an erasure the primary made from tampering,
    as the primary does."""
    from langgraph_ckpt_ext import InMemoryCheckpointer, ReplicatedCheckpointer

    primary, replica = InMemoryCheckpointer(audit=True), InMemoryCheckpointer(audit=True)
    cp = ReplicatedCheckpointer(primary, [replica])
    try:
        clocked(cp, keep=2)
        chat(cp, "t", turns=3)
        chat(cp, "gone", user_id="u-1")
        assert sorted(cp.sweep().trimmed) == ["gone", "t"]
        assert cp.erase({"user_id": "u-1"}, reason="request 9").threads == ["gone"]
        assert cp.flush(30)
        on_primary = primary.verify("t")
        assert CUT in {p.kind for p in on_primary.problems}
        on_replica = replica.verify("t")
        assert [(p.kind, p.checkpoint_id) for p in on_replica.problems] == [
            (p.kind, p.checkpoint_id) for p in on_primary.problems]
        for saver in (primary, replica):
            erased = saver.verify("gone")
            assert erased.erased and erased.ok and "request 9" in str(erased)
    finally:
        cp.close()
