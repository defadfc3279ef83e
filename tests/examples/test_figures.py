"""benchmarks/figures.py at its smoke size draws every picture, as valid PNG and SVG, and keeps
the JSON it drew them from.

The smart and lag runs are real (figures.py runs them). The backends file is written here, in
bench_backends.py's `--json` shape, from a small real measurement of ours-sqlite and
official-sqlite (the agent graph, one thread of a few turns, then turns at concurrency 1 and 16).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from langchain_core.messages import HumanMessage
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

from langgraph_ckpt_ext import SQLiteCheckpointer

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))
from bench_backends import build_graph, sqlite_bytes, text  # noqa: E402
from draw import slope  # noqa: E402

PICTURES = ("storage_growth", "turn_latency", "throughput", "smart_round_trips", "replica_lag")
TURNS = 6


async def turn(graph: Any, tid: str, k: int) -> float:
    human = HumanMessage(content=text(f"question {tid}/{k}"), id=f"{tid}/{k}:human")
    t = time.perf_counter()
    await graph.ainvoke({"messages": [human]}, {"configurable": {"thread_id": tid}})
    return 1000 * (time.perf_counter() - t)


async def measure(saver: Any, path: Path) -> tuple[dict[str, Any], dict[str, float]]:
    graph = build_graph(saver)
    growth: dict[str, list[Any]] = {"turns": [], "bytes": [], "turn_ms": []}
    for k in range(1, TURNS + 1):
        growth["turn_ms"].append(await turn(graph, "long", k))
        growth["turns"].append(k)
        growth["bytes"].append(sqlite_bytes(path))
    throughput = {}
    for level in (1, 16):
        tids = [f"c{level}-{i}" for i in range(level)]
        t = time.perf_counter()
        if level == 1:
            await turn(graph, tids[0], 0)
        else:
            await asyncio.gather(*(turn(graph, tid, 0) for tid in tids))
        seconds = time.perf_counter() - t
        stored = 0
        for tid in tids:
            stored += len([c async for c in saver.alist({"configurable": {"thread_id": tid}})])
        throughput[str(level)] = stored / seconds
    return growth, throughput


async def backends_file(tmp: Path) -> dict[str, Any]:
    ours_path, official_path = tmp / "ours.db", tmp / "official.db"
    ours = SQLiteCheckpointer(ours_path)
    try:
        ours_growth, ours_rate = await measure(ours, ours_path)
    finally:
        await ours.aclose()
    async with AsyncSqliteSaver.from_conn_string(str(official_path)) as official:
        official_growth, official_rate = await measure(official, official_path)
    return {
        "benchmark": "backends", "command": "tests/examples/test_figures.py",
        "machine": {"cpus": 1, "python": sys.version.split()[0], "platform": sys.platform},
        "versions": {}, "savers": ["ours-sqlite", "official-sqlite"],
        "growth": {"ours-sqlite": ours_growth, "official-sqlite": official_growth},
        "throughput": {"ours-sqlite": ours_rate, "official-sqlite": official_rate},
        "restore_ms": {},
    }


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
    data.mkdir(parents=True)
    backends = asyncio.run(backends_file(tmp_path))
    (data / "backends-sqlite.json").write_text(json.dumps(backends))
    done = subprocess.run(
        [sys.executable, str(BENCH / "figures.py"), "--quick", "--only", "smart,lag",
         "--out", str(out)],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
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
    lag = files["replica_lag.json"]
    assert lag["flushed"] and lag["caught_up"], lag["repair"]
    assert lag["kill_s"] < lag["restart_s"] <= (lag["caught_up_s"] or 0)
    down = [s for s in lag["samples"] if lag["kill_s"] < s["t"] < lag["restart_s"]]
    assert any(s["replicas"]["redis"]["queued"] > 0 for s in down)  # the kill was seen
    assert not any(s["replicas"]["sqlite"]["needs_repair"] for s in lag["samples"])
    # The official saver stores the whole thread again each turn: it grows faster than ours.
    growth = backends["growth"]
    assert growth["official-sqlite"]["bytes"][-1] > growth["ours-sqlite"]["bytes"][-1]
