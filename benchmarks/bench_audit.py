"""Benchmark: what the audit trail (`audit=True`) costs a put, and what `verify` costs.

Per backend, three checkpointers, audit off, on (unkeyed sha256 chain) and keyed (on, sealed
with HMAC-SHA256 under `audit_keys`), each over fresh storage of its own (auditing is a setting
of the store: one audited storage would make them all seal):

1. Graph turns: a compiled chat graph (START -> agent -> END, messages growing by two per turn,
   three checkpoints per turn), `ainvoke` on one thread per checkpointer, continued across
   rounds.
2. Raw puts: `aput` of a mid-size checkpoint (a list of 24 messages, about 12 KB, growing by one
   message per put, plus a counter and a small dict) on a chain of one thread per checkpointer.
3. `averify` of a 200-checkpoint chat thread written with audit on (and keyed), by a
   checkpointer that did not write it.

Rounds interleave the checkpointers (the order reverses every other round); the best round of
each is printed, with the ratios on/off and keyed/on.

Run: `python benchmarks/bench_audit.py --backend sqlite|postgres|redis|all [--quick]`.
Servers: PostgreSQL at --dsn, Redis at --redis-url; each run uses a fresh schema / key prefix
and drops it afterwards (PostgreSQL: DROP SCHEMA; Redis: SCAN MATCH <prefix>:* and UNLINK).
"""

from __future__ import annotations

import argparse
import asyncio
import operator
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import Checkpoint
from langgraph.checkpoint.base.id import uuid6
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from places import drop, open_saver

from langgraph_ckpt_ext.core.keys import StaticKeys, new_key
from langgraph_ckpt_ext.core.saver import StoreCheckpointer

KINDS = ("off", "on", "keyed")


