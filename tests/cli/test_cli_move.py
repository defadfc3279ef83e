"""`lgckpt copy`, `import` and `export`, run as subprocesses against real stores: a copy
killed (SIGKILL) halfway and run again, round trips, and bad input (a one-line error, an exit
code, and nothing changed at either end)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from langgraph_ckpt_ext import SQLiteCheckpointer, connect
from langgraph_ckpt_ext.transfer import diff_thread, thread_ids, thread_tuples
from tests.support.forked import run_lgckpt
from tests.support.graphs import chat_graph, human
from tests.support.savers import (
    PG_DSN,
    REDIS_URL,
    drop_pg_schemas,
    drop_redis_prefixes,
    params,
    pg_schema,
    redis_prefix,
)
from tests.support.transfer_graphs import official_sqlite
from tests.support.transfer_graphs import write_threads as write_official_threads

REPO = Path(__file__).resolve().parents[2]
THREADS = 400  # enough that a copy killed at 40% is caught mid-way, in a few seconds


@dataclass
class Run:
    code: int
    out: str
    err: str


def lgckpt(*args: str, stdin: str | None = None) -> Run:
    """`lgckpt ARGS` in a process of its own, forked from one that imported it once."""
    env = {k: v for k, v in os.environ.items() if k != "LGCKPT_URL"}
    return Run(*run_lgckpt(list(args), env=env, cwd=REPO, stdin=stdin))


def _one_line_error(run: Run, code: int, *needles: str) -> None:
    assert run.code == code, run
    lines = run.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lgckpt: error: "), run.err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def _state(url: str) -> dict[str, list[tuple[str, str]]] | None:
    """Every thread of a store with its checkpoints' ids and parents (None: no store there)."""
    if url.startswith("sqlite:///") and not os.path.exists(url[len("sqlite:///"):]):
        return None
    saver = connect(url, setup=False)
    try:
        if saver.storage_version() == 0:
            return None
        return {t: [(c.checkpoint["id"], str(c.checkpoint["channel_values"]))
                    for c in thread_tuples(saver, t)] for t in thread_ids(saver)}
    finally:
        saver.close()


def _equal(source_url: str, target_url: str) -> int:
    """Every thread of the source is in the target, once and equal; how many threads."""
    source, target = connect(source_url, setup=False), connect(target_url, setup=False)

    def differs(tid: str) -> str | None:
        d = diff_thread(target.serde, tid, thread_tuples(source, tid), thread_tuples(target, tid))
        return None if d.equal else f"{tid}: {d.conflict or f'{len(d.missing)} missing'}"

    try:
        ids = thread_ids(source)
        assert thread_ids(target) == ids
        with ThreadPoolExecutor(8) as pool:  # overlaps the round trips
            assert [d for d in pool.map(differs, ids) if d] == []
        return len(ids)
    finally:
        source.close()
        target.close()


@pytest.fixture
def move_urls(tmp_path: Path) -> Iterator[dict[str, str]]:
    """URLs: `src` (our SQLite, with threads), `pg` and `redis` (fresh, empty)."""
    src = tmp_path / "src.db"
    cp = SQLiteCheckpointer(src)
    write_official_threads(cp)
    cp.close()
    schema, prefix = pg_schema(), redis_prefix()
    yield {"src": f"sqlite:///{src}", "pg": f"{PG_DSN}?schema={schema}",
           "redis": f"{REDIS_URL}?key_prefix={prefix}", "dir": str(tmp_path)}
    drop_pg_schemas(schema)
    drop_redis_prefixes(prefix)


# -- what works -------------------------------------------------------------------------------


@pytest.mark.postgres
@pytest.mark.redis
def test_copy_export_import(move_urls: dict[str, str], tmp_path: Path) -> None:
    src, pg, redis = move_urls["src"], move_urls["pg"], move_urls["redis"]
    run = lgckpt("copy", "--url", src, "--to", pg)
    assert run.code == 0 and "4 threads copied" in run.out and "threads/s" in run.out, run
    assert _equal(src, pg) == 4
    again = lgckpt("copy", "--url", src, "--to", pg, "--json")
    report = json.loads(again.out)
    assert again.code == 0 and report["threads_skipped"] == 4 and report["ok"], again

    exported = lgckpt("export", "--url", pg)  # to stdout
    assert exported.code == 0 and "4 threads" in exported.err, exported
    assert json.loads(exported.out.splitlines()[0])["format"] == "langgraph-ckpt-ext/threads"
    run = lgckpt("import", "--jsonl", "-", "--url", redis, stdin=exported.out)
    assert run.code == 0 and "4 threads copied" in run.out, run
    assert _equal(src, redis) == 4

    out = tmp_path / "two.jsonl"
    run = lgckpt("export", "--url", src, "chat", "fork", "-o", str(out))
    assert run.code == 0 and out.exists() and not Path(f"{out}.part").exists(), run
    target = f"sqlite:///{tmp_path / 'two.db'}"
    run = lgckpt("import", "--jsonl", str(out), "--url", target, "--json")
    assert json.loads(run.out)["threads_copied"] == 2
    assert sorted(_state(target) or {}) == ["chat", "fork"]


