"""A small graph that pauses for a human: `draft` writes, `review` asks for approval with
`interrupt()`, `publish` records the answer."""

from __future__ import annotations

import operator
from typing import Annotated, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt


class State(TypedDict):
    topic: str
    log: Annotated[list[str], operator.add]


def draft(state: State) -> dict[str, list[str]]:
    return {"log": [f"draft about {state['topic']}"]}


def review(state: State) -> dict[str, list[str]]:
    answer = interrupt({"question": "publish?", "draft": state["log"][-1]})
    return {"log": [f"review: {answer}"]}


def publish(state: State) -> dict[str, list[str]]:
    return {"log": ["published"]}


builder = StateGraph(State)
builder.add_node("draft", draft)
builder.add_node("review", review)
builder.add_node("publish", publish)
builder.add_edge(START, "draft")
builder.add_edge("draft", "review")
builder.add_edge("review", "publish")
builder.add_edge("publish", END)
graph = builder.compile()  # the server gives it its checkpointer
