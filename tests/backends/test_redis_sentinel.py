"""Redis Sentinel: a graph runs turns through `RedisCheckpointer` on a master, one replica and
three sentinels (throwaway servers on loopback ports, `tests.support.redis_sentinel`); the
master is SIGKILLed in the middle of a turn, and the run goes on on the promoted replica.

What survives: with `wait_replicas=1` every checkpoint whose put returned (a replica had
acknowledged it before the kill); without, the test counts what was lost and prints it. A
paused replica (SIGSTOP) shows the difference deterministically: with `wait_replicas` a put is
refused (`ReplicaAckError`) instead of being acknowledged with no replica holding it."""

from __future__ import annotations

import asyncio
import itertools
import operator
import time
from collections.abc import Callable, Iterator
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.messages import AIMessage, AnyMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from redis.asyncio.sentinel import Sentinel

from langgraph_ckpt_ext import RedisCheckpointer, ReplicaAckError, StoreUnavailableError
from langgraph_ckpt_ext.core.errors import InvalidConfigError
from langgraph_ckpt_ext.core.urls import parse_sentinel, parse_url
from tests.support.graphs import human
from tests.support.redis_sentinel import SERVICE, SentinelSetup, redis_sentinel
from tests.support.savers import redis_cluster_url, redis_prefix

pytestmark = pytest.mark.redis

TURNS = 8
KILL_AT = 4  # the turn during which the master is killed
DEADLINE = 30.0  # seconds a turn may take to get through a failover


class Chat(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    turns: Annotated[int, operator.add]


def chat(during: Callable[[int], None]) -> Any:
    """Two steps a turn (`think`, then `answer`): `during(turn)` runs in `think`, between the
    turn's first checkpoints and its last."""

    def think(state: Chat) -> dict[str, Any]:
        during(state.get("turns", 0) + 1)
        return {}

    def answer(state: Chat) -> dict[str, Any]:
        return {"messages": [AIMessage(content=f"echo: {state['messages'][-1].content}")],
                "turns": 1}

    b = StateGraph(Chat)
    b.add_node("think", think)
    b.add_node("answer", answer)
    b.add_edge(START, "think")
    b.add_edge("think", "answer")
    b.add_edge("answer", END)
    return b


def finished(values: dict[str, Any], text: str) -> bool:
    msgs = values.get("messages", [])
    return len(msgs) >= 2 and msgs[-2].content == text and msgs[-1].content == f"echo: {text}"


async def turn(graph: Any, cfg: dict[str, Any], text: str) -> int:
    """One turn as an app would run it: a turn cut short by an outage is resumed, or sent
    again if its input was lost; retried until `DEADLINE`. Returns the failed attempts."""
    deadline = time.monotonic() + DEADLINE
    failed = 0
    while True:
        try:
            snap = await graph.aget_state(cfg)
            if snap.next:
                await graph.ainvoke(None, cfg)
            elif not finished(snap.values, text):
                await graph.ainvoke({"messages": [human(text)]}, cfg)
            if finished((await graph.aget_state(cfg)).values, text):
                return failed
        except StoreUnavailableError:
            failed += 1
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)  # an app's back-off before it retries


@pytest.fixture
def sentinels(request: pytest.FixtureRequest) -> Iterator[SentinelSetup]:
    """A master, its replicas (1, or the test's parameter) and 3 sentinels."""
    with redis_sentinel(replicas=getattr(request, "param", 1)) as setup:
        yield setup


# With `wait_replicas=1`, writes go on after a failover only while the new master has a
# replica: the master's replica promoted, another one must be left.
two_replicas = pytest.mark.parametrize("sentinels", [2], indirect=True)


async def ids(cp: RedisCheckpointer, cfg: dict[str, Any]) -> set[str]:
    return {t.config["configurable"]["checkpoint_id"] async for t in cp.alist(cfg)}


CFG = {"configurable": {"thread_id": "t-1"}}


