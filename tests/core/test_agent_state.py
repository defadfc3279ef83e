"""`AgentState` on every backend: a multi-turn agent with tool calls, its reducers, and its
typed state read back under strict deserialization."""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.graph import END, START, StateGraph

from langgraph_ckpt_ext import (
    AgentSnapshot,
    AgentState,
    MemoryRef,
    PlanStep,
    ToolCall,
    ToolSpec,
    WorkingMemory,
    aload_agent_state,
    load_agent_state,
)
from langgraph_ckpt_ext.state import SHORT_TERM_LIMIT, append, first, merge_by_id, recent

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
TOOLS = [ToolSpec(name="search", description="web search"),
         ToolSpec(name="send_email", side_effects=True)]


def agent(state: AgentState) -> dict[str, Any]:
    """Asks for a tool on the first pass of a turn, answers on the second."""
    turn = len([m for m in state["messages"] if isinstance(m, HumanMessage)])
    last = state["messages"][-1]
    update: dict[str, Any] = {"iterations": 1, "tokens_used": 100, "cost_usd": 0.25,
                              "start_time": T0, "status": "running"}
    if isinstance(last, HumanMessage):
        call = {"id": f"call-{turn}", "name": "search", "args": {"q": last.content}}
        update["messages"] = [AIMessage(content="", id=f"ai-{turn}-a", tool_calls=[call])]
        update["plan"] = [PlanStep(id="1", description="search", status="running"),
                          PlanStep(id="2", description="answer")]
        update["current_step"] = 1
    else:
        update["messages"] = [AIMessage(content=f"answer {turn}", id=f"ai-{turn}-b")]
        update["plan"] = [PlanStep(id="1", description="search", status="done", result="ok"),
                          PlanStep(id="2", description="answer", status="done")]
        update["current_step"] = 2
        update["working_memory"] = WorkingMemory(scratchpad=f"turn {turn}", facts={"turn": turn},
                                                 updated_at=T0)
        update["short_term_memory"] = [f"answered turn {turn}"]
        update["status"] = "completed"
    return update


def tools(state: AgentState) -> dict[str, Any]:
    call = state["messages"][-1].tool_calls[0]  # type: ignore[union-attr]
    return {
        "messages": [ToolMessage(content=f"found {call['args']['q']}", tool_call_id=call["id"],
                                 id=f"tool-{call['id']}")],
        "tool_call_history": [ToolCall(id=call["id"], name=call["name"], args=call["args"],
                                       result={"hits": 3}, started_at=T0, duration_ms=12.5)],
        "long_term_refs": [MemoryRef(id="doc-1", score=0.9), MemoryRef(id=f"doc-{call['id']}")],
        "tokens_used": 10,
    }


def route(state: AgentState) -> str:
    last = state["messages"][-1]
    return "tools" if isinstance(last, AIMessage) and last.tool_calls else END


def build(saver: Any) -> Any:
    g = StateGraph(AgentState)
    g.add_node("agent", agent)
    g.add_node("tools", tools)
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", route, ["tools", END])
    g.add_edge("tools", "agent")
    return g.compile(checkpointer=saver)


def test_agent_runs_multi_turn_with_tools_and_reads_back_typed(
    saver: Any, caplog: pytest.LogCaptureFixture
) -> None:
    graph = build(saver)
    config = {"configurable": {"thread_id": "agent-1"}}
    first_input = {"thread_id": "agent-1", "agent_id": "a", "user_id": "u", "goal": "help",
                   "available_tools": TOOLS, "schema_version": 1,
                   "messages": [HumanMessage(content="q1", id="h-1")]}
    with caplog.at_level(logging.WARNING):
        graph.invoke(first_input, config)
        # The same human message sent again (a client retry) is not added twice.
        graph.invoke({"messages": [HumanMessage(content="q1", id="h-1")]}, config)
        graph.invoke({"messages": [HumanMessage(content="q2", id="h-2")]}, config)
        graph.invoke({"messages": [HumanMessage(content="q3", id="h-3")]}, config)
    # Strict deserialization: our models come back as themselves, with no warning about them.
    assert not [r for r in caplog.records if "deserializ" in r.getMessage().lower()]

    snap = load_agent_state(saver, config)
    assert isinstance(snap, AgentSnapshot)
    ids = [m.id for m in snap.messages]
    # Three turns of four messages; the re-sent h-1 replaced itself, and the answer its re-run
    # gave (same id) replaced the stored one: nothing is duplicated.
    assert len(ids) == len(set(ids)) == 12 and ids.count("h-1") == 1
    # Six agent passes for three turns, one more for the re-run; three tool calls.
    assert snap.iterations == 7 and snap.tokens_used == 7 * 100 + 3 * 10
    assert snap.cost_usd == pytest.approx(7 * 0.25)
    assert snap.working_memory == WorkingMemory(scratchpad="turn 3", facts={"turn": 3},
                                                updated_at=T0)
    assert [c.id for c in snap.tool_call_history] == ["call-1", "call-2", "call-3"]
    assert all(isinstance(c, ToolCall) and c.result == {"hits": 3} for c in snap.tool_call_history)
    assert [r.id for r in snap.long_term_refs] == ["doc-1", "doc-call-1", "doc-call-2", "doc-call-3"]
    assert snap.plan is not None and [s.status for s in snap.plan] == ["done", "done"]
    assert snap.available_tools == TOOLS and snap.available_tools[1].side_effects
    assert snap.short_term_memory == [f"answered turn {t}" for t in (1, 1, 2, 3)]
    assert (snap.thread_id, snap.agent_id, snap.user_id, snap.goal) == ("agent-1", "a", "u", "help")
    assert snap.status == "completed" and snap.current_step == 2 and snap.start_time == T0
    assert snap.schema_version == 1
    # The typed state is the graph's own state, and it carries its checkpoint's id and time.
    state = graph.get_state(config)
    assert snap.checkpoint_id == state.config["configurable"]["checkpoint_id"]
    assert abs((datetime.now(timezone.utc) - snap.last_checkpoint).total_seconds()) < 120
    for key, value in state.values.items():
        assert getattr(snap, key) == value, key
    assert load_agent_state(saver, {"configurable": {"thread_id": "nobody"}}) is None


