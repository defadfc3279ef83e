"""PostgreSQL high availability: a real primary and a streaming standby of this test's own
(`tests.support.pg_cluster`), a multi-host DSN that follows the primary through a promotion,
and read replicas (`read_replicas=`)."""

from __future__ import annotations

import asyncio
import operator
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, TypedDict

import asyncpg
import pytest
from langgraph.graph import END, START, StateGraph

from langgraph_ckpt_ext import PostgresCheckpointer
from langgraph_ckpt_ext.backends.postgres import replica_dsn
from langgraph_ckpt_ext.core.errors import InvalidConfigError, StoreUnavailableError
from langgraph_ckpt_ext.core.urls import parse_url
from tests.support.pg_cluster import HOST, USER, PgCluster, PgNode, pg_cluster
from tests.support.tcp_link import HeldLink

STEPS = 8


class Count(TypedDict):
    n: Annotated[int, operator.add]
    log: Annotated[list[int], operator.add]


def counting_graph(on_step: Callable[[int], Awaitable[None]] | None = None) -> StateGraph:
    """`STEPS` steps, a checkpoint after each; `on_step(n)` awaited in the step that makes
    `n` (the hook a test stops the primary in)."""

    async def step(state: Count) -> dict[str, Any]:
        n = state["n"] + 1
        if on_step is not None:
            await on_step(n)
        return {"n": 1, "log": [n]}

    b = StateGraph(Count)
    b.add_node("step", step)
    b.add_edge(START, "step")
    b.add_conditional_edges("step", lambda s: END if s["n"] >= STEPS else "step")
    return b


async def first_of(wait: Awaitable[Any], run: asyncio.Task[Any]) -> None:
    """Until `wait` is done, or `run` ended (its error raised)."""
    waiting = asyncio.ensure_future(wait)
    await asyncio.wait([waiting, run], return_when=asyncio.FIRST_COMPLETED)
    if run.done():
        waiting.cancel()
        run.result()
        raise AssertionError("the run ended before the point awaited")


async def until(done: Callable[[], Awaitable[bool]], timeout: float = 20) -> None:
    """Until `await done()` is true (asked every 10 ms), or fail after `timeout` seconds."""
    async def wait() -> None:
        while not await done():
            await asyncio.sleep(0.01)
    await asyncio.wait_for(wait(), timeout)


def failover_url(cluster: PgCluster, **query: str) -> str:
    """The multi-host DSN of the primary, then the standby: the one that accepts writes."""
    hosts = ",".join(f"{HOST}:{node.port}" for node in cluster.nodes())
    extra = "".join(f"&{k}={v}" for k, v in query.items())
    return f"postgresql://{USER}@{hosts}/postgres?target_session_attrs=read-write{extra}"


async def chain_of(cp: PostgresCheckpointer, thread: str) -> list[str]:
    """The thread's checkpoint ids, oldest first, checked to be one chain (each the parent of
    the next), with no id twice."""
    config = {"configurable": {"thread_id": thread}}
    found = [t async for t in cp.alist(config)][::-1]
    ids = [t.checkpoint["id"] for t in found]
    assert len(ids) == len(set(ids))
    parents = [t.parent_config["configurable"]["checkpoint_id"] if t.parent_config else None
               for t in found]
    assert parents == [None, *ids[:-1]]
    return ids


async def rows_on(dsn: str, thread: str) -> list[str]:
    """Checkpoint ids of `thread` as stored on one server, read directly."""
    conn = await asyncpg.connect(dsn)
    try:
        return [r[0] for r in await conn.fetch(
            "SELECT checkpoint_id FROM lgx_checkpoints WHERE thread_id = $1 "
            "ORDER BY checkpoint_id", thread)]
    finally:
        await conn.close()


