"""Small real graphs the scenario tests compile with our checkpointers."""

from __future__ import annotations

import operator
import time
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import Send, interrupt


class ChatState(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    turns: Annotated[int, operator.add]


def chat_graph() -> StateGraph:
    def agent(state: ChatState) -> dict[str, Any]:
        last = state["messages"][-1].content
        return {"messages": [AIMessage(content=f"echo: {last}")], "turns": 1}

    b = StateGraph(ChatState)
    b.add_node("agent", agent)
    b.add_edge(START, "agent")
    b.add_edge("agent", END)
    return b


class ApprovalState(TypedDict):
    request: str
    decision: str
    log: Annotated[list[str], operator.add]


def approval_graph() -> StateGraph:
    def propose(state: ApprovalState) -> dict[str, Any]:
        return {"log": [f"proposed {state['request']}"]}

    def ask(state: ApprovalState) -> dict[str, Any]:
        decision = interrupt({"question": f"approve {state['request']}?"})
        return {"decision": decision, "log": [f"human said {decision}"]}

    def act(state: ApprovalState) -> dict[str, Any]:
        return {"log": [f"acted on {state['decision']}"]}

    b = StateGraph(ApprovalState)
    b.add_node("propose", propose)
    b.add_node("ask", ask)
    b.add_node("act", act)
    b.add_edge(START, "propose")
    b.add_edge("propose", "ask")
    b.add_edge("ask", "act")
    b.add_edge("act", END)
    return b


class FanState(TypedDict):
    items: list[int]
    results: Annotated[list[int], operator.add]
    total: int


def fan_graph() -> StateGraph:
    def split(state: FanState) -> list[Send]:
        return [Send("square", {"items": [x], "results": [], "total": 0}) for x in state["items"]]

    def square(state: FanState) -> dict[str, Any]:
        return {"results": [state["items"][0] ** 2]}

    def join(state: FanState) -> dict[str, Any]:
        return {"total": sum(state["results"])}

    b = StateGraph(FanState)
    b.add_node("square", square)
    b.add_node("join", join)
    b.add_conditional_edges(START, split, ["square"])
    b.add_edge("square", "join")
    b.add_edge("join", END)
    return b


class ParentState(TypedDict):
    text: str
    trail: Annotated[list[str], operator.add]


class InnerState(TypedDict):
    text: str


def subgraph_graph() -> StateGraph:
    def inner_step(state: InnerState) -> dict[str, Any]:
        answer = interrupt("inner question")
        return {"text": state["text"] + f"+inner({answer})"}

    inner = StateGraph(InnerState)
    inner.add_node("inner_step", inner_step)
    inner.add_edge(START, "inner_step")
    inner.add_edge("inner_step", END)

    def outer(state: ParentState) -> dict[str, Any]:
        return {"text": state["text"] + "+outer", "trail": ["outer"]}

    b = StateGraph(ParentState)
    b.add_node("outer", outer)
    b.add_node("child", inner.compile())
    b.add_edge(START, "outer")
    b.add_edge("outer", "child")
    b.add_edge("child", END)
    return b


class FlakyState(TypedDict):
    log: Annotated[list[str], operator.add]


def flaky_graph(calls: dict[str, int], fail: dict[str, bool]) -> StateGraph:
    """Two parallel branches: `good` succeeds, `bad` fails while `fail['bad']` is set."""

    def good(state: FlakyState) -> dict[str, Any]:
        calls["good"] = calls.get("good", 0) + 1
        return {"log": ["good"]}

    def bad(state: FlakyState) -> dict[str, Any]:
        calls["bad"] = calls.get("bad", 0) + 1
        if fail["bad"]:
            # Fail after `good` has finished: LangGraph drops a sibling's writes that land
            # after the step has already failed (with any checkpointer).
            time.sleep(0.3)
            raise RuntimeError("bad branch failed")
        return {"log": ["bad"]}

    b = StateGraph(FlakyState)
    b.add_node("good", good)
    b.add_node("bad", bad)
    b.add_edge(START, "good")
    b.add_edge(START, "bad")
    b.add_edge("good", END)
    b.add_edge("bad", END)
    return b


def human(text: str) -> HumanMessage:
    return HumanMessage(content=text)
