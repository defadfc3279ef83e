"""Redis only: the thread lifecycle over the key layout. Lifecycle rows in the meta hash (set
by the write scripts themselves), the thread index walked by `thread_states` and cleaned by
the sweeper, pins against the native TTL, `expire_thread` against a concurrent write, the sweep
lock between processes (and after a SIGKILL), on a standalone server and on a Redis Cluster.

Time is an injected clock wherever the sweeper decides; only Redis's own expiry (the native
TTL, the lock's lease) runs on real time, and the tests shorten it with PEXPIRE instead of
waiting for it."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from langgraph_ckpt_ext import RedisCheckpointer, Retention
from langgraph_ckpt_ext.core.retention import LifecycleEvent
from langgraph_ckpt_ext.core.rows import WriteRow
from tests.support.forked import Forked, start
from tests.support.graphs import chat_graph, human
from tests.support.lifecycle import T0, Clock, cfg, put_chain
from tests.support.migrate_worker import open_target
from tests.support.savers import SaverHandle, drop_redis_prefixes, open_saver, params, redis_prefix

pytestmark = pytest.mark.redis


@pytest.fixture(params=params(["redis", "redis-cluster"]))
def handle(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SaverHandle]:
    with open_saver(request.param, tmp_path) as h:
        yield h


def put(cp: RedisCheckpointer, thread: str, n: int = 1) -> Any:
    """`n` checkpoints on `thread` (a growing list), each the child of the one before."""
    return put_chain(cp, thread, n)


def keys_of(client: Any, cp: RedisCheckpointer, thread: str) -> list[str]:
    return [k for k in cp.store.keys(thread) if client.exists(k)]


def meta(client: Any, cp: RedisCheckpointer, thread: str) -> dict[bytes, bytes]:
    return client.hgetall(cp.store.keys(thread)[6])


def indexed(client: Any, h: SaverHandle, thread: str) -> bool:
    return client.zscore(f"{h.prefix}:threads", thread) is not None


def gone_by_ttl(client: Any, cp: RedisCheckpointer, thread: str) -> None:
    """Let Redis expire every key of the thread (PEXPIRE 1 ms; Redis's own expiry does the
    rest), and wait until it did (bounded)."""
    for key in keys_of(client, cp, thread):
        client.pexpire(key, 1)
    for _ in range(200):
        if not keys_of(client, cp, thread):
            return
        time.sleep(0.01)
    raise AssertionError(f"{thread}'s keys did not expire")


# -- lifecycle rows, written by the write scripts ---------------------------------------------


def test_every_write_stamps_the_row_in_its_own_script(handle: SaverHandle) -> None:
    cp: RedisCheckpointer = handle.inner
    client = handle.redis_client()
    clock = Clock()
    cp.clock = clock
    config = put(cp, "t")
    state = cp.thread_state("t")
    assert state is not None
    assert (state.created_at, state.written_at, state.generation) == (T0, T0, 1)
    assert state.read_at is None and not state.pinned and state.policy is None
    clock.now += 10
    put(cp, "t", 2)  # checkpoints
    clock.now += 10
    cp.put_writes(config, [("items", [9])], "task-1")  # pending writes
    state = cp.thread_state("t")
    assert state is not None
    assert (state.created_at, state.written_at, state.generation) == (T0, T0 + 20, 4)
    # a batch: one script, one stamp, a generation per item
    clock.now += 10
    cid = config["configurable"]["checkpoint_id"]
    cp.run_sync(cp.store.write_batch([
        [WriteRow("t", "", cid, f"task-{i}", 0, "items", "json", b"[1]")] for i in (2, 3)]))
    state = cp.thread_state("t")
    assert state is not None and (state.written_at, state.generation) == (T0 + 30, 6)
    # a history cut is no write; a copy is a write to its target
    clock.now += 10
    cp.prune(["t"])
    after = cp.thread_state("t")
    assert after is not None and (after.written_at, after.generation) == (T0 + 30, 6)
    cp.copy_thread("t", "copy")
    copy = cp.thread_state("copy")
    assert copy is not None and (copy.created_at, copy.written_at, copy.generation) == (
        T0 + 40, T0 + 40, 1)
    assert indexed(client, handle, "copy")
    # deleting the thread deletes its row
    cp.delete_thread("t")
    assert cp.thread_state("t") is None and meta(client, cp, "t") == {}
    client.close()


def test_a_row_from_before_the_lifecycle_fields_is_stamped_when_first_seen(make_redis: Any) -> None:
    h = make_redis()
    cp: RedisCheckpointer = h.saver
    client = h.redis_client()
    clock = Clock()
    cp.clock = clock
    put(cp, "old", 2)
    client.hdel(cp.store.keys("old")[6], "created", "written")  # as the layout had it
    clock.now += 500
    cp.retention = Retention(idle=100)
    assert cp.sweep().deleted == []  # unknown age: counted from now, never from before
    fields = meta(client, cp, "old")
    assert float(fields[b"created"]) == float(fields[b"written"]) == T0 + 500
    clock.now += 101
    assert cp.sweep().deleted == ["old"]
    client.close()


# -- thread_states over the index ---------------------------------------------------------------


def test_thread_states_pages_see_each_thread_once_while_threads_go(handle: SaverHandle) -> None:
    cp: RedisCheckpointer = handle.inner
    client = handle.redis_client()
    store = cp.store
    names = [f"t{i:03d}" for i in range(300)]  # past the listpack size: a hash table zset
    for name in names:
        cp.pin(name)  # a row (and an index entry) without a checkpoint
    seen: list[str] = []
    cursor: str | None = None
    pages = 0
    deleted: set[str] = set()
    while True:
        states, cursor = cp.run_sync(store.thread_states(cursor, 7))
        pages += 1
        assert len(states) <= 7
        seen += [s.thread_id for s in states]
        # threads go between pages (as a sweep deletes them): nothing present throughout
        # the walk is missed
        for s in states[:2]:
            cp.delete_thread(s.thread_id)
            deleted.add(s.thread_id)
        if cursor is None:
            break
    assert pages == -(-300 // 7)  # every page full but the last
    assert set(seen) == set(names)
    assert len(seen) - len(set(seen)) <= 5  # ZSCAN may repeat one, rarely
    assert all(s.pinned for s in cp.run_sync(store.thread_states(None, 1000))[0])
    client.close()


def test_the_sweeper_drops_index_entries_of_threads_gone_by_ttl(make_redis: Any) -> None:
    # with a TTL: the deadline hint has passed, and housekeeping drops the entry
    h = make_redis(ttl=0.2)
    cp: RedisCheckpointer = h.saver
    client = h.redis_client()
    put(cp, "brief")
    put(cp, "kept")
    cp.pin("kept")  # its hint passes too, but its keys persist: re-scored, not dropped
    for _ in range(300):  # Redis's own expiry, real time (bounded)
        if not keys_of(client, cp, "brief"):
            break
        time.sleep(0.02)
    assert keys_of(client, cp, "brief") == [] and indexed(client, h, "brief")
    time.sleep(0.05)  # the hint (taken before the write) is past as well
    report = cp.sweep()
    assert report.examined == 1 and report.pinned == 1 and not indexed(client, h, "brief")
    assert client.zscore(f"{h.prefix}:threads", "kept") == float("inf")
    # without a TTL (no hint to pass): the walk over the index finds the keys gone
    h2 = make_redis()
    cp2: RedisCheckpointer = h2.saver
    put(cp2, "gone")
    put(cp2, "kept")
    gone_by_ttl(client, cp2, "gone")
    report = cp2.sweep()
    assert report.examined == 1 and report.deleted == []
    assert not indexed(client, h2, "gone") and indexed(client, h2, "kept")
    assert cp2.thread_ids() == ["kept"]
    client.close()


def test_a_thread_another_process_deleted_is_indexed_again_at_its_next_write(
        make_redis: Any) -> None:
    h = make_redis()
    writer: RedisCheckpointer = h.saver
    # another process's checkpointer on the same prefix, deleting with no tombstone (late
    # writes come back, as before tombstones: what this test is about is the index)
    other = h.reopen(tombstone_ttl=None)
    client = h.redis_client()
    try:
        put(writer, "t")
        other.delete_thread("t")  # drops the entry; the writer still remembers adding it
        assert not indexed(client, h, "t")
        put(writer, "t")
        assert indexed(client, h, "t") and other.thread_ids() == ["t"]
        config = put(writer, "u")
        writer.put_writes(config, [("items", [1])], "task")
        other.delete_thread("u")
        writer.put_writes(config, [("items", [1])], "task")  # pending writes alone
        assert indexed(client, h, "u")
        # a sweeper that found "u" gone drops its entry just after a write made it again
        # (whose writer had added the entry already): the entry is put back
        other.run_sync(other.store._unindex("u"))
        assert indexed(client, h, "u")
    finally:
        other.close()
        client.close()


# -- pins, policies, expire_thread ------------------------------------------------------------


def test_pins_persist_keys_under_ttl_and_unpin_restores_it(handle: SaverHandle) -> None:
    cp: RedisCheckpointer = handle.inner
    cp.store.ttl_ms = 30_000
    client = handle.redis_client()
    clock = Clock()
    cp.clock = clock
    cp.pin("keep")  # before its first write: a row, pinned, with no TTL
    clock.now += 5
    state = cp.thread_state("keep")
    assert state is not None and state.pinned and state.generation == 0
    assert state.created_at == state.written_at == T0
    assert client.pttl(cp.store.keys("keep")[6]) == -1
    put(cp, "keep", 2)
    put(cp, "other")
    assert all(client.pttl(k) == -1 for k in keys_of(client, cp, "keep"))
    assert all(0 < client.pttl(k) <= 30_000 for k in keys_of(client, cp, "other"))
    cp.unpin("keep")
    assert all(0 < client.pttl(k) <= 30_000 for k in keys_of(client, cp, "keep"))
    assert not cp.thread_state("keep").pinned  # type: ignore[union-attr]
    cp.pin("other")  # after writes: every key persists
    assert all(client.pttl(k) == -1 for k in keys_of(client, cp, "other"))
    # a row made by unpinning (or a policy) before any write carries the TTL: no key
    # outlives the thread
    cp.unpin("ghost")
    cp.set_thread_retention("ghost2", Retention(idle=5))
    for ghost in ("ghost", "ghost2"):
        assert 0 < client.pttl(cp.store.keys(ghost)[6]) <= 30_000
        assert indexed(client, handle, ghost)
    assert Retention.from_json(cp.thread_state("ghost2").policy) == Retention(idle=5)  # type: ignore[arg-type, union-attr]
    cp.set_thread_retention("ghost2", None)
    assert cp.thread_state("ghost2").policy is None  # type: ignore[union-attr]
    client.close()


def test_touch_and_mark_swept_never_make_a_row(handle: SaverHandle) -> None:
    cp: RedisCheckpointer = handle.inner
    client = handle.redis_client()
    cp.clock = Clock()
    cp.run_sync(cp.store.touch_thread("nobody"))
    cp.run_sync(cp.store.mark_swept("nobody", 3))
    assert meta(client, cp, "nobody") == {}
    put(cp, "t")
    cp.run_sync(cp.store.touch_thread("t"))
    cp.run_sync(cp.store.mark_swept("t", 1))
    state = cp.thread_state("t")
    assert state is not None and state.read_at == T0 and state.swept == 1
    client.close()


def test_expire_thread_refuses_after_a_concurrent_write(handle: SaverHandle) -> None:
    cp: RedisCheckpointer = handle.inner
    client = handle.redis_client()
    put(cp, "t", 2)
    state = cp.thread_state("t")
    assert state is not None
    put(cp, "t")  # a run writes between the sweep's read and its delete
    assert cp.run_sync(cp.store.expire_thread("t", state.generation)) is False
    assert len(keys_of(client, cp, "t")) == 5 and indexed(client, handle, "t")
    assert len(list(cp.list(cfg("t")))) == 3
    fresh = cp.thread_state("t")
    assert fresh is not None and fresh.generation == state.generation + 1
    assert cp.run_sync(cp.store.expire_thread("t", fresh.generation)) is True
    assert keys_of(client, cp, "t") == [] and not indexed(client, handle, "t")
    assert cp.run_sync(cp.store.expire_thread("t", fresh.generation)) is False  # no row
    client.close()


def test_retention_and_ttl_together(handle: SaverHandle) -> None:
    cp: RedisCheckpointer = handle.inner
    cp.store.ttl_ms = 60_000
    clock = Clock()
    cp.clock = clock
    cp.retention = Retention(idle=100, keep=2)
    put(cp, "t", 4)
    put(cp, "u", 1)
    report = cp.sweep()
    assert report.trimmed == {"t": 2} and report.deleted == []
    assert len(list(cp.list(cfg("t")))) == 2
    clock.now += 101
    report = cp.sweep()
    assert sorted(report.deleted) == ["t", "u"] and cp.thread_ids() == []


def test_lifecycle_log_round_trips(handle: SaverHandle) -> None:
    cp: RedisCheckpointer = handle.inner
    events = [LifecycleEvent(T0, "erase", "a" * 32, 3, "why\0not, ü"),
              LifecycleEvent(T0 + 1.5, "trim", "b" * 32, 0)]
    cp.run_sync(cp.store.log_lifecycle(events))
    cp.run_sync(cp.store.log_lifecycle([]))
    assert cp.run_sync(cp.store.read_lifecycle()) == events
    assert cp.run_sync(cp.store.read_lifecycle("b" * 32)) == events[1:]
    assert cp.vacuum() == (0, 0)


# -- the sweep lock --------------------------------------------------------------------------


def test_the_sweep_lock_is_held_renewed_and_released(handle: SaverHandle) -> None:
    cp: RedisCheckpointer = handle.inner
    other = handle.reopen()
    client = handle.redis_client()
    lock_key = f"{handle.prefix}:sweep-lock"

    async def hold() -> tuple[bool, bool, int]:
        cp.store.lock_lease = 1.0
        async with cp.store.sweep_lock() as held:
            await asyncio.sleep(2.5)  # longer than the lease: renewed meanwhile
            async with other.store.sweep_lock() as second:
                pass
            ttl = client.pttl(lock_key)
        return held, second, ttl

    held, second, ttl = asyncio.run(hold())
    assert (held, second) == (True, False) and 0 < ttl <= 1000, (held, second, ttl)
    assert client.exists(lock_key) == 0  # released
    assert other.sweep().locked_out is False
    other.close()
    client.close()


def _worker(target: str, *args: str) -> Forked:
    return start("tests.support.sweep_worker", target, *args)


def _events(lines: Any) -> Iterator[dict[str, Any]]:
    for line in lines:
        yield json.loads(line)


@pytest.fixture
def target() -> Iterator[str]:
    prefix = redis_prefix()
    yield prefix
    drop_redis_prefixes(prefix)


THREADS = 24


def _fill(prefix: str) -> None:
    proc = _worker(f"redis:{prefix}", "fill", str(THREADS), "3", str(T0))
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err


def test_two_sweepers_on_one_prefix(target: str) -> None:
    _fill(target)
    first = _worker(f"redis:{target}", "sweep", str(T0 + 100), "50", "-", "step")
    try:
        assert first.stdout is not None and first.stdin is not None
        first_events = _events(first.stdout)
        expired: list[str] = []
        for event in first_events:
            if event["event"] == "expired":
                expired.append(event["thread"])
                break
        # the first holds the lock, waiting mid-pass until its stdin ends
        second = _worker(f"redis:{target}", "sweep", str(T0 + 100), "50")
        out2, err2 = second.communicate(timeout=120)
        assert second.returncode == 0, err2
        done2 = [json.loads(line) for line in out2.splitlines()][-1]
        assert done2 == {"event": "done", "deleted": 0, "locked_out": True, "busy": 0,
                         "examined": 0}
        first.stdin.close()
        done1: dict[str, Any] = {}
        for event in first_events:
            if event["event"] == "expired":
                assert event["done"] is True
                expired.append(event["thread"])
            elif event["event"] == "done":
                done1 = event
        first.wait(120)
        assert first.returncode == 0, first.stderr.read() if first.stderr else ""
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(30)
    assert done1["deleted"] == THREADS and not done1["locked_out"] and done1["busy"] == 0
    assert sorted(expired) == [f"t{i:05d}" for i in range(THREADS)]  # each once
    with open_target(f"redis:{target}") as cp:
        assert cp.thread_ids() == []
        assert cp.run_sync(cp._store._command("EXISTS", f"{target}:sweep-lock")) == 0


def test_a_sweeper_killed_mid_pass(target: str) -> None:
    _fill(target)
    proc = _worker(f"redis:{target}", "sweep", str(T0 + 100), "50", "-", "0.1")
    killed_after: list[str] = []
    try:
        assert proc.stdout is not None
        for event in _events(proc.stdout):
            if event["event"] == "expired":
                killed_after.append(event["thread"])
                if len(killed_after) == THREADS // 3:
                    proc.kill()  # SIGKILL: no release, no cleanup
                    break
        else:
            pytest.fail(f"the worker ended early: {proc.stderr.read() if proc.stderr else ''}")
    finally:
        proc.wait(30)
    assert proc.returncode == -9
    with open_target(f"redis:{target}") as cp:
        assert isinstance(cp, RedisCheckpointer)
        store = cp.store
        client = cp.run_sync
        # every thread whole (three checkpoints, each readable) or entirely gone
        left = []
        for i in range(THREADS):
            tid = f"t{i:05d}"
            tuples = list(cp.list(cfg(tid)))
            existing = client(store.existing_keys(tid))
            if tuples:
                assert len(tuples) == 3
                assert [t.checkpoint["channel_values"]["items"] for t in tuples] == [
                    [0, 1, 2], [0, 1], [0]]
                left.append(tid)
            else:
                assert existing == [], (tid, existing)
        assert THREADS // 3 <= THREADS - len(left) <= THREADS // 3 + 1
        # the dead holder's lock lapses by itself, after its lease
        lock_key = f"{target}:sweep-lock"
        ttl = client(store._command("PTTL", lock_key))
        assert 0 < ttl <= store.lock_lease * 1000
        cp.clock = lambda: T0 + 100
        cp.retention = Retention(idle=50)
        assert cp.sweep().locked_out
        client(store._command("PEXPIRE", lock_key, 1))  # instead of waiting out the lease
        for _ in range(200):
            if not client(store._command("EXISTS", lock_key)):
                break
            time.sleep(0.01)
        report = cp.sweep()
        assert not report.locked_out and sorted(report.deleted) == left
        assert cp.thread_ids() == []


def test_constructor_takes_retention_and_sweep_every(make_redis: Any) -> None:
    h = make_redis(retention={"idle": 60}, sweep_every=3600)
    cp: RedisCheckpointer = h.saver
    assert cp.retention == Retention(idle=60)
    assert cp._sweeper is not None and cp._sweeper.schedule.interval == 3600
    cp.stop_sweeper()
    graph = chat_graph().compile(checkpointer=cp)
    graph.invoke({"messages": [human("hi")]}, {"configurable": {"thread_id": "g"}})
    clock = Clock(time.time() + 61)
    cp.clock = clock
    assert cp.sweep().deleted == ["g"]
