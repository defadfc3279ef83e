"""LangGraph's own server (`langgraph dev`, in-memory runtime) with
`langgraph_ckpt_ext.server:checkpointer` on SQLite, driven over HTTP with `langgraph_sdk`:
a thread run to an interrupt and resumed, its history read, copied twice, one copy deleted;
then the server restarted, and the thread, its history and the kept copy read back through
the API and straight from our SQLite file."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from langgraph_sdk import get_sync_client
from langgraph_sdk.errors import NotFoundError

from langgraph_ckpt_ext import SQLiteCheckpointer

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "langgraph_server"
LANGGRAPH = Path(sys.executable).with_name("langgraph")
START_DEADLINE = 90.0  # seconds for /ok to answer (imports and graph loading, on a busy box)
RUN_DEADLINE = 120.0  # seconds for a run of these tiny graphs to end, on a busy box


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class DevServer:
    """One `langgraph dev` process group in `app`, logging to `app/server-N.log`."""

    def __init__(self, app: Path, env: dict[str, str]) -> None:
        self.app, self.env = app, env
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.log = app / "server.log"
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        port = _free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.log = self.app / f"server-{self.starts}.log"
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [str(LANGGRAPH), "dev", "--port", str(port), "--host", "127.0.0.1",
                 "--no-browser", "--no-reload"],
                cwd=self.app, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True)
        self._wait_ok()

    def _wait_ok(self) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + START_DEADLINE
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"langgraph dev exited with {self.proc.returncode}:\n{self.tail()}")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{self.url}/ok", timeout=2).status_code == 200:
                    return
            with contextlib.suppress(subprocess.TimeoutExpired):  # the poll interval
                self.proc.wait(timeout=0.2)
        pytest.fail(f"langgraph dev did not answer /ok in {START_DEADLINE:.0f} s:\n"
                    f"{self.tail()}")

    def run(self, client: Any, thread_id: str, assistant: str, **kwargs: Any) -> Any:
        """`client.runs.wait` under a deadline: a run that never ends fails the test with the
        server's log instead of hanging the suite (`runs.wait` itself has none)."""
        run_id = client.runs.create(thread_id, assistant, **kwargs)["run_id"]
        _poll(lambda: client.runs.get(thread_id, run_id)["status"] not in ("pending", "running"),
              self, RUN_DEADLINE)
        assert client.runs.get(thread_id, run_id)["status"] != "error", self.tail()
        return client.runs.join(thread_id, run_id)

    def tail(self, lines: int = 60) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else "(no log)"
        text = re.sub(r"\x1b\[[0-9;]*m", "", text)  # the server's colours
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[DevServer]:
    app = tmp_path / "app"
    app.mkdir()
    for name in ("graph.py", "langgraph.json"):
        shutil.copy(EXAMPLE / name, app / name)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("LANGGRAPH_", "LGCKPT_", "LANGSMITH_", "LANGCHAIN_"))}
    env.update(LGCKPT_URL=f"sqlite:///{tmp_path / 'ckpt.db'}", LANGSMITH_TRACING="false",
               LANGGRAPH_CLI_NO_ANALYTICS="1", PYTHONUNBUFFERED="1")
    dev = DevServer(app, env)
    try:
        yield dev
    finally:
        dev.stop()


def _ids(history: list[dict[str, Any]]) -> list[str]:
    return [h["checkpoint"]["checkpoint_id"] for h in history]


def _stored(db: Path, thread_id: str) -> list[str]:
    """Checkpoint ids of a thread in our SQLite file, newest first."""
    with SQLiteCheckpointer(db) as cp:
        return [t.config["configurable"]["checkpoint_id"]
                for t in cp.list({"configurable": {"thread_id": thread_id}})]


def test_langgraph_dev_runs_on_our_checkpointer_and_survives_a_restart(
    server: DevServer, tmp_path: Path
) -> None:
    db = tmp_path / "ckpt.db"
    server.start()
    assert "Using custom checkpointer: SQLiteCheckpointer" in server.tail(400), server.tail()
    client = get_sync_client(url=server.url)

    thread = client.threads.create()
    tid = thread["thread_id"]
    server.run(client, tid, "agent", input={"topic": "otters", "log": []})
    paused = client.threads.get_state(tid)
    assert paused["next"] == ["review"], paused
    [interrupt] = paused["tasks"][0]["interrupts"]
    assert interrupt["value"] == {"question": "publish?", "draft": "draft about otters"}

    server.run(client, tid, "agent", command={"resume": "yes"})
    done = client.threads.get_state(tid)
    assert done["next"] == []
    assert done["values"]["log"] == ["draft about otters", "review: yes", "published"]

    history = client.threads.get_history(tid, limit=100)
    assert [h["values"].get("log") for h in history][:2] == [
        done["values"]["log"], ["draft about otters", "review: yes"]]
    assert len(history) >= 5  # input, draft, review (paused), review, publish
    assert _ids(history) == _stored(db, tid), "the API's history is not our store's"
    with SQLiteCheckpointer(db) as cp:  # the server's metadata, its request id left out
        stored = [t.metadata for t in cp.list({"configurable": {"thread_id": tid}})]
    assert all(m.get("graph_id") == "agent" and "assistant_id" in m for m in stored), stored
    assert not any("langgraph_request_id" in m for m in stored), stored[0]

    kept = client.threads.copy(tid)["thread_id"]
    dropped = client.threads.copy(tid)["thread_id"]
    assert client.threads.get_state(kept)["values"] == done["values"]
    kept_ids = _stored(db, kept)
    assert kept_ids == _ids(history)  # the whole history, its checkpoint ids kept
    client.threads.delete(dropped)
    assert _stored(db, dropped) == []
    with pytest.raises(NotFoundError):
        client.threads.get(dropped)

    server.stop()
    assert _stored(db, tid) == _ids(history)  # in the file, with no server running
    server.start()
    client = get_sync_client(url=server.url)

    assert client.threads.get_state(tid)["values"] == done["values"]
    assert _ids(client.threads.get_history(tid, limit=100)) == _ids(history)
    assert client.threads.get_state(kept)["values"] == done["values"]
    assert _stored(db, kept) == kept_ids
    assert _stored(db, dropped) == []

    # the thread goes on after the restart: a new run on it reads its old state
    server.run(client, tid, "agent", input={"topic": "seals", "log": []})
    assert client.threads.get_state(tid)["values"]["log"][:4] == [
        *done["values"]["log"], "draft about seals"]