async def test_async_agent_and_typed_read(saver: Any) -> None:
    graph = build(saver)
    config = {"configurable": {"thread_id": "agent-async"}}
    await graph.ainvoke({"messages": [HumanMessage(content="hi", id="h")],
                         "available_tools": TOOLS}, config)
    snap = await aload_agent_state(saver, config)
    assert snap is not None and snap.iterations == 2 and snap.tool_call_history[0].name == "search"
    assert snap.messages[-1].content == "answer 1"


def test_reducers() -> None:
    assert append(None, [1]) == [1] and append([1], 2) == [1, 2] and append([1], [2, 3]) == [1, 2, 3]
    assert first(None, 5) == 5 and first(4, 5) == 4
    a, b = MemoryRef(id="a"), MemoryRef(id="b")
    a2 = MemoryRef(id="a", score=1.0)
    assert merge_by_id([a], [b, a2]) == [a2, b]
    assert recent(None, [str(i) for i in range(SHORT_TERM_LIMIT + 5)])[0] == "5"
    with pytest.raises(ValueError):
        PlanStep(id="1", description="x", status="unknown")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        ToolSpec(name="t", unknown_field=1)  # type: ignore[call-arg]


def test_agent_state_under_a_schema_chain(saver: Any) -> None:
    """An AgentState thread stored at schema v1 reads back, typed, at v2: the upcaster's change
    applied and `schema_version` following the chain; the agent runs on from there."""
    from langgraph_ckpt_ext import SchemaChain

    graph = build(saver)
    config = {"configurable": {"thread_id": "agent-v1"}}
    graph.invoke({"goal": "help", "schema_version": 1, "available_tools": TOOLS,
                  "messages": [HumanMessage(content="q1", id="h-1")]}, config)

    def v1_to_v2(values: dict[str, Any]) -> dict[str, Any]:
        """v2 keeps goals as imperatives with a capital letter, and drops tools with side
        effects from the tools on offer."""
        values["goal"] = values.get("goal", "").capitalize()
        values["available_tools"] = [t for t in values.get("available_tools", [])
                                     if not t.side_effects]
        return values

    saver.schema_chain = SchemaChain(current=2, upcasters={1: v1_to_v2})
    try:
        snap = load_agent_state(saver, config)
        assert snap is not None
        assert (snap.goal, snap.schema_version) == ("Help", 2)
        assert [t.name for t in snap.available_tools] == ["search"]
        graph.invoke({"messages": [HumanMessage(content="q2", id="h-2")]}, config)
        after = load_agent_state(saver, config)
        assert after is not None and after.schema_version == 2 and after.goal == "Help"
        assert after.iterations == 4 and len(after.tool_call_history) == 2
        assert saver.migrate_threads(include_unstamped=True).threads_migrated == 1
        assert load_agent_state(saver, config) == after
    finally:
        saver.schema_chain = None


def test_snapshot_schema_version_and_metadata_follow_the_checkpoint(saver: Any) -> None:
    """A graph that never writes `schema_version` itself: the snapshot takes the version from
    the checkpoint's metadata (read-time upgrade, then eager migration to v3), and carries that
    metadata, read-only."""
    from langgraph_ckpt_ext import SchemaChain

    graph = build(saver)
    config = {"configurable": {"thread_id": "agent-meta"}}
    graph.invoke({"goal": "help", "messages": [HumanMessage(content="q1", id="h-1")]}, config)
    plain = load_agent_state(saver, config)
    assert plain is not None and plain.schema_version == 1  # never stamped: version 1
    assert plain.checkpointer_metadata["source"] == "loop"

    def same(values: dict[str, Any]) -> dict[str, Any]:
        return values

    saver.schema_chain = SchemaChain(current=3, upcasters={1: same, 2: same}, name="agent")
    try:
        lazy = load_agent_state(saver, config)
        assert lazy is not None and lazy.checkpointer_metadata["schema_version"] == 3
        assert lazy.schema_version == 3
        saver.migrate_threads(include_unstamped=True)
        snap = load_agent_state(saver, config)
        tup = saver.get_tuple(config)
        assert snap is not None and tup is not None
        assert snap.schema_version == tup.metadata["schema_version"] == 3
        assert dict(snap.checkpointer_metadata) == tup.metadata
        assert snap.checkpointer_metadata["schema_name"] == "agent"
        with pytest.raises(TypeError):
            snap.checkpointer_metadata["schema_version"] = 4  # type: ignore[index]
        with pytest.raises(ValueError, match="frozen"):
            snap.checkpointer_metadata = {}
        with pytest.raises(TypeError):
            snap.checkpointer_metadata["parents"]["x"] = "y"  # type: ignore[index]
        assert snap.model_dump()["checkpointer_metadata"]["schema_version"] == 3
    finally:
        saver.schema_chain = None
