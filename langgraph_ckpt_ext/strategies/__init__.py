"""Checkpointers that wrap others: `SmartCheckpointer` (when to save) and its policies;
`ReplicatedCheckpointer` (a primary and replicas)."""

from .replicated import (
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
