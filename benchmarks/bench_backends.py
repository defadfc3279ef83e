"""Benchmark: our checkpointers against LangGraph's official ones, interleaved in one run.

Backend sqlite: ours-sqlite (`SQLiteCheckpointer`, synchronous=FULL), official-sqlite
(`AsyncSqliteSaver`, SQLite's default synchronous=FULL), ours-memory (`InMemoryCheckpointer`),
official-memory (`InMemorySaver`) and, as an extra line, ours-sqlite-normal (`SQLiteCheckpointer`,
synchronous=NORMAL). Every saver gets a fresh database file per workload and round.

Backend postgres (server at --dsn): ours-postgres (`PostgresCheckpointer`, asyncpg pool) and
official-postgres (`AsyncPostgresSaver` of langgraph-checkpoint-postgres on a psycopg pool), both
with pools of POOL_MIN..POOL_MAX connections. Every saver gets a fresh schema per workload and
round (the official one through `-c search_path=<schema>`), dropped right after it and, whatever
happens, at exit.

Backend redis (server at --redis-url): ours-redis (`RedisCheckpointer`) and plainredis
(`AsyncRedisSaver` of langgraph-checkpoint-plainredis, core Redis commands only). Every saver gets
a fresh key prefix per workload and round, `<run prefix>_<nnnnn>`; its keys are deleted right after
it (SCAN MATCH on that prefix, then UNLINK) and, whatever happens, every key under the run's prefix
at exit. Never FLUSHDB: the server may be shared.

DeltaChannel: the official savers also run the same agent graph with `messages` declared as
LangGraph's `DeltaChannel` (beta; reducer `_messages_delta_reducer`), which stores appended
messages as writes and a full snapshot every 100 updates: official-memory-delta,
official-sqlite-delta, official-postgres-delta, plainredis-delta; and ours on it,
ours-sqlite-delta. They take part in workloads 1 and 2 (3 and 4 call `aput` directly, with no
graph); each restore check compares a -delta run with its plain twin too.

Workloads (real compiled LangGraph graphs with deterministic fake nodes, no LLM):
  1. agent loop, THREADS threads x TURNS turns, at concurrency 1 and 16, ROUNDS rounds;
  2. one thread of LONG_TURNS turns: bytes stored and per-turn latency as the thread grows
     (bytes sampled every LONG_TURNS/30 turns), then the time to restore it: the first
     `aget_state` on a fresh saver object;
  3. aget_tuple / alist on threads of 10 and CHECKPOINTS checkpoints written with `aput`;
  4. (redis only) `aput` against a bare `SET` of the same number of bytes, see `run_aput_vs_set`.
Then a restore check (`aget_state(...).values` equal between ours and the official saver) and
a summary against the issue's targets and the DeltaChannel columns (informational: the exit
code is 0 either way). `--json PATH` writes every figure, with `growth`, `throughput` and
`restore_ms` per saver in the shape `figures` documents.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import gc
import importlib.metadata
import json
import math
import operator
import os
import platform
import random
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, TypedDict

import asyncpg
import redis
import redis.asyncio as aioredis
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.channels.delta import DeltaChannel
from langgraph.checkpoint.base import BaseCheckpointSaver, empty_checkpoint
from langgraph.checkpoint.base.id import uuid6
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import _messages_delta_reducer, add_messages
from langgraph.graph.state import CompiledStateGraph
from langgraph.version import __version__ as langgraph_version
from langgraph_checkpoint_plainredis import AsyncRedisSaver
from psycopg import AsyncConnection
from psycopg.rows import DictRow, dict_row
from psycopg_pool import AsyncConnectionPool

from langgraph_ckpt_ext import (
    InMemoryCheckpointer,
    PostgresCheckpointer,
    RedisCheckpointer,
    SQLiteCheckpointer,
)

Saver = BaseCheckpointSaver[Any]
Json = dict[str, Any]
OURS, OFFICIAL = "ours-sqlite", "official-sqlite"
OURS_PG, OFFICIAL_PG = "ours-postgres", "official-postgres"
OURS_REDIS, PLAINREDIS = "ours-redis", "plainredis"
BACKENDS = ("sqlite", "postgres", "redis")
DEFAULT_DSN = os.environ.get("LGCKPT_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
DEFAULT_REDIS_URL = os.environ.get("LGCKPT_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
POOL_MIN, POOL_MAX = 4, 16  # both PostgreSQL savers (psycopg_pool's default min_size is 4)

# -- savers ------------------------------------------------------------------------------------


@dataclasses.dataclass
class Ctx:
    """Where the savers' data goes: SQLite files in `tmp`; PostgreSQL schemas named
    `<prefix>_<n>` on `dsn`, measured and dropped over the `admin` connection; Redis key prefixes
    `<prefix>_<nnnnn>` on `redis_url`, measured and deleted over the `redis` client."""

    tmp: Path
    dsn: str
    redis_url: str = DEFAULT_REDIS_URL
    prefix: str = dataclasses.field(default_factory=lambda: f"lgxbench_{uuid.uuid4().hex[:8]}")
    admin: Any = None  # asyncpg.Connection, when a PostgreSQL saver is selected
    redis: Any = None  # redis.asyncio.Redis, when a Redis saver is selected
    made: int = 0

    def place(self, spec: Spec, slot: str) -> str:
        """A fresh place for one saver: a database file path, a schema name or a key prefix."""
        if spec.kind == "postgres":
            self.made += 1
            return f"{self.prefix}_{self.made}"
        if spec.kind == "redis":
            return self.redis_place()
        return str(self.tmp / f"{slot}-{spec.label}.db")

    def redis_place(self) -> str:
        """A fresh key prefix. Fixed-width numbers: no prefix is a prefix of another, so the
        pattern `<place>*` matches the keys of this place only."""
        self.made += 1
        return f"{self.prefix}_{self.made:05d}"

    async def release(self, spec: Spec, place: str) -> None:
        if spec.kind == "postgres":
            await self.admin.execute(f'DROP SCHEMA IF EXISTS "{place}" CASCADE')
        elif spec.kind == "redis":
            await redis_delete(self.redis, place)

    async def drop_all(self) -> list[str]:
        """Drop every schema this run created (all start with `prefix`)."""
        rows = await self.admin.fetch(
            "SELECT nspname FROM pg_namespace WHERE starts_with(nspname, $1)", self.prefix + "_"
        )
        names = [str(r[0]) for r in rows]
        for name in names:
            await self.admin.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
        return names

    async def close(self) -> None:
        """At exit, on error as well: drop every schema and delete every Redis key of this run."""
        try:
            if self.admin is not None:
                try:
                    left = await self.drop_all()
                    if left:
                        print(f"  (dropped {len(left)} leftover schema(s): {', '.join(left)})")
                finally:
                    await self.admin.close()
        finally:
            if self.redis is not None:
                try:
                    n = await redis_delete(self.redis, self.prefix + "_")
                    if n:
                        print(f"  (deleted {n} leftover Redis key(s) under {self.prefix}_*)")
                finally:
                    await self.redis.aclose()


@contextlib.asynccontextmanager
async def _ready(saver: Saver) -> AsyncIterator[Saver]:
    yield saver


def open_ours_pg(ctx: Ctx, schema: str) -> contextlib.AbstractAsyncContextManager[Saver]:
    """Ours creates its schema and tables itself."""
    return PostgresCheckpointer.from_conn_string(
        ctx.dsn, schema=schema, min_size=POOL_MIN, max_size=POOL_MAX
    )


@contextlib.asynccontextmanager
async def open_official_pg(ctx: Ctx, schema: str) -> AsyncIterator[Saver]:
    """The official saver on a psycopg pool with the connection settings its docs require
    (autocommit, dict rows, prepare_threshold=0), confined to `schema` by its search_path."""
    await ctx.admin.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')  # reopened to restore
    pool: AsyncConnectionPool[AsyncConnection[DictRow]] = AsyncConnectionPool(
        ctx.dsn,
        min_size=POOL_MIN,
        max_size=POOL_MAX,
        open=False,
        kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row,
                "options": f"-c search_path={schema}"},
    )
    await pool.open(wait=True)
    try:
        saver = AsyncPostgresSaver(pool)
        await saver.setup()
        yield saver
    finally:
        await pool.close()


def open_ours_redis(ctx: Ctx, place: str) -> contextlib.AbstractAsyncContextManager[Saver]:
    return RedisCheckpointer.from_conn_string(ctx.redis_url, key_prefix=place)


def open_ours_redis_forking(ctx: Ctx, place: str) -> contextlib.AbstractAsyncContextManager[Saver]:
    """For `run_aput_vs_set`, whose puts fork from one checkpoint again and again: without the
    head check of writers="single" (which refuses a put whose parent is not the head), as
    plainredis, which has none."""
    return RedisCheckpointer.from_conn_string(ctx.redis_url, key_prefix=place, writers="last_wins")


@contextlib.asynccontextmanager
async def open_plainredis(ctx: Ctx, place: str) -> AsyncIterator[Saver]:
    """plainredis has no from_conn_string: its constructor makes a client from the URL (RESP2,
    5 s socket timeouts by default) and `aclose()` closes it."""
    saver = AsyncRedisSaver(url=ctx.redis_url, prefix=place)
    try:
        yield saver
    finally:
        await saver.aclose()


@dataclasses.dataclass(frozen=True)
class Spec:
    label: str
    backend: str  # the --backend that selects it: "sqlite" (SQLite and memory), "postgres", "redis"
    kind: str  # where it stores: "sqlite", "memory", "postgres" or "redis"
    open: Callable[[Ctx, str], contextlib.AbstractAsyncContextManager[Saver]]
    table: str | None = None  # the table with one row per checkpoint
    delta: bool = False  # runs the agent graph whose messages are a DeltaChannel


SPECS = [
    Spec(OURS, "sqlite", "sqlite",
         lambda c, p: SQLiteCheckpointer.from_conn_string(p), "lgx_checkpoints"),
    Spec(OFFICIAL, "sqlite", "sqlite",
         lambda c, p: AsyncSqliteSaver.from_conn_string(p), "checkpoints"),
    Spec("ours-memory", "sqlite", "memory", lambda c, p: _ready(InMemoryCheckpointer())),
    Spec("official-memory", "sqlite", "memory", lambda c, p: _ready(InMemorySaver())),
    Spec("ours-sqlite-normal", "sqlite", "sqlite",
         lambda c, p: SQLiteCheckpointer.from_conn_string(p, synchronous="NORMAL"), "lgx_checkpoints"),
    Spec(OURS_PG, "postgres", "postgres", open_ours_pg, "lgx_checkpoints"),
    Spec(OFFICIAL_PG, "postgres", "postgres", open_official_pg, "checkpoints"),
    Spec(OURS_REDIS, "redis", "redis", open_ours_redis),
    Spec(PLAINREDIS, "redis", "redis", open_plainredis),
]
DELTA_OF = {  # a saver on the DeltaChannel graph -> the same saver on the plain graph
    "official-memory-delta": "official-memory",
    "official-sqlite-delta": OFFICIAL,
    "ours-sqlite-delta": OURS,
    "official-postgres-delta": OFFICIAL_PG,
    "plainredis-delta": PLAINREDIS,
}
SPECS += [dataclasses.replace(next(s for s in SPECS if s.label == plain), label=label, delta=True)
          for label, plain in DELTA_OF.items()]
DELTA_VS = {  # (ours, official with DeltaChannel) per backend: the DeltaChannel ratios
    "sqlite": [(OURS, "official-sqlite-delta"), ("ours-memory", "official-memory-delta")],
    "postgres": [(OURS_PG, "official-postgres-delta")],
    "redis": [(OURS_REDIS, "plainredis-delta")],
}
PAIRS = [  # (ours, official): ratios and restore checks
    (OURS, OFFICIAL),
    ("ours-memory", "official-memory"),
    ("ours-sqlite-normal", OFFICIAL),
    (OURS_PG, OFFICIAL_PG),
    (OURS_REDIS, PLAINREDIS),
]


def sqlite_bytes(path: Path) -> int:
    """Size of the .db plus -wal file after a TRUNCATE checkpoint on a separate connection."""
    conn = sqlite3.connect(path)
    try:
        busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    finally:
        conn.close()
    if busy:
        print(f"  (warning: wal_checkpoint on {path.name} was busy; the size includes the WAL)")
    wal = path.with_name(path.name + "-wal")
    return path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)


def _payload(obj: Any) -> int:
    if isinstance(obj, bytes | bytearray | memoryview):
        return len(obj)
    if isinstance(obj, dict):
        return sum(_payload(v) for v in obj.values())
    if isinstance(obj, list | tuple):
        return sum(_payload(v) for v in obj)
    if dataclasses.is_dataclass(obj):
        return sum(_payload(getattr(obj, f.name)) for f in dataclasses.fields(obj))
    return 0


def memory_bytes(saver: Saver) -> int:
    """In-memory savers (an estimate): the serialized bytes they hold, i.e. values, checkpoint
    records and writes, without keys or Python object overhead."""
    if isinstance(saver, InMemoryCheckpointer):
        s = saver.store
        return _payload(s.checkpoints) + _payload(s.blobs) + _payload(s.writes)
    assert isinstance(saver, InMemorySaver)
    return _payload(saver.storage) + _payload(saver.blobs) + _payload(saver.writes)


async def pg_bytes(ctx: Ctx, schema: str) -> int:
    """pg_total_relation_size (heap, TOAST, indexes, free-space and visibility maps; no VACUUM)
    summed over every table in the saver's schema: ours lgx_checkpoints, lgx_blobs, lgx_writes,
    lgx_migrations; official checkpoints, checkpoint_blobs, checkpoint_writes,
    checkpoint_migrations."""
    return int(await ctx.admin.fetchval(
        "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relkind = 'r'",
        schema,
    ))


def _glob(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


async def redis_scan(client: Any, prefix: str) -> list[bytes]:
    """Every key that starts with `prefix` (SCAN MATCH, so never a blocking KEYS)."""
    return [key async for key in client.scan_iter(match=_glob(prefix) + "*", count=1000)]


async def redis_delete(client: Any, prefix: str) -> int:
    """UNLINK every key that starts with `prefix`; returns how many there were."""
    keys = await redis_scan(client, prefix)
    for i in range(0, len(keys), 1000):
        await client.unlink(*keys[i : i + 1000])
    return len(keys)


async def redis_memory(client: Any, keys: Sequence[str | bytes]) -> int:
    """MEMORY USAGE ... SAMPLES 0 (every element of hashes, sets and lists, not a sample) summed
    over `keys`; a key that is gone counts 0."""
    total = 0
    for i in range(0, len(keys), 1000):
        pipe = client.pipeline(transaction=False)
        for key in keys[i : i + 1000]:
            pipe.memory_usage(key, samples=0)
        total += sum(int(n or 0) for n in await pipe.execute())
    return total


async def redis_keys(ctx: Ctx, saver: Saver, place: str, tids: Sequence[str]) -> list[str | bytes]:
    """The keys of these threads: ours names them (`athread_keys`, falling back to a SCAN of its
    prefix if the method is missing); plainredis: a SCAN of its prefix (its keys are
    `<prefix>:...`: those of the threads, plus its thread registry and sequence counter)."""
    thread_keys = getattr(saver, "athread_keys", None)
    if isinstance(saver, AsyncRedisSaver) or thread_keys is None:
        return list(await redis_scan(ctx.redis, place))
    keys: list[str | bytes] = []
    for tid in tids:
        keys.extend(await thread_keys(tid))
    return list(dict.fromkeys(keys))


async def redis_bytes(ctx: Ctx, saver: Saver, place: str, tids: Sequence[str]) -> int:
    return await redis_memory(ctx.redis, await redis_keys(ctx, saver, place, tids))


async def stored_bytes(ctx: Ctx, spec: Spec, place: str, saver: Saver, tids: Sequence[str]) -> int:
    if spec.kind == "sqlite":
        return sqlite_bytes(Path(place))
    if spec.kind == "postgres":
        return await pg_bytes(ctx, place)
    if spec.kind == "redis":
        return await redis_bytes(ctx, saver, place, tids)
    return memory_bytes(saver)


async def count_checkpoints(
    ctx: Ctx, spec: Spec, place: str, saver: Saver, tids: Sequence[str]
) -> int:
    """Checkpoints actually stored, counted after the run: rows of the checkpoint table (on a
    separate connection) for SQLite and PostgreSQL, entries of the checkpoint dicts for memory
    savers, what `alist` yields on each thread for Redis."""
    if spec.kind == "redis":
        n = 0
        for tid in tids:
            n += len([t async for t in saver.alist(thread_config(tid))])
        return n
    if spec.kind == "postgres":
        return int(await ctx.admin.fetchval(f'SELECT count(*) FROM "{place}".{spec.table}'))
    if spec.table is not None:
        with contextlib.closing(sqlite3.connect(place)) as conn:
            return int(conn.execute(f"SELECT count(*) FROM {spec.table}").fetchone()[0])
    if isinstance(saver, InMemoryCheckpointer):
        return sum(len(rows) for rows in saver.store.checkpoints.values())
    assert isinstance(saver, InMemorySaver)
    return sum(len(rows) for by_ns in saver.storage.values() for rows in by_ns.values())


# -- the agent graph: agent -> tool -> agent -> END, five checkpoints per turn --------------------

_PROSE = (
    "agent tool call cost latency evidence plan step answer user query result search fetch "
    "parse retry budget token model reply context memory summary invoice order refund ticket "
    "customer account balance status error warning report draft review approve reject deploy "
    "server disk cache build test release version schema thread checkpoint graph node edge "
    "message weather flight hotel price date city route map score rank filter sort index"
)
_WORDS = _PROSE.split()


def text(tag: str, size: int = 500) -> str:
    """Deterministic content of `size` bytes, as varied as prose: every message differs, so a
    database that compresses values (PostgreSQL's TOAST) gains what it would on real chats."""
    rng = random.Random(tag)
    words = [f"[{tag}]"]
    while sum(len(w) + 1 for w in words) < size:
        words.append(rng.choice(_WORDS) if rng.random() < 0.8 else str(rng.randrange(10**6)))
    return " ".join(words)[:size]


class AgentState(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]
    tool_calls: Annotated[list[dict[str, Any]], operator.add]
    working_memory: dict[str, Any]
    tokens_used: Annotated[int, operator.add]
    cost_usd: Annotated[float, operator.add]


# Not a TypedDict: LangGraph would read the nodes' input schema from it, and the delta graph's
# `messages` channel differs from AgentState's.
State = Mapping[str, Any]


class DeltaAgentState(TypedDict, total=False):
    """AgentState with `messages` as LangGraph's DeltaChannel (beta): checkpoints store the
    appended messages only (as writes), with a full snapshot every `snapshot_frequency` (100)
    updates. `_messages_delta_reducer` is LangGraph's batching-invariant messages reducer."""

    messages: Annotated[list[AnyMessage], DeltaChannel(_messages_delta_reducer)]
    tool_calls: Annotated[list[dict[str, Any]], operator.add]
    working_memory: dict[str, Any]
    tokens_used: Annotated[int, operator.add]
    cost_usd: Annotated[float, operator.add]


def agent(state: State) -> AgentState:
    messages = state["messages"]
    last = messages[-1]
    base = str(last.id).rsplit(":", 1)[0]  # "<thread>/<turn>"
    turn = len(messages) // 4
    if isinstance(last, ToolMessage):
        reply = AIMessage(content=text(f"answer {base}"), id=f"{base}:answer")
        calls: list[dict[str, Any]] = []
    else:
        call_id = f"{base}:call"
        reply = AIMessage(
            content=text(f"thinking {base}"),
            id=call_id,
            tool_calls=[{"name": "search", "args": {"query": f"q {base}"}, "id": call_id}],
        )
        calls = [{"id": call_id, "tool": "search", "turn": turn}]
    return {
        "messages": [reply],
        "tool_calls": calls,
        "working_memory": {"turn": turn, "last": reply.id, "plan": ["look up", "answer"]},
        "tokens_used": 120 + turn % 7,
        "cost_usd": 0.00125,
    }


def tool(state: State) -> AgentState:
    call = state["messages"][-1].tool_calls[0]  # type: ignore[union-attr]
    base = str(call["id"]).rsplit(":", 1)[0]
    result = ToolMessage(content=text(f"result {base}"), tool_call_id=call["id"], id=f"{base}:tool")
    return {"messages": [result], "tokens_used": 40}


def route(state: State) -> str:
    last = state["messages"][-1]
    return "tool" if isinstance(last, AIMessage) and last.tool_calls else END


def build_graph(saver: Saver, delta: bool = False) -> CompiledStateGraph[Any, Any, Any, Any]:
    schema: Any = DeltaAgentState if delta else AgentState
    builder: StateGraph[Any, Any, Any, Any] = StateGraph(schema)
    builder.add_node("agent", agent)
    builder.add_node("tool", tool)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", route, ["tool", END])
    builder.add_edge("tool", "agent")
    return builder.compile(checkpointer=saver)


def question(tid: str, k: int) -> HumanMessage:
    """The user's message of turn `k` of thread `tid` (its id names both: the nodes' replies
    are named after it)."""
    return HumanMessage(content=text(f"question {tid}/{k}"), id=f"{tid}/{k}:human")


def thread_config(tid: str) -> RunnableConfig:
    return {"configurable": {"thread_id": tid}}


def normalize(values: dict[str, Any]) -> dict[str, Any]:
    """State values comparable across savers: messages by type, content and id."""
    return {**values, "messages": [(m.type, m.content, m.id) for m in values.get("messages", [])]}


@dataclasses.dataclass
class AgentRun:
    seconds: float
    latencies: list[list[float]]  # [thread][turn], seconds
    checkpoints: int
    bytes: int
    milestones: dict[int, int]  # turn -> bytes stored after it (single-thread runs)
    states: dict[str, dict[str, Any]]
    restore_s: float | None = None  # median seconds of `aget_state` on a fresh saver (`restore`)


async def run_agent(
    ctx: Ctx,
    spec: Spec,
    slot: str,
    threads: int,
    turns: int,
    concurrency: int,
    milestones: Sequence[int] = (),
    restore: bool = False,
) -> AgentRun:
    """Concurrency 1: threads one after another. Above: up to `concurrency` turns of different
    threads in flight at once; each thread's own turns stay in order. `restore`: then time
    `aget_state` of the first thread on fresh savers (`time_restore`); the run's states are the
    restored ones."""
    tids = [f"thread-{i}" for i in range(threads)]
    lat = [[0.0] * turns for _ in tids]
    marks: dict[int, int] = {}
    place = ctx.place(spec, slot)
    try:
        return await _run_agent(
            ctx, spec, place, tids, lat, marks, turns, concurrency, milestones, restore
        )
    finally:
        await ctx.release(spec, place)


async def _run_agent(
    ctx: Ctx,
    spec: Spec,
    place: str,
    tids: list[str],
    lat: list[list[float]],
    marks: dict[int, int],
    turns: int,
    concurrency: int,
    milestones: Sequence[int],
    restore: bool,
) -> AgentRun:
    threads = len(tids)
    gc.collect()
    async with spec.open(ctx, place) as saver:
        graph = build_graph(saver, spec.delta)
        gate = asyncio.Semaphore(concurrency)

        async def run_thread(i: int) -> None:
            for k in range(turns):
                human = question(tids[i], k)
                async with gate:
                    t0 = time.perf_counter()
                    await graph.ainvoke({"messages": [human]}, thread_config(tids[i]))
                    lat[i][k] = time.perf_counter() - t0
                if k + 1 in milestones:
                    marks[k + 1] = await stored_bytes(ctx, spec, place, saver, tids)

        t0 = time.perf_counter()
        if concurrency == 1:
            for i in range(threads):
                await run_thread(i)
        else:
            await asyncio.gather(*(run_thread(i) for i in range(threads)))
        seconds = time.perf_counter() - t0
        states = {t: normalize((await graph.aget_state(thread_config(t))).values) for t in tids}
        n = await count_checkpoints(ctx, spec, place, saver, tids)
        opened = spec.kind in ("memory", "redis")  # ours-redis names a thread's keys itself
        size = await stored_bytes(ctx, spec, place, saver, tids) if opened else None
        if restore and spec.kind == "memory":  # its data lives in this object
            restored = await time_restore(spec, lambda: _ready(saver), tids[0])
    if size is None:  # SQLite: after the saver closed its connection
        size = await stored_bytes(ctx, spec, place, saver, tids)
    if restore and spec.kind != "memory":
        restored = await time_restore(spec, lambda: spec.open(ctx, place), tids[0])
    if restore:
        return AgentRun(seconds, lat, n, size, marks, restored[1], restored[0])
    return AgentRun(seconds, lat, n, size, marks, states)


RESTORE_REPS = 3  # fresh savers per restore measure
GROWTH_SAMPLES = 30  # bytes measured after every n/30-th turn of the long thread


async def time_restore(
    spec: Spec, opener: Callable[[], contextlib.AbstractAsyncContextManager[Saver]], tid: str
) -> tuple[float, dict[str, dict[str, Any]]]:
    """Median seconds of the first `aget_state` of thread `tid` on RESTORE_REPS fresh savers
    from `opener` (opening is not timed), and the state restored. In-memory savers hold their
    data in the object itself: for them `opener` yields the same saver, under a fresh graph."""
    seconds: list[float] = []
    states: list[dict[str, Any]] = []
    for _ in range(RESTORE_REPS):
        gc.collect()
        async with opener() as saver:
            graph = build_graph(saver, spec.delta)
            t0 = time.perf_counter()
            snapshot = await graph.aget_state(thread_config(tid))
            seconds.append(time.perf_counter() - t0)
            states.append(normalize(snapshot.values))
    if any(s != states[0] for s in states):
        print(f"  (warning: {spec.label} restored thread {tid} differently on fresh savers)")
    return statistics.median(seconds), {tid: states[0]}


# -- direct reads: aget_tuple / alist on threads of 10 and 1,000 checkpoints -------------------

CHANNELS = ("messages", "plan", "memory", "scratch")


async def fill_thread(saver: Saver, tid: str, n: int) -> None:
    """n checkpoints of one fixed state size: four ~1 KB channels, one of which changes per
    step (all four at the first); `new_versions` names exactly the changed ones."""
    config: RunnableConfig = {"configurable": {"thread_id": tid, "checkpoint_ns": ""}}
    versions: dict[str, Any] = {}
    values: dict[str, Any] = {}
    for step in range(n):
        changed = CHANNELS if step == 0 else (CHANNELS[step % len(CHANNELS)],)
        for ch in changed:
            versions[ch] = saver.get_next_version(versions.get(ch), None)
            values[ch] = {"step": step, "text": text(f"{tid} {ch} {step:06d}", 1000)}
        checkpoint = empty_checkpoint()
        checkpoint["id"] = str(uuid6(clock_seq=step))
        checkpoint["channel_values"] = dict(values)
        checkpoint["channel_versions"] = dict(versions)
        checkpoint["versions_seen"] = {"node": {ch: versions[ch] for ch in changed}}
        checkpoint["updated_channels"] = list(changed)
        metadata: Any = {"source": "loop", "step": step, "parents": {}}
        new_versions = {ch: versions[ch] for ch in changed}
        config = await saver.aput(config, checkpoint, metadata, new_versions)


async def mean_seconds(fn: Callable[[], Awaitable[Any]], reps: int, at_least: float = 0.1) -> float:
    """Mean seconds per call over at least `reps` calls and `at_least` seconds."""
    n, t0 = 0, time.perf_counter()
    while n < reps or time.perf_counter() - t0 < at_least:
        await fn()
        n += 1
    return (time.perf_counter() - t0) / n


async def run_reads(ctx: Ctx, specs: Sequence[Spec], big: int, rounds: int) -> Json:
    """All savers open at once; each round measures them one after another (round 0 warms up)."""
    samples: dict[str, dict[str, list[float]]] = {s.label: {} for s in specs}
    async with contextlib.AsyncExitStack() as stack:
        savers: dict[str, Saver] = {}
        for spec in specs:
            place = ctx.place(spec, "reads")
            stack.push_async_callback(ctx.release, spec, place)
            saver = await stack.enter_async_context(spec.open(ctx, place))
            savers[spec.label] = saver
            for n in (10, big):
                await fill_thread(saver, f"reads-{n}", n)

        def latest(saver: Saver, n: int) -> Callable[[], Awaitable[Any]]:
            config: RunnableConfig = {"configurable": {"thread_id": f"reads-{n}", "checkpoint_ns": ""}}
            return lambda: saver.aget_tuple(config)

        def listing(saver: Saver, limit: int | None) -> Callable[[], Awaitable[None]]:
            async def go() -> None:
                got = [t async for t in saver.alist(thread_config(f"reads-{big}"), limit=limit)]
                if len(got) != (limit or big):
                    print(f"  (warning: alist(limit={limit}) returned {len(got)} checkpoints)")

            return go

        for r in range(rounds + 1):
            for spec in specs:
                saver = savers[spec.label]
                gc.collect()
                small = large = 0.0
                for _ in range(5):  # alternate, so that drift hits both threads alike
                    small += await mean_seconds(latest(saver, 10), 60, 0.02) / 5
                    large += await mean_seconds(latest(saver, big), 60, 0.02) / 5
                got = {
                    "get_latest_10": small,
                    "get_latest_big": large,
                    "list_limit_10": await mean_seconds(listing(saver, 10), 30),
                    "list_all_big": await mean_seconds(listing(saver, None), 2),
                }
                for key, value in got.items():
                    if r:
                        samples[spec.label].setdefault(key, []).append(value)
    res = {label: {k: statistics.median(v) for k, v in got.items()} for label, got in samples.items()}
    for v in res.values():
        v["get_latest_ratio"] = v["get_latest_big"] / v["get_latest_10"]
    return res


# -- Redis: aput against a bare SET of the same bytes -------------------------------------------

APUT_SOURCE_TURNS = 20  # the checkpoint that is put again: the agent graph's state after 20 turns
APUT_BATCH = 25  # aputs, then as many SETs (or the other way round), per saver and batch


@dataclasses.dataclass
class AputPlan:
    """Ready-made aput arguments, so that building them is not timed, and for each one the SET
    payload of the same size."""

    calls: list[tuple[RunnableConfig, Any, Any, dict[str, Any]]]
    payloads: list[bytes]
    channels: list[str]


async def aput_plan(saver: Saver, n: int) -> AputPlan:
    """Run APUT_SOURCE_TURNS turns of the agent graph on one thread, read the latest checkpoint
    back (`aget_tuple`), and prepare n puts: runs of APUT_BATCH steps that would follow it.

    Put j of a run (j = 0 .. APUT_BATCH-1) holds the source checkpoint's state plus j + 1 more
    ~500-byte AIMessages (one per step, as the agent's answer step adds one), a new checkpoint
    id, the previous put of the run as its parent (the source checkpoint for j = 0), and new
    versions for the channels that the source checkpoint's own step changed: its
    `updated_channels`, in this graph messages, tool_calls, working_memory, tokens_used and
    cost_usd, i.e. every channel that holds a value (the others hold none). Versions only go up,
    so no put reuses a version another one wrote. Every run starts again from the source
    checkpoint (a fork), so the state stays that of turn ~20. Why not put the same values again:
    a saver that stores only what a list gained since its last write would write nothing for
    the messages, which no real step does. Each run's first put forks, so such a saver writes
    the whole list there: one put in APUT_BATCH, more than a real thread costs it.

    The SET payload of put i is `dumps_typed(checkpoint)[1] + dumps_typed(metadata)[1]` of that
    put with LangGraph's default `JsonPlusSerializer`: the whole checkpoint, every channel value
    included, plus its metadata, serialized once, as one value."""
    tid = "aput-source"
    graph = build_graph(saver)
    for k in range(APUT_SOURCE_TURNS):
        human = question(tid, k)
        await graph.ainvoke({"messages": [human]}, thread_config(tid))
    source = await saver.aget_tuple(thread_config(tid))
    assert source is not None
    base = source.checkpoint
    channels = sorted(base.get("updated_channels") or base["channel_versions"])
    versions = dict(base["channel_versions"])
    serde = JsonPlusSerializer()
    plan = AputPlan([], [], channels)
    for i in range(n):
        j = i % APUT_BATCH
        if j == 0:
            config, messages = source.config, list(base["channel_values"]["messages"])
        for ch in channels:
            versions[ch] = saver.get_next_version(versions.get(ch), None)
        messages = [*messages, AIMessage(content=text(f"aput extra {j}"), id=f"{tid}/extra-{j}")]
        checkpoint = {**base, "id": str(uuid6(clock_seq=i)),
                      "channel_values": {**base["channel_values"], "messages": messages},
                      "channel_versions": dict(versions), "updated_channels": channels}
        metadata = {**source.metadata, "step": source.metadata["step"] + j + 1}
        plan.calls.append((config, checkpoint, metadata, {ch: versions[ch] for ch in channels}))
        plan.payloads.append(serde.dumps_typed(checkpoint)[1] + serde.dumps_typed(metadata)[1])
        config = {"configurable": {**source.config["configurable"], "checkpoint_id": checkpoint["id"]}}
    return plan


async def run_aput_vs_set(ctx: Ctx, specs: Sequence[Spec], reps: int) -> Json:
    """Mean seconds per `aput` of each saver and per bare `SET` of the same bytes (`AputPlan`),
    in alternating batches of APUT_BATCH (one run of steps each): for each batch and saver, the
    aputs and the SETs one after the other (their order flips from batch to batch), after one
    batch of warm-up. Each SET writes a fresh key (as an aput adds keys); those keys are deleted,
    untimed, after each batch. The bare SETs go through the benchmark's own client (redis-py's
    defaults). Ours runs with writers="last_wins" here (`open_ours_redis_forking`)."""
    batches = max(1, math.ceil(reps / APUT_BATCH))
    t_aput = {s.label: 0.0 for s in specs}
    t_set = dict(t_aput)
    async with contextlib.AsyncExitStack() as stack:
        savers: dict[str, Saver] = {}
        plans: dict[str, AputPlan] = {}
        for spec in specs:
            place = ctx.place(spec, "aput")
            stack.push_async_callback(ctx.release, spec, place)
            opener = open_ours_redis_forking if spec.label == OURS_REDIS else spec.open
            savers[spec.label] = await stack.enter_async_context(opener(ctx, place))
            plans[spec.label] = await aput_plan(savers[spec.label], (batches + 1) * APUT_BATCH)
        set_place = ctx.redis_place()
        stack.push_async_callback(redis_delete, ctx.redis, set_place)
        gc.collect()
        for b in range(batches + 1):  # batch 0: warm-up
            for spec in specs:
                saver, plan = savers[spec.label], plans[spec.label]
                todo = range(b * APUT_BATCH, (b + 1) * APUT_BATCH)
                keys = [f"{set_place}:{spec.label}:{i}" for i in todo]
                elapsed: dict[str, float] = {}
                for what in (("aput", "set") if b % 2 else ("set", "aput")):
                    t0 = time.perf_counter()
                    if what == "aput":
                        for i in todo:
                            await saver.aput(*plan.calls[i])
                    else:
                        for i, key in zip(todo, keys, strict=True):
                            await ctx.redis.set(key, plan.payloads[i])
                    elapsed[what] = time.perf_counter() - t0
                await ctx.redis.unlink(*keys)
                if b:
                    t_aput[spec.label] += elapsed["aput"]
                    t_set[spec.label] += elapsed["set"]
    n = batches * APUT_BATCH
    return {
        label: {
            "aput_s": t_aput[label] / n,
            "set_s": t_set[label] / n,
            "set_over_aput": t_set[label] / t_aput[label],
            "payload_bytes": statistics.fmean(map(len, plans[label].payloads[APUT_BATCH:])),
            "reps": n,
            "channels": plans[label].channels,
        }
        for label in t_aput
    }


# -- reporting ---------------------------------------------------------------------------------


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or a < 0 or b <= 0 else a / b


def fmt(x: Any) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, float):
        return f"{x:,.3f}" if abs(x) < 0.1 else f"{x:,.2f}"
    return f"{x:,}" if isinstance(x, int) else str(x)


