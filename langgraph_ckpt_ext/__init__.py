"""LangGraph checkpointers: in-memory, SQLite, PostgreSQL and Redis (plain or Cluster).

Importing this package loads no database driver: each backend is imported when first named.
The top of the layers: it may import every package. Layers, bottom to top: core -> state,
migrations, timetravel -> backends -> connecting, transfer -> strategies -> cli and this top-level
package (`tests/core/test_layering.py`).

    from langgraph_ckpt_ext import SQLiteCheckpointer

    async with SQLiteCheckpointer.from_conn_string("agent.db") as checkpointer:
        graph = builder.compile(checkpointer=checkpointer)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .core.errors import (
    CheckpointerError,
    CheckpointNotFoundError,
    ConcurrentWriteError,
    CorruptBlobError,
    CorruptChainError,
    DecompressionLimitError,
    DecryptionError,
    FencedError,
    InvalidConfigError,
    InvalidFilterError,
    LeaseLostError,
    MissingDependencyError,
    PlaintextRefusedError,
    PrimaryUnavailableError,
    QuorumUnavailableError,
    ReplicaAckError,
    ReplicationError,
    SchemaVersionError,
    SerializationError,
    StorageVersionError,
    StoreBusyError,
    StoreUnavailableError,
    ThreadDeletedError,
    ThreadExistsError,
    ThreadLeasedError,
    ThreadNotFoundError,
    UnknownKeyError,
)

if TYPE_CHECKING:
    from .backends.memory import InMemoryCheckpointer
    from .backends.postgres import PostgresCheckpointer
    from .backends.redis import RedisCheckpointer
    from .backends.sqlite import SQLiteCheckpointer
    from .connecting import connect
    from .core.keys import CallbackKeys, EnvKeys, KeyProvider, StaticKeys, new_key
    from .core.retention import ErasureReport, Retention, SweepReport, ThreadState
    from .core.rotation import RotationProgress, RotationReport
    from .core.rows import MigrationEntry
    from .core.schema import SchemaChain, SchemaStep
    from .core.sealing import Compression, Encryption
    from .core.telemetry import Telemetry
    from .migrations.runner import MigrationProgress, MigrationReport
    from .state import (
        AgentSnapshot,
        AgentState,
        MemoryRef,
        PlanStep,
        ToolCall,
        ToolSpec,
        WorkingMemory,
        aload_agent_state,
        load_agent_state,
    )
    from .strategies import (
        EveryStep,
        Hybrid,
        OnEvents,
        Periodic,
        RepairReport,
        ReplicatedCheckpointer,
        ReplicationStatus,
        SmartCheckpointer,
    )

_LAZY = {
    "InMemoryCheckpointer": ".backends.memory",
    "SQLiteCheckpointer": ".backends.sqlite",
    "PostgresCheckpointer": ".backends.postgres",
    "RedisCheckpointer": ".backends.redis",
    "connect": ".connecting",
    "MigrationEntry": ".core.rows",
    **dict.fromkeys(("CallbackKeys", "EnvKeys", "KeyProvider", "StaticKeys", "new_key"),
                    ".core.keys"),
    **dict.fromkeys(("RotationProgress", "RotationReport"), ".core.rotation"),
    **dict.fromkeys(("Compression", "Encryption"), ".core.sealing"),
    **dict.fromkeys(("ErasureReport", "Retention", "SweepReport", "ThreadState"),
                    ".core.retention"),
    "SchemaChain": ".core.schema",
    "Telemetry": ".core.telemetry",
    "SchemaStep": ".core.schema",
    "MigrationProgress": ".migrations.runner",
    "MigrationReport": ".migrations.runner",
    **dict.fromkeys(
        ("EveryStep", "Hybrid", "OnEvents", "Periodic", "SmartCheckpointer", "RepairReport",
         "ReplicatedCheckpointer", "ReplicationStatus"),
        ".strategies",
    ),
    **dict.fromkeys(
        (
            "AgentSnapshot", "AgentState", "MemoryRef", "PlanStep", "ToolCall", "ToolSpec",
            "WorkingMemory", "aload_agent_state", "load_agent_state",
        ),
        ".state",
    ),
}

__all__ = [
    "AgentSnapshot",
    "AgentState",
    "CallbackKeys",
    "CheckpointNotFoundError",
    "CheckpointerError",
    "Compression",
    "ConcurrentWriteError",
    "CorruptBlobError",
    "CorruptChainError",
    "DecompressionLimitError",
    "DecryptionError",
    "Encryption",
    "EnvKeys",
    "ErasureReport",
    "EveryStep",
    "FencedError",
    "Hybrid",
    "InMemoryCheckpointer",
    "InvalidConfigError",
    "InvalidFilterError",
    "KeyProvider",
    "LeaseLostError",
    "MemoryRef",
    "MigrationEntry",
    "MigrationProgress",
    "MigrationReport",
    "MissingDependencyError",
    "OnEvents",
    "Periodic",
    "PlaintextRefusedError",
    "PlanStep",
    "PostgresCheckpointer",
    "PrimaryUnavailableError",
    "QuorumUnavailableError",
    "RedisCheckpointer",
    "RepairReport",
    "ReplicaAckError",
    "ReplicatedCheckpointer",
    "ReplicationError",
    "ReplicationStatus",
    "Retention",
    "RotationProgress",
    "RotationReport",
    "SQLiteCheckpointer",
    "SchemaChain",
    "SchemaStep",
    "SchemaVersionError",
    "SerializationError",
    "SmartCheckpointer",
    "StaticKeys",
    "StorageVersionError",
    "StoreBusyError",
    "StoreUnavailableError",
    "SweepReport",
    "Telemetry",
    "ThreadDeletedError",
    "ThreadExistsError",
    "ThreadLeasedError",
    "ThreadNotFoundError",
    "ThreadState",
    "ToolCall",
    "ToolSpec",
    "UnknownKeyError",
    "WorkingMemory",
    "aload_agent_state",
    "connect",
    "load_agent_state",
    "new_key",
]

__version__ = "0.1.0"


def _server_checkpointer() -> Any:
    """What `"path": "langgraph_ckpt_ext.server:checkpointer"` in `langgraph.json` names.
    LangGraph's server reads a path with neither `/` nor `.py:` as `module.attr`, split at its
    last dot: it imports this package and looks up `server:checkpointer` in its namespace."""
    from .server import checkpointer

    return checkpointer()


globals()["server:checkpointer"] = _server_checkpointer


def __getattr__(name: str) -> Any:
    if name == "Step":  # the former name of `SchemaStep`, still importable for a while
        from .core.errors import renamed
        from .core.schema import SchemaStep as _SchemaStep

        return renamed("langgraph_ckpt_ext", "Step", _SchemaStep)
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'langgraph_ckpt_ext' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value
