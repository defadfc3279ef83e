"""Moving threads between savers (`langgraph_ckpt_ext.transfer`): from LangGraph's official
SqliteSaver and PostgresSaver into each of our backends, between ours (resumable, conflicts,
large threads), and through JSON Lines (round trip, malformed and hostile files)."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import pickle
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ormsgpack
import pytest
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from langgraph_ckpt_ext import (
    InMemoryCheckpointer,
    SQLiteCheckpointer,
    ThreadExistsError,
    ThreadNotFoundError,
)
from langgraph_ckpt_ext.core.saver import StoreCheckpointer
from langgraph_ckpt_ext.transfer import (
    MalformedExportError,
    Missing,
    acopy_threads,
    copy_threads,
    diff_thread,
    export_threads,
    import_jsonl,
    open_jsonl,
    open_official,
    put_thread,
    thread_ids,
    thread_tuples,
)
from tests.support.lifecycle import later_id
from tests.support.savers import SaverHandle, open_saver, params
from tests.support.transfer_graphs import (
    CONTINUE,
    cfg,
    history,
    official_postgres,
    official_sqlite,
    plain,
)
from tests.support.transfer_graphs import write_threads as write_official_threads

TARGETS = ["memory", "sqlite", "postgres", "redis"]


@pytest.fixture(params=params(TARGETS))
def transfer_target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreCheckpointer]:
    cp_h = open_saver(request.param, tmp_path)
    cp = cp_h.saver
    yield cp
    cp.close()
    cp_h.cleanup()


def _make(kind: str, tmp_path: Path) -> SaverHandle:
    sub = tmp_path / kind
    sub.mkdir(exist_ok=True)
    return open_saver(kind, sub)


def _equal_everywhere(a: Any, b: Any, threads: list[str] | None = None) -> None:
    """Every thread of `a` is in `b`, equal by checkpoint ids and content hashes."""
    ids = threads or thread_ids(a)
    assert sorted(thread_ids(b)) == sorted(ids)
    for tid in ids:
        d = diff_thread(b.serde, tid, thread_tuples(a, tid), thread_tuples(b, tid))
        assert d.equal, (tid, d.conflict, len(d.missing))


# -- from LangGraph's official savers ---------------------------------------------------------


@pytest.mark.parametrize("official", params(["sqlite", "postgres"]))
def test_official_threads_resume_the_same_in_each_backend(
    official: str, transfer_target: StoreCheckpointer, tmp_path: Path
) -> None:
    made = official_sqlite(tmp_path) if official == "sqlite" else official_postgres()
    with made as (url, writable):
        with open_official(url) as source:
            report = copy_threads(source, transfer_target)
            assert report.ok and report.threads_copied == len(CONTINUE)
            assert report.threads_verified == len(CONTINUE) and not report.blocked_types
            _equal_everywhere(source, transfer_target)
            for thread, (builder, _) in CONTINUE.items():
                theirs = builder().compile(checkpointer=source)
                ours = builder().compile(checkpointer=transfer_target)
                assert history(ours, thread) == history(theirs, thread), thread
            # Imported again: every thread is there already, equal.
            again = copy_threads(source, transfer_target)
            assert (again.threads_copied, again.threads_skipped) == (0, len(CONTINUE))
        with writable() as saver:  # the official saver, writable, runs the same steps
            for thread, (builder, steps) in CONTINUE.items():
                theirs = builder().compile(checkpointer=saver)
                ours = builder().compile(checkpointer=transfer_target)
                for step in steps:
                    expected = plain(theirs.invoke(step, cfg(thread)))
                    assert plain(ours.invoke(step, cfg(thread))) == expected, thread
                assert [plain(s.values) for s in ours.get_state_history(cfg(thread))] == [
                    plain(s.values) for s in theirs.get_state_history(cfg(thread))]
                assert not ours.get_state(cfg(thread)).next


@pytest.mark.postgres
def test_official_source_is_read_only(tmp_path: Path) -> None:
    with official_sqlite(tmp_path) as (url, _), open_official(url) as source:
        with pytest.raises(Exception, match=r"readonly|read-only"):
            source.delete_thread("chat")
        assert "chat" in thread_ids(source)
    with official_postgres() as (url, _), open_official(url) as source:
        with pytest.raises(Exception, match="read-only"):
            source.delete_thread("chat")
        assert thread_ids(source) == sorted(CONTINUE)


def test_open_official_errors(tmp_path: Path) -> None:
    from langgraph_ckpt_ext import InvalidConfigError, StoreUnavailableError

    with pytest.raises(StoreUnavailableError, match="no SQLite database"), \
            open_official(f"sqlite:///{tmp_path}/none.db"):
        pass
    assert not (tmp_path / "none.db").exists()
    ours = SQLiteCheckpointer(tmp_path / "ours.db")
    ours.close()
    with pytest.raises(InvalidConfigError, match="not written by LangGraph's SqliteSaver"), \
            open_official(f"sqlite:///{tmp_path}/ours.db"):
        pass
    (tmp_path / "junk.db").write_bytes(b"not a database at all" * 100)
    with pytest.raises(InvalidConfigError, match="not an SQLite database"), \
            open_official(f"sqlite:///{tmp_path}/junk.db"):
        pass
    with pytest.raises(StoreUnavailableError, match="cannot connect"), \
            open_official("postgresql://postgres@127.0.0.1:1/test"):
        pass
    with pytest.raises(InvalidConfigError, match="PostgresSaver"), \
            open_official("postgresql://postgres@127.0.0.1:5432/test?options=-c%20search_path%3Dnone"):
        pass
    with pytest.raises(InvalidConfigError, match="unsupported URL"), open_official("mysql://x/y"):
        pass


def test_missing_official_package_names_the_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from langgraph_ckpt_ext import MissingDependencyError

    monkeypatch.setitem(sys.modules, "langgraph.checkpoint.sqlite", None)  # import fails
    monkeypatch.setitem(sys.modules, "langgraph.checkpoint.postgres", None)
    with pytest.raises(MissingDependencyError, match="pip install langgraph-checkpoint-sqlite"), \
            open_official(f"sqlite:///{tmp_path}/x.db"):
        pass
    with pytest.raises(MissingDependencyError, match="pip install langgraph-checkpoint-postgres"), \
            open_official("postgresql://postgres@127.0.0.1:5432/test"):
        pass


# -- between our savers -----------------------------------------------------------------------


@pytest.fixture
def source(tmp_path: Path) -> Iterator[StoreCheckpointer]:
    """Our SQLite saver holding the official scenarios' threads, plus a fork of one."""
    cp = SQLiteCheckpointer(tmp_path / "source.db")
    write_official_threads(cp)
    cp.fork(cfg("approve"), "approve-fork")  # a fork: a thread of its own
    yield cp
    cp.close()