async def test_run_resumes_on_promoted_standby_without_losing_a_checkpoint() -> None:
    """Synchronous replication (`remote_apply`, fsync on): the primary is killed mid-run,
    history read from the standby (reads go to the replica), the standby promoted, and the run
    goes on by itself on the new primary; every acknowledged checkpoint is there once."""
    with pg_cluster(fsync=True) as cluster:
        primary = cluster.start_primary(synchronous_commit="remote_apply",
                                        synchronous_standby_names="*")
        # Promoted, it has no standby of its own: it must not wait for one.
        standby = cluster.start_standby(synchronous_standby_names="")
        await asyncio.to_thread(cluster.wait_streaming)
        reached, go = asyncio.Event(), asyncio.Event()

        async def on_step(n: int) -> None:
            if n == STEPS // 2:
                reached.set()
                await go.wait()

        url = failover_url(cluster, read_replicas=f"{HOST}:{standby.port}")
        async with PostgresCheckpointer.from_conn_string(url) as cp:
            graph = counting_graph(on_step).compile(checkpointer=cp)
            config = {"configurable": {"thread_id": "t-ha"}}
            run = asyncio.create_task(
                graph.ainvoke({"n": 0, "log": []}, config, durability="sync"))
            await first_of(reached.wait(), run)
            acknowledged = await rows_on(primary.dsn, "t-ha")
            await asyncio.to_thread(primary.stop, "immediate")
            # The primary is gone: history comes from the standby, all of it.
            assert sorted(await chain_of(cp, "t-ha")) == acknowledged
            await asyncio.to_thread(standby.promote)
            go.set()
            state = await asyncio.wait_for(run, 30)
            assert state == {"n": STEPS, "log": list(range(1, STEPS + 1))}
            ids = await chain_of(cp, "t-ha")
            assert ids[:len(acknowledged)] == acknowledged
            assert len(ids) == STEPS + 2  # the input, the first step's start, each step
            assert await rows_on(standby.dsn, "t-ha") == ids


async def test_writes_in_flight_land_once_or_fail_unavailable() -> None:
    """Many threads written at once under `remote_apply` when the primary is killed: each
    put either returned (then its checkpoint is on the promoted standby, once) or raised
    `StoreUnavailableError`; the threads go on after the promotion."""
    with pg_cluster(fsync=True) as cluster:
        primary = cluster.start_primary(synchronous_commit="remote_apply",
                                        synchronous_standby_names="*")
        standby = cluster.start_standby(synchronous_standby_names="")
        await asyncio.to_thread(cluster.wait_streaming)
        async with PostgresCheckpointer.from_conn_string(failover_url(cluster)) as cp:
            graph = counting_graph().compile(checkpointer=cp)
            threads = [f"t-{i}" for i in range(8)]
            acked: dict[str, set[str]] = {t: set() for t in threads}
            failed: list[BaseException] = []
            killed = asyncio.Event()

            async def writer(thread: str) -> None:
                config = {"configurable": {"thread_id": thread}}
                after = 0  # runs done since the promotion
                while after < 2:
                    was_killed = killed.is_set()
                    try:
                        await graph.ainvoke({"n": 0, "log": []}, config)
                        head = await cp.aget_tuple(config)
                    except StoreUnavailableError as exc:
                        failed.append(exc)
                        await killed.wait()
                        continue
                    assert head is not None
                    acked[thread].add(head.checkpoint["id"])
                    after += was_killed

            writers = [asyncio.create_task(writer(t)) for t in threads]
            async def each_acked() -> bool:
                return all(acked.values())

            await until(each_acked)
            await asyncio.to_thread(primary.stop, "immediate")
            await asyncio.to_thread(standby.promote)
            killed.set()
            await asyncio.wait_for(asyncio.gather(*writers), 45)
            for t in threads:
                stored = await rows_on(standby.dsn, t)
                assert acked[t] <= set(stored), t
                await chain_of(cp, t)
            print(f"\n{len(failed)} runs failed with StoreUnavailableError during the switch")


async def sync_waiters(node: PgNode) -> int:
    """Backends of `node` waiting for a synchronous standby to confirm their commit."""
    return int(await asyncio.to_thread(
        node.psql, "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'"))


