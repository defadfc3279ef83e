"""The core: the whole saver contract once (`StoreCheckpointer`, over any backend's `Store`),
and what it needs: encoding, append-deltas, filters, versions, the state-schema chain applied
on read (`schema`), the audit seal of every put (`audit`), LangGraph's graph names (`graph`),
the one sync bridge, errors. No I/O of its own: a backend's `Store` moves the rows.

May import: nothing else of this package (the bottom layer).
Layers, bottom to top: core -> state, migrations, timetravel -> backends -> connecting,
transfer -> strategies -> cli and the top-level package (`tests/core/test_layering.py`).
"""

from .errors import (
    CheckpointerError,
    CorruptBlobError,
    InvalidConfigError,
    InvalidFilterError,
    MissingDependencyError,
    SerializationError,
    StorageVersionError,
)
from .saver import StoreCheckpointer, strict_serde

__all__ = [
    "CheckpointerError",
    "CorruptBlobError",
    "InvalidConfigError",
    "InvalidFilterError",
    "MissingDependencyError",
    "SerializationError",
    "StorageVersionError",
    "StoreCheckpointer",
    "strict_serde",
]
