"""Redis only: TTLs (a thread expires whole), pinning, the key layout under hostile thread ids,
atomic puts under concurrent readers, a server that goes away, and a Redis Cluster of three
masters started by the test itself."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aredis
from langgraph.checkpoint.base import empty_checkpoint
from redis.crc import key_slot

from langgraph_ckpt_ext import (
    InvalidConfigError,
    RedisCheckpointer,
    StorageVersionError,
    StoreUnavailableError,
)
from tests.support.graphs import chat_graph, human
from tests.support.redis_servers import redis_cluster, redis_server
from tests.support.savers import (
    REDIS_URL,
    drop_redis_prefixes,
    open_saver,
    params,
    redis_prefix,
)

pytestmark = pytest.mark.redis


@pytest.fixture
def client() -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(REDIS_URL)
    yield c
    c.close()


def cfg(thread: str, **extra: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread, **extra}}


def put(cp: RedisCheckpointer, thread: str, values: dict[str, Any], changed: list[str],
        parent: dict[str, Any] | None = None, versions: dict[str, Any] | None = None,
        ns: str = "") -> tuple[dict[str, Any], dict[str, Any]]:
    """One `put` of `values`, bumping the versions of the `changed` channels only."""
    versions = dict(versions or {})
    for ch in changed:
        versions[ch] = cp.get_next_version(versions.get(ch))
    ckpt = empty_checkpoint()
    ckpt["channel_values"] = dict(values)
    ckpt["channel_versions"] = dict(versions)
    config = parent or cfg(thread, checkpoint_ns=ns)
    new = cp.put(config, ckpt, {"source": "loop", "step": 0}, {ch: versions[ch] for ch in changed})
    return new, versions


def existing(client: redis.Redis, cp: RedisCheckpointer, thread: str) -> list[str]:
    return [k for k in cp.store.keys(thread) if client.exists(k)]


# -- TTL --------------------------------------------------------------------------------------


def test_index_sweep_runs_off_the_put_path(make_redis: Any, client: redis.Redis,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The put that reaches the sweep's turn issues its own few commands only (counted per
    task on the client, the server untouched); the stale index entries go all the same."""
    cp_h = make_redis()
    cp = cp_h.saver
    threads_key, runs_key = f"{cp_h.prefix}:threads", f"{cp_h.prefix}:runs"
    client.zadd(threads_key, {f"gone-{i}": 1 for i in range(80)})  # hints long past, no keys
    client.zadd(runs_key, {f"run-{i}\0gone-{i}": 0 for i in range(80)})
    per_task: dict[Any, int] = {}
    original = aredis.Redis.execute_command

    async def counting(self: aredis.Redis, *args: Any, **options: Any) -> Any:
        task = asyncio.current_task()
        per_task[task] = per_task.get(task, 0) + 1
        return await original(self, *args, **options)

    monkeypatch.setattr(aredis.Redis, "execute_command", counting)

    async def puts(n: int, wait: bool = True) -> list[int]:
        config: dict[str, Any] = cfg("busy", checkpoint_ns="")
        counts = []
        for i in range(n):
            ckpt = empty_checkpoint()
            ckpt["channel_values"] = {"tick": i}
            ckpt["channel_versions"] = {"tick": i + 1}
            task = asyncio.ensure_future(cp.aput(config, ckpt, {"source": "loop", "step": i},
                                                 {"tick": i + 1}))
            config = await task
            counts.append(per_task.pop(task, 0))
        for _ in range(600 if wait else 0):  # the sweep finishes on this loop, on its own
            if client.zcard(threads_key) == 1 and client.zcard(runs_key) == 0:
                break
            await asyncio.sleep(0.05)
        return counts

    async def closed_mid_step() -> int:
        """Commands issued after `aclose()` returned, with a step under way when it was called."""
        client.zadd(threads_key, {f"gone-{i}": 1 for i in range(300)})
        counts = await puts(512, wait=False)
        assert max(counts) <= 4, sorted(counts)[-5:]
        await cp.aclose()  # cancels the step it started, which has hundreds of entries to go
        issued = sum(per_task.values())
        await asyncio.sleep(0.3)
        return sum(per_task.values()) - issued

    counts = asyncio.run(puts(600))
    assert max(counts) <= 4, sorted(counts)[-5:]
    assert client.zrange(threads_key, 0, -1) == [b"busy"] and client.zcard(runs_key) == 0
    assert asyncio.run(closed_mid_step()) == 0


