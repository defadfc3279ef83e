"""One small agent at two versions of its state schema, and the chain between them.

v1: `objective`, and messages as dicts `{"id", "role", "text"}` appended with `operator.add`.
v2: `objective` renamed `goal`.
v3: messages are LangChain messages (`add_messages`), and a new `priority` (default "normal").

Both graphs: START -> respond -> END, or, when the human says "ship ...", respond -> (note and
ask in parallel) -> END, where `ask` pauses at `interrupt()` for a decision. A thread paused
there holds `note`'s finished writes as pending writes of the interrupted step.
"""

from __future__ import annotations

import operator
import uuid
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, AnyMessage, BaseMessage, HumanMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import interrupt

from langgraph_ckpt_ext.migrations import SchemaChain


class StateV1(TypedDict, total=False):
    messages: Annotated[list[dict[str, str]], operator.add]
    objective: str
    turns: Annotated[int, operator.add]


class StateV3(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]
    goal: str
    priority: str
    turns: Annotated[int, operator.add]


def v1_message(role: str, text: str) -> dict[str, str]:
    return {"id": str(uuid.uuid4()), "role": role, "text": text}


# -- the upcasters: plain functions of stored channel values --------------------------------


def v1_to_v2(values: dict[str, Any]) -> dict[str, Any]:
    """`objective` is called `goal`."""
    if "objective" in values:
        values["goal"] = values.pop("objective")
    return values


def to_message(m: Any) -> Any:
    if not isinstance(m, dict):
        return m
    cls = HumanMessage if m["role"] == "human" else AIMessage
    return cls(content=m["text"], id=m["id"])


def v2_to_v3(values: dict[str, Any]) -> dict[str, Any]:
    """Messages become LangChain messages (keeping their ids); `priority` is new."""
    if "messages" in values:
        values["messages"] = [to_message(m) for m in values["messages"]]
    values.setdefault("priority", "normal")
    return values


CHAIN = SchemaChain(current=3, upcasters={1: v1_to_v2, 2: v2_to_v3}, name="echo")
UNNAMED_CHAIN = SchemaChain(current=3, upcasters={1: v1_to_v2, 2: v2_to_v3})
"""The same chain before chains had names: it upgrades on read, and migrates only when told to
include the threads stamped with no name."""


# -- the graphs --------------------------------------------------------------------------------


def _route(last_text: str) -> list[str] | str:
    return ["note", "ask"] if last_text.startswith("ship") else END


def graph_v1() -> StateGraph:
    def respond(state: StateV1) -> dict[str, Any]:
        text = state["messages"][-1]["text"]
        return {"messages": [v1_message("ai", f"echo: {text}")], "turns": 1,
                "objective": state.get("objective") or text}

    def note(state: StateV1) -> dict[str, Any]:
        return {"messages": [v1_message("ai", "noted")], "objective": "ship the release"}

    def ask(state: StateV1) -> dict[str, Any]:
        decision = interrupt({"question": "ship it?"})
        return {"messages": [v1_message("ai", f"decision: {decision}")]}

    g = StateGraph(StateV1)
    g.add_node("respond", respond)
    g.add_node("note", note)
    g.add_node("ask", ask)
    g.add_edge(START, "respond")
    g.add_conditional_edges(
        "respond", lambda s: _route(s["messages"][-2]["text"]), ["note", "ask", END]
    )
    g.add_edge("note", END)
    g.add_edge("ask", END)
    return g


def graph_v3() -> StateGraph:
    def respond(state: StateV3) -> dict[str, Any]:
        text = state["messages"][-1].content
        return {"messages": [AIMessage(f"echo: {text}")], "turns": 1,
                "goal": state.get("goal") or text}

    def note(state: StateV3) -> dict[str, Any]:
        return {"messages": [AIMessage("noted")], "goal": "ship the release"}

    def ask(state: StateV3) -> dict[str, Any]:
        decision = interrupt({"question": "ship it?"})
        return {"messages": [AIMessage(f"decision: {decision}")]}

    g = StateGraph(StateV3)
    g.add_node("respond", respond)
    g.add_node("note", note)
    g.add_node("ask", ask)
    g.add_edge(START, "respond")
    g.add_conditional_edges(
        "respond", lambda s: _route(str(s["messages"][-2].content)), ["note", "ask", END]
    )
    g.add_edge("note", END)
    g.add_edge("ask", END)
    return g


def is_v3(values: dict[str, Any]) -> bool:
    """Values in the v3 shape: no v1 field left, messages are LangChain messages."""
    return (
        "objective" not in values
        and values.get("priority") == "normal"
        and all(isinstance(m, BaseMessage) for m in values.get("messages", []))
    )
