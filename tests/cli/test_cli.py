"""`lgckpt`, run as a subprocess (`python -m langgraph_ckpt_ext`, and the console script) against
stores that real compiled graphs wrote: SQLite files, PostgreSQL schemas and Redis key prefixes
of their own. Text and JSON output, exit codes, dry runs, paused threads, tampering, bad input.

A new `python -m langgraph_ckpt_ext` costs about a second (the imports): runs are forked from
a process that imported the command line once (tests/support/forked.py); the console
script itself is started whole where a test says so."""

from __future__ import annotations

import io
import json
import operator
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command

from langgraph_ckpt_ext.cli import build_parser, main
from langgraph_ckpt_ext.cli.output import Output, cell
from langgraph_ckpt_ext.cli.selection import checkpoint_ref
from langgraph_ckpt_ext.core.saver import StoreCheckpointer
from langgraph_ckpt_ext.migrations import SchemaChain
from tests.support.common import conf
from tests.support.forked import run_lgckpt
from tests.support.graphs import approval_graph, chat_graph, human, subgraph_graph
from tests.support.lifecycle import later_id
from tests.support.savers import PG_DSN, REDIS_URL, SaverHandle, open_saver, params
from tests.support.schema_graphs import graph_v1, v1_message

REPO = Path(__file__).resolve().parents[2]
LGCKPT = shutil.which("lgckpt") or str(Path(sys.executable).parent / "lgckpt")
BACKENDS = ["sqlite", "postgres", "redis"]


@dataclass
class Run:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        assert self.code == 0, self
        return json.loads(self.out)


def lgckpt(*args: str, url: str | None = None, script: bool = False,
           env: dict[str, str] | None = None) -> Run:
    """Run the command line in a process of its own (`script`: the console script, started
    whole; else forked from a process that imported it once); `url` goes after the
    command's arguments."""
    full_env = {k: v for k, v in os.environ.items() if k not in ("LGCKPT_URL", "NO_COLOR")}
    full_env.update(env or {})
    argv = [*args, *(["--url", url] if url is not None else [])]
    if not script:
        return Run(*run_lgckpt(argv, env=full_env, cwd=REPO))
    done = subprocess.run([LGCKPT, *argv], capture_output=True, text=True, timeout=120,
                          env=full_env, cwd=REPO)
    return Run(done.returncode, done.stdout, done.stderr)


def fails(run: Run, code: int, *words: str) -> str:
    """Assert one line on stderr, nothing on stdout, the exit code; the line."""
    assert run.code == code, run
    lines = run.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lgckpt: error: "), run
    assert run.out == "", run
    for word in words:
        assert word in lines[0], (word, lines[0])
    return lines[0]


# -- stores written by real graphs ---------------------------------------------------------------


class BrokenState(TypedDict):
    log: Annotated[list[str], operator.add]


def broken_graph() -> StateGraph:
    def boom(state: BrokenState) -> dict[str, Any]:
        raise ValueError("boom")

    b = StateGraph(BrokenState)
    b.add_node("boom", boom)
    b.add_edge(START, "boom")
    b.add_edge("boom", END)
    return b


def write_threads(cp: StoreCheckpointer) -> None:
    """chat (two turns, done), approval (paused at interrupt()), approved (resumed, done),
    sub (paused inside a subgraph), broken (a node failed)."""
    chat = chat_graph().compile(checkpointer=cp)
    for i in range(2):
        chat.invoke({"messages": [human(f"hello {i}")]}, conf("chat"))
    approval = approval_graph().compile(checkpointer=cp)
    approval.invoke({"request": "deploy", "log": []}, conf("approval"))
    approval.invoke({"request": "ship", "log": []}, conf("approved"))
    approval.invoke(Command(resume="yes"), conf("approved"))
    subgraph_graph().compile(checkpointer=cp).invoke({"text": "x", "trail": []}, conf("sub"))
    with pytest.raises(ValueError, match="boom"):
        broken_graph().compile(checkpointer=cp).invoke({"log": ["x"]}, conf("broken"))


