"""Stored state is exactly what LangGraph's own saver stores, whatever callers do with objects.

Randomized runs (appends, replace-by-id, `RemoveMessage`, messages and tool calls changed in
place by a node or after `get_state` and written back with `update_state`, forks from old
checkpoints, tuples, sets, datetimes, pydantic models, nested dicts) go through each of our
checkpointers and through LangGraph's `InMemorySaver`. After every action the state is read
three ways and compared, types included: by this process, by a checkpointer opened over the
same storage in another process (in-memory storage: another checkpointer object), and from
`InMemorySaver`. Runs use `durability="sync"`: with "async" LangGraph saves a checkpoint while
the next step runs, so a node that changes a value in place races that save on every saver,
LangGraph's own included. A failure names its seed; replay one with `LGCKPT_DIFF_SEED=<seed>`, run more
with `LGCKPT_DIFF_SEEDS=<n>` (a multiplier of each variant's default count).
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver

from langgraph_ckpt_ext import ReplicatedCheckpointer, SmartCheckpointer
from langgraph_ckpt_ext.core.saver import StoreCheckpointer
from tests.support.diff_graphs import (
    Reader,
    approval_tools_graph,
    canon,
    diff_graph,
    diff_serde,
    random_op,
    state_of,
)
from tests.support.savers import open_saver, params

# variant -> seeds by default (the embedded default gets the most; the suite's time: about
# 0.3 s a seed, 0.5 s on a server; LGCKPT_DIFF_SEEDS=3 for a deeper run)
VARIANTS = {
    "memory": 40,
    "sqlite": 80,
    "postgres": 25,
    "redis": 25,
    "smart:sqlite": 25,
    "replicated:postgres+sqlite": 15,
    "replicated-quorum:sqlite+redis": 15,
}
STEPS = 8


class Setup:
    """A variant's checkpointer, what reads its storage afresh, and how to settle writes."""

    def __init__(self, variant: str, tmp: Path) -> None:
        self.variant = variant
        self.cleanups: list[Callable[[], None]] = []
        kind, _, rest = variant.partition(":")
        if kind == "memory":
            inner = open_saver("memory", tmp, serde=diff_serde()).saver
            self.saver: Any = inner
            fresh = StoreCheckpointer(inner._store, serde=diff_serde())
            self.fresh_graph = diff_graph().compile(checkpointer=fresh)
            self.reader = None
            self.primary: StoreCheckpointer = inner
            return
        if kind in ("smart", "replicated", "replicated-quorum"):
            backend, _, replica_kind = rest.partition("+")
        else:
            backend, replica_kind = kind, ""
        primary_h = open_saver(backend, tmp, serde=diff_serde())
        self.primary = primary = primary_h.saver
        self.cleanups.append(primary_h.cleanup)
        if kind == "smart":
            self.saver = SmartCheckpointer(primary)
        elif kind.startswith("replicated"):
            rtmp = tmp / "replica"
            rtmp.mkdir()
            replica_h = open_saver(replica_kind, rtmp, serde=diff_serde())
            self.replica = replica = replica_h.saver
            self.cleanups.append(replica_h.cleanup)
            mode = "quorum" if kind == "replicated-quorum" else "async"
            self.saver = ReplicatedCheckpointer(primary, [replica], consistency=mode)
        else:
            self.saver = primary
        self.reader = Reader(backend, tmp, primary_h.options())

    def settle(self) -> None:
        flush = getattr(self.saver, "flush", None)
        if flush is not None:
            flush()

    def fresh(self, config: dict[str, Any]) -> Any:
        if self.reader is None:
            return state_of(self.fresh_graph, config)
        return self.reader.ask("state", config)

    def close(self) -> None:
        if self.reader is not None:
            self.reader.close()
        self.saver.close()
        if self.saver is not self.primary:
            self.primary.close()
            replica = getattr(self, "replica", None)
            if replica is not None:
                replica.close()
        for fn in self.cleanups:
            fn()


@pytest.fixture(params=params(list(VARIANTS)))
def variant_setup(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Setup]:
    s = Setup(request.param, tmp_path)
    yield s
    s.close()


def _seeds(variant: str) -> list[int]:
    one = os.environ.get("LGCKPT_DIFF_SEED")
    if one is not None:
        return [int(one)]
    times = float(os.environ.get("LGCKPT_DIFF_SEEDS", "1"))
    return list(range(int(VARIANTS[variant] * times)))


def _edit(graph: Any, config: dict[str, Any], op: dict[str, Any]) -> None:
    """The edit-before-approve pattern: change a message got from `get_state` in place, then
    write it back (replaced by id)."""
    msgs = graph.get_state(config).values.get("messages") or []
    if not msgs:
        return
    m = msgs[op["k"] % len(msgs)]
    if isinstance(m, AIMessage) and m.tool_calls and op["call"]:
        m.tool_calls[0]["args"]["q"] = op["text"]
    else:
        m.content = op["text"]
    graph.update_state(config, {"messages": m})


def _scribble(graph: Any, config: dict[str, Any], op: dict[str, Any]) -> None:
    """Change whatever a read returned, and write nothing back."""
    values = graph.get_state(config).values
    for m in values.get("messages") or []:
        m.content = "scribbled"
    (values.get("messages") or []).append(HumanMessage("not stored"))
    if isinstance(values.get("nested"), dict):
        values["nested"]["scribbled"] = True
    if isinstance(values.get("log"), list):
        values["log"].clear()


