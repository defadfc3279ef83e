"""Run in separate processes by the sweep tests: fills a store with threads, or sweeps it
with an injected clock, printing what it did (one JSON line per event), so that a test can
run two at once or kill one halfway.

    python -m tests.support.sweep_worker TARGET fill N CHECKPOINTS CLOCK
    python -m tests.support.sweep_worker TARGET sweep CLOCK IDLE [LIMIT] [PAUSE]

TARGET is `sqlite:<path>`, `postgres:<schema>` or `redis:<key prefix>` (see `open_target`).
`sweep` deletes every thread not written for IDLE seconds at time CLOCK; with PAUSE it works on
one thread at a time and waits after each thread it deletes (the store's `expire_thread` is
wrapped), so that a test can SIGKILL it mid-pass: PAUSE seconds, or with PAUSE `step` until it
reads a line on stdin (at the end of stdin it goes on without waiting), so that a test holds it
mid-pass for as long as it needs, however busy the machine.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from langgraph_ckpt_ext import Retention
from langgraph_ckpt_ext.core.saver import StoreCheckpointer
from tests.support.lifecycle import put_chain
from tests.support.migrate_worker import open_target


def say(**event: Any) -> None:
    print(json.dumps(event), flush=True)


def fill(saver: StoreCheckpointer, threads: int, per_thread: int) -> None:
    """`threads` threads `t00000`... of `per_thread` checkpoints each (a growing list)."""
    for t in range(threads):
        put_chain(saver, f"t{t:05d}", per_thread)
    say(event="filled", threads=threads)


def main(target: str, mode: str, *args: str) -> None:
    saver = open_target(target)
    try:
        if mode == "fill":
            threads, per_thread, clock = int(args[0]), int(args[1]), float(args[2])
            saver.clock = lambda: clock
            fill(saver, threads, per_thread)
        elif mode == "sweep":
            clock, idle = float(args[0]), float(args[1])
            limit = int(args[2]) if len(args) > 2 and args[2] != "-" else None
            pause = args[3] if len(args) > 3 else ""
            saver.clock = lambda: clock
            saver.retention = Retention(idle=idle)
            if pause:  # one thread at a time, so that a kill lands between two of them
                saver._sweep_in_flight = 1
            store: Any = saver._store
            expire = store.expire_thread

            async def slow_expire(thread_id: str, generation: int, tombstone: bool = False
                                  ) -> bool:
                done = await expire(thread_id, generation, tombstone)
                say(event="expired", thread=thread_id, done=done)
                if pause == "step":
                    sys.stdin.readline()
                elif pause:
                    time.sleep(float(pause))
                return bool(done)

            store.expire_thread = slow_expire
            say(event="start")
            report = saver.sweep(limit)
            say(event="done", deleted=len(report.deleted), locked_out=report.locked_out,
                busy=len(report.busy), examined=report.examined)
        else:
            raise SystemExit(f"unknown mode {mode!r}")
    finally:
        saver.close()


if __name__ == "__main__":
    main(*sys.argv[1:])
