"""The `postgres` and `redis` markers: with the servers pointed at a dead port, the tests that
need them fail with the reason (skipped only where a run opts out), and the others still run."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.savers import params, servers_of

ROOT = Path(__file__).resolve().parents[2]
TARGET = "tests/core/test_append_log_budget.py::test_every_checkpointer_takes_the_budget"


def _dead_port() -> int:
    """A loopback port nothing listens on (bound by us, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run_on_dead_ports(servers: str) -> tuple[subprocess.CompletedProcess[str], int, int]:
    """The target run with both servers on dead ports, `LGCKPT_TEST_SERVERS=servers` ("":
    not set)."""
    pg, rd = _dead_port(), _dead_port()
    env = {**os.environ, "LGCKPT_TEST_PG_DSN": f"postgresql://postgres@127.0.0.1:{pg}/test",
           "LGCKPT_TEST_REDIS_URL": f"redis://127.0.0.1:{rd}/0"}
    env.pop("LGCKPT_TEST_SERVERS", None)
    if servers:
        env["LGCKPT_TEST_SERVERS"] = servers
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-rs",
         "-q", TARGET],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    return run, pg, rd


def test_marked_tests_skip_with_the_reason_when_a_run_opts_out() -> None:
    run, pg, rd = _run_on_dead_ports("optional")
    out = run.stdout
    assert run.returncode == 0, out + run.stderr
    assert "2 passed, 2 skipped" in out, out  # memory and sqlite ran
    assert f"PostgreSQL not reachable at 127.0.0.1:{pg}: " in out, out
    assert f"Redis not reachable at 127.0.0.1:{rd}: " in out, out


def test_a_run_that_requires_the_servers_fails_instead_of_skipping() -> None:
    """`scripts/test.sh` (and so CI) sets LGCKPT_TEST_SERVERS=required: there a server that is
    down fails its tests, with the reason, so that the suite never passes by skipping them."""
    run, pg, rd = _run_on_dead_ports("required")
    out = run.stdout
    assert run.returncode == 1, out + run.stderr
    assert "2 passed, 2 errors" in out, out  # failed at setup, with the reason
    assert "skipped" not in out, out
    assert f"PostgreSQL not reachable at 127.0.0.1:{pg}: " in out, out
    assert f"Redis not reachable at 127.0.0.1:{rd}: " in out, out


def test_a_plain_run_fails_too_when_the_servers_are_down() -> None:
    """Without LGCKPT_TEST_SERVERS (a plain `pytest`), a server that is down fails its tests
    as well: only an explicit `optional` skips them."""
    run, pg, rd = _run_on_dead_ports("")
    out = run.stdout
    assert run.returncode == 1, out + run.stderr
    assert "2 passed, 2 errors" in out, out
    assert "skipped" not in out, out
    assert f"PostgreSQL not reachable at 127.0.0.1:{pg}: " in out, out
    assert f"Redis not reachable at 127.0.0.1:{rd}: " in out, out
    assert "LGCKPT_TEST_SERVERS=optional" in out, out


def test_params_carry_the_servers_they_need() -> None:
    marks = {p.values[0]: sorted(m.name for m in p.marks)
             for p in params(["memory", "sqlite", "postgres-no-cache", "redis-cluster",
                              "smart-events:redis", "replicated:postgres+sqlite",
                              "replicated-quorum:sqlite+redis"])}
    assert marks == {"memory": [], "sqlite": [], "postgres-no-cache": ["postgres"],
                     "redis-cluster": ["redis"], "smart-events:redis": ["redis"],
                     "replicated:postgres+sqlite": ["postgres"],
                     "replicated-quorum:sqlite+redis": ["redis"]}
    assert servers_of("sqlite") == set()


@pytest.mark.postgres
def test_an_unmarked_use_of_a_server_is_reported() -> None:
    """(Marked itself, so that it runs only where PostgreSQL answers.) Opening Redis storage
    from a test without the `redis` marker is an error, not a silent dependency."""
    from tests.support.savers import redis_prefix

    with pytest.raises(AssertionError, match=r"not marked @pytest.mark.redis"):
        redis_prefix()
