"""Channel versions: compact, monotonic, and unique across forks of one thread."""

from __future__ import annotations

import math
import random

Version = str | int | float


def next_version(current: Version | None) -> Version:
    """The version after `current`.

    New threads get floats `n + r` (n the write count, r random in [0, 1)): nine bytes in
    msgpack against fifty for the zero-padded strings of LangGraph's savers, and two forks
    that both write the step after version n get different versions, so their blobs never
    collide. A thread that already uses string versions (imported from an official saver)
    keeps that format, since LangGraph compares versions of one checkpoint with each other.
    """
    if current is None:
        return 1 + random.random()
    if isinstance(current, str):
        n = int(current.split(".")[0]) + 1
        return f"{n:032}.{random.random():016}"
    return math.floor(current) + 1 + random.random()


_float_keys: dict[float, str] = {}


def version_key(version: Version) -> str:
    """The text form a version is stored under; exact for floats (repr round-trips)."""
    if isinstance(version, float):
        # Every put and read turns a checkpoint's versions into keys; a float's shortest
        # repr costs far more than a dict lookup, and the live versions are few.
        key = _float_keys.get(version)
        if key is None:
            if len(_float_keys) >= 1 << 16:
                _float_keys.clear()
            key = _float_keys[version] = float.__repr__(version)
        return key
    return str(version)


class _UpgradedFloat(float):
    """A version that a state-schema upgrade gave, on read, to a value it changed: that value
    is not stored under it yet, so the next `put` of a checkpoint holding it stores it."""


class _UpgradedStr(str):
    __doc__ = _UpgradedFloat.__doc__


_issued = False


def any_upgraded() -> bool:
    """Whether this process ever marked a version (if not, no checkpoint can hold one)."""
    return _issued


def upgraded_version(after: Version | None) -> Version:
    """A fresh version after `after`, marked as not stored yet (see `is_upgraded`)."""
    global _issued
    _issued = True
    v = next_version(after)
    return _UpgradedStr(v) if isinstance(v, str) else _UpgradedFloat(v)


def is_upgraded(version: object) -> bool:
    return isinstance(version, _UpgradedFloat | _UpgradedStr)


def plain(version: Version) -> Version:
    """`version` without the upgrade mark (what is stored)."""
    if isinstance(version, _UpgradedFloat):
        return float(version)
    if isinstance(version, _UpgradedStr):
        return str.__str__(version)
    return version