def _act(rng: random.Random, graph: Any, ref: Any, config: dict[str, Any], n: int) -> str:
    action = rng.choice(["run", "run", "run", "run", "edit", "values", "fork", "scribble"])
    op = random_op(rng, n)
    for g in (graph, ref):
        if action == "run":
            g.invoke({"op": op}, config, durability="sync")
        elif action == "edit":
            _edit(g, config, op)
        elif action == "values":
            g.update_state(config, {"pair": (op["k"], 7), "tags": {"edited"},
                                    "nested": {"inner": {"seen": [op["k"]]}, "count": -1}})
        elif action == "fork":
            history = list(g.get_state_history(config))
            g.invoke({"op": op}, history[op["k"] % len(history)].config, durability="sync")
        else:
            _scribble(g, config, op)
    return f"{action} {op}"


def _history(graph: Any, config: dict[str, Any]) -> list[Any]:
    return [(canon(s.values), list(s.next), s.metadata.get("step"))
            for s in graph.get_state_history(config)]


def _run_seed(setup: Setup, seed: int) -> None:
    rng = random.Random(seed)
    graph = diff_graph().compile(checkpointer=setup.saver)
    ref = diff_graph().compile(checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": f"s{seed}"}}
    op = random_op(rng, 0)
    for g in (graph, ref):  # an input of its own each: a node may change it in place
        g.invoke({"messages": [HumanMessage("hello", id="h0")], "op": dict(op)}, config,
                 durability="sync")
    done = ["start"]
    for n in range(1, STEPS + 1):
        done.append(_act(rng, graph, ref, config, n))
        where = f"seed {seed} of {setup.variant}, after: " + " | ".join(done)
        want = state_of(ref, config)
        assert state_of(graph, config) == want, f"this process differs from InMemorySaver; {where}"
        setup.settle()
        assert setup.fresh(config) == want, f"a fresh reader differs from InMemorySaver; {where}"
    assert _history(graph, config) == _history(ref, config), f"history differs; seed {seed}"


def test_state_read_anywhere_equals_langgraphs(variant_setup: Setup) -> None:
    for seed in _seeds(variant_setup.variant):
        _run_seed(variant_setup, seed)
    replica = getattr(variant_setup, "replica", None)
    if replica is not None:  # what the replica stored reads back the same too
        variant_setup.settle()
        for seed in _seeds(variant_setup.variant)[:5]:
            config = {"configurable": {"thread_id": f"s{seed}"}}
            graph = diff_graph().compile(checkpointer=variant_setup.saver)
            mirror = diff_graph().compile(checkpointer=replica)
            assert _history(mirror, config) == _history(graph, config), f"replica, seed {seed}"


# -- edit before approve, read and resumed by another process ----------------------------------

EDIT_VARIANTS = ["memory", "sqlite", "postgres", "redis", "smart:sqlite",
                 "replicated:postgres+sqlite"]


@pytest.mark.parametrize("variant", params(EDIT_VARIANTS))
def test_edit_before_approve_survives_a_restart(variant: str, tmp_path: Path) -> None:
    setup = Setup(variant, tmp_path)
    try:
        g = approval_tools_graph().compile(checkpointer=setup.saver, interrupt_before=["tools"])
        c = {"configurable": {"thread_id": "approve"}}
        g.invoke({"messages": [HumanMessage("weather?", id="h")]}, c)
        last = g.get_state(c).values["messages"][-1]
        assert last.tool_calls[0]["args"]["query"] == "query"
        last.tool_calls[0]["args"]["query"] = "a different query"
        g.update_state(c, {"messages": last})
        setup.settle()
        edited = g.get_state(c).values["messages"][-1].tool_calls[0]["args"]["query"]
        assert edited == "a different query"
        if setup.reader is None:  # in-memory storage: another checkpointer over it
            other = approval_tools_graph().compile(
                checkpointer=StoreCheckpointer(setup.primary._store, serde=diff_serde()),
                interrupt_before=["tools"])
            values = other.get_state(c).values
            assert values["messages"][-1].tool_calls[0]["args"]["query"] == "a different query"
            other.invoke(None, c)
            ran = other.get_state(c).values["ran"]
        else:
            values, nxt = setup.reader.ask("approval", c)
            assert nxt == ["tools"]
            assert "a different query" in repr(values) and "'query': 'query'" not in repr(values)
            values, nxt = setup.reader.ask("resume", c)
            assert nxt == [] and "results for a different query" in repr(values)
            ran = [x[1] for x in dict(values[1])[("str", "ran")][1]]
        assert ran == ["a different query"]
    finally:
        setup.close()


_STRICT_SCRIPT = """
import sys
from tests.support.diff_graphs import diff_graph
from langgraph_ckpt_ext import SQLiteCheckpointer, SmartCheckpointer
path = sys.argv[1]
for name, cp in [("plain", SQLiteCheckpointer(path + "/a.db")),
                 ("smart", SmartCheckpointer(SQLiteCheckpointer(path + "/b.db")))]:
    g = diff_graph().compile(checkpointer=cp)
    c = {"configurable": {"thread_id": "t"}}
    g.invoke({"op": {"kind": "values", "k": 1, "text": "hello", "id": "x", "call": False}}, c)
    print(name, type(g.get_state(c).values["item"]).__name__)
    cp.close()
"""


def test_graph_schema_types_read_back_under_strict_msgpack(tmp_path: Path) -> None:
    """Under LANGGRAPH_STRICT_MSGPACK, LangGraph allows a graph's own schema types on the
    checkpointer it compiles with; a SmartCheckpointer passes that on to its inner one."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "LANGGRAPH_STRICT_MSGPACK": "true", "PYTHONPATH": str(root)}
    out = subprocess.run([sys.executable, "-c", _STRICT_SCRIPT, str(tmp_path)], env=env,
                         capture_output=True, text=True, timeout=120, cwd=root)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["plain", "Item", "smart", "Item"]
