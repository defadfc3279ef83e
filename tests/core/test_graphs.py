"""Real compiled graphs with our checkpointers, each scenario in three ways: sync calls, async
calls, and sync calls from a thread whose event loop is running (a notebook cell)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from langgraph.types import Command

from langgraph_ckpt_ext import (
    EveryStep,
    Hybrid,
    OnEvents,
    Periodic,
)
from tests.support.common import LoopThread, in_running_loop
from tests.support.graphs import (
    approval_graph,
    chat_graph,
    fan_graph,
    flaky_graph,
    human,
    subgraph_graph,
)
from tests.support.savers import BACKENDS, open_saver, param, params

MODES = ["sync", "async", "sync_in_loop"]

# SmartCheckpointer around a backend, under each policy (short intervals, so that the interval
# timer writes while the scenarios run).
SMART = {
    "smart-every:sqlite": EveryStep(),
    "smart-periodic:memory": Periodic(0.05),
    "smart-periodic:postgres": Periodic(0.05),
    "smart-events:sqlite": OnEvents(),
    "smart-events:redis": OnEvents(),
    "smart-hybrid:sqlite-memory": Hybrid(min_interval=0.01, max_interval=0.2),
}

# ReplicatedCheckpointer: the primary's backend after the colon; its replicas' backends, and the
# wrapper's options.
REPLICATED: dict[str, tuple[list[str], dict[str, Any]]] = {
    "replicated-async:postgres": (["redis", "sqlite"], {"consistency": "async"}),
    "replicated-quorum:sqlite": (["postgres", "redis"], {"consistency": "quorum", "quorum": 2}),
    "replicated-anti_entropy:redis": (
        ["sqlite"], {"consistency": "anti_entropy", "repair_interval": 0.05}),
    # the replicas given as URLs: applied by a replicator process
    "replicated-proc:postgres": (["redis", "sqlite"], {"consistency": "async", "urls": True}),
}


# The variants that run each scenario in one mode only, not all three: a replicator process
# (seconds to start, per test) applies the replicas the same whatever the caller's mode, and
# "replicated-async:postgres" runs the same scenarios in every mode in-process.
ONE_MODE = {"replicated-proc:postgres": "async"}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Each scenario on every variant, in every mode (`ONE_MODE`: in one)."""
    if "graph_saver" not in metafunc.fixturenames:
        return
    variants = [*params(BACKENDS), *params(SMART),
                *(param(k, *REPLICATED[k][0]) for k in REPLICATED)]
    metafunc.parametrize(("graph_saver", "mode"), [
        pytest.param(v.values[0], m, id=f"{v.id}-{m}", marks=v.marks)
        for v in variants for m in MODES if ONE_MODE.get(v.values[0], m) == m
    ], indirect=True)


