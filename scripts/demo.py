"""A small agent graph on SQLite that pauses for a human's approval, is resumed by a second
process, then prints the thread's history and a fork.

    python scripts/demo.py [--db PATH]

No LLM: the nodes are deterministic fakes. `resume` is the second process's mode, which the
demo starts itself.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import uuid
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Command, StateSnapshot, interrupt

from langgraph_ckpt_ext import SQLiteCheckpointer

REQUEST = "The build server's disk is full. Please fix it."


class State(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]
    plan: list[str]
    status: str


def plan(state: State) -> State:
    steps = ["find build caches older than 30 days", "delete them (12 GB)"]
    return {"plan": steps, "status": "planned", "messages": [AIMessage("Plan: " + "; ".join(steps))]}


def act(state: State) -> State:
    decision = interrupt({"action": "rm -rf /var/cache/build/old-*", "frees": "12 GB"})
    if decision == "approve":
        return {"status": "approved", "messages": [AIMessage("Deleted 412 old caches: 12 GB free.")]}
    return {"status": "rejected", "messages": [AIMessage("Left the caches alone, as asked.")]}


def finish(state: State) -> State:
    if state["status"] == "approved":
        answer = "the disk has room again."
    else:
        answer = "nothing deleted; the disk is still full."
    return {"messages": [AIMessage(f"Final answer: {answer}")]}


def build_graph(checkpointer: SQLiteCheckpointer) -> CompiledStateGraph:
    builder = StateGraph(State)
    builder.add_node("plan", plan)
    builder.add_node("act", act)
    builder.add_node("finish", finish)
    builder.add_edge(START, "plan")
    builder.add_edge("plan", "act")
    builder.add_edge("act", "finish")
    builder.add_edge("finish", END)
    return builder.compile(checkpointer=checkpointer)


def config(thread_id: str, checkpoint_id: str | None = None) -> dict[str, Any]:
    conf = {"thread_id": thread_id}
    if checkpoint_id:
        conf["checkpoint_id"] = checkpoint_id
    return {"configurable": conf}


def heading(text: str) -> None:
    print(f"\n== {text} ==")


def start(db: str, thread: str) -> None:
    heading(f"1. Process {os.getpid()} starts thread {thread!r}")
    with SQLiteCheckpointer(db) as cp:
        graph = build_graph(cp)
        graph.invoke({"messages": [HumanMessage(REQUEST)]}, config(thread))
        state = graph.get_state(config(thread))
    print(f"user:    {REQUEST}")
    print(f"agent:   {state.values['messages'][-1].content}")
    print(f"paused before {list(state.next)}; awaiting approval of {state.interrupts[0].value}")
    print("checkpointer closed: the paused thread waits in the file")


def resume(db: str, thread: str, decision: str) -> None:
    with SQLiteCheckpointer(db) as cp:
        result = build_graph(cp).invoke(Command(resume=decision), config(thread))
    print(f"process {os.getpid()} opened {db}, resumed {thread!r} with {decision!r}")
    print(f"status:  {result['status']}")
    print(f"agent:   {result['messages'][-1].content}")


def describe(snap: StateSnapshot) -> str:
    md = snap.metadata or {}
    return (
        f"step {md.get('step'):>2}  {md.get('source'):<6}  next={','.join(snap.next) or '-':<9}"
        f"  messages={len(snap.values.get('messages', []))}"
        f"  id={snap.config['configurable']['checkpoint_id'][:23]}"
    )


def history_and_fork(db: str, thread: str) -> None:
    fork_thread = f"{thread}-fork"
    with SQLiteCheckpointer(db) as cp:
        graph = build_graph(cp)
        heading(f"3. Process {os.getpid()} reopens the file: history of {thread!r}, newest first")
        history = list(graph.get_state_history(config(thread)))
        for snap in history:
            print(describe(snap))

        # Fork: copy the thread, branch it at the checkpoint that awaited approval, answer again.
        awaiting = next(s for s in history if s.next == ("act",))
        checkpoint_id = awaiting.config["configurable"]["checkpoint_id"]
        heading(f"4. Fork {fork_thread!r} from step {awaiting.metadata['step']}, answered 'reject'")
        cp.copy_thread(thread, fork_thread)
        graph.update_state(config(fork_thread, checkpoint_id), None)
        graph.invoke(Command(resume="reject"), config(fork_thread))
        print("the fork's lineage, newest first:")
        snap: StateSnapshot | None = graph.get_state(config(fork_thread))
        while snap is not None:
            print(describe(snap))
            snap = graph.get_state(snap.parent_config) if snap.parent_config else None

        heading("5. Final states")
        for name in (thread, fork_thread):
            values = graph.get_state(config(name)).values
            print(
                f"{name:<{len(fork_thread)}}  status={values['status']:<8}"
                f"  {values['messages'][-1].content}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("mode", nargs="?", choices=["demo", "resume"], default="demo")
    parser.add_argument("--db", metavar="PATH", help="SQLite file (default: a new temporary file)")
    parser.add_argument("--thread", help=argparse.SUPPRESS)
    parser.add_argument("--decision", default="approve", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.mode == "resume":
        if not (args.db and args.thread):
            parser.error("resume needs --db and --thread")
        resume(args.db, args.thread, args.decision)
        return

    db = os.path.abspath(args.db or os.path.join(tempfile.mkdtemp(prefix="lgckpt-demo-"), "demo.db"))
    thread = f"ticket-{uuid.uuid4().hex[:6]}"
    print(f"database: {db}")
    start(db, thread)

    heading("2. A second process resumes it with 'approve'")
    sys.stdout.flush()
    cmd = [sys.executable, os.path.abspath(__file__), "resume", "--db", db, "--thread", thread]
    subprocess.run(cmd, check=True)

    history_and_fork(db, thread)


if __name__ == "__main__":
    main()
