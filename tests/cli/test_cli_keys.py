"""`lgckpt` on encrypted stores, run as subprocesses: `new-key`, keys from $LGCKPT_KEYS read by
every command, `rotate-keys` (dry run, progress, resumed, encrypting a plaintext store with
`--plaintext-read`), encrypted and plaintext exports, and the URL options `redact_metadata=`,
`compression=` and `encryption=env` on every backend."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import HumanMessage

from langgraph_ckpt_ext import connect
from langgraph_ckpt_ext.core.keys import EnvKeys, encode_key, new_key
from langgraph_ckpt_ext.core.rows import ListQuery
from langgraph_ckpt_ext.core.sealing import SEALED, Encryption
from tests.cli.test_cli import Store, fails, lgckpt, new_store
from tests.support.graphs import chat_graph
from tests.support.savers import params

SECRET = "the-customer-said-this-in-confidence"
OLD, NEW = encode_key(new_key()), encode_key(new_key())
ONE = {"LGCKPT_KEYS": f"old:{OLD}"}
BOTH = {"LGCKPT_KEYS": f"old:{OLD},new:{NEW}"}


def keys(env: dict[str, str]) -> Encryption:
    return Encryption(EnvKeys(environ=env))


def chat(cp: Any, thread: str, turns: int = 2) -> None:
    graph = chat_graph().compile(checkpointer=cp)
    for i in range(turns):
        graph.invoke({"messages": [HumanMessage(content=f"{SECRET} {i}")]},
                     {"configurable": {"thread_id": thread, "api_key": "sk-very-secret"}})


def stored(cp: Any) -> set[str]:
    """The key ids (or "plain") of every checkpoint record as stored."""
    sealed = cp.stored.sealed

    async def rows() -> list[Any]:
        inner = sealed.inner if sealed is not None else cp._raw_store
        return [r async for r in inner.iter_checkpoints(ListQuery())]

    out = set()
    for row in cp.run_sync(rows()):
        type_, data = row.checkpoint[0], bytes(row.checkpoint[1])
        out.add(data[7:7 + data[6]].decode() if type_ == SEALED and data[4] & 1 else "plain")
    return out


@pytest.fixture
def plain_store(tmp_path: Path) -> Iterator[Store]:
    s = new_store("sqlite", tmp_path)
    with s.open() as cp:
        for t in ("t1", "t2", "t3"):
            chat(cp, t)
    yield s
    s.handle.cleanup()


def test_new_key() -> None:
    run = lgckpt("new-key")
    assert run.code == 0 and len(base64.b64decode(run.out.strip(), validate=True)) == 32
    run = lgckpt("new-key", "--id", "2026-12")
    kid, _, key = run.out.strip().partition(":")
    assert kid == "2026-12" and len(base64.b64decode(key)) == 32
    assert EnvKeys(environ={"LGCKPT_KEYS": run.out.strip()}).current(None) == "2026-12"
    assert lgckpt("new-key").out != lgckpt("new-key").out
    fails(lgckpt("new-key", "--id", "no spaces"), 2, "key id")


def test_encrypting_a_plaintext_store_in_place_then_rotating(plain_store: Store) -> None:
    url = plain_store.url
    fails(lgckpt("rotate-keys", url), 2, "LGCKPT_KEYS")  # no keys
    fails(lgckpt("rotate-keys", url, "--plaintext-read"), 2, "LGCKPT_KEYS")
    history = lgckpt("history", "t1", "--json", url=url).json()
    # with keys but without --plaintext-read, a plaintext row is refused, and named
    assert "stored unencrypted" in lgckpt("history", "t1", url=url, env=ONE).err

    dry = lgckpt("rotate-keys", url, "--plaintext-read", "--dry-run", "--json", env=ONE).json()
    assert dry["dry_run"] and dry["rows_rotated"] > 0 and dry["from_keys"] == {
        "": dry["rows_rotated"]}
    with plain_store.open() as cp:
        assert stored(cp) == {"plain"}

    # one thread first (as a run stopped part way would leave it), then the rest: resumed
    one = lgckpt("rotate-keys", url, "--plaintext-read", "--thread", "t2", "--json", env=ONE)
    assert one.json()["threads_rotated"] == 1
    rest = lgckpt("rotate-keys", "--plaintext-read", "--json", url=url, env=ONE).json()
    assert rest["threads_rotated"] == 2 and rest["rows_current"] > 0
    assert rest["rows_rotated"] + one.json()["rows_rotated"] == dry["rows_rotated"]
    with plain_store.open(encryption=keys(ONE)) as cp:
        assert stored(cp) == {"old"}
    fails(lgckpt("history", "t1", url=url), 2, "store is encrypted", "LGCKPT_KEYS")
    assert lgckpt("history", "t1", "--json", url=url, env=ONE).json() == history

    # a new current key: everything sealed again under it, with progress and a summary
    run = lgckpt("rotate-keys", url, env=BOTH)
    assert run.code == 0 and "re-sealed" in run.out and "from old:" in run.out, run
    with plain_store.open(encryption=keys(BOTH)) as cp:
        assert stored(cp) == {"new"}
    again = lgckpt("rotate-keys", url, "--json", env=BOTH).json()
    assert again["rows_rotated"] == 0 and again["rows_current"] == dry["rows_rotated"]
    assert lgckpt("history", "t1", "--json", url=url,
                  env={"LGCKPT_KEYS": f"new:{NEW}"}).json() == history


def test_exports_of_an_encrypted_store(tmp_path: Path) -> None:
    s = new_store("sqlite", tmp_path / "a", encryption=keys(ONE))
    try:
        with s.open(encryption=keys(ONE)) as cp:
            chat(cp, "t1")
        sealed = lgckpt("export", url=s.url, env=ONE)
        assert sealed.code == 0 and SECRET not in sealed.out
        assert json.loads(sealed.out.splitlines()[0])["sealed"] is True
        plain = lgckpt("export", "--plaintext", url=s.url, env=ONE)
        assert plain.code == 0 and not json.loads(plain.out.splitlines()[0]).get("sealed")
        assert any(SECRET in base64.b64decode(w[3]).decode("utf-8", "replace")
                   for line in plain.out.splitlines()[1:-1]
                   for w in json.loads(line)["writes"])
        target = f"sqlite:///{tmp_path / 'b.db'}"
        path = tmp_path / "t.jsonl"
        path.write_text(sealed.out)
        fails(lgckpt("import", "--jsonl", str(path), url=target), 1, "LGCKPT_KEYS")
        run = lgckpt("import", "--jsonl", str(path), url=target, env=BOTH)
        assert run.code == 0, run
        assert lgckpt("history", "t1", "--json", url=target, env=BOTH).json() == lgckpt(
            "history", "t1", "--json", url=s.url, env=ONE).json()
    finally:
        s.handle.cleanup()


@pytest.fixture(params=params(["sqlite", "postgres", "redis"]))
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_url_options_on_every_backend(backend: str, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    s = new_store(backend, tmp_path)
    try:
        join = "&" if "?" in s.url else "?"
        monkeypatch.setenv("LGCKPT_KEYS", ONE["LGCKPT_KEYS"])
        url = f"{s.url}{join}encryption=env&compression=zstd&redact_metadata=customer_ref"
        with connect(url) as cp:
            assert cp.encryption is not None and cp.compression is not None
            graph = chat_graph().compile(checkpointer=cp)
            graph.invoke({"messages": [HumanMessage(content=SECRET)]}, {"configurable": {
                "thread_id": "t1", "customer_ref": "c-42", "api_key": "sk-x", "plain": "p"}})
            metadata = cp.get_tuple({"configurable": {"thread_id": "t1"}}).metadata
            assert "customer_ref" not in metadata and "api_key" not in metadata
            assert metadata["plain"] == "p"
            assert stored(cp) == {"old"}
        # the CLI reads it with the keys from the environment, the URL plain
        run = lgckpt("history", "t1", "--json", url=s.url, env=ONE)
        assert run.code == 0 and run.json(), run
        monkeypatch.delenv("LGCKPT_KEYS")
        with connect(f"{s.url}{join}compression=none&redact_metadata=false") as cp:
            assert cp.encryption is None and cp.compression is None
            graph = chat_graph().compile(checkpointer=cp)
            graph.invoke({"messages": [HumanMessage(content="x")]},
                         {"configurable": {"thread_id": "t2", "api_key": "sk-x"}})
            assert cp.get_tuple({"configurable": {"thread_id": "t2"}}).metadata[
                "api_key"] == "sk-x"
        with pytest.raises(ValueError, match="LGCKPT_KEYS"):
            connect(f"{s.url}{join}encryption=env")
        with pytest.raises(ValueError, match="compression must be one of"):
            connect(f"{s.url}{join}compression=lz4")
    finally:
        s.handle.cleanup()