def test_copy_between_backends_is_resumable_and_verified(
    source: StoreCheckpointer, transfer_target: StoreCheckpointer
) -> None:
    seen: list[tuple[int, int]] = []
    report = copy_threads(source, transfer_target, concurrency=3,
                          progress=lambda d, t: seen.append((d, t)))
    total = len(thread_ids(source))
    assert report.ok and report.threads_copied == report.threads_verified == total
    assert seen[-1] == (total, total) and len(seen) == total
    _equal_everywhere(source, transfer_target)
    assert copy_threads(source, transfer_target).threads_skipped == total


def test_partial_thread_is_completed(
    source: StoreCheckpointer, transfer_target: StoreCheckpointer
) -> None:
    """A thread cut short in the target (an older copy: its first checkpoints, some without
    their writes) is completed, not refused."""
    tuples = thread_tuples(source, "fork")
    head = [Missing(t, True, frozenset()) for t in tuples[:3]]  # no writes at all
    put_thread(transfer_target, "fork", tuples, head)
    d = diff_thread(transfer_target.serde, "fork", tuples, thread_tuples(transfer_target, "fork"))
    assert d.conflict is None and d.missing
    report = copy_threads(source, transfer_target, ["fork"])
    assert report.ok and report.threads_copied == 1
    assert report.checkpoints == len(tuples) - 3
    _equal_everywhere(source, transfer_target, ["fork"])


