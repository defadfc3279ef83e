"""benchmarks/figures.py at its smoke size runs the benchmarks for real (bench_backends on SQLite
with the DeltaChannel savers, bench_smart, bench_replica_lag), draws every picture as valid PNG
and SVG, and keeps the JSON it drew them from, in the shape other tools read."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))
from draw import slope  # noqa: E402

PICTURES = ("storage_growth", "turn_latency", "throughput", "smart_round_trips", "replica_lag")
DELTA = ("official-memory-delta", "official-sqlite-delta", "ours-sqlite-delta")


def test_slope_of_linear_and_quadratic_growth() -> None:
    turns = list(range(10, 310, 10))
    assert abs((slope(turns, [1000 * t for t in turns]) or 0) - 1.0) < 1e-9
    assert abs((slope(turns, [5 * t * t + 7 for t in turns]) or 0) - 2.0) < 0.01
    # Only the second half counts: a quadratic start, then linear.
    mixed = [t * t if t < 150 else 150 * t for t in turns]
    assert abs((slope(turns, mixed) or 0) - 1.0) < 1e-9


def test_figures_quick(tmp_path: Path) -> None:
    out = tmp_path / "img"
    data = out / "data"
    done = subprocess.run(
        [sys.executable, str(BENCH / "figures.py"), "--quick", "--only",
         "backends-sqlite,smart,lag", "--out", str(out)],
        capture_output=True, text=True, timeout=600,
    )
    printed = done.stdout
    assert done.returncode == 0, printed + done.stderr
    # bench_backends' restore checks: ours against official, each DeltaChannel run against its
    # plain twin.
    assert "MISMATCH" not in printed and "official-sqlite-delta vs official-sqlite: OK" in printed
    assert "== DeltaChannel" in printed
    for name in PICTURES:
        png = (out / f"{name}.png").read_bytes()
        assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000, name
        root = ET.parse(out / f"{name}.svg").getroot()
        assert root.tag == "{http://www.w3.org/2000/svg}svg", name
    files = {p.name: json.loads(p.read_text()) for p in data.glob("*.json")}
    assert set(files) == {"backends-sqlite.json", "smart.json", "replica_lag.json"}
    smart = files["smart.json"]
    assert set(smart["backends"]) == {"sqlite", "postgres"}
    for run in smart["backends"].values():
        assert list(run["variants"]) == list(smart["policies"])
        # The wrapper saves less often than the bare backend under every policy.
        bare = run["variants"]["bare"]["calls_per_turn"]
        assert all(v["calls_per_turn"] < bare for k, v in run["variants"].items() if k != "bare")
    backends = files["backends-sqlite.json"]
    assert backends["benchmark"] == "backends" and "--json" in backends["command"]
    machine = backends["machine"]
    assert isinstance(machine["cpus"], int) and machine["python"] and machine["platform"]
    assert backends["versions"]["langgraph"]
    savers = backends["savers"]
    assert set(DELTA) <= set(savers) and "official-postgres-delta" not in savers
    for saver in savers:
        growth = backends["growth"][saver]
        assert len(growth["turns"]) == len(growth["bytes"]) == len(growth["turn_ms"]) == 15
        assert growth["turns"] == sorted(growth["turns"]) and growth["turns"][-1] == 15
        assert all(b > 0 for b in growth["bytes"]) and all(t > 0 for t in growth["turn_ms"])
        assert set(backends["throughput"][saver]) == {"1", "16"}
        assert all(v > 0 for v in backends["throughput"][saver].values())
        assert backends["restore_ms"][saver] > 0
    lag = files["replica_lag.json"]
    assert lag["flushed"] and lag["caught_up"], lag["repair"]
    assert lag["kill_s"] < lag["restart_s"] <= (lag["caught_up_s"] or 0)
    down = [s for s in lag["samples"] if lag["kill_s"] < s["t"] < lag["restart_s"]]
    assert any(s["replicas"]["redis"]["queued"] > 0 for s in down)  # the kill was seen
    assert not any(s["replicas"]["sqlite"]["needs_repair"] for s in lag["samples"])
    # The official saver stores the whole thread again each turn: it grows faster than ours.
    growth = backends["growth"]
    assert growth["official-sqlite"]["bytes"][-1] > growth["ours-sqlite"]["bytes"][-1]


def test_bench_floor_smoke(tmp_path: Path) -> None:
    """bench_floor at a smoke size: every line's restored states equal the floor's (it exits
    non-zero otherwise), its JSON holds each line's ratios at each concurrency, and its
    picture draws."""
    from draw import draw_floor

    results = tmp_path / "floor.json"
    done = subprocess.run(
        [sys.executable, str(BENCH / "bench_floor.py"), "--rounds", "1", "--threads", "2",
         "--turns", "3", "--concurrency", "1,4", "--lines",
         "floor,ours-memory,ours-sqlite,official-sqlite", "--json", str(results)],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ours-sqlite:" in done.stdout and "of the floor" in done.stdout
    floor = json.loads(results.read_text())
    assert floor["benchmark"] == "floor"
    for level in ("1", "4"):
        assert list(floor[level]) == ["floor", "ours-memory", "ours-sqlite", "official-sqlite"]
        assert floor[level]["floor"]["turns_x"] == 1.0
        assert all(row["turns_per_s"] > 0 and row["cpu_ms"] > 0
                   for row in floor[level].values())
    written = draw_floor({**floor, "16": floor["4"]}, tmp_path)
    assert (tmp_path / "floor.png").read_bytes().startswith(b"\x89PNG") and len(written) == 2


@pytest.mark.postgres
@pytest.mark.redis
@pytest.mark.parametrize("kind", ["sqlite", "sqlite-thread", "postgres", "redis"])
@pytest.mark.parametrize("free", [False, True], ids=["bytes", "free"])
async def test_floor_bounds_store_every_call(tmp_path: Path, kind: str, free: bool) -> None:
    """The `bound-*` lines of bench_floor really store: one row or key per `aput` and
    `aput_writes` call, holding the bytes LangGraph's serializer made (only the key with
    `-free`), durable before the call returns; and the graph's state is the floor's."""
    import sqlite3

    import asyncpg
    import redis.asyncio as aioredis
    from bench_backends import build_graph, normalize, question, thread_config
    from floor_bounds import BoundSaver, open_sink
    from langgraph.checkpoint.memory import InMemorySaver

    from tests.support.savers import PG_DSN, REDIS_URL, require

    if kind in ("postgres", "redis"):
        require(kind)
    place = f"lgxbound_{uuid.uuid4().hex[:10]}"
    path = tmp_path / "bound.db"
    sink = await open_sink(kind, path=path, dsn=PG_DSN, redis_url=REDIS_URL, place=place)
    calls = 0

    async def counted(key: str, value: bytes) -> None:
        nonlocal calls
        calls += 1
        assert bool(value) is not free  # the serialized bytes, or only the key
        await sink.sink(key, value)

    try:
        saver, floor = BoundSaver(counted, free=free), InMemorySaver()
        graph, reference = build_graph(saver), build_graph(floor)
        for k in range(3):
            for g, durability in ((graph, "async"), (reference, "exit")):
                await g.ainvoke({"messages": [question("t", k)]}, thread_config("t"),
                                durability=durability)
        assert normalize((await graph.aget_state(thread_config("t"))).values) == normalize(
            (await reference.aget_state(thread_config("t"))).values)
        assert calls >= 3 * 5  # five checkpoints a turn at least, and the tasks' writes
        if kind.startswith("sqlite"):
            with sqlite3.connect(path) as conn:  # another connection: what is on disk
                stored = conn.execute("SELECT count(*), sum(length(v)) FROM r").fetchone()
        elif kind == "postgres":
            conn = await asyncpg.connect(PG_DSN)
            try:
                stored = tuple(await conn.fetchrow(
                    f'SELECT count(*), sum(length(v)) FROM "{place}"'))
            finally:
                await conn.close()
        else:
            client = aioredis.from_url(REDIS_URL)
            try:
                keys = [k async for k in client.scan_iter(match=f"{place}:*")]
                stored = (len(keys), sum([await client.strlen(k) for k in keys]))
            finally:
                await client.aclose()
        assert stored[0] == calls
        assert (stored[1] or 0) == 0 if free else stored[1] > 1000
    finally:
        await sink.close()


def test_bench_saver_calls_smoke(tmp_path: Path) -> None:
    """bench_saver_calls at a smoke size: LangGraph's calls recorded (five puts, four writes,
    one read a turn for this agent), replayed into each line, its JSON holding every line's
    time per kind of call and its CPU, and `--split` timing our functions in our lines only."""
    results = tmp_path / "calls.json"
    done = subprocess.run(
        [sys.executable, str(BENCH / "bench_saver_calls.py"), "--threads", "2", "--turns", "3",
         "--rounds", "1", "--split", "--lines", "official-memory,ours-memory,ours-sqlite",
         "--json", str(results)],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = json.loads(results.read_text())
    assert out["calls_per_turn"] == {"aput": 5.0, "aput_writes": 4.0, "aget_tuple": 1.0}
    assert list(out["lines"]) == ["official-memory", "ours-memory", "ours-sqlite"]
    for line, row in out["lines"].items():
        assert all(v > 0 for v in row["inside_us"].values()) and row["cpu_us"] > 0
        assert bool(row["split_us"]) is line.startswith("ours-")
    assert out["lines"]["ours-sqlite"]["split_us"]["chunk_mark"] > 0
    assert out["lines"]["ours-memory"]["other_threads_us"] < out["lines"]["ours-sqlite"][
        "other_threads_us"]  # SQLite's connection threads do its statements
    bad = subprocess.run([sys.executable, str(BENCH / "bench_saver_calls.py"), "--lines",
                          "floor"], capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "unknown lines ['floor']" in bad.stderr
