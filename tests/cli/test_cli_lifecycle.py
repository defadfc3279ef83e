"""`lgckpt sweep`, `erase`, `vacuum`, `pin`, `unpin` and `prune --idle-for/--older-than/--keep`.

One scenario runs twice over: in-process (`main`) over an in-memory checkpointer handed to the
commands, and as a subprocess against SQLite files (PostgreSQL schemas, Redis prefixes), whose
old threads were written with an injected clock 40 days back. No test sleeps.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import io
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from langgraph_ckpt_ext.backends.memory import InMemoryCheckpointer
from langgraph_ckpt_ext.cli import browse, lifecycle, main, maintain
from langgraph_ckpt_ext.cli.lifecycle import duration, instant, where_item
from langgraph_ckpt_ext.core.retention import thread_digest
from langgraph_ckpt_ext.core.saver import StoreCheckpointer
from tests.cli.test_cli import Run, fails, lgckpt, new_store
from tests.support.graphs import approval_graph
from tests.support.lifecycle import DAY, chat
from tests.support.savers import params

RunCli = Callable[..., Run]


# -- parsing: refused before anything is opened ---------------------------------------------------


def test_durations_dates_and_where_items() -> None:
    assert duration("90s") == 90 and duration("30m") == 1800 and duration("12h") == 43200
    assert duration("7d") == 7 * DAY and duration("2w") == 14 * DAY
    assert duration("1d12h") == 1.5 * DAY and duration("1.5h") == 5400
    for bad in ("", "10", "d", "7 d", "7x", "-3d", "0s", "7d-", "1d 2h"):
        with pytest.raises(argparse.ArgumentTypeError, match=r"duration|more than 0"):
            duration(bad)
    assert instant("7d", now=lambda: 1_000_000.0) == 1_000_000.0 - 7 * DAY
    assert instant("2026-01-01") == 1767225600.0  # UTC unless it says
    assert instant("2026-01-01T01:00:00+01:00") == 1767225600.0
    with pytest.raises(argparse.ArgumentTypeError, match="neither a date"):
        instant("yesterday")
    assert where_item("user_id=u-42") == ("user_id", "u-42")
    assert where_item("note=a=b") == ("note", "a=b")
    assert where_item("empty=") == ("empty", "")
    assert where_item("attempt:=3") == ("attempt", 3)
    assert where_item('flag:=true') == ("flag", True)
    assert where_item('code:="007"') == ("code", "007")
    for bad, why in (("user_id", "KEY=VALUE"), ("=u-42", "empty"), ("  =x", "empty"),
                     (":=3", "empty"), ("n:=nope", "JSON")):
        with pytest.raises(argparse.ArgumentTypeError, match=why):
            where_item(bad)


def test_bad_input_is_refused_before_the_store_is_opened(tmp_path: Path) -> None:
    """Every refusal is a usage error (2), not 'no store there' (5): the URL names no file, so
    opening anything would fail otherwise."""
    url = f"sqlite:///{tmp_path / 'none.db'}"
    for args, words in [
        (("sweep",), ("needs a rule",)),
        (("sweep", "--dry-run", "--strategy", "delete"), ("needs a rule",)),
        (("sweep", "--idle-for", "10"), ("--idle-for", "unit")),
        (("sweep", "--older-than", "last week"), ("--older-than", "neither a date")),
        (("sweep", "--keep", "0"), ("--keep",)),
        (("sweep", "--idle-for", "1d", "--limit", "-1"), ("--limit",)),
        (("sweep", "--idle-for", "1d", "--strategy", "shred"), ("--strategy",)),
        (("erase",), ("--where KEY=VALUE",)),
        (("erase", "--dry-run"), ("--where KEY=VALUE",)),
        (("erase", "--where", "user_id"), ("KEY=VALUE",)),
        (("erase", "--where", "=u-42"), ("empty",)),
        (("erase", "--where", "a=1", "--where", "a=2"), ("twice",)),
        (("erase", "--where", "a:=null", "--yes"), ("None",)),
        (("erase", "--where", "user_id=u-42"), ("--yes",)),  # stdin is no terminal
        (("prune", "t-1", "--all", "--idle-for", "30d"), ("--all", "not both")),
        (("prune", "--idle-for", "30d"), ("--all",)),
    ]:
        run = lgckpt(*args, url=url)
        assert run.code == 2 and run.out == "", (args, run)
        assert all(w in run.err for w in words), (args, words, run.err)
    assert list(tmp_path.iterdir()) == []


# -- the scenario --------------------------------------------------------------------------------


def populate(cp: StoreCheckpointer) -> None:
    """Written 40 days ago: old-1 (user u-42), old-2, paused-old (at an interrupt()),
    pinned-old (pinned); now: new (user u-7, three turns)."""
    cp.clock = lambda: time.time() - 40 * DAY
    chat(cp, "old-1", 2, user_id="u-42")
    chat(cp, "old-2", 1)
    approval_graph().compile(checkpointer=cp).invoke(
        {"request": "deploy", "log": []}, {"configurable": {"thread_id": "paused-old"}})
    chat(cp, "pinned-old", 1)
    cp.pin("pinned-old")
    cp.clock = time.time
    chat(cp, "new", 3, user_id="u-7")


def scenario(run: RunCli, snapshot: Callable[[], dict[str, list[str]]],
             lifecycle_log: Callable[[], list[Any]]) -> None:
    before = snapshot()
    assert sorted(before) == ["new", "old-1", "old-2", "paused-old", "pinned-old"]

    # threads --lifecycle: each thread's row
    rows = {r["thread_id"]: r for r in run("threads", "--lifecycle", "--json").json()}
    assert rows["pinned-old"]["pinned"] is True and rows["new"]["pinned"] is False
    created = dt.datetime.fromisoformat(rows["old-2"]["created"]).timestamp()
    assert 39 * DAY < time.time() - created < 41 * DAY
    assert time.time() - dt.datetime.fromisoformat(rows["new"]["written"]).timestamp() < DAY
    assert rows["new"]["policy"] is None and rows["new"]["status"] == "done"
    text = run("threads", "--lifecycle").out
    assert text.split()[:7] == ["THREAD", "ID", "CHECKPOINTS", "BYTES", "CREATED", "WRITTEN",
                                "PINNED"]
    assert "pinned" not in run("threads", "--json").json()[0]

    # dry runs change nothing
    dry = run("sweep", "--idle-for", "30d", "--dry-run", "--json").json()
    assert dry["dry_run"] is True and dry["deleted"] == ["old-1", "old-2"]
    assert dry["paused"] == ["paused-old"] and dry["pinned"] == 1 and dry["examined"] == 5
    assert dry["policy"] == {"idle": 30 * DAY, "strategy": "delete"}
    text = run("sweep", "--idle-for", "30d", "--dry-run").out
    assert "would delete" in text and "old-2" in text and "kept: awaiting human" in text
    assert "nothing changed (dry run)" in text and "1 pinned" in text
    plan = {r["thread_id"]: r for r in run("prune", "--all", "--older-than", "30d",
                                           "--dry-run", "--json").json()}
    assert set(plan) == {"old-1", "old-2", "paused-old"}  # keep_latest: cut, not deleted
    assert plan["old-1"]["status"] == "would remove" and plan["old-1"]["kept"] == 1
    assert plan["old-1"]["removed"] == len(before["old-1"]) - 1
    named = run("prune", "old-2", "new", "nobody", "--older-than", "30d", "--dry-run",
                "--json").json()
    assert [r["thread_id"] for r in named] == ["old-2"]  # "new" is young, "nobody" unknown
    erase_plan = run("erase", "--where", "user_id=u-42", "--dry-run", "--json").json()
    assert erase_plan["threads"] == ["old-1"] and erase_plan["dry_run"] is True
    assert erase_plan["checkpoints"] == len(before["old-1"])
    text = run("erase", "--where", "user_id=u-42", "--dry-run").out
    assert "old-1" in text and "would erase 1 thread(s)" in text
    assert run("erase", "--where", "user_id=nobody", "--dry-run", "--json").json()[
        "threads"] == []
    assert snapshot() == before

    # pins
    pinned = run("pin", "new", "--json").json()
    assert pinned == {"thread_id": "new", "pinned": True, "stored": True}
    assert "pinned" in run("sweep", "--keep", "1", "--dry-run").out
    assert "'new' unpinned" in run("unpin", "new").out
    ghost = run("pin", "ghost")
    assert ghost.code == 0 and "ahead of its first write" in ghost.err
    assert run("unpin", "never-seen", "--json").json()["pinned"] is False

    # erase: the report names the keys, never the values
    erased = run("erase", "--where", "user_id=u-42", "--reason", "ticket 118", "--yes")
    assert erased.code == 0 and "erased 1 thread(s)" in erased.out, erased
    assert "user_id" in erased.out and "u-42" not in erased.out + erased.err
    assert "old-1" not in snapshot()
    events = [e for e in lifecycle_log() if e.action == "erase"]
    assert [(e.thread, e.reason) for e in events] == [(thread_digest("old-1"), "ticket 118")]
    again = run("erase", "--where", "user_id=u-7", "--yes", "--json").json()
    assert again["threads"] == 1 and again["thread_digests"] == [thread_digest("new")]
    assert "u-7" not in json.dumps(again) and "new" not in again["thread_digests"]
    chat_back = snapshot()
    assert "new" not in chat_back

    # a real sweep: the paused and the pinned thread stay
    swept = run("sweep", "--idle-for", "30d", "--json").json()
    assert swept["deleted"] == ["old-2"] and swept["paused"] == ["paused-old"]
    assert sorted(snapshot()) == ["paused-old", "pinned-old"]
    text = run("sweep", "--idle-for", "30d", "--delete-paused").out
    assert "deleted 1 thread(s)" in text and "2 pinned" in text  # and ghost
    assert sorted(snapshot()) == ["pinned-old"]

    # prune --keep and vacuum
    run("unpin", "pinned-old")
    kept = run("prune", "--all", "--keep", "1", "--json").json()
    assert [(r["thread_id"], r["status"], r["kept"]) for r in kept] == [
        ("pinned-old", "removed", 1)]
    assert len(snapshot()["pinned-old"]) == 1
    vac = run("vacuum", "--json").json()
    assert set(vac) == {"before_bytes", "after_bytes", "freed_bytes"}
    assert run("vacuum").out.startswith("vacuum: ")


# -- in process, over the in-memory store --------------------------------------------------------


@contextlib.contextmanager
def handed(monkeypatch: pytest.MonkeyPatch, cp: StoreCheckpointer) -> Iterator[None]:
    """The commands open `cp` (left open) whatever their URL says."""
    def opener(url: str | None, **kw: Any) -> Any:
        return contextlib.nullcontext(cp)

    monkeypatch.setattr(lifecycle, "open_saver", opener)
    monkeypatch.setattr(maintain, "open_saver", opener)
    monkeypatch.setattr(browse, "open_saver", opener)
    yield


def in_process(capsys: pytest.CaptureFixture[str]) -> RunCli:
    def run(*args: str) -> Run:
        code = main([*args, "--url", "sqlite:///handed.db"])
        captured = capsys.readouterr()
        return Run(code, captured.out, captured.err)

    return run


def memory_snapshot(cp: StoreCheckpointer) -> Callable[[], dict[str, list[str]]]:
    """Each thread's checkpoint ids (a thread holding none, only pinned, left out)."""
    def snapshot() -> dict[str, list[str]]:
        found = {t: [c.config["configurable"]["checkpoint_id"]
                     for c in cp.list({"configurable": {"thread_id": t}})]
                 for t in cp.thread_ids()}
        return {t: ids for t, ids in found.items() if ids}

    return snapshot


