"""Graph runs in processes of their own, for tests/backends/test_writers_redis.py: each worker
opens its own `RedisCheckpointer` on the test's storage, runs a real graph on one thread and
reports what became of each run on a queue (multiprocessing "spawn": nothing is shared with
the test process but the Redis server and the synchronization primitives)."""

from __future__ import annotations

import contextlib
import operator
import threading
from collections.abc import Callable, Sequence
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph

from langgraph_ckpt_ext import RedisCheckpointer


class State(TypedDict):
    log: Annotated[list[str], operator.add]


def graph(cp: Any, wait: Callable[[], object] | None = None) -> Any:
    """step -> review -> END; `step` calls `wait` when the newest input starts with "race"."""

    def step(state: State) -> dict[str, Any]:
        if wait is not None and state["log"][-1].startswith("race"):
            wait()
        return {"log": ["step"]}

    def review(state: State) -> dict[str, Any]:
        return {"log": ["review"]}

    g = StateGraph(State)
    g.add_node("step", step)
    g.add_node("review", review)
    g.add_edge(START, "step")
    g.add_edge("step", "review")
    g.add_edge("review", END)
    return g.compile(checkpointer=cp)


def outcome(exc: BaseException | None) -> str:
    return "won" if exc is None else type(exc).__name__


def race(url: str, prefix: str, thread: str, name: str, go: Any, barriers: Sequence[Any],
         out: Any) -> None:
    """One run per round on `thread`, started with the other worker's (`go`), both meeting at
    the round's barrier inside `step`; a refused run breaks the barrier, so that the other
    goes on at once. Puts (round, name, outcome) on `out`."""
    cp = RedisCheckpointer(url, key_prefix=prefix)
    try:
        config = {"configurable": {"thread_id": thread}}
        for r, barrier in enumerate(barriers):
            go.wait(60)

            def meet(barrier: Any = barrier) -> None:
                with contextlib.suppress(threading.BrokenBarrierError):
                    barrier.wait(20)

            try:
                # durability="sync": a refused checkpoint stops the run before its next step,
                # so a run refused at its input never waits at the barrier
                graph(cp, meet).invoke({"log": [f"race-{name}-{r}"]}, config, durability="sync")
                out.put((r, name, "won"))
            except BaseException as exc:
                barrier.abort()
                out.put((r, name, outcome(exc)))
    finally:
        cp.close()


def late(url: str, prefix: str, thread: str, ready: Any, deleted: Any, out: Any) -> None:
    """A run on `thread` that stops inside `step` (`ready`) until the test has deleted the
    thread (`deleted`), then goes on: puts its outcome on `out`."""
    cp = RedisCheckpointer(url, key_prefix=prefix)
    try:
        def stall() -> None:
            ready.set()
            deleted.wait(60)

        try:
            graph(cp, stall).invoke({"log": ["race-late"]}, {"configurable": {"thread_id": thread}})
            out.put("won")
        except BaseException as exc:
            out.put(outcome(exc))
    finally:
        cp.close()


def stalled(url: str, prefix: str, thread: str, ttl: float, ready: Any, go: Any, out: Any
            ) -> None:
    """A run holding a lease of `thread` (`ttl`, not kept alive) that stops inside `step`
    (`ready`: the test then stops this process) until `go`; puts its outcome on `out`."""
    cp = RedisCheckpointer(url, key_prefix=prefix)
    try:
        def stall() -> None:
            ready.set()
            go.wait(60)

        config = {"configurable": {"thread_id": thread}}
        try:
            with cp.lease(thread, ttl=ttl, keep_alive=False) as lease:
                graph(cp, stall).invoke({"log": ["race-stalled"]}, lease.config(config))
            out.put("won")
        except BaseException as exc:
            out.put(outcome(exc))
    finally:
        cp.close()
