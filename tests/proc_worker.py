"""Run in a separate Python process by test_processes.py."""

from __future__ import annotations

import sys

from langgraph.types import Command

from langgraph_ckpt_ext import SQLiteCheckpointer
from tests.graphs import approval_graph, chat_graph, human


def main(action: str, path: str, thread: str) -> None:
    with SQLiteCheckpointer(path) as saver:
        config = {"configurable": {"thread_id": thread}}
        if action == "start":
            out = approval_graph().compile(checkpointer=saver).invoke(
                {"request": "refund", "log": []}, config
            )
            print("PAUSED", out["__interrupt__"][0].value["question"])
        elif action == "resume":
            out = approval_graph().compile(checkpointer=saver).invoke(Command(resume="yes"), config)
            print("DONE", "|".join(out["log"]))
        elif action == "chat":
            graph = chat_graph().compile(checkpointer=saver)
            for i in range(25):
                graph.invoke({"messages": [human(f"{thread} {i}")]}, config)
            print("CHAT", graph.get_state(config).values["turns"])


if __name__ == "__main__":
    main(*sys.argv[1:4])
