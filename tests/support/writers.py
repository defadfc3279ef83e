"""What the tests of one writer per thread share (tests/core/test_writers.py,
tests/strategies/test_writers_wrappers.py, tests/backends/test_writers_{sqlite,postgres,redis}.py):
the race graph, the history helpers, and the worker functions the cross-process tests run in
processes of their own (`tests.support.fresh`: nothing is shared with the test process but
the storage and the synchronization primitives handed over).

Each worker opens its own checkpointer from a `Target` (backend + what names the storage) and
reports what became of its writes on a queue: "won"/"stored", or the name of the error raised.
"""

from __future__ import annotations

import asyncio
import contextlib
import operator
import os
import queue
import signal
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt

from langgraph_ckpt_ext import ConcurrentWriteError, PostgresCheckpointer
from langgraph_ckpt_ext.core.saver import StoreCheckpointer
from tests.support.fresh import PROCESSES
from tests.support.lifecycle import cfg, later_id
from tests.support.savers import PG_DSN

LATE_STEP = 99  # the metadata step of a late put, to find it if it was stored


class State(TypedDict):
    log: Annotated[list[str], operator.add]


def meet(barrier: Any, timeout: float = 10) -> Callable[[], None]:
    """Wait at `barrier` (threading or multiprocessing); a broken one (the other run was
    refused and aborted it) is passed over."""

    def wait() -> None:
        with contextlib.suppress(threading.BrokenBarrierError):
            barrier.wait(timeout)

    return wait


def race_graph(during: Callable[[], object] | None = None, *, ask: bool = True) -> StateGraph:
    """step -> review -> END. `step` calls `during()` when the newest input asks it to
    ("race..."): `meet(barrier)` for a race, or a stall. `review` interrupts ("ok?") while the
    log is short when `ask`, else answers "auto"; it logs "review:<answer>"."""

    def step(state: State) -> dict[str, Any]:
        if during is not None and state["log"] and state["log"][-1].startswith("race"):
            during()
        return {"log": ["step"]}

    def review(state: State) -> dict[str, Any]:
        answer = interrupt("ok?") if ask and len(state["log"]) < 4 else "auto"
        return {"log": [f"review:{answer}"]}

    g = StateGraph(State)
    g.add_node("step", step)
    g.add_node("review", review)
    g.add_edge(START, "step")
    g.add_edge("step", "review")
    g.add_edge("review", END)
    return g


def async_race_graph() -> StateGraph:
    """step -> END; `step` of a "race" input waits (5 s at most) until two runs reached it."""
    arrived = asyncio.Event()
    waiting = 0

    async def step(state: State) -> dict[str, Any]:
        nonlocal waiting
        if state["log"][-1].startswith("race"):
            waiting += 1
            if waiting == 2:
                arrived.set()
            with contextlib.suppress(TimeoutError):  # the other run was refused before
                await asyncio.wait_for(arrived.wait(), 5)
        return {"log": ["step"]}

    g = StateGraph(State)
    g.add_node("step", step)
    g.add_edge(START, "step")
    g.add_edge("step", END)
    return g


def history(cp: Any, thread_id: str) -> list[Any]:
    return list(cp.list(cfg(thread_id)))


def late_puts(cp: Any, thread_id: str) -> list[Any]:
    """The checkpoints of the thread that a late put (`LATE_STEP`) stored."""
    return [t for t in history(cp, thread_id) if t.metadata.get("step") == LATE_STEP]


def assert_one_chain(cp: Any, thread_id: str) -> int:
    """Every checkpoint of the namespace is an ancestor of the head: no fork, nothing
    orphaned. How many checkpoints there are."""
    tuples = history(cp, thread_id)
    by_id = {t.config["configurable"]["checkpoint_id"]: t for t in tuples}
    seen: set[str] = set()
    cursor: Any = tuples[0]
    while cursor is not None:
        seen.add(cursor.config["configurable"]["checkpoint_id"])
        parent = cursor.parent_config
        cursor = None if parent is None else by_id[parent["configurable"]["checkpoint_id"]]
    assert seen == set(by_id), f"{len(by_id) - len(seen)} checkpoint(s) off the head's chain"
    return len(tuples)