def mb(n: int | None) -> float | None:
    return None if n is None else n / 1e6


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    cells = [list(headers), *([fmt(c) for c in row] for row in rows)]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(r: Sequence[str]) -> str:
        rest = (c.rjust(w) for c, w in zip(r[1:], widths[1:], strict=True))
        return "  ".join([r[0].ljust(widths[0]), *rest])

    print(line(cells[0]))
    print("-" * len(line(cells[0])))
    for r in cells[1:]:
        print(line(r))
    print()


def window_ms(lat: Sequence[float], lo: int, hi: int) -> float:
    """Mean latency in ms over turns lo..hi (1-based, inclusive)."""
    return 1000 * statistics.fmean(lat[max(0, lo - 1) : hi])


def thirds_growth(turns: Sequence[int], sizes: Sequence[int]) -> float | None:
    """Bytes added per turn over the last third of the thread / over the middle third (from
    turn n/3 to 2n/3): 1 when the size grows linearly, 5/3 when it grows quadratically. A constant
    part (empty database, registries) cancels out."""
    (t1, t2, t3), (b1, b2, b3) = turns, sizes
    return ratio((b3 - b2) / (t3 - t2), (b2 - b1) / (t2 - t1))


def verdict(ok: bool | None) -> str:
    return "info" if ok is None else ("PASS" if ok else "FAIL")


