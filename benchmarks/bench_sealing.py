"""Benchmark: what encryption at rest and compression cost a graph, and what they save on disk.

Four configurations of our checkpointer, each on fresh storage per run:

    plain        no compression, no encryption (the default)
    compression  `compression=True` (zstd, values of 1 KiB or more)
    encryption   `encryption=Encryption(StaticKeys(...))` (AES-256-GCM)
    both         the two (compressed, then encrypted)

The workload is a chat agent: per turn a user question (~150-400 bytes), an answer that calls a
tool, the tool's output (4-20 KB of JSON search results, which compresses the way such output
does) and a final answer (~0.6-1.5 KB of prose); four checkpoints a turn, the message list
growing. The nodes are async and do no work of their own (their texts are made before the
timed part), so the times are the graph's and the checkpointer's. `--threads` threads of
`--turns` turns each, one after another (`--concurrency` to overlap them). Each round runs
every configuration once, the order shifted by one each round; the table gives medians over
rounds, and ratios to plain as the median of each round's ratio.

Checks (exit code 1 if one fails): every configuration restores the same final state as plain;
a marker written into every tool output is found in plain's raw storage and nowhere in an
encrypted one's (the SQLite file, the in-memory rows, every PostgreSQL row, every Redis value);
an `api_key` passed in the config is in no configuration's storage (metadata redaction).

Run: `python benchmarks/bench_sealing.py [--backends memory,sqlite,postgres,redis] [--threads 8]
[--turns 16] [--rounds 7] [--concurrency 1] [--smoke] [--profile encryption]`.
Servers: PostgreSQL at --dsn, Redis at --redis-url; a fresh schema / key prefix per run,
dropped afterwards (never FLUSHDB).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import dataclasses
import functools
import gc
import io
import json
import os
import pstats
import random
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, TypedDict

import asyncpg
import cryptography
import redis.asyncio as aioredis
import zstandard
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from places import drop, open_saver

from langgraph_ckpt_ext import connect
from langgraph_ckpt_ext.core.keys import StaticKeys, new_key
from langgraph_ckpt_ext.core.rows import ListQuery
from langgraph_ckpt_ext.core.saver import StoreCheckpointer
from langgraph_ckpt_ext.core.sealing import Encryption

CONFIGS = ("plain", "compression", "encryption", "both")
MARKER = "lgx-bench-marker-5c1e"  # in every tool output
SECRET = "sk-bench-0b7d44-never-stored"  # passed as configurable api_key

_PROSE = (
    "the a of to and in is for on that with as it by this from be are at or an was which "
    "order invoice refund account shipping delivery customer payment card address status "
    "warehouse return label carrier tracking update request policy window days business "
    "manager ticket escalation priority review approved pending failed retry timeout "
    "product price discount coupon subscription plan annual monthly renewal cancel upgrade "
    "report summary result results query search document page section table figure note "
    "please could would should we you they our your their there here when where how what "
    "because however although therefore meanwhile finally first second next last also"
)
_WORDS = _PROSE.split()
_TAGS = ("billing", "shipping", "returns", "api", "sla", "eu", "us", "apac", "vip", "legal",
         "security", "faq", "howto", "release", "incident", "pricing")


def prose(rng: random.Random, size: int) -> str:
    words: list[str] = []
    while sum(len(w) + 1 for w in words) < size:
        words.append(rng.choice(_WORDS) if rng.random() < 0.85 else str(rng.randrange(10**5)))
    return " ".join(words)[:size]


def tool_output(rng: random.Random, size: int) -> str:
    """JSON search results of about `size` bytes, as varied as a search tool's output."""
    hits: list[dict[str, Any]] = []
    length = 0
    while length < size:
        doc = f"{rng.choice(_TAGS)}-{rng.randrange(10**6):06d}"
        hits.append({
            "id": doc, "title": prose(rng, rng.randint(20, 70)).capitalize(),
            "url": f"https://kb.example.com/{doc}?rev={rng.randrange(1000)}",
            "score": round(rng.random(), 4), "tags": rng.sample(_TAGS, 3),
            "updated": f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
            "snippet": prose(rng, rng.randint(150, 400)),
        })
        length += len(json.dumps(hits[-1])) + 2
    return json.dumps({"query_id": MARKER, "hits": hits})


@functools.cache
def content(kind: str, base: str) -> str:
    """A message's text, the same in every configuration; made once, before the timed runs, so
    that what is timed is the graph and the checkpointer, not this script's text generator."""
    rng = random.Random(f"{kind} {base}")
    if kind == "human":
        return prose(rng, rng.randint(150, 400))
    if kind == "tool":
        return tool_output(rng, rng.randint(4096, 20480))
    return prose(rng, rng.randint(80, 200) if kind == "call" else rng.randint(600, 1500))


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    notes: dict[str, Any]