async def run_through_failover(setup: SentinelSetup, cp: RedisCheckpointer
                               ) -> tuple[set[str], set[str], int, dict[str, Any]]:
    """`TURNS` turns, the master SIGKILLed during turn `KILL_AT`: (the checkpoints whose put
    had returned before the kill, those there after the run, failed attempts, the state).
    Prints the seconds from the kill to the end of that turn (not asserted)."""
    acked: set[str] = set()
    killed: list[float] = []

    def during(n: int) -> None:
        if n == KILL_AT and setup.master.running:
            acked.update(t.config["configurable"]["checkpoint_id"] for t in cp.list(CFG))
            setup.kill_master()
            killed.append(time.monotonic())

    graph = chat(during).compile(checkpointer=cp)
    failed = 0
    for i in range(1, TURNS + 1):
        failed += await turn(graph, CFG, f"m{i}")
        if i == KILL_AT:
            print(f"[sentinel] turn {i} finished {time.monotonic() - killed[0]:.2f} s after "
                  "the master was killed")
    setup.wait_failover()
    values = (await graph.aget_state(CFG)).values
    texts = [m.content for m in values["messages"]]
    assert texts[-2:] == [f"m{TURNS}", f"echo: m{TURNS}"]
    for question, answer in itertools.pairwise(texts):
        if answer.startswith("echo: "):  # every answer right after its question
            assert question == answer.removeprefix("echo: ")
    return acked, await ids(cp, CFG), failed, values


def report(label: str, acked: set[str], after: set[str], failed: int) -> None:
    print(f"[sentinel] {label}: {len(acked)} checkpoints acknowledged before the kill, "
          f"{len(acked - after)} lost; {failed} failed turn attempts during the failover")


@two_replicas
async def test_url_follows_failover_and_keeps_acknowledged_checkpoints(
        sentinels: SentinelSetup) -> None:
    url = f"{sentinels.url}?wait_replicas=1&wait_timeout=2"
    async with RedisCheckpointer.from_conn_string(url) as cp:
        assert cp.store.wait_replicas == 1
        acked, after, failed, values = await run_through_failover(sentinels, cp)
    report("url, wait_replicas=1", acked, after, failed)
    assert len(acked) >= 3 * (KILL_AT - 1)
    assert acked <= after, f"acknowledged checkpoints lost: {sorted(acked - after)}"
    assert values["turns"] == TURNS
    assert [m.content for m in values["messages"]][::2] == [f"m{i}" for i in range(1, TURNS + 1)]


async def test_url_without_wait_follows_failover(sentinels: SentinelSetup) -> None:
    async with RedisCheckpointer.from_conn_string(sentinels.url) as cp:
        acked, after, failed, values = await run_through_failover(sentinels, cp)
    report("url, no wait", acked, after, failed)
    assert len(acked) >= 3 * (KILL_AT - 1)
    assert values["turns"] >= 1  # what was lost is counted, not asserted: see report()


@two_replicas
async def test_client_passed_in_follows_failover(sentinels: SentinelSetup) -> None:
    manager = Sentinel(sentinels.addresses, socket_timeout=2)
    client = manager.master_for(SERVICE)
    try:
        cp = RedisCheckpointer(client, wait_replicas=1, wait_timeout=2)
        await cp.asetup()
        acked, after, failed, values = await run_through_failover(sentinels, cp)
        report("client passed in, wait_replicas=1", acked, after, failed)
        assert acked <= after
        assert values["turns"] == TURNS
        # the sync API (the bridge's loop: a clone of the client) reaches the new master too
        assert cp.get_tuple(CFG) is not None
        await cp.aclose()
        assert await client.ping()  # the caller's client stays open
    finally:
        await client.aclose()
        await manager.aclose()


async def test_paused_replica_put_refused_with_wait_acknowledged_without(
        sentinels: SentinelSetup) -> None:
    replica = sentinels.replicas[0]
    async with RedisCheckpointer.from_conn_string(sentinels.url) as plain, \
            RedisCheckpointer.from_conn_string(  # time for an ack on a loaded machine
                f"{sentinels.url}?wait_replicas=1&wait_timeout=2&key_prefix=waits") as waits:
        graphs = [chat(lambda n: None).compile(checkpointer=cp) for cp in (plain, waits)]
        for g in graphs:
            assert await turn(g, CFG, "m1") == 0
        sentinels.pause(replica)
        try:
            # no replica can hold it, and the put returns all the same
            await graphs[0].ainvoke({"messages": [human("m2")]}, CFG)
            with pytest.raises(ReplicaAckError, match="0 of the 1 replicas"):
                await graphs[1].ainvoke({"messages": [human("m2")]}, CFG)
            with pytest.raises(ReplicaAckError):  # a delete waits for its replicas too
                await waits.adelete_thread("t-1")
        finally:
            sentinels.resume(replica)
        assert await waits.aget_tuple(CFG) is None  # the delete itself was done on the master
        # once the replica is back, a turn goes through (on the thread anew: it was deleted)
        assert await turn(graphs[1], CFG, "m2") >= 0
        assert (await graphs[1].aget_state(CFG)).values["turns"] == 1