def test_conflict_refused_before_writing_then_overwritten(
    source: StoreCheckpointer, transfer_target: StoreCheckpointer
) -> None:
    from tests.support.graphs import chat_graph, human

    chat_graph().compile(checkpointer=transfer_target).invoke(
        {"messages": [human("other")]}, cfg("chat"))
    before = {t: thread_tuples(transfer_target, t) for t in thread_ids(transfer_target)}
    with pytest.raises(ThreadExistsError, match=r"'chat'.*overwrite"):
        copy_threads(source, transfer_target)
    assert thread_ids(transfer_target) == ["chat"]  # nothing copied, not even the other threads
    assert [t.checkpoint for t in thread_tuples(transfer_target, "chat")] == [
        t.checkpoint for t in before["chat"]]
    report = copy_threads(source, transfer_target, overwrite=True)
    assert report.ok and report.threads_copied == len(thread_ids(source))
    _equal_everywhere(source, transfer_target)


def test_unknown_thread_refused_before_writing(
    source: StoreCheckpointer, transfer_target: StoreCheckpointer
) -> None:
    with pytest.raises(ThreadNotFoundError, match="'nope' is not in the source"):
        copy_threads(source, transfer_target, ["chat", "nope"])
    assert thread_ids(transfer_target) == []
    with pytest.raises(ValueError, match="not one string"):
        copy_threads(source, transfer_target, "chat")


def test_verification_finds_what_reads_back_different(
    source: StoreCheckpointer, tmp_path: Path
) -> None:
    """A target that changes what it stores (here: it stamps a state-schema version in the
    metadata) fails the check at the end; the report says which thread and what."""
    from langgraph_ckpt_ext import SchemaChain

    target = SQLiteCheckpointer(tmp_path / "stamped.db", schema_chain=SchemaChain(1))
    try:
        report = copy_threads(source, target, ["chat", "approve"])
    finally:
        target.close()
    assert not report.ok and report.threads_copied == 2 and report.threads_verified == 0
    assert [t for t, _ in report.failed] == ["approve", "chat"]
    assert "differs" in report.failed[0][1] and "differ after the copy" in report.summary()


def _long_thread(saver: Any, thread: str, n: int) -> None:
    """A thread of `n` checkpoints: a list growing by one item each (stored as deltas by
    ours), a counter, and two writes per checkpoint."""
    config: Any = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    log: list[str] = []
    version = None
    for i in range(n):
        cp = empty_checkpoint()
        version = saver.get_next_version(version)
        log = [*log, f"entry {i}"]
        cp["channel_values"] = {"log": log, "step": i}
        cp["channel_versions"] = {"log": version, "step": version}
        config = saver.put(config, cp, {"source": "loop", "step": i, "parents": {}},
                           {"log": version, "step": version})
        saver.put_writes(config, [("log", [f"w{i}"]), ("step", i + 1)], f"task-{i}")


@pytest.mark.parametrize("batch_size", [100_000, 97])
def test_long_thread(transfer_target: StoreCheckpointer, batch_size: int) -> None:
    """A long thread lands in one batch (one transaction or script), or in several when it is
    longer than batch_size; either way equal, its list values rebuilt from their deltas."""
    src = InMemoryCheckpointer()
    _long_thread(src, "long", 400)
    report = copy_threads(src, transfer_target, batch_size=batch_size)
    assert report.ok and report.checkpoints == 400 and report.writes == 800
    _equal_everywhere(src, transfer_target)
    latest = transfer_target.get_tuple(cfg("long"))
    assert latest is not None and len(latest.checkpoint["channel_values"]["log"]) == 400


