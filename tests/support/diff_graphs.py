"""Graphs, random actions and a second-process reader for the differential tests of stored
state (test_stored_state.py): the same actions run on our checkpointers and on LangGraph's
`InMemorySaver`, and every state read is compared, types included."""

from __future__ import annotations

import contextlib
import random
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langchain_core.messages import (
    AIMessage,
    AnyMessage,
    BaseMessage,
    HumanMessage,
    RemoveMessage,
    ToolMessage,
)
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from pydantic import BaseModel

from tests.support.fresh import PROCESSES


class Item(BaseModel):
    name: str
    n: int
    tags: list[str] = []


def _extend(left: list[Any] | None, right: list[Any] | None) -> list[Any]:
    return [*(left or []), *(right or [])]


class DiffState(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]
    op: dict[str, Any]
    pair: tuple[int, int]
    tags: set[str]
    when: datetime
    item: Item
    nested: dict[str, Any]
    log: Annotated[list[Any], _extend]


def _step(state: DiffState) -> dict[str, Any]:
    """Does what the run's input says (the same on every checkpointer)."""
    op = state.get("op") or {}
    kind = op.get("kind")
    msgs = state.get("messages") or []
    out: dict[str, Any] = {}
    if kind == "append":
        calls = [{"name": "search", "args": {"q": op["text"][:12]}, "id": op["id"] + "c"}] \
            if op.get("call") else []
        out["messages"] = [AIMessage(content=op["text"], id=op["id"], tool_calls=calls)]
    elif kind == "human":
        out["messages"] = [HumanMessage(content=op["text"], id=op["id"])]
    elif kind == "replace" and msgs:
        old = msgs[op["k"] % len(msgs)]
        out["messages"] = [type(old)(content=op["text"], id=old.id,
                                     **({"tool_call_id": old.tool_call_id}
                                        if isinstance(old, ToolMessage) else {}))]
    elif kind == "remove" and msgs:
        out["messages"] = [RemoveMessage(id=msgs[op["k"] % len(msgs)].id)]
    elif kind == "mutate" and msgs:
        m = msgs[op["k"] % len(msgs)]
        m.content = f"{m.content} / {op['text']}"  # changed in place, and returned
        out["messages"] = [m]
    elif kind == "mutate_call":
        ai = [m for m in msgs if isinstance(m, AIMessage) and m.tool_calls]
        if ai:
            m = ai[op["k"] % len(ai)]
            m.tool_calls[0]["args"]["q"] = op["text"]  # a tool call changed in place
            out["messages"] = [m]
    elif kind == "values":
        out["pair"] = (op["k"], op["k"] + 1)
        out["tags"] = {op["text"][:5], "t"}
        out["when"] = datetime(2026, 1, 1, tzinfo=timezone.utc) + timedelta(minutes=op["k"])
        out["item"] = Item(name=op["text"][:8], n=op["k"], tags=["a", op["text"][:3]])
    elif kind == "nested":
        nested = state.get("nested") or {"inner": {"seen": []}, "count": 0}
        nested["inner"]["seen"].append(op["k"])  # changed in place, and returned
        nested["count"] = nested.get("count", 0) + 1
        out["nested"] = nested
    elif kind == "log":
        log = state.get("log") or []
        if log and isinstance(log[0], dict):
            log[0]["hits"] = log[0].get("hits", 0) + 1  # an item changed in place...
        out["log"] = [{"k": op["k"], "text": op["text"][:6]}, (op["k"], "t")]  # ...and appended
    return out


def _after(state: DiffState) -> dict[str, Any]:
    return {"log": [f"after {len(state.get('messages') or [])}"]}


def diff_graph() -> StateGraph:
    b = StateGraph(DiffState)
    b.add_node("step", _step)
    b.add_node("after", _after)
    b.add_edge(START, "step")
    b.add_edge("step", "after")
    b.add_edge("after", END)
    return b