def test_sentinel_urls_parse() -> None:
    url = ("redis+sentinel://app:s%40cret@10.0.0.1:26379,10.0.0.2,[::1]:26380/cache/2"
           "?socket_timeout=1&sentinel_password=pw&wait_replicas=1&wait_timeout=0.5")
    parsed = parse_url(url)
    assert parsed.backend == "redis"
    assert parsed.options == {"wait_replicas": 1, "wait_timeout": 0.5}
    assert "s%40cret" not in str(parsed) and "pw" not in str(parsed)
    where = parse_sentinel(parsed.target)
    assert where.sentinels == (("10.0.0.1", 26379), ("10.0.0.2", 26379), ("::1", 26380))
    assert (where.service, where.db, where.username, where.password) == ("cache", 2, "app",
                                                                           "s@cret")
    assert dict(where.query) == {"socket_timeout": "1", "sentinel_password": "pw"}
    at_in_query = parse_sentinel("redis+sentinel://h/m?sentinel_password=a@b")
    assert (at_in_query.sentinels, at_in_query.username, at_in_query.password) == (
        (("h", 26379),), None, None)
    for bad in ("redis+sentinel://h:1/", "redis+sentinel://h:x/m", "redis+sentinel://h/m/x",
                "redis+sentinel://h/m?nope=1", "redis://h/0?sentinel_password=x",
                "redis+sentinel://h/m?wait_replicas=-1"):
        with pytest.raises(InvalidConfigError):
            parse_url(bad)


async def test_plain_url_to_a_replica_says_read_only(sentinels: SentinelSetup) -> None:
    replica = sentinels.replicas[0]
    with pytest.raises(StoreUnavailableError, match=r"read-only replica.*redis\+sentinel://"):
        async with RedisCheckpointer.from_conn_string(replica.url):
            pass


async def test_held_replica_link_loses_acknowledged_turn_only_without_wait() -> None:
    """The replica's link held (the master's bytes kept from it), a turn on each of two
    checkpointers, the master killed and the link cut: the replica promoted lacks both turns;
    without `wait_replicas` one was acknowledged, with it the put was refused."""
    with redis_sentinel(replicas=1, held_link=True, failover_timeout_ms=60000) as setup:
        async with RedisCheckpointer.from_conn_string(setup.url) as plain, \
                RedisCheckpointer.from_conn_string(
                    f"{setup.url}?wait_replicas=1&wait_timeout=0.3&key_prefix=waits") as waits:
            graphs = [chat(lambda n: None).compile(checkpointer=cp) for cp in (plain, waits)]
            for g in graphs:
                await turn(g, CFG, "m1")
            setup.links[0].hold()
            await graphs[0].ainvoke({"messages": [human("m2")]}, CFG)
            acked = [await ids(plain, CFG), await ids(waits, CFG)]
            with pytest.raises(ReplicaAckError):
                await graphs[1].ainvoke({"messages": [human("m2")]}, CFG)
            setup.kill_master()
            setup.links[0].cut()
            setup.wait_failover()
            after = [await ids(cp, CFG) for cp in (plain, waits)]
            lost = [len(a - b) for a, b in zip(acked, after, strict=True)]
            print(f"[sentinel] held link: acknowledged then lost: {lost[0]} without "
                  f"wait_replicas, {lost[1]} with wait_replicas=1")
            assert lost[0] >= 1 and lost[1] == 0
            # both threads stand at turn 1 on the new master; without a replica left, only
            # the checkpointer that waits for none goes on
            assert [(await g.aget_state(CFG)).values["turns"] for g in graphs] == [1, 1]
            await turn(graphs[0], CFG, "m2")
            assert (await graphs[0].aget_state(CFG)).values["turns"] == 2
            with pytest.raises(ReplicaAckError):
                await graphs[1].ainvoke({"messages": [human("m2")]}, CFG)


def test_wait_replicas_checked() -> None:
    for bad in ({"wait_replicas": -1}, {"wait_replicas": 1.5}, {"wait_timeout": 0},
                {"wait_timeout": float("inf")}):
        with pytest.raises(InvalidConfigError):
            RedisCheckpointer("redis://127.0.0.1:1/0", setup=False, **bad)


def test_wait_replicas_refused_on_cluster() -> None:
    cp = RedisCheckpointer(redis_cluster_url(), wait_replicas=1, setup=False,
                           key_prefix=redis_prefix())
    try:
        with pytest.raises(InvalidConfigError, match="not supported on Redis Cluster"):
            cp.setup()
    finally:
        cp.close()
