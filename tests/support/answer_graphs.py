"""Graphs that wait for a human and then act on the answer, with a side-effecting node that
records each call (thread id, answer), for the tests of forking at an answered interrupt."""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt

Calls = list[tuple[str, str]]


class AnswerState(TypedDict, total=False):
    request: str
    answer: str
    log: Annotated[list[str], operator.add]


def _notify(calls: Calls, what: str = "") -> Any:
    def notify(state: AnswerState, config: RunnableConfig) -> dict[str, Any]:
        calls.append((config["configurable"]["thread_id"], what or state["answer"]))
        return {"log": [f"notified {what or state['answer']}"]}

    return notify


def _ask(state: AnswerState) -> dict[str, Any]:
    answer = interrupt({"question": f"approve {state['request']}?"})
    return {"answer": answer, "log": [f"human said {answer}"]}


def decision_graph(calls: Calls) -> StateGraph:
    """ask (interrupt) -> approve or deny, by the answer -> notify (records the answer)."""
    b = StateGraph(AnswerState)
    b.add_node("ask", _ask)
    b.add_node("approve", lambda s: {"log": ["approved"]})
    b.add_node("deny", lambda s: {"log": ["denied"]})
    b.add_node("notify", _notify(calls))
    b.add_edge(START, "ask")
    b.add_conditional_edges("ask", lambda s: "approve" if s["answer"] == "yes" else "deny",
                            ["approve", "deny"])
    b.add_edge("approve", "notify")
    b.add_edge("deny", "notify")
    b.add_edge("notify", END)
    return b


def parallel_graph(calls: Calls) -> StateGraph:
    """fetch (records a call, reads no answer) beside ask (interrupt), then notify."""
    b = StateGraph(AnswerState)
    b.add_node("fetch", _notify(calls, "fetch"))
    b.add_node("ask", _ask)
    b.add_node("notify", _notify(calls))
    b.add_edge(START, "fetch")
    b.add_edge(START, "ask")
    b.add_edge(["fetch", "ask"], "notify")
    b.add_edge("notify", END)
    return b


def two_questions_graph(calls: Calls) -> StateGraph:
    """One node asking twice, then notify with both answers."""
    def ask_twice(state: AnswerState) -> dict[str, Any]:
        first = interrupt("first?")
        second = interrupt("second?")
        return {"answer": f"{first}/{second}", "log": [f"answers {first}/{second}"]}

    b = StateGraph(AnswerState)
    b.add_node("ask_twice", ask_twice)
    b.add_node("notify", _notify(calls))
    b.add_edge(START, "ask_twice")
    b.add_edge("ask_twice", "notify")
    b.add_edge("notify", END)
    return b


class NestedState(TypedDict, total=False):
    text: str


def nested_graph(calls: Calls) -> StateGraph:
    """outer -> child subgraph (prepare, which records its call; ask, which waits for a human)."""

    def prepare(state: NestedState, config: RunnableConfig) -> dict[str, Any]:
        calls.append((config["configurable"]["thread_id"], "prepare"))
        return {"text": state["text"] + "+prepared"}

    def ask(state: NestedState) -> dict[str, Any]:
        return {"text": state["text"] + f"+{interrupt('inner question')}"}

    inner = StateGraph(NestedState)
    inner.add_node("prepare", prepare)
    inner.add_node("ask", ask)
    inner.add_edge(START, "prepare")
    inner.add_edge("prepare", "ask")
    inner.add_edge("ask", END)
    b = StateGraph(NestedState)
    b.add_node("outer", lambda s: {"text": s["text"] + "+outer"})
    b.add_node("child", inner.compile())
    b.add_edge(START, "outer")
    b.add_edge("outer", "child")
    b.add_edge("child", END)
    return b