@dataclass
class Store:
    backend: str
    url: str
    handle: SaverHandle  # its saver closed: `open` reopens the storage
    tmp_path: Path

    def open(self, **options: Any) -> StoreCheckpointer:
        """A fresh checkpointer over the store (no cache of what was written)."""
        return self.handle.reopen(**options)

    def snapshot(self) -> dict[str, Any]:
        """Every thread's checkpoint ids and stored sizes: what a command must not change."""
        with self.open() as cp:
            return {t: ([c.config["configurable"]["checkpoint_id"] for c in cp.list(conf(t))],
                        cp.sizes(t)) for t in cp.thread_ids()}


def new_store(backend: str, tmp_path: Path, **options: Any) -> Store:
    h = open_saver(backend, tmp_path, **options)
    h.saver.close()
    return Store(backend, h.store_url(), h, tmp_path)


@pytest.fixture(params=params(BACKENDS))
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    s = new_store(str(request.param), tmp_path)
    try:
        with s.open() as cp:
            write_threads(cp)
        yield s
    finally:
        s.handle.cleanup()


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Store:
    s = new_store("sqlite", tmp_path)
    with s.open() as cp:
        write_threads(cp)
    return s


# -- reading ---------------------------------------------------------------------------------------


def test_read_commands(store: Store) -> None:
    """Every read command in JSON on each backend; nothing changes."""
    before = store.snapshot()
    url = store.url
    rows = {r["thread_id"]: r for r in lgckpt("threads", "--json", url=url).json()}
    assert {t: r["status"] for t, r in rows.items()} == {
        "approval": "awaiting_human", "approved": "done", "broken": "error", "chat": "done",
        "sub": "awaiting_human",
    }
    with store.open() as cp:
        for thread_id, row in rows.items():
            assert row["bytes"] == sum(s.bytes for s in cp.sizes(thread_id)) > 0
            assert row["checkpoints"] == len(list(cp.list(conf(thread_id))))
    assert rows["approval"]["next"] == ["ask"] and rows["chat"]["last_update"]

    history = lgckpt("history", "chat", "--json", url=url).json()
    assert [h["step"] for h in history] == [4, 3, 2, 1, 0, -1]
    assert history[0]["next"] == [] and history[1]["next"] == ["agent"]
    assert history[1]["writes"] == ["messages", "turns"] and history[2]["source"] == "input"

    shown = lgckpt("show", "approval", "--json", url=url).json()
    assert shown["status"] == "awaiting_human" and shown["next"] == ["ask"]
    assert shown["interrupts"] == [{"question": "approve deploy?"}]
    assert shown["values"] == {"request": "deploy", "log": ["proposed deploy"]}
    assert [w["channel"] for w in shown["pending_writes"]] == ["__interrupt__"]

    old = history[-3]["checkpoint_id"]  # step 1: the first turn done
    diff = lgckpt("diff", f"chat:{old}", "chat", "--json", url=url).json()
    kinds = [(c["path"][0], c["kind"]) for c in diff["changes"]]
    assert kinds == [("messages", "message_added")] * 2 + [("turns", "changed")]
    assert diff["labels"] == [f"chat@{old}", f"chat@{history[0]['checkpoint_id']}"]

    totals = {r["thread_id"]: r for r in lgckpt("stats", "--json", url=url).json()}
    assert {t: r["bytes"] for t, r in totals.items()} == {t: r["bytes"] for t, r in rows.items()}
    detail = lgckpt("stats", "sub", "--json", url=url).json()
    assert {d["kind"] for d in detail} == {"checkpoint", "blob", "write"}
    assert any(d["checkpoint_ns"].startswith("child:") for d in detail)
    assert sum(d["bytes"] for d in detail) == rows["sub"]["bytes"]
    assert {"text", "trail"} <= {d["channel"] for d in detail if d["kind"] == "blob"}
    whole = {r["figure"]: r["value"] for r in lgckpt("stats", "--store", "--json",
                                                      url=url).json()}
    assert whole["threads"] == len(rows) and whole["audited"] is False
    assert whole["bytes"] == sum(r["bytes"] for r in rows.values())
    assert whole["checkpoints"] == sum(r["checkpoints"] for r in rows.values())
    assert whole["checkpoints migrated"] == 0 and whole["threads erased"] == 0
    fails(lgckpt("stats", "chat", "--store", url=url), 2, "--store")

    run = lgckpt("verify", "chat", "--json", url=url)  # written without audit=True
    assert run.code == 6 and json.loads(run.out)[0]["status"] == "not audited"
    fails(Run(6, "", run.err), 6, "audit off", "audit=True")
    assert store.snapshot() == before