def test_short_ttl_thread_is_entirely_gone(make_redis: Any, client: redis.Redis) -> None:
    cp_h = make_redis(ttl=2.0)
    cp = cp_h.saver
    graph = chat_graph().compile(checkpointer=cp)
    for i in range(3):
        graph.invoke({"messages": [human(f"m{i}")]}, cfg("brief"))
    assert len(existing(client, cp, "brief")) >= 6
    # Every key of the thread carries one deadline: it cannot expire in part.
    deadlines = {client.execute_command("PEXPIRETIME", k) for k in existing(client, cp, "brief")}
    assert len(deadlines) == 1 and deadlines.pop() > 0
    time.sleep(2.4)
    assert existing(client, cp, "brief") == []
    assert cp.get_tuple(cfg("brief")) is None and list(cp.list(cfg("brief"))) == []
    leftovers = [k for k in client.scan_iter(match=f"{cp_h.prefix}:*")
                 if b"brief" in k]
    assert leftovers == []
    # The index entry goes at the next sweep, and the id can be used again from scratch.
    cp.sweep()
    assert client.zscore(f"{cp_h.prefix}:threads", "brief") is None
    graph.invoke({"messages": [human("again")]}, cfg("brief"))
    assert graph.get_state(cfg("brief")).values["messages"][0].content == "again"
    assert client.zscore(f"{cp_h.prefix}:threads", "brief") is not None


def test_thread_written_before_ttl_keeps_every_checkpoint(make_redis: Any, client: redis.Redis) -> None:
    cp_h = make_redis(ttl=2.0)
    cp = cp_h.saver
    # `static` is written once; `tick` changes at every step, for 2.5x the TTL.
    config, versions = put(cp, "busy", {"static": "set once", "tick": 0}, ["static", "tick"])
    configs = [config]
    deadline = time.monotonic() + 5.0
    i = 0
    while time.monotonic() < deadline:
        i += 1
        config, versions = put(cp, "busy", {"static": "set once", "tick": i}, ["tick"],
                               parent=config, versions=versions)
        configs.append(config)
        time.sleep(0.1)
    assert i > 20
    for n, c in enumerate(configs):
        values = cp.get_tuple(c).checkpoint["channel_values"]  # type: ignore[union-attr]
        assert values == {"static": "set once", "tick": n}
    assert len(list(cp.list(cfg("busy")))) == len(configs)
    time.sleep(2.4)
    assert existing(client, cp, "busy") == []


def test_refresh_on_read_keeps_a_thread_that_is_only_read(make_redis: Any, client: redis.Redis) -> None:
    cp_h = make_redis(ttl=2.0, refresh_on_read=True)
    cp = cp_h.saver
    put(cp, "read-only", {"a": 1}, ["a"])
    for _ in range(25):
        assert cp.get_tuple(cfg("read-only")) is not None
        time.sleep(0.2)
    assert len(list(cp.list(cfg("read-only")))) == 1
    plain_h = make_redis(ttl=2.0)
    plain = plain_h.saver
    put(plain, "read-only", {"a": 1}, ["a"])
    for _ in range(14):
        plain.get_tuple(cfg("read-only"))
        time.sleep(0.2)
    assert plain.get_tuple(cfg("read-only")) is None  # reads alone do not refresh by default