# Async nodes run on the event loop (as nodes calling a model API do), so that `--profile` sees
# all of a run's work in one thread.
async def agent(state: State) -> dict[str, Any]:
    last = state["messages"][-1]
    base = str(last.id).rsplit(":", 1)[0]
    if isinstance(last, ToolMessage):
        reply = AIMessage(content=content("answer", base), id=f"{base}:answer")
    else:
        reply = AIMessage(content=content("call", base), id=f"{base}:call",
                          tool_calls=[{"name": "search", "args": {"q": base},
                                       "id": f"{base}:call"}])
    return {"messages": [reply], "notes": {"turn": base, "last": reply.id,
                                           "plan": ["search", "answer"]}}


async def tool(state: State) -> dict[str, Any]:
    call = state["messages"][-1]
    base = str(call.id).rsplit(":", 1)[0]
    return {"messages": [ToolMessage(content=content("tool", base),
                                     tool_call_id=f"{base}:call", id=f"{base}:tool")]}


def route(state: State) -> str:
    last = state["messages"][-1]
    return "tool" if isinstance(last, AIMessage) and last.tool_calls else END


def build_graph(saver: StoreCheckpointer) -> Any:
    g = StateGraph(State)
    g.add_node("agent", agent)
    g.add_node("tool", tool)
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", route, ["tool", END])
    g.add_edge("tool", "agent")
    return g.compile(checkpointer=saver)


def config_of(tid: str) -> RunnableConfig:
    return {"configurable": {"thread_id": tid, "api_key": SECRET}}


def options(name: str, keys: StaticKeys) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if name in ("compression", "both"):
        out["compression"] = True
    if name in ("encryption", "both"):
        out["encryption"] = Encryption(keys)
    return out


# -- what a run stored ----------------------------------------------------------------------


def _values(obj: Any) -> list[bytes]:
    """The bytes held by the in-memory store's rows (values, records, writes)."""
    if isinstance(obj, bytes | bytearray | memoryview):
        return [bytes(obj)]
    if isinstance(obj, str):
        return [obj.encode("utf-8", "surrogatepass")]
    if isinstance(obj, dict):
        return [b for v in obj.values() for b in _values(v)]
    if isinstance(obj, list | tuple):
        return [b for v in obj for b in _values(v)]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [b for f in dataclasses.fields(obj) for b in _values(getattr(obj, f.name))]
    return []


def memory_values(saver: StoreCheckpointer) -> list[bytes]:
    store = saver._raw_store  # the rows as stored, sealed
    return _values(store.checkpoints) + _values(store.blobs) + _values(store.writes)  # type: ignore[attr-defined]


def sqlite_bytes(path: Path) -> bytes:
    """The .db file (after a TRUNCATE checkpoint folds the WAL into it), read whole."""
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    wal = path.with_name(path.name + "-wal")
    return path.read_bytes() + (wal.read_bytes() if wal.exists() else b"")