def test_text_output(sqlite_store: Store) -> None:
    """What the read commands print for a reader; options before or after the command, the
    URL from the environment."""
    url = sqlite_store.url
    page = lgckpt("--url", url, "--json", "threads", "--no-color", "--limit", "2",
                  "--after", "approval")
    assert [r["thread_id"] for r in page.json()] == ["approved", "broken"]
    lines = lgckpt("threads", "--limit", "2", "--after", "approval",
                   env={"LGCKPT_URL": url}).out.splitlines()
    assert lines[0].split() == ["THREAD", "ID", "CHECKPOINTS", "BYTES", "LAST", "UPDATE", "STATUS"]
    assert lines[1].startswith("approved ") and lines[1].endswith("done")
    assert lines[2].startswith("broken ") and lines[2].endswith("error")
    assert lines[3] == "(more threads follow: --after broken)" and len(lines) == 4

    head, *entries = lgckpt("history", "sub", "--subgraphs", "--limit", "4",
                            url=url).out.splitlines()
    assert head.split()[:5] == ["CHECKPOINT", "ID", "CHECKPOINT", "NS", "STEP"]
    assert len(entries) == 4 and any(" child:" in e for e in entries)
    assert "__interrupt__" in entries[0] and "\033[" not in head
    with sqlite_store.open() as cp:
        child = next(e.checkpoint_ns for e in cp.history("sub", subgraphs=True) if e.checkpoint_ns)
    inner = lgckpt("history", "sub", "--ns", child, "--json", url=url).json()
    assert [(h["checkpoint_ns"], h["next"]) for h in inner] == [(child, ["inner_step"]),
                                                                 (child, ["__start__"])]

    with sqlite_store.open() as cp:
        ids = [e.checkpoint_id for e in cp.history("chat")]
    text = lgckpt("show", "chat", ids[2], url=url).out
    assert f"checkpoint {ids[2]}" in text and "step       2 (input)" in text
    assert "status     running" in text and "(2 messages)" in text and "ai: echo: hello 0" in text
    assert "  messages: [human: hello 1]" in text  # the step's pending write

    text = lgckpt("diff", f"chat:{ids[3]}", "chat", url=url).out.splitlines()
    assert text[:2] == [f"--- chat@{ids[3]}", f"+++ chat@{ids[0]}"]
    assert text[2].startswith("+ messages[id=") and 'HumanMessage "hello 1"' in text[2]
    assert text[-1].split() == ["~", "turns:", "1", "->", "2", "(+1)"]

    lines = lgckpt("stats", "chat", url=url).out.splitlines()
    assert lines[0].split() == ["CHECKPOINT", "NS", "KIND", "CHANNEL", "ROWS", "BYTES"]
    assert lines[1].split()[:4] == ["-", "checkpoint", "-", "6"]
    assert lines[-1].startswith("total: ") and " KiB in " in lines[-1]