def show_restore(what: str, checks: dict[str, bool], runs: dict[str, list[AgentRun]]) -> None:
    for name, ok in checks.items():
        print(f"  restore check ({what}) {name}: {'OK' if ok else 'MISMATCH'}")
        if ok:
            continue
        a, b = (runs[x][-1].states for x in name.split(" vs "))
        for tid in a:
            for key in a[tid].keys() | b.get(tid, {}).keys():
                if a[tid].get(key) != b.get(tid, {}).get(key):
                    print(f"    first difference: {tid}.{key}: {str(a[tid].get(key))[:100]} "
                          f"!= {str(b.get(tid, {}).get(key))[:100]}")
                    return


def restore_checks(args: argparse.Namespace, runs: dict[str, list[AgentRun]]) -> dict[str, bool]:
    """Ours against the official savers, and each DeltaChannel run against its plain twin."""
    have = {s.label for s in args.specs}
    fidelity = [(d, p) for d, p in DELTA_OF.items() if d in have and p in have]
    return {
        f"{a} vs {b}": all(x.states == y.states for x, y in zip(runs[a], runs[b], strict=True))
        for a, b in [*pairs(args.specs), *fidelity]
    }


# -- workloads ---------------------------------------------------------------------------------


def pairs(specs: Sequence[Spec]) -> list[tuple[str, str]]:
    have = {s.label for s in specs}
    return [(a, b) for a, b in PAIRS if a in have and b in have]


