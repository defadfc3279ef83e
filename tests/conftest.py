"""Shared fixtures (every test runs on each backend, against real storage) and the `postgres` /
`redis` markers: a marked test is skipped, with the reason, when its server does not answer
(failed instead where the run requires the servers, as `scripts/test.sh` and CI do).
Savers are built by `tests.support.savers`; helpers live in `tests.support`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest

from langgraph_ckpt_ext.core.guard import read_heads
from tests.support.common import LoopThread
from tests.support.savers import (
    BACKENDS,
    SaverHandle,
    open_saver,
    params,
    set_current_marks,
    stop_redis_cluster,
    unless_reachable,
)

SERVER_MARKS = ("postgres", "redis")


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Stop a test marked for a server that does not answer (probed once per process). The
    factory checks that a test which opens a server's storage carries its marker."""
    marks = {m.name for m in item.iter_markers()}
    set_current_marks(marks)
    for server in SERVER_MARKS:
        if server in marks:
            unless_reachable(server)


def pytest_runtest_teardown(item: pytest.Item) -> None:
    set_current_marks(None)


@pytest.fixture(scope="session", autouse=True)
def _stop_redis_cluster() -> Iterator[None]:
    yield
    stop_redis_cluster()


@pytest.fixture(autouse=True)
def _no_reads_of_earlier_tests() -> Iterator[None]:
    """Each test starts as a new process would: no thread read in this context yet (the
    heads one-writer-per-thread notes per context, `core.guard.read_heads`; tests reuse thread
    ids, and some the same checkpoint ids, in storage of their own)."""
    token = read_heads.set(MappingProxyType({}))
    yield
    read_heads.reset(token)


@pytest.fixture(params=params(BACKENDS))
def backend(request: pytest.FixtureRequest) -> str:
    """Each backend's name (its tests marked with the server it needs)."""
    return str(request.param)


@pytest.fixture
def saver_handle(backend: str, tmp_path: Path) -> Iterator[SaverHandle]:
    """The backend's checkpointer with its storage; closed and dropped after the test."""
    handle = open_saver(backend, tmp_path)
    yield handle
    handle.close()


@pytest.fixture
def saver(saver_handle: SaverHandle) -> Any:
    """The backend's checkpointer (its storage in `saver_handle`)."""
    return saver_handle.saver


@pytest.fixture
def loop_thread() -> Iterator[LoopThread]:
    lt = LoopThread()
    yield lt
    lt.stop()