def test_pinned_thread_stays_and_unpinned_expires(make_redis: Any, client: redis.Redis) -> None:
    cp_h = make_redis(ttl=1.0)
    cp = cp_h.saver
    cp.pin("keep")  # before its first write
    graph = chat_graph().compile(checkpointer=cp)
    graph.invoke({"messages": [human("stay")]}, cfg("keep"))
    graph.invoke({"messages": [human("brief")]}, cfg("gone"))
    assert all(client.ttl(k) == -1 for k in existing(client, cp, "keep"))
    time.sleep(1.3)
    assert graph.get_state(cfg("keep")).values["messages"][0].content == "stay"
    assert existing(client, cp, "gone") == []
    cp.sweep()
    assert client.zscore(f"{cp_h.prefix}:threads", "keep") is not None
    cp.unpin("keep")
    assert all(0 < client.pttl(k) <= 1000 for k in existing(client, cp, "keep"))
    time.sleep(1.3)
    assert existing(client, cp, "keep") == []


def test_no_ttl_persists_a_thread_written_with_one(make_redis: Any, client: redis.Redis) -> None:
    prefix = redis_prefix()
    with_ttl_h = make_redis(ttl=30, key_prefix=prefix)
    with_ttl = with_ttl_h.saver
    put(with_ttl, "t", {"a": 1}, ["a"])
    without_h = make_redis(key_prefix=prefix)
    without = without_h.saver
    put(without, "t", {"a": 2}, ["a"])  # no key may keep the old deadline
    assert all(client.ttl(k) == -1 for k in existing(client, without, "t"))


# -- key layout and bad input ----------------------------------------------------------------

HOSTILE = ["a", "a}", "{a}", "a:b", "a*", "*", "a b", "a\nb", "}{", "%41", "A", "ü", "a}:cp"]


def test_hostile_thread_ids_stay_apart_in_one_slot_each(make_redis: Any, client: redis.Redis) -> None:
    cp_h = make_redis()
    cp = cp_h.saver
    graph = chat_graph().compile(checkpointer=cp)
    for tid in HOSTILE:
        graph.invoke({"messages": [human(f"I am {tid!r}")]}, cfg(tid))
    for tid in HOSTILE:
        msgs = graph.get_state(cfg(tid)).values["messages"]
        assert msgs[0].content == f"I am {tid!r}"
        keys = existing(client, cp, tid)
        assert len({key_slot(k.encode()) for k in keys}) == 1, (tid, keys)
    slots = {tid: key_slot(cp.store.keys(tid)[0].encode()) for tid in HOSTILE}
    assert len({cp.store.keys(t)[0] for t in HOSTILE}) == len(HOSTILE)
    assert len(set(slots.values())) > 1
    # Deleting one leaves every other one whole.
    cp.delete_thread("a}")
    assert cp.get_tuple(cfg("a}")) is None
    for tid in set(HOSTILE) - {"a}"}:
        assert cp.get_tuple(cfg(tid)) is not None
    # Filters with the same characters match values, never keys.
    found = list(cp.list(None, filter={"source": "input", "step": -1}))
    assert {t.config["configurable"]["thread_id"] for t in found} == set(HOSTILE) - {"a}"}
    assert list(cp.list(None, filter={"source": "*"})) == []
    assert list(cp.list(None, filter={"source": "{a}:cp\n*"})) == []


def test_bad_arguments_are_refused_clearly(make_redis: Any) -> None:
    with pytest.raises(InvalidConfigError, match="key_prefix"):
        RedisCheckpointer(REDIS_URL, key_prefix="bad{prefix}")
    with pytest.raises(InvalidConfigError, match="ttl"):
        RedisCheckpointer(REDIS_URL, ttl=-5)
    with pytest.raises(InvalidConfigError, match="decode_responses"):
        RedisCheckpointer(aredis.Redis.from_url(REDIS_URL, decode_responses=True))
    cp_h = make_redis()
    cp = cp_h.saver
    put(cp, "ok", {"a": 1}, ["a"])
    with pytest.raises(InvalidConfigError, match="NUL"):
        put(cp, "ok", {"a": 2}, ["a"], ns="bad\0ns")
    with pytest.raises(InvalidConfigError, match="thread_id"):
        cp.get_tuple({"configurable": {}})
    assert cp.get_tuple(cfg("ok")).checkpoint["channel_values"] == {"a": 1}  # type: ignore[union-attr]


