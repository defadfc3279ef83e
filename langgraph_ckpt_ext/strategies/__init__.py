"""Checkpointers that wrap others: `SmartCheckpointer` (when to save) and its policies;
`ReplicatedCheckpointer` (a primary and replicas)."""

from .policies import AnyOf, EveryStep, Hybrid, OnEvents, Periodic, Policy, ThreadActivity
from .replication import (
    RepairReport,
    ReplicaRepair,
    ReplicaStatus,
    ReplicatedCheckpointer,
    ReplicationStatus,
)
from .smart import Metrics, SmartCheckpointer

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
