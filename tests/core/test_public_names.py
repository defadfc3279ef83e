"""The public names, pinned: a name that appears in or leaves an `__all__` fails here until this
list is updated on purpose (a rename keeps the old name importable, or says so in the notes)."""

from __future__ import annotations

import importlib

import pytest

PUBLIC: dict[str, list[str]] = {
    "langgraph_ckpt_ext": [
        "AgentSnapshot", "AgentState", "CallbackKeys", "CheckpointNotFoundError",
        "CheckpointerError", "Compression", "ConcurrentWriteError", "CorruptBlobError",
        "CorruptChainError", "DecompressionLimitError", "DecryptionError", "Encryption", "EnvKeys",
        "ErasureReport", "EveryStep", "FencedError", "Hybrid", "InMemoryCheckpointer",
        "InvalidConfigError", "InvalidFilterError", "KeyProvider", "LeaseLostError", "MemoryRef",
        "MigrationEntry", "MigrationProgress", "MigrationReport", "MissingDependencyError",
        "OnEvents", "Periodic", "PlaintextRefusedError", "PlanStep", "PostgresCheckpointer",
        "PrimaryUnavailableError", "QuorumUnavailableError", "RedisCheckpointer", "RepairReport",
        "ReplicaAckError", "ReplicatedCheckpointer", "ReplicationError", "ReplicationStatus",
        "Retention", "RotationProgress", "RotationReport", "SQLiteCheckpointer", "SchemaChain",
        "SchemaStep", "SchemaVersionError", "SerializationError", "SmartCheckpointer", "StaticKeys",
        "StorageVersionError", "StoreBusyError", "StoreUnavailableError", "SweepReport",
        "Telemetry", "ThreadDeletedError", "ThreadExistsError", "ThreadLeasedError",
        "ThreadNotFoundError", "ThreadState", "ToolCall", "ToolSpec", "UnknownKeyError", "WorkingMemory",
        "aload_agent_state", "connect", "load_agent_state", "new_key",
    ],
    "langgraph_ckpt_ext.cli": [
        "CliError", "Output", "main",
    ],
    "langgraph_ckpt_ext.core": [
        "CheckpointerError", "CorruptBlobError", "InvalidConfigError", "InvalidFilterError",
        "MissingDependencyError", "SerializationError", "StorageVersionError", "StoreCheckpointer",
        "strict_serde",
    ],
    "langgraph_ckpt_ext.migrations": [
        "NAME_KEY", "SchemaChain", "SchemaStep", "SchemaVersionError", "Upcaster", "VERSION_KEY",
        "WriteUpcaster", "compare", "is_reserved", "stored_schema_name", "stored_schema_version",
    ],
    "langgraph_ckpt_ext.server": [
        "ServerSettings", "checkpointer", "open_checkpointer", "serde_from_settings",
    ],
    "langgraph_ckpt_ext.strategies": [
        "AnyOf", "EveryStep", "Hybrid", "Metrics", "OnEvents", "Periodic", "Policy", "RepairReport",
        "ReplicaRepair", "ReplicaStatus", "ReplicatedCheckpointer", "ReplicationStatus",
        "SmartCheckpointer", "ThreadActivity",
    ],
    "langgraph_ckpt_ext.timetravel": [
        "ABResult", "CheckpointNotFoundError", "ForkNode", "HistoryEntry", "HistoryPage", "Inspection",
        "StateDiff", "ThreadExistsError", "ThreadNotFoundError", "Transition", "Variant", "VariantRun",
        "aab_test", "ab_test", "adiff", "afork", "ahistory", "ahistory_page", "ainspect", "alineage",
        "areplay", "arerun", "diff", "diff_values", "fork", "history", "history_page", "inspect",
        "lineage", "replay", "rerun",
    ],
    "langgraph_ckpt_ext.transfer": [
        "BATCH_SIZE", "CopyReport", "ExportReport", "FORMAT", "FORMAT_VERSION", "MalformedExportError",
        "Missing", "Progress", "ThreadDiff", "acopy_threads", "checkpoint_hash", "checkpoint_key",
        "copy_threads", "diff_thread", "export_header", "export_threads", "import_jsonl",
        "named_threads", "open_jsonl",
        "open_official", "put_thread", "thread_ids", "thread_tuples", "writes_hashes",
    ],
}


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_all_is_the_pinned_list(module: str) -> None:
    pinned = PUBLIC[module]
    assert pinned == sorted(pinned), "keep the pinned list sorted"
    exported = importlib.import_module(module).__all__
    assert len(exported) == len(set(exported)), "a name listed twice in __all__"
    assert sorted(exported) == pinned


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_every_public_name_resolves(module: str) -> None:
    mod = importlib.import_module(module)
    missing = [name for name in PUBLIC[module] if not hasattr(mod, name)]
    assert not missing, f"{module} lists names it does not define: {missing}"
    star: dict[str, object] = {}
    exec(f"from {module} import *", star)  # what `import *` really hands out
    assert sorted(k for k in star if k != "__builtins__") == PUBLIC[module]


def test_connect_is_the_function_whatever_was_imported_first() -> None:
    """`connect` lives in the submodule `connecting` (a submodule named `connect`, once imported,
    left the package attribute bound to the module instead of the function)."""
    import subprocess
    import sys

    code = (
        "import langgraph_ckpt_ext.strategies.smart\n"
        "from langgraph_ckpt_ext import connect\n"
        "assert callable(connect), connect\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
