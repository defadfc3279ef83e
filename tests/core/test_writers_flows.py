"""No legitimate LangGraph flow is refused by `writers="single"`: randomized sequences of
runs, resumes, `update_state` on the newest and on old checkpoints, forks from old
checkpoints and new input on old checkpoints, with every durability, on graphs with an
interrupt, a subgraph that interrupts, and parallel `Send` tasks. Each sequence runs on
LangGraph's `InMemorySaver` and on ours (every backend; for the persistent ones, two
checkpointer objects over one storage take turns, as two processes would) and must give
the same states, the same pending questions and histories of the same length, with no
`ConcurrentWriteError` anywhere.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import StateGraph
from langgraph.types import Command

from langgraph_ckpt_ext import CheckpointerError
from tests.support.graphs import approval_graph, fan_graph, subgraph_graph
from tests.support.savers import PERSISTENT, open_saver, params

BACKENDS = ["memory", "sqlite", "postgres", "redis"]
GRAPHS: dict[str, tuple[Callable[[], StateGraph], Callable[[random.Random], Any]]] = {
    "approval": (approval_graph, lambda r: {"request": f"refund {r.randint(1, 99)}",
                                            "log": []}),
    "subgraph": (subgraph_graph, lambda r: {"text": f"t{r.randint(1, 99)}", "trail": []}),
    "fan": (fan_graph, lambda r: {"numbers": [r.randint(1, 9) for _ in range(3)],
                                  "squares": [], "total": 0}),
}
OPS = ["run", "run", "resume", "update", "update_old", "fork_old", "input_on_old"]


def view(graph: Any, config: Any) -> tuple[Any, ...]:
    state = graph.get_state(config)
    questions = tuple(i.value for t in state.tasks for i in t.interrupts)
    return (state.values, state.next, questions)


def step(graph: Any, config: Any, op: str, pick: int, arg: Any, durability: str) -> str:
    """One operation, the same on any saver; what it did (to compare outcomes)."""
    history = list(graph.get_state_history(config))
    old = history[pick % len(history)].config if history else None
    try:
        if op == "run" or not history:
            graph.invoke(arg, config, durability=durability)
        elif op == "resume":
            graph.invoke(Command(resume=f"answer-{pick}"), config, durability=durability)
        elif op == "update":
            graph.update_state(config, _update(graph, config, pick))
        elif op == "update_old":
            graph.update_state(old, _update(graph, old, pick))
        elif op == "fork_old":
            graph.invoke(None, old, durability=durability)
        else:
            graph.invoke(arg, old, durability=durability)
    except CheckpointerError:
        raise  # ours: never expected here (a refused write, above all)
    except Exception as exc:  # LangGraph's own refusals (ambiguous update...): compared
        return f"error:{type(exc).__name__}"
    return "ok"


def _update(graph: Any, config: Any, pick: int) -> dict[str, Any]:
    values = graph.get_state(config).values
    if "log" in values:
        return {"log": [f"edit-{pick}"]}
    if "trail" in values:
        return {"trail": [f"edit-{pick}"]}
    return {"total": pick}


@pytest.fixture(params=params(BACKENDS))
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_flows_match_langgraph_and_are_never_refused(
    backend: str, seed: int, tmp_path: Path
) -> None:
    flows(backend, seed, tmp_path)


def test_random_flows_on_sealed_storage(backend: str, tmp_path: Path) -> None:
    """The same, every value encrypted and compressed (`core.sealing`)."""
    from langgraph_ckpt_ext import Compression, Encryption, StaticKeys

    keys = StaticKeys({"k": bytes(range(32))})
    flows(backend, 4, tmp_path, encryption=Encryption(keys), compression=Compression(min_size=0))


def flows(backend: str, seed: int, tmp_path: Path, **options: Any) -> None:
    rng = random.Random(seed)
    with open_saver(backend, tmp_path, **options) as h:
        # a second object over the same storage (its own caches and append log)
        twin = h.reopen(**options) if backend in PERSISTENT else None
        try:
            for name, (build, make_input) in GRAPHS.items():
                ref = build().compile(checkpointer=InMemorySaver())
                ours = [build().compile(checkpointer=h.inner)]
                if twin is not None:
                    ours.append(build().compile(checkpointer=twin))
                config = {"configurable": {"thread_id": f"{name}-{seed}"}}
                for i in range(14):
                    op, pick = rng.choice(OPS), rng.randint(0, 50)
                    arg, durability = make_input(rng), rng.choice(["sync", "async", "exit"])
                    expected = step(ref, config, op, pick, arg, durability)
                    graph = ours[i % len(ours)]  # the two objects take turns
                    got = step(graph, config, op, pick, arg, durability)
                    where = f"{name} step {i}: {op} ({durability})"
                    assert got == expected, where
                    assert view(graph, config) == view(ref, config), where
                    assert (len(list(graph.get_state_history(config)))
                            == len(list(ref.get_state_history(config)))), where
        finally:
            if twin is not None:
                twin.close()
