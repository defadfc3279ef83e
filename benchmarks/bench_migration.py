"""Benchmark: what state-schema migration costs, per backend.

1. Threads written by a v1 graph (THREADS threads x TURNS turns, real compiled graph, no chain),
   read back by a checkpointer given the v1 -> v3 chain:
   - lazy upgrade: `aget_tuple` of each thread's latest checkpoint, upgraded on read, against
     the same read once the thread is migrated (no upgrade needed) and against a checkpointer
     with no chain at all (the floor). Ratios printed; reads interleaved, best of ROUNDS.
2. Eager migration: `amigrate_threads(include_unstamped=True)` of all of them: threads/s and
   checkpoints/s; then a second run (nothing to do) for its scan cost.

Run: `python benchmarks/bench_migration.py --backend sqlite|postgres|redis|all [--quick]`.
Servers: PostgreSQL at --dsn, Redis at --redis-url; each run uses a fresh schema / key prefix
and drops it afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import operator
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, AnyMessage, BaseMessage, HumanMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from places import drop, open_saver

from langgraph_ckpt_ext import SchemaChain
from langgraph_ckpt_ext.core.saver import StoreCheckpointer


class V1(TypedDict, total=False):
    messages: Annotated[list[dict[str, str]], operator.add]
    objective: str
    turns: Annotated[int, operator.add]


class V3(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]
    goal: str
    priority: str
    turns: Annotated[int, operator.add]


def v1_to_v2(values: dict[str, Any]) -> dict[str, Any]:
    if "objective" in values:
        values["goal"] = values.pop("objective")
    return values


def v2_to_v3(values: dict[str, Any]) -> dict[str, Any]:
    def msg(m: Any) -> Any:
        if not isinstance(m, dict):
            return m
        cls = HumanMessage if m["role"] == "human" else AIMessage
        return cls(content=m["text"], id=m["id"])

    if "messages" in values:
        values["messages"] = [msg(m) for m in values["messages"]]
    values.setdefault("priority", "normal")
    return values


CHAIN = SchemaChain(current=3, upcasters={1: v1_to_v2, 2: v2_to_v3}, name="bench")


def v1_graph() -> Any:
    def respond(state: V1) -> dict[str, Any]:
        text = state["messages"][-1]["text"]
        reply = {"id": str(uuid.uuid4()), "role": "ai", "text": f"echo: {text} " + "x" * 200}
        return {"messages": [reply], "turns": 1, "objective": state.get("objective") or text}

    g = StateGraph(V1)
    g.add_node("respond", respond)
    g.add_edge(START, "respond")
    g.add_edge("respond", END)
    return g


async def best_read_us(saver: StoreCheckpointer, tids: list[str], rounds: int) -> float:
    """Mean microseconds per `aget_tuple` of a thread's latest checkpoint (best round)."""
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for tid in tids:
            tup = await saver.aget_tuple({"configurable": {"thread_id": tid}})
            assert tup is not None
        best = min(best, (time.perf_counter() - start) / len(tids))
    return best * 1e6


async def run(backend: str, args: argparse.Namespace) -> dict[str, float]:
    tmp = tempfile.TemporaryDirectory()
    place = (str(Path(tmp.name) / "bench.db") if backend == "sqlite"
             else f"lgxmig_{uuid.uuid4().hex[:8]}")
    tids = [f"t{i:05}" for i in range(args.threads)]
    try:
        v1 = open_saver(backend, place, args, schema_chain=None)
        graph = v1_graph().compile(checkpointer=v1)
        for tid in tids:
            config = {"configurable": {"thread_id": tid}}
            for turn in range(args.turns):
                msg = {"id": str(uuid.uuid4()), "role": "human", "text": f"turn {turn}"}
                await graph.ainvoke({"messages": [msg]}, config)
        await v1.aclose()

        lazy = open_saver(backend, place, args, schema_chain=CHAIN)
        plain = open_saver(backend, place, args, schema_chain=None)
        sample = tids[: args.sample]
        tup = await lazy.aget_tuple({"configurable": {"thread_id": sample[0]}})
        assert tup is not None and all(
            isinstance(m, BaseMessage) for m in tup.checkpoint["channel_values"]["messages"]
        )
        # interleave: upgrade-on-read and no-chain reads of the same v1 rows
        upgrade_us, floor_us = [], []
        for _ in range(args.rounds):
            upgrade_us.append(await best_read_us(lazy, sample, 1))
            floor_us.append(await best_read_us(plain, sample, 1))

        report = await lazy.amigrate_threads(include_unstamped=True)  # written with no chain
        assert report.threads_migrated == len(tids), report.summary()
        again = await lazy.amigrate_threads()
        assert again.checkpoints_migrated == 0

        migrated_us = []
        for _ in range(args.rounds):
            migrated_us.append(await best_read_us(lazy, sample, 1))
        await lazy.aclose()
        await plain.aclose()
        res = {
            "threads": float(len(tids)),
            "checkpoints": float(report.checkpoints_migrated),
            "eager_threads_per_s": len(tids) / report.seconds,
            "eager_checkpoints_per_s": report.checkpoints_migrated / report.seconds,
            "rescan_s": again.seconds,
            "get_tuple_upgrade_us": min(upgrade_us),
            "get_tuple_migrated_us": min(migrated_us),
            "get_tuple_no_chain_us": min(floor_us),
        }
        res["lazy_ratio_vs_migrated"] = res["get_tuple_upgrade_us"] / res["get_tuple_migrated_us"]
        res["lazy_ratio_vs_no_chain"] = res["get_tuple_upgrade_us"] / res["get_tuple_no_chain_us"]
        return res
    finally:
        await drop(backend, place, args)
        tmp.cleanup()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--backend", default="sqlite", choices=["sqlite", "postgres", "redis", "all"])
    p.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/test")
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    p.add_argument("--threads", type=int, default=300)
    p.add_argument("--turns", type=int, default=10)
    p.add_argument("--sample", type=int, default=100, help="threads read per latency round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="60 threads x 4 turns, 3 rounds")
    args = p.parse_args()
    if args.quick:
        args.threads, args.turns, args.rounds, args.sample = 60, 4, 3, 30
    args.sample = min(args.sample, args.threads)
    backends = ["sqlite", "postgres", "redis"] if args.backend == "all" else [args.backend]
    print(f"python {sys.version.split()[0]}; {args.threads} threads x {args.turns} turns "
          f"(v1 graph), chain v1 -> v3; get_tuple: mean of {args.sample} threads, best of "
          f"{args.rounds} rounds")
    for backend in backends:
        r = asyncio.run(run(backend, args))
        print(f"\n[{backend}]")
        print(f"  eager migration: {int(r['checkpoints'])} checkpoints of {int(r['threads'])} "
              f"threads: {r['eager_threads_per_s']:.0f} threads/s, "
              f"{r['eager_checkpoints_per_s']:.0f} checkpoints/s; a second run (nothing to do) "
              f"{r['rescan_s']:.2f} s")
        print(f"  get_tuple, upgraded on read: {r['get_tuple_upgrade_us']:.0f} us")
        print(f"  get_tuple, after migration:  {r['get_tuple_migrated_us']:.0f} us")
        print(f"  get_tuple, no chain:         {r['get_tuple_no_chain_us']:.0f} us")
        print(f"  lazy upgrade / migrated read: {r['lazy_ratio_vs_migrated']:.2f}x; "
              f"/ no-chain read: {r['lazy_ratio_vs_no_chain']:.2f}x")


if __name__ == "__main__":
    main()