def test_import_from_official(tmp_path: Path) -> None:
    with official_sqlite(tmp_path) as (url, _):
        target = f"sqlite:///{tmp_path / 'ours.db'}"
        run = lgckpt("import", "--from-official", url, "--url", target, "approve", "sub")
        assert run.code == 0 and "2 threads copied" in run.out, run
        assert sorted(_state(target) or {}) == ["approve", "sub"]
        run = lgckpt("import", "--from-official", url, "--url", target)
        assert run.code == 0 and "2 threads copied" in run.out and "2 already there" in run.out


def _fresh(backend: str, tmp_path: Path, name: str) -> tuple[str, Callable[[], None]]:
    """The URL of an empty store of its own on `backend`, and how to drop it."""
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / f'{name}.db'}", lambda: None
    if backend == "postgres":
        schema = pg_schema()
        return f"{PG_DSN}?schema={schema}", lambda: drop_pg_schemas(schema)
    prefix = redis_prefix()
    return f"{REDIS_URL}?key_prefix={prefix}", lambda: drop_redis_prefixes(prefix)


@pytest.mark.parametrize("backend", params(["sqlite", "postgres", "redis"]))
def test_move_commands_on_each_backend(backend: str, tmp_path: Path) -> None:
    """`import --from-official`, `copy`, `export` and `import --jsonl`, each reading from and
    writing to stores of one backend: an official SqliteSaver database -> A -> B -> a file ->
    C, every thread equal at each step."""
    fresh = [_fresh(backend, tmp_path, name) for name in "abc"]
    (a, b, c), drops = zip(*fresh, strict=True)
    try:
        with official_sqlite(tmp_path) as (official, _):
            run = lgckpt("import", "--from-official", official, "--url", a, "--json")
            assert run.code == 0, run
            report = json.loads(run.out)
            assert report["ok"] and report["threads_copied"] == report["threads_verified"] == 4
            assert sorted(_state(a) or {}) == ["approve", "chat", "fork", "sub"]

        run = lgckpt("copy", "--url", a, "--to", b, "chat", "sub", "--json")
        assert run.code == 0, run
        report = json.loads(run.out)
        assert report["ok"] and (report["threads_copied"], report["threads_skipped"]) == (2, 0)
        run = lgckpt("copy", "--url", a, "--to", b)  # the rest; the two already there skipped
        assert run.code == 0 and "2 threads copied" in run.out and "2 already there" in run.out
        assert _equal(a, b) == 4

        out = tmp_path / f"{backend}.jsonl"
        run = lgckpt("export", "--url", b, "-o", str(out), "--json")
        assert run.code == 0 and not Path(f"{out}.part").exists(), run
        exported = json.loads(run.out)
        assert exported["threads"] == 4 and exported["checkpoints"] > 4
        lines = out.read_text().splitlines()
        assert json.loads(lines[0])["format"] == "langgraph-ckpt-ext/threads"
        assert len(lines) == exported["checkpoints"] + 2  # a header, the checkpoints, an end

        run = lgckpt("import", "--jsonl", str(out), "--url", c, "--json")
        assert run.code == 0, run
        report = json.loads(run.out)
        assert report["ok"] and report["threads_copied"] == 4
        assert _equal(a, c) == 4 and _state(c) == _state(a)
    finally:
        for d in drops:
            d()


@pytest.mark.parametrize("backend", params(["sqlite", "postgres", "redis"]))
def test_copy_and_import_into_audited_stores_verify(backend: str, tmp_path: Path) -> None:
    """`import --from-official`, `copy` and `import --jsonl` into stores audited by a
    checkpointer opened once with audit=True: the commands' own checkpointers (opened without
    it) seal every checkpoint they write, and `verify --all` passes on each store."""
    fresh = [_fresh(backend, tmp_path, name) for name in "abc"]
    (a, b, c), drops = zip(*fresh, strict=True)
    try:
        for url in (a, b, c):
            connect(url, audit=True).close()
        with official_sqlite(tmp_path) as (official, _):
            assert lgckpt("import", "--from-official", official, "--url", a).code == 0
        assert lgckpt("copy", "--url", a, "--to", b).code == 0
        out = tmp_path / f"{backend}.jsonl"
        assert lgckpt("export", "--url", b, "-o", str(out)).code == 0
        assert lgckpt("import", "--jsonl", str(out), "--url", c).code == 0
        for url in (a, b, c):
            run = lgckpt("verify", "--all", "--url", url, "--json")
            assert run.code == 0, run
            assert {r["thread_id"]: r["status"] for r in json.loads(run.out)} == dict.fromkeys(
                ["approve", "chat", "fork", "sub"], "intact")
    finally:
        for d in drops:
            d()