def bytes_note(specs: Sequence[Spec]) -> str:
    kinds = {s.kind for s in specs}
    notes = {
        "sqlite": "SQLite: .db + -wal after wal_checkpoint(TRUNCATE)",
        "postgres": "PostgreSQL: pg_total_relation_size summed over the saver's tables (heap + "
                    "TOAST + indexes, no VACUUM)",
        "memory": "memory: serialized bytes held, estimate",
        "redis": "Redis: MEMORY USAGE (SAMPLES 0) summed over the threads' keys (ours: athread_keys; "
                 "plainredis: a SCAN of its prefix)",
    }
    return "; ".join(v for k, v in notes.items() if k in kinds)


async def workload_agent(args: argparse.Namespace, ctx: Ctx, out: Json) -> None:
    print(f"== 1. agent loop: {args.threads} threads x {args.turns} turns, {args.rounds} round(s), "
          "savers interleaved ==")
    for conc in args.concurrency:
        runs: dict[str, list[AgentRun]] = {s.label: [] for s in args.specs}
        for r in range(args.rounds):
            for spec in args.specs:
                slot = f"agent-c{conc}-r{r}"
                run = await run_agent(ctx, spec, slot, args.threads, args.turns, conc)
                runs[spec.label].append(run)
                print(f"  c={conc} round {r + 1} {spec.label:<19} {run.seconds:7.2f} s "
                      f"{run.checkpoints / run.seconds:8.1f} ckpt/s")
        res: Json = {}
        for label, rs in runs.items():
            lat = [x for run in rs for per in run.latencies for x in per]
            res[label] = {
                "checkpoints": rs[-1].checkpoints,
                "checkpoints_per_s": statistics.median(run.checkpoints / run.seconds for run in rs),
                "seconds": [run.seconds for run in rs],
                "p50_ms": 1000 * pct(lat, 50),
                "p99_ms": 1000 * pct(lat, 99),
                "bytes": rs[-1].bytes,
            }
        print(f"\n  concurrency {conc}: checkpoints = stored rows (Redis: alist) counted after the "
              f"run (expected 5 per turn = {5 * args.threads * args.turns}); ckpt/s = median over "
              "rounds of checkpoints / wall time; latency = per ainvoke, all rounds pooled; stored = "
              f"{bytes_note(args.specs)}")
        table(
            ["saver", "checkpoints", "ckpt/s", "p50 ms", "p99 ms", "MB stored"],
            [[k, v["checkpoints"], v["checkpoints_per_s"], v["p50_ms"], v["p99_ms"], mb(v["bytes"])]
             for k, v in res.items()],
        )
        metrics = ("checkpoints_per_s", "p50_ms", "p99_ms", "bytes")
        table(
            ["ours / official", "ckpt/s", "p50 ms", "p99 ms", "bytes"],
            [[f"{a} / {b}", *(ratio(res[a][m], res[b][m]) for m in metrics)]
             for a, b in pairs(args.specs)],
        )
        restore = restore_checks(args, runs)
        show_restore(f"c={conc}, {args.threads} threads x {args.rounds} rounds", restore, runs)
        print()
        out["agent"][f"c{conc}"] = {"savers": res, "restore_ok": restore}


