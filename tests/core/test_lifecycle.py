"""The data lifecycle on every backend: retention policies, pins, sweeps, erasure.

Time is an injected clock (`cp.clock`): no test sleeps for a TTL.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langgraph.types import Command

from langgraph_ckpt_ext import Retention
from langgraph_ckpt_ext.core.errors import InvalidConfigError
from langgraph_ckpt_ext.core.retention import SweepSchedule, ThreadState, thread_digest
from tests.support.graphs import approval_graph
from tests.support.lifecycle import DAY, Clock, cfg, chat, sweeps_beside_a_graph
from tests.support.savers import SaverHandle, open_saver, params

BACKENDS = ["memory", "sqlite", "postgres", "redis"]
@pytest.fixture(params=params(BACKENDS))
def handle(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SaverHandle]:
    with open_saver(request.param, tmp_path) as h:
        yield h


def checkpoints(cp: Any, thread_id: str) -> int:
    return len(list(cp.list(cfg(thread_id))))


def clocked(h: SaverHandle, **retention: Any) -> Clock:
    clock = Clock()
    h.inner.clock = clock
    if retention:
        h.inner.retention = Retention(**retention)
    return clock


def test_idle_and_absolute_expiry(handle: SaverHandle) -> None:
    cp = handle.inner
    clock = clocked(handle, idle=DAY)
    chat(cp, "old")
    clock.advance(DAY / 2)
    chat(cp, "young")
    clock.advance(DAY / 2 + 1)
    report = cp.sweep()
    assert report.deleted == ["old"] and cp.get_tuple(cfg("old")) is None
    assert cp.get_tuple(cfg("young")) is not None
    # a write keeps an idle thread alive; an absolute TTL counts from the first write
    cp.retention = Retention(absolute=DAY)
    chat(cp, "young")
    assert cp.sweep().deleted == []
    clock.advance(DAY / 2)
    chat(cp, "young")  # written just now, but created more than a day ago
    assert cp.sweep().deleted == ["young"]
    chat(cp, "fresh")
    clock.advance(DAY - 1)
    chat(cp, "fresh")
    assert cp.sweep().deleted == []
    clock.advance(2)
    chat(cp, "fresh")  # written just now, but created more than a day ago
    assert cp.sweep().deleted == ["fresh"]


def test_keep_latest_cuts_history_and_keeps_the_state(handle: SaverHandle) -> None:
    cp = handle.inner
    clock = clocked(handle, idle=60, strategy="keep_latest")
    chat(cp, "t", turns=3)
    before = cp.get_tuple(cfg("t"))
    assert checkpoints(cp, "t") > 2
    clock.advance(61)
    report = cp.sweep()
    assert list(report.trimmed) == ["t"] and report.deleted == []
    assert checkpoints(cp, "t") == 1
    after = cp.get_tuple(cfg("t"))
    assert after is not None and before is not None
    assert after.checkpoint["channel_values"] == before.checkpoint["channel_values"]
    # nothing written since: the next pass has nothing to do
    assert cp.sweep().trimmed == {}
    chat(cp, "t")  # and the thread goes on
    assert len(cp.get_tuple(cfg("t")).checkpoint["channel_values"]["messages"]) == 8


def test_keep_newest_n(handle: SaverHandle) -> None:
    cp = handle.inner
    clocked(handle, keep=4)
    chat(cp, "t", turns=5)
    total = checkpoints(cp, "t")
    newest = [c.config["configurable"]["checkpoint_id"] for c in cp.list(cfg("t"), limit=4)]
    report = cp.sweep()
    assert report.trimmed == {"t": total - 4}
    assert [c.config["configurable"]["checkpoint_id"] for c in cp.list(cfg("t"))] == newest


def test_older_than_a_date(handle: SaverHandle) -> None:
    cp = handle.inner
    clock = clocked(handle)
    chat(cp, "before")
    clock.advance(10)
    cp.retention = Retention(older_than=dt.datetime.fromtimestamp(clock.now - 5, dt.timezone.utc))
    chat(cp, "after")
    assert cp.sweep().deleted == ["before"]


def test_paused_threads_are_kept_unless_told(handle: SaverHandle) -> None:
    cp = handle.inner
    clock = clocked(handle, idle=60)
    graph = approval_graph().compile(checkpointer=cp)
    graph.invoke({"request": "r", "decision": "", "log": []}, cfg("paused"))
    chat(cp, "done")
    clock.advance(61)
    report = cp.sweep()
    assert report.deleted == ["done"] and report.paused == ["paused"]
    # the human answers later: the run resumes where it waited
    graph.invoke(Command(resume="yes"), cfg("paused"))
    assert graph.get_state(cfg("paused")).values["decision"] == "yes"
    graph.invoke({"request": "r2", "decision": "", "log": []}, cfg("paused2"))
    clock.advance(61)
    assert "paused2" in cp.sweep(delete_paused=True).deleted


def test_pins_and_per_thread_policies(handle: SaverHandle) -> None:
    cp = handle.inner
    clock = clocked(handle, idle=60)
    cp.pin("kept")  # before its first write: a thread with no checkpoint yet
    assert cp.thread_ids() == [] and cp.thread_state("kept") is not None
    chat(cp, "kept")
    chat(cp, "own")
    cp.set_thread_retention("own", Retention(idle=3600))
    chat(cp, "short")
    cp.set_thread_retention("short", {"idle": 10})
    clock.advance(30)
    assert cp.sweep().deleted == ["short"]
    clock.advance(60)
    report = cp.sweep()
    assert report.deleted == [] and report.pinned == 1
    cp.unpin("kept")
    assert cp.sweep().deleted == ["kept"]
    clock.advance(3600)
    assert cp.sweep().deleted == ["own"]
    state = cp.thread_state("kept")
    assert state is None


def test_refresh_on_read(handle: SaverHandle) -> None:
    cp = handle.inner
    clock = clocked(handle, idle=100, refresh_on_read=True)
    chat(cp, "read")
    chat(cp, "unread")
    clock.advance(60)
    assert cp.get_tuple(cfg("read")) is not None
    clock.advance(60)
    assert cp.sweep().deleted == ["unread"]


def test_limit_dry_run_and_reports(handle: SaverHandle) -> None:
    cp = handle.inner
    clock = clocked(handle, idle=60)
    for i in range(5):
        chat(cp, f"t{i}")
    clock.advance(61)
    dry = cp.sweep(dry_run=True)
    assert dry.dry_run and len(dry.deleted) == 5 and "would delete 5" in str(dry)
    assert len(cp.thread_ids()) == 5
    first = cp.sweep(limit=2)
    assert len(first.deleted) == 2 and first.more
    rest = cp.sweep()
    assert len(rest.deleted) == 3 and not rest.more
    assert cp.thread_ids() == []


def test_a_sweep_of_named_threads(handle: SaverHandle) -> None:
    cp = handle.inner
    clock = clocked(handle, idle=60)
    for t in ("a", "b", "c"):
        chat(cp, t)
    clock.advance(61)
    report = cp.sweep(threads=["c", "a", "unknown"])
    assert report.deleted == ["a", "c"] and report.examined == 2
    assert cp.thread_ids() == ["b"]
    with pytest.raises(InvalidConfigError):
        cp.sweep(threads=[""])


def test_a_thread_written_since_it_was_read_is_not_expired(handle: SaverHandle) -> None:
    cp = handle.inner
    clock = clocked(handle, idle=60)
    chat(cp, "t")
    clock.advance(61)
    state = cp.thread_state("t")
    assert state is not None
    chat(cp, "t")  # a run writes between the sweep's read and its delete
    assert cp.run_sync(cp._store.expire_thread("t", state.generation)) is False
    assert checkpoints(cp, "t") > 0
    fresh = cp.thread_state("t")
    assert fresh is not None and fresh.generation > state.generation


def test_sweeps_beside_a_running_graph_leave_threads_whole_or_gone(handle: SaverHandle) -> None:
    sweeps_beside_a_graph(handle.inner, handle.inner.sweep, turns=15)


def test_erasure_across_threads_forks_and_namespaces(handle: SaverHandle) -> None:
    cp = handle.inner
    clocked(handle)
    chat(cp, "u42-a", turns=2, user_id="u-42")
    chat(cp, "u42-b", user_id="u-42")
    chat(cp, "other", user_id="u-7")
    cp.fork({"configurable": {"thread_id": "u42-a"}}, new_thread_id="u42-fork")
    dry = cp.erase({"user_id": "u-42"}, dry_run=True)
    assert dry.threads == ["u42-a", "u42-b", "u42-fork"] and dry.checkpoints > 0
    assert len(cp.thread_ids()) == 4
    report = cp.erase({"user_id": "u-42"}, reason="GDPR request 17")
    assert report.threads == dry.threads and "u-42" not in str(report)
    assert cp.thread_ids() == ["other"]
    log = cp.lifecycle_log("u42-a")
    assert [e.action for e in log] == ["erase"] and log[0].reason == "GDPR request 17"
    assert log[0].thread == thread_digest("u42-a")
    assert all("u42" not in e.thread for e in cp.lifecycle_log())


def test_bad_input_is_refused_before_anything_is_deleted(handle: SaverHandle) -> None:
    cp = handle.inner
    clocked(handle)
    chat(cp, "t", user_id="u")
    for bad in ({"idle": 0}, {"idle": -5}, {"absolute": float("nan")}, {"strategy": "shred"},
                {"keep": 0}, {"older_than": "yesterday"}, {"idle": "1h"}, {"ttl": 5}):
        with pytest.raises(InvalidConfigError):
            cp.retention = bad
        with pytest.raises(InvalidConfigError):
            cp.set_thread_retention("t", bad)
    for where in ({}, None, "user_id=u", {"": "u"}, {"user_id": None}):
        with pytest.raises((InvalidConfigError, ValueError)):
            cp.erase(where)  # type: ignore[arg-type]
    with pytest.raises(InvalidConfigError):
        cp.sweep(limit=0)
    assert cp.thread_ids() == ["t"]


def test_langgraph_platform_ttl_vocabulary() -> None:
    policy, schedule = Retention.from_platform(
        {"strategy": "keep_latest", "default_ttl": 30, "sweep_interval_minutes": 2,
         "sweep_limit": 100})
    assert policy == Retention(idle=1800, strategy="keep_latest")
    assert schedule == SweepSchedule(120.0, 100)
    # `strategy` is a key of both vocabularies: our fields beside it stay ours
    ours = {"idle": 60, "strategy": "keep_latest"}
    assert Retention.coerce(ours) == Retention(idle=60, strategy="keep_latest")
    assert Retention.coerce({"strategy": "delete", "default_ttl": 1}) == Retention(idle=60)
    with pytest.raises(InvalidConfigError):
        Retention.from_platform({"strategy": "archive"})
    with pytest.raises(InvalidConfigError):
        Retention.from_platform({"default_ttl": 0})
    with pytest.raises(InvalidConfigError):
        Retention.from_platform({"default_tll": 10})


def test_background_sweeper(tmp_path: Path) -> None:
    from langgraph_ckpt_ext import InMemoryCheckpointer

    clock = Clock()
    cp = InMemoryCheckpointer(retention={"idle": 60})
    cp.clock = clock
    chat(cp, "t")
    clock.advance(61)
    cp.start_sweeper(0.02)
    try:
        for _ in range(500):
            if not cp.thread_ids():
                break
            threading.Event().wait(0.01)
        assert cp.thread_ids() == []
    finally:
        cp.close()
    assert cp._sweeper is None


def test_a_cut_the_store_is_too_busy_for_is_skipped_not_fatal(tmp_path: Path) -> None:
    """`delete_checkpoints` raising StoreBusyError (PostgreSQL: a writer held the thread past
    lock_timeout) marks that thread busy; the pass goes on with the others."""
    from langgraph_ckpt_ext import InMemoryCheckpointer
    from langgraph_ckpt_ext.core.errors import StoreBusyError

    cp = InMemoryCheckpointer(retention={"keep": 1})
    chat(cp, "a", turns=2)
    chat(cp, "b", turns=2)
    store: Any = cp._store
    delete = store.delete_checkpoints

    async def busy_for_a(thread_id: str, *args: Any) -> None:
        if thread_id == "a":
            raise StoreBusyError("thread 'a' is being written")
        await delete(thread_id, *args)

    store.delete_checkpoints = busy_for_a
    report = cp.sweep()
    assert report.busy == ["a"] and list(report.trimmed) == ["b"]
    store.delete_checkpoints = delete
    assert list(cp.sweep().trimmed) == ["a"]  # the next pass finishes the job


def test_a_thread_row_after_a_write_keeps_every_other_field() -> None:
    """`ThreadState.written` (made field by field, for speed) moves the generation, and the
    write time for activity, and keeps every other field, whichever fields the row has."""
    values: dict[str, Any] = {}
    for i, f in enumerate(dataclasses.fields(ThreadState)):
        values[f.name] = {"thread_id": "t", "pinned": True, "policy": "p"}.get(f.name, i + 0.5)
    row = ThreadState(**values)
    after = row.written(99.0)
    assert dataclasses.replace(row, generation=row.generation + 1, written_at=99.0) == after
    assert dataclasses.replace(row, generation=row.generation + 1) == row.written(99.0, False)