async def test_async_replication_loses_what_the_held_standby_never_got() -> None:
    """Async replication (`synchronous_commit=on`, no synchronous standby), the standby's WAL
    stream held: puts are acknowledged all the same; the primary killed and the standby
    promoted, exactly those are lost, and the history is the chain the standby had."""
    with pg_cluster(fsync=True) as cluster:
        primary = cluster.start_primary()
        with HeldLink(primary.port) as link:
            standby = cluster.start_standby(upstream_port=link.port)
            await asyncio.to_thread(cluster.wait_streaming)
            async with PostgresCheckpointer.from_conn_string(failover_url(cluster)) as cp:
                graph = counting_graph().compile(checkpointer=cp)
                config = {"configurable": {"thread_id": "t-a"}}
                await graph.ainvoke({"n": 0, "log": []}, config)
                kept = await chain_of(cp, "t-a")
                await asyncio.to_thread(cluster.wait_replayed, standby)
                link.hold()
                for _ in range(3):
                    await graph.aupdate_state(config, {"n": 1})
                other = {"configurable": {"thread_id": "t-b"}}
                await graph.ainvoke({"n": 0, "log": []}, other)
                held = len(await chain_of(cp, "t-a")) - len(kept) + len(
                    await chain_of(cp, "t-b"))
                assert held == 3 + STEPS + 2  # acknowledged by the primary
                await asyncio.to_thread(primary.stop, "immediate")
                link.cut()
                await asyncio.to_thread(standby.promote)
                assert await rows_on(standby.dsn, "t-a") == kept
                assert await rows_on(standby.dsn, "t-b") == []
                assert await chain_of(cp, "t-a") == kept  # one chain, as the standby had it
                # The thread goes on from what survived, on the new primary.
                await graph.aupdate_state(config, {"n": 1})
                assert (await chain_of(cp, "t-a"))[:-1] == kept
                assert (await graph.aget_state(config)).values["n"] == STEPS + 1
                print(f"\n{held} acknowledged checkpoints lost (async, link held)")


@pytest.mark.parametrize("promote_before_retries_end", [True, False])
async def test_remote_apply_put_waits_for_the_held_standby_and_nothing_is_lost(
        promote_before_retries_end: bool) -> None:
    """`remote_apply` with `synchronous_standby_names` naming the standby, its WAL stream
    held: a put does not return (its commit waits for the standby: `SyncRep`); the primary
    killed and the standby promoted, that put either raised `StoreUnavailableError` (and is
    not stored) or was retried onto the new primary (stored once); every checkpoint
    acknowledged before is there. Promoted only after the put's retries ran out, the put
    must have raised."""
    with pg_cluster(fsync=True) as cluster:
        primary = cluster.start_primary(synchronous_commit="remote_apply",
                                        synchronous_standby_names="standby")
        with HeldLink(primary.port) as link:
            standby = cluster.start_standby(upstream_port=link.port,
                                            synchronous_standby_names="")
            await asyncio.to_thread(cluster.wait_streaming)

            async def synchronous() -> bool:  # 'async' for a moment after it starts streaming
                return await asyncio.to_thread(
                    primary.psql, "SELECT application_name || ' ' || sync_state "
                    "FROM pg_stat_replication") == "standby sync"

            await until(synchronous)
            async with PostgresCheckpointer.from_conn_string(failover_url(cluster)) as cp:
                graph = counting_graph().compile(checkpointer=cp)
                config = {"configurable": {"thread_id": "t-s"}}
                await graph.ainvoke({"n": 0, "log": []}, config)
                acknowledged = await chain_of(cp, "t-s")
                link.hold()
                put = asyncio.create_task(graph.aupdate_state(config, {"n": 1}))

                async def waiting() -> bool:
                    return await sync_waiters(primary) > 0

                await first_of(until(waiting), put)  # committed there, waiting for the standby
                assert not put.done()
                await asyncio.to_thread(primary.stop, "immediate")
                link.cut()
                if promote_before_retries_end:
                    await asyncio.to_thread(standby.promote)
                try:
                    landed = await asyncio.wait_for(put, 30)
                except StoreUnavailableError:
                    landed = None
                if not promote_before_retries_end:
                    assert landed is None  # no server accepted writes
                    await asyncio.to_thread(standby.promote)
                stored = await rows_on(standby.dsn, "t-s")
                assert stored[:len(acknowledged)] == acknowledged  # none lost
                if landed is None:
                    assert stored == acknowledged
                else:
                    assert stored == [*acknowledged, landed["configurable"]["checkpoint_id"]]
                assert await chain_of(cp, "t-s") == stored
                await graph.aupdate_state(config, {"n": 1})  # and on, on the new primary
                assert len(await chain_of(cp, "t-s")) == len(stored) + 1
                how = "StoreUnavailableError" if landed is None else "retried onto the new primary"
                print(f"\nthe put held by the standby: {how}")