async def workload_long(args: argparse.Namespace, ctx: Ctx, out: Json) -> None:
    n = args.long_turns
    marks = sorted({max(1, round(n * i / 6)) for i in range(1, 7)})
    thirds = [max(1, round(n * i / 6)) for i in (2, 4, 6)]  # turns n/3, 2n/3, n: among the marks
    early, late = (6, 15), (max(1, n - 9), n)
    step = max(1, n // GROWTH_SAMPLES)
    sampled = sorted({*marks, *range(step, n + 1, step)})
    print(f"== 2. one thread of {n} turns (concurrency 1), {args.long_rounds} round(s) ==")
    runs: dict[str, list[AgentRun]] = {s.label: [] for s in args.specs}
    for r in range(args.long_rounds):
        for spec in args.specs:
            run = await run_agent(ctx, spec, f"long-r{r}", 1, n, 1, sampled, restore=True)
            runs[spec.label].append(run)
            print(f"  round {r + 1} {spec.label:<19} {run.seconds:7.2f} s")
    res: Json = {}
    for label, rs in runs.items():
        per_turn = zip(*(run.latencies[0] for run in rs), strict=True)
        lat = [statistics.median(x) for x in per_turn]
        sizes = [rs[-1].milestones[m] for m in marks]
        e, lt = window_ms(lat, *early), window_ms(lat, *late)
        res[label] = {
            "seconds": [run.seconds for run in rs],
            "checkpoints": rs[-1].checkpoints,
            "bytes": rs[-1].bytes,
            "bytes_after_turn": dict(zip(marks, sizes, strict=True)),
            # log-log slope of bytes over turns, from the 2nd milestone on: ~1 linear, ~2 quadratic
            "bytes_growth_exponent": math.log(sizes[-1] / sizes[1]) / math.log(marks[-1] / marks[1]),
            "bytes_growth_thirds": thirds_growth(thirds, [rs[-1].milestones[m] for m in thirds]),
            "latency_early_ms": e,
            "latency_late_ms": lt,
            "latency_growth": lt / e,
            "restore_ms": 1000 * statistics.median(run.restore_s or 0.0 for run in rs),
            # turn_ms[i]: median latency of the turns after the previous sample up to turns[i]
            # (one turn alone is too noisy to draw on a shared machine)
            "growth": {"turns": sampled, "bytes": [rs[-1].milestones[t] for t in sampled],
                       "turn_ms": [1000 * statistics.median(lat[a:t]) for a, t in
                                   zip([0, *sampled[:-1]], sampled, strict=True)]},
        }
    print(f"\n  MB stored after turn N ({bytes_note(args.specs)}); exponent = log-log slope of "
          f"bytes from turn {marks[1]} to {marks[-1]} (1 linear, 2 quadratic); latency = mean ms per "
          f"turn over turns {early[0]}-{early[1]} and {late[0]}-{late[1]} of each turn's median "
          f"over rounds; restore = ms of the first aget_state of the thread on a fresh saver "
          f"(in-memory: the same saver, a fresh graph), median of {RESTORE_REPS} savers x rounds")
    table(
        ["saver", "ckpts", *(f"@{m}" for m in marks), "exponent", f"ms@{early[1]}", f"ms@{late[1]}",
         "growth", "restore ms"],
        [[k, v["checkpoints"], *(mb(v["bytes_after_turn"][m]) for m in marks),
          v["bytes_growth_exponent"], v["latency_early_ms"], v["latency_late_ms"], v["latency_growth"],
          v["restore_ms"]]
         for k, v in res.items()],
    )
    table(
        ["official / ours", "bytes", "latency growth"],
        [[f"{b} / {a}", ratio(res[b]["bytes"], res[a]["bytes"]),
          ratio(res[b]["latency_growth"], res[a]["latency_growth"])] for a, b in pairs(args.specs)],
    )
    restore = restore_checks(args, runs)
    show_restore(f"{n}-turn thread", restore, runs)
    print()
    out["long"] = {"turns": n, "thirds": thirds, "savers": res, "restore_ok": restore}


async def workload_reads(args: argparse.Namespace, ctx: Ctx, out: Json) -> None:
    big = args.checkpoints
    print(f"== 3. aget_tuple / alist on threads of 10 and {big} checkpoints (written with aput) ==")
    specs = [s for s in args.specs if not s.delta]  # direct aput/aget_tuple: no graph, no channel
    if not specs:
        return
    res = await run_reads(ctx, specs, big, rounds=3)
    print("  mean per call, median of 3 interleaved rounds: get = aget_tuple of the latest "
          f"checkpoint (5 alternating batches of >= 60 calls and >= 20 ms on each thread per round); "
          f"alist on the {big}-checkpoint thread")
    table(
        ["saver", "get@10 us", f"get@{big} us", f"{big}/10", "alist(limit=10) ms",
         f"alist all {big} ms"],
        [[k, 1e6 * v["get_latest_10"], 1e6 * v["get_latest_big"], v["get_latest_ratio"],
          1e3 * v["list_limit_10"], 1e3 * v["list_all_big"]] for k, v in res.items()],
    )
    metrics = ("get_latest_10", "get_latest_big", "list_limit_10", "list_all_big")
    table(
        ["ours / official", "get@10", f"get@{big}", "alist(limit=10)", f"alist all {big}"],
        [[f"{a} / {b}", *(ratio(res[a][m], res[b][m]) for m in metrics)]
         for a, b in pairs(specs)],
    )
    out["reads"] = {"checkpoints": big, "savers": res}


async def workload_aput(args: argparse.Namespace, ctx: Ctx, out: Json) -> None:
    specs = [s for s in args.specs if s.kind == "redis" and not s.delta]
    if not specs:
        return
    print(f"== 4. Redis: aput against a bare SET of the same bytes, {APUT_BATCH} x "
          f"{math.ceil(args.aput_reps / APUT_BATCH)} interleaved per saver ==")
    res = await run_aput_vs_set(ctx, specs, args.aput_reps)
    some = next(iter(res.values()))
    print(f"  aput: the checkpoint after {APUT_SOURCE_TURNS} agent turns (aget_tuple) and the "
          f"{APUT_BATCH} steps that would follow it, again and again (each run forks from it): "
          "each step adds one ~500-byte message, has a new id, the previous step as parent, and "
          f"new versions for {', '.join(some['channels'])} (the channels the source checkpoint's "
          "own step changed; the other channels hold no value). SET: one bare SET of a fresh key "
          "with the bytes of dumps_typed(checkpoint) + dumps_typed(metadata) of the same step "
          "(payload = their mean size). Mean per call")
    table(
        ["saver", "payload KB", "aput us", "SET us", "SET/aput"],
        [[k, v["payload_bytes"] / 1e3, 1e6 * v["aput_s"], 1e6 * v["set_s"], v["set_over_aput"]]
         for k, v in res.items()],
    )
    out["aput_vs_set"] = {"source_turns": APUT_SOURCE_TURNS, "savers": res}


@dataclasses.dataclass(frozen=True)
class Goals:
    """The issue's targets for one backend: ours against official."""

    backend: str
    ours: str
    official: str
    max_bytes_ratio: float  # (a) ours/official bytes of the long thread, strictly below
    min_ckpt_ratio: dict[int, float]  # (b) by concurrency; key 0: any other concurrency
    max_latency_growth_ratio: float | None  # (c) None: no target, printed as info
    variants: dict[str, str]  # further savers of ours, (b) as info: label -> note
    reads: tuple[tuple[str, str], ...]  # (d) (ours, official) pairs, each must stay <= 1.2
    # (a) linear: False: log-log exponent from the 2nd milestone on <= 1.25; True: bytes added
    # per turn over the last third <= 1.2 x those over the middle third (`thirds_growth`)
    linear_by_thirds: bool = False
    min_set_over_aput: float | None = None  # (f) bare SET time / aput time, at least


GOALS = [
    Goals("sqlite", OURS, OFFICIAL, 1 / 30, {0: 1.5}, 0.5,
          {"ours-sqlite-normal": " (NORMAL vs FULL)"},
          ((OURS, OFFICIAL), ("ours-memory", "official-memory"), ("ours-sqlite-normal", OFFICIAL))),
    Goals("postgres", OURS_PG, OFFICIAL_PG, 1 / 10, {1: 1.3, 0: 1.5}, None, {},
          ((OURS_PG, OFFICIAL_PG),)),
    Goals("redis", OURS_REDIS, PLAINREDIS, 1 / 30, {0: 1.5}, None, {}, (),
          linear_by_thirds=True, min_set_over_aput=0.5),
]


def goal_rows(g: Goals, out: Json) -> list[list[Any]]:
    rows: list[list[Any]] = []
    long = out.get("long", {}).get("savers", {})
    if g.ours in long and g.official in long:
        a, b = long[g.ours], long[g.official]
        r = ratio(a["bytes"], b["bytes"])
        if g.linear_by_thirds:
            growth = a["bytes_growth_thirds"]
            linear = growth is not None and growth <= 1.2
        else:
            linear = a["bytes_growth_exponent"] <= 1.25
        ok = r is not None and r < g.max_bytes_ratio and linear
        rows.append([f"(a) {out['long']['turns']}-turn thread, MB stored", mb(a["bytes"]),
                     mb(b["bytes"]), r,
                     f"< 1/{round(1 / g.max_bytes_ratio)} = {g.max_bytes_ratio:.3f}, linear",
                     verdict(ok)])
        if g.linear_by_thirds:
            thirds = out["long"]["thirds"]

            def at(v: Json) -> str:
                return " / ".join(fmt(mb(v["bytes_after_turn"][t])) for t in thirds)

            rows.append([f"    MB after turns {' / '.join(map(str, thirds))}", at(a), at(b), None,
                         "", verdict(None)])
            rows.append(["    bytes/turn, last third / middle third (1 linear, 1.67 quadratic)",
                         a["bytes_growth_thirds"], b["bytes_growth_thirds"], None, "<= 1.2",
                         verdict(None)])
        else:
            rows.append(["    bytes growth exponent (1 linear, 2 quadratic)",
                         a["bytes_growth_exponent"], b["bytes_growth_exponent"], None, "<= 1.25",
                         verdict(None)])
    for key, res in out.get("agent", {}).items():
        s, conc = res["savers"], int(key[1:])
        goal = g.min_ckpt_ratio.get(conc, g.min_ckpt_ratio[0])
        for label in (g.ours, *g.variants):
            if label in s and g.official in s:
                r = ratio(s[label]["checkpoints_per_s"], s[g.official]["checkpoints_per_s"])
                note = g.variants.get(label, "")
                rows.append([f"(b) agent ckpt/s, concurrency {conc}{note}",
                             s[label]["checkpoints_per_s"], s[g.official]["checkpoints_per_s"], r,
                             f">= {goal}", verdict(r is not None and r >= goal) if not note else "info"])
    if g.ours in long and g.official in long:
        a, b = long[g.ours], long[g.official]
        r = ratio(a["latency_growth"], b["latency_growth"])
        limit = g.max_latency_growth_ratio
        rows.append([f"(c) latency growth, turn ~10 -> {out['long']['turns']}", a["latency_growth"],
                     b["latency_growth"], r, "(no target)" if limit is None else f"<= {limit}",
                     verdict(None if limit is None else r is not None and r <= limit)])
    reads = out.get("reads", {}).get("savers", {})
    for label, official in g.reads:
        if label in reads:
            r = reads[label]["get_latest_ratio"]
            rows.append([f"(d) aget_tuple latest {out['reads']['checkpoints']}/10, {label}", r,
                         reads.get(official, {}).get("get_latest_ratio"), None, "<= 1.2",
                         verdict(r <= 1.2)])
    mine = {g.ours, g.official, *g.variants, *(x for pair in g.reads for x in pair)}
    checks = [ok for res in (*out.get("agent", {}).values(), out.get("long", {}))
              for name, ok in res.get("restore_ok", {}).items() if set(name.split(" vs ")) <= mine]
    if checks:
        rows.append([f"(e) restored state identical ({len(checks)} checks)",
                     f"{sum(checks)} OK", "", None, "all OK", verdict(all(checks))])
    aput = out.get("aput_vs_set", {}).get("savers", {})
    if g.min_set_over_aput is not None and g.ours in aput:
        a, b = aput[g.ours]["set_over_aput"], aput.get(g.official, {}).get("set_over_aput")
        rows.append(["(f) aput vs bare SET of the same bytes: SET time / aput time", a, b, None,
                     f">= {g.min_set_over_aput}", verdict(a >= g.min_set_over_aput)])
    return rows


def delta_summary(out: Json) -> None:
    """The DeltaChannel columns: every saver of the run side by side, then ours against the
    official savers on the DeltaChannel graph."""
    growth, thru, restore = out["growth"], out["throughput"], out["restore_ms"]
    long = out.get("long", {}).get("savers", {})
    if not any(DELTA_OF.get(label) for label in out["savers"]) or not (growth or thru):
        return
    n = out.get("long", {}).get("turns")
    print(f"== DeltaChannel: the official savers on the agent graph whose messages are a "
          f"DeltaChannel (-delta) beside the plain graph ({n}-turn thread; ckpt/s of workload 1) ==")
    rows = [[label, mb(growth[label]["bytes"][-1]) if label in growth else None,
             long.get(label, {}).get("bytes_growth_exponent"),
             long.get(label, {}).get("bytes_growth_thirds"),
             thru.get(label, {}).get("1"), thru.get(label, {}).get("16"),
             long.get(label, {}).get("latency_late_ms"), restore.get(label)]
            for label in out["savers"]]
    table(["saver", "MB stored", "exponent", "thirds", "ckpt/s c1", "ckpt/s c16", "ms/turn end",
           "restore ms"], rows)
    by = {r[0]: r for r in rows}
    ratios = [[f"{a} / {b}", *(ratio(by[a][i], by[b][i]) for i in range(1, 8) if i not in (2, 3))]
              for pairs_ in DELTA_VS.values() for a, b in pairs_ if a in by and b in by]
    if ratios:
        table(["ours / official-delta", "bytes", "ckpt/s c1", "ckpt/s c16", "ms/turn end",
               "restore ms"], ratios)


def figures(out: Json, command: Sequence[str]) -> None:
    """The figures other tools read (`--json`): growth, throughput and restore time per saver."""
    long = out.get("long", {}).get("savers", {})
    out.update(
        benchmark="backends",
        command=" ".join(command),
        machine={"cpus": os.cpu_count() or 0, "python": platform.python_version(),
                 "platform": platform.platform()},
        versions={"langgraph": langgraph_version, "langgraph-ckpt-ext":
                  importlib.metadata.version("langgraph-ckpt-ext"), **versions()},
        growth={label: v["growth"] for label, v in long.items()},
        throughput={},
        restore_ms={label: v["restore_ms"] for label, v in long.items()},
    )
    for key, res in out.get("agent", {}).items():
        for label, v in res["savers"].items():
            out["throughput"].setdefault(label, {})[key[1:]] = v["checkpoints_per_s"]


def summary(out: Json) -> None:
    for g in GOALS:
        rows = goal_rows(g, out)
        if rows:
            print(f"== summary, {g.backend}: the issue's targets (informational; ours = {g.ours} "
                  "unless named) ==")
            table(["target", "ours", "official", "ratio", "goal", "verdict"], rows)


# -- main --------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="small smoke run (about a minute)")
    p.add_argument("--backend", choices=[*BACKENDS, "all"], default="all",
                   help="sqlite: the SQLite and in-memory savers; postgres: the PostgreSQL savers; "
                        "redis: the Redis savers; all (default): all three")
    p.add_argument("--dsn", default=DEFAULT_DSN,
                   help="PostgreSQL server for --backend postgres/all (default: $LGCKPT_TEST_PG_DSN "
                        "or postgresql://postgres@127.0.0.1:5432/test); each run gets fresh schemas "
                        "lgxbench_<random>_<n>, all dropped at exit")
    p.add_argument("--redis-url", default=DEFAULT_REDIS_URL,
                   help="Redis server for --backend redis/all (default: $LGCKPT_TEST_REDIS_URL or "
                        "redis://127.0.0.1:6379/0); each run gets fresh key prefixes "
                        "lgxbench_<random>_<nnnnn>, all keys under them deleted at exit (no FLUSHDB)")
    p.add_argument("--threads", type=int, help="agent workload threads (default 20; quick 4)")
    p.add_argument("--turns", type=int, help="agent workload turns per thread (default 30; quick 5)")
    p.add_argument("--rounds", type=int, help="agent workload rounds (default 3; quick 1)")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 16], help="default: 1 16")
    p.add_argument("--long-turns", type=int, help="turns of the long thread (default 300; quick 40)")
    p.add_argument("--long-rounds", type=int, help="long-thread rounds (default 3; quick 1)")
    p.add_argument("--checkpoints", type=int, help="checkpoints of the long read thread (default 1000)")
    p.add_argument("--aput-reps", type=int,
                   help="aput-vs-SET reps per Redis saver (default 1000; quick 200)")
    p.add_argument("--workloads", default="1,2,3,4",
                   help="which workloads to run, e.g. 1,3 (4: aput vs SET, Redis savers only)")
    p.add_argument("--savers", help=f"comma-separated subset of {','.join(s.label for s in SPECS)} "
                                    "(overrides --backend)")
    p.add_argument("--dir", type=Path, help="directory for the database files (default: a temp dir)")
    p.add_argument("--json", type=Path, help="also write every number to this JSON file")
    args = p.parse_args(argv)
    args.command = [sys.argv[0], *(sys.argv[1:] if argv is None else argv)]
    quick = args.quick
    args.threads = args.threads or (4 if quick else 20)
    args.turns = args.turns or (5 if quick else 30)
    args.rounds = args.rounds or (1 if quick else 3)
    args.long_turns = args.long_turns or (40 if quick else 300)
    args.long_rounds = args.long_rounds or (1 if quick else 3)
    args.checkpoints = args.checkpoints or (200 if quick else 1000)
    args.aput_reps = args.aput_reps or (200 if quick else 1000)
    if args.long_turns < 15:
        p.error("--long-turns must be at least 15 (the early latency window is turns 6-15)")
    args.workloads = {int(w) for w in args.workloads.split(",")}
    backends = BACKENDS if args.backend == "all" else (args.backend,)
    labels = args.savers.split(",") if args.savers else [s.label for s in SPECS if s.backend in backends]
    unknown = set(labels) - {s.label for s in SPECS}
    if unknown:
        p.error(f"unknown saver(s) {sorted(unknown)}")
    args.specs = [s for s in SPECS if s.label in labels]
    return args


