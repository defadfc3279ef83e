"""The shared core: no I/O. Encoding, append-deltas, filters, versions, the bridge, errors."""

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
