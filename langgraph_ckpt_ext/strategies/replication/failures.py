"""Which store an error came from, and what it means there: an outage (fail over, retry,
mark the replica down) or a request the store refused (raised as it is, or the op dropped and
its threads marked for repair). Each saver of ours classifies its own errors
(`StoreCheckpointer.is_unavailable`, refined by its backend); any other saver (LangGraph's,
a wrapper) gets the generic rule with PostgreSQL's SQLSTATE refusals, as LangGraph's
`PostgresSaver` raises psycopg errors that carry them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...backends import sqlstate
from ...core.failures import Classifying, unavailable

Classifier = Callable[[BaseException], bool]


class RemoteError(Exception):
    """An error a replica raised in the replicator process (its message names its type)."""


def describe(exc: BaseException) -> str:
    if isinstance(exc, RemoteError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


def foreign_unavailable(exc: BaseException) -> bool:
    """The rule for a saver that does not classify its own errors."""
    return unavailable(exc, sqlstate.refused)


def classifier(saver: Any) -> Classifier:
    """How errors `saver` raised are read (looked up when one is raised, never per call)."""
    if isinstance(saver, Classifying):
        return saver.is_unavailable
    return foreign_unavailable


def unavailable_at(exc: BaseException, *savers: Any) -> bool:
    """For an error that one of `savers` raised, which one unknown: an outage unless one of
    them recognises it as a request it refused."""
    return all(classifier(s)(exc) for s in savers)