@pytest.mark.postgres
def test_acopy_threads(source: StoreCheckpointer, tmp_path: Path) -> None:
    target_h = _make("postgres", tmp_path)
    target = target_h.saver
    try:
        report = asyncio.run(acopy_threads(source, target))
        assert report.ok
        _equal_everywhere(source, target)
    finally:
        target.close()
        target_h.cleanup()


@dataclass
class Point:
    x: int
    y: int


def test_blocked_types_are_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A source whose serde does not allow a class reads its values as plain data: the copy
    says which classes, so that the user can allow them. (A data type of a module the process
    loaded is allowed by default: the process copying here has not loaded this one.)"""
    allowing = JsonPlusSerializer(allowed_msgpack_modules=[("tests.transfer.test_transfer", "Point")])
    writer = SQLiteCheckpointer(tmp_path / "typed.db", serde=allowing)
    cp = empty_checkpoint()
    cp["channel_values"] = {"where": Point(1, 2)}
    cp["channel_versions"] = {"where": 1.5}
    writer.put(cfg("typed"), cp, {}, {"where": 1.5})
    writer.close()
    strict = SQLiteCheckpointer(tmp_path / "typed.db")
    try:
        with monkeypatch.context() as m:
            m.delitem(sys.modules, __name__)
            report = copy_threads(strict, InMemoryCheckpointer())
        assert report.blocked_types == ("tests.transfer.test_transfer.Point",)
        assert "read as plain data: tests.transfer.test_transfer.Point" in report.summary()
    finally:
        strict.close()
    allowed = SQLiteCheckpointer(tmp_path / "typed.db", serde=allowing)
    target = InMemoryCheckpointer(serde=allowing)
    try:
        assert copy_threads(allowed, target).blocked_types == ()
        tup = target.get_tuple(cfg("typed"))
        assert tup is not None and tup.checkpoint["channel_values"]["where"] == Point(1, 2)
    finally:
        allowed.close()


# -- JSON Lines -------------------------------------------------------------------------------


def _export(saver: Any, threads: list[str] | None = None) -> str:
    buf = io.StringIO()
    export_threads(saver, buf, threads)
    return buf.getvalue()


def test_jsonl_round_trip(source: StoreCheckpointer, transfer_target: StoreCheckpointer,
                          tmp_path: Path) -> None:
    text = _export(source)
    lines = text.splitlines()
    head, end = json.loads(lines[0]), json.loads(lines[-1])
    assert head["format"] == "langgraph-ckpt-ext/threads" and head["version"] == 1
    n = sum(len(thread_tuples(source, t)) for t in thread_ids(source))
    assert end == {"end": True, "threads": len(thread_ids(source)), "checkpoints": n}
    assert len(lines) == n + 2
    line = json.loads(lines[1])
    assert {"thread_id", "checkpoint_ns", "checkpoint_id", "parent_checkpoint_id",
            "checkpoint", "metadata", "writes"} <= set(line)
    path = tmp_path / "threads.jsonl"
    path.write_text(text)
    report = import_jsonl(path, transfer_target)
    assert report.ok and report.threads_copied == len(thread_ids(source))
    _equal_everywhere(source, transfer_target)
    # From a pipe (not seekable), as text: spooled, and already there.
    again = import_jsonl(_Pipe(text.encode()), transfer_target)
    assert again.threads_skipped == len(thread_ids(source))
    # Exported again from the target: the same lines, but the time in the header.
    assert _export(transfer_target).splitlines()[1:] == lines[1:]
    with open_jsonl(io.BytesIO(text.encode())) as src:
        assert thread_ids(src) == thread_ids(source)


class _Pipe(io.RawIOBase):
    """A byte stream that cannot seek, like stdin from a pipe."""

    def __init__(self, data: bytes) -> None:
        self._data = io.BytesIO(data)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def read(self, n: int = -1) -> bytes:
        return self._data.read(n)


def _typed(type_: str, data: bytes) -> list[str]:
    return [type_, base64.b64encode(data).decode()]


def _constructor(module: str, name: str, arg: Any) -> bytes:
    """msgpack of LangGraph's "construct module.name(arg)" extension."""
    inner = ormsgpack.packb([module, name, arg])
    return ormsgpack.packb({"v": ormsgpack.Ext(0, inner)})