def test_one_checkpoint_reference_everywhere(store: Store) -> None:
    """THREAD:CHECKPOINT and THREAD CHECKPOINT name a checkpoint in show, history, diff and fork
    alike; a thread id holding ':' is read whole unless what follows the last ':' is a
    checkpoint stored in the thread before it; `THREAD:` is the thread's newest."""
    url = store.url
    with store.open() as cp:
        ids = [e.checkpoint_id for e in cp.history("chat")]
        cp.copy_thread("chat", "user:42")
        cp.copy_thread("chat", f"odd:{ids[1]}")  # looks like THREAD:CHECKPOINT, is a thread
    for ref in ([f"chat:{ids[2]}"], ["chat", ids[2]], [f"user:42:{ids[2]}"],
                ["user:42", ids[2]]):
        shown = lgckpt("show", *ref, "--json", url=url).json()
        assert (shown["thread_id"], shown["checkpoint_id"]) == (ref[0].split(":" + ids[2])[0],
                                                                ids[2]), ref
    for ref, thread in (("user:42", "user:42"), ("user:42:", "user:42"),
                        (f"odd:{ids[1]}", f"odd:{ids[1]}"), (f"odd:{ids[1]}:", f"odd:{ids[1]}")):
        shown = lgckpt("show", ref, "--json", url=url).json()
        assert (shown["thread_id"], shown["checkpoint_id"]) == (thread, ids[0]), ref
    listed = lgckpt("history", f"chat:{ids[2]}", "--limit", "2", "--json", url=url).json()
    assert listed == lgckpt("history", "chat", "--json", url=url).json()[2:4]
    fails(lgckpt("history", f"chat:{ids[2]}", "--before", ids[3], url=url), 2, "--before")
    diff = lgckpt("diff", f"chat:{ids[3]}", f"user:42:{ids[0]}", "--json", url=url).json()
    assert diff["labels"] == [f"chat@{ids[3]}", f"user:42@{ids[0]}"]
    forked = lgckpt("fork", f"chat:{ids[2]}", "--to", "chat-2", "--json", url=url).json()
    assert (forked["source_thread_id"], forked["checkpoint_id"]) == ("chat", ids[2])
    absent = later_id()
    fails(lgckpt("show", f"chat:{absent}", url=url), 3, f"{absent!r} is not stored")
    # values read as JSON-like text, not Python reprs
    text = lgckpt("show", "approval", url=url).out
    assert '{"question": "approve deploy?"}' in text and "{'question'" not in text
    assert '["proposed deploy"]' in text and "['proposed" not in text


# -- writing ---------------------------------------------------------------------------------------


def test_fork_and_prune(store: Store) -> None:
    url = store.url
    with store.open() as cp:
        ids = [e.checkpoint_id for e in cp.history("chat")]
    forked = lgckpt("fork", "chat", ids[2], "--to", "chat-fork", "--json", url=url).json()
    assert forked == {"source_thread_id": "chat", "checkpoint_id": ids[2],
                      "thread_id": "chat-fork"}
    before = store.snapshot()
    assert before["chat-fork"][0][0] == ids[2] and len(before["chat-fork"][0]) == 4
    fails(lgckpt("fork", "chat", "--to", "chat-fork", url=url), 4, "'chat-fork' already holds")

    plan = {r["thread_id"]: r for r in lgckpt("prune", "--all", "--dry-run", "--json",
                                             url=url).json()}
    assert store.snapshot() == before
    assert plan["approval"]["status"] == plan["sub"]["status"] == "skipped: awaiting human"
    assert plan["approval"]["removed"] == 0 and plan["approval"]["kept"] == 3
    assert plan["chat"]["status"] == "would remove" and plan["chat"]["kept"] == 1
    assert [c["checkpoint_id"] for c in plan["chat"]["checkpoints"]] == ids[1:]

    text = lgckpt("prune", "--all", url=url).out
    assert "skipped: awaiting human" in text and "--include-paused" in text
    after = store.snapshot()
    assert after["approval"] == before["approval"] and after["sub"] == before["sub"]
    assert after["chat"][0] == ids[:1]
    with store.open() as cp:
        done = approval_graph().compile(checkpointer=cp).invoke(Command(resume="ok"),
                                                                conf("approval"))
        assert done["log"][-1] == "acted on ok"  # the paused thread resumes
        assert chat_graph().compile(checkpointer=cp).get_state(conf("chat")).values["turns"] == 2

    run = lgckpt("prune", "sub", "--strategy", "delete", "--include-paused", "--json", url=url)
    assert [(r["status"], r["kept"]) for r in run.json()] == [("removed", 0)]
    with store.open() as cp:
        assert "sub" not in cp.thread_ids() and cp.sizes("sub") == []