async def test_read_replica_routing() -> None:
    """History reads go to the replica (they miss what it has not replayed), `get_tuple`
    sees this process's last write (from the primary while the replica lags), and a replica
    that is down leaves every read to the primary. (fsync off: routing only.)"""
    with pg_cluster(fsync=False) as cluster:
        primary = cluster.start_primary()
        standby = cluster.start_standby()
        await asyncio.to_thread(cluster.wait_streaming)
        async with PostgresCheckpointer.from_conn_string(
                primary.dsn, read_replicas=[standby.dsn], replica_wait=0.2) as cp:
            graph = counting_graph().compile(checkpointer=cp)
            config = {"configurable": {"thread_id": "t-r"}}
            await graph.ainvoke({"n": 0, "log": []}, config)
            before = await chain_of(cp, "t-r")
            await asyncio.to_thread(standby.psql, "SELECT pg_wal_replay_pause()")
            await graph.aupdate_state(config, {"n": 1})
            latest = await cp.aget_tuple(config)  # read your writes: from the primary
            assert latest is not None and latest.checkpoint["id"] not in before
            assert (await graph.aget_state(config)).values["n"] == STEPS + 1
            assert await chain_of(cp, "t-r") == before  # the replica, paused behind
            assert len([s async for s in graph.aget_state_history(config)]) == len(before)
            await asyncio.to_thread(standby.psql, "SELECT pg_wal_replay_resume()")
            async def replayed() -> bool:
                return len(await chain_of(cp, "t-r")) > len(before)

            await until(replayed)  # the replica replays the update
            assert await chain_of(cp, "t-r") == [*before, latest.checkpoint["id"]]
            # Caught up: the primary may go, reads of history and of the latest checkpoint
            # are the replica's.
            await asyncio.to_thread(primary.stop, "immediate")
            again = await cp.aget_tuple(config)
            assert again is not None and again.checkpoint["id"] == latest.checkpoint["id"]
            assert len(await chain_of(cp, "t-r")) == len(before) + 1
            await asyncio.to_thread(primary.start)
            await asyncio.to_thread(standby.stop, "immediate")
            # The replica down: every read on the primary.
            await graph.aupdate_state(config, {"n": 1})
            assert len(await chain_of(cp, "t-r")) == len(before) + 2
            assert (await graph.aget_state(config)).values["n"] == STEPS + 2


async def test_put_retried_after_commit_is_stored_once() -> None:
    """A put whose commit reply was lost is sent again, as `_run` retries it: the same
    checkpoint written twice is one row, no error, the history still one chain."""
    with pg_cluster(fsync=False) as cluster:
        primary = cluster.start_primary()
        async with PostgresCheckpointer.from_conn_string(primary.dsn) as cp:
            graph = counting_graph().compile(checkpointer=cp)
            config = {"configurable": {"thread_id": "t-once"}}
            await graph.ainvoke({"n": 0, "log": []}, config)
            head = await cp.aget_tuple(config)
            assert head is not None and head.parent_config is not None
            for _ in range(2):
                await cp.aput(head.parent_config, head.checkpoint, head.metadata,
                              head.checkpoint["channel_versions"])
            ids = await chain_of(cp, "t-once")
            assert ids == await rows_on(primary.dsn, "t-once")
            assert ids[-1] == head.checkpoint["id"] and len(ids) == STEPS + 2


def test_multi_host_url_and_replicas_option() -> None:
    parsed = parse_url("postgresql://app@h1:5432,h2:5433/db?target_session_attrs=read-write"
                       "&read_replicas=h2:5433,h3:5434")
    assert parsed.options == {"read_replicas": ["h2:5433", "h3:5434"]}
    assert parsed.target == "postgresql://app@h1:5432,h2:5433/db?target_session_attrs=read-write"
    with pytest.raises(InvalidConfigError, match="Port could not be cast"):
        parse_url("postgresql://h1:5432,h2:x/db")


def test_replica_dsn() -> None:
    assert replica_dsn("postgresql://app:pw@h1:5432,h2:5433/db?target_session_attrs="
                       "read-write&sslmode=require", "h3:5434") == (
        "postgresql://app:pw@h3:5434/db?sslmode=require")
    assert replica_dsn("postgresql://h1/db", "postgresql://x@r/db") == "postgresql://x@r/db"
