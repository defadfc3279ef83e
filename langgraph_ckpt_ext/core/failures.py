"""Whether an error means that a store could not be reached (or could not serve) rather than
that the request was wrong: what a wrapper fails over on, or retries, and what it raises as
it is.

The generic rule is here: connection errors and timeouts are outages; this package's caller
errors (and Python's `ValueError`, `TypeError`, ...) are not; any other error a driver raises
counts as an outage unless the store refines it. Each backend's store says which of its own
errors are a request the server answered and refused, as it would refuse it again
(`Store.refuses`); `StoreCheckpointer.is_unavailable` combines the two.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

from .errors import (
    CheckpointNotFoundError,
    ConcurrentWriteError,
    InvalidConfigError,
    InvalidFilterError,
    MissingBaseError,
    SerializationError,
    ThreadExistsError,
)

CALLER_ERRORS: tuple[type[BaseException], ...] = (
    InvalidConfigError, InvalidFilterError, SerializationError, CheckpointNotFoundError,
    ThreadExistsError, NotImplementedError, ValueError, TypeError, KeyError,
    MissingBaseError,  # rows that need a base this store lacks: the thread needs a repair
    ConcurrentWriteError,  # another writer got there first (`core.guard`): no outage
)
"""Errors that say the call was wrong, not that a store is unreachable."""


def unavailable(exc: BaseException,
                refused: Callable[[BaseException], bool] | None = None) -> bool:
    """Whether `exc` means the store could not be reached (or served): connection errors,
    timeouts, and anything that is neither a caller error nor an error `refused` (the store's
    own rule) recognises as a request the server refused."""
    if isinstance(exc, ConnectionError | TimeoutError | OSError):
        return True
    if refused is not None and refused(exc):
        return False
    return isinstance(exc, Exception) and not isinstance(exc, CALLER_ERRORS)


@runtime_checkable
class Classifying(Protocol):
    """A saver that classifies its own errors (ours: `StoreCheckpointer`)."""

    def is_unavailable(self, exc: BaseException) -> bool: ...