PLAN_GRAPH = '''
from typing import TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt
from pydantic import BaseModel


class Plan(BaseModel):
    steps: list[str]


class State(TypedDict, total=False):
    plan: Plan
    kind: str


def make(state: State) -> dict:
    return {"plan": Plan(steps=["look", "leap"])}


def ask(state: State) -> dict:
    interrupt("go?")
    return {"kind": type(state["plan"]).__name__}  # as read back from the checkpoint


builder = StateGraph(State)
builder.add_node("make", make)
builder.add_node("ask", ask)
builder.add_edge(START, "make")
builder.add_edge("make", "ask")
builder.add_edge("ask", END)
graph = builder.compile()
'''


SERDE_FORMS: dict[str, tuple[dict[str, Any] | None, str]] = {
    # langgraph.json's checkpointer.serde -> the type a resumed run reads the plan back as
    "absent": (None, "Plan"),  # the graph's own class is a loaded data type
    "json-modules": ({"allowed_json_modules": [["__plan_graph", "Plan"]]}, "Plan"),
    "msgpack-list": ({"allowed_msgpack_modules": [["__plan_graph", "Plan"]]}, "Plan"),
    "msgpack-true": ({"allowed_msgpack_modules": True}, "Plan"),
    "msgpack-null": ({"allowed_msgpack_modules": None}, "dict"),  # strict: its fields
}


@pytest.mark.parametrize("form", list(SERDE_FORMS))
def test_a_state_class_comes_back_as_serde_says(server: DevServer, form: str) -> None:
    """`checkpointer.serde` in each form langgraph-cli documents (a graph loaded from
    `./plan_graph.py` lives in module `__plan_graph`): the graph's own class comes back as
    itself, except where the settings ask for strict loading."""
    serde, kind = SERDE_FORMS[form]
    (server.app / "plan_graph.py").write_text(PLAN_GRAPH)
    checkpointer: dict[str, Any] = {"path": "langgraph_ckpt_ext.server:checkpointer"}
    if serde is not None:
        checkpointer["serde"] = serde
    (server.app / "langgraph.json").write_text(json.dumps({
        "dependencies": ["."], "graphs": {"plan": "./plan_graph.py:graph"},
        "checkpointer": checkpointer}))
    server.start()
    client = get_sync_client(url=server.url)
    tid = client.threads.create()["thread_id"]
    server.run(client, tid, "plan", input={})
    done = server.run(client, tid, "plan", command={"resume": True})
    assert done == {"plan": {"steps": ["look", "leap"]}, "kind": kind}, server.tail()


WAIT_GRAPH = '''
import asyncio
from pathlib import Path
from typing import TypedDict

from langgraph.graph import END, START, StateGraph


class State(TypedDict):
    release: str
    done: bool


async def wait(state: State) -> dict:
    while not Path(state["release"]).exists():  # the run's work: until released
        await asyncio.sleep(0.05)
    return {"done": True}


builder = StateGraph(State)
builder.add_node("wait", wait)
builder.add_edge(START, "wait")
builder.add_edge("wait", END)
graph = builder.compile()
'''


def _runs_stored(db: Path, thread_id: str) -> set[str]:
    with SQLiteCheckpointer(db) as cp:
        return {str(t.metadata.get("run_id"))
                for t in cp.list({"configurable": {"thread_id": thread_id}})}


def test_a_rolled_back_run_leaves_no_checkpoint(server: DevServer, tmp_path: Path) -> None:
    """`runs.cancel(..., action="rollback")`: the server deletes the run and calls our
    `adelete_for_runs`; the run's checkpoints go, an earlier run's stay."""
    db = tmp_path / "ckpt.db"
    (server.app / "wait_graph.py").write_text(WAIT_GRAPH)
    (server.app / "langgraph.json").write_text(json.dumps({
        "dependencies": ["."], "graphs": {"wait": "./wait_graph.py:graph"},
        "checkpointer": {"path": "langgraph_ckpt_ext.server:checkpointer"}}))
    server.start()
    client = get_sync_client(url=server.url)
    tid = client.threads.create()["thread_id"]
    released = tmp_path / "released"
    released.touch()
    first = server.run(client, tid, "wait", input={"release": str(released), "done": False})
    assert first["done"] is True
    kept = _runs_stored(db, tid)
    held = client.runs.create(tid, "wait", input={"release": str(tmp_path / "never"),
                                                  "done": False})
    _poll(lambda: held["run_id"] in _runs_stored(db, tid), server)  # it has checkpoints
    client.runs.cancel(tid, held["run_id"], wait=True, action="rollback")
    _poll(lambda: _runs_stored(db, tid) == kept, server)  # however the server orders it


def _poll(done: Callable[[], bool], server: DevServer, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while not done():
        assert time.monotonic() < deadline, server.tail()
        time.sleep(0.05)  # the poll interval, under a deadline
