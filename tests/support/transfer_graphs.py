"""Threads for the transfer tests: written by LangGraph's official savers (interrupts, a
subgraph, a fork), the way to continue each, and what to compare between two savers."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from langchain_core.messages import BaseMessage
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import StateGraph
from langgraph.types import Command, Interrupt

from tests.support.graphs import approval_graph, chat_graph, human, subgraph_graph
from tests.support.savers import PG_DSN, drop_pg_schemas


def cfg(thread: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread}}


# thread -> (its graph, what to invoke to continue it, step by step)
CONTINUE: dict[str, tuple[Callable[[], StateGraph], list[Any]]] = {
    "approve": (approval_graph, [Command(resume="yes")]),
    "sub": (subgraph_graph, [Command(resume="fine")]),
    "chat": (chat_graph, [{"messages": [human("more")]}]),
    "fork": (approval_graph, [Command(resume="no")]),
}


def write_threads(saver: BaseCheckpointSaver[Any]) -> None:
    """Four threads: paused at an interrupt, paused inside a subgraph, a finished two-turn chat,
    and a finished run forked (`update_state`) at its interrupt."""
    approval = approval_graph().compile(checkpointer=saver)
    approval.invoke({"request": "deploy", "log": []}, cfg("approve"))
    subgraph_graph().compile(checkpointer=saver).invoke({"text": "t", "trail": []}, cfg("sub"))
    chat = chat_graph().compile(checkpointer=saver)
    chat.invoke({"messages": [human("hi")]}, cfg("chat"))
    chat.invoke({"messages": [human("again")]}, cfg("chat"))
    approval.invoke({"request": "ship", "log": []}, cfg("fork"))
    approval.invoke(Command(resume="yes"), cfg("fork"))
    paused = next(s for s in approval.get_state_history(cfg("fork")) if s.next == ("ask",))
    approval.update_state(paused.config, {"request": "ship v2"})


@contextlib.contextmanager
def official_sqlite(tmp_path: Path) -> Iterator[tuple[str, Callable[[], Any]]]:
    """A database written by LangGraph's `SqliteSaver`: its URL, and a way to open it
    writable (a context manager giving the saver)."""
    from langgraph.checkpoint.sqlite import SqliteSaver

    path = tmp_path / f"official-{uuid.uuid4().hex[:6]}.db"

    @contextlib.contextmanager
    def writable() -> Iterator[BaseCheckpointSaver[Any]]:
        conn = sqlite3.connect(path, check_same_thread=False)
        try:
            yield SqliteSaver(conn)
        finally:
            conn.close()

    with writable() as saver:
        write_threads(saver)
    yield f"sqlite:///{path}", writable
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.remove(f"{path}{suffix}")


@contextlib.contextmanager
def official_postgres() -> Iterator[tuple[str, Callable[[], Any]]]:
    """A database written by LangGraph's `PostgresSaver` in a schema of its own (set with
    `search_path` in the URL), dropped at the end."""
    import psycopg
    from langgraph.checkpoint.postgres import PostgresSaver

    schema = f"lgx_official_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    url = f"{PG_DSN}?options=-c%20search_path%3D{schema}"

    @contextlib.contextmanager
    def writable() -> Iterator[BaseCheckpointSaver[Any]]:
        with PostgresSaver.from_conn_string(url) as saver:
            yield saver

    try:
        with writable() as saver:
            saver.setup()
            write_threads(saver)
        yield url, writable
    finally:
        drop_pg_schemas(schema)


def plain(value: Any) -> Any:
    """A graph's output without what differs between two runs of the same steps: messages as
    (type, content) (new ones get random ids), interrupts as their values."""
    if isinstance(value, BaseMessage):
        return (value.type, value.content)
    if isinstance(value, Interrupt):
        return ("interrupt", plain(value.value))
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def history(graph: Any, thread: str) -> list[Any]:
    """`get_state_history` as comparable data: ids, parents, values, next, step, source, and
    the tasks with their interrupts; the subgraph states of the newest checkpoint too."""
    out = []
    for s in graph.get_state_history(cfg(thread)):
        out.append((
            s.config["configurable"]["checkpoint_id"],
            s.parent_config["configurable"]["checkpoint_id"] if s.parent_config else None,
            s.values, s.next, s.metadata.get("step"), s.metadata.get("source"),
            [(t.name, [i.value for i in t.interrupts]) for t in s.tasks],
        ))
    latest = graph.get_state(cfg(thread), subgraphs=True)
    out.append([(t.name, t.state.values, t.state.next, t.state.config)
                for t in latest.tasks if t.state is not None])
    return out