@pytest.mark.parametrize("backend", params(BACKENDS))
def test_migrate(backend: str, tmp_path: Path) -> None:
    s = new_store(backend, tmp_path)
    try:
        _migrate(s)
    finally:
        s.handle.cleanup()


def _migrate(s: Store) -> None:
    with s.open() as cp:  # v1 threads: two of the echo graph, one of billing, one unstamped
        graph = graph_v1().compile(checkpointer=cp)
        for thread, name in (("m1", "echo"), ("m2", "echo"), ("b1", "billing"), ("u1", None)):
            cp.schema_chain = None if name is None else SchemaChain(1, name=name)
            graph.invoke({"messages": [v1_message("human", "hi")], "objective": "o"},
                         conf(thread))
    before = s.snapshot()
    chain = ["--chain", "tests.support.schema_graphs:CHAIN", "--path", str(REPO)]
    dry = lgckpt("migrate", *chain, "--dry-run", "--json", url=s.url).json()
    assert dry["dry_run"] and dry["threads_migrated"] == 2 and dry["checkpoints_migrated"] == 6
    assert dry["threads"] == ["m1", "m2"] and dry["chain_name"] == "echo"
    assert (dry["threads_skipped_other"], dry["threads_skipped_unstamped"]) == (1, 1)
    assert sorted((x["thread_id"], x["reason"], x["schema_name"]) for x in dry["skipped"]) == [
        ("b1", "other chain", "billing"), ("u1", "unstamped", None)]
    text = lgckpt("migrate", *chain, "--dry-run", url=s.url).out
    assert text.startswith("would migrate 6 checkpoint(s) of 2 thread(s) to schema version 3 "
                           "of chain 'echo'")
    assert "  threads: m1, m2\n" in text
    assert "skipped 1 thread(s) of other chains: b1 ('billing')" in text
    assert "skipped 1 unstamped thread(s)" in text and "--include-unstamped" in text
    assert s.snapshot() == before
    text = lgckpt("migrate", *chain, "m1", "b1", url=s.url).out
    assert text.startswith("migrated 3 checkpoint(s) of 1 thread(s) to schema version 3")
    assert "b1 ('billing')" in text
    again = lgckpt("migrate", *chain, "--json", url=s.url).json()
    assert (again["checkpoints_migrated"], again["checkpoints_current"]) == (3, 3)
    assert again["threads"] == ["m2"]
    unstamped = lgckpt("migrate", *chain, "--include-unstamped", "--json", url=s.url).json()
    assert unstamped["threads"] == ["u1"] and unstamped["threads_skipped_other"] == 1
    with s.open() as cp:  # stored values rewritten: read with no chain at all
        for thread in ("m1", "m2", "u1"):
            values = cp.get_tuple(conf(thread))
            assert values is not None and values.metadata["schema_version"] == 3
            assert values.metadata["schema_name"] == "echo"
            assert values.checkpoint["channel_values"]["goal"] == "o"
        other = cp.get_tuple(conf("b1"))  # another graph's thread: as it was written
        assert other is not None and other.metadata["schema_version"] == 1
        assert "priority" not in other.checkpoint["channel_values"]
        assert other.checkpoint["channel_values"]["objective"] == "o"
    assert [c for c, _ in s.snapshot().values()] == [c for c, _ in before.values()]
    assert s.snapshot()["b1"] == before["b1"]
    fails(lgckpt("migrate", "--chain", "tests.support.schema_graphs:graph_v1", "--path", str(REPO),
                 url=s.url), 2, "not a SchemaChain")
    fails(lgckpt("migrate", "--chain", "tests.support.schema_graphs:UNNAMED_CHAIN", "--path", str(REPO),
                 url=s.url), 2, "has no name", "--include-unstamped")


