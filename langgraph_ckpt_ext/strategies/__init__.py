"""Checkpointers that wrap others: `SmartCheckpointer` (when to save) and its policies."""

from .policies import AnyOf, EveryStep, Hybrid, OnEvents, Periodic, Policy, ThreadActivity
from .smart import Metrics, SmartCheckpointer

__all__ = [
    "AnyOf",
    "EveryStep",
    "Hybrid",
    "Metrics",
    "OnEvents",
    "Periodic",
    "Policy",
    "SmartCheckpointer",
    "ThreadActivity",
]
