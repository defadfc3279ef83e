"""Secrets a config carries stay out of checkpoint metadata (LangGraph copies a run's
`configurable` values into it), on every backend; `lgckpt` never prints one stored before."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import HumanMessage

from langgraph_ckpt_ext import SQLiteCheckpointer
from langgraph_ckpt_ext.core.redact import Redaction, words
from langgraph_ckpt_ext.core.rows import ListQuery
from tests.support.forked import run_lgckpt
from tests.support.graphs import chat_graph
from tests.support.savers import SaverHandle, open_saver, params

SECRET = "sk-live-5f3a9c"
CONFIGURABLE = {"api_key": SECRET, "Authorization": f"Bearer {SECRET}",
                "accessToken": SECRET, "X-Api-Key": SECRET, "db_password": SECRET,
                "max_tokens": 512, "user_id": "u-1", "author": "ann", "keyword": "k"}
KEPT = {"max_tokens", "user_id", "author", "keyword"}


@pytest.fixture(params=params(["memory", "sqlite", "postgres", "redis"]))
def handle(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SaverHandle]:
    with open_saver(request.param, tmp_path) as h:
        yield h


def run(cp: Any, thread: str) -> None:
    graph = chat_graph().compile(checkpointer=cp)
    config = {"configurable": {"thread_id": thread, **CONFIGURABLE}}
    graph.invoke({"messages": [HumanMessage(content="hi")]}, config)


def raw_metadata(cp: Any, thread: str) -> list[bytes]:
    """Every stored checkpoint row's metadata bytes, as the store holds them."""
    async def collect() -> list[bytes]:
        return [row.metadata[1] async for row in cp.stored.iter(ListQuery(thread_id=thread))]

    return cp.run_sync(collect())


def test_key_words() -> None:
    assert words("X-Api-Key") == ["x", "api", "key"]
    assert words("accessToken") == ["access", "token"]
    rule = Redaction()
    for key in ("api_key", "apiKey", "OPENAI_API_KEY", "Authorization", "auth", "db_password",
                "client_secret", "refresh-token", "session_id", "private_key", "cookie"):
        assert rule.secret(key), key
    for key in ("max_tokens", "author", "keyword", "user_id", "thread_id", "source", "step",
                "parents", "run_id", "checkpoint_ns", "langgraph_step", "monkey"):
        assert not rule.secret(key), key
    custom = Redaction(["tenant key", "ssn"])
    assert custom.secret("TenantKey") and custom.secret("user_ssn") and custom.secret("token")
    assert not Redaction(["ssn"], defaults=False).secret("api_key")
    for bad in ("", "  ", 3):
        with pytest.raises(ValueError, match="key name"):
            Redaction([bad])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="list of key names"):
        Redaction("api_key")


def test_secrets_never_stored_on_any_backend(handle: SaverHandle) -> None:
    cp = handle.inner
    run(cp, "r")
    tuples = list(cp.list({"configurable": {"thread_id": "r"}}))
    assert tuples
    for tup in tuples:
        assert not set(tup.metadata) & (set(CONFIGURABLE) - KEPT), tup.metadata
        assert set(tup.metadata) >= KEPT
    rows = raw_metadata(cp, "r")
    assert rows and not any(SECRET.encode() in data for data in rows)
    # what is kept still filters
    assert list(cp.list({"configurable": {"thread_id": "r"}}, filter={"user_id": "u-1"}))


def test_redaction_is_an_option(tmp_path: Path) -> None:
    with open_saver("memory", tmp_path, redact_metadata=False) as h:
        run(h.inner, "plain")
        assert h.inner.get_tuple({"configurable": {"thread_id": "plain"}}).metadata[
            "api_key"] == SECRET
    with open_saver("memory", tmp_path, redact_metadata=["user id"]) as h:
        run(h.inner, "more")
        md = h.inner.get_tuple({"configurable": {"thread_id": "more"}}).metadata
        assert "user_id" not in md and "api_key" not in md and "max_tokens" in md


def test_cli_never_prints_a_secret_stored_before(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with SQLiteCheckpointer(path, redact_metadata=False) as cp:  # a store written without it
        run(cp, "old")
    url = f"sqlite:///{path}"
    env = dict(os.environ)
    for args in (["history", "old", "--json"], ["show", "old", "--json"], ["show", "old"]):
        code, out, err = run_lgckpt([*args, "--url", url], env=env, cwd=tmp_path)
        assert code == 0, err
        assert SECRET not in out + err, args
        assert "***" in out, args
    shown = json.loads(run_lgckpt(["show", "old", "--json", "--url", url], env=env,
                                  cwd=tmp_path)[1])
    assert shown["metadata"]["api_key"] == "***" and shown["metadata"]["max_tokens"] == 512