class ToolState(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    ran: list[str]


def _agent(state: ToolState) -> dict[str, Any]:
    if any(isinstance(m, ToolMessage) for m in state["messages"]):
        return {"messages": [AIMessage("done", id="final")]}
    call = {"name": "search", "args": {"query": "query"}, "id": "call-1"}
    return {"messages": [AIMessage("", id="ai-1", tool_calls=[call])]}


def _tools(state: ToolState) -> dict[str, Any]:
    call = state["messages"][-1].tool_calls[0]  # type: ignore[union-attr]
    query = call["args"]["query"]
    return {"messages": [ToolMessage(f"results for {query}", tool_call_id=call["id"], id="tool-1")],
            "ran": [*state.get("ran", []), query]}


def approval_tools_graph() -> StateGraph:
    b = StateGraph(ToolState)
    b.add_node("agent", _agent)
    b.add_node("tools", _tools)
    b.add_edge(START, "agent")
    b.add_conditional_edges(
        "agent", lambda s: "tools" if s["messages"][-1].tool_calls else END)  # type: ignore[union-attr]
    b.add_edge("tools", "agent")
    return b



def canon(v: Any) -> Any:
    """A value as plain data that keeps every type: equal canon, equal value and types."""
    if isinstance(v, BaseMessage | BaseModel):
        return (type(v).__name__, canon(v.model_dump()))
    if isinstance(v, dict):
        return ("dict", [(canon(k), canon(x)) for k, x in v.items()])
    if isinstance(v, list | tuple):
        return (type(v).__name__, [canon(x) for x in v])
    if isinstance(v, set | frozenset):
        return (type(v).__name__, sorted(repr(canon(x)) for x in v))
    if isinstance(v, datetime):
        return ("datetime", v.isoformat())
    return (type(v).__name__, v)


def state_of(graph: Any, config: dict[str, Any]) -> Any:
    snap = graph.get_state(config)
    return canon(snap.values), list(snap.next)


WORDS = ["alpha", "beta", "gamma", "delta", "search", "weather", "paris", "tool", "plan", "answer"]


def random_op(rng: random.Random, n: int) -> dict[str, Any]:
    kind = rng.choice(["append", "append", "append", "human", "replace", "remove", "mutate",
                       "mutate", "mutate_call", "values", "nested", "log"])
    return {"kind": kind, "k": rng.randrange(1000), "id": f"m{n}-{rng.randrange(10**6)}",
            "text": " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 12))),
            "call": rng.random() < 0.4}


# -- the reader in a second process ------------------------------------------------------------


def diff_serde() -> Any:
    """Our strict serializer, told about the state's own model (LangGraph adds a graph's schema
    types only under LANGGRAPH_STRICT_MSGPACK; without it a strict serializer returns a
    blocked model's fields as a dict)."""
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    from langgraph_ckpt_ext.core.serde import _OWN_TYPES

    return JsonPlusSerializer(allowed_msgpack_modules=[*_OWN_TYPES, (__name__, "Item")])


def _open(spec: tuple[str, str, dict[str, Any]]) -> Any:
    from tests.support.savers import open_saver

    kind, tmp, options = spec
    return open_saver(kind, Path(tmp), serde=diff_serde(), **options).saver


def _serve(conn: Any, spec: tuple[str, str, dict[str, Any]]) -> None:
    saver = _open(spec)
    graph = diff_graph().compile(checkpointer=saver)
    try:
        while True:
            msg = conn.recv()
            if msg is None:
                break
            what, config = msg
            try:
                if what == "state":
                    conn.send(("ok", state_of(graph, config)))
                else:  # a graph of the edit-before-approve test, run on from here
                    g = approval_tools_graph().compile(checkpointer=saver,
                                                       interrupt_before=["tools"])
                    if what == "resume":
                        g.invoke(None, config)
                    snap = g.get_state(config)
                    conn.send(("ok", (canon(snap.values), list(snap.next))))
            except BaseException as exc:  # sent back: the test fails with it
                conn.send(("error", repr(exc)))
    finally:
        saver.close()


class Reader:
    """A checkpointer opened over the same storage in another Python process."""

    def __init__(self, kind: str, tmp: Path, options: dict[str, Any]) -> None:
        ctx = PROCESSES
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(child, (kind, str(tmp), options)),
                                daemon=True)
        self.proc.start()

    def ask(self, what: str, config: dict[str, Any]) -> Any:
        self.conn.send((what, config))
        if not self.conn.poll(120):
            raise TimeoutError("the reader process did not answer")
        status, value = self.conn.recv()
        if status != "ok":
            raise AssertionError(f"the reader process failed: {value}")
        return value

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.send(None)
        self.proc.join(30)
        if self.proc.is_alive():
            self.proc.kill()


if __name__ == "__main__":  # pragma: no cover
    sys.exit("imported by the tests")