def test_newer_layout_is_refused(make_redis: Any, client: redis.Redis) -> None:
    cp_h = make_redis()
    cp = cp_h.saver
    client.set(f"{cp_h.prefix}:layout", 99)
    with pytest.raises(StorageVersionError, match="upgrade"):
        cp.setup()


# -- atomicity, concurrency, a server that goes away ------------------------------------------


def test_readers_never_see_half_a_checkpoint(make_redis: Any) -> None:
    cp_h = make_redis()
    cp = cp_h.saver
    channels = [f"ch{i}" for i in range(12)]
    stop = threading.Event()
    seen: list[int] = []
    errors: list[BaseException] = []

    def reader() -> None:
        other_h = make_redis(key_prefix=cp_h.prefix)  # another client, as another process would be
        other = other_h.saver
        try:
            while not stop.is_set():
                tup = other.get_tuple(cfg("atomic"))
                if tup is None:
                    continue
                values = tup.checkpoint["channel_values"]
                steps = {values[ch] for ch in channels}
                assert len(steps) == 1 and set(values) == set(channels), values
                seen.append(steps.pop())
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=reader)
    thread.start()
    config, versions = None, None
    for step in range(150):
        config, versions = put(cp, "atomic", dict.fromkeys(channels, step), channels,
                               parent=config, versions=versions)
    stop.set()
    thread.join(30)
    assert not errors, errors[0]
    assert len(seen) > 10 and seen == sorted(seen)


async def test_calls_cancelled_mid_flight_leave_no_reply_behind() -> None:
    """Reads and writes cancelled at every point of their round trip (sending, waiting for
    the reply, reading it): the connection they held is dropped, not handed back with a reply
    unread, so no later call on the pool reads another call's answer."""
    prefix = redis_prefix()
    try:
        async with RedisCheckpointer.from_conn_string(REDIS_URL, key_prefix=prefix) as cp:
            heads = {}
            for thread in ("a", "b"):
                ckpt = empty_checkpoint()
                ckpt["channel_values"] = {"who": thread}
                ckpt["channel_versions"] = {"who": 1}
                heads[thread] = await cp.aput(cfg(thread, checkpoint_ns=""), ckpt,
                                              {"source": "loop", "step": 0}, {"who": 1})
            for i in range(300):
                call = (cp.aget_tuple(cfg("a")) if i % 2 else
                        cp.aput_writes(heads["a"], [("who", i)], f"task-{i}"))
                task = asyncio.ensure_future(call)
                for _ in range(i % 7):  # cancelled after 0 to 6 turns of the loop
                    await asyncio.sleep(0)
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                tup = await cp.aget_tuple(cfg("b"))
                assert tup is not None and tup.checkpoint["channel_values"] == {"who": "b"}, i
                assert tup.config["configurable"]["thread_id"] == "b"
    finally:
        drop_redis_prefixes(prefix)


async def test_server_that_goes_away_then_comes_back() -> None:
    with redis_server("--appendonly", "yes", "--appendfsync", "always") as server:
        async with RedisCheckpointer.from_conn_string(server.url, key_prefix="t") as cp:
            graph = chat_graph().compile(checkpointer=cp)
            await graph.ainvoke({"messages": [human("before")]}, cfg("t1"))
            await asyncio.to_thread(server.stop)
            with pytest.raises(StoreUnavailableError, match="Redis unreachable"):
                await graph.ainvoke({"messages": [human("while down")]}, cfg("t1"))
            await asyncio.to_thread(server.start)
            await graph.ainvoke({"messages": [human("after")]}, cfg("t1"))
            state = await graph.aget_state(cfg("t1"))
            contents = [m.content for m in state.values["messages"]]
            assert contents[0] == "before" and contents[-2] == "after"
            assert "while down" not in contents
            assert state.values["turns"] == 2


