"""Benchmark: the first page of a thread's time-travel history, as the thread grows.

One thread of N checkpoints (N = 100, 1,000 and 3,000; 100 and 1,000 with --quick) is written by
a real compiled chat graph (`add_messages` plus a turn counter, deterministic fake replies, no
LLM) once to ours (`SQLiteCheckpointer`) and once to LangGraph's official `SqliteSaver`, each on
its own file; all sizes share those two files (one thread per size). The chat keeps the last
WINDOW messages (older ones are removed with `RemoveMessage`), so every checkpoint holds about
the same state and only the length of the thread changes with N.

After writing, both files are reopened by fresh savers (nothing cached in-process from the
writes, as for a UI that opens the thread later), and timed, best of ROUNDS, ours and official
interleaved within each round:
  - ours, first page: `history_page(ours, thread_id, size=20)` (values, next nodes, writes);
  - ours, metadata only: `list(history(ours, thread_id, metadata_only=True, limit=20))`;
  - official, first 20: `list(islice(graph.get_state_history(config), 20))` on `SqliteSaver`;
  - references: the same islice on a graph compiled with ours, and the official
    `get_state_history(config, limit=20)` (the limit goes down to the saver's SQL);
  - full walks: `list(history(ours, thread_id))`, `list(get_state_history(config))` on ours and
    on the official saver, and (reference) the async `ahistory(ours, thread_id)` stream.
Checks: both savers hold N checkpoints for the thread, and ours' first page has the same steps,
turn counters and message ids as the official first 20 snapshots.

Run: `python benchmarks/bench_history.py [--quick] [--rounds R] [--sizes 100,1000,3000]`.
Everything goes to a temporary directory, removed at exit. The exit code is 0 unless a check
fails.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import operator
import platform
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, RemoveMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.graph.state import CompiledStateGraph
from langgraph.version import __version__ as langgraph_version

from langgraph_ckpt_ext import SQLiteCheckpointer
from langgraph_ckpt_ext.timetravel import ahistory, history, history_page

Saver = BaseCheckpointSaver[Any]
Graph = CompiledStateGraph[Any, Any, Any, Any]
PAGE = 20
WINDOW = 12  # messages kept in the state
FLAT = 1.5  # "flat": the largest size's time within this factor of the smallest's

# -- the graph ---------------------------------------------------------------------------------


class ChatState(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]
    turns: Annotated[int, operator.add]
    steps: int  # replies still to make in this turn


def respond(state: ChatState) -> ChatState:
    messages = state["messages"]
    last = messages[-1]
    reply = AIMessage(content=f"reply to {last.content}: " + "lorem ipsum " * 6,
                      id=f"{last.id}:r{state.get('steps', 1)}")
    drop = [RemoveMessage(id=str(m.id)) for m in messages[: max(0, len(messages) + 1 - WINDOW)]]
    return {"messages": [*drop, reply], "turns": 1, "steps": state.get("steps", 1) - 1}


def route(state: ChatState) -> str:
    return "respond" if state.get("steps", 0) > 0 else END


def build_graph(saver: Saver) -> Graph:
    builder = StateGraph(ChatState)
    builder.add_node("respond", respond)
    builder.add_edge(START, "respond")
    builder.add_conditional_edges("respond", route, ["respond", END])
    return builder.compile(checkpointer=saver)


def config_of(tid: str) -> RunnableConfig:
    return {"configurable": {"thread_id": tid}}


def fill(graph: Graph, tid: str, n: int) -> None:
    """Write exactly n checkpoints: a turn with k replies makes 2 + k (input, start, replies);
    the first turn takes the remainder of n / 3, every other one makes 3."""
    turns, extra = divmod(n, 3)
    for turn in range(turns):
        human = HumanMessage(content=f"question {turn} " + "dolor sit amet " * 4,
                             id=f"{tid}:{turn}")
        graph.invoke({"messages": [human], "steps": 1 + (extra if turn == 0 else 0)},
                     config_of(tid))


# -- timing ------------------------------------------------------------------------------------


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    gc.collect()
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def run_size(ours: SQLiteCheckpointer, official: SqliteSaver, n: int, rounds: int) -> dict[str, float]:
    tid = f"hist-{n}"
    cfg = config_of(tid)
    g_ours, g_off = build_graph(ours), build_graph(official)
    probes: dict[str, Callable[[], Any]] = {
        "ours_page": lambda: history_page(ours, tid, size=PAGE),
        "off_islice": lambda: list(itertools.islice(g_off.get_state_history(cfg), PAGE)),
        "ours_meta": lambda: list(history(ours, tid, metadata_only=True, limit=PAGE)),
        "ours_islice": lambda: list(itertools.islice(g_ours.get_state_history(cfg), PAGE)),
        "off_limit": lambda: list(g_off.get_state_history(cfg, limit=PAGE)),
        "ours_full": lambda: list(history(ours, tid)),
        "ours_afull": lambda: asyncio.run(collect(ours, tid)),
        "off_full": lambda: list(g_off.get_state_history(cfg)),
        "ours_gsh_full": lambda: list(g_ours.get_state_history(cfg)),
    }
    best = dict.fromkeys(probes, float("inf"))
    last: dict[str, Any] = {}
    for _ in range(rounds):
        for name, fn in probes.items():  # ours and official alternate
            seconds, last[name] = timed(fn)
            best[name] = min(best[name], seconds)
    check(n, last)
    return {k: v * 1e3 for k, v in best.items()}


async def collect(saver: Saver, tid: str) -> list[Any]:
    return [e async for e in ahistory(saver, tid)]


def check(n: int, out: dict[str, Any]) -> None:
    """Same thread length on both savers; ours' first page is the official first 20."""
    counts = {"ours": len(out["ours_full"]), "official": len(out["off_full"]),
              "ours via get_state_history": len(out["ours_gsh_full"]),
              "ours via ahistory": len(out["ours_afull"])}
    if set(counts.values()) != {n}:
        raise SystemExit(f"N={n}: checkpoints stored {counts}, expected {n} each")
    page, snaps = out["ours_page"], out["off_islice"]
    if len(page.entries) != PAGE or len(snaps) != PAGE or (n > PAGE) != (page.before is not None):
        raise SystemExit(f"N={n}: first page of {len(page.entries)} (before={page.before}), "
                         f"official {len(snaps)}")
    for e, s, m in zip(page.entries, snaps, out["ours_meta"], strict=True):
        ours_view = (e.step, e.values.get("turns"), [x.id for x in e.values.get("messages", [])])
        off_view = (s.metadata["step"], s.values.get("turns"),
                    [x.id for x in s.values.get("messages", [])])
        if ours_view != off_view or m.checkpoint_id != e.checkpoint_id:
            raise SystemExit(f"N={n}: first page differs: ours {ours_view}, official {off_view}")
        if e.next != tuple(sorted(s.next)):
            raise SystemExit(f"N={n}: next differs: ours {e.next}, official {s.next}")