def versions() -> dict[str, str]:
    names = ("langgraph-checkpoint", "langgraph-checkpoint-sqlite", "langgraph-checkpoint-postgres",
             "asyncpg", "psycopg", "psycopg-pool", "redis", "langgraph-checkpoint-plainredis")
    return {name: importlib.metadata.version(name) for name in names}


async def connect_redis(ctx: Ctx, out: Json) -> None:
    client = aioredis.Redis.from_url(ctx.redis_url)
    try:
        info = await client.info("server")
    except (OSError, aioredis.RedisError) as e:
        await client.aclose()
        raise SystemExit(f"cannot connect to Redis at {ctx.redis_url}: {e}\n"
                         "(pass --redis-url, or another --backend)") from e
    ctx.redis = client  # from now on, ctx.close() deletes the run's keys
    config = await ctx.redis.config_get("appendonly")
    config.update(await ctx.redis.config_get("appendfsync"))
    config.update(await ctx.redis.config_get("save"))
    out["env"].update(redis_server=str(info["redis_version"]), redis_persistence=config)
    persistence = ", ".join(f"{k} {v!r}" for k, v in sorted(config.items()))
    print(f"redis {info['redis_version']} at {ctx.redis_url} ({persistence}); key prefixes "
          f"{ctx.prefix}_<nnnnn>\n")