def tamper(s: Store, thread: str, channel: str, data: bytes) -> None:
    """Overwrite the oldest stored value of a thread's channel behind the checkpointer's back
    (type kept: it still decodes, to something else)."""
    if s.backend == "sqlite":
        with sqlite3.connect(s.tmp_path / "ckpt.db") as conn:
            changed = conn.execute(
                "UPDATE lgx_blobs SET data = ? WHERE thread_id = ? AND channel = ? AND "
                "checkpoint_ns = '' AND version = (SELECT MIN(version) FROM lgx_blobs WHERE "
                "thread_id = ? AND channel = ? AND checkpoint_ns = '')",
                (data, thread, channel, thread, channel)).rowcount
        assert changed == 1
    elif s.backend == "postgres":
        import psycopg

        table = f'"{s.handle.schema}".lgx_blobs'
        with psycopg.connect(PG_DSN, autocommit=True) as conn:
            changed = conn.execute(
                f"UPDATE {table} SET data = %s WHERE thread_id = %s AND channel = %s AND "
                f"checkpoint_ns = '' AND version = (SELECT MIN(version) FROM {table} WHERE "
                "thread_id = %s AND channel = %s AND checkpoint_ns = '')",
                (data, thread, channel, thread, channel)).rowcount
        assert changed == 1
    else:  # <prefix>:{<thread>}:bl, a hash: ns\0channel\0version -> base\0type\0data
        import redis

        key = f"{s.handle.prefix}:{{{thread}}}:bl"
        client = redis.Redis.from_url(REDIS_URL)
        try:
            fields = [f for f in client.hkeys(key)
                      if f.split(b"\0")[:2] == [b"", channel.encode()]]
            field = min(fields, key=lambda f: f.split(b"\0")[2])
            base, type_, _ = client.hget(key, field).split(b"\0", 2)
            client.hset(key, field, b"\0".join([base, type_, data]))
        finally:
            client.close()


@pytest.mark.parametrize("backend", params(BACKENDS))
def test_verify_finds_a_tampered_store(backend: str, tmp_path: Path) -> None:
    s = new_store(backend, tmp_path, audit=True)
    try:
        _verify_tampered(s)
    finally:
        s.handle.cleanup()


def _verify_tampered(s: Store) -> None:
    with s.open(audit=True) as cp:
        write_threads(cp)
    run = lgckpt("verify", "--all", url=s.url, script=True)  # the console script
    assert run.code == 0 and run.err == ""
    assert {line.split()[0]: line.split()[-1] for line in run.out.splitlines()[1:]} == {
        "approval": "intact", "approved": "intact", "broken": "intact", "chat": "intact",
        "sub": "intact"}
    tamper(s, "chat", "turns", b"\x05")
    run = lgckpt("verify", "chat", "approval", "--json", url=s.url)
    assert run.code == 6, run
    reports = {r["thread_id"]: r for r in json.loads(run.out)}
    assert reports["approval"]["ok"] and not reports["chat"]["ok"]
    assert reports["approval"]["checked"] == 3 and reports["chat"]["checked"] == 6
    assert {p["kind"] for p in reports["chat"]["problems"]} == {"altered"}
    assert fails(Run(6, "", run.err), 6, "verification failed for 1 of 2", "'chat'")


@pytest.mark.parametrize("backend", params(BACKENDS))
def test_fork_into_an_audited_store_verifies(backend: str, tmp_path: Path) -> None:
    """`lgckpt fork` into an audited store seals the fork, so `verify --all` passes; `lgckpt
    audit status|on|off`: off needs --reason, warns, is recorded and reported by verify."""
    s = new_store(backend, tmp_path, audit=True)
    try:
        with s.open(audit=True) as cp:
            write_threads(cp)
        assert lgckpt("fork", "chat", "--to", "chat-fork", url=s.url).code == 0
        run = lgckpt("verify", "--all", url=s.url)
        assert run.code == 0 and run.err == "", run
        assert {line.split()[0]: line.split()[-1] for line in run.out.splitlines()[1:]}[
            "chat-fork"] == "intact"
        status = lgckpt("audit", "status", "--json", url=s.url).json()
        assert status["enabled"] and [e["enabled"] for e in status["log"]] == [True]
        fails(lgckpt("audit", "off", url=s.url), 2, "--reason")
        run = lgckpt("audit", "off", "--reason", "maintenance window", url=s.url)
        assert run.code == 0 and run.out.startswith("audit: off"), run
        assert "lgckpt: warning: audit trail turned off" in run.err and "maintenance" in run.err
        log = lgckpt("audit", "status", "--json", url=s.url).json()["log"]
        assert [(e["enabled"], e["reason"]) for e in log][1:] == [(False, "maintenance window")]
        assert lgckpt("fork", "chat", "--to", "chat-late", url=s.url).code == 0
        run = lgckpt("verify", "chat-late", url=s.url)
        assert run.code == 6 and "turned off" in run.err and "maintenance window" in run.err
        run = lgckpt("audit", "on", url=s.url)
        assert run.code == 0 and run.out.startswith("audit: on") and run.err == "", run
        assert lgckpt("fork", "chat", "--to", "chat-again", url=s.url).code == 0
        assert lgckpt("verify", "chat-fork", "chat-again", url=s.url).code == 0
    finally:
        s.handle.cleanup()