def race(cp: Any, thread_id: str, fresh: bool) -> list[str]:
    """Two runs of the graph on one thread at once, from two threads; what each got."""
    barrier = threading.Barrier(2)
    graph = race_graph(meet(barrier)).compile(checkpointer=cp)
    config = {"configurable": {"thread_id": thread_id}}
    if not fresh:
        graph.invoke({"log": ["start"]}, config)
    outcomes: list[str] = []

    def run(name: str) -> None:
        try:
            graph.invoke({"log": [f"race-{name}"]}, config)
            outcomes.append("won")
        except ConcurrentWriteError:
            outcomes.append("refused")
            barrier.abort()

    threads = [threading.Thread(target=run, args=(n,)) for n in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sorted(outcomes)


# -- workers: each runs in a spawned process ---------------------------------------------------



class Workers:
    """The worker processes a test started: continued (in case the test stopped one), joined,
    and killed if still alive, at the end (only these processes, by their own handles)."""

    def __init__(self) -> None:
        self.procs: list[Any] = []

    def start(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        proc = PROCESSES.Process(target=fn, args=args, kwargs=kwargs, daemon=True)
        proc.start()
        self.procs.append(proc)
        return proc

    def close(self) -> None:
        for proc in self.procs:
            if proc.pid is not None and proc.is_alive():
                os.kill(proc.pid, signal.SIGCONT)  # a stopped worker dies only once continued
            proc.join(30)
            if proc.is_alive():
                proc.kill()
                proc.join(5)


def take(q: Any, n: int) -> list[Any]:
    """`n` reports from the workers' queue."""
    out = []
    for _ in range(n):
        try:
            out.append(q.get(timeout=120))
        except queue.Empty:
            raise AssertionError(f"a worker reported nothing (got {out})") from None
    return out



@dataclass(frozen=True)
class Target:
    """A test's storage, for a worker to open a checkpointer of its own over it."""

    backend: str  # "sqlite", "postgres", "redis" (a standalone server or a Cluster's node)
    name: str  # the SQLite file, the PostgreSQL schema, the Redis key prefix
    url: str = ""  # Redis: the server

    def open(self) -> StoreCheckpointer:
        if self.backend == "sqlite":
            from langgraph_ckpt_ext import SQLiteCheckpointer

            return SQLiteCheckpointer(self.name)
        if self.backend == "postgres":
            return PostgresCheckpointer(PG_DSN, schema=self.name, setup=False)
        if self.backend == "redis":
            from langgraph_ckpt_ext import RedisCheckpointer

            return RedisCheckpointer(self.url, key_prefix=self.name)
        raise ValueError(f"no worker target for {self.backend!r}")


def outcome(fn: Callable[[], object], won: str = "stored") -> str:
    """What a write got: `won`, or the name of the error it raised (the test asserts on it)."""
    try:
        fn()
    except Exception as exc:
        return type(exc).__name__
    return won


def race_worker(target: Target, thread: str, name: str, go: Any, barriers: Sequence[Any],
                out: Any, durability: str | None = None) -> None:
    """One run of the race graph per barrier on `thread`, each round started at `go` (with the
    other worker, and the test if it is a party); the runs meet at the round's barrier inside
    `step`, so both read the thread before either goes on; a refused run breaks the barrier,
    so that the other goes on at once. Puts (round, name, "won" or the error's name)."""
    with target.open() as cp:
        config = {"configurable": {"thread_id": thread}}
        for r, barrier in enumerate(barriers):
            go.wait(60)
            graph = race_graph(meet(barrier, 20), ask=False).compile(checkpointer=cp)
            got = outcome(lambda g=graph, i={"log": [f"race-{name}-{r}"]}: g.invoke(
                i, config, durability=durability), "won")
            if got != "won":
                barrier.abort()
            out.put((r, name, got))


def late_worker(target: Target, thread: str, ready: Any, go: Any, out: Any, *,
                run: bool = False, lease_ttl: float | None = None) -> None:
    """A writer of `thread` that is held up between its read and its writes: it tells the
    test (`ready`), which deletes the thread, takes its lease, stops it...; at `go`, it writes
    what it read. With `lease_ttl`, it first takes a lease of the thread (not kept alive) and
    puts ("leased", token, expires_at). `run`: a graph run held inside `step`, then goes on
    (puts ("run", outcome)); else a read, then a put and pending writes chaining onto it (puts
    ("put", outcome) and ("writes", outcome))."""
    with target.open() as cp, contextlib.ExitStack() as stack:
        config: Any = {"configurable": {"thread_id": thread}}
        carry: Callable[[Any], Any] = lambda c: c  # noqa: E731 - what the writes carry
        if lease_ttl is not None:
            lease = stack.enter_context(cp.lease(thread, ttl=lease_ttl, keep_alive=False))
            held = cp.run_sync(cp.store.read_lease(thread))
            out.put(("leased", lease.token, held[1] if held else None))
            carry = lease.config
            config = carry(config)

        def hold() -> None:
            ready.set()
            go.wait(60)

        if run:
            graph = race_graph(hold, ask=False).compile(checkpointer=cp)
            out.put(("run", outcome(lambda: graph.invoke({"log": ["race-late"]}, config),
                                    "won")))
            return
        read = cp.get_tuple(config)
        assert read is not None
        hold()
        written = carry(read.config)
        ckpt = {**read.checkpoint, "id": later_id()}
        out.put(("put", outcome(lambda: cp.put(written, ckpt, {"source": "loop", "step": LATE_STEP},
                                               {}))))
        out.put(("writes", outcome(lambda: cp.put_writes(written, [("log", ["late"])],
                                                         "late-task"))))


def many_puts(target: Target, proc: int, thread: str, rounds: int, connections: int,
              barrier: Any, out: Any) -> None:
    """PostgreSQL. Per round: read the head (both processes read the same one: nobody writes
    between the barriers), then `connections` puts at once, each chaining onto it on a
    connection of its own. Puts (proc, round, how many landed)."""

    async def main() -> None:
        async with PostgresCheckpointer.from_conn_string(
                PG_DSN, schema=target.name, setup=False, max_size=connections) as cp:
            for round_ in range(rounds):
                await asyncio.to_thread(barrier.wait, 30)
                read = await cp.aget_tuple({"configurable": {"thread_id": thread}})
                assert read is not None
                await asyncio.to_thread(barrier.wait, 30)

                async def put(i: int, read: Any = read, round_: int = round_) -> bool:
                    ckpt = {**read.checkpoint,
                            "id": later_id()}
                    try:
                        await cp.aput(read.config, ckpt, {"source": "loop", "step": round_}, {})
                        return True
                    except ConcurrentWriteError:
                        return False

                landed = await asyncio.gather(*(put(i) for i in range(connections)))
                out.put((proc, round_, sum(landed)))
                await asyncio.to_thread(barrier.wait, 30)

    asyncio.run(main())


def put_racing_delete(target: Target, thread: str, rounds: int, barrier: Any, out: Any) -> None:
    """Per round: read the thread, meet the test (which deletes the thread at once), put a
    checkpoint chaining onto what was read. Puts (round, outcome)."""
    with target.open() as cp:
        config = {"configurable": {"thread_id": thread}}
        for round_ in range(rounds):
            read = cp.get_tuple(config)
            assert read is not None
            barrier.wait(30)
            ckpt = {**read.checkpoint, "id": later_id()}
            out.put((round_, outcome(lambda c=ckpt, r=read: cp.put(
                r.config, c, {"source": "loop", "step": 9}, {}))))
            barrier.wait(30)  # the test checks, and starts the thread again
