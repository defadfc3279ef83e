"""Shared fixtures (every test runs on each backend, against real storage) and the `postgres` /
`redis` markers: a marked test is skipped, with the reason, when its server does not answer
(failed instead where the run requires the servers, as `scripts/test.sh` and CI do).
Savers are built by `tests.support.savers`; helpers live in `tests.support`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

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
