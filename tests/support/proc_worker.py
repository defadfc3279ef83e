"""Run in a separate Python process by test_processes.py.

`target` is a SQLite file path, or `postgres:<schema>` for the test PostgreSQL database.
"""

from __future__ import annotations

import sys

from langgraph.types import Command

from langgraph_ckpt_ext import PostgresCheckpointer, SQLiteCheckpointer
from langgraph_ckpt_ext.core.saver import StoreCheckpointer
from tests.support.graphs import approval_graph, chat_graph, human
from tests.support.savers import PG_DSN


def open_saver(target: str) -> StoreCheckpointer:
    if target.startswith("postgres:"):
        return PostgresCheckpointer(PG_DSN, schema=target.split(":", 1)[1])
    return SQLiteCheckpointer(target)


def main(actions: str, target: str, thread: str) -> None:
    with open_saver(target) as saver:
        config = {"configurable": {"thread_id": thread}}
        for action in actions.split("+"):
            if action == "start":
                out = approval_graph().compile(checkpointer=saver).invoke(
                    {"request": "refund", "log": []}, config
                )
                print("PAUSED", out["__interrupt__"][0].value["question"], flush=True)
            elif action == "resume":
                graph = approval_graph().compile(checkpointer=saver)
                out = graph.invoke(Command(resume="yes"), config)
                print("DONE", "|".join(out["log"]), flush=True)
            elif action == "chat":
                graph = chat_graph().compile(checkpointer=saver)
                chat = {"configurable": {"thread_id": f"{thread}-chat"}}
                for i in range(25):
                    graph.invoke({"messages": [human(f"{thread} {i}")]}, chat)
                print("CHAT", graph.get_state(chat).values["turns"], flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:4])