def _edit(n: int, edit: Any) -> Any:
    """A change of line `n` (1-based) of an export: `edit(dict) -> dict | str`."""

    def change(text: str, marker: Path) -> str:
        lines = text.splitlines()
        changed = edit(json.loads(lines[n - 1]))
        lines[n - 1] = changed if isinstance(changed, str) else json.dumps(changed)
        return "\n".join(lines) + "\n"

    return change


def _drop(first: bool) -> Any:
    def change(text: str, marker: Path) -> str:
        lines = text.splitlines()
        return "\n".join(lines[1:] if first else lines[:-1]) + "\n"

    return change


def _os_system(text: str, marker: Path) -> str:
    evil = _constructor("posix", "system", f"touch {marker}")
    return _edit(2, lambda d: {**d, "metadata": _typed("msgpack", evil)})(text, marker)


def _thread_again(text: str, marker: Path) -> str:
    lines = text.splitlines()
    first = next(i for i, raw in enumerate(lines) if '"thread_id": "approve"' in raw)
    moved = lines.pop(first)
    lines.insert(len(lines) - 1, moved)  # an approve line after chat's
    return "\n".join(lines) + "\n"


_OTHER_ID = later_id()
_BAD_FILES = {
    "not json": (_edit(3, lambda d: "{not json"), "line 3 of the export: not JSON"),
    "no header": (_drop(first=True), "line 1 of the export: not an export of langgraph-ckpt-ext"),
    "newer version": (_edit(1, lambda d: {**d, "version": 99}), "format version 99 is newer"),
    "missing key": (_edit(2, lambda d: {k: v for k, v in d.items() if k != "metadata"}),
                    "line 2 of the export: not a checkpoint line"),
    "bad base64": (_edit(2, lambda d: {**d, "checkpoint": ["msgpack", "!!!"]}),
                   "line 2 of the export: checkpoint is not valid base64"),
    "wrong id": (_edit(2, lambda d: {**d, "checkpoint_id": _OTHER_ID}),
                 "line 2 of the export: checkpoint is not a checkpoint with this line"),
    "bad write": (_edit(3, lambda d: {**d, "writes": [["task", "ch", "msgpack"]]}),
                  "line 3 of the export: write 0 is not"),
    "cut short": (_drop(first=False), "ends without its end line"),
    "pickle": (_edit(2, lambda d: {**d, "metadata": _typed("pickle", pickle.dumps({}))}),
               "line 2 of the export: a value cannot be decoded"),
    "os.system": (_os_system, "line 2 of the export: it holds a value of type posix.system"),
    "thread again": (_thread_again, "appears again after other threads"),
}


@pytest.mark.parametrize("case", sorted(_BAD_FILES))
def test_malformed_or_hostile_file_refused(
    source: StoreCheckpointer, tmp_path: Path, case: str
) -> None:
    """Refused with the line and what is wrong, before anything is written; a value that
    would construct something else than allowed classes (os.system) is never constructed."""
    change, message = _BAD_FILES[case]
    marker = tmp_path / "pwned"
    text = change(_export(source, ["approve", "chat"]), marker)
    target = InMemoryCheckpointer()
    with pytest.raises(MalformedExportError, match=re.escape(message)) as err:
        import_jsonl(io.StringIO(text), target)
    assert "nothing was imported" in str(err.value)
    assert thread_ids(target) == []
    assert not marker.exists()
