"""`lgckpt` against hostile stores and input: a damaged row in one thread (the others still
listed, exported, copied), passwords in URLs (never printed, whatever the URL looks like), and
thread ids holding terminal control sequences (escaped in text, exact in JSON).

Damage is checked through subprocesses (no cache of the writer in the way); the rest runs
`main` in-process, which is quick."""

from __future__ import annotations

import asyncio
import io
import json
import sqlite3
import unicodedata
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from langgraph_ckpt_ext import connect
from langgraph_ckpt_ext.cli import main
from langgraph_ckpt_ext.cli.output import Output, printable
from langgraph_ckpt_ext.core.saver import StoreCheckpointer
from langgraph_ckpt_ext.transfer import open_jsonl
from tests.cli.test_cli import BACKENDS, Store, free_port, lgckpt, new_store
from tests.support.cli_serde import XorSerde
from tests.support.common import conf
from tests.support.graphs import chat_graph, human
from tests.support.savers import PG_DSN, REDIS_URL, params

EIGHT = 8  # exit code: finished past damaged threads


def write_chats(cp: StoreCheckpointer, *threads: str) -> None:
    graph = chat_graph().compile(checkpointer=cp)
    for thread in threads:
        graph.invoke({"messages": [human(f"hi {thread}")]}, conf(thread))


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# -- item 3: one undecodable row -----------------------------------------------------------------


def corrupt(s: Store, thread: str) -> None:
    """Make the stored value of a thread's `turns` channel undecodable, through the raw
    database (0xc1 is a byte msgpack never uses)."""
    junk = b"\xc1\xc1"
    if s.backend == "sqlite":
        with sqlite3.connect(s.tmp_path / "ckpt.db") as conn:
            n = conn.execute("UPDATE lgx_blobs SET data = ? WHERE thread_id = ? AND channel = "
                             "'turns'", (junk, thread)).rowcount
    elif s.backend == "postgres":
        import asyncpg

        async def update() -> str:
            conn = await asyncpg.connect(PG_DSN)
            try:
                schema = s.handle.schema
                return str(await conn.execute(
                    f'UPDATE "{schema}".lgx_blobs SET data = $1 WHERE thread_id = $2 AND '
                    "channel = 'turns'", junk, thread))
            finally:
                await conn.close()

        n = int(asyncio.run(update()).split()[-1])
    else:  # <prefix>:{<thread>}:bl, a hash: ns\0channel\0version -> base\0type\0data
        import redis

        client = redis.Redis.from_url(REDIS_URL)
        key = f"{s.handle.prefix}:{{{thread}}}:bl"
        try:
            fields = [f for f in client.hkeys(key) if f.split(b"\0")[1] == b"turns"]
            for f in fields:
                base, type_, _ = client.hget(key, f).split(b"\0", 2)
                client.hset(key, f, b"\0".join([base, type_, junk]))
            n = len(fields)
        finally:
            client.close()
    assert n == 1