@pytest.fixture
def graph_saver(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """Every backend, and the SmartCheckpointer and ReplicatedCheckpointer variants, for the
    scenarios of this module."""
    kind = str(request.param)
    backend = kind.rpartition(":")[2]
    if kind in REPLICATED:
        yield from replicated_saver(kind, tmp_path)
        return
    with open_saver(backend, tmp_path, wrapper="smart" if kind in SMART else None,
                    policy=SMART.get(kind)) as h:
        yield h.saver


def replicated_saver(kind: str, tmp_path: Path) -> Iterator[Any]:
    """A ReplicatedCheckpointer whose replicas, once the scenario is over and their queues
    applied, hold exactly the primary's checkpoints and writes."""
    replica_kinds, options = REPLICATED[kind]
    options = dict(options)
    urls = options.pop("urls", False)
    with open_saver(kind.partition(":")[2], tmp_path, wrapper="replicated", replicas=replica_kinds,
                    replica_urls=urls, wrapper_options=options) as h:
        cp = h.saver
        yield cp
        assert cp.flush(timeout=30), cp.status()
        report = cp.repair()
        assert report.clean, report.summary()
        assert all(r.up and not r.needs_repair for r in cp.status().replicas), cp.status()


class Api:
    """The graph calls a scenario makes, sync or async underneath."""

    def __init__(self, mode: str, loop: LoopThread) -> None:
        self.mode, self.loop = mode, loop

    def invoke(self, graph: Any, inp: Any, config: dict[str, Any], **kw: Any) -> Any:
        if self.mode == "async":
            return self.loop.run(graph.ainvoke(inp, config, **kw))
        return graph.invoke(inp, config, **kw)

    def stream(self, graph: Any, inp: Any, config: dict[str, Any], **kw: Any) -> list[Any]:
        if self.mode == "async":
            async def collect() -> list[Any]:
                return [c async for c in graph.astream(inp, config, **kw)]

            return self.loop.run(collect())  # type: ignore[no-any-return]
        return list(graph.stream(inp, config, **kw))

    def state(self, graph: Any, config: dict[str, Any], **kw: Any) -> Any:
        if self.mode == "async":
            return self.loop.run(graph.aget_state(config, **kw))
        return graph.get_state(config, **kw)

    def history(self, graph: Any, config: dict[str, Any]) -> list[Any]:
        if self.mode == "async":
            async def collect() -> list[Any]:
                return [s async for s in graph.aget_state_history(config)]

            return self.loop.run(collect())  # type: ignore[no-any-return]
        return list(graph.get_state_history(config))

    def update(self, graph: Any, config: dict[str, Any], values: Any, **kw: Any) -> Any:
        if self.mode == "async":
            return self.loop.run(graph.aupdate_state(config, values, **kw))
        return graph.update_state(config, values, **kw)


@pytest.fixture
def mode(request: pytest.FixtureRequest) -> str:
    """One of `MODES`, as the test is parametrized."""
    return str(request.param)


@pytest.fixture
def run(mode: str, loop_thread: LoopThread) -> Callable[[Callable[[Api], Any]], Any]:
    api = Api(mode, loop_thread)

    def runner(scenario: Callable[[Api], Any]) -> Any:
        if mode == "sync_in_loop":
            return in_running_loop(lambda: scenario(api))
        return scenario(api)

    return runner


def cfg(thread: str, **extra: Any) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread, **extra}}


def test_multi_turn_memory(graph_saver: Any, run: Any) -> None:
    graph = chat_graph().compile(checkpointer=graph_saver)

    def scenario(api: Api) -> None:
        for i in range(3):
            api.invoke(graph, {"messages": [human(f"hi {i}")]}, cfg("a"))
        chunks = api.stream(graph, {"messages": [human("last")]}, cfg("a"), stream_mode="values")
        assert chunks[-1]["turns"] == 4
        values = api.state(graph, cfg("a")).values
        assert [m.content for m in values["messages"]] == [
            "hi 0", "echo: hi 0", "hi 1", "echo: hi 1", "hi 2", "echo: hi 2", "last", "echo: last"
        ]
        assert api.state(graph, cfg("other")).values == {}

    run(scenario)


def test_interrupt_and_resume(graph_saver: Any, run: Any) -> None:
    graph = approval_graph().compile(checkpointer=graph_saver)

    def scenario(api: Api) -> None:
        out = api.invoke(graph, {"request": "deploy", "log": []}, cfg("h"))
        assert out["__interrupt__"][0].value == {"question": "approve deploy?"}
        paused = api.state(graph, cfg("h"))
        assert paused.next == ("ask",)
        assert paused.tasks[0].interrupts[0].value == {"question": "approve deploy?"}
        final = api.invoke(graph, Command(resume="yes"), cfg("h"))
        assert final["log"] == ["proposed deploy", "human said yes", "acted on yes"]
        assert api.state(graph, cfg("h")).next == ()

    run(scenario)


def test_interrupt_before(graph_saver: Any, run: Any) -> None:
    graph = approval_graph().compile(checkpointer=graph_saver, interrupt_before=["act"])

    def scenario(api: Api) -> None:
        api.invoke(graph, {"request": "x", "log": []}, cfg("ib"))
        api.invoke(graph, Command(resume="ok"), cfg("ib"))
        assert api.state(graph, cfg("ib")).next == ("act",)
        final = api.invoke(graph, None, cfg("ib"))
        assert final["log"][-1] == "acted on ok"

    run(scenario)


