"""Checkpointers that wrap others: `SmartCheckpointer` (when to save) and its policies;
`ReplicatedCheckpointer` (a primary and replicas). A wrapper asks of the saver it wraps
LangGraph's interface and, for batches and rows, the protocols of `core.inner`.

May import: `core`, `state`, `migrations`, `timetravel`, `backends`, `connecting` (to open what a
URL names) and `transfer` (a replica's repair).
Layers, bottom to top: core -> state, migrations, timetravel -> backends -> connecting,
transfer -> strategies -> cli and the top-level package (`tests/core/test_layering.py`).
"""

from .replication import (
    RepairReport,
    ReplicaRepair,
    ReplicaStatus,
    ReplicatedCheckpointer,
    ReplicationStatus,
)
from .smart import Metrics, SmartCheckpointer
from .smart.policies import AnyOf, EveryStep, Hybrid, OnEvents, Periodic, Policy, ThreadActivity

__all__ = [
    "AnyOf",
    "EveryStep",
    "Hybrid",
    "Metrics",
    "OnEvents",
    "Periodic",
    "Policy",
    "RepairReport",
    "ReplicaRepair",
    "ReplicaStatus",
    "ReplicatedCheckpointer",
    "ReplicationStatus",
    "SmartCheckpointer",
    "ThreadActivity",
]