async def main_async(args: argparse.Namespace, ctx: Ctx) -> Json:
    out: Json = {
        "args": {k: v for k, v in vars(args).items()
                 if k not in ("specs", "workloads", "json", "dir", "dsn", "redis_url", "command")},
        "savers": [s.label for s in args.specs],
        "env": {"python": platform.python_version(), "langgraph": langgraph_version,
                "sqlite": sqlite3.sqlite_version, "cpus": os.cpu_count(), **versions()},
        "agent": {},
    }
    if any(s.kind == "postgres" for s in args.specs):
        try:
            ctx.admin = await asyncpg.connect(ctx.dsn)
        except (OSError, asyncpg.PostgresError) as e:
            raise SystemExit(f"cannot connect to PostgreSQL at {ctx.dsn}: {e!r}\n"
                             "(pass --dsn, or --backend sqlite)") from e
        server = await ctx.admin.fetchval("SHOW server_version")
        autovacuum = await ctx.admin.fetchval("SHOW autovacuum")
        out["env"].update(postgres=server, autovacuum=autovacuum)
        print(f"postgres {server} at {ctx.dsn} (autovacuum {autovacuum}: without it the tables get "
              f"no planner statistics); pools {POOL_MIN}..{POOL_MAX} connections; schemas "
              f"{ctx.prefix}_<n>\n")
    started = time.perf_counter()
    try:
        if any(s.kind == "redis" for s in args.specs):
            await connect_redis(ctx, out)
        if 1 in args.workloads:
            await workload_agent(args, ctx, out)
        if 2 in args.workloads:
            await workload_long(args, ctx, out)
        if 3 in args.workloads:
            await workload_reads(args, ctx, out)
        if 4 in args.workloads:
            await workload_aput(args, ctx, out)
    finally:
        await ctx.close()
    figures(out, args.command)
    summary(out)
    delta_summary(out)
    out["seconds_total"] = time.perf_counter() - started
    print(f"total time {out['seconds_total']:.0f} s")
    return out