def test_a_host_that_never_answers_a_connect_fails_in_bounded_time() -> None:
    """A loopback listener whose accept queue is full drops further SYNs, as a host behind a
    firewall that drops packets does: the connect times out (5 s by default, here 0.3 s) and,
    after the retries, the call fails clearly instead of hanging for minutes."""
    import socket

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(0)
    fillers = []
    for _ in range(4):  # nobody accepts: these fill the queue, later SYNs are dropped
        f = socket.socket()
        f.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            f.connect(silent.getsockname())
        fillers.append(f)
    url = f"redis://127.0.0.1:{silent.getsockname()[1]}/0"
    try:
        with RedisCheckpointer(url, setup=False) as default:
            assert default._store._options["socket_connect_timeout"] == 5
        cp = RedisCheckpointer(url, setup=False, cluster=False, socket_connect_timeout=0.3)
        started = time.monotonic()
        with pytest.raises(StoreUnavailableError, match="Redis unreachable"):
            cp.get_tuple(cfg("t"))
        assert time.monotonic() - started < 10
        cp.close()
    finally:
        for f in fillers:
            f.close()
        silent.close()


# -- Redis Cluster ----------------------------------------------------------------------------


async def test_cluster_graphs_ttl_and_hostile_ids() -> None:
    with redis_cluster(3) as cluster:
        async with RedisCheckpointer.from_conn_string(cluster.url, key_prefix="c", ttl=60) as cp:
            assert cp.store._cluster is True
            graph = chat_graph().compile(checkpointer=cp)
            for tid in HOSTILE:
                for turn in range(3):
                    await graph.ainvoke({"messages": [human(f"{tid} {turn}")]}, cfg(tid))
            for tid in HOSTILE:
                state = await graph.aget_state(cfg(tid))
                assert state.values["turns"] == 3 and len(state.values["messages"]) == 6
                history = [s async for s in graph.aget_state_history(cfg(tid))]
                assert len(history) == 9  # three checkpoints a turn
            assert len(await cp.store.thread_ids()) == len(HOSTILE)
            every = [t async for t in cp.alist(None)]
            assert len(every) == 9 * len(HOSTILE)
            await cp.acopy_thread("a", "copy of a")
            await cp.adelete_thread("a")
            state = await graph.aget_state(cfg("copy of a"))
            assert state.values["turns"] == 3
            await cp.aprune(["copy of a"], strategy="keep_latest")
            assert len([t async for t in cp.alist(cfg("copy of a"))]) == 1
            # Sync calls too (they run on the bridge's loop with a client of their own).
            assert await asyncio.to_thread(lambda: graph.get_state(cfg("*")).values["turns"]) == 3


def test_caller_owned_client_serves_sync_and_async_calls(loop_thread: Any) -> None:
    prefix = redis_prefix()
    client = aredis.Redis.from_url(REDIS_URL)
    cp = RedisCheckpointer(client, key_prefix=prefix)
    try:
        loop_thread.run(cp.asetup())
        graph = chat_graph().compile(checkpointer=cp)
        graph.invoke({"messages": [human("sync")]}, cfg("owned"))  # on the bridge's loop
        loop_thread.run(graph.ainvoke({"messages": [human("async")]}, cfg("owned")))
        graph.invoke({"messages": [human("sync again")]}, cfg("owned"))
        state = loop_thread.run(graph.aget_state(cfg("owned")))
        assert [m.content for m in state.values["messages"]][::2] == ["sync", "async", "sync again"]
        cp.close()
        assert loop_thread.run(client.ping())  # the caller's client stays open
    finally:
        loop_thread.run(client.aclose())
        drop_redis_prefixes(prefix)


