"""A state whose values are the application's own types (an Enum, a dataclass, a NamedTuple,
pydantic v1 and v2 models, LangChain's agent types and messages), and a graph that pauses
between writing and reading them: they must come back as themselves, as with InMemorySaver."""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, NamedTuple, TypedDict

import pydantic
import pydantic.v1
from langchain_core.agents import AgentAction
from langchain_core.messages import AIMessage
from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt


class Color(enum.Enum):
    BLUE = "blue"
    RED = "red"


@dataclasses.dataclass
class Point:
    x: int
    y: int


class Pair(NamedTuple):
    left: str
    right: str


class Plan(pydantic.BaseModel):
    steps: list[str]


class OldPlan(pydantic.v1.BaseModel):
    steps: list[str]


class Typed(TypedDict, total=False):
    color: Color
    point: Point
    pair: Pair
    plan: Plan
    old: OldPlan
    action: AgentAction
    reply: AIMessage
    seen: list[str]


def values() -> dict[str, Any]:
    return {"color": Color.BLUE, "point": Point(1, 2), "pair": Pair("a", "b"),
            "plan": Plan(steps=["x"]), "old": OldPlan(steps=["y"]),
            "action": AgentAction(tool="search", tool_input="q", log="l"),
            "reply": AIMessage(content="hi", id="m1")}


def typed_graph() -> StateGraph:
    """`write` stores the values; `check` pauses, then reads each as its own type (a dict in
    place of a model fails `.steps`, as users' nodes do)."""

    def write(state: Typed) -> dict[str, Any]:
        return values()

    def check(state: Typed) -> dict[str, Any]:
        interrupt("go on?")
        seen = [type(state[k]).__name__ for k in sorted(values())]  # type: ignore[literal-required]
        assert state["plan"].steps == ["x"] and state["old"].steps == ["y"]
        return {"seen": seen}

    b = StateGraph(Typed)
    b.add_node("write", write)
    b.add_node("check", check)
    b.add_edge(START, "write")
    b.add_edge("write", "check")
    b.add_edge("check", END)
    return b
