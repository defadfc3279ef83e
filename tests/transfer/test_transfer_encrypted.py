"""Transfer on encrypted stores: copies between stores under the same or different keys, an
export that stays sealed unless asked for plaintext, and imports of a sealed export (the keys
needed; a value moved to another thread in the file refused)."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import HumanMessage

from langgraph_ckpt_ext.core.errors import DecryptionError, InvalidConfigError
from langgraph_ckpt_ext.core.keys import StaticKeys, new_key
from langgraph_ckpt_ext.core.rows import ListQuery
from langgraph_ckpt_ext.core.sealing import SEALED, Encryption
from langgraph_ckpt_ext.strategies import SmartCheckpointer
from langgraph_ckpt_ext.transfer import (
    MalformedExportError,
    copy_threads,
    export_threads,
    import_jsonl,
    open_jsonl,
    thread_tuples,
)
from tests.support.graphs import chat_graph
from tests.support.savers import SaverHandle, open_saver, params

K1, K2 = new_key(), new_key()
SECRET = "the-customer-said-this-in-confidence"


def enc(**keys: bytes) -> Encryption:
    return Encryption(StaticKeys(keys or {"k1": K1}))


@pytest.fixture(params=params(["memory", "sqlite", "postgres", "redis"]))
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


class Made:
    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path, self.handles = tmp_path, list[SaverHandle]()

    def __call__(self, kind: str, **options: Any) -> Any:
        where = self.tmp_path / f"s{len(self.handles)}"
        where.mkdir()
        self.handles.append(open_saver(kind, where, **options))
        return self.handles[-1].saver


@pytest.fixture
def made(tmp_path: Path) -> Iterator[Made]:
    m = Made(tmp_path)
    yield m
    for h in m.handles:
        h.close()


def chat(cp: Any, thread: str, turns: int = 3) -> None:
    graph = chat_graph().compile(checkpointer=cp)
    for i in range(turns):
        graph.invoke({"messages": [HumanMessage(content=f"{SECRET} {i}")]},
                     {"configurable": {"thread_id": thread}})


def state(cp: Any, thread: str) -> list[tuple[Any, ...]]:
    return [(t.config["configurable"]["checkpoint_id"], t.checkpoint["channel_values"],
             sorted(repr(w) for w in t.pending_writes or []))
            for t in thread_tuples(cp, thread)]


def key_ids(cp: Any, thread: str) -> set[str]:
    """The key ids the thread's checkpoint rows are sealed under, as stored."""
    async def rows() -> list[Any]:
        inner = cp.stored.sealed.inner
        return [r async for r in inner.iter_checkpoints(ListQuery(thread_id=thread))]

    return {bytes(r.checkpoint[1])[7:7 + r.checkpoint[1][6]].decode() for r in
            cp.run_sync(rows())}


def export(cp: Any, **kw: Any) -> str:
    fh = io.StringIO()
    export_threads(cp, fh, **kw)
    return fh.getvalue()


def test_copy_between_stores_under_different_keys(kind: str, made: Made) -> None:
    source = made("sqlite", encryption=enc(k1=K1))
    target = made(kind, encryption=enc(k2=K2), compression=True)
    chat(source, "t1")
    report = copy_threads(source, target)
    assert report.ok and report.threads_copied == 1
    assert state(target, "t1") == state(source, "t1")
    assert key_ids(target, "t1") == {"k2"}  # sealed again, under the target's own key
    again = copy_threads(source, target)
    assert again.threads_skipped == 1 and again.threads_copied == 0


def test_an_export_stays_sealed_and_imports_with_the_keys(kind: str, made: Made) -> None:
    source = made(kind, encryption=enc(k1=K1), compression=True)
    chat(source, "t1")
    chat(source, "t2", turns=1)
    text = export(source)
    assert SECRET not in text
    head = json.loads(text.splitlines()[0])
    assert head["sealed"] is True and head["version"] == 2
    for line in text.splitlines()[1:-1]:
        obj = json.loads(line)
        assert obj["checkpoint"][0] == SEALED and obj["metadata"][0] == SEALED
        assert all(b[3] == SEALED for b in obj["blobs"])
        assert all(w[4] == SEALED for w in obj["writes"])
    # into a store holding the same key among others: read, and sealed again under its own
    target = made("sqlite", encryption=enc(k1=K1, k2=K2))
    report = import_jsonl(io.StringIO(text), target)
    assert report.ok and report.threads_copied == 2
    for t in ("t1", "t2"):
        assert state(target, t) == state(source, t)


def test_a_plaintext_export_only_when_asked(made: Made) -> None:
    source = made("sqlite", encryption=enc(k1=K1))
    chat(source, "t1")
    text = export(source, plaintext=True)
    assert SECRET in base64.b64decode(json.loads(text.splitlines()[1])["checkpoint"][1]
                                      ).decode("utf-8", "replace") or SECRET in "".join(
        base64.b64decode(w[3]).decode("utf-8", "replace")
        for line in text.splitlines()[1:-1] for w in json.loads(line)["writes"])
    assert json.loads(text.splitlines()[0]).get("sealed") is None
    plain = made("memory")  # no keys needed to import it
    assert import_jsonl(io.StringIO(text), plain).ok
    assert state(plain, "t1") == state(source, "t1")


def test_a_wrapper_that_encrypts_exports_only_plaintext(made: Made) -> None:
    inner = made("memory", encryption=enc(k1=K1))
    chat(inner, "t1", turns=1)
    with pytest.raises(InvalidConfigError, match="plaintext=True"):
        export(SmartCheckpointer(inner))


def test_a_sealed_export_needs_the_keys(made: Made) -> None:
    source = made("sqlite", encryption=enc(k1=K1))
    chat(source, "t1", turns=1)
    text = export(source)
    with pytest.raises(DecryptionError, match="export is encrypted"):
        import_jsonl(io.StringIO(text), made("memory"))
    wrong = made("memory", encryption=enc(k1=K2))  # same id, another key
    with pytest.raises(MalformedExportError, match="cannot decrypt"):
        import_jsonl(io.StringIO(text), wrong)
    assert wrong.thread_ids() == []


def test_a_thread_id_edited_in_a_sealed_export_is_refused(made: Made) -> None:
    source = made("sqlite", encryption=enc(k1=K1))
    chat(source, "t1", turns=1)
    lines = export(source).splitlines()
    moved = [lines[0], *(line.replace('"thread_id": "t1"', '"thread_id": "t9"')
                         for line in lines[1:-1]), lines[-1]]
    target = made("memory", encryption=enc(k1=K1))
    with pytest.raises(MalformedExportError, match=r"'t9'.*sealed for another row"):
        import_jsonl(io.StringIO("\n".join(moved) + "\n"), target)
    assert target.thread_ids() == []


def test_an_import_under_another_thread_id_is_sealed_again(made: Made) -> None:
    source = made("sqlite", encryption=enc(k1=K1))
    chat(source, "t1")
    target = made("sqlite", encryption=enc(k1=K1, k2=K2))
    with open_jsonl(io.StringIO(export(source)), encryption=target.encryption) as file:
        assert copy_threads(file, target).ok
    target.copy_thread("t1", "t-renamed")  # opened for t1's rows, sealed for the new ones
    assert [s[1:] for s in state(target, "t-renamed")] == [s[1:] for s in state(source, "t1")]