def test_history_replay_and_update_state(graph_saver: Any, run: Any) -> None:
    graph = chat_graph().compile(checkpointer=graph_saver)

    def scenario(api: Api) -> None:
        for i in range(3):
            api.invoke(graph, {"messages": [human(f"m{i}")]}, cfg("t"))
        history = api.history(graph, cfg("t"))
        assert len(history) == 9  # per turn: input, agent... 3 checkpoints
        assert [s.metadata["step"] for s in history] == sorted(
            (s.metadata["step"] for s in history), reverse=True
        )
        # Re-invoke from the checkpoint after the first turn: a new branch.
        after_first = next(
            s for s in history if s.metadata["source"] == "loop" and len(s.values["messages"]) == 2
        )
        out = api.invoke(graph, {"messages": [human("branch")]}, after_first.config)
        assert [m.content for m in out["messages"]] == ["m0", "echo: m0", "branch", "echo: branch"]
        # update_state writes a new checkpoint on top of the latest.
        api.update(graph, cfg("t"), {"messages": [human("edited")]})
        values = api.state(graph, cfg("t")).values
        assert values["messages"][-1].content == "edited"
        assert api.state(graph, cfg("t")).metadata["source"] == "update"
        # The old checkpoint is still intact.
        old = api.state(graph, after_first.config).values
        assert [m.content for m in old["messages"]] == ["m0", "echo: m0"]

    run(scenario)


def test_fan_out_fan_in(graph_saver: Any, run: Any) -> None:
    graph = fan_graph().compile(checkpointer=graph_saver)

    def scenario(api: Api) -> None:
        out = api.invoke(graph, {"items": [1, 2, 3, 4], "results": [], "total": 0}, cfg("f"))
        assert sorted(out["results"]) == [1, 4, 9, 16] and out["total"] == 30
        assert api.state(graph, cfg("f")).values["total"] == 30

    run(scenario)


def test_subgraph_namespace(graph_saver: Any, run: Any) -> None:
    graph = subgraph_graph().compile(checkpointer=graph_saver)

    def scenario(api: Api) -> None:
        api.invoke(graph, {"text": "s", "trail": []}, cfg("sg"))
        state = api.state(graph, cfg("sg"), subgraphs=True)
        child = state.tasks[0].state
        assert child.config["configurable"]["checkpoint_ns"].startswith("child:")
        assert child.next == ("inner_step",)
        out = api.invoke(graph, Command(resume="42"), cfg("sg"))
        assert out["text"] == "s+outer+inner(42)" and out["trail"] == ["outer"]
        namespaces = {
            t.config["configurable"]["checkpoint_ns"] for t in graph_saver.list(cfg("sg"))
        }
        assert "" in namespaces and any(ns.startswith("child:") for ns in namespaces)

    run(scenario)


def test_failed_node_rerun_skips_succeeded_sibling(graph_saver: Any, run: Any) -> None:
    calls: dict[str, int] = {}
    fail = {"bad": True}
    graph = flaky_graph(calls, fail).compile(checkpointer=graph_saver)

    def scenario(api: Api) -> None:
        with pytest.raises(RuntimeError, match="bad branch failed"):
            api.invoke(graph, {"log": []}, cfg("fl"))
        assert calls == {"good": 1, "bad": 1}
        pending = graph_saver.get_tuple(cfg("fl")).pending_writes
        assert any(w[1] == "log" and w[2] == ["good"] for w in pending)
        fail["bad"] = False
        out = api.invoke(graph, None, cfg("fl"))
        assert calls == {"good": 1, "bad": 2}  # `good` was not run again
        assert sorted(out["log"]) == ["bad", "good"]

    run(scenario)


