"""The other processes of tests/backends/test_writers_postgres.py (one writer per thread on
PostgreSQL across processes). Each function runs in a spawned process, on the test's schema,
and reports what happened through a queue (or, `stalled_holder`, stdout)."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from typing import Any

from langgraph_ckpt_ext import ConcurrentWriteError, PostgresCheckpointer
from tests.support.savers import PG_DSN

Barrier = Any  # a multiprocessing barrier (its type is not importable)
Queue = Any


def saver(schema: str) -> PostgresCheckpointer:
    return PostgresCheckpointer(PG_DSN, schema=schema, setup=False)


def racing_runs(schema: str, name: str, thread: str, barriers: list[Barrier],
                out: Queue) -> None:
    """One run of the race graph per barrier on `thread`, the other process doing the same
    at once: the `step` node waits for the other run at the round's barrier (or until the
    other run was refused, which breaks it). Puts ("won", round) or ("refused", round)."""
    from tests.core.test_writers import race_graph

    with saver(schema) as cp:
        for round_, barrier in enumerate(barriers):
            graph = race_graph(barrier).compile(checkpointer=cp)
            config = {"configurable": {"thread_id": thread}}
            try:
                graph.invoke({"log": [f"race-{name}-{round_}"]}, config)
                out.put((name, "won", round_))
            except ConcurrentWriteError:
                barrier.abort()
                out.put((name, "refused", round_))


def many_puts(schema: str, proc: int, thread: str, rounds: int, connections: int,
              barrier: Barrier, out: Queue) -> None:
    """Per round: read the head (both processes read the same one: nobody writes between
    the barriers), then `connections` puts at once, each chaining onto it on a connection of
    its own. Puts (proc, round, how many landed)."""

    async def main() -> None:
        async with PostgresCheckpointer.from_conn_string(
                PG_DSN, schema=schema, setup=False, max_size=connections) as cp:
            for round_ in range(rounds):
                await asyncio.to_thread(barrier.wait, 30)
                read = await cp.aget_tuple({"configurable": {"thread_id": thread}})
                assert read is not None
                await asyncio.to_thread(barrier.wait, 30)

                async def put(i: int, read: Any = read, round_: int = round_) -> bool:
                    ckpt = {**read.checkpoint,
                            "id": f"1f1f{round_:04x}-{proc:01x}{i:03x}-6000-8000-000000000000"}
                    try:
                        await cp.aput(read.config, ckpt, {"source": "loop", "step": round_}, {})
                        return True
                    except ConcurrentWriteError:
                        return False

                landed = await asyncio.gather(*(put(i) for i in range(connections)))
                out.put((proc, round_, sum(landed)))
                await asyncio.to_thread(barrier.wait, 30)

    asyncio.run(main())


def late_put(schema: str, thread: str, read_done: Any, deleted: Any, out: Queue) -> None:
    """Read the thread, tell the test, wait until it deleted the thread, then put a
    checkpoint chaining onto what was read and pending writes for it. Puts the outcomes."""
    with saver(schema) as cp:
        config = {"configurable": {"thread_id": thread}}
        read = cp.get_tuple(config)
        assert read is not None
        read_done.set()
        deleted.wait(30)
        out.put(("put", _outcome(lambda: cp.put(
            read.config, {**read.checkpoint, "id": "1f1fffff-0000-6000-8000-000000000000"},
            {"source": "loop", "step": 9}, {}))))
        out.put(("writes", _outcome(lambda: cp.put_writes(read.config, [("log", "late")],
                                                         "task-late"))))


def put_racing_delete(schema: str, thread: str, rounds: int, barrier: Barrier,
                      out: Queue) -> None:
    """Per round: read the thread, meet the test (which deletes the thread at once), put a
    checkpoint chaining onto what was read. Puts (round, outcome)."""
    with saver(schema) as cp:
        config = {"configurable": {"thread_id": thread}}
        for round_ in range(rounds):
            read = cp.get_tuple(config)
            assert read is not None
            barrier.wait(30)
            ckpt = {**read.checkpoint, "id": f"1f1fff{round_:02x}-0000-6000-8000-000000000000"}
            out.put((round_, _outcome(lambda c=ckpt, r=read: cp.put(
                r.config, c, {"source": "loop", "step": 9}, {}))))
            barrier.wait(30)  # the test checks, and starts the thread again


def _outcome(fn: Any) -> str:
    try:
        fn()
        return "stored"
    except ConcurrentWriteError as exc:
        return type(exc).__name__


def stalled_holder(schema: str, thread: str) -> None:
    """Take a lease of `thread` (ttl 1 s, no keep-alive), read it, say READY, wait for a
    line on stdin (the test stops this process meanwhile, past the lease), then put
    chaining onto what it read, and print the outcome."""
    with saver(schema) as cp:
        lease = cp.lease(thread, ttl=1.0, keep_alive=False).acquire()
        config = lease.config({"configurable": {"thread_id": thread}})
        read = cp.get_tuple(config)
        assert read is not None
        print("READY", flush=True)
        sys.stdin.readline()
        outcome = _outcome(lambda: cp.put(
            lease.config(read.config),
            {**read.checkpoint, "id": "1f1ffffe-0000-6000-8000-000000000000"},
            {"source": "loop", "step": 9}, {}))
        with contextlib.suppress(Exception):
            lease.release()
        print("OUTCOME", outcome, flush=True)


if __name__ == "__main__":
    stalled_holder(sys.argv[1], sys.argv[2])
