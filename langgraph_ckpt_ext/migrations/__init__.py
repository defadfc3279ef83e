"""State-schema migration: a versioned chain of upcasters for stored channel values.

An upcaster is a plain function of a checkpoint's channel values at version N that returns them
at version N + 1 (a renamed field, a new field with its default, a changed message format). A
`SchemaChain` declares them once, checks that they form an unbroken chain from its first version
to the current one, and applies the steps a stored version needs:

    def v1_to_v2(values):
        values = dict(values)
        values["goal"] = values.pop("objective", "")
        return values

    chain = SchemaChain(current=2, upcasters={1: v1_to_v2})
    chain.upgrade({"objective": "x"}, stored=1)  # -> {"goal": "x"}, at version 2
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..core.errors import CheckpointerError

Values = dict[str, Any]
Upcaster = Callable[[Values], Values]


class SchemaVersionError(CheckpointerError, ValueError):
    """A chain that cannot be applied: a gap, a bad version, or stored data newer than the code."""


class SchemaChain:
    """Upcasters keyed by the version they upgrade from, up to `current`.

    Args:
        current: the schema version the code writes.
        upcasters: `{n: f}` (or `(n, f)` pairs) where `f` turns values at version n into
            values at n + 1; every version from the lowest to `current - 1` must have one.
        first: the oldest version data may be stored at (default: the lowest key, or `current`).
    """

    def __init__(
        self,
        current: int,
        upcasters: Mapping[int, Upcaster] | Iterable[tuple[int, Upcaster]] | None = None,
        *,
        first: int | None = None,
    ) -> None:
        pairs = list(upcasters.items() if isinstance(upcasters, Mapping) else upcasters or ())
        steps: dict[int, Upcaster] = {}
        for version, fn in pairs:
            if version in steps:
                raise SchemaVersionError(
                    f"two upcasters from version {version}: keep one step per version"
                )
            steps[version] = fn
        if not isinstance(current, int) or isinstance(current, bool) or current < 1:
            raise SchemaVersionError(f"current schema version must be an int >= 1, got {current!r}")
        for version, fn in steps.items():
            if not isinstance(version, int) or isinstance(version, bool) or version < 1:
                raise SchemaVersionError(f"upcaster key {version!r} is not a version (an int >= 1)")
            if version >= current:
                raise SchemaVersionError(
                    f"upcaster from version {version} goes past the current version {current}: "
                    "raise `current`, or drop the step"
                )
            if not callable(fn):
                raise SchemaVersionError(f"upcaster from version {version} is not callable")
        self.current = current
        self.first = min(steps, default=current) if first is None else first
        missing = [v for v in range(self.first, current) if v not in steps]
        if missing:
            raise SchemaVersionError(
                f"the chain from version {self.first} to {current} has a gap: no upcaster from "
                f"version(s) {missing}"
            )
        self._steps = steps

    def upgrade(self, values: Mapping[str, Any], stored: int) -> Values:
        """`values` stored at version `stored`, upgraded to `current` (a new dict; the input is
        not changed). Versions never go down: data newer than the code is refused."""
        if stored > self.current:
            raise SchemaVersionError(
                f"stored state has schema version {stored}, newer than the {self.current} this "
                "code knows: deploy the newer code (versions never go down)"
            )
        if stored < self.first:
            raise SchemaVersionError(
                f"stored state has schema version {stored}, older than the oldest this chain "
                f"upgrades ({self.first}): add the upcasters from version {stored}"
            )
        out = dict(values)
        for version in range(stored, self.current):
            try:
                out = self._steps[version](dict(out))
            except Exception as exc:
                raise SchemaVersionError(
                    f"upcaster from version {version} to {version + 1} failed: {exc}"
                ) from exc
            if not isinstance(out, dict):
                raise SchemaVersionError(
                    f"upcaster from version {version} returned {type(out).__name__}, not a dict "
                    "of channel values"
                )
        return out

    def needs(self, stored: int) -> bool:
        """Whether values stored at `stored` need upgrading (raises if they cannot be)."""
        if stored > self.current:
            self.upgrade({}, stored)  # raises the clear error
        return stored < self.current


__all__ = ["SchemaChain", "SchemaVersionError", "Upcaster"]