@pytest.fixture(params=params(BACKENDS))
def damaged(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """Threads a, b, c; b's newest checkpoint cannot be decoded."""
    s = new_store(str(request.param), tmp_path)
    try:
        with s.open() as cp:
            write_chats(cp, "a", "b", "c")
        corrupt(s, "b")
        yield s
    finally:
        s.handle.cleanup()


def _reported(err: str, thread: str) -> None:
    """One line on stderr names the damaged thread and the row; the last says why exit 8."""
    lines = err.strip().splitlines()
    named = [line for line in lines if repr(thread) in line and "channel 'turns'" in line]
    assert len(named) == 1, err
    assert lines[-1].startswith("lgckpt: error: ") and "--strict" in lines[-1], err


def _damage(doc: list[dict[str, Any]], thread: str) -> None:
    assert [d["thread_id"] for d in doc] == [thread]
    assert "channel 'turns' at version" in doc[0]["row"]
    assert "cannot decode" in doc[0]["error"]


def test_store_wide_commands_go_past_a_damaged_thread(damaged: Store, tmp_path: Path) -> None:
    url = damaged.url
    run = lgckpt("threads", "--json", url=url)
    assert run.code == EIGHT, run
    rows = {r["thread_id"]: r for r in json.loads(run.out)}
    assert {t: r["status"] for t, r in rows.items()} == {"a": "done", "b": "damaged",
                                                          "c": "done"}
    _damage([{k: rows["b"][k] for k in ("thread_id", "row", "error")}], "b")
    assert rows["b"]["checkpoints"] == 3
    _reported(run.err, "b")

    backup = tmp_path / "backup.jsonl"
    run = lgckpt("export", "-o", str(backup), "--json", url=url)
    assert run.code == EIGHT, run
    report = json.loads(run.out)
    assert report["threads"] == 2 and report["checkpoints"] == 6
    _damage(report["damaged"], "b")
    _reported(run.err, "b")
    with open_jsonl(backup) as source:  # a complete export of the healthy threads
        assert source.thread_ids() == ["a", "c"]

    target = f"sqlite:///{tmp_path / 'copy.db'}"
    run = lgckpt("copy", "--to", target, "--json", url=url)
    assert run.code == EIGHT, run
    report = json.loads(run.out)
    assert (report["threads_copied"], report["threads_verified"], report["ok"]) == (2, 2, True)
    _damage(report["damaged"], "b")
    _reported(run.err, "b")
    with connect(target, setup=False) as cp:
        assert cp.thread_ids() == ["a", "c"]


def test_damage_in_text_history_and_strict(tmp_path: Path) -> None:
    s = new_store("sqlite", tmp_path)
    with s.open() as cp:
        write_chats(cp, "a", "b", "c")
        cp.fork(conf("a"), "a-fork")  # a thread the copy target holds already, then damaged
    url, target = s.url, f"sqlite:///{tmp_path / 'copy.db'}"
    assert lgckpt("copy", "a-fork", "--to", target, url=url).code == 0
    corrupt(s, "b")
    with sqlite3.connect(tmp_path / "ckpt.db") as conn:  # a-fork's copy of a's value too
        conn.execute("UPDATE lgx_blobs SET data = x'c1' WHERE thread_id = 'a-fork' AND "
                     "channel = 'turns'")

    run = lgckpt("threads", url=url)
    assert run.code == EIGHT, run
    lines = run.out.splitlines()
    assert [line.split()[0] for line in lines[1:]] == ["a", "a-fork", "b", "c"]
    assert lines[3].split()[-1] == "damaged" and lines[4].split()[-1] == "done"
    _reported(run.err, "b")

    history = lgckpt("history", "b", "--json", url=url)
    assert history.code == EIGHT, history
    entries = json.loads(history.out)
    assert [e["step"] for e in entries] == [1, 0, -1]  # every checkpoint listed
    assert entries[0]["status"] == "damaged" and "cannot decode" in entries[0]["error"]
    assert entries[1]["writes"] == ["messages", "turns"] and "status" not in entries[1]
    _reported(history.err, "b")
    assert lgckpt("history", "a", url=url).code == 0

    strict = lgckpt("threads", "--strict", url=url)
    assert strict.code == 1 and strict.out == "", strict
    assert strict.err.count("\n") == 1 and "'a-fork'" in strict.err, strict
    backup = tmp_path / "strict.jsonl"
    strict = lgckpt("export", "-o", str(backup), "--strict", url=url)
    assert strict.code == 1 and "'a-fork'" in strict.err and not backup.exists(), strict

    run = lgckpt("copy", "--to", target, "--json", url=url)  # a-fork conflicts in no way
    assert run.code == EIGHT, run
    report = json.loads(run.out)
    assert [d["thread_id"] for d in report["damaged"]] == ["a-fork", "b"]
    assert report["threads_copied"] == 2


def test_stores_of_a_custom_serializer(tmp_path: Path) -> None:
    s = new_store("sqlite", tmp_path)
    with s.open(serde=XorSerde(), unsafe_allow_any_class=True) as cp:
        write_chats(cp, "a", "b")
    run = lgckpt("threads", "--json", url=s.url)  # without it, every thread reads as damaged
    assert run.code == EIGHT and "--serde" in run.err.splitlines()[-1], run
    assert {r["status"] for r in json.loads(run.out)} == {"damaged"}
    # A serializer this package cannot make strict: refused unless the operator says so.
    run = lgckpt("threads", "--json", "--serde", "tests.support.cli_serde:SERDE", url=s.url)
    assert run.code == 2 and "unsafe_allow_any_class" in run.err, run
    run = lgckpt("threads", "--json", "--serde", "tests.support.cli_serde:SERDE",
                 "--unsafe-allow-any-class", url=s.url)
    assert [r["status"] for r in run.json()] == ["done", "done"]
    target = f"sqlite:///{tmp_path / 'copy.db'}"
    run = lgckpt("--serde", "tests.support.cli_serde:XorSerde", "--unsafe-allow-any-class", "copy",
                 "--to", target, url=s.url,
                 script=True)  # a factory; the console script, from the repository
    assert run.code == 0 and "2 threads copied" in run.out, run
    with connect(target, setup=False, serde=XorSerde(),
                 unsafe_allow_any_class=True) as cp:  # written with it too
        assert cp.thread_ids() == ["a", "b"]
    bad = lgckpt("threads", "--serde", "tests.support.cli_serde:_KEY", url=s.url)
    assert bad.code == 2 and "not a serializer" in bad.err, bad


# -- item 4: passwords in URLs --------------------------------------------------------------------

# '/' and '?' alone cut the URL as '#' does: the last one holds them all
PASSWORDS = ["s3cr#Et9x", "s3cr@Et9x", "s3cr%Et9x", "s3cr Et9x", "4711#Et9x", "s3cr:Et9/x?y#z@w"]


def _pieces(password: str) -> list[str]:
    """The password, and each part of it a parser may cut it into (3 characters or more)."""
    parts = [password, quote(password, safe="")]
    for sep in "#/?@: %":
        parts += [p for p in password.split(sep) if len(p) >= 3]
    return parts


def _hidden(password: str, *texts: str) -> None:
    for text in texts:
        for piece in _pieces(password):
            assert piece not in text, (piece, text)


@pytest.mark.parametrize("password", PASSWORDS)
def test_passwords_never_printed(password: str, capsys: pytest.CaptureFixture[str],
                                 tmp_path: Path) -> None:
    closed = free_port()
    urls = [
        f"postgresql://postgres:{password}@127.0.0.1:5432/test?schema=lgx_cli_nothing_here",
        f"postgresql://postgres:{password}@127.0.0.1:{closed}/test",
        f"redis://:{password}@127.0.0.1:6379/0?key_prefix=lgx-cli-nothing-here",
        f"redis://default:{password}@127.0.0.1:{closed}/0",
        f"postgresql://postgres@127.0.0.1:{closed}/test?password={password}",
    ]
    for url, mode in [(urls[0], "--no-color"), *((u, "--json") for u in urls)]:
        code, out, err = _run(capsys, "threads", mode, "--url", url)
        assert code == 5 and out == "" and err.startswith("lgckpt: error: "), (url, err)
        _hidden(password, out, err)
    source = new_store("sqlite", tmp_path)
    with source.open() as cp:
        write_chats(cp, "a")
    sqlite = source.url
    for argv in (["copy", "--url", sqlite, "--to", urls[1]],
                 ["import", "--from-official", urls[1], "--url", sqlite],
                 [urls[0], "threads"],  # a usage error quotes the argument
                 ["--url", urls[0], "threads", "--limit", "0"]):
        code, out, err = _run(capsys, *argv)
        assert code in (1, 2, 5) and err, (argv, err)
        _hidden(password, out, err)
    assert "***" in _run(capsys, "threads", "--url", urls[0])[2]


@pytest.mark.parametrize("backend", params(["postgres", "redis"]))
def test_passwords_hidden_when_it_works(backend: str, capsys: pytest.CaptureFixture[str],
                                        tmp_path: Path) -> None:
    """A reachable server (PostgreSQL trusts any password here; Redis has none to check):
    percent-encoded passwords work, and are never printed either."""
    s = new_store(backend, tmp_path)
    try:
        with s.open() as cp:
            write_chats(cp, "a")
        scheme, rest = s.url.split("://", 1)
        for password in PASSWORDS:
            user = "postgres" if backend == "postgres" else "default"
            url = f"{scheme}://{user}:{quote(password, safe='')}@{rest.split('@')[-1]}"
            code, out, err = _run(capsys, "threads", "--json", "--url", url)
            assert code == 0 and [r["thread_id"] for r in json.loads(out)] == ["a"], err
            code, out2, err2 = _run(capsys, "history", "nobody", "--url", url)
            assert code == 3, err2
            _hidden(password, out, err, out2, err2)
    finally:
        s.handle.cleanup()


# -- item 5: terminal control characters in thread ids --------------------------------------------

HOSTILE = ["clear\x1b[2J\x1b[Hscreen", "two\nlines", "car\rriage", "tab\tbed", "del\x7fete",
           "csi\x9b31m", "bidi\u202eevil"]


def _raw_controls(text: str) -> list[str]:
    """Characters a terminal acts on (other than the newline that ends a line)."""
    return [ch for ch in text if ch != "\n" and (
        unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp"))]


def test_control_characters_escaped_in_text(capsys: pytest.CaptureFixture[str],
                                            tmp_path: Path) -> None:
    s = new_store("sqlite", tmp_path, audit=True)
    with s.open(audit=True) as cp:
        write_chats(cp, *HOSTILE)
    url = s.url
    code, out, _ = _run(capsys, "threads", "--json", "--url", url)
    assert code == 0 and [r["thread_id"] for r in json.loads(out)] == sorted(HOSTILE)
    backup = tmp_path / "x.jsonl"
    runs = [["threads"], ["stats"], ["prune", "--all", "--dry-run"], ["verify", "--all"],
            ["export", "-o", str(backup)], ["diff", HOSTILE[0], HOSTILE[1]]]
    for thread in HOSTILE:
        runs += [["show", thread], ["history", thread], ["stats", thread],
                 ["fork", thread, "--to", thread + "\x1b]0;title\x07"]]
    for argv in runs:
        code, out, err = _run(capsys, *argv, "--url", url)
        assert code == 0, (argv, err)
        assert _raw_controls(out + err) == [], (argv, out, err)
    code, out, _ = _run(capsys, "threads", "--url", url)
    lines = out.splitlines()
    assert len(lines) == 1 + 2 * len(HOSTILE)  # one row each, forks included: none forged
    assert any(line.startswith("clear\\x1b[2J\\x1b[Hscreen ") for line in lines), out
    assert any(line.startswith("two\\nlines ") for line in lines), out
    code, out, _ = _run(capsys, "threads", "--json", "--url", url)
    ids = [r["thread_id"] for r in json.loads(out)]
    assert sorted(HOSTILE + [t + "\x1b]0;title\x07" for t in HOSTILE]) == ids  # exact


def test_one_escaping_function() -> None:
    assert printable("a\x1b[2Jb\n\r\t\x7f\x9b\u202e\u2028\ud800z") == (
        "a\\x1b[2Jb\\n\\r\\t\\x7f\\x9b\\u202e\\u2028\\ud800z")
    assert printable("plain ünïcödé 😀 text") == "plain ünïcödé 😀 text"
    out, err = io.StringIO(), io.StringIO()
    o = Output(False, False, stdout=out, stderr=err)
    o.table([{"thread_id": "x\x1b[31m\ny", "status": "done"}], ["thread_id", "status"])
    o.line("one\x1b[2J")
    o.error("boom \x1b[2J\nnext")
    o.warn("care\x9b")
    with o.progress(2, "label\x1b[2J") as bar:  # drawn only on a terminal: not here
        bar.update(2)
    assert _raw_controls(out.getvalue() + err.getvalue()) == []
    lines = out.getvalue().splitlines()
    assert lines[1:] == ["x\\x1b[31m\\ny  done", "one\\x1b[2J"] and len(lines) == 3
    json_out = io.StringIO()
    Output(True, False, stdout=json_out, stderr=err).json({"id": "a\x1b\x9b\u202e\n"})
    assert _raw_controls(json_out.getvalue()) == []  # escaped as JSON escapes: exact
    assert json.loads(json_out.getvalue()) == {"id": "a\x1b\x9b\u202e\n"}