# -- bad input --------------------------------------------------------------------------------


def _conflict(url: str) -> None:
    """Give the target a thread 'chat' of its own."""
    saver = connect(url)
    try:
        chat_graph().compile(checkpointer=saver).invoke(
            {"messages": [human("mine")]}, {"configurable": {"thread_id": "chat"}})
    finally:
        saver.close()


@pytest.mark.postgres
@pytest.mark.redis
def test_copy_bad_input(move_urls: dict[str, str]) -> None:
    src, pg = move_urls["src"], move_urls["pg"]
    new = f"sqlite:///{move_urls['dir']}/new.db"
    before = _state(src)
    cases: list[tuple[list[str], int, tuple[str, ...]]] = [
        (["--url", "mysql://h/db", "--to", pg], 5, ("unsupported URL scheme 'mysql'",)),
        (["--url", src, "--to", "postgresql://postgres@127.0.0.1:1/test"], 5, ("cannot reach",)),
        (["--url", f"sqlite:///{move_urls['dir']}/none.db", "--to", new], 5, ("no such file",)),
        (["--url", src, "--to", new, "chat", "nope"], 3, ("'nope' is not in",)),
    ]
    for args, code, needles in cases:
        _one_line_error(lgckpt("copy", *args), code, *needles)
    assert not os.path.exists(f"{move_urls['dir']}/none.db")
    assert _state(new) is None and _state(pg) is None  # nothing created at the target
    for args in (["--to", pg, "--concurrency", "0"], []):
        assert lgckpt("copy", "--url", src, *args).code == 2

    _conflict(pg)
    held = _state(pg)
    run = lgckpt("copy", "--url", src, "--to", pg)
    _one_line_error(run, 4, "'chat'", "--overwrite")
    assert _state(pg) == held and _state(src) == before  # nothing changed at either end
    run = lgckpt("copy", "--url", src, "--to", pg, "--overwrite")
    assert run.code == 0 and "4 threads copied" in run.out, run
    assert _equal(src, pg) == 4


@pytest.mark.postgres
@pytest.mark.redis
def test_import_bad_input(move_urls: dict[str, str], tmp_path: Path) -> None:
    target = f"sqlite:///{tmp_path / 'target.db'}"
    none = f"sqlite:///{tmp_path / 'none.db'}"
    good = tmp_path / "good.jsonl"
    assert lgckpt("export", "--url", move_urls["src"], "-o", str(good)).code == 0
    lines = good.read_text().splitlines()
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join([*lines[:2], lines[2][:40], *lines[3:]]) + "\n")
    cases: list[tuple[list[str], int, tuple[str, ...]]] = [
        (["--from-official", none], 5, ("no SQLite database",)),
        (["--from-official", move_urls["src"]], 5, ("not written by LangGraph's SqliteSaver",)),
        (["--from-official", "postgresql://postgres@127.0.0.1:1/test"], 5, ("cannot connect",)),
        (["--from-official", "mysql://h/db"], 5, ("unsupported URL",)),
        (["--jsonl", str(tmp_path / "none.jsonl")], 5, ("no such file",)),
        (["--jsonl", str(bad)], 1, ("line 3 of the export: not JSON", "nothing was imported")),
        (["--jsonl", str(good), "nope"], 3, ("'nope' is not in",)),
    ]
    for args, code, needles in cases:
        _one_line_error(lgckpt("import", *args, "--url", target), code, *needles)
    assert _state(target) is None  # the target was never created
    assert not (tmp_path / "none.db").exists()
    assert lgckpt("import", "--jsonl", str(good), "--from-official", none, "--url",
                  target).code == 2

    _conflict(move_urls["redis"])
    held = _state(move_urls["redis"])
    run = lgckpt("import", "--jsonl", str(good), "--url", move_urls["redis"])
    _one_line_error(run, 4, "'chat'", "--overwrite")
    assert _state(move_urls["redis"]) == held