def test_commands_on_the_memory_store(monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    cp = InMemoryCheckpointer()
    populate(cp)
    with handed(monkeypatch, cp):
        scenario(in_process(capsys), memory_snapshot(cp), cp.lifecycle_log)


def test_a_sweep_locked_out_exits_busy(monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    cp = InMemoryCheckpointer()
    populate(cp)
    before = memory_snapshot(cp)()
    run = in_process(capsys)
    lock = cp._store._sweeping  # type: ignore[attr-defined]  # what another sweeper holds
    with handed(monkeypatch, cp):
        assert lock.acquire(blocking=False)
        try:
            fails(run("sweep", "--idle-for", "1d"), 7, "another sweeper", "retry")
            fails(run("prune", "--all", "--idle-for", "1d", "--strategy", "delete"), 7,
                  "another sweeper")
        finally:
            lock.release()
        assert memory_snapshot(cp)() == before
        assert run("sweep", "--idle-for", "1d", "--json").json()["locked_out"] is False


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_erase_asks_on_a_terminal(monkeypatch: pytest.MonkeyPatch,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    cp = InMemoryCheckpointer()
    populate(cp)
    run = in_process(capsys)
    with handed(monkeypatch, cp):
        monkeypatch.setattr("sys.stdin", _Terminal("n\n"))
        refused = run("erase", "--where", "user_id=u-42")
        assert refused.code == 1 and "cancelled" in refused.err
        assert "erase 1 thread(s)" in refused.err and "u-42" not in refused.err
        assert "old-1" in cp.thread_ids()
        monkeypatch.setattr("sys.stdin", _Terminal("nobody\n"))
        assert "0 thread(s)" in run("erase", "--where", "user_id=nobody").out  # nothing asked
        monkeypatch.setattr("sys.stdin", _Terminal("y\n"))
        assert "erased 1 thread(s)" in run("erase", "--where", "user_id=u-42").out
        assert "old-1" not in cp.thread_ids()


# -- as a subprocess, over stores on disk and servers ----------------------------------------------


@pytest.mark.parametrize("backend", params(["sqlite", "postgres", "redis"]))
def test_commands_on_a_stored_store(backend: str, tmp_path: Path) -> None:
    store = new_store(backend, tmp_path)
    try:
        with store.open() as cp:
            populate(cp)

        def snapshot() -> dict[str, list[str]]:
            with store.open() as cp:
                return memory_snapshot(cp)()

        def log() -> list[Any]:
            with store.open() as cp:
                return cp.lifecycle_log()

        scenario(lambda *a: lgckpt(*a, url=store.url), snapshot, log)
    finally:
        store.handle.cleanup()