@pytest.mark.parametrize("durability", ["sync", "async", "exit"])
def test_durability_modes(graph_saver: Any, run: Any, durability: str) -> None:
    graph = approval_graph().compile(checkpointer=graph_saver)

    def scenario(api: Api) -> None:
        api.invoke(graph, {"request": "d", "log": []}, cfg(durability), durability=durability)
        final = api.invoke(graph, Command(resume="y"), cfg(durability), durability=durability)
        assert final["log"] == ["proposed d", "human said y", "acted on y"]
        history = api.history(graph, cfg(durability))
        if durability == "exit":
            assert len(history) == 2  # one checkpoint per run
        else:
            assert len(history) >= 5
        assert history[0].values["log"] == final["log"]

    run(scenario)


@pytest.mark.parametrize("mode", MODES, indirect=True)
def test_long_thread_300_turns(backend: str, tmp_path: Path, mode: str, loop_thread: Any) -> None:
    h = open_saver(backend, tmp_path)
    saver = h.saver
    graph = chat_graph().compile(checkpointer=saver)
    api = Api(mode, loop_thread)

    # 300 turns in one mode per backend; the other modes cross the same bridge 90 times (the
    # suite's time: this test runs once per backend and mode).
    n = 300 if mode == "sync" else 90

    def scenario(api: Api) -> None:
        for i in range(n):
            api.invoke(graph, {"messages": [human(f"turn {i}")]}, cfg("long"))
        values = api.state(graph, cfg("long")).values
        assert values["turns"] == n and len(values["messages"]) == 2 * n
        assert values["messages"][-2].content == f"turn {n - 1}"
        # An old checkpoint still reads back exactly.
        mid = list(saver.list(cfg("long"), limit=4 * n // 3))[-1].checkpoint["channel_values"]
        turns = mid["turns"]
        assert n / 3 < turns < 2 * n / 3 and len(mid["messages"]) in (2 * turns, 2 * turns + 1)
        assert mid["messages"][2 * turns - 2].content == f"turn {turns - 1}"

    try:
        if mode == "sync_in_loop":
            in_running_loop(lambda: scenario(api))
        else:
            scenario(api)
    finally:
        h.close()


def _configs(found: Any, out: list[Any]) -> list[Any]:
    """Every config (a dict with "configurable") in what a graph call returned, in order."""
    if isinstance(found, dict):
        if "configurable" in found:
            out.append(found)
        for value in found.values():
            _configs(value, out)
    elif isinstance(found, list | tuple):
        for value in found:
            _configs(value, out)
    elif hasattr(found, "_asdict"):  # StateSnapshot, CheckpointTuple
        _configs(found._asdict(), out)
    return out


def _normalized(configs: list[Any]) -> list[Any]:
    """The configs with each checkpoint id replaced by the order it first appeared in (ids are
    time-based: two savers' runs never share them; everything else must be equal)."""
    ids: dict[str, str] = {}

    def norm(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: norm(v) for k, v in sorted(value.items())}
        if isinstance(value, str) and len(value) == 36 and value.count("-") == 4:
            return ids.setdefault(value, f"#{len(ids)}")
        return value

    return [norm(c) for c in configs]


def _config_flows(api: Api, graph: Any) -> list[Any]:
    """What LangGraph hands a user, as configs: stream events of a run that pauses, state and
    history, a copy fork and an edit of an old checkpoint, a resume from the fork."""
    events = api.stream(graph, {"request": "deploy", "log": []}, cfg("c"),
                        stream_mode=["checkpoints", "debug", "values"])
    paused = api.state(graph, cfg("c"))
    history = api.history(graph, cfg("c"))
    copied = api.update(graph, paused.config, None, as_node="__copy__")
    edited = api.update(graph, history[-2].config, {"log": ["edited"]})
    resumed = api.stream(graph, Command(resume="yes"), copied, stream_mode=["checkpoints"])
    return [events, paused, history, copied, edited, resumed, api.state(graph, cfg("c")),
            api.history(graph, cfg("c"))]


def test_configs_are_exactly_langgraphs(graph_saver: Any, run: Any) -> None:
    """No key of ours in any config LangGraph hands out (streamed, state, history, forks), and
    LangGraph's own fork paths never refused: the same configs, field by field, as
    InMemorySaver's, ids aside."""
    from langgraph.checkpoint.memory import InMemorySaver

    ours = run(lambda api: _config_flows(api, approval_graph().compile(checkpointer=graph_saver)))
    theirs = run(lambda api: _config_flows(
        api, approval_graph().compile(checkpointer=InMemorySaver())))
    mine, reference = _normalized(_configs(ours, [])), _normalized(_configs(theirs, []))
    assert len(mine) == len(reference) > 20
    for got, want in zip(mine, reference, strict=True):
        assert got == want


def _stateful_subgraph_replay(api: Api, checkpointer: Any) -> list[Any]:
    """A parent whose subgraph keeps its own state across runs (`checkpointer=True`), run
    twice, then replayed from a checkpoint of the first run: the subgraph's first put of the
    replay comes from the checkpoint LangGraph lists for it (`list(before=..., limit=1)`)."""
    from typing import TypedDict

    from langgraph.graph import END, START, StateGraph

    class Sub(TypedDict):
        count: int

    class Parent(TypedDict):
        count: int
        seen: list[int]

    def bump(state: Sub) -> dict[str, Any]:
        return {"count": state.get("count", 0) + 1}

    sub = StateGraph(Sub)
    sub.add_node("bump", bump)
    sub.add_edge(START, "bump")
    sub.add_edge("bump", END)
    child = sub.compile(checkpointer=True)

    def call(state: Parent) -> dict[str, Any]:
        out = child.invoke({"count": state.get("count", 0)})
        return {"count": out["count"], "seen": [*state.get("seen", []), out["count"]]}

    b = StateGraph(Parent)
    b.add_node("call", call)
    b.add_edge(START, "call")
    b.add_edge("call", END)
    graph = b.compile(checkpointer=checkpointer)
    first = api.invoke(graph, {"count": 0, "seen": []}, cfg("s"))
    second = api.invoke(graph, {"count": 5, "seen": []}, cfg("s"))
    before_call = [s for s in api.history(graph, cfg("s")) if s.next == ("call",)][-1]
    replayed = api.invoke(graph, None, before_call.config)
    again = api.invoke(graph, {"count": 0, "seen": []}, cfg("s"))
    return [first, second, replayed, again, api.state(graph, cfg("s")).values]


def test_a_replay_through_a_stateful_subgraph_is_not_refused(graph_saver: Any, run: Any
                                                            ) -> None:
    from langgraph.checkpoint.memory import InMemorySaver

    assert run(lambda api: _stateful_subgraph_replay(api, graph_saver)) == run(
        lambda api: _stateful_subgraph_replay(api, InMemorySaver()))


def _typed_flow(api: Api, checkpointer: Any) -> list[Any]:
    from tests.support.typed_state import typed_graph

    graph = typed_graph().compile(checkpointer=checkpointer)
    api.invoke(graph, {}, cfg("ty"))
    paused = api.state(graph, cfg("ty")).values
    api.invoke(graph, Command(resume="yes"), cfg("ty"))
    final = api.state(graph, cfg("ty")).values
    return [{k: (type(v), v) for k, v in paused.items()},
            {k: (type(v), v) for k, v in final.items()}]


def test_the_applications_own_types_come_back_as_themselves(graph_saver: Any, run: Any
                                                            ) -> None:
    """Default settings: an Enum, a dataclass, a NamedTuple, pydantic v1/v2 models, LangChain's
    agent types and messages come back with their types, as InMemorySaver returns them."""
    from langgraph.checkpoint.memory import InMemorySaver

    from tests.support.typed_state import values

    ours = run(lambda api: _typed_flow(api, graph_saver))
    assert ours == run(lambda api: _typed_flow(api, InMemorySaver()))
    assert ours[1]["seen"][1] == [type(v).__name__ for _, v in sorted(values().items())]
