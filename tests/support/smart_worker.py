"""Run in a separate process by test_smart_kill.py, then killed with SIGKILL.

    python -m tests.support.smart_worker pause <db> <policy>   pause at interrupt(), print PAUSED, wait
    python -m tests.support.smart_worker chat <db> <interval>  chat turns forever, printing each one
    python -m tests.support.smart_worker exit <db> <turns>     chat turns, buffered, then a normal exit
"""

from __future__ import annotations

import sys
import time

from langgraph_ckpt_ext import OnEvents, Periodic, SmartCheckpointer, SQLiteCheckpointer
from tests.support.graphs import approval_graph, chat_graph, human


def main(action: str, db: str, arg: str) -> None:
    inner = SQLiteCheckpointer(db)
    if action == "pause":
        policy = OnEvents() if arg == "events" else Periodic(3600)
        smart = SmartCheckpointer(inner, policy)
        graph = approval_graph().compile(checkpointer=smart)
        graph.invoke({"request": "refund", "log": []}, {"configurable": {"thread_id": "p"}})
        print("PAUSED", flush=True)
        time.sleep(600)
    elif action == "exit":  # buffered, never flushed by hand: the interpreter's exit writes it
        smart = SmartCheckpointer(inner, Periodic(3600))
        graph = chat_graph().compile(checkpointer=smart)
        for i in range(int(arg)):
            graph.invoke({"messages": [human(f"turn {i}")]}, {"configurable": {"thread_id": "x"}})
        print("BUFFERED", smart.metrics.buffered, flush=True)
    else:
        smart = SmartCheckpointer(inner, Periodic(float(arg)))
        graph = chat_graph().compile(checkpointer=smart)
        config = {"configurable": {"thread_id": "c"}}
        for i in range(1, 100000):
            graph.invoke({"messages": [human(f"turn {i}")]}, config)
            print(f"TURN {i} {time.time():.3f}", flush=True)
            time.sleep(0.01)


if __name__ == "__main__":
    main(*sys.argv[1:4])