def redis_cleanup_sync(ctx: Ctx) -> None:
    """Whatever happened, delete the run's Redis keys once more, without the event loop: a
    second Ctrl-C ends `asyncio.run` before `ctx.close()` could (redis-py's asyncio client does
    not always let the first one cancel a command)."""
    try:
        with redis.Redis.from_url(ctx.redis_url) as client:
            keys = list(client.scan_iter(match=_glob(ctx.prefix + "_") + "*", count=1000))
            for i in range(0, len(keys), 1000):
                client.unlink(*keys[i : i + 1000])
    except redis.RedisError as e:
        print(f"  (could not check for leftover Redis keys under {ctx.prefix}_*: {e})")
        return
    if keys:
        print(f"  (deleted {len(keys)} leftover Redis key(s) under {ctx.prefix}_*)")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    print(f"python {platform.python_version()}, langgraph {langgraph_version}, sqlite "
          f"{sqlite3.sqlite_version}, {os.cpu_count()} cpus; savers: "
          f"{', '.join(s.label for s in args.specs)}\n")
    with contextlib.ExitStack() as stack:
        if args.dir:
            args.dir.mkdir(parents=True, exist_ok=True)
            tmp = args.dir
        else:
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="lgckpt-bench-")))
        ctx = Ctx(tmp, args.dsn, args.redis_url)
        try:
            out = asyncio.run(main_async(args, ctx))
        finally:
            if ctx.redis is not None:  # it connected, so it may have written keys
                redis_cleanup_sync(ctx)
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