async def pg_facts(dsn: str, schema: str, needles: Sequence[str]) -> tuple[int, list[int]]:
    """pg_total_relation_size summed over the schema's tables (heap, TOAST, indexes), and for
    each needle the rows whose text form holds it (as text, or as bytea's hex)."""
    conn = await asyncpg.connect(dsn)
    try:
        size = await conn.fetchval(
            "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c JOIN "
            "pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relkind = 'r'",
            schema)
        tables = [r[0] for r in await conn.fetch(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = $1", schema)]
        found = []
        for needle in needles:
            hexed = needle.encode().hex()
            n = 0
            for t in tables:
                n += await conn.fetchval(
                    f'SELECT count(*) FROM "{schema}"."{t}" r '
                    "WHERE strpos(r::text, $1) > 0 OR strpos(r::text, $2) > 0", needle, hexed)
            found.append(n)
        return int(size), found
    finally:
        await conn.close()


async def redis_facts(url: str, prefix: str) -> tuple[int, list[Any]]:
    """MEMORY USAGE (SAMPLES 0) summed over the prefix's keys, and every value they hold."""
    client = aioredis.from_url(url)
    try:
        keys = [k async for k in client.scan_iter(match=f"{prefix}:*", count=1000)]
        size = 0
        values: list[Any] = []
        for key in keys:
            size += int(await client.memory_usage(key, samples=0) or 0)
            kind = (await client.type(key)).decode()  # type: ignore[union-attr]
            if kind == "string":
                values.append(await client.get(key) or b"")
            elif kind == "hash":
                values += list((await client.hgetall(key)).values())
            elif kind == "zset":
                values += await client.zrange(key, 0, -1)
            elif kind == "list":
                values += await client.lrange(key, 0, -1)
            elif kind == "set":
                values += list(await client.smembers(key))
        return size, values
    finally:
        await client.aclose()


# -- one run --------------------------------------------------------------------------------


@dataclasses.dataclass
class Run:
    seconds: float
    cpu: float
    checkpoints: int
    stored: int
    marker: bool  # the tool outputs' marker found in the raw storage
    secret: bool  # the config's api_key found in the raw storage
    states: dict[str, Any]


def normalize(values: dict[str, Any]) -> Any:
    return ([(m.type, m.content, m.id) for m in values["messages"]], values.get("notes"))


async def run_one(backend: str, name: str, args: argparse.Namespace, keys: StaticKeys,
                  tmp: Path, profile: cProfile.Profile | None = None) -> Run:
    place = (str(tmp / f"{name}-{uuid.uuid4().hex[:6]}.db") if backend == "sqlite"
             else f"lgxseal_{uuid.uuid4().hex[:10]}")
    opts = options(name, keys)
    saver = (connect("memory://", **opts) if backend == "memory"
             else open_saver(backend, place, args, **opts))
    try:
        await saver.asetup()
        graph = build_graph(saver)
        tids = [f"thread-{i}" for i in range(args.threads)]
        gate = asyncio.Semaphore(args.concurrency)

        for tid in tids:
            for k in range(args.turns):
                for kind in ("human", "call", "tool", "answer"):
                    content(kind, f"{tid}/{k}")

        async def thread(tid: str) -> None:
            for k in range(args.turns):
                human = HumanMessage(content=content("human", f"{tid}/{k}"),
                                     id=f"{tid}/{k}:human")
                async with gate:
                    await graph.ainvoke({"messages": [human]}, config_of(tid))

        gc.collect()
        if profile is not None:
            profile.enable()
        cpu0, t0 = time.process_time(), time.perf_counter()
        await asyncio.gather(*(thread(t) for t in tids))
        seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        if profile is not None:
            profile.disable()
        states = {t: normalize((await graph.aget_state(config_of(t))).values) for t in tids}
        count = 0
        for t in tids:
            count += len([r async for r in saver.stored.iter(ListQuery(thread_id=t))])
        stored, marker, secret = await _facts(backend, place, saver, args)
    finally:
        await saver.aclose()
    if backend == "sqlite":  # after the saver closed its connection
        data = sqlite_bytes(Path(place))
        stored, marker, secret = len(data), MARKER.encode() in data, SECRET.encode() in data
    await drop(backend, place, args)
    return Run(seconds, cpu, count, stored, marker, secret, states)


async def _facts(backend: str, place: str, saver: StoreCheckpointer,
                 args: argparse.Namespace) -> tuple[int, bool, bool]:
    if backend == "memory":
        values = memory_values(saver)
    elif backend == "postgres":
        size, (m, s) = await pg_facts(args.dsn, place, (MARKER, SECRET))
        return size, m > 0, s > 0
    elif backend == "redis":
        size, values = await redis_facts(args.redis_url, place)
        return (size, any(MARKER.encode() in v for v in values),
                any(SECRET.encode() in v for v in values))
    else:
        return 0, False, False  # SQLite: read once the file is closed
    return (sum(map(len, values)), any(MARKER.encode() in v for v in values),
            any(SECRET.encode() in v for v in values))


# -- the table ------------------------------------------------------------------------------


def median_ratio(runs: dict[str, list[Run]], name: str, of: str) -> float:
    def value(r: Run) -> float:
        if of == "rate":
            return r.checkpoints / r.seconds
        if of == "cpu":
            return r.cpu
        return float(r.stored)
    return statistics.median(value(a) / value(b)
                             for a, b in zip(runs[name], runs["plain"], strict=True))


def check(backend: str, runs: dict[str, list[Run]]) -> list[str]:
    problems = []
    want = runs["plain"][0].states
    for name, rs in runs.items():
        for r in rs:
            if r.states != want:
                problems.append(f"{backend}/{name}: restored state differs from plain's")
            if r.secret:
                problems.append(f"{backend}/{name}: the config's api_key is in the raw storage")
            if "encryption" in options(name, _KEYS) and r.marker:
                problems.append(f"{backend}/{name}: tool output found unencrypted in storage")
            if name == "plain" and not r.marker:
                problems.append(f"{backend}/plain: the marker was not found in raw storage "
                                "(the check itself is broken)")
            if r.checkpoints != rs[0].checkpoints:
                problems.append(f"{backend}/{name}: checkpoint counts differ between rounds")
    return sorted(set(problems))


def table(backend: str, runs: dict[str, list[Run]], turns: int) -> None:
    head = ("config", "ckpt/s", "x plain", "CPU ms/turn", "x plain", "stored", "x plain",
            "no plaintext")
    rows = []
    for name, rs in runs.items():
        rate = statistics.median(r.checkpoints / r.seconds for r in rs)
        cpu = statistics.median(r.cpu for r in rs) / turns * 1000
        stored = statistics.median(r.stored for r in rs)
        enc = "encryption" in options(name, _KEYS)
        rows.append((name, f"{rate:.0f}", f"{median_ratio(runs, name, 'rate'):.2f}",
                     f"{cpu:.2f}", f"{median_ratio(runs, name, 'cpu'):.2f}",
                     f"{stored / 1e6:.2f} MB", f"{median_ratio(runs, name, 'stored'):.2f}",
                     ("OK" if not any(r.marker for r in rs) else "FOUND") if enc else "-"))
    widths = [max(len(str(c)) for c in col) for col in zip(head, *rows, strict=True)]
    print(f"\n[{backend}]")
    for row in (head, *rows):
        print("  " + "  ".join(str(c).rjust(w) if i else str(c).ljust(w)
                               for i, (c, w) in enumerate(zip(row, widths, strict=True))))


_KEYS = StaticKeys({"bench-1": new_key()})


async def bench(backend: str, args: argparse.Namespace, tmp: Path) -> dict[str, list[Run]]:
    runs: dict[str, list[Run]] = {n: [] for n in CONFIGS}
    for r in range(args.rounds + 1):  # round 0 warms up (imports, caches, the server)
        order = CONFIGS[r % 4:] + CONFIGS[:r % 4]
        for name in order:
            run = await run_one(backend, name, args, _KEYS, tmp)
            if r:
                runs[name].append(run)
    return runs


def profile_config(backend: str, name: str, args: argparse.Namespace, tmp: Path) -> None:
    """Where the CPU of one configuration's run goes: sealing's share, then the top callees."""
    prof = cProfile.Profile()
    asyncio.run(run_one(backend, name, args, _KEYS, tmp, prof))
    stats = pstats.Stats(prof)
    total = stats.total_tt  # type: ignore[attr-defined]
    own = {"seal": 0.0, "open": 0.0, "compress": 0.0, "decompress": 0.0}
    for (path, _, func), (_, _, _, ct, _) in stats.stats.items():  # type: ignore[attr-defined]
        if path.endswith("core/sealing.py") and func in ("seal", "open"):
            own[func] += ct
    print(f"\nprofile of {backend}/{name}: {total:.2f} s of CPU in Python functions; "
          f"Sealer.seal {own['seal']:.3f} s ({100 * own['seal'] / total:.1f}%), "
          f"Sealer.open {own['open']:.3f} s ({100 * own['open'] / total:.1f}%) (cumulative)")
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(15)
    print(out.getvalue())


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--backends", default="memory,sqlite,postgres,redis")
    p.add_argument("--dsn", default=os.environ.get("LGCKPT_TEST_PG_DSN",
                                                   "postgresql://postgres@127.0.0.1:5432/test"))
    p.add_argument("--redis-url", default=os.environ.get("LGCKPT_TEST_REDIS_URL",
                                                         "redis://127.0.0.1:6379/0"))
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--turns", type=int, default=16, help="turns per thread")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--concurrency", type=int, default=1, help="threads in flight at once")
    p.add_argument("--smoke", action="store_true", help="2 threads x 2 turns, 1 round")
    p.add_argument("--profile", choices=CONFIGS, help="also profile this configuration "
                   "(cProfile) on the first backend")
    args = p.parse_args(argv)
    if args.smoke:
        args.threads, args.turns, args.rounds = 2, 2, 1
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    print(f"python {sys.version.split()[0]}, cryptography {cryptography.__version__}, "
          f"zstandard {zstandard.__version__}, sqlite {sqlite3.sqlite_version}, "
          f"{os.cpu_count()} cpus; {args.threads} threads x {args.turns} turns "
          f"(4 checkpoints a turn), concurrency {args.concurrency}; median of {args.rounds} "
          "rounds after a warm-up round")
    problems: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        for backend in backends:
            runs = asyncio.run(bench(backend, args, Path(tmp)))
            table(backend, runs, args.threads * args.turns)
            problems += check(backend, runs)
        if args.profile:
            profile_config(backends[0], args.profile, args, Path(tmp))
    for problem in problems:
        print(f"FAILED: {problem}")
    if not problems:
        print("\nchecks: OK (same restored state in every configuration; nothing in the clear "
              "where encrypted; no api_key stored)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
