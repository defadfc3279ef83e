"""Fixtures the backend tests share."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.savers import SaverHandle, drop_redis_prefixes, open_saver
from tests.support.writers import Workers


@pytest.fixture
def make_redis(tmp_path: Path) -> Iterator[Any]:
    """Standalone Redis checkpointers (in their handles) on the shared server, with options; closed and
    their keys deleted after the test."""
    made: list[SaverHandle] = []

    def factory(**options: Any) -> SaverHandle:
        made.append(open_saver("redis", tmp_path, **options))
        return made[-1]

    yield factory
    for h in made:
        h.close_savers()
    drop_redis_prefixes(*{h.prefix for h in made if h.prefix})


@pytest.fixture
def workers() -> Iterator[Workers]:
    """Worker processes a test starts (`Workers.start`): continued, joined and killed if
    still alive at the end."""
    w = Workers()
    try:
        yield w
    finally:
        w.close()