# -- bad input -------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.postgres
def test_bad_urls(tmp_path: Path) -> None:
    fails(lgckpt("threads", url="mysql://u@db/x"), 5, "unsupported URL scheme 'mysql'",
          "sqlite:///")
    fails(lgckpt("threads", url="memory://"), 5, "keeps nothing")
    port = free_port()
    fails(lgckpt("threads", url=f"postgresql://postgres:secret@127.0.0.1:{port}/test"), 5,
          f"cannot reach postgresql://postgres:***@127.0.0.1:{port}/test")
    fails(lgckpt("show", "t", url=f"redis://127.0.0.1:{port}/0"), 5, "cannot reach redis://")
    fails(lgckpt("threads", url=f"{PG_DSN}?schema=lgx_cli_nothing_here"), 5,
          "no checkpoint store", "?schema=NAME")
    missing = tmp_path / "missing.db"
    fails(lgckpt("history", "t", url=f"sqlite:///{missing}"), 5, "no such file")
    empty = tmp_path / "empty.db"
    empty.touch()
    fails(lgckpt("prune", "--all", url=f"sqlite:///{empty}"), 5, "no checkpoint tables")
    assert not missing.exists() and empty.stat().st_size == 0
    run = lgckpt("threads")  # no URL at all
    fails(run, 2, "--url", "LGCKPT_URL")


def _main(capsys: pytest.CaptureFixture[str], *argv: str) -> Run:
    code = main(list(argv))
    captured = capsys.readouterr()
    return Run(code, captured.out, captured.err)