class ChatState(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    turns: Annotated[int, operator.add]


def chat_graph() -> StateGraph:
    def agent(state: ChatState) -> dict[str, Any]:
        last = state["messages"][-1].content
        return {"messages": [AIMessage(f"echo: {last} " + "x" * 300)], "turns": 1}

    g = StateGraph(ChatState)
    g.add_node("agent", agent)
    g.add_edge(START, "agent")
    g.add_edge("agent", END)
    return g


class RawThread:
    """A chain of raw puts on one thread: each checkpoint the previous one plus a message."""

    def __init__(self, saver: StoreCheckpointer, thread_id: str) -> None:
        self.saver = saver
        self.config: RunnableConfig = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
        self.messages: list[Any] = [
            (HumanMessage if i % 2 else AIMessage)(f"message {i} " + "y" * 450, id=str(uuid.uuid4()))
            for i in range(24)
        ]
        self.versions: dict[str, Any] = {}
        self.step = 0

    async def put(self) -> None:
        self.step += 1
        self.messages = [*self.messages, AIMessage(f"step {self.step}", id=str(uuid.uuid4()))]
        new = {ch: self.saver.get_next_version(self.versions.get(ch)) for ch in ("messages", "n")}
        if not self.versions:
            new["profile"] = self.saver.get_next_version(None)
        self.versions.update(new)
        checkpoint: Checkpoint = {
            "v": 4, "id": str(uuid6()), "ts": "2026-01-01T00:00:00+00:00",
            "channel_values": {"messages": self.messages, "n": self.step,
                               "profile": {"user": "u-1", "plan": "pro", "tags": ["a", "b"]}},
            "channel_versions": dict(self.versions), "versions_seen": {"agent": dict(new)},
            "updated_channels": sorted(new),
        }
        metadata: Any = {"source": "loop", "step": self.step, "parents": {}}
        self.config = await self.saver.aput(self.config, checkpoint, metadata, new)


async def best_rate(
    rounds: int, n: int, work: dict[str, Callable[[], Awaitable[None]]]
) -> dict[str, float]:
    """Operations per second of each named workload (best round), rounds interleaved."""
    best = dict.fromkeys(work, 0.0)
    names = list(work)
    for r in range(rounds):
        for name in names if r % 2 == 0 else reversed(names):
            start = time.perf_counter()
            for _ in range(n):
                await work[name]()
            best[name] = max(best[name], n / (time.perf_counter() - start))
    return best


async def run(backend: str, args: argparse.Namespace) -> dict[str, float]:
    tmp = tempfile.TemporaryDirectory()
    places = [str(Path(tmp.name) / f"bench-{name}.db") if backend == "sqlite"
              else f"lgxaudit_{uuid.uuid4().hex[:8]}" for name in KINDS]
    keys = StaticKeys({"bench": new_key()})
    options: dict[str, dict[str, Any]] = {
        "off": {"audit": False}, "on": {"audit": True}, "keyed": {"audit": True, "audit_keys": keys}}
    savers: list[StoreCheckpointer] = []
    try:
        by_kind = {k: open_saver(backend, p, args, **options[k])
                   for k, p in zip(KINDS, places, strict=True)}
        savers += by_kind.values()
        res: dict[str, float] = {}

        graphs = {name: chat_graph().compile(checkpointer=s) for name, s in by_kind.items()}
        turn = dict.fromkeys(KINDS, 0)

        def chat(name: str) -> Callable[[], Awaitable[None]]:
            async def one() -> None:
                turn[name] += 1
                await graphs[name].ainvoke(
                    {"messages": [HumanMessage(f"turn {turn[name]}")]},
                    {"configurable": {"thread_id": f"chat-{name}"}},
                )
            return one

        rates = await best_rate(args.rounds, args.turns, {k: chat(k) for k in KINDS})
        for k in KINDS:
            res[f"turns_{k}"] = rates[k]
        res["messages"] = 2.0 * turn["on"]

        raw = {k: RawThread(s, f"raw-{k}") for k, s in by_kind.items()}
        rates = await best_rate(args.rounds, args.puts, {k: t.put for k, t in raw.items()})
        for k in KINDS:
            res[f"puts_{k}"] = rates[k]

        # verify: a 200-checkpoint thread, by a checkpointer that did not write it
        for kind, place in zip(KINDS[1:], places[1:], strict=True):
            for i in range(67):
                await graphs[kind].ainvoke({"messages": [HumanMessage(f"v {i}")]},
                                           {"configurable": {"thread_id": "verify"}})
            fresh = open_saver(backend, place, args, **options[kind])
            savers.append(fresh)
            best = float("inf")
            for _ in range(args.rounds):
                start = time.perf_counter()
                report = await fresh.averify("verify")
                best = min(best, time.perf_counter() - start)
                assert report.ok, str(report)
            res["verify_checked"], res[f"verify_s_{kind}"] = float(report.checked), best
            for name in (f"chat-{kind}", f"raw-{kind}"):
                assert (await fresh.averify(name)).ok
        return res
    finally:
        for s in savers:
            await s.aclose()
        for p in places:
            await drop(backend, p, args)
        tmp.cleanup()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--backend", default="all", choices=["sqlite", "postgres", "redis", "all"])
    p.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/test")
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    p.add_argument("--turns", type=int, default=40, help="graph turns per round")
    p.add_argument("--puts", type=int, default=400, help="raw puts per round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="15 turns, 150 puts, 3 rounds")
    args = p.parse_args()
    if args.quick:
        args.turns, args.puts, args.rounds = 15, 150, 3
    backends = ["sqlite", "postgres", "redis"] if args.backend == "all" else [args.backend]
    print(f"python {sys.version.split()[0]}; best of {args.rounds} interleaved rounds; graph: "
          f"{args.turns} turns per round (3 puts each), raw: {args.puts} puts per round")
    for backend in backends:
        r = asyncio.run(run(backend, args))
        print(f"\n[{backend}]")
        print(f"  chat graph (to {r['messages']:.0f} messages): off {r['turns_off']:.0f} turns/s "
              f"({3 * r['turns_off']:.0f} puts/s), on {r['turns_on']:.0f} turns/s, keyed "
              f"{r['turns_keyed']:.0f} turns/s; on/off {r['turns_on'] / r['turns_off']:.2f}, "
              f"keyed/on {r['turns_keyed'] / r['turns_on']:.2f}")
        print(f"  raw aput (~12 KB checkpoint): off {r['puts_off']:.0f} puts/s, on "
              f"{r['puts_on']:.0f} puts/s, keyed {r['puts_keyed']:.0f} puts/s; on/off "
              f"{r['puts_on'] / r['puts_off']:.2f}, keyed/on {r['puts_keyed'] / r['puts_on']:.2f}")
        for kind in KINDS[1:]:
            s = r[f"verify_s_{kind}"]
            print(f"  verify {r['verify_checked']:.0f} checkpoints ({kind}): {1000 * s:.1f} ms "
                  f"({r['verify_checked'] / s:.0f} checkpoints/s)")


if __name__ == "__main__":
    main()