def test_listing_across_many_threads_is_one_merged_order(make_redis: Any) -> None:
    """`list(None)` merges the threads' own orders, reading each thread a page at a time:
    the same rows, in the same order, as sorting them all; `before` and `limit` honoured."""
    import random


    cp_h = make_redis()
    cp = cp_h.saver
    rng = random.Random(7)
    expected: list[tuple[str, str, str]] = []
    for t in range(40):
        thread = f"t{t:02}"
        for i in range(rng.choice([1, 3, 9, 70])):  # some threads longer than a page
            ns = "" if i % 4 else "sub:1"
            new, _ = put(cp, thread, {"x": i}, ["x"], ns=ns)
            c = new["configurable"]
            expected.append((c["checkpoint_id"], c["checkpoint_ns"], thread))
    expected.sort(reverse=True)
    got = [(t.config["configurable"]["checkpoint_id"], t.config["configurable"]["checkpoint_ns"],
            t.config["configurable"]["thread_id"]) for t in cp.list(None)]
    assert got == expected
    pivot = expected[len(expected) // 3]
    before = {"configurable": {"thread_id": pivot[2], "checkpoint_id": pivot[0]}}
    got = [t.config["configurable"]["checkpoint_id"] for t in cp.list(None, before=before, limit=50)]
    assert got == [cid for cid, _, _ in expected if cid < pivot[0]][:50]


# -- write_batch: one script call per batch ---------------------------------------------------


def _track(cp: RedisCheckpointer, monkeypatch: pytest.MonkeyPatch) -> tuple[list[Any], list[str]]:
    """Record the items the saver's single calls store, and name every round trip."""
    store = cp.store
    items: list[Any] = []
    trips: list[str] = []
    write_checkpoint, write_writes = store.write_checkpoint, store.write_writes
    call, command = store._call, store._command

    async def rec_checkpoint(row: Any, blobs: Any, guard: Any = None) -> set[str]:
        items.append((row, list(blobs)))
        return await write_checkpoint(row, blobs, guard)

    async def rec_writes(rows: Any, guard: Any = None) -> None:
        items.append(list(rows))
        await write_writes(rows, guard)

    async def rec_call(name: str, keys: Any, args: Any) -> Any:
        trips.append(name)
        return await call(name, keys, args)

    async def rec_command(*args: Any) -> Any:
        trips.append(f"{args[0]} {args[1].rsplit(':', 1)[-1]}")
        return await command(*args)

    monkeypatch.setattr(store, "write_checkpoint", rec_checkpoint)
    monkeypatch.setattr(store, "write_writes", rec_writes)
    monkeypatch.setattr(store, "_call", rec_call)
    monkeypatch.setattr(store, "_command", rec_command)
    return items, trips


def _thread_contents(client: Any, cp: RedisCheckpointer, thread: str) -> dict[str, Any]:
    keys = dict(zip(("ix", "ord", "cp", "bl", "wr", "wx", "meta", "mig"), cp.store.keys(thread),
                    strict=True))
    return {
        **{k: client.hgetall(keys[k]) for k in ("cp", "bl", "wr", "mig")},
        **{k: client.zrange(keys[k], 0, -1) for k in ("ix", "ord", "wx")},
        "gen": client.hget(keys["meta"], "gen"),
    }


def _as_thread(item: Any, thread: str) -> Any:
    from dataclasses import replace

    if isinstance(item, tuple):
        return (replace(item[0], thread_id=thread), item[1])
    return [replace(w, thread_id=thread) for w in item]


@pytest.mark.parametrize("kind", params(["redis", "redis-cluster"]))
def test_write_batch_stores_what_single_calls_store_in_one_call(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cp_h = open_saver(kind, tmp_path)
    cp: RedisCheckpointer = cp_h.saver
    reader = cp_h.reopen()
    client = cp_h.redis_client()
    try:
        items, trips = _track(cp, monkeypatch)
        # The sequence, by single calls into "single": list channels growing by appends (so
        # append-deltas), values with NUL and arbitrary bytes, two namespaces, and writes that
        # are kept (idx >= 0, HSETNX) and replaced (idx < 0).
        configs: dict[str, Any] = {}
        versions: dict[str, dict[str, Any]] = {"": {}, "sub:1": {}}
        log: dict[str, list[Any]] = {"": [], "sub:1": []}
        for step in range(8):
            ns = "sub:1" if step % 3 == 2 else ""
            log[ns] = [*log[ns], f"item\0{step}", bytes([0, 255, step])]
            vs = versions[ns]
            changed = ["log", "n"] if step % 2 == 0 else ["log"]
            for ch in changed:
                vs[ch] = cp.get_next_version(vs.get(ch))
            ckpt = empty_checkpoint()
            ckpt["channel_values"] = {"log": list(log[ns]), "n": step}
            ckpt["channel_versions"] = dict(vs)
            parent = configs.get(ns) or cfg("single", checkpoint_ns=ns)
            config = cp.put(parent, ckpt, {"source": "loop", "step": step, "run_id": "run-1"},
                            {ch: vs[ch] for ch in changed})
            configs[ns] = config
            cp.put_writes(config, [("a", step), ("b", b"\0raw\xff")], "task-1")
            cp.put_writes(config, [("a", "not kept")], "task-1")  # idx 0 is there: kept
            cp.put_writes(config, [("__error__", f"first {step}")], "task-2")
            cp.put_writes(config, [("__error__", f"second {step}")], "task-2")  # idx -1: replaced
        n_ckpts = sum(isinstance(i, tuple) for i in items)
        assert n_ckpts == 8 and len(items) == 8 * 5
        deltas = [b for i in items if isinstance(i, tuple) for b in i[1] if b.base_version]
        assert len(deltas) >= 4
        single_trips = [t for t in trips if not t.startswith("ZADD")]
        assert len(single_trips) == len(items)  # one script call per item

        # The same items for "batched", in two batches: the second's deltas have their bases
        # stored already, the first's in the batch itself.
        batched = [_as_thread(i, "batched") for i in items]
        half = 4 * 5 + 1  # cut after a checkpoint, before its writes
        trips.clear()
        assert cp.run_sync(cp.store.write_batch(batched[:half])) == [set()] * 5
        # One script call, plus the index entries of a thread and a run seen the first time.
        assert sorted(trips) == ["BATCH", "ZADD runs", "ZADD threads"]
        trips.clear()
        assert cp.run_sync(cp.store.write_batch(batched[half:])) == [set()] * 3
        assert trips == ["BATCH"]  # 3 checkpoints + 19 write lists: one round trip

        # Byte for byte the same keys (gen too: one write per item, as the single calls)...
        single, batch = (_thread_contents(client, cp, t) for t in ("single", "batched"))
        assert single == batch and int(batch["gen"]) == len(items)
        assert len(batch["cp"]) == 8 and len(batch["wr"]) == 8 * 3
        assert client.zscore(f"{cp_h.prefix}:threads", "batched") is not None
        assert client.zscore(f"{cp_h.prefix}:runs", "run-1\0batched") is not None
        # ...and read back the same, by a process with nothing cached.

        def view(thread: str, ns: str) -> list[Any]:
            return [(t.checkpoint, t.metadata, t.parent_config and
                     t.parent_config["configurable"]["checkpoint_id"], t.pending_writes)
                    for t in reader.list(cfg(thread, checkpoint_ns=ns))]

        for ns in ("", "sub:1"):
            assert view("batched", ns) == view("single", ns) and view("batched", ns)
            one = reader.get_tuple(cfg("batched", checkpoint_ns=ns))
            assert one is not None
            assert one.checkpoint["channel_values"]["log"] == log[ns]
            assert sorted(one.pending_writes or ()) == sorted([
                ("task-1", "a", 7 if ns == "" else 5), ("task-1", "b", b"\0raw\xff"),
                ("task-2", "__error__", f"second {7 if ns == '' else 5}"),
            ])
    finally:
        cp.close()
        reader.close()
        client.close()
        cp_h.cleanup()


def _blob(store: Any, value: Any, ch: str, ver: str, base: str | None = None,
          whole: Any = None) -> Any:
    from langgraph_ckpt_ext.core import codec
    from langgraph_ckpt_ext.core.rows import BlobRow
    from langgraph_ckpt_ext.core.saver import strict_serde

    serde = strict_serde()
    type_, data = codec.dumps(serde, value, ch)
    if base is None:
        return BlobRow(ch, ver, type_, data)
    return BlobRow(ch, ver, type_, data, base, full=lambda: codec.dumps(serde, whole, ch))


def _row(thread: str, cid: str, parent: str | None, versions: dict[str, str]) -> Any:
    from langgraph_ckpt_ext.core.rows import CheckpointRow

    return CheckpointRow(thread, "", cid, parent, None, ("bytes", b"\0head"), ("bytes", b"md\0"),
                         versions)


@pytest.mark.parametrize("kind", params(["redis", "redis-cluster"]))
def test_write_batch_falls_back_only_where_a_base_is_gone(kind: str, tmp_path: Path) -> None:
    from langgraph_ckpt_ext.core.rows import WriteRow

    cp_h = open_saver(kind, tmp_path)
    cp: RedisCheckpointer = cp_h.saver
    client = cp_h.redis_client()
    store = cp.store
    try:
        items: list[Any] = [
            (_row("t", "c1", None, {"log": "v1"}), [_blob(store, [1], "log", "v1")]),
            [WriteRow("t", "", "c1", "task", 0, "a", "bytes", b"w\0")],
            # Base written by the item before: stays a delta.
            (_row("t", "c2", "c1", {"log": "v2"}),
             [_blob(store, [2], "log", "v2", "v1", [1, 2])]),
            # Base never written: stored whole, the batch's other items as they are.
            (_row("t", "c3", "c2", {"log": "v2", "other": "o2"}),
             [_blob(store, ["b"], "other", "o2", "o1", ["a", "b"])]),
            [],
        ]
        assert cp.run_sync(store.write_batch(items)) == [set(), set(), {"other"}]
        got = cp.run_sync(store.read_blobs("t", "", [("log", "v2"), ("other", "o2")]))
        assert got[("log", "v2")].base_version == "v1" and ("log", "v1") in got
        assert got[("other", "o2")].base_version is None
        assert cp.serde.loads_typed((got[("other", "o2")].type, got[("other", "o2")].data)) == [
            "a", "b"]
        assert cp.run_sync(store.read_checkpoint("t", "", None)) == items[3][0]
        # The refused first call wrote nothing: gen counts the four items once.
        assert client.hget(store.keys("t")[6], "gen") == b"4"
        assert [r.checkpoint_id for r in cp.run_sync(store.read_ancestors("t", "", "c3", 9))] == [
            "c3", "c2", "c1"]
    finally:
        cp.close()
        client.close()
        cp_h.cleanup()


def test_write_batch_refuses_mixed_threads(make_redis: Any, client: redis.Redis) -> None:
    from langgraph_ckpt_ext.core.rows import WriteRow


    cp_h = make_redis()
    cp = cp_h.saver
    store = cp.store
    one = (_row("x", "c1", None, {"log": "v1"}), [_blob(store, [1], "log", "v1")])
    other = (_row("y", "c1", None, {"log": "v1"}), [_blob(store, [1], "log", "v1")])
    w = WriteRow("y", "", "c1", "task", 0, "a", "bytes", b"")
    mixed = [WriteRow("x", "", "c1", "task", 1, "a", "bytes", b""), w]
    for items in ([one, other], [one, [w]], [[w], one], [mixed], [one, [], mixed]):
        with pytest.raises(ValueError, match="one thread"):
            cp.run_sync(store.write_batch(items))
    assert existing(client, cp, "x") == [] and existing(client, cp, "y") == []
    assert cp.run_sync(store.write_batch([])) == []


def test_write_batch_sets_one_ttl_on_every_key(make_redis: Any, client: redis.Redis) -> None:
    from langgraph_ckpt_ext.core.rows import WriteRow


    cp_h = make_redis(ttl=30)
    cp = cp_h.saver
    store = cp.store
    items: list[Any] = [
        (_row("t", "c1", None, {"log": "v1"}), [_blob(store, [1], "log", "v1")]),
        [WriteRow("t", "", "c1", "task", 0, "a", "bytes", b"")],
        (_row("t", "c2", "c1", {"log": "v2"}), [_blob(store, [2], "log", "v2", "v1", [1, 2])]),
    ]
    cp.run_sync(store.write_batch(items))
    keys = existing(client, cp, "t")
    assert len(keys) == 7  # all but the migration log, which nothing wrote
    deadlines = {client.execute_command("PEXPIRETIME", k) for k in keys}
    assert len(deadlines) == 1
    seconds, micros = client.time()  # the server's clock: Redis expires keys by its own
    assert 0 < deadlines.pop() - (seconds * 1000 + micros // 1000) <= 30_000