@pytest.mark.postgres
@pytest.mark.redis
def test_export_bad_input(move_urls: dict[str, str], tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    run = lgckpt("export", "--url", move_urls["src"], "nope", "-o", str(out))
    _one_line_error(run, 3, "'nope' is not in")
    assert not out.exists()
    run = lgckpt("export", "--url", f"sqlite:///{tmp_path / 'none.db'}", "-o", str(out))
    _one_line_error(run, 5, "no such file")
    assert not (tmp_path / "none.db").exists() and not out.exists()
    run = lgckpt("export", "--url", move_urls["src"], "-o", str(tmp_path / "no" / "dir.jsonl"))
    _one_line_error(run, 1, "cannot write")


def test_verification_failure_exits_6() -> None:
    import io

    from langgraph_ckpt_ext.cli.damage import DamageLog
    from langgraph_ckpt_ext.cli.move import _report
    from langgraph_ckpt_ext.cli.output import Output
    from langgraph_ckpt_ext.transfer import CopyReport

    out, err = io.StringIO(), io.StringIO()
    report = CopyReport(2, 0, 1, 6, 8, 0.5, failed=(("t-1", "checkpoint 'x' differs"),))
    output = Output(False, False, stdout=out, stderr=err)
    assert _report(output, report, DamageLog(output, strict=False)) == 6
    assert "2 threads copied" in out.getvalue()
    run = Run(6, out.getvalue(), err.getvalue())
    _one_line_error(run, 6, "'t-1'", "checkpoint 'x' differs", "--overwrite")


# -- killed halfway ---------------------------------------------------------------------------


def _pg_count(schema: str) -> Callable[[], int]:
    import psycopg

    conn = psycopg.connect(PG_DSN, autocommit=True)

    def count() -> int:
        try:
            row = conn.execute(
                f'SELECT count(DISTINCT thread_id) FROM "{schema}".lgx_checkpoints').fetchone()
        except psycopg.errors.UndefinedTable:
            return 0
        return int(row[0]) if row else 0

    return count


def _redis_count(prefix: str) -> Callable[[], int]:
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    return lambda: int(client.zcard(f"{prefix}:threads"))


def _killed_copy(src: str, dst: str, count: Callable[[], int]) -> tuple[int, float]:
    """Start `copy`, SIGKILL it once the target holds 40% of the threads; (threads there
    then, seconds it ran)."""
    env = {k: v for k, v in os.environ.items() if k != "LGCKPT_URL"}
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "langgraph_ckpt_ext", "copy", "--url", src,
                             "--to", dst], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        while (held := count()) < THREADS * 0.4:
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.01)
        proc.kill()  # SIGKILL: no cleanup, mid-batch
    finally:
        proc.wait(30)
    assert proc.returncode == -9
    return held, time.monotonic() - started


def _many_threads(path: Path) -> str:
    """A SQLite store of THREADS small threads (two turns of a chat each), copied from one."""
    saver = SQLiteCheckpointer(path)
    try:
        graph = chat_graph().compile(checkpointer=saver)
        first = {"configurable": {"thread_id": "t0000"}}
        graph.invoke({"messages": [human("hello")]}, first)
        graph.invoke({"messages": [human("again")]}, first)
        for i in range(1, THREADS):
            saver.copy_thread("t0000", f"t{i:04}")
    finally:
        saver.close()
    return f"sqlite:///{path}"


@pytest.mark.postgres
@pytest.mark.redis
def test_copy_killed_halfway_resumes(tmp_path: Path) -> None:
    """SQLite -> PostgreSQL, then PostgreSQL -> Redis: each copy is killed once the target
    holds 40% of the threads and run again; it finishes with every thread there once, equal
    to its source."""
    src = _many_threads(tmp_path / "many.db")
    schema, prefix = pg_schema(), redis_prefix()
    pg, redis = f"{PG_DSN}?schema={schema}", f"{REDIS_URL}?key_prefix={prefix}"
    rates = []
    try:
        for source, target, count in ((src, pg, _pg_count(schema)),
                                      (pg, redis, _redis_count(prefix))):
            held, seconds = _killed_copy(source, target, count)
            assert held < THREADS
            run = lgckpt("copy", "--url", source, "--to", target, "--json")
            assert run.code == 0, run
            report: dict[str, Any] = json.loads(run.out)
            assert report["ok"] and report["threads_verified"] == THREADS
            assert report["threads_copied"] + report["threads_skipped"] == THREADS
            assert report["threads_skipped"] >= THREADS * 0.4 - 64  # what was there, less cut
            assert _equal(source, target) == THREADS
            rates.append(
                f"{source.split(':')[0]} -> {target.split(':')[0]}: killed after {held} threads "
                f"in {seconds:.1f} s ({held / seconds:.0f} threads/s with start-up); resumed: "
                f"{report['threads_copied']} copied, {report['threads_skipped']} skipped, "
                f"{report['threads_per_second']:.0f} threads/s")
    finally:
        drop_pg_schemas(schema)
        drop_redis_prefixes(prefix)
    print("\n" + "\n".join(rates))
