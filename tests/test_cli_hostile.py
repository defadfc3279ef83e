"""`lgckpt` against hostile input: passwords in URLs (never printed, whatever the URL looks
like), and thread ids holding terminal control sequences (escaped in text, exact in JSON).
It runs `main` in-process, which is quick."""

from __future__ import annotations

import io
import json
import unicodedata
from pathlib import Path
from urllib.parse import quote

import pytest

from langgraph_ckpt_ext.cli import main
from langgraph_ckpt_ext.cli.output import Output, printable
from langgraph_ckpt_ext.core.saver import StoreCheckpointer

from .conftest import cleanup, conf
from .graphs import chat_graph, human
from .test_cli import free_port, new_store


def write_chats(cp: StoreCheckpointer, *threads: str) -> None:
    graph = chat_graph().compile(checkpointer=cp)
    for thread in threads:
        graph.invoke({"messages": [human(f"hi {thread}")]}, conf(thread))


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


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


@pytest.mark.parametrize("backend", ["postgres", "redis"])
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
        cleanup(s.backend, s.writer)


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