def test_url_forms_and_options(sqlite_store: Store, tmp_path: Path,
                               monkeypatch: pytest.MonkeyPatch,
                               capsys: pytest.CaptureFixture[str]) -> None:
    """The CLI reads URLs with the one parser: a sqlite:// URL with a host is refused with the
    right form and creates nothing (not even as a copy's target), query options are
    SQLite's, and an unknown option is refused by name, never with the password."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    fails(_main(capsys, "threads", "--url", "sqlite://rel.db"), 5, "sqlite:///rel.db",
          "sqlite:////")
    fails(_main(capsys, "copy", "--url", sqlite_store.url, "--to", "sqlite://copy.db"), 5,
          "sqlite:///copy.db")
    fails(_main(capsys, "copy", "--url", sqlite_store.url, "--to", "sqlite:///x.db?timeout=5"),
          5, "'timeout'", "busy_timeout")
    assert list(work.iterdir()) == []
    run = _main(capsys, "threads", "--json", "--url", f"{sqlite_store.url}?mode=ro&busy_timeout=2")
    assert sorted(r["thread_id"] for r in run.json()) == [
        "approval", "approved", "broken", "chat", "sub"]
    port = free_port()
    for url in (f"postgresql://postgres:s3cr%23t9x@127.0.0.1:{port}/test?key_prefix=a",
                f"redis://:s3cr%23t9x@127.0.0.1:{port}/0?schema=a"):
        line = fails(_main(capsys, "threads", "--json", "--url", url), 5, "is an option of")
        assert "s3cr" not in line and "t9x" not in line and "***" in line, line


def test_missing_threads_and_checkpoints(sqlite_store: Store) -> None:
    url = sqlite_store.url
    before = sqlite_store.snapshot()
    absent = later_id()
    fails(lgckpt("show", "chat", absent, url=url), 3, f"checkpoint {absent!r} is not stored")
    fails(lgckpt("history", "nobody", url=url), 3, "thread 'nobody' has no checkpoint")
    fails(lgckpt("diff", "chat", f"nobody:{absent}", url=url), 3, "is not stored")
    fails(lgckpt("fork", "nobody", "--to", "copy", url=url), 3, "'nobody'")
    # every thread is checked before any is pruned
    fails(lgckpt("prune", "chat", "nobody", "--strategy", "delete", url=url), 3, "'nobody'")
    fails(lgckpt("stats", "nobody", url=url), 3, "'nobody'")
    fails(lgckpt("prune", url=url), 2, "--all")
    assert sqlite_store.snapshot() == before


def test_help_of_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    """Every command's --help has an example (in-process: it is argparse's work; the console
    script once)."""
    commands = sorted(build_parser()._subparsers._group_actions[0].choices)  # type: ignore[union-attr]
    assert {"threads", "history", "show", "diff", "fork", "prune", "migrate", "verify",
            "stats", "copy", "import", "export"} <= set(commands)
    for command in commands:
        assert main([command, "--help"]) == 0
        text = capsys.readouterr().out
        assert text.startswith(f"usage: lgckpt {command}") and "\nexample:\n  lgckpt " in text
    run = lgckpt("--help", script=True)
    assert run.code == 0 and "exit codes:" in run.out and all(c in run.out for c in commands)
    run = lgckpt("prune", "--strategy", "some")
    assert run.code == 2 and "invalid choice" in run.err


# -- in-process pieces ------------------------------------------------------------------------------


def test_checkpoint_refs() -> None:
    cid = later_id()
    assert checkpoint_ref("t-1") == ("t-1", None)
    assert checkpoint_ref(f"t-1:{cid}") == ("t-1", cid)
    assert checkpoint_ref("user:42") == ("user:42", None)  # not a checkpoint id
    assert checkpoint_ref("user:42:") == ("user:42", None)
    assert checkpoint_ref(f"user:42:{cid}") == ("user:42", cid)


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_output_tables_colour_and_progress(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = [{"thread_id": "a", "bytes": 2048, "status": "awaiting_human", "next": ["x", "y"]},
            {"thread_id": "bb", "bytes": 5, "status": "done", "next": []}]
    monkeypatch.delenv("NO_COLOR", raising=False)
    out, err = _Tty(), _Tty()
    Output(False, None, stdout=out, stderr=err).table(rows, ["thread_id", "bytes", "status",
                                                              "next"])
    assert "\033[1mTHREAD ID" in out.getvalue() and "\033[33mawaiting human\033[0m" in out.getvalue()
    monkeypatch.setenv("NO_COLOR", "1")
    out = _Tty()
    Output(False, None, stdout=out, stderr=err).table(rows, ["thread_id", "bytes", "status",
                                                              "next"])
    assert out.getvalue().splitlines() == [
        "THREAD ID  BYTES    STATUS          NEXT",
        "a          2.0 KiB  awaiting human  x, y",
        "bb         5 B      done            -",
    ]
    out = _Tty()
    Output(True, None, stdout=out, stderr=err).table(rows, ["thread_id"])
    assert json.loads(out.getvalue()) == rows
    with Output(False, False, stdout=out, stderr=err).progress(4, "work") as bar:
        bar.update(4)
    assert "\rwork [" in err.getvalue() and "4/4" in err.getvalue()
    quiet = io.StringIO()
    with Output(False, False, stdout=out, stderr=quiet).progress(4, "work") as bar:
        bar.update(4)
    assert quiet.getvalue() == ""  # not a terminal
    assert cell("status", None) == "-" and cell("total_bytes", 3 * 1024 ** 2) == "3.0 MiB"
    # values of other types as JSON-like text, not Python reprs
    from datetime import date

    assert cell("x", {"a": None, "b": [True]}) == '{"a": null, "b": [true]}'
    assert cell("x", date(2026, 1, 2)) == "2026-01-02"
