"""Run in separate processes by tests/backends/test_writers_sqlite.py: writers of one thread of
one SQLite file, each printing what happened to it (one JSON line per event), so that a test
can race two of them, delete the thread under one, or stop one with SIGSTOP.

    python -m tests.support.writers_worker PATH race THREAD NAME ROUNDS SIGNALS_DIR
    python -m tests.support.writers_worker PATH late THREAD
    python -m tests.support.writers_worker PATH stall THREAD TTL

`race`: ROUNDS real graph runs on THREAD, each started when the file `go-<round>` appears in
SIGNALS_DIR; the run's node waits (`arrived-<round>-<name>` files) until the other worker's
run reached it too, or was refused, so both runs read the thread before either goes on.
`late`: reads the thread, then, at a line on stdin, puts a checkpoint and pending writes
carrying what it read. `stall`: takes a lease of TTL seconds (no keep-alive), reads the
thread under it, then, at a line on stdin, does as `late` with the lease's token.
"""

from __future__ import annotations

import json
import operator
import sys
import time
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph

from langgraph_ckpt_ext import ConcurrentWriteError, SQLiteCheckpointer

LATE_ID = "1f1ffff9-0000-6000-8000-000000000000"  # the late put's checkpoint id


class State(TypedDict):
    log: Annotated[list[str], operator.add]


def say(**event: Any) -> None:
    print(json.dumps(event), flush=True)


def wait_for(*paths: Path, limit: float = 20.0) -> None:
    """Until one of `paths` exists (a signal from the test or the other worker)."""
    end = time.monotonic() + limit
    while not any(p.exists() for p in paths) and time.monotonic() < end:
        time.sleep(0.005)


def race_graph(signals: Path, name: str, other: str) -> Any:
    def step(state: State) -> dict[str, Any]:
        round_ = state["log"][-1].split("-")[-1]
        (signals / f"arrived-{round_}-{name}").touch()
        wait_for(signals / f"arrived-{round_}-{other}", signals / f"refused-{round_}-{other}")
        return {"log": [f"step-{name}"]}

    g = StateGraph(State)
    g.add_node("step", step)
    g.add_edge(START, "step")
    g.add_edge("step", END)
    return g


def race(saver: SQLiteCheckpointer, thread: str, name: str, rounds: int, signals: Path) -> None:
    other = "b" if name == "a" else "a"
    graph = race_graph(signals, name, other).compile(checkpointer=saver)
    config = {"configurable": {"thread_id": thread}}
    say(event="ready")
    for r in range(rounds):
        wait_for(signals / f"go-{r}", limit=60)
        try:
            graph.invoke({"log": [f"race-{name}-{r}"]}, config)
            say(event="won", round=r)
        except ConcurrentWriteError as exc:
            (signals / f"refused-{r}-{name}").touch()
            say(event="refused", round=r, error=type(exc).__name__)


def attempt(fn: Any) -> str:
    """What a late write got: "stored", or the name of the error it raised."""
    try:
        fn()
    except Exception as exc:  # the test asserts on the name
        return type(exc).__name__
    return "stored"


def late_writes(saver: SQLiteCheckpointer, read: Any, config: Any) -> None:
    """At a line on stdin, a put and pending writes carrying what the process read."""
    sys.stdin.readline()
    ckpt = {**read.checkpoint, "id": LATE_ID}
    put = attempt(lambda: saver.put(config, ckpt, {"source": "loop", "step": 99}, {}))
    writes = attempt(lambda: saver.put_writes(config, [("log", ["late"])], "late-task"))
    say(event="late", put=put, writes=writes)


def main(path: str, mode: str, thread: str, *args: str) -> None:
    with SQLiteCheckpointer(path) as saver:
        config = {"configurable": {"thread_id": thread}}
        if mode == "race":
            race(saver, thread, args[0], int(args[1]), Path(args[2]))
        elif mode == "late":
            read = saver.get_tuple(config)
            say(event="read", checkpoint_id=read.config["configurable"]["checkpoint_id"])
            late_writes(saver, read, read.config)
        elif mode == "stall":
            lease = saver.lease(thread, ttl=float(args[0]), keep_alive=False).acquire()
            read = saver.get_tuple(lease.config(config))
            expires = saver.run_sync(saver.store.read_lease(thread))
            say(event="leased", token=lease.token, expires_at=expires[1] if expires else None)
            late_writes(saver, read, lease.config(read.config))
        else:
            raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(*sys.argv[1:])
