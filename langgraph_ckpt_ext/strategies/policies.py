"""Kept importable: the save policies of `SmartCheckpointer` live in `strategies.smart.policies`."""

from .smart.policies import (
    END,
    ERROR,
    EVENTS,
    INTERRUPT,
    PLAN_CHANGE,
    TOOL_CALL,
    UPDATE,
    AnyOf,
    EveryStep,
    Hybrid,
    OnEvents,
    Periodic,
    Policy,
    ThreadActivity,
)

__all__ = [
    "END",
    "ERROR",
    "EVENTS",
    "INTERRUPT",
    "PLAN_CHANGE",
    "TOOL_CALL",
    "UPDATE",
    "AnyOf",
    "EveryStep",
    "Hybrid",
    "OnEvents",
    "Periodic",
    "Policy",
    "ThreadActivity",
]