# -- main --------------------------------------------------------------------------------------


def growth(times: Sequence[float]) -> float:
    return times[-1] / times[0]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sizes", default="100,1000,3000",
                   help="thread lengths in checkpoints, comma-separated (each >= 3)")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--quick", action="store_true", help="sizes 100 and 1000, 3 rounds")
    args = p.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.quick:
        sizes, args.rounds = [s for s in sizes if s <= 1000] or sizes[:1], 3
    if any(s < 3 for s in sizes):
        p.error("every size must be at least 3 checkpoints")
    print(f"python {platform.python_version()}, langgraph {langgraph_version}, sqlite "
          f"{sqlite3.sqlite_version}; one thread per size N = {', '.join(map(str, sizes))}; "
          f"page of {PAGE}, state window {WINDOW} messages; best of {args.rounds} rounds, "
          f"ours and official interleaved\n")
    results: dict[int, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="lgckpt-hist-") as tmp:
        ours_path, off_path = Path(tmp) / "ours.db", Path(tmp) / "official.db"
        t0 = time.perf_counter()
        with SQLiteCheckpointer(ours_path) as ours, SqliteSaver.from_conn_string(
            str(off_path)
        ) as official:
            for n in sizes:
                fill(build_graph(ours), f"hist-{n}", n)
                fill(build_graph(official), f"hist-{n}", n)
        size_mb = {k: f.stat().st_size / 1e6 for k, f in (("ours", ours_path), ("official", off_path))}
        print(f"written in {time.perf_counter() - t0:.1f} s ({sum(sizes)} checkpoints per saver); "
              f"files: ours {size_mb['ours']:.1f} MB, official {size_mb['official']:.1f} MB\n")
        # Fresh savers: nothing kept in-process from the writes.
        with SQLiteCheckpointer(ours_path) as ours, SqliteSaver.from_conn_string(
            str(off_path)
        ) as official:
            for n in sizes:
                results[n] = run_size(ours, official, n, args.rounds)

    print(f"first page of {PAGE} (ms)")
    print(f"{'N':>6} {'ours page':>10} {'ours meta':>10} {'official':>10} {'off/ours':>9}"
          f" | {'ours gsh':>9} {'off limit':>10}")
    for n, r in results.items():
        print(f"{n:>6} {r['ours_page']:>10.2f} {r['ours_meta']:>10.2f} {r['off_islice']:>10.2f} "
              f"{r['off_islice'] / r['ours_page']:>8.1f}x | {r['ours_islice']:>9.2f} "
              f"{r['off_limit']:>10.2f}")
    print("  ours page: history_page(size=20); ours meta: history(metadata_only=True, limit=20);\n"
          "  official: islice(get_state_history(config), 20) on SqliteSaver; references:\n"
          "  ours gsh: the same islice on a graph compiled with ours; off limit:\n"
          "  get_state_history(config, limit=20) on SqliteSaver\n")
    print("full history walk (ms)")
    print(f"{'N':>6} {'ours history':>13} {'official gsh':>13} {'off/ours':>9} | {'ours gsh':>9} "
          f"{'ours ahistory':>14}")
    for n, r in results.items():
        print(f"{n:>6} {r['ours_full']:>13.1f} {r['off_full']:>13.1f} "
              f"{r['off_full'] / r['ours_full']:>8.1f}x | {r['ours_gsh_full']:>9.1f} "
              f"{r['ours_afull']:>14.1f}")
    print("  ours history: list(history(ours, thread_id)) (sync, a page of 32 at a time);\n"
          "  gsh: list(get_state_history(config)); ours ahistory: every entry of\n"
          "  `async for e in ahistory(ours, thread_id)` (one stream), under asyncio.run\n")

    lo, hi = sizes[0], sizes[-1]
    col = {k: [results[n][k] for n in sizes] for k in results[lo]}
    for key, label in (("ours_page", "ours first page"), ("ours_meta", "ours metadata-only page")):
        g = growth(col[key])
        verdict = "flat" if g <= FLAT else "NOT flat"
        print(f"{label}: {col[key][0]:.2f} ms at N={lo} -> {col[key][-1]:.2f} ms at N={hi} "
              f"({g:.2f}x for {hi / lo:.0f}x the checkpoints): {verdict} (threshold {FLAT}x)")
    print(f"official islice(get_state_history, 20): {col['off_islice'][0]:.2f} ms -> "
          f"{col['off_islice'][-1]:.2f} ms ({growth(col['off_islice']):.1f}x); with limit=20: "
          f"{growth(col['off_limit']):.2f}x; full walk: {growth(col['off_full']):.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
